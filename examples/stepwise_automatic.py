"""Cross-layer equalization step by step, the automatic way (AIMET-style API).

What ``cle.equalize_model(model)`` does in one call, written out as four user-visible steps on
``keras.applications.MobileNetV2`` (random weights, 224x224)::

    ReLU6 -> ClippedReLU   cle.replace_relu6_with_clipped_relu(model)
    fold batch norms       cle.fold_all_batch_norms(...)
    cross-layer scaling    cle.CrossLayerScaling.scale_model(folded)        (in place)
    high-bias folding      cle.HighBiasFold.bias_fold(cls_set_infos, bns)   (in place)

After each step it prints what was done and ``max|y - y0| / max|y0|``, the largest difference of
the logits from those of the original model on a fixed random batch. Steps 1-3 are exact
rewrites (float32 round-off). Step 4 is exact only where a pre-activation stays above the shift
``c = max(0, β − 3|γ|)`` taken from the BN statistics; the made-up statistics used here do not
describe the real activations, so step 4 shows a visible difference.

Step 1 must come before ``scale_model``: the in-place scaling cannot give a plain ReLU6 the
per-channel caps it would need.

Run::

    .venv/bin/python examples/stepwise_automatic.py [--batch 4] [--seed 0]
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import time  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

import cle  # noqa: E402


def randomize_batch_norms(model, seed=0):
    """Give every BatchNormalization made-up, per-channel statistics.

    With ``weights=None`` every BN is the identity (γ=1, β=0, μ=0, σ²=1): folding would look exact
    even if it were wrong, and high-bias folding would have nothing to move (β=0). Spreads like a
    trained network's (γ in [0.5, 1.5], σ² in [0.5, 2]) keep the 150-layer float32 network well
    conditioned; β has a positive mean so that some channels have β > 3|γ| (the "high biases"
    that high-bias folding moves into the next layer).
    """
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            c = layer.moving_mean.shape[0]
            layer.gamma.assign(rng.uniform(0.5, 1.5, c))
            layer.beta.assign(rng.normal(1.0, 1.5, c))
            layer.moving_mean.assign(rng.normal(0.0, 0.5, c))
            layer.moving_variance.assign(rng.uniform(0.5, 2.0, c))
    return model


def logits(model, x):
    return keras.ops.convert_to_numpy(model(x, training=False)).astype(np.float64)


def rel_diff(y0, y):
    return float(np.abs(y - y0).max() / np.abs(y0).max())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4, help="random inputs (default 4)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    keras.utils.set_random_seed(args.seed)  # weights=None draws the kernels at random

    # Logits (classifier_activation=None): a softmax over 1000 classes of a random network is
    # nearly flat and would hide differences.
    model = keras.applications.MobileNetV2(
        weights=None, input_shape=(224, 224, 3), classifier_activation=None)
    randomize_batch_norms(model, args.seed)
    x = np.random.default_rng(args.seed + 1).uniform(
        -1.0, 1.0, (args.batch, 224, 224, 3)).astype("float32")  # MobileNetV2's input range
    y0 = logits(model, x)
    print(f"MobileNetV2 (weights=None, random BN statistics): {len(model.layers)} layers, "
          f"logits on {args.batch} random images, max|y0| = {np.abs(y0).max():.3g}")
    print("difference = max|y - y0| / max|y0| against the original model\n")

    # 1. ReLU6 -> ClippedReLU(caps=6). Same function; the per-channel caps let scaling cross the
    #    activation exactly (scale_model divides the caps by the factors). The alternative,
    #    cle.replace_relu6_with_relu, is what Nagel et al. and AIMET do, but it CHANGES the
    #    function (activations above 6 are no longer clipped); see the check at the end.
    bounded, replaced = cle.replace_relu6_with_clipped_relu(model)
    print(f"1. replace_relu6_with_clipped_relu: {len(replaced)} ReLU6 -> ClippedReLU "
          f"(e.g. {', '.join(replaced[:3])})")
    print(f"   difference {rel_diff(y0, logits(bounded, x)):.2e}")

    # 2. Fold every BN. pairs[i] = (layer of `folded`, BN of `bounded`); pair.bn_after tells a
    #    backward fold (BN after the layer) from a forward one.
    pairs, folded = cle.fold_all_batch_norms(bounded)
    n_backward = sum(p.bn_after for p in pairs)
    print(f"2. fold_all_batch_norms: {len(pairs)} folded ({n_backward} backward, "
          f"{len(pairs) - n_backward} forward), {len(pairs.skipped)} skipped")
    for skip in pairs.skipped:
        print(f"   skipped {skip}")
    print(f"   difference {rel_diff(y0, logits(folded, x)):.2e}")

    # 3. Find every scaling set of the folded model and equalize it, in place.
    cls_set_infos = cle.CrossLayerScaling.scale_model(folded)
    n_trip = sum(len(info.cls_pair_info_list) == 2 for info in cls_set_infos)
    scales = np.concatenate([p.scale_factor for info in cls_set_infos
                             for p in info.cls_pair_info_list])
    print(f"3. CrossLayerScaling.scale_model: {len(cls_set_infos)} sets "
          f"({len(cls_set_infos) - n_trip} pairs, {n_trip} triplets), "
          f"scale factors {scales.min():.3g} .. {scales.max():.3g}")
    for info in cls_set_infos[:3]:
        print(f"   {info.cls_pair_info_list}")
    print(f"   difference {rel_diff(y0, logits(folded, x)):.2e}")

    # 4. High-bias folding needs, for each set's first layer, the BN it absorbed. Only BACKWARD
    #    folds qualify: a BN folded forward sat before the layer, so its statistics describe the
    #    layer's input, not its output.
    bn_layers = {layer: bn for layer, bn in (p for p in pairs if p.bn_after)}
    records = cle.HighBiasFold.bias_fold(cls_set_infos, bn_layers)
    absorbed = [r for r in records if r.absorbed]
    print(f"4. HighBiasFold.bias_fold: {len(records)} pairs considered, {len(absorbed)} absorbed "
          f"({sum(r.channels for r in absorbed)} channels, max shift "
          f"{max((r.max_shift for r in absorbed), default=0.0):.3g}), "
          f"{len(records) - len(absorbed)} skipped")
    skipped = [r for r in records if not r.absorbed]
    for r in skipped[:2]:
        print(f"   skipped {r.layer1} -> {r.layer2}: {r.reason}")
    if len(skipped) > 2:
        print(f"   ... {len(skipped) - 2} more")
    print(f"   difference {rel_diff(y0, logits(folded, x)):.2e}  (not exact: the 3-sigma rule "
          "trusts the BN statistics, made up here)")

    # The alternative ReLU6 handling, for comparison: ReLU6 -> ReLU changes the original model.
    relu_model, _ = cle.replace_relu6_with_relu(model)
    print(f"\n(for comparison) replace_relu6_with_relu alone: difference "
          f"{rel_diff(y0, logits(relu_model, x)):.2e}, the function changed")
    print(f"done in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
