"""Benchmark of ``cle analyze`` and ``cle quantize --tune`` against the goals of issue #29.

Run it directly (each part on its own with ``--only``; all of it takes about an hour on 2
loaded cores)::

    .venv/bin/python benchmarks/bench_analyze.py
    .venv/bin/python benchmarks/bench_analyze.py --only check entries rank
    .venv/bin/python benchmarks/bench_analyze.py --only tune --net mobilenet_v2

It prints figures; it asserts nothing. The parts:

* ``check``: the output entry's SQNR of ``cle.analyze`` on 64 real crops against an
  independent end-to-end check of the same ``.tflite`` (LiteRT on the held-out quarter against
  the Keras model's ``predict``), for both real networks. Goal: within 0.5 dB.
* ``entries``: every Conv2D / DepthwiseConv2D / Dense layer of both networks has an entry.
* ``time``: ``cle analyze`` and ``cle quantize`` as processes on MobileNetV2 saved as
  ``.keras`` with the same 64 crops as ``.npy``. Goal: analyze <= 3x quantize.
* ``rank``: a model built with one badly ranged layer ('wide': channel 0 is 100x the others,
  read back at 1/100 by two depthwise convolutions) is analysed; goal: 'wide' ranked first.
* ``tune``: ``cle.quantize(model, crops)`` and ``cle.quantize(model, crops, tune=True)``
  on both networks, per-channel and per-tensor weights, judged on 256 other crops against the
  float model: top-1 agreement and SQNR. Goal: tuning >= untuned in both figures on both.

Wall times depend on the machine and its load (printed); compare ratios measured in one run.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

import cle  # noqa: E402
from cle import pretrained as P  # noqa: E402
from cle import quantization as Q  # noqa: E402

CALIB, EVAL = 64, 256
NETS = {
    "mobilenet_v2": ("MobileNetV2", P.mobilenet_v2_imagenet, P.preprocess_imagenet, 224),
    "efficientnet_lite1": ("EfficientNet-Lite1", P.efficientnet_lite1_imagenet,
                           P.preprocess_efficientnet_lite, P.LITE1_INPUT_SIZE),
}
KERNELS = (keras.layers.Conv2D, keras.layers.DepthwiseConv2D, keras.layers.Dense)


def _cpu():
    """The CPU's model name (scripts/_docblocks.py's reader, which the doc generators use)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
    from _docblocks import cpu_name

    return cpu_name()


def _net(name):
    title, build, pre, size = NETS[name]
    return title, build(), pre(P.sample_images(CALIB, size, seed=1)), pre, size


def check_and_entries(name, parts):
    title, model, x, _, _ = _net(name)
    start = time.perf_counter()
    report = cle.analyze(model, x)
    seconds = time.perf_counter() - start
    print(f"{title}: cle.analyze with {CALIB} crops: {seconds:.0f} s "
          f"({', '.join(f'{k} {v:.0f}' for k, v in report.seconds.items())})", flush=True)
    if "check" in parts:
        held = x[CALIB - report.n_check:]
        independent = Q.sqnr_db(model.predict(held, verbose=0, batch_size=32),
                                Q.run_tflite(report.tflite, held, batch_size=32))
        print(f"  output entry SQNR {report.output['sqnr_db']:.3f} dB, independent check "
              f"{independent:.3f} dB: |difference| {abs(report.output['sqnr_db'] - independent):.4f}"
              " dB (goal <= 0.5)")
    if "entries" in parts:
        names = {layer.name for layer in report.layers}
        kernels = [layer.name for layer in model.layers if type(layer) in KERNELS]
        missing = [n for n in kernels if n not in names]
        print(f"  Conv2D/DepthwiseConv2D/Dense layers: {len(kernels)}, with an entry: "
              f"{len(kernels) - len(missing)}; missing: {missing or 'none'}")
    print("  " + report.summary(5).replace("\n", "\n  "), flush=True)


def timing():
    title, model, x, _, _ = _net("mobilenet_v2")
    with tempfile.TemporaryDirectory() as tmp:
        model.save(os.path.join(tmp, "m.keras"))
        np.save(os.path.join(tmp, "x.npy"), x)
        seconds = {}
        for command in (["quantize", "m.keras", "-o", "m.tflite"], ["analyze", "m.keras"]):
            start = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "cle", *command, "--calibration",
                                "x.npy"], cwd=tmp, capture_output=True, text=True)
            seconds[command[0]] = time.perf_counter() - start
            if r.returncode:
                print(r.stderr)
    ratio = seconds["analyze"] / seconds["quantize"]
    print(f"{title}, {CALIB} crops: cle quantize {seconds['quantize']:.0f} s, cle analyze "
          f"{seconds['analyze']:.0f} s: ratio {ratio:.2f} (goal <= 3); load average "
          f"{os.getloadavg()[0]:.1f}", flush=True)


def badly_ranged(factor, seed=0):
    """The model of tests/test_analysis.py: 'wide' has one channel ``factor``x the others."""
    L = keras.layers
    keras.utils.set_random_seed(seed)
    inp = keras.Input((16, 16, 3))
    x = L.Conv2D(16, 3, padding="same", name="c1")(inp)
    x = L.BatchNormalization(name="bn1")(x)
    x = L.ReLU(name="r1")(x)
    x = L.Conv2D(16, 1, name="wide")(x)
    a = L.DepthwiseConv2D(3, padding="same", name="dw_a")(x)
    b = L.DepthwiseConv2D(3, padding="same", name="dw_b")(x)
    x = L.ReLU(name="r2")(L.Add(name="add")([a, b]))
    model = keras.Model(inp, L.Dense(10, name="logits")(L.GlobalAveragePooling2D()(x)))
    rng = np.random.default_rng(seed)
    bn = model.get_layer("bn1")
    bn.set_weights([rng.uniform(0.5, 1.5, 16), rng.normal(0, 0.5, 16), rng.normal(0, 0.5, 16),
                    rng.uniform(0.5, 2.0, 16)])
    w, bias = model.get_layer("wide").get_weights()
    w[..., 0] *= factor
    bias[0] *= factor
    model.get_layer("wide").set_weights([w, bias])
    for name in ("dw_a", "dw_b"):
        k, b = model.get_layer(name).get_weights()
        k[:, :, 0, :] /= factor
        b[0] /= factor
        model.get_layer(name).set_weights([k, b])
    return model


def rank():
    x = np.random.default_rng(1).uniform(-1, 1, (64, 16, 16, 3)).astype(np.float32)
    for factor in (100.0, 1.0):
        report = cle.analyze(badly_ranged(factor), x)
        order = ", ".join(f"{layer.name} {layer.share:.0%}" for layer in report.worst(3))
        print(f"channel 0 of 'wide' {factor:g}x the others: worst layers {order}", flush=True)


def tune(names):
    for name in names:
        title, model, x, pre, size = _net(name)
        x_eval = pre(P.sample_images(EVAL, size, seed=0))
        ref = model.predict(x_eval, batch_size=32, verbose=0)
        for per_channel in (True, False):
            row = {}
            for tuned in (False, True):
                start = time.perf_counter()
                content, report = cle.quantize(model, x, per_channel=per_channel, tune=tuned)
                y = Q.run_tflite(content, x_eval, batch_size=32)
                row[tuned] = (Q.top1_agreement(ref, y), Q.sqnr_db(ref, y),
                              time.perf_counter() - start)
                if tuned:
                    print("    " + "\n    ".join(report.tuning.lines()))
            (t0, s0, c0), (t1, s1, c1) = row[False], row[True]
            print(f"  {title} {'per-channel' if per_channel else 'per-tensor'} on {EVAL} "
                  f"crops: untuned {t0:.1%} / {s0:.2f} dB ({c0:.0f} s), tuned {t1:.1%} / "
                  f"{s1:.2f} dB ({c1:.0f} s): gain {100 * (t1 - t0):+.1f} points / "
                  f"{s1 - s0:+.2f} dB", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", default=["check", "entries", "time", "rank", "tune"],
                        choices=["check", "entries", "time", "rank", "tune"])
    parser.add_argument("--net", nargs="+", default=list(NETS), choices=list(NETS))
    args = parser.parse_args()
    print(f"{_cpu()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
          f"backend {keras.backend.backend()}", flush=True)
    if {"check", "entries"} & set(args.only):
        for name in args.net:
            check_and_entries(name, args.only)
    if "time" in args.only:
        timing()
    if "rank" in args.only:
        rank()
    if "tune" in args.only:
        tune(args.net)


if __name__ == "__main__":
    main()
