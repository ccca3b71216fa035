"""Runs ``cle demo`` (the real ImageNet MobileNetV2, about 90 s on 2 cores) and writes its
figures into the docs:

- docs/cli.md ``demo-output``: the demo's whole output, step times and total included;
- docs/results.md ``demo-table``: the before/after table;
- docs/results.md ``demo-spread``: the weight range spread.

Run: ``python scripts/gen_demo_results.py`` (``make results`` runs it with the other
generators). Too slow for the test suite; tests/test_docs.py checks the blocks' form and that
they came from this script's format (their headers).
"""

from __future__ import annotations

import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from _docblocks import cpu_name, replace_block  # noqa: E402


def _pct(v):
    return "–" if v is None else f"{100.0 * v:.1f}%"


def _db(v):
    if v is None:
        return "–"
    return "∞" if v == float("inf") else f"{v:.1f}"


def tables(result) -> dict[str, str]:
    """Markdown tables of a :func:`cle.demo.run_demo` result."""
    n_cal = result.get("calibration")
    lines = [
        f"`cle demo`: {result['images']} photo crops, TFLite calibrated on the first "
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
    return {"demo-table": "\n".join(lines), "demo-spread": "\n".join(spread)}


def main():
    from cle import demo

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        result = demo.run_demo(out_dir=tmp, print_fn=lambda *a: out.append(" ".join(map(str, a))))
    result["calibration"] = min(demo.DEFAULT_CALIBRATION, result["images"])
    text = "\n".join(out).replace(tmp, "cle_demo")
    blocks = {("docs/cli.md", "demo-output"):
              f"```\n$ cle demo\n{text}\n```\n\nMeasured on {cpu_name()}, {os.cpu_count()} cores."}
    for name, body in tables(result).items():
        blocks[("docs/results.md", name)] = body
    for (doc, name), body in blocks.items():
        changed = replace_block(os.path.join(REPO, doc), name, body)
        print(f"{doc}: {name} {'updated' if changed else 'unchanged'}")


if __name__ == "__main__":
    main()
