"""The package's shape: folders are tiers.

``cle/`` holds the public modules at the top and every private module in a tier folder. The
tiers, lowest first (a module imports only its own tier and the tiers below it):

====== ================ =================================================================
 tier   folder           what it holds
====== ================ =================================================================
 0      ``_math``        pure numpy math and value checks; imports no Keras, TensorFlow, JAX
 1      ``_core``        the graph view, the one rebuild, layouts, semantics, weights,
                         model checks, backend capabilities, files
 2      ``_transforms``  BN folding, scaling sets and their plan, ReLU6, high-bias folding,
                         the report, the stepwise AIMET classes, bias correction, QAT layers
 2      ``_tflite``      the target room: TF Lite's converter and its private calls, the
                         flatbuffer graph, the weight store, the simulation of the file, the
                         LiteRT runs (it reaches ``_math`` and ``_core`` only)
 3      ``_measure``     target-neutral measurement: Keras runs, metrics, calibration data,
                         synthetic inputs, input ranges, the check
 4      ``_quantize``,   the end-to-end ``quantize`` route; the real networks
        ``_pretrained``
 5      (top level)      the public modules: thin faces that re-export their folder's API
 6      ``_cli``         the command line and the demo, built on the public modules
====== ================ =================================================================

Two public modules define classes that saved models name by module (``cle.layers.ClippedReLU``,
``cle.training_fold.FoldedConv2D``), so they hold code and sit in the tier of what they
import; the command line's entry points sit in ``_cli``'s tier. Every form of import counts:
``from cle._core.graph import x``, ``from cle._core import graph``, ``import cle._core.graph``,
relative imports, and attribute reach through the package (``cle._core.graph.x``). No module
uses another module's private names, no module passes the size a reader can hold, and no
function is longer than :data:`MAX_FUNCTION_LINES` lines of code (the command line's parser
excepted: it is one long table of options).
"""

from __future__ import annotations

import ast
import io
import pathlib
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "cle"
MAX_LINES = 600
MAX_FUNCTION_LINES = 80
#: Functions allowed past MAX_FUNCTION_LINES, with the reason.
LONG_FUNCTIONS = {("_cli/main.py", "build_parser"): "the parser is one table of options"}

FOLDER_TIERS = {"_math": 0, "_core": 1, "_transforms": 2, "_tflite": 2, "_measure": 3,
                "_quantize": 4, "_pretrained": 4, "_cli": 6}
#: Folders that may reach only the folders listed (beyond the tier rule), with the reason.
FOLDER_REACH = {"_tflite": {"_math", "_core"}}  # the target room: one place for the runtime
#: The only folder whose code imports or reaches TF Lite's converter, flatbuffer and LiteRT.
TARGET_ROOM = "_tflite"
TARGET_MODULES = ("tensorflow.lite", "ai_edge_litert", "tflite_micro", "ethosu")
PUBLIC_TIER = 5
#: Top-level modules outside the public tier, with the reason.
TOP_LEVEL_TIERS = {
    "layers": 1,  # ClippedReLU: saved models name cle.layers
    "training_fold": 2,  # the fused QAT layers: saved models name cle.training_fold
    "cli": 6, "__main__": 6, "demo": 6,  # the command line's entry points
}
SOURCES = sorted(PACKAGE.rglob("*.py"))


def _relative(path):
    return path.relative_to(PACKAGE).as_posix()


def module_of(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def tier_of(module):
    """The tier of a cle module given by its dotted name (``cle._core.graph``, ``cle.layers``)."""
    parts = module.split(".")
    if len(parts) == 1:  # the package itself
        return PUBLIC_TIER
    if parts[1] in FOLDER_TIERS:
        return FOLDER_TIERS[parts[1]]
    return TOP_LEVEL_TIERS.get(parts[1], PUBLIC_TIER)


def _folder(module):
    """The tier folder of a cle module (``_core``), or None for a top-level module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in FOLDER_TIERS else None


def _private(name):
    return name.startswith("_") and not name.startswith("__")


def _is_module(dotted):
    rel = pathlib.Path(*dotted.split(".")[1:])
    return ((PACKAGE / rel).with_suffix(".py").exists() or (PACKAGE / rel / "__init__.py").exists()
            or dotted == "cle")


def imports(path, tree=None):
    """``[(line, imported cle module, [names])]`` for every import in ``path``: absolute and
    relative ``from`` imports (a name that is itself a module counts as that module) and
    ``import cle.x.y``."""
    tree = tree or ast.parse(path.read_text(encoding="utf-8"), str(path))
    me = module_of(path).split(".")
    package = me if path.name == "__init__.py" else me[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "cle":
                continue
            names = [a.name for a in node.names]
            subs = [n for n in names if _is_module(f"{module}.{n}")]
            for n in subs:
                out.append((node.lineno, f"{module}.{n}", []))
            rest = [n for n in names if n not in subs]
            if rest or not subs:
                out.append((node.lineno, module, rest))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "cle":
                    out.append((node.lineno, a.name, []))
    return out


def attribute_reach(tree):
    """``[(line, dotted)]`` for every expression ``cle.a.b...`` written out in code."""
    found = []
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            chain, cur = [node.attr], node.value
            while isinstance(cur, ast.Attribute):
                chain.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name) and cur.id == "cle":
                found.append((node.lineno, ".".join(["cle"] + chain[::-1])))
    return found


def _module_prefix(dotted):
    """The longest prefix of ``dotted`` that is a cle module, and the rest."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        if _is_module(".".join(parts[:k])):
            return ".".join(parts[:k]), parts[k:]
    return "cle", parts[1:]


def problems(path):
    """Every rule ``path`` breaks, as readable lines."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    me = module_of(path)
    mine = tier_of(me)
    out = []
    reached = [(line, module, names) for line, module, names in imports(path, tree)]
    for line, dotted in attribute_reach(tree):
        module, rest = _module_prefix(dotted)
        reached.append((line, module, rest[:1]))
    for line, module, names in reached:
        if module == me:
            continue
        if tier_of(module) > mine:
            out.append(f"line {line}: tier {mine} reaches {module} (tier {tier_of(module)})")
        folder, target = _folder(me), _folder(module)
        if (folder in FOLDER_REACH and target not in FOLDER_REACH[folder] | {folder}
                and module != "cle"):
            out.append(f"line {line}: {folder} reaches {module} ({folder} reaches only "
                       f"{', '.join(sorted(FOLDER_REACH[folder]))})")
        for n in names:
            if _private(n) and not _is_module(f"{module}.{n}"):
                out.append(f"line {line}: uses {module}'s private name {n}")
    return sorted(set(out))


@pytest.mark.parametrize("path", SOURCES, ids=_relative)
def test_imports_go_only_to_the_same_or_a_lower_tier_and_no_private_names(path):
    assert problems(path) == []


def test_top_level_holds_the_public_modules_only():
    top = sorted(p.name for p in PACKAGE.glob("*.py")
                 if _private(p.stem) and p.stem not in ("__init__", "__main__"))
    assert top == [], "private modules belong in a tier folder"
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == sorted(FOLDER_TIERS), "a new folder needs a tier in FOLDER_TIERS"
    assert all((PACKAGE / f / "__init__.py").exists() for f in folders)


@pytest.mark.parametrize("path", sorted((PACKAGE / "_math").glob("*.py")), ids=_relative)
def test_math_imports_no_framework(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names}
    roots |= {(n.module or "").split(".")[0] for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom) and not n.level}
    assert not roots & {"keras", "tensorflow", "jax", "torch", "ai_edge_litert"}


def _pretend_file(monkeypatch, fake, source):
    """Make ``fake`` (a path never written) read as ``source``: the probes of the checks."""
    real = pathlib.Path.read_text
    monkeypatch.setattr(pathlib.Path, "read_text",
                        lambda self, encoding=None: source if self == fake
                        else real(self, encoding=encoding))


def target_reaches(path, tree=None):
    """``(line, what)`` of every import of TF Lite's converter, flatbuffer or a runtime
    (:data:`TARGET_MODULES`), and every reach ``tf.lite.x`` / ``tensorflow.lite.x`` in code."""
    tree = tree or ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for node in ast.walk(tree):
        modules = []
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        for m in modules:
            if any(m == t or m.startswith(t + ".") for t in TARGET_MODULES):
                found.append((node.lineno, f"import {m}"))
                break
        if (isinstance(node, ast.Attribute) and node.attr == "lite"
                and isinstance(node.value, ast.Name) and node.value.id in ("tf", "tensorflow")):
            found.append((node.lineno, f"{node.value.id}.lite"))
    return found


@pytest.mark.parametrize("path", [p for p in SOURCES if _folder(module_of(p)) != TARGET_ROOM],
                         ids=_relative)
def test_only_the_target_room_reaches_tflite_and_the_runtimes(path):
    assert target_reaches(path) == [], f"TF Lite and its runtimes live in cle/{TARGET_ROOM}/"


def test_the_target_room_checks_can_fail(monkeypatch):
    fake = PACKAGE / "_tflite" / "_room_probe_never_written.py"
    source = ("import tensorflow as tf\n"
              "c = tf.lite.TFLiteConverter\n"
              "from ai_edge_litert.interpreter import Interpreter\n"
              "from tflite_micro.python.tflite_micro import runtime\n"
              "from cle._transforms import plan\n"
              "from cle._core import graph\n")
    _pretend_file(monkeypatch, fake, source)
    assert sorted(target_reaches(fake)) == [
        (2, "tf.lite"), (3, "import ai_edge_litert.interpreter"),
        (4, "import tflite_micro.python.tflite_micro")]
    assert problems(fake) == [
        "line 5: _tflite reaches cle._transforms.plan (_tflite reaches only _core, _math)"]


@pytest.mark.parametrize("path", SOURCES, ids=_relative)
def test_no_module_is_over_the_size_limit(path):
    n = len(path.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"{path.name}: {n} lines (limit {MAX_LINES}): split it by concern"


def code_lines(source, node):
    """Lines of ``node`` that hold code: not blank, not a comment, not its docstring."""
    lines = set()
    segment = "\n".join(source.splitlines()[node.lineno - 1: node.end_lineno])
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER}
    doc = node.body[0] if (node.body and isinstance(node.body[0], ast.Expr)
                           and isinstance(node.body[0].value, ast.Constant)
                           and isinstance(node.body[0].value.value, str)) else None
    for tok in tokenize.generate_tokens(io.StringIO(segment).readline):
        if tok.type in skip:
            continue
        row = tok.start[0] + node.lineno - 1
        if doc is not None and doc.lineno <= row <= doc.end_lineno:
            continue
        lines.update(range(row, tok.end[0] + node.lineno))
    return len(lines)


def long_functions(path):
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = code_lines(source, node)
            if n > MAX_FUNCTION_LINES and (_relative(path), node.name) not in LONG_FUNCTIONS:
                out.append(f"{node.name}: {n} lines of code")
    return out


@pytest.mark.parametrize("path", SOURCES, ids=_relative)
def test_no_function_is_over_the_size_limit(path):
    assert long_functions(path) == [], f"split by step (limit {MAX_FUNCTION_LINES} lines)"


def test_the_checks_can_fail(monkeypatch):
    """Each rule finds what it guards against, so the tests above can fail."""
    fake = PACKAGE / "_core" / "_layout_probe_never_written.py"
    source = ("from cle._transforms.plan import plan_equalization\n"
              "from cle._core.graph import _inner\n"
              "from .._measure import synthetic\n"
              "import cle._cli.main\n"
              "import cle\n"
              "x = cle._measure.synthetic.distill\n"
              "from cle._core import graph\n"
              "from . import rebuild\n"
              "def f():\n" + "".join(f"    a{i} = {i}\n" for i in range(MAX_FUNCTION_LINES)))
    _pretend_file(monkeypatch, fake, source)
    assert problems(fake) == sorted([
        "line 1: tier 1 reaches cle._transforms.plan (tier 2)",
        "line 2: uses cle._core.graph's private name _inner",
        "line 3: tier 1 reaches cle._measure.synthetic (tier 3)",
        "line 4: tier 1 reaches cle._cli.main (tier 6)",
        "line 5: tier 1 reaches cle (tier 5)",
        "line 6: tier 1 reaches cle._measure.synthetic (tier 3)",
    ])
    assert long_functions(fake) == [f"f: {MAX_FUNCTION_LINES + 1} lines of code"]


# ------------------------------------------------------------------ private APIs of others

#: The two modules that may use Keras', TensorFlow's and LiteRT's private API.
FENCES = ("_core/keras_internals.py", "_tflite/internals.py")
PRIVATE_IMPORTS = ("keras.src", "tensorflow.python", "tensorflow.lite.python",
                   "tensorflow.lite.tools", "tensorflow.compiler", "ai_edge_litert._")


def _own_private_names():
    """Every private name cle defines itself (functions, classes, attributes, variables)."""
    names = set()
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[-1])
    return {n for n in names if _private(n)}


def foreign_private_uses(path, own=None):
    """``(line, text)`` of every use in ``path`` of another library's private API: an import
    from a private module, or an attribute with a leading underscore that cle does not define
    (read on anything but ``self`` / ``cls``)."""
    own = _own_private_names() if own is None else own
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        modules = []
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        for m in modules:
            if any(m == p or m.startswith(p if p.endswith("_") else p + ".")
                   for p in PRIVATE_IMPORTS):
                found.append((node.lineno, f"import {m}"))
                break
        if (isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
            found.append((node.lineno, f".{node.attr}"))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
                and _private(node.args[1].value) and node.args[1].value not in own):
            found.append((node.lineno, f"{node.func.id}(..., {node.args[1].value!r})"))
    return found


@pytest.fixture(scope="module")
def own_private_names():
    return _own_private_names()


@pytest.mark.parametrize("path", [p for p in SOURCES if _relative(p) not in FENCES],
                         ids=_relative)
def test_private_apis_of_keras_tensorflow_litert_only_behind_the_fences(path, own_private_names):
    assert foreign_private_uses(path, own_private_names) == []


@pytest.mark.parametrize("fence", FENCES)
def test_each_fenced_use_names_its_public_replacement(fence):
    tree = ast.parse((PACKAGE / fence).read_text(encoding="utf-8"))
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef) and not _private(n.name)]
    assert functions
    for fn in functions:
        assert "Public replacement:" in (ast.get_docstring(fn) or ""), fn.name
    assert foreign_private_uses(PACKAGE / fence), "a fence with nothing behind it"


def test_the_fence_check_can_fail(monkeypatch):
    fake = PACKAGE / "_core" / "_fence_probe_never_written.py"
    source = ("from keras.src.saving import serialization_lib\n"
              "from tensorflow.lite.python import convert\n"
              "import tensorflow.python.framework\n"
              "n = layer._inbound_nodes\n"
              "m = self._inbound_nodes\n"
              "f = getattr(model, '_functional', None)\n")
    _pretend_file(monkeypatch, fake, source)
    assert foreign_private_uses(fake, own=set()) == [
        (1, "import keras.src.saving"), (2, "import tensorflow.lite.python"),
        (3, "import tensorflow.python.framework"), (4, "._inbound_nodes"),
        (6, "getattr(..., '_functional')")]
