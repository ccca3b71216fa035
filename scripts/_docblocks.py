"""Replace generated blocks in docs pages.

A block is delimited by ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->`` lines; the
text between them is replaced and everything else in the page is kept.
"""

from __future__ import annotations

import pathlib
import re


def replace_block(path, name: str, text: str) -> None:
    """Replace the text of block ``name`` in the file at ``path`` with ``text``.

    Raises:
        ValueError: the page has no such block (or it is opened/closed more than once).
    """
    path = pathlib.Path(path)
    page = path.read_text()
    start, end = f"<!-- generated:{name} -->", f"<!-- /generated:{name} -->"
    pattern = re.compile(re.escape(start) + r"\n.*?" + re.escape(end), re.S)
    if page.count(start) != 1 or page.count(end) != 1 or not pattern.search(page):
        raise ValueError(f"{path} must contain exactly one block {start} ... {end}. "
                         f"Received: {page.count(start)} openings, {page.count(end)} closings")
    body = text.rstrip("\n") + "\n"
    path.write_text(pattern.sub(lambda m: f"{start}\n{body}{end}", page))
