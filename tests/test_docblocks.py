"""scripts/_docblocks.replace_block: only the text between the markers changes."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))
from _docblocks import replace_block  # noqa: E402


def test_replace_block_keeps_the_rest(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("a\n<!-- generated:t -->\nold\nlines\n<!-- /generated:t -->\nb\n")
    replace_block(page, "t", "new $1 \\1 text")
    assert page.read_text() == "a\n<!-- generated:t -->\nnew $1 \\1 text\n<!-- /generated:t -->\nb\n"
    replace_block(page, "t", "again\n")
    assert page.read_text() == "a\n<!-- generated:t -->\nagain\n<!-- /generated:t -->\nb\n"


def test_replace_block_needs_exactly_one_block(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("no block here\n")
    with pytest.raises(KeyError, match="generated:t"):
        replace_block(page, "t", "x")
