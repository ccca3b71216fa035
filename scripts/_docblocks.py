"""Generated blocks in Markdown files: the one mechanism by which measured figures and command
output get into README.md and docs/.

A generated block is delimited by two HTML comments, which Markdown does not render::

    <!-- generated:NAME -->
    ...text written by a script under scripts/...
    <!-- /generated:NAME -->

A script computes the text and calls :func:`replace_block`; ``make results`` runs every
script. Nothing between the markers is edited by hand: the next run overwrites it. Each script
names its blocks ``<script topic>-<what>``, and ``tests/test_docs.py`` checks that every block
is well formed, that every block has a script that writes it (:data:`GENERATORS`), and, for
the cheap generators, that the text in the file is what the script writes today.
"""

from __future__ import annotations

import os
import re
import textwrap

__all__ = ["GENERATORS", "BLOCK_RE", "blocks", "replace_block", "render", "publish",
           "fmt_error", "wrap"]

#: Block name prefix -> the script (under scripts/) that writes blocks with that prefix.
GENERATORS = {
    "cli-": "gen_cli_docs.py",
    "demo-": "gen_demo_results.py",
    "applications": "applications_report.py",
    "cost": "../benchmarks/bench_cost.py",
    "backends-": "../benchmarks/backends.py",
    "int8-": "gen_int8_results.py",
    "training-": "gen_training_fold_docs.py",
    "exactness-": "gen_exactness_docs.py",
    "bias-correction-": "../benchmarks/bench_bias_correction.py",
    "quantize-": "gen_quantize_results.py",
    "analyze-": "gen_analysis_docs.py",
    "w4a8-": "gen_w4a8_results.py",
    "zoo": "gen_zoo_results.py",
    "targets-": "gen_targets_docs.py",
    "deploy-": "../benchmarks/bench_targets.py",
}

# Markers count only on a line of their own (a marker quoted in running text is not one).
BLOCK_RE = re.compile(
    r"^<!-- generated:(?P<name>[\w.-]+) -->\n(?P<body>.*?)^<!-- /generated:(?P=name) -->$",
    re.DOTALL | re.MULTILINE,
)


def blocks(path: str) -> dict[str, str]:
    """``{name: text}`` of every generated block in a file (text without the markers).

    Raises:
        ValueError: a marker without its partner, or a name used twice.
    """
    with open(path, encoding="utf-8") as f:
        text = f.read()
    found = {}
    for m in BLOCK_RE.finditer(text):
        if m.group("name") in found:
            raise ValueError(f"{path}: generated block '{m.group('name')}' appears twice")
        found[m.group("name")] = m.group("body")
    opened = re.findall(r"(?m)^<!-- generated:([\w.-]+) -->$", text)
    closed = re.findall(r"(?m)^<!-- /generated:([\w.-]+) -->$", text)
    if sorted(opened) != sorted(found) or sorted(closed) != sorted(found):
        raise ValueError(f"{path}: unbalanced generated-block markers (opened {opened}, "
                         f"closed {closed})")
    return found


def render(text: str) -> str:
    """Body as stored between the markers: the text with exactly one final newline."""
    return text.rstrip("\n") + "\n"


def replace_block(path: str, name: str, text: str) -> bool:
    """Replace the body of block ``name`` in ``path`` by ``text``.

    Returns:
        True if the file changed.

    Raises:
        KeyError: the file has no block ``name`` (add the two markers by hand once, where the
            block belongs).
    """
    current = blocks(path)
    if name not in current:
        raise KeyError(f"{path} has no block <!-- generated:{name} -->; add the two markers "
                       "where it belongs")
    with open(path, encoding="utf-8") as f:
        text_before = f.read()
    m = next(m for m in BLOCK_RE.finditer(text_before) if m.group("name") == name)
    i, j = m.start("body"), m.end("body")
    new = text_before[:i] + render(text) + text_before[j:]
    if new == text_before:
        return False
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(new)
    os.replace(tmp, path)
    return True


def publish(items, print_only=False, root=None) -> None:
    """Write (or, with ``print_only``, print) generated blocks: ``items`` are
    ``(path, name, text)``; one line per block says whether the file changed."""
    for path, name, text in items:
        shown = os.path.relpath(path, root) if root else str(path)
        if print_only:
            print(f"== {shown}: {name}\n{text}\n")
        else:
            changed = replace_block(path, name, text)
            print(f"{shown}: {name} {'updated' if changed else 'unchanged'}")


def fmt_error(v: float) -> str:
    """A measured error as the docs show it: ``0`` when exact, else two significant digits
    (``2.7e-7``)."""
    if v == 0:
        return "0"
    mantissa, exponent = f"{v:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def wrap(text: str) -> str:
    """A paragraph wrapped at 100 columns, as the docs' hand-written prose."""
    return textwrap.fill(text, 100, break_long_words=False, break_on_hyphens=False)


def cpu_name() -> str:
    """The CPU model name (Linux ``/proc/cpuinfo``): measured times name the machine."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"
