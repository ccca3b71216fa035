"""The documentation site: it builds with ``mkdocs build --strict`` (no warning, no broken
link or anchor, no unresolved API reference), every public name has a rendered reference entry
with its signature and docstring, and every code block of the task pages and of the AIMET page
runs.

The docs packages are in the ``test`` extra (``make test`` installs them), so the build is
never skipped for want of mkdocs.
"""

from __future__ import annotations

import contextlib
import html
import io
import os
import re
import subprocess
import sys

import keras
import pytest
from conftest import BACKEND

import cle

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO, "docs")

#: Pages whose every fenced block is Python that runs, in order, as one session.
RUNNABLE_PAGES = ["quantize_int8.md", "stepwise_cle.md", "qat.md", "reading_the_report.md",
                  "coming_from_aimet.md"]

FENCE_RE = re.compile(r"^(?P<indent> *)```(?P<info>[^\n`]*)\n(?P<code>.*?)^(?P=indent)```\s*$",
                      re.DOTALL | re.MULTILINE)


GENERATED_RE = re.compile(r"<!-- generated:(?P<name>[\w-]+) -->.*?<!-- /generated:(?P=name) -->",
                          re.DOTALL)


def code_blocks(page, with_recorded=False):
    """``[(info string, code)]`` of every fenced block of ``docs/<page>``, in order.

    A ```console block inside a generated region (``<!-- generated:NAME -->``, written by a
    script under ``scripts/`` from a recorded run) is output a reader reads, not code that runs:
    it is left out unless ``with_recorded``."""
    with open(os.path.join(DOCS, page), encoding="utf-8") as f:
        text = f.read()
    generated = [m.span() for m in GENERATED_RE.finditer(text)]
    out = []
    for m in FENCE_RE.finditer(text):
        recorded = m.group("info").strip() == "console" and any(
            a <= m.start() < b for a, b in generated)
        if recorded and not with_recorded:
            continue
        indent = len(m.group("indent"))
        code = "\n".join(line[indent:] for line in m.group("code").splitlines()) + "\n"
        out.append((m.group("info").strip(), code))
    return out


# Whole keras.applications networks (slow): on JAX skipped like the other slow tests
# (tests/conftest.py); they run in the TensorFlow run.
SLOW_PAGES = {"stepwise_cle.md"}


@pytest.mark.parametrize("page", [pytest.param(p, marks=pytest.mark.slow) if p in SLOW_PAGES
                                  else p for p in RUNNABLE_PAGES])
def test_page_code_blocks_run(page, tmp_path, monkeypatch):
    """Each block is ```python with a title (what the reader sees above it), and the page's
    blocks run in order in one namespace, in an empty working directory."""
    blocks = code_blocks(page)
    assert len(blocks) >= 3, page
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"docs_{page[:-3]}"}
    for info, code in blocks:
        assert re.fullmatch(r'(python|bash) title="[^"]+"', info), (
            f"docs/{page}: every block on a runnable page is ```python title=\"...\"``` "
            f"or ```bash title=\"...\"``` of `cle` commands; found ```{info}")
        title = re.search(r'title="([^"]+)"', info).group(1)
        if info.startswith("bash"):
            _run_cle_lines(page, title, code)
            continue
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                exec(compile(code, f"docs/{page}: {title}", "exec"), namespace)
            except Exception as exc:
                raise AssertionError(f"docs/{page}, block '{title}' failed: {exc!r}\n"
                                     f"printed:\n{out.getvalue()}") from exc
    keras.backend.clear_session()


def _run_cle_lines(page, title, code):
    """Every line of a ```bash block is a `cle` command, run as the console script would run
    it (``cle.cli.main``), and must succeed."""
    import shlex

    from cle.cli import main

    for line in code.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        argv = shlex.split(line)
        assert argv[0] == "cle", f"docs/{page}, block '{title}': not a cle command: {line}"
        assert main(argv[1:]) == 0, f"docs/{page}, block '{title}': failed: {line}"


@pytest.mark.parametrize("page", RUNNABLE_PAGES + ["cli.md"])
def test_recorded_console_blocks_show_commands_the_parser_takes(page):
    """A recorded ```console block is not run, so its command line is checked instead: each
    ``$ cle ...`` line parses with today's parser (a renamed option fails here)."""
    import shlex

    from cle.cli import build_parser

    for info, code in code_blocks(page, with_recorded=True):
        if info != "console":
            continue
        commands = [line[2:] for line in code.splitlines() if line.startswith("$ ")]
        assert commands, f"docs/{page}: a recorded console block shows no `$ cle` command"
        for line in commands:
            argv = shlex.split(line)
            assert argv[0] == "cle", f"docs/{page}: not a cle command: {line}"
            build_parser().parse_args(argv[1:])


def test_runnable_pages_are_in_the_site_navigation():
    with open(os.path.join(REPO, "mkdocs.yml"), encoding="utf-8") as f:
        config = f.read()
    for page in RUNNABLE_PAGES:
        assert re.search(rf":\s*{re.escape(page)}\s*$", config, re.MULTILINE), page


# --------------------------------------------------------------------------- the built site


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    if BACKEND != "tensorflow":
        pytest.skip(f"the site build reads the sources statically and does not depend on the "
                    f"Keras backend; it runs in the TensorFlow run (running on {BACKEND})")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONPATH=REPO)
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         os.path.join(REPO, "mkdocs.yml"), "--site-dir", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("WARNING")]
    assert not warnings, warnings
    return out


def _page(site, *parts):
    with open(os.path.join(site, *parts, "index.html"), encoding="utf-8") as f:
        return f.read()


def _words(text):
    """The words of a text, without reST roles (``:func:``), marks and punctuation."""
    return re.findall(r"\w+", re.sub(r":[a-z]+:", " ", text))


def _text(fragment):
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def test_site_builds_strict_with_search(site):
    assert os.path.isfile(os.path.join(site, "index.html"))
    assert os.path.isfile(os.path.join(site, "search", "search_index.json"))
    home = _page(site)
    for page in RUNNABLE_PAGES:
        assert f'href="{page[:-3]}/"' in home, page


def test_every_public_name_has_a_reference_entry(site):
    """Every name in ``cle.__all__`` has a heading with its anchor in the API reference,
    a signature and the first line of its docstring."""
    reference = {}
    for root, _, files in os.walk(os.path.join(site, "reference")):
        for name in files:
            if name == "index.html":
                with open(os.path.join(root, name), encoding="utf-8") as f:
                    reference[root] = f.read()
    assert reference
    roles = [root for root, text in reference.items() if re.search(r":(func|class):", text)]
    assert not roles, f"reST roles shown literally (scripts/griffe_roles.py): {roles}"
    missing = []
    for name in cle.__all__:
        module = cle._EXPORTS.get(name, "cle")
        anchor = f'id="{module}.{name}"'
        page = next((text for text in reference.values() if anchor in text), None)
        if page is None:
            missing.append(f"{name}: no heading {anchor}")
            continue
        start = page.index(anchor)
        entry = page[start:start + 40000]
        obj = getattr(cle, name)
        if callable(obj) and not isinstance(obj, type):
            if "doc-signature" not in entry[:20000]:
                missing.append(f"{name}: no signature")
        first_line = (obj.__doc__ or "").strip().splitlines()[0]
        words = _words(first_line)[:5]
        if not words or " ".join(words) not in " ".join(_words(_text(entry))):
            missing.append(f"{name}: docstring '{first_line}' not rendered")
    assert not missing, "\n".join(missing)


def test_figures_are_drawn_from_the_saved_measurements(tmp_path):
    """scripts/gen_doc_figures.py draws the site's charts from docs/data alone (``--render``),
    and the site shows the PNGs it writes."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_gen_doc_figures", os.path.join(REPO, "scripts", "gen_doc_figures.py"))
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    for draw, name in ((gen.int8_chart, "int8_quality.png"),
                       (gen.ranges_chart, "layer_ranges_mobilenet_v2.png")):
        out = draw(out=str(tmp_path / name))
        with open(out, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert os.path.isfile(os.path.join(DOCS, "img", name)), name
    with open(os.path.join(DOCS, "figures.md"), encoding="utf-8") as f:
        figures = f.read()
    assert "img/int8_quality.png" in figures and "img/layer_ranges_mobilenet_v2.png" in figures
