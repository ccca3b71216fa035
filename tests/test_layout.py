"""The package's shape, as docs/design.md states it: every module sits in one tier and imports
only its own tier and those above it (the "Tiers" table of docs/design.md is read, not copied),
no module of ``cle/`` reaches into another module's private names, and none grows past the size
a reader can hold.

Private *modules* (``cle/_graph.py``) are the package's internal API and may be imported with
their public names; a name with a leading underscore belongs to its own module alone.
"""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "cle"
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


def tiers():
    """``{module: tier index}`` from the "Tiers" table of docs/design.md."""
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    section = text.split("\n## Tiers\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][1:]
    found = {}
    for i, row in enumerate(rows):
        for module in re.findall(r"`(\w+)`", row.rsplit("|", 2)[-2]):
            assert module not in found, f"{module} is in two tiers of docs/design.md"
            found[module] = i
    return found


def cle_imports(path):
    """The cle modules ``path`` imports (by file stem), wherever the import statement is."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "cle":
            if node.module == "cle":
                out.update(a.name for a in node.names if (PACKAGE / f"{a.name}.py").exists())
            else:
                out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[1] for a in node.names if a.name.startswith("cle."))
    out.discard(path.stem)
    return out


def test_every_module_has_a_tier():
    table = tiers()
    assert len(set(table.values())) == 4
    modules = {p.stem for p in SOURCES}
    assert sorted(modules - set(table)) == [], "add the new module to docs/design.md's Tiers"
    assert sorted(set(table) - modules) == [], "docs/design.md names modules that do not exist"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_go_only_to_the_same_or_a_lower_tier(path):
    table = tiers()
    mine = table[path.stem]
    above = sorted(m for m in cle_imports(path) if table.get(m, -1) > mine)
    assert above == [], f"{path.name} (tier {mine}) imports {above} from a higher tier"
