"""Layer → BN cases for batch-norm folding during training (cle.training_fold), shared by
tests/test_training_fold.py and scripts/gen_training_fold_docs.py (which measures the same
cases for docs/training_fold.md). No pytest here: the script imports it as a plain module."""

from __future__ import annotations

import keras
import numpy as np

from cle.training_fold import fuse_for_training

L = keras.layers


def _np(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def rel(a, b):
    """``max|a - b| / max|b|``, in float64."""
    a, b = _np(a).astype(np.float64), _np(b).astype(np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


#: What :func:`randomize_bn` draws, for the docs: γ magnitude, σ² range.
BN_GAMMA_RANGE = (0.5, 1.5)
BN_VARIANCE_RANGE = (0.3, 2.0)


def randomize_bn(bn, rng):
    """γ of both signs (magnitude in BN_GAMMA_RANGE), β ~ N(0, 1), moving mean ~ N(0, 0.5),
    moving variance uniform in BN_VARIANCE_RANGE."""
    c = bn.moving_mean.shape[0]
    if bn.scale:
        bn.gamma.assign(rng.uniform(*BN_GAMMA_RANGE, c) * rng.choice([-1.0, 1.0], c))
    if bn.center:
        bn.beta.assign(rng.normal(0.0, 1.0, c))
    bn.moving_mean.assign(rng.normal(0.0, 0.5, c))
    bn.moving_variance.assign(rng.uniform(*BN_VARIANCE_RANGE, c))


# One layer -> BN pair per case: (layer factory, input shape without batch).
CASES = {
    "conv2d": (lambda: L.Conv2D(6, 3, padding="same", name="layer"), (9, 9, 4)),
    "conv2d_nobias_strided": (
        lambda: L.Conv2D(5, 3, strides=2, use_bias=False, name="layer"), (9, 9, 3)),
    "conv2d_groups": (lambda: L.Conv2D(6, 3, groups=2, padding="same", name="layer"), (8, 8, 4)),
    "depthwise2d_mult2": (
        lambda: L.DepthwiseConv2D(3, depth_multiplier=2, padding="same", name="layer"),
        (8, 8, 3)),
    "dense": (lambda: L.Dense(7, name="layer"), (10,)),
    "dense_rank3": (lambda: L.Dense(5, use_bias=False, name="layer"), (6, 4)),
    "conv1d_causal": (lambda: L.Conv1D(5, 3, padding="causal", name="layer"), (12, 3)),
    "depthwise1d": (lambda: L.DepthwiseConv1D(3, depth_multiplier=3, name="layer"), (12, 2)),
}
BATCH = 6  # inputs per case


def pair_model(case, seed=0, momentum=0.9, epsilon=1e-2, **bn_kwargs):
    """(keras.Model: input -> layer -> BN with non-default momentum/epsilon and random
    statistics, input batch)."""
    factory, shape = CASES[case]
    keras.utils.set_random_seed(seed)
    inp = keras.Input(shape)
    layer = factory()
    out = L.BatchNormalization(momentum=momentum, epsilon=epsilon, name="bn", **bn_kwargs)(
        layer(inp))
    model = keras.Model(inp, out)
    rng = np.random.default_rng(seed)
    if layer.use_bias:
        layer.bias.assign(rng.normal(0.0, 0.5, layer.bias.shape))
    randomize_bn(model.get_layer("bn"), rng)
    x = rng.normal(0.5, 1.0, (BATCH,) + shape).astype("float32")
    return model, x


def fused_pair(case, seed=0, **options):
    """(model, fuse_for_training(model, **options), its fused layer, input batch)."""
    model, x = pair_model(case, seed)
    fused_model = fuse_for_training(model, **options)
    return model, fused_model, fused_model.get_layer("layer"), x


def training_steps(x, steps=3):
    """The inputs of successive training steps: statistics that differ from step to step."""
    return [x * (1.0 + 0.5 * step) + step for step in range(steps)]


def small_model(seed=0):
    """conv → BN → ReLU, depthwise(×2) → BN → ReLU, separable → BN, BN → valid conv,
    pool, Dense → BN → ReLU, Dense."""
    keras.utils.set_random_seed(seed)
    inp = keras.Input((12, 12, 3), name="image")
    h = L.Conv2D(8, 3, padding="same", use_bias=False, name="conv1")(inp)
    h = L.BatchNormalization(name="bn1")(h)
    h = L.ReLU(name="relu1")(h)
    h = L.DepthwiseConv2D(3, depth_multiplier=2, padding="same", name="dw2")(h)
    h = L.BatchNormalization(name="bn2")(h)
    h = L.ReLU(name="relu2")(h)
    h = L.SeparableConv2D(8, 3, padding="same", name="sep3")(h)
    h = L.BatchNormalization(name="bn3")(h)
    h = L.ReLU(name="relu3")(h)
    h = L.BatchNormalization(name="bn_pre4")(h)
    h = L.Conv2D(8, 3, name="conv4")(h)  # valid padding: bn_pre4 folds forward into it
    h = L.GlobalAveragePooling2D(name="pool")(h)
    h = L.Dense(16, name="fc5")(h)
    h = L.BatchNormalization(name="bn5")(h)
    h = L.ReLU(name="relu5")(h)
    out = L.Dense(3, name="logits")(h)
    model = keras.Model(inp, out, name="small")
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, L.BatchNormalization):
            randomize_bn(layer, rng)
    return model
