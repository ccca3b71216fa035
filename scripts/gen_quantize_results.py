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
* ``cle.quantize(model)`` without any data and without any option, as ``cle quantize
  model.keras -o model.tflite`` runs it: the input range found from the model, synthetic
  calibration inputs;

and the wall time of each call (conversion or ``cle.quantize``, its own check included; the
load average is saved with the rows). It also runs that bare command on MobileNetV2 saved to
``mobilenet_v2.keras`` and writes what it printed (block ``quantize-console`` of
docs/quantize_int8.md and docs/cli.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The checkout this script is in, not whichever one the environment installed in editable mode.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


import cle  # noqa: E402
from cle import pretrained as P  # noqa: E402
from _docblocks import cpu_name  # noqa: E402
from cle import quantization as Q  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "docs", "data")
EVAL_CROPS, CALIB_CROPS = 256, 64
NETS = {
    # name: (title, builder, preprocessing, size)
    "mobilenet_v2": ("MobileNetV2", P.mobilenet_v2_imagenet, P.preprocess_imagenet, 224),
    "efficientnet_lite1": ("EfficientNet-Lite1", P.efficientnet_lite1_imagenet,
                           P.preprocess_efficientnet_lite, P.LITE1_INPUT_SIZE),
}
ROWS = ("plain", "data", "nodata")


def _metrics(ref, y):
    return {"top1_agreement": Q.top1_agreement(ref, y), "sqnr_db": Q.sqnr_db(ref, y)}


WEIGHTS = ("per_channel", "per_tensor")


def measure(net, weights=WEIGHTS):
    title, build, pre, size = NETS[net]
    model = build()
    x_eval = pre(P.sample_images(EVAL_CROPS, size, seed=0))
    x_cal = pre(P.sample_images(CALIB_CROPS, size, seed=1))
    ref = model.predict(x_eval, batch_size=32, verbose=0)
    out = {"net": title, "load": os.getloadavg()[0], "cpu": cpu_name(), "rows": {}}
    # The networks end in linear logits: declared, so that the check gives their top-1.
    logits = {model.layers[-1].name: "classes"}
    for key in weights:
        per_channel = key == "per_channel"
        rows = {}
        start = time.perf_counter()
        # The float model straight into TF Lite's converter (the same flatbuffer as
        # TFLiteConverter.from_keras_model gives: tests/test_quantize.py checks both routes).
        content = Q.convert_to_tflite_int8(model, x_cal, per_channel=per_channel)
        rows["plain"] = {"seconds": time.perf_counter() - start,
                         **_metrics(ref, Q.run_tflite(content, x_eval, batch_size=32))}
        print(net, key, "plain", rows["plain"], flush=True)
        start = time.perf_counter()
        content, report = cle.quantize(model, x_cal, per_channel=per_channel,
                                       output_kinds=logits)
        rows["data"] = {"seconds": time.perf_counter() - start,
                        "check": [report.top1_agreement, report.sqnr_db],
                        **_metrics(ref, Q.run_tflite(content, x_eval, batch_size=32))}
        print(net, key, "data", rows["data"], flush=True)
        start = time.perf_counter()
        content, report = cle.quantize(model, per_channel=per_channel, output_kinds=logits,
                                       progress=lambda m: print("  ", m, flush=True))
        rows["nodata"] = {"seconds": time.perf_counter() - start,
                          "check": [report.top1_agreement, report.sqnr_db],
                          "input_range": report.input_ranges[0]["range"],
                          "source": report.input_ranges[0]["source"],
                          "warnings": report.warnings,
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
        f"{CALIB_CROPS} crops | `cle quantize`, no data, no flags |",
        "|---|---|---|---|---|",
    ]
    for net in nets:
        r = results[net]
        for key, label in (("per_channel", "per-channel"), ("per_tensor", "per-tensor")):
            rows = r["rows"][key]
            cells = [f"{_cell(rows[k])} ({rows[k]['seconds']:.0f} s)" for k in ROWS]
            lines.append(f"| {r['net']} | {label} | " + " | ".join(cells) + " |")
    notes = "; ".join(
        f"{results[n]['net']}: [{r['input_range'][0]:.4g}, {r['input_range'][1]:.4g}]"
        for n in nets for r in [results[n]["rows"]["per_channel"]["nodata"]])
    loads = ", ".join(f"{min(pair):.1f}–{max(pair):.1f}" for n in nets
                      for pair in [(results[n]["load"], results[n].get("load_after", 0))])
    cpus = [results[n].get("cpu", "unknown CPU") for n in nets]
    machine = (f"2 cores of an {cpus[0]}" if len(set(cpus)) == 1 else "2 cores; " + ", ".join(
        f"{results[n]['net']} on an {cpu}" for n, cpu in zip(nets, cpus)))
    lines += ["", f"No data, no flags: the input range is found from the model's first batch "
              f"norm ({notes}), the calibration inputs are synthetic. "
              f"Load average during the runs: {loads} ({machine}; other work shared the "
              "machine)."]
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
                       ("nodata", "`cle quantize` without data, no flags")):
        lines.append(f"| {label} | " + " | ".join(
            _cell(results[n]["rows"]["per_channel"][key]) for n in nets) + " |")
    return "\n".join(lines) + "\n"


def _path(net):
    return os.path.join(DATA, f"quantize_{net}.json")


CONSOLE = os.path.join(DATA, "quantize_console.json")


def console():
    """What bare `cle quantize mobilenet_v2.keras -o mobilenet_v2_int8.tflite` prints."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        P.mobilenet_v2_imagenet().save(os.path.join(tmp, "mobilenet_v2.keras"))
        load = os.getloadavg()[0]
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "cle", "quantize", "mobilenet_v2.keras", "-o",
             "mobilenet_v2_int8.tflite"], cwd=tmp, capture_output=True, text=True,
            env=dict(os.environ, PYTHONPATH=os.path.join(HERE, "..")), check=True)
        seconds = time.perf_counter() - start
    return {"stdout": proc.stdout, "stderr": proc.stderr, "seconds": seconds, "load": load,
            "load_after": os.getloadavg()[0], "cpu": cpu_name()}


def console_block(run):
    return ("```console\n$ cle quantize mobilenet_v2.keras -o mobilenet_v2_int8.tflite\n"
            + run["stdout"].rstrip() + "\n```\n\n"
            f"The progress of each stage went to stderr; the command took {run['seconds']:.0f} s "
            f"on 2 cores of an {run['cpu']} (load average {run['load']:.1f}–"
            f"{run['load_after']:.1f}, other work shared the machine).\n")


def load():
    results = {}
    for net in NETS:
        if os.path.exists(_path(net)):
            with open(_path(net), encoding="utf-8") as f:
                results[net] = json.load(f)
    return results


def rendered():
    results = load()
    out = {}
    if os.path.exists(CONSOLE):
        with open(CONSOLE, encoding="utf-8") as f:
            block = console_block(json.load(f))
        out[("docs/quantize_int8.md", "quantize-console")] = block
        out[("docs/cli.md", "quantize-console")] = block
    if not results:
        return out
    out[("docs/results.md", "quantize-results")] = table(results)
    if len(results) == len(NETS):
        out[("README.md", "quantize-summary")] = summary(results)
    return out


def _merged(net, result):
    """``result`` with the saved rows of the granularities it did not measure (the load
    range spans both runs)."""
    if len(result["rows"]) == len(WEIGHTS) or not os.path.exists(_path(net)):
        return result
    with open(_path(net), encoding="utf-8") as f:
        saved = json.load(f)
    for key, rows in saved["rows"].items():
        result["rows"].setdefault(key, rows)
    result["rows"] = {key: result["rows"][key] for key in WEIGHTS if key in result["rows"]}
    result["load"] = min(result["load"], saved["load"])
    result["load_after"] = max(result["load_after"], saved.get("load_after", 0.0))
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--net", choices=sorted(NETS), action="append")
    ap.add_argument("--console", action="store_true",
                    help="only the bare `cle quantize` console example")
    ap.add_argument("--weights", choices=WEIGHTS, action="append",
                    help="measure only these weight granularities (the others' saved rows stay)")
    ap.add_argument("--no-console", action="store_true",
                    help="measure the networks, not the console example")
    ap.add_argument("--render", action="store_true", help="measure nothing; docs from docs/data")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    if not args.render and not args.no_console:
        run = console()
        print(run["stdout"], run["stderr"], flush=True)
        if not args.no_write:
            with open(CONSOLE, "w", encoding="utf-8") as f:
                json.dump(run, f, indent=1)
    if not args.render and not args.console:
        for net in args.net or list(NETS):
            result = _merged(net, measure(net, args.weights or WEIGHTS))
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
