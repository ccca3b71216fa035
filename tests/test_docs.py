"""The docs cannot go stale: generated blocks are well formed and come from a script (the
cheap ones are regenerated here and compared), and the README's Python code blocks and command
lines run.
"""

import contextlib
import ast
import glob
import importlib.util
import io
import os
import re
import shlex
import tokenize

import keras
import numpy as np
import pytest

from cle import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(REPO, "scripts")
DOCS = [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))
CODE = sorted(glob.glob(os.path.join(REPO, "cle", "**", "*.py"), recursive=True))


def _script(name):
    spec = importlib.util.spec_from_file_location(f"_docs_{name}",
                                                  os.path.join(SCRIPTS, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


docblocks = _script("_docblocks")


def _fenced(path, lang):
    """(line before the fence, code) of every ```lang block of a Markdown file."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    found, k = [], 0
    while k < len(lines):
        if lines[k].startswith("```"):
            tag = lines[k][3:].strip()
            end = k + 1
            while not lines[end].startswith("```"):
                end += 1
            if tag == lang:
                found.append((lines[k - 1] if k else "", "\n".join(lines[k + 1:end]) + "\n"))
            k = end + 1
        else:
            k += 1
    return found


@pytest.mark.parametrize("path", DOCS, ids=os.path.basename)
def test_generated_blocks_are_well_formed_and_have_a_generator(path):
    for name, body in docblocks.blocks(path).items():
        prefix = [p for p in docblocks.GENERATORS if name.startswith(p)]
        assert prefix, f"{path}: block '{name}' has no generator in scripts/_docblocks.py"
        assert os.path.isfile(os.path.join(SCRIPTS, docblocks.GENERATORS[prefix[0]]))
        assert body.strip(), f"{path}: block '{name}' is empty: run make results"


def test_replace_block(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("a\n<!-- generated:x-1 -->\nold\n<!-- /generated:x-1 -->\nb\n")
    assert docblocks.replace_block(str(doc), "x-1", "new\nlines")
    assert doc.read_text() == "a\n<!-- generated:x-1 -->\nnew\nlines\n<!-- /generated:x-1 -->\nb\n"
    assert not docblocks.replace_block(str(doc), "x-1", "new\nlines\n")
    with pytest.raises(KeyError, match="no block"):
        docblocks.replace_block(str(doc), "y", "z")
    doc.write_text("<!-- generated:x -->\nold\n")
    with pytest.raises(ValueError, match="unbalanced"):
        docblocks.blocks(str(doc))


def test_cli_docs_are_what_the_generator_writes(monkeypatch):
    """`cle --help`, the example session and its report in docs/cli.md are current."""
    monkeypatch.setenv("COLUMNS", "100")
    gen = _script("gen_cli_docs")
    current = docblocks.blocks(gen.DOC)
    for name, text in gen.generate().items():
        assert current[name] == docblocks.render(text), (
            f"docs/cli.md block '{name}' is stale: run python scripts/gen_cli_docs.py")


def test_targets_table_is_what_the_generator_writes():
    gen = _script("gen_targets_docs")
    found = docblocks.blocks(gen.DOC)
    text = docblocks.render(gen.generate(measured=False)["targets-table"])
    assert found["targets-table"] == text, (
        "docs/targets.md block 'targets-table' is stale: run python scripts/gen_targets_docs.py")


def test_int8_blocks_are_what_the_saved_measurements_give():
    """The INT8 tables (results.md, README, the margin sweep, the range-model fit) render the
    rows that scripts/gen_int8_results.py saved in docs/data; nobody edited a figure by hand."""
    gen = _script("gen_int8_results")
    expected = gen.rendered()
    assert {name for _, name in expected} >= {"int8-mobilenet_v2", "int8-efficientnet_lite1",
                                              "int8-summary", "int8-margins", "int8-modes",
                                              "int8-range-fit"}
    for (doc, name), text in expected.items():
        current = docblocks.blocks(os.path.join(REPO, doc))
        assert current[name] == docblocks.render(text), (
            f"{doc} block '{name}' is stale: run python scripts/gen_int8_results.py --render")


def test_w4a8_blocks_are_what_the_saved_measurements_give():
    """The W4A8 tables of docs/quantize_w4.md render the rows of benchmarks/bench_w4a8.py,
    bench_w4a8_knobs.py, bench_w4a8_apps.py, bench_w4_generalize.py, bench_w4_distinct.py and
    bench_w4_distill.py that scripts/gen_w4a8_results.py saved in docs/data; nobody edited a
    figure by hand."""
    gen = _script("gen_w4a8_results")
    expected = gen.rendered()
    assert {name for _, name in expected} == {"w4a8-goals", "w4a8-candidates", "w4a8-knobs",
                                              "w4a8-apps", "w4a8-generalize", "w4a8-distinct",
                                              "w4a8-distill"}
    for (doc, name), text in expected.items():
        assert "Measured on " in text
        current = docblocks.blocks(os.path.join(REPO, doc))
        assert current[name] == docblocks.render(text), (
            f"{doc} block '{name}' is stale: run python scripts/gen_w4a8_results.py --render")


def test_demo_blocks_have_the_generator_format():
    gen = _script("gen_demo_results")
    cli_md = docblocks.blocks(os.path.join(REPO, "docs", "cli.md"))
    results = docblocks.blocks(os.path.join(REPO, "docs", "results.md"))
    output = cli_md["demo-output"]
    assert output.startswith("```\n$ cle demo\n[1/6]")
    for row in ("TF Lite's converter, 64 photos", "cle quantize, 64 photos",
                "cle quantize, no data"):
        assert row in output and row in results["demo-table"]
    assert "run the same yourself:" in output and "      $ cle quantize " in output
    assert re.search(r"\ndone in \d+\.\d s\n```\n\nMeasured on .+, \d+ cores\.\n$", output)
    assert results["demo-table"].startswith("`cle demo`: MobileNetV2 INT8 (per-channel weights) "
                                            "judged on 128 photo crops")
    assert results["demo-equalization-table"].startswith(
        "`cle demo --equalization`: 128 photo crops, TFLite calibrated on the first 32")
    assert results["demo-spread"].startswith("| | after BN folding | after equalization |")
    assert callable(gen.tables) and callable(gen.demo_table)
    assert os.path.exists(os.path.join(REPO, "docs", "img", "cle_demo_analysis.png"))


@pytest.fixture(scope="module")
def tiny_model():
    return _script("gen_cli_docs").tiny_cnn()


def test_readme_python_blocks_run(tiny_model, tmp_path, monkeypatch):
    import cle

    monkeypatch.chdir(tmp_path)
    blocks = _fenced(os.path.join(REPO, "README.md"), "python")
    assert len(blocks) >= 3
    ran = 0
    x = np.random.default_rng(0).uniform(-1, 1, (16,) + tuple(tiny_model.inputs[0].shape[1:]))
    # the blocks read as one session; x stands for the user's calibration inputs
    namespace = {"model": tiny_model, "keras": keras, "x": x.astype("float32")}
    for before, code in blocks:
        if "qat.compile(...)" in code:  # needs a dataset: training_fold.md's example trains
            code = code.replace("qat.compile(...); qat.fit(...)", "")
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(code, "README.md", "exec"), namespace)
        ran += 1
    assert ran == len(blocks)
    assert [w.shape for w in tiny_model.get_weights()] == [
        w.shape for w in _script("gen_cli_docs").tiny_cnn().get_weights()]


def test_readme_command_lines_run(tiny_model, tmp_path, monkeypatch):
    from cle._measure.input_range import PIXEL_MEAN, PIXEL_STD

    monkeypatch.chdir(tmp_path)
    # The README's no-data line has no flag: it is for a model that tells its input range.
    # The tiny model's input batch norm is given what natural images in [-1, 1] make of it.
    model = keras.models.clone_model(tiny_model)
    model.set_weights(tiny_model.get_weights())
    gamma, beta, _, _ = model.get_layer("input_bn").get_weights()
    model.get_layer("input_bn").set_weights([gamma, beta, PIXEL_MEAN / 127.5 - 1.0,
                                             (PIXEL_STD / 127.5) ** 2])
    model.save("model.keras")
    np.save("inputs.npy", np.random.default_rng(0).uniform(
        -1, 1, (16,) + tuple(tiny_model.inputs[0].shape[1:])).astype("float32"))
    commands = [line.split("#")[0].strip() for _, code in _fenced(
        os.path.join(REPO, "README.md"), "") for line in code.splitlines()
        if line.startswith("cle ")]
    assert "cle demo" in commands  # run by tests/test_cli.py::test_run_demo (16 photos)
    commands.remove("cle demo")
    assert len(commands) == 7
    for command in commands:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            assert cli.main(shlex.split(command)[1:]) == 0, (command, out.getvalue())
    assert sorted(os.listdir(tmp_path)) == ["analysis.png", "eq.keras", "folded.keras",
                                            "inputs.npy", "model.keras", "model_int8.tflite",
                                            "model_int8_vela.tflite", "model_nodata.tflite",
                                            "report.json"]


def test_cli_md_loading_block_runs(tmp_path, monkeypatch, tiny_model):
    import cle

    monkeypatch.chdir(tmp_path)
    # objective="weights" scales every set, so the saved model holds ClippedReLUs to load
    cle.equalize_model(tiny_model, objective="weights").save("tiny_cle.keras")
    code = [c for _, c in _fenced(os.path.join(REPO, "docs", "cli.md"), "python")
            if "cle.load_model" in c]
    assert len(code) == 1
    namespace = {}
    exec(compile(code[0], "docs/cli.md", "exec"), namespace)
    assert isinstance(namespace["model"].get_layer("stem_relu6"), cle.ClippedReLU)


# A measured figure: a number with a unit a measurement carries (percent, dB, a ratio "1.3×" /
# "10x" — not a shape like "224×224" or "1 x 1" —, seconds, minutes, MB/GB).
FIGURE_RE = re.compile(
    r"\d(\.\d+)?\s?(%|dB|×(?!\s?\d)|x(?=[\s),.;:]|$)(?!\s?\d)|s|ms|min|MB|GB)(?!\w)")

# Lines with such a figure outside generated blocks. These are stated bounds and budgets, not
# measurements: the counts may only go down, and every other document must have none.
HAND_FIGURES = {
    "README.md": 0,
    # two quality bounds the test-suite section names ("gain >= 1 dB", "not > 0 dB") and its
    # float32 round-off example (2 %)
    "docs/design.md": 3,
    # the demo's time budget (a target)
    "docs/cli.md": 1,
    "docs/results.md": 0,
}


@pytest.mark.parametrize("path", DOCS, ids=os.path.basename)
def test_no_new_hand_copied_figures(path):
    with open(path, encoding="utf-8") as f:
        text = docblocks.BLOCK_RE.sub("", f.read())
    lines = [line for line in text.splitlines() if FIGURE_RE.search(line)]
    allowed = HAND_FIGURES.get(os.path.relpath(path, REPO), 0)
    assert len(lines) <= allowed, (
        f"{os.path.relpath(path, REPO)} has measured figures outside generated blocks; write "
        "them with a scripts/gen_*.py into a <!-- generated:NAME --> block:\n" + "\n".join(lines))


def _comments_and_docstrings(path):
    """(line number, text) of every comment and every line of every docstring of a module."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    found = [(tok.start[0], tok.string) for tok in
             tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                first = node.body[0].lineno
                found += [(first + k, line) for k, line in enumerate(doc.splitlines())]
    return sorted(found)


# Lines of the library's comments and docstrings with such a figure that is no measurement: a
# statistical level or a bound stated as a constant, or a size computed from a shape. The
# counts may only go down; every other module must have none.
CODE_STATED = {
    "cle/_math/moments.py": 1,  # the size of one layer's matrix, computed from its fan-in
    "cle/_measure/check.py": 1,  # a top-1 agreement that "can hardly fall below 100 %"
    "cle/_measure/ties.py": 4,  # the rule of three's 95 % level; "100 %" as above
    "cle/_quantize/analysis_stats.py": 1,  # the middle share of values a range spans
    "cle/_quantize/choice.py": 1,  # the choice's interval level
    "cle/_quantize/rounding.py": 3,  # sizes computed from a fan-in; the figure's precision
    "cle/_transforms/stable.py": 1,  # the rounding error of one step over 254, computed
}


@pytest.mark.parametrize("path", CODE, ids=lambda p: os.path.relpath(p, REPO))
def test_no_hand_copied_figures_in_code(path):
    """The same guard over the library's comments and docstrings, every subpackage included: a
    measured figure there goes stale as silently as in a document; point at the generated docs
    (or the test that measures it) instead."""
    rel = os.path.relpath(path, REPO).replace(os.sep, "/")
    lines = [f"{rel}:{n}: {text.strip()}"
             for n, text in _comments_and_docstrings(path) if FIGURE_RE.search(text)]
    assert len(lines) <= CODE_STATED.get(rel, 0), (
        "measured figures in comments or docstrings; point at the generated docs instead:\n"
        + "\n".join(lines))


def test_the_code_guard_reads_every_subpackage():
    assert os.path.join(REPO, "cle", "_measure", "check.py") in CODE
    assert all(os.path.join(REPO, *p.split("/")) in CODE for p in CODE_STATED)


def test_the_code_guard_sees_comments_and_docstrings(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text('"""Doc: 3 dB."""\n\n\ndef f():\n    """Fine.\n\n    2.5x faster."""\n'
                   '    return "4 dB"  # took 12 s\n')
    hits = [n for n, text in _comments_and_docstrings(str(mod)) if FIGURE_RE.search(text)]
    assert hits == [1, 7, 8]  # the string literal "4 dB" is code, not prose
    assert not FIGURE_RE.search("a 1 x 1 convolution") and FIGURE_RE.search("about 10x")


def test_backends_suite_block_reports_counts_and_names_every_failure():
    """benchmarks/backends.py --suite (block backends-torch-suite) reads pytest's summary lines:
    the counts and time per command, every FAILED / ERROR test by id, and a command that ended
    without a summary (killed, crashed); a failure is never reduced to a count."""
    spec = importlib.util.spec_from_file_location(
        "_docs_backends", os.path.join(REPO, "benchmarks", "backends.py"))
    backends = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backends)
    assert "backends-torch-suite" in docblocks.blocks(os.path.join(REPO, "docs", "backends.md"))
    ok = backends.parse_pytest_output([
        "....s..", "SKIPPED [7] tests/test_quantization.py:40: no TF Lite | on torch",
        "753 passed, 19 skipped, 65 deselected in 219.12s (0:03:39)"])
    assert ok["counts"] == {"passed": 753, "skipped": 19, "failed": 0, "errors": 0,
                            "deselected": 65}
    assert ok["seconds"] == 219.12 and ok["problems"] == []
    bad = backends.parse_pytest_output([
        "..F.E", "=== short test summary info ===",
        "FAILED tests/test_cli.py::test_x[a-b] - AssertionError: assert 1 < 0.5",
        "ERROR tests/test_q.py::test_y - RuntimeError: boom",
        "========== 1 failed, 3 passed, 1 error in 5.01s ==========",
    ])
    assert bad["counts"]["failed"] == 1 and bad["counts"]["errors"] == 1
    assert [p[1] for p in bad["problems"]] == ["tests/test_cli.py::test_x[a-b]",
                                              "tests/test_q.py::test_y"]
    killed = backends.parse_pytest_output(["...", "Killed"])
    assert killed["counts"] is None
    cmds = backends.SUITE_COMMANDS
    text = backends.render_suite("PyTorch", "torch", "torch 2, keras 3",
                                 [(cmds[0], 0, 220.0, ok, []), (cmds[1], 1, 6.0, bad, []),
                                  (cmds[2], -9, 30.0, killed, ["...", "Killed"])],
                                 (3.2, 2.5, 2.0), 2)
    assert "| 753 | 19 | 0 | 0 | 65 |" in text
    assert "FAILED `tests/test_cli.py::test_x[a-b]`: AssertionError" in text
    assert "ERROR `tests/test_q.py::test_y`: RuntimeError: boom" in text
    assert "did not finish normally** (exit code -9)" in text
    assert "No test failed" not in text
    assert "no TF Lite &#124; on torch" in text  # a "|" in a reason does not split the table
    assert "No test failed" in backends.render_suite(
        "PyTorch", "torch", "", [(cmds[0], 0, 220.0, ok, [])], (1.0, 1.0, 1.0), 2)
