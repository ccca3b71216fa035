"""The measured parts of docs/analyze.md: the picture and summary of ``cle analyze`` on the real
MobileNetV2 (``docs/img/analyze_mobilenet_v2.png``, block ``analyze-mobilenet-v2``) and the
table of ``cle quantize --tune`` against ``cle quantize`` on both real networks (block
``analyze-tune``).

Run it (``make results`` runs every ``scripts/gen_*.py``)::

    .venv/bin/python scripts/gen_analysis_docs.py                # both parts (about an hour)
    .venv/bin/python scripts/gen_analysis_docs.py --part figure  # the picture and summary
    .venv/bin/python scripts/gen_analysis_docs.py --part tune    # the tuning table
    .venv/bin/python scripts/gen_analysis_docs.py --render       # the table from docs/data

The figure: ``cle.analyze(model, crops)`` with 64 real photo crops
(``cle.pretrained.sample_images``, seed 1); the picture names the machine. The table: for each
network and weight granularity, ``cle.quantize(model, crops)`` and
``cle.quantize(model, crops, tune=True)`` with the same 64 crops, judged against the float
model on 256 other crops (seed 0): top-1 agreement and SQNR (saved in
``docs/data/analyze_tune.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

import cle  # noqa: E402
from cle import pretrained as P  # noqa: E402
from cle import quantization as Q  # noqa: E402
from _docblocks import cpu_name, replace_block  # noqa: E402

DOC = os.path.join(HERE, "..", "docs", "analyze.md")
PNG = os.path.join(HERE, "..", "docs", "img", "analyze_mobilenet_v2.png")
DATA = os.path.join(HERE, "..", "docs", "data", "analyze_tune.json")
CALIB, EVAL = 64, 256
NETS = {
    "mobilenet_v2": ("MobileNetV2", P.mobilenet_v2_imagenet, P.preprocess_imagenet, 224),
    "efficientnet_lite1": ("EfficientNet-Lite1", P.efficientnet_lite1_imagenet,
                           P.preprocess_efficientnet_lite, P.LITE1_INPUT_SIZE),
}


def figure():
    title, build, pre, size = NETS["mobilenet_v2"]
    model = build()
    x = pre(P.sample_images(CALIB, size, seed=1))
    load = os.getloadavg()[0]
    start = time.perf_counter()
    # The network ends in linear logits: declared, so that the output gets its top-1.
    report = cle.analyze(model, x, output_kinds={model.layers[-1].name: "classes"},
                         progress=lambda m: print("  ", m, flush=True))
    seconds = time.perf_counter() - start
    machine = f"{cpu_name()}, {os.cpu_count()} cores"
    report.plot(PNG, title=f"{title} (ImageNet): where the INT8 error comes from, layer by layer",
                note=f"measured by scripts/gen_analysis_docs.py on {machine}")
    text = ("```\n$ cle analyze mobilenet_v2.keras --calibration crops.npy\n"
            + "\n".join("  " + line for line in report.summary(5).splitlines()) + "\n```\n\n"
            f"{len(report.layers)} layers with a quantized output; `cle.analyze` took "
            f"{seconds:.0f} s on {machine} (load average {load:.1f} at the start; other work "
            "shared the machine).\n")
    replace_block(DOC, "analyze-mobilenet-v2", text)
    print(text)


def measure_tune():
    out = {"cpu": cpu_name(), "load": os.getloadavg()[0], "rows": []}
    for name, (title, build, pre, size) in NETS.items():
        model = build()
        x = pre(P.sample_images(CALIB, size, seed=1))
        x_eval = pre(P.sample_images(EVAL, size, seed=0))
        ref = model.predict(x_eval, batch_size=32, verbose=0)
        for per_channel in (True, False):
            row = {"net": title, "per_channel": per_channel}
            for key, tune in (("untuned", False), ("tuned", True)):
                start = time.perf_counter()
                content, report = cle.quantize(model, x, per_channel=per_channel, tune=tune)
                y = Q.run_tflite(content, x_eval, batch_size=32)
                row[key] = {"top1_agreement": Q.top1_agreement(ref, y),
                            "sqnr_db": Q.sqnr_db(ref, y),
                            "seconds": time.perf_counter() - start}
                if tune:
                    row["tuning"] = report.tuning.to_dict()
            print(row, flush=True)
            out["rows"].append(row)
    out["load_after"] = os.getloadavg()[0]
    with open(DATA, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
    return out


def tune_table(data) -> str:
    lines = [
        f"Top-1 agreement / SQNR (dB) against the float model on {EVAL} photo crops; "
        f"{CALIB} other crops to calibrate (a quarter held out: half of it tunes, half checks); "
        "time: wall seconds of the call:",
        "",
        "| network | weights | `cle quantize` | `cle quantize --tune` | gain | ranges changed "
        "(kept?) |",
        "|---|---|---|---|---|---|",
    ]
    for row in data["rows"]:
        u, t = row["untuned"], row["tuned"]
        tuning = row["tuning"]
        lines.append(
            f"| {row['net']} | {'per-channel' if row['per_channel'] else 'per-tensor'} | "
            f"{u['top1_agreement']:.1%} / {u['sqnr_db']:.2f} ({u['seconds']:.0f} s) | "
            f"{t['top1_agreement']:.1%} / {t['sqnr_db']:.2f} ({t['seconds']:.0f} s) | "
            f"{100 * (t['top1_agreement'] - u['top1_agreement']):+.1f} points / "
            f"{t['sqnr_db'] - u['sqnr_db']:+.2f} dB | {len(tuning['changes'])} "
            f"({'yes' if tuning['kept'] else 'no'}) |")
    lines += ["", f"On {data['cpu']} (load average {data['load']:.1f}–"
              f"{data.get('load_after', 0):.1f}; other work shared the machine)."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=("figure", "tune"), action="append")
    ap.add_argument("--render", action="store_true", help="measure nothing; the table from "
                    "docs/data")
    args = ap.parse_args(argv)
    parts = args.part or ["figure", "tune"]
    if args.render:
        parts = []
    if "figure" in parts:
        figure()
    data = measure_tune() if "tune" in parts else None
    if data is None and os.path.exists(DATA):
        with open(DATA, encoding="utf-8") as f:
            data = json.load(f)
    if data is not None:
        replace_block(DOC, "analyze-tune", tune_table(data))


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
