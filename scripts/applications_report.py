"""Per-model BN folds and scaling sets of every keras.applications constructor, into docs.

    .venv/bin/python scripts/applications_report.py            # all models, updates the docs
    .venv/bin/python scripts/applications_report.py --print MobileNetV3Small

Each model is built at the smallest square input it accepts with ``weights=None`` and run
through ``cle.equalize_model(model, return_report=True)`` (defaults), one model alive at a time.
The counts do not depend on weight values: a set counts when it is found, whether or not the
default objective then scales it (that depends on the BN statistics). Models with no set get
one line per distinct reason (``EqualizationReport.reasons()``), not one per layer.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import gc  # noqa: E402
import pathlib  # noqa: E402
import sys  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))

import keras  # noqa: E402

import cle  # noqa: E402
from _apps import application_constructors, build_smallest  # noqa: E402
from _docblocks import replace_block  # noqa: E402

PAGE = ROOT / "docs" / "applications.md"


def row(name, ctor):
    model, size = build_smallest(ctor)
    n_bn = sum(isinstance(la, keras.layers.BatchNormalization) for la in model._flatten_layers())
    _, report = cle.equalize_model(model, return_report=True)
    # Every set found is in report.scaling, scaled or left (whether the default objective
    # scales a set depends on the BN statistics; what is found does not).
    found = report.scaling
    n_pairs = sum(len(d.layers) == 2 for d in found)
    line = (f"| {name} | {size}×{size} | {n_bn} | {len(report.folded)} | "
            f"{len(report.fold_skipped)} | {len(found)} | {n_pairs} | "
            f"{len(found) - n_pairs} |")
    why = []
    if not found:
        why = [f"- **{name}**: {count}× {reason}" for what, reason, count, _ in report.reasons()
               if what == "set end"]
        if not why:
            why = [f"- **{name}**: no layer that can start a set"]
    del model, report
    gc.collect()
    return line, why


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="constructor names (default: all)")
    parser.add_argument("--print", action="store_true", help="print only, do not edit docs")
    args = parser.parse_args(argv)
    ctors = application_constructors()
    names = args.models or list(ctors)
    lines = ["| model | input | BNs | folded | BN skipped | sets found | pairs | triplets |",
             "|---|---|---|---|---|---|---|---|"]
    whys = []
    for name in names:
        line, why = row(name, ctors[name])
        print(line, flush=True)
        for w in why:
            print("   ", w, flush=True)
        lines.append(line)
        whys += why
    text = "\n".join(lines) + "\n\nWhy models have no scaling set (one line per reason):\n\n"
    text += "\n".join(whys) if whys else "(every model gets at least one set)"
    if not args.print and not args.models:
        replace_block(PAGE, "applications", text)
        print(f"updated {PAGE.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
