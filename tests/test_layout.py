"""The package's shape, as docs/design.md states it: no module of ``cle/`` reaches into another
module's private names, and none grows past the size a reader can hold.

Private *modules* (``cle/_graph.py``) are the package's internal API and may be imported with
their public names; a name with a leading underscore belongs to its own module alone.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "cle"
MAX_LINES = 600
SOURCES = sorted(PACKAGE.rglob("*.py"))


def _private(name):
    return name.startswith("_") and not name.startswith("__")


def _module_of(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def private_uses(path):
    """``(line, text)`` of every use in ``path`` of a private name of another cle module."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    me = _module_of(path)
    aliases = {}  # local name -> cle module it stands for
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "cle":
            for a in node.names:
                if node.module == "cle":  # `from cle import batch_norm_fold as bnf`
                    aliases[a.asname or a.name] = f"cle.{a.name}"
                elif _private(a.name) and node.module != me:
                    found.append((node.lineno, f"from {node.module} import {a.name}"))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "cle" and a.asname:
                    aliases[a.asname] = a.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and _private(node.attr)
                and aliases[node.value.id] != me):
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return sorted(found)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_uses_another_modules_private_names(path):
    assert private_uses(path) == []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_is_over_the_size_limit(path):
    n = len(path.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"{path.name}: {n} lines (limit {MAX_LINES}): split it by concern"


def test_the_private_name_check_can_fail(tmp_path, monkeypatch):
    """The checker finds both forms it guards against (so the tests above can fail)."""
    fake = PACKAGE / "_layout_probe_never_written.py"
    source = ("from cle.batch_norm_fold import _find\n"
              "from cle import batch_norm_fold as bnf\n"
              "x = bnf._bn_arrays\n"
              "from cle._graph import graph_view\n"
              "y = bnf.fold_all_batch_norms\n")
    monkeypatch.setattr(pathlib.Path, "read_text",
                        lambda self, encoding=None: source if self == fake
                        else pathlib.Path.read_bytes(self).decode(encoding or "utf-8"))
    assert private_uses(fake) == [(1, "from cle.batch_norm_fold import _find"),
                                  (3, "bnf._bn_arrays")]
