"""Issue #44's levers for 4-bit weights that generalize from few images, measured against the
default rounding on the real ImageNet MobileNetV2 (or EfficientNet-Lite1) of ``cle.pretrained``.

Run it directly (one network per process; a few minutes per row on 2 cores, the block row
several times that)::

    .venv/bin/python benchmarks/bench_w4_generalize.py --json gen.jsonl
    .venv/bin/python benchmarks/bench_w4_generalize.py --rows block --json gen.jsonl
    .venv/bin/python scripts/gen_w4a8_results.py --generalize gen.jsonl   # the docs' table

Every row is ``cle.quantize(model, x64, weight_bits=4)`` (the default rounding, AdaRound, on
the 48 crops the build calibrates on; the last 16 are its check's) with only the rounding
stage's inputs or method changed, judged as ``benchmarks/bench_w4a8.py`` judges (LiteRT on 256
other crops against the float Keras model: top-1 agreement and SQNR), and also on the 48
crops the rounding fitted (how much of the fit is the calibration crops' own):

* ``default``: today's rounding on the 48 crops;
* ``flips``: the 48 and a horizontally flipped copy of each (96; augmentation, issue #44
  item 2; the kernels kept 8-bit are chosen on these too);
* ``all``: all 64 crops, the check's 16 among them (item 3; the build's own check is then
  partly in-sample, so its figure is not shown);
* ``block``: block reconstruction (item 1, BRECQ-style: the rounding of every kernel of each
  inverted residual block fitted together for the block's output; the stem, the head and
  the classifier layer-wise), ``benchmarks/proto_block_rounding.py`` run as a child process
  with 200 iterations per block (MobileNetV2 only: it cuts blocks by MobileNetV2's names);
* ``baseline``: the float model straight into TF Lite's converter at W8A8 with the 64 crops,
  the issue's goal.

It prints figures and asserts nothing; the load average is printed with each row.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import cle  # noqa: E402
from cle import pretrained as P  # noqa: E402
from cle import quantization as Q  # noqa: E402
from cle._measure import calibration as _calibration  # noqa: E402
from cle._quantize import weight_stages  # noqa: E402

from bench_w4a8 import NETS, _cpu  # noqa: E402

ROWS = ("baseline", "default", "flips", "all", "block")
#: Iterations per block of the ``block`` row (the prototype's measured setting).
BLOCK_ITERATIONS = 200
HERE = os.path.dirname(os.path.abspath(__file__))


class _RoundingInputs:
    """Changes the inputs of the rounding stage of ``cle.quantize`` (and only those) while
    active: ``"flips"`` adds a horizontally flipped copy of each, ``"all"`` adds the inputs
    the build holds out for its check. Records how many the rounding saw."""

    def __init__(self, how):
        self.how, self.held, self.count = how, None, None

    def __enter__(self):
        self._split, self._stage = _calibration.split_holdout, weight_stages.round_stage

        def split(x, fraction):
            cal, self.held = self._split(x, fraction)
            return cal, self.held

        def stage(equalized, x_cal, opts, source, say):
            if self.how == "flips":
                x_cal = x_cal.__class__(tuple(np.concatenate([a, a[:, :, ::-1]])
                                              for a in x_cal.arrays), x_cal.names, x_cal.shapes)
            elif self.how == "all":
                x_cal = x_cal.__class__(tuple(np.concatenate([a, b]) for a, b in
                                              zip(x_cal.arrays, self.held.arrays)),
                                        x_cal.names, x_cal.shapes)
            self.count = len(x_cal)
            return self._stage(equalized, x_cal, opts, source, say)

        _calibration.split_holdout, weight_stages.round_stage = split, stage
        return self

    def __exit__(self, *exc):
        _calibration.split_holdout, weight_stages.round_stage = self._split, self._stage


def _block_row(net):
    """The prototype's block reconstruction, run as a child process (it patches cle's
    rounding stage for the whole process): its row, in this benchmark's keys."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rows.jsonl")
        subprocess.run([sys.executable, os.path.join(HERE, "proto_block_rounding.py"),
                        "--net", net, "--variants", str(BLOCK_ITERATIONS), "--json", path],
                       check=True)
        with open(path) as f:
            rows = [json.loads(line) for line in f]
    block = [r for r in rows if "brecq" in r["tag"]][-1]
    return {"top1": block["top1"], "sqnr_db": block["sqnr_db"],
            "fit_top1": block["cal48_top1"], "fit_sqnr_db": block["cal48_sqnr_db"],
            "rounding_inputs": 48, "claim": None, "seconds": block["seconds"],
            "bytes": block["bytes"]}


def measure(net, rows, json_path=None):
    load, size, prep, _ = NETS[net]
    model = load()
    x_cal = prep(P.sample_images(64, size, seed=1))
    x_eval = prep(P.sample_images(256, size, seed=7))
    reference = model.predict(x_eval, batch_size=32, verbose=0)
    ref_fit = model.predict(x_cal[:48], batch_size=32, verbose=0)
    for name in rows:
        start = time.perf_counter()
        if name == "block":
            r = _block_row(net)
        elif name == "baseline":
            content = Q.convert_to_tflite_int8(model, x_cal, per_channel=True)
            r = {"rounding_inputs": None, "claim": None}
        else:
            with _RoundingInputs(name) as hook:
                content, report = cle.quantize(model, x_cal, weight_bits=4)
            r = {"rounding_inputs": hook.count,
                 "claim": None if name == "all" else report.sqnr_db}
        if name != "block":
            y = Q.run_tflite(content, x_eval, batch_size=32)
            y_fit = Q.run_tflite(content, x_cal[:48], batch_size=32)
            r.update(top1=Q.top1_agreement(reference, y), sqnr_db=Q.sqnr_db(reference, y),
                     fit_top1=Q.top1_agreement(ref_fit, y_fit),
                     fit_sqnr_db=Q.sqnr_db(ref_fit, y_fit),
                     seconds=time.perf_counter() - start, bytes=len(content))
        r = {"net": net, "row": name, **r, "load": os.getloadavg()[0], "cpu": _cpu(),
             "cores": os.cpu_count()}
        print(f"{net:18s} {name:9s} top-1 {r['top1']:.3f}  SQNR {r['sqnr_db']:6.2f} dB  "
              f"(on the 48 fitted: {r['fit_top1']:.3f} / {r['fit_sqnr_db']:6.2f} dB)  "
              f"{r['seconds']:5.0f} s  load {r['load']:.1f}", flush=True)
        if json_path:
            with open(json_path, "a") as f:
                f.write(json.dumps(r) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", choices=sorted(NETS), default="mobilenet_v2")
    parser.add_argument("--rows", nargs="*", choices=ROWS,
                        default=[r for r in ROWS if r != "block"],
                        help="the rows to measure (default: all but block, the slow one)")
    parser.add_argument("--json", help="append every row to this JSON-lines file")
    args = parser.parse_args(argv)
    if "block" in args.rows and args.net != "mobilenet_v2":
        parser.error("the block row cuts MobileNetV2's blocks by name: --net mobilenet_v2")
    print(f"{_cpu()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; cle "
          f"{cle.__version__}", flush=True)
    measure(args.net, args.rows, args.json)


if __name__ == "__main__":
    main()
