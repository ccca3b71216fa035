"""W4A8 on every ``keras.applications`` model: does ``cle.quantize(..., weight_bits=4)`` give a
``.tflite`` that LiteRT runs, with data and without, and how long does the rounding take?

Each constructor (``tests/_apps.py``) is built at the smallest input it accepts, ``weights=None``
(random weights: the figures say the file runs and what the check printed, not how good a
trained model would come out; ``benchmarks/bench_w4a8.py`` measures that on real networks).
With data: 24 photo crops scaled to [-1, 1] (a quarter held out for the check) and
``compare=True``, so the plain W8A8 conversion's figures on the same crops stand beside; without
data: no calibration data at all (a model without batch norms is refused, with its reason).

Run it directly (one row per model and mode; minutes per model on 2 cores, the rounding's time
grows with each layer's weights times its inputs per output, not with the input size)::

    .venv/bin/python benchmarks/bench_w4a8_apps.py --max-params 15e6 --json apps.jsonl
    .venv/bin/python benchmarks/bench_w4a8_apps.py NASNetMobile Xception
    .venv/bin/python benchmarks/bench_w4a8_apps.py ConvNeXtTiny --modes data --rounding gptq
    .venv/bin/python scripts/gen_w4a8_results.py --apps apps.jsonl     # the docs' table

It prints figures and asserts nothing; an exception is printed as the row's result.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

import cle  # noqa: E402
from cle import pretrained as P  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from _apps import application_constructors, build_smallest  # noqa: E402
from bench_w4a8 import _cpu  # noqa: E402


def _build(ctor):
    try:
        return build_smallest(ctor, classifier_activation=None)  # logits, where offered
    except TypeError:
        return build_smallest(ctor)


def measure(name, ctor, max_params, rounding="auto", modes=("data", "no data")):
    """The rows of one model: ``[{"model", "mode", ...}]``, one per mode ("data", "no data")."""
    model, size = _build(ctor)
    rows = []
    x = P.sample_images(24, size, seed=3).astype(np.float32) / 127.5 - 1
    for mode in modes:
        row = {"model": name, "mode": mode, "input": size, "params": model.count_params(),
               "rounding": rounding}
        if row["params"] > max_params:
            row["result"] = f"not run: more than {max_params:g} weights"
            rows.append(row)
            continue
        start = time.perf_counter()
        try:
            content, report = cle.quantize(model, x if mode == "data" else None, weight_bits=4,
                                           compare=mode == "data", rounding=rounding)
        except Exception as e:  # noqa: BLE001 (a row's result, printed)
            row["result"] = f"{type(e).__name__}: {e}"
        else:
            int4 = sum(w.nbytes for w in report.weights if w.storage == "INT4")
            row.update(result="ran", bytes=len(content), int4_bytes=int4,
                       top1=report.top1_agreement, sqnr_db=report.sqnr_db,
                       rounding_s=report.seconds.get("rounding"))
            if report.plain is not None:
                row["plain"] = (report.plain["top1_agreement"], report.plain["sqnr_db"])
        row.update(seconds=time.perf_counter() - start, cpu=_cpu(), cores=os.cpu_count(),
                   load=os.getloadavg()[0])
        rows.append(row)
    keras.backend.clear_session()
    return rows


def _line(r):
    if r["result"] != "ran":
        return f"{r['model']:<22} {r['mode']:<8} {r['result'][:160]}"
    plain = (f"; plain W8A8 {r['plain'][0]:.0%} / {r['plain'][1]:.2f} dB" if "plain" in r
             else "")
    rounding = ("" if r["rounding_s"] is None
                else f" (rounding {r['rounding']} {r['rounding_s']:.0f} s)")
    return (f"{r['model']:<22} {r['mode']:<8} {r['params'] / 1e6:6.1f}M weights, "
            f"{r['bytes'] / 1e6:.2f} MB ({r['int4_bytes'] / 1e6:.2f} MB INT4), "
            f"{r['top1']:.0%} / {r['sqnr_db']:.2f} dB{plain}, {r['seconds']:.0f} s{rounding}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", help="constructor names (default: every one)")
    ap.add_argument("--max-params", type=float, default=30e6,
                    help="models with more weights are listed, not run")
    ap.add_argument("--rounding", default="auto", help="cle.quantize's rounding (default auto)")
    ap.add_argument("--modes", nargs="+", default=["data", "no data"],
                    choices=["data", "no data"])
    ap.add_argument("--json", help="append each row to this JSON-lines file")
    args = ap.parse_args(argv)
    ctors = application_constructors()
    unknown = sorted(set(args.models) - set(ctors))
    if unknown:
        ap.error(f"not keras.applications constructors: {unknown}")
    for name in args.models or list(ctors):
        for row in measure(name, ctors[name], args.max_params, args.rounding, args.modes):
            print(_line(row), flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
