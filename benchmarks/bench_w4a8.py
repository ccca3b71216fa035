"""The goals of 4-bit weights (W4A8), measured on the real ImageNet MobileNetV2 and
EfficientNet-Lite1 of ``cle.pretrained``.

Run it directly (each network in its own process with ``--net``; about 20-40 minutes per
network on 2 shared cores)::

    .venv/bin/python benchmarks/bench_w4a8.py                       # both networks
    .venv/bin/python benchmarks/bench_w4a8.py --net mobilenet_v2 --json out.jsonl

It prints figures and whether each goal holds; it asserts nothing. In one process per network,
on 64 real photo crops for calibration and 256 other crops for evaluation (LiteRT, builtin
kernels, against the float Keras model's logits: top-1 agreement and SQNR):

* **baseline**: the float model straight into TF Lite's converter, W8A8 per-channel, the
  64 crops (``cle.quantization.convert_to_tflite_int8``);
* **W4A8 data**: ``cle.quantize(model, x64, weight_bits=4)``;
* **W4A8 no data**: ``cle.quantize(model, weight_bits=4, input_range=...)`` with the input
  range of the network's preprocessing;
* **W8A8 default** and **W8A8 nearest**: ``cle.quantize(model, x64)`` with ``rounding``
  left at its default and with ``rounding="nearest"`` (the same run when the default is
  nearest at 8 bits: then it is run once and both rows are that run).

With ``--rows`` it also measures the other rounding candidates (not run by default):
``w4_nearest``, ``w4_gptq`` and ``w4_adaround`` (``cle.quantize(model, x64, weight_bits=4,
rounding=...)``), ``w8_gptq`` and ``w8_adaround`` (the same at 8 bits), and
``w4_nodata_adaround`` (the no-data row with ``rounding="adaround"``).
``scripts/gen_w4a8_results.py`` turns the JSON lines into the tables of docs/quantize_w4.md.

Where the photo packages of ``benchmarks/bench_w4_generalize.py`` are installed, every row is
also judged on 256 crops of new photos (none of the nine the calibration crops are cut from),
and the goal of issue #44 "on photos unlike the calibration set's source" is printed.

Goals (issue 27): W4A8 data >= baseline in both figures; W4A8 no data >= baseline - 2 dB and
- 0.03; the W4A8 file <= 0.6x the baseline W8A8 file; W4A8 data <= 10 minutes on MobileNetV2
(the rounding stage's time printed); W8A8 default >= W8A8 nearest in both figures.
Times are wall-clock on a machine that may be shared: the load average is printed.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import cle  # noqa: E402
from cle import pretrained as P  # noqa: E402
from cle import quantization as Q  # noqa: E402
from cle._pretrained.networks import crop_photos  # noqa: E402

NETS = {
    "mobilenet_v2": (P.mobilenet_v2_imagenet, 224, P.preprocess_imagenet,
                     Q.input_range_of("torch")),
    "efficientnet_lite1": (P.efficientnet_lite1_imagenet, 240, P.preprocess_efficientnet_lite,
                           (-127 / 128, 1.0)),
}
MINUTES_LIMIT = 10.0
#: The evaluation crops of the goals (issue 27); ``--eval-crops`` takes more.
EVAL_CROPS = 256
DEFAULT_ROWS = ("baseline", "w4_data", "w4_nodata", "w8_default", "w8_nearest")
#: The other rounding candidates: row key -> (name, weight bits, rounding, with the 64 real
#: crops or without data (the input range of the network's preprocessing, as "w4_nodata")).
CANDIDATES = {"w4_nearest": ("W4A8 nearest", 4, "nearest", True),
              "w4_gptq": ("W4A8 gptq", 4, "gptq", True),
              "w4_adaround": ("W4A8 adaround", 4, "adaround", True),
              "w8_gptq": ("W8A8 gptq", 8, "gptq", True),
              "w8_adaround": ("W8A8 adaround", 8, "adaround", True),
              "w4_nodata_adaround": ("W4A8 no data adaround", 4, "adaround", False)}


def _cpu():
    """The CPU's model name (scripts/_docblocks.py's reader, which the doc generators use)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
    from _docblocks import cpu_name

    return cpu_name()


def machine() -> str:
    """The line each benchmark prints first: the CPU, its cores, the load, cle's version."""
    return (f"{_cpu()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; cle "
            f"{cle.__version__}")


def _append(path, row):
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


def measure(net, rows=None, json_path=None, eval_crops=EVAL_CROPS):
    """Every row of one network, as dicts (printed as they come, and appended to the JSON-lines
    file ``json_path`` as they come), evaluated on ``eval_crops`` crops: the goals' 256, then
    crops of another seed."""
    load, size, prep, input_range = NETS[net]
    model = load()
    x_cal = prep(P.sample_images(64, size, seed=1))
    x_eval = prep(P.sample_images(min(eval_crops, EVAL_CROPS), size, seed=7))
    if eval_crops > EVAL_CROPS:
        x_eval = np.concatenate(
            [x_eval, prep(P.sample_images(eval_crops - EVAL_CROPS, size, seed=11))])
    reference = model.predict(x_eval, batch_size=32, verbose=0)
    x_new = ref_new = None
    try:  # photos none of the calibration crops are cut from (bench_w4_generalize.py)
        from bench_w4_generalize import new_photos

        x_new = prep(crop_photos(new_photos(), EVAL_CROPS, size, seed=3))
        ref_new = model.predict(x_new, batch_size=32, verbose=0)
    except ModuleNotFoundError as exc:
        print(f"(no new-photo evaluation: {exc})", flush=True)
    out = []

    def row(name, content, seconds, report=None):
        y = Q.run_tflite(content, x_eval, batch_size=32)
        r = {"net": net, "row": name, "top1": Q.top1_agreement(reference, y),
             "sqnr_db": Q.sqnr_db(reference, y), "n_eval": len(x_eval), "bytes": len(content),
             "seconds": seconds,
             "stages": dict(report.seconds) if report is not None else {},
             "kernels_8bit": (sum(1 for r in report.rounding.layers if r.bits == 8)
                              if report is not None and report.rounding is not None
                              and report.rounding.bits < 8 else None),
             "load": os.getloadavg()[0], "cpu": _cpu(), "cores": os.cpu_count()}
        if x_new is not None:
            y_new = Q.run_tflite(content, x_new, batch_size=32)
            r.update(new_top1=Q.top1_agreement(ref_new, y_new),
                     new_sqnr_db=Q.sqnr_db(ref_new, y_new))
        out.append(r)
        _append(json_path, r)
        print(f"{net:18s} {name:18s} top-1 {r['top1']:.3f}  SQNR {r['sqnr_db']:6.2f} dB  "
              f"{r['bytes']:>9,} B  {seconds:6.0f} s"
              + (f" (rounding {r['stages']['rounding']:.0f} s)"
                 if "rounding" in r["stages"] else "")
              + (f"  new photos {r['new_top1']:.3f} / {r['new_sqnr_db']:6.2f} dB"
                 if "new_top1" in r else "")
              + f"  load {r['load']:.1f}", flush=True)
        return r

    def timed(fn, *args, **kwargs):
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        return result, time.perf_counter() - start

    wanted = rows or DEFAULT_ROWS
    if "baseline" in wanted:
        content, sec = timed(Q.convert_to_tflite_int8, model, x_cal, per_channel=True)
        row("baseline W8A8", content, sec)
    if "w4_data" in wanted:
        (content, rep), sec = timed(cle.quantize, model, x_cal, weight_bits=4)
        row("W4A8 data", content, sec, rep)
    if "w4_nodata" in wanted:
        (content, rep), sec = timed(cle.quantize, model, weight_bits=4,
                                    input_range=input_range)
        row("W4A8 no data", content, sec, rep)
    if "w8_default" in wanted:
        (content, rep), sec = timed(cle.quantize, model, x_cal)
        default = row("W8A8 default", content, sec, rep)
        if rep.target["rounding"] == "nearest" and "w8_nearest" in wanted:
            out.append(dict(default, row="W8A8 nearest"))
            _append(json_path, out[-1])
            print(f"{net:18s} W8A8 nearest       (the default is nearest at 8 bits: the "
                  "same run)")
            wanted = [w for w in wanted if w != "w8_nearest"]
    if "w8_nearest" in wanted:
        (content, rep), sec = timed(cle.quantize, model, x_cal, rounding="nearest")
        row("W8A8 nearest", content, sec, rep)
    for key, (name, bits, method, with_data) in CANDIDATES.items():
        if key in wanted:
            data = {"calibration_data": x_cal} if with_data else {"input_range": input_range}
            (content, rep), sec = timed(cle.quantize, model, weight_bits=bits,
                                        rounding=method, **data)
            row(name, content, sec, rep)
    return out


def goals(rows):
    """The goals that the rows allow to judge, as printed lines."""
    by = {(r["net"], r["row"]): r for r in rows}
    lines = []

    def say(ok, text):
        lines.append(f"  [{'met' if ok else 'NOT met'}] {text}")

    for net in dict.fromkeys(r["net"] for r in rows):
        base = by.get((net, "baseline W8A8"))
        w4 = by.get((net, "W4A8 data"))
        nd = by.get((net, "W4A8 no data"))
        d8, n8 = by.get((net, "W8A8 default")), by.get((net, "W8A8 nearest"))
        lines.append(net)
        if base and w4:
            say(w4["top1"] >= base["top1"] and w4["sqnr_db"] >= base["sqnr_db"],
                f"W4A8 with data {w4['top1']:.3f} / {w4['sqnr_db']:.2f} dB >= baseline "
                f"{base['top1']:.3f} / {base['sqnr_db']:.2f} dB")
            if "new_top1" in base and "new_top1" in w4:
                say(w4["new_top1"] >= base["new_top1"] and w4["new_sqnr_db"] >= base["new_sqnr_db"],
                    f"on new photos, W4A8 with data {w4['new_top1']:.3f} / "
                    f"{w4['new_sqnr_db']:.2f} dB >= baseline {base['new_top1']:.3f} / "
                    f"{base['new_sqnr_db']:.2f} dB")
            say(w4["bytes"] <= 0.6 * base["bytes"],
                f"W4A8 file {w4['bytes'] / base['bytes']:.3f}x the W8A8 file (<= 0.6)")
        if base and nd:
            say(nd["top1"] >= base["top1"] - 0.03 and nd["sqnr_db"] >= base["sqnr_db"] - 2,
                f"W4A8 without data {nd['top1']:.3f} / {nd['sqnr_db']:.2f} dB >= baseline "
                f"- 0.03 / - 2 dB ({base['top1'] - 0.03:.3f} / {base['sqnr_db'] - 2:.2f} dB)")
        if w4 and net == "mobilenet_v2":
            say(w4["seconds"] <= 60 * MINUTES_LIMIT,
                f"W4A8 with data {w4['seconds'] / 60:.1f} min (rounding "
                f"{w4['stages'].get('rounding', 0) / 60:.1f} min) <= {MINUTES_LIMIT:.0f} min "
                f"(load {w4['load']:.1f} on {os.cpu_count()} cores)")
        if d8 and n8:
            say(d8["top1"] >= n8["top1"] and d8["sqnr_db"] >= n8["sqnr_db"],
                f"W8A8 default rounding {d8['top1']:.3f} / {d8['sqnr_db']:.2f} dB >= "
                f"nearest {n8['top1']:.3f} / {n8['sqnr_db']:.2f} dB")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", choices=sorted(NETS), action="append",
                        help="one network (repeatable; default: both, each in its own "
                             "process)")
    parser.add_argument("--rows", nargs="*", choices=DEFAULT_ROWS + tuple(CANDIDATES),
                        help="only these rows (default: the goals' rows, "
                             f"{' '.join(DEFAULT_ROWS)})")
    parser.add_argument("--json", help="append every row to this JSON-lines file")
    parser.add_argument("--eval-crops", type=int, default=EVAL_CROPS,
                        help=f"evaluation crops (default {EVAL_CROPS}, the goals'; more: the "
                             f"{EVAL_CROPS} then crops of another seed, for a top-1 agreement "
                             "less noisy than on 256 crops of nine photos)")
    args = parser.parse_args(argv)
    if args.eval_crops < EVAL_CROPS:
        parser.error(f"--eval-crops must be at least {EVAL_CROPS} (the goals' crops come "
                     f"first). Received: {args.eval_crops}")
    print(machine(), flush=True)
    rows = []
    if args.net and len(args.net) == 1:
        rows = measure(args.net[0], args.rows, args.json, args.eval_crops)
    else:
        path = args.json or f"/tmp/bench_w4a8_{os.getpid()}.jsonl"
        for net in args.net or sorted(NETS, reverse=True):
            subprocess.run([sys.executable, __file__, "--net", net, "--json", path,
                            "--eval-crops", str(args.eval_crops)]
                           + (["--rows", *args.rows] if args.rows else []), check=True)
        with open(path) as f:
            rows = [json.loads(line) for line in f]
    print("\n".join(["goals:"] + goals(rows)))


if __name__ == "__main__":
    main()
