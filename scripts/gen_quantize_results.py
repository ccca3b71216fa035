"""`cle.quantize` on both real networks against what a user does today: the table in
docs/results.md (block ``quantize-results``) and its summary in README.md
(``quantize-summary``).

Run it (``make results`` runs every ``scripts/gen_*.py``; about half an hour on 2 cores)::

    .venv/bin/python scripts/gen_quantize_results.py                 # measure, write the docs
    .venv/bin/python scripts/gen_quantize_results.py --render        # docs from docs/data
    .venv/bin/python scripts/gen_quantize_results.py --net mobilenet_v2 --no-write

For each network and each weight granularity (per-channel, TF Lite's default, and
per-tensor) it measures, against the original float model's logits on 256 evaluation crops
(``cle.pretrained.sample_images``, seed 0), top-1 agreement and logit SQNR of:

* the float model straight into TF Lite's converter (``TFLiteConverter.from_keras_model``),
  calibrated on 64 other real crops (seed 1): what a user does today;
* ``cle.quantize(model, crops)`` with those 64 crops (it holds a quarter out for its own check);
* ``cle.quantize(model, input_range=...)`` without any data: synthetic calibration inputs
  distilled from the model's BN statistics; the input range is the preprocessing's.

and the wall time of each call (conversion or ``cle.quantize``, its own check included; the
load average is saved with the rows).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


import cle  # noqa: E402
from cle import pretrained as P  # noqa: E402
from _docblocks import cpu_name  # noqa: E402
from cle import quantization as Q  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "docs", "data")
EVAL_CROPS, CALIB_CROPS = 256, 64
NETS = {
    # name: (title, builder, preprocessing, size, input range of the preprocessing, how named)
    "mobilenet_v2": ("MobileNetV2", P.mobilenet_v2_imagenet, P.preprocess_imagenet, 224,
                     Q.input_range_of("torch"), "`--preprocessing torch`"),
    "efficientnet_lite1": ("EfficientNet-Lite1", P.efficientnet_lite1_imagenet,
                           P.preprocess_efficientnet_lite, P.LITE1_INPUT_SIZE,
                           (-1.0, 1.0), "`--input-range=-1,1`"),
}
ROWS = ("plain", "data", "nodata")


def _metrics(ref, y):
    return {"top1_agreement": Q.top1_agreement(ref, y), "sqnr_db": Q.sqnr_db(ref, y)}


def measure(net):
    title, build, pre, size, input_range, _ = NETS[net]
    model = build()
    x_eval = pre(P.sample_images(EVAL_CROPS, size, seed=0))
    x_cal = pre(P.sample_images(CALIB_CROPS, size, seed=1))
    ref = model.predict(x_eval, batch_size=32, verbose=0)
    out = {"net": title, "load": os.getloadavg()[0], "cpu": cpu_name(), "rows": {}}
    for per_channel in (True, False):
        key = "per_channel" if per_channel else "per_tensor"
        rows = {}
        start = time.perf_counter()
        # The float model straight into TF Lite's converter (the same flatbuffer as
        # TFLiteConverter.from_keras_model gives: tests/test_quantize.py checks both routes).
        content = Q.convert_to_tflite_int8(model, x_cal, per_channel=per_channel)
        rows["plain"] = {"seconds": time.perf_counter() - start,
                         **_metrics(ref, Q.run_tflite(content, x_eval, batch_size=32))}
        print(net, key, "plain", rows["plain"], flush=True)
        start = time.perf_counter()
        content, report = cle.quantize(model, x_cal, per_channel=per_channel)
        rows["data"] = {"seconds": time.perf_counter() - start,
                        "check": [report.top1_agreement, report.sqnr_db],
                        **_metrics(ref, Q.run_tflite(content, x_eval, batch_size=32))}
        print(net, key, "data", rows["data"], flush=True)
        start = time.perf_counter()
        content, report = cle.quantize(model, per_channel=per_channel, input_range=input_range,
                                       progress=lambda m: print("  ", m, flush=True))
        rows["nodata"] = {"seconds": time.perf_counter() - start,
                          "check": [report.top1_agreement, report.sqnr_db],
                          **_metrics(ref, Q.run_tflite(content, x_eval, batch_size=32))}
        print(net, key, "nodata", rows["nodata"], flush=True)
        out["rows"][key] = rows
    out["load_after"] = os.getloadavg()[0]
    return out


def _cell(row):
    return f"{row['top1_agreement']:.1%} / {row['sqnr_db']:.2f}"


def table(results):
    nets = [n for n in NETS if n in results]
    lines = [
        f"TFLite full INT8, top-1 agreement / logit SQNR (dB) against the float model on "
        f"{EVAL_CROPS} real photo crops; calibration data: {CALIB_CROPS} other crops; time: "
        "wall seconds of the call on 2 CPU cores (conversion, or `cle.quantize` with its own "
        "check):",
        "",
        "| network | weights | float model straight into the converter (`from_keras_model`) "
        "| `cle quantize`, "
        f"{CALIB_CROPS} crops | `cle quantize`, no data |",
        "|---|---|---|---|---|",
    ]
    for net in nets:
        r = results[net]
        for key, label in (("per_channel", "per-channel"), ("per_tensor", "per-tensor")):
            rows = r["rows"][key]
            cells = [f"{_cell(rows[k])} ({rows[k]['seconds']:.0f} s)" for k in ROWS]
            lines.append(f"| {r['net']} | {label} | " + " | ".join(cells) + " |")
    notes = "; ".join(f"{results[n]['net']}: {NETS[n][5]}" for n in nets)
    loads = ", ".join(f"{results[n]['load']:.1f}–{results[n].get('load_after', 0):.1f}"
                      for n in nets)
    lines += ["", f"No data: the input range comes from the preprocessing ({notes}). "
              f"Load average during the runs: {loads} (2 cores of an "
              f"{results[nets[0]].get('cpu', 'unknown CPU')}; other work shared the machine)."]
    return "\n".join(lines) + "\n"


def summary(results):
    nets = [n for n in NETS if n in results]
    lines = [
        "TFLite full INT8, per-channel weights, top-1 agreement / logit SQNR (dB) against the "
        f"float model on {EVAL_CROPS} real photo crops ({CALIB_CROPS} other crops to calibrate):",
        "",
        "| | " + " | ".join(results[n]["net"] for n in nets) + " |",
        "|---|" + "---|" * len(nets),
    ]
    for key, label in (("plain", "float model straight into TF Lite's converter"),
                       ("data", f"`cle quantize` with {CALIB_CROPS} crops"),
                       ("nodata", "`cle quantize` without data")):
        lines.append(f"| {label} | " + " | ".join(
            _cell(results[n]["rows"]["per_channel"][key]) for n in nets) + " |")
    return "\n".join(lines) + "\n"


def _path(net):
    return os.path.join(DATA, f"quantize_{net}.json")


def load():
    results = {}
    for net in NETS:
        if os.path.exists(_path(net)):
            with open(_path(net), encoding="utf-8") as f:
                results[net] = json.load(f)
    return results


def rendered():
    results = load()
    if not results:
        return {}
    out = {("docs/results.md", "quantize-results"): table(results)}
    if len(results) == len(NETS):
        out[("README.md", "quantize-summary")] = summary(results)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--net", choices=sorted(NETS), action="append")
    ap.add_argument("--render", action="store_true", help="measure nothing; docs from docs/data")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    if not args.render:
        for net in args.net or list(NETS):
            result = measure(net)
            if not args.no_write:
                with open(_path(net), "w", encoding="utf-8") as f:
                    json.dump(result, f, indent=1)
    from _docblocks import replace_block

    for (doc, name), text in rendered().items():
        if args.no_write:
            print(text)
        else:
            replace_block(os.path.join(HERE, "..", doc), name, text)


if __name__ == "__main__":
    main()
