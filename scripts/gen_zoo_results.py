"""`cle.quantize` on the zoo of benchmarks/zoo_models.py, with data and without, against the
plain converter: the block ``zoo`` of docs/results.md (issue #41's goals).

Run it (the measurement is ``benchmarks/bench_zoo.py``'s, each model in a process of its
own; about half an hour on 2 cores, most of it the real MobileNetV2)::

    nice -n 10 .venv/bin/python scripts/gen_zoo_results.py               # measure, write
    .venv/bin/python scripts/gen_zoo_results.py --render                 # docs from docs/data
    .venv/bin/python scripts/gen_zoo_results.py --from /tmp/zoo.jsonl    # rows bench_zoo wrote
    .venv/bin/python scripts/gen_zoo_results.py --models mtcnn_onet      # these again, the
                                                                         # others' rows kept
    .venv/bin/python scripts/gen_zoo_results.py --render --no-write      # print the block

The rows are kept in ``docs/data/zoo.jsonl`` (one JSON object per model × mode × output, the
form ``bench_zoo.py --json`` writes). Models whose weights package is missing are listed as
skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))
sys.path.insert(0, os.path.join(HERE, ".."))

import bench_zoo as B  # noqa: E402
from _docblocks import cpu_name, replace_block  # noqa: E402

DATA = os.path.join(HERE, "..", "docs", "data", "zoo.jsonl")
DOC = os.path.join(HERE, "..", "docs", "results.md")


def block(rows, meta) -> str:
    """The text of the block: the models, the figures, the goals counted."""
    loads = [r["load"] for r in rows if "load" in r]
    load = f"{min(loads):.1f}–{max(loads):.1f}" if loads else "not recorded"
    return "\n".join([
        "The models (`benchmarks/zoo_models.py`):",
        "",
        B.models_table(rows),
        "",
        "Per model, mode and output: top-1 agreement (class outputs) / SQNR (dB) against the "
        "float model on the held-out inputs (1000 where the inputs are generated, 192 of "
        "sklearn's fixed sets), with the figure's 90 % interval over those inputs in brackets "
        "(a bootstrap: how far another draw of as many could move it). *cle real*: the "
        "`.tflite` of `cle.quantize(model, x_cal or None, compare=True)`; *cle claimed*: what "
        "its report said (its own check), its interval in brackets; "
        "*plain real*: the float model straight into TF Lite's converter with the same 64 "
        "calibration inputs; *cle − plain*: the SQNR gain of cle's file over plain's on the "
        "same held-out inputs, its interval by a paired bootstrap; *plain real, 48*: the same calibrated on the 48 of them "
        "`cle.quantize` calibrates on (it holds the last 16 out for its check). Flags: "
        "`below-plain` (under plain − 0.5 dB with data, − 3 dB without), `claim-off(±d)` "
        "(claim − real beyond 2 dB, the real figure outside the claim's interval), "
        "`in-interval(±d)` (beyond 2 dB, inside the interval), `CORRUPT` (a file broken "
        "where plain's is not: under 10 dB and 10 dB below plain, or top-1 20 points below), "
        "`SILENT-CORRUPT` (the same, its "
        "claim more than 2 dB above the real figure), `CRASH` (the exception's last line and "
        "where it was raised), `refused`; *cle s*: wall seconds of the `cle.quantize` call "
        "(its check and the plain conversion of `compare` included).",
        "",
        B.table(rows),
        "",
        "Goals counted:",
        "",
        "```text",
        B.summary(rows),
        "```",
        "",
        f"Measured by `scripts/gen_zoo_results.py` ({meta['versions']}) on 2 cores of an "
        f"{meta['cpu']}, load average {load} (other work shared the machine).",
    ]) + "\n"


def _versions():
    import keras
    import tensorflow as tf

    return f"Keras {keras.__version__}, TensorFlow {tf.__version__}"


def _save(rows, meta):
    with open(DATA, "w", encoding="utf-8") as f:
        f.write(json.dumps({"status": "meta", **meta}) + "\n")
        for r in rows:
            f.write(json.dumps(r, default=float) + "\n")


def _load():
    rows = B.read_rows(DATA)
    meta = next((r for r in rows if r["status"] == "meta"), {})
    return [r for r in rows if r["status"] != "meta"], meta


def main(argv=None):
    import zoo_models as Z

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--render", action="store_true", help="measure nothing; docs from docs/data")
    ap.add_argument("--from", dest="source", metavar="JSONL",
                    help="take the rows of a bench_zoo.py --json file instead of measuring")
    ap.add_argument("--models", nargs="*", choices=list(Z.MODELS), metavar="MODEL")
    ap.add_argument("--no-write", action="store_true", help="print the block, write nothing")
    args = ap.parse_args(argv)
    if args.render:
        rows, meta = _load()
    else:
        if args.source:
            rows = B.read_rows(args.source)
        else:
            path = os.path.join(tempfile.mkdtemp(prefix="cle-zoo-"), "zoo.jsonl")
            B.run(args.models or list(Z.MODELS), list(B.MODES), path)
            rows = B.read_rows(path)
        meta = {"cpu": cpu_name(), "versions": _versions()}
        if args.models and os.path.exists(DATA):  # the other models' saved rows stay
            measured = {r["model"] for r in rows}
            kept = [r for r in _load()[0] if r["model"] not in measured]
            order = list(Z.MODELS)
            rows = sorted(kept + rows, key=lambda r: order.index(r["model"])
                          if r["model"] in order else len(order))
        if not args.no_write:
            _save(rows, meta)
    text = block(rows, meta)
    if args.no_write:
        print(text)
    else:
        changed = replace_block(DOC, "zoo", text)
        print(f"docs/results.md: zoo {'updated' if changed else 'unchanged'}")


if __name__ == "__main__":
    main()
