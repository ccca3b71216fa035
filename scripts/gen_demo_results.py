"""Runs ``cle demo`` and ``cle demo --equalization`` (the real ImageNet MobileNetV2, about two
and one and a half minutes on 2 cores) and writes their figures into the docs:

- docs/cli.md ``demo-output``: the demo's whole output, step times and total included;
- docs/results.md ``demo-table``: its table, the three builds judged on photos none calibrated on;
- docs/img/cle_demo_analysis.png: the picture ``cle analyze`` drew in the demo;
- docs/results.md ``demo-equalization-table``: the before/after equalization table;
- docs/results.md ``demo-spread``: the weight range spread.

Run: ``python scripts/gen_demo_results.py`` (``make results`` runs it with the other
generators). Too slow for the test suite; tests/test_docs.py checks the blocks' form and that
they came from this script's format (their headers).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
# The checkout this script is in, not whichever one the environment installed in editable mode.
sys.path.insert(0, REPO)

from _docblocks import cpu_name, replace_block  # noqa: E402


def _pct(v):
    return "–" if v is None else f"{100.0 * v:.1f}%"


def _db(v):
    if v is None:
        return "–"
    return "∞" if v == float("inf") else f"{v:.1f}"


def demo_table(result) -> str:
    """The markdown table of a :func:`cle.demo.run_demo` result."""
    from cle._cli.demo import check_cell

    lines = [
        f"`cle demo`: MobileNetV2 INT8 (per-channel weights) judged on {result['images']} photo "
        f"crops none of the builds calibrated on; {result['calibration']} other crops to "
        "calibrate; top-1 agreement / logit SQNR (dB, 90% interval) against the float model:",
        "",
        "| | top-1 agreement | SQNR dB | against the converter | time | `cle quantize`'s own "
        "check |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["rows"].values():
        low, high = r["sqnr_interval"]
        gain = "–" if "gain_db" not in r else f"{r['gain_db']:+.1f} dB ({r['verdict']})"
        check = "–" if r["check"] is None else check_cell(r["check"])
        lines.append(f"| {r['name']} | {_pct(r['top1_agreement'])} | {r['sqnr_db']:.1f} "
                     f"({low:.1f} to {high:.1f}) | {gain} | {r['seconds']:.0f} s | {check} |")
    return "\n".join(lines)


def tables(result) -> dict[str, str]:
    """Markdown tables of a :func:`cle.demo.run_equalization_demo` result."""
    n_cal = result.get("calibration")
    lines = [
        f"`cle demo --equalization`: {result['images']} photo crops, TFLite calibrated on the first "
        f"{n_cal}, default `equalize_model` options:",
        "",
        "| | original: top-1 | original: SQNR dB | equalized: top-1 | equalized: SQNR dB |",
        "|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        o, e = r["original"], r["equalized"]
        lines.append(f"| {r['name']} | {_pct(o['top1_agreement'])} | {_db(o['sqnr_db'])} | "
                     f"{_pct(e['top1_agreement'])} | {_db(e['sqnr_db'])} |")
    folded, eq = result["spread"]["folded"], result["spread"]["equalized"]
    names = [n for n in folded if n in eq]
    first = result["first_depthwise"]

    def med(d):
        vals = sorted(d[n] for n in names)
        k = len(vals) // 2
        return vals[k] if len(vals) % 2 else 0.5 * (vals[k - 1] + vals[k])

    spread = [
        "| | after BN folding | after equalization |",
        "|---|---|---|",
        f"| `expanded_conv_depthwise` | {first['folded']:.2f} | {first['equalized']:.2f} |",
        f"| median over {len(names)} layers | {med(folded):.2f} | {med(eq):.2f} |",
        f"| largest | {max(folded[n] for n in names):.2f} | {max(eq[n] for n in names):.2f} |",
    ]
    return {"demo-equalization-table": "\n".join(lines), "demo-spread": "\n".join(spread)}


def _run(fn, **kwargs):
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        result = fn(out_dir=tmp, print_fn=lambda *a: out.append(" ".join(map(str, a))),
                    **kwargs)
        if result.get("png") and fn.__name__ == "run_demo":
            shutil.copyfile(result["png"], os.path.join(REPO, "docs", "img", "cle_demo_analysis.png"))
        text = "\n".join(out).replace(tmp, "cle_demo")
    return result, text


def main():
    from cle import demo

    result, text = _run(demo.run_demo)
    machine = f"Measured on {cpu_name()}, {os.cpu_count()} cores."
    blocks = {("docs/cli.md", "demo-output"): f"```\n$ cle demo\n{text}\n```\n\n{machine}",
              ("docs/results.md", "demo-table"): f"{demo_table(result)}\n\n{machine}"}
    result, _ = _run(demo.run_equalization_demo)
    result["calibration"] = min(demo.EQUALIZATION_CALIBRATION, result["images"])
    for name, body in tables(result).items():
        blocks[("docs/results.md", name)] = body
    for (doc, name), body in blocks.items():
        changed = replace_block(os.path.join(REPO, doc), name, body)
        print(f"{doc}: {name} {'updated' if changed else 'unchanged'}")


if __name__ == "__main__":
    main()
