"""Cross-layer equalization step by step, choosing every layer by hand (AIMET-style API).

On ``keras.applications.ResNet50`` (random weights, 224x224), for the first bottleneck blocks
only (``conv2_block1`` .. ``conv2_block3`` and ``conv3_block1`` by default)::

    fold the chosen conv/BN pairs      cle.fold_given_batch_norms(model, [(conv, bn), ...])
    scale the chosen conv pairs        cle.CrossLayerScaling.scale_cls_sets(sets, model=folded)
    package them for high-bias fold    cle.CrossLayerScaling.create_cls_set_info_list(...)
    move high biases forward           cle.HighBiasFold.bias_fold(infos, {conv: bn})

Inside a bottleneck block ``1_conv (1x1) -> ReLU -> 2_conv (3x3, same) -> ReLU -> 3_conv (1x1)``,
so the scalable sets are ``(1_conv, 2_conv)`` and ``(2_conv, 3_conv)``; ``3_conv`` feeds the
residual Add, so no set starts there (``scale_cls_sets`` refuses one, shown at the end).

Run::

    .venv/bin/python examples/stepwise_manual_resnet50.py [--blocks conv2_block1 conv2_block2]
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
    """Made-up per-channel BN statistics: with ``weights=None`` every BN is the identity, so a
    wrong fold would look exact and high-bias folding would have nothing to move (β=0). β has a
    positive mean so that some channels have β > 3|γ|."""
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


def kernel_spread(layer):
    """max / median of the per-output-channel max|W| of a Conv2D kernel (h, w, in, out)."""
    r = np.abs(keras.ops.convert_to_numpy(layer.kernel)).max(axis=(0, 1, 2))
    return float(r.max() / np.median(r))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", nargs="+",
                        default=["conv2_block1", "conv2_block2", "conv2_block3", "conv3_block1"],
                        help="bottleneck blocks to process (default: the first four)")
    parser.add_argument("--batch", type=int, default=2, help="random inputs (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    keras.utils.set_random_seed(args.seed)  # weights=None draws the kernels at random

    model = keras.applications.ResNet50(
        weights=None, input_shape=(224, 224, 3), classifier_activation=None)
    randomize_batch_norms(model, args.seed)
    x = np.random.default_rng(args.seed + 1).normal(
        0.0, 1.0, (args.batch, 224, 224, 3)).astype("float32")
    y0 = logits(model, x)
    print(f"ResNet50 (weights=None, random BN statistics): {len(model.layers)} layers; "
          f"blocks {', '.join(args.blocks)}")
    print("difference = max|y - y0| / max|y0| of the logits against the original model\n")

    # 1. Fold the BN after each of the block's three convolutions (names of `model`).
    fold_pairs = [(f"{b}_{i}_conv", f"{b}_{i}_bn") for b in args.blocks for i in (1, 2, 3)]
    folded = cle.fold_given_batch_norms(model, fold_pairs)
    n_bn = sum(isinstance(la, keras.layers.BatchNormalization) for la in folded.layers)
    print(f"1. fold_given_batch_norms: {len(fold_pairs)} pairs folded, e.g. "
          f"{fold_pairs[0]}; {n_bn} BNs left in the model")
    print(f"   difference {rel_diff(y0, logits(folded, x)):.2e}")

    # 2. Scale conv pairs of the FOLDED model (a BN still between two convs would refuse).
    sets = [(folded.get_layer(f"{b}_{i}_conv"), folded.get_layer(f"{b}_{i + 1}_conv"))
            for b in args.blocks for i in (1, 2)]
    spread_before = [kernel_spread(la) for la in sets[0]]
    factors = cle.CrossLayerScaling.scale_cls_sets(sets, model=folded)
    spread_after = [kernel_spread(la) for la in sets[0]]
    print(f"2. CrossLayerScaling.scale_cls_sets: {len(sets)} sets scaled in place")
    for (a, b), s in zip(sets, factors):
        print(f"   {a.name} -> {b.name}: {s.size} factors in {s.min():.3g} .. {s.max():.3g}")
    print(f"   output-channel range spread (max/median of max|W|) of {sets[0][0].name}: "
          f"{spread_before[0]:.2f} -> {spread_after[0]:.2f}")
    print(f"   difference {rel_diff(y0, logits(folded, x)):.2e}")

    # 3. High-bias folding. Every set has a ReLU between its two convs; the BN of each set's
    #    first conv is the BN of the ORIGINAL model it absorbed (backward fold).
    infos = cle.CrossLayerScaling.create_cls_set_info_list(sets, factors, [True] * len(sets))
    bn_layers = {folded.get_layer(conv): model.get_layer(bn) for conv, bn in fold_pairs}
    records = cle.HighBiasFold.bias_fold(infos, bn_layers)
    print(f"3. HighBiasFold.bias_fold: {sum(r.absorbed for r in records)} of {len(records)} "
          "pairs absorbed")
    for r in records:
        if r.absorbed:
            print(f"   {r.layer1} -> {r.layer2}: {r.channels} channels shifted, "
                  f"max shift {r.max_shift:.3g}")
        else:
            print(f"   {r.layer1} -> {r.layer2}: skipped, {r.reason}")
    print(f"   difference {rel_diff(y0, logits(folded, x)):.2e}  (not exact: the 3-sigma rule "
          "trusts the BN statistics, made up here)")

    # A set that would change the function is refused, and nothing is scaled.
    # 3_conv feeds the residual Add, not the next block's 1_conv alone.
    stage, block = args.blocks[0].split("_block")
    bad = [(folded.get_layer(f"{stage}_block{block}_3_conv"),
            folded.get_layer(f"{stage}_block{int(block) + 1}_1_conv"))]
    try:
        cle.CrossLayerScaling.scale_cls_sets(bad, model=folded)
    except ValueError as exc:
        print(f"\nrefused as expected: {exc}")
    print(f"done in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
