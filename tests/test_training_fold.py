"""Batch-norm folding during training (cle.training_fold): fused layers, fuse/export, FakeQuant.

Tolerances: ``max|Δ| / max|reference|``. Inference equivalence with conv → BN is bounded by
1e-5 (issue 6); training-mode equivalence by 1e-5 as well (measured: 0 without a quantizer, the
fused layer then calls the same ``keras.ops`` as Keras BN, a few 1e-7 through the
two-convolution path: docs/training_fold.md); moving statistics by 1e-6. The layer cases live in
tests/_training_cases.py, which scripts/gen_training_fold_docs.py measures for that page.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest
from _training_cases import (
    CASES,
    _np,
    fused_pair,
    pair_model,
    randomize_bn,
    rel,
    small_model,
    training_steps,
)
from conftest import tensorflow_only

from cle.batch_norm_fold import FoldedPairs
from cle.training_fold import (
    FakeQuant,
    FoldedConv1D,
    FoldedConv2D,
    FoldedDense,
    FoldedDepthwiseConv1D,
    FoldedDepthwiseConv2D,
    export_folded,
    fuse_for_training,
)

L = keras.layers
RTOL = 1e-5
STATS_TOL = 1e-6
FUSED = (FoldedConv1D, FoldedConv2D, FoldedDense, FoldedDepthwiseConv1D, FoldedDepthwiseConv2D)
FUSED_CLASS = {
    "conv2d": FoldedConv2D, "conv2d_nobias_strided": FoldedConv2D, "conv2d_groups": FoldedConv2D,
    "depthwise2d_mult2": FoldedDepthwiseConv2D, "dense": FoldedDense, "dense_rank3": FoldedDense,
    "conv1d_causal": FoldedConv1D, "depthwise1d": FoldedDepthwiseConv1D,
}


class Spy:
    """A kernel quantizer that records what it is given (the folded kernel) and returns it."""

    def __init__(self):
        self.seen = []

    def __call__(self, w):
        self.seen.append(_np(w))
        return w


# --------------------------------------------------------------------------- single layers


@pytest.mark.parametrize("case", sorted(CASES))
def test_inference_equals_layer_then_bn(case):
    model, fused_model, fused, x = fused_pair(case)
    assert type(fused) is FUSED_CLASS[case]
    bn = model.get_layer("bn")
    assert fused.momentum == bn.momentum == 0.9 and fused.epsilon == bn.epsilon == 1e-2
    assert rel(fused_model(x, training=False), model(x, training=False)) <= RTOL
    # get_folded_weights gives a plain layer the same function.
    kernel, bias = fused.get_folded_weights()
    plain = fused._plain_class.from_config(fused._plain_config())
    plain.build(x.shape)
    plain.set_weights([kernel, bias])
    assert rel(plain(x), fused(x)) <= RTOL


@pytest.mark.parametrize("quantizer", [None, "identity"])
@pytest.mark.parametrize("case", ["conv2d", "depthwise2d_mult2", "dense_rank3", "conv1d_causal"])
def test_training_before_freeze_equals_bn_training(case, quantizer):
    # "identity" takes the path with a quantizer: conv(x, W·γ/σ_mv)·σ_mv/σ_B + bias term.
    q = (lambda w: w) if quantizer else None
    model, fused_model, fused, x = fused_pair(case, kernel_quantizer=q)
    bn = model.get_layer("bn")
    m = bn.momentum
    for step, xs in enumerate(training_steps(x)):  # statistics that differ step to step
        y_raw = _np(model.get_layer("layer")(xs)).astype(np.float64)
        axes = tuple(range(y_raw.ndim - 1))
        mean_b, var_b = y_raw.mean(axes), y_raw.var(axes)  # biased variance, as Keras BN
        mm0, mv0 = _np(bn.moving_mean).astype(np.float64), _np(bn.moving_variance)
        y_ref = model(xs, training=True)
        y = fused_model(xs, training=True)
        err = rel(y, y_ref)
        assert err <= (0.0 if q is None else RTOL), (step, err)
        # Moving statistics: exactly Keras BN's, and Keras BN's are moving*m + batch*(1 - m).
        np.testing.assert_array_equal(_np(fused.moving_mean), _np(bn.moving_mean))
        assert rel(fused.moving_variance, bn.moving_variance) <= STATS_TOL
        assert rel(bn.moving_mean, mm0 * m + mean_b * (1 - m)) <= STATS_TOL
        assert rel(bn.moving_variance, mv0 * m + var_b * (1 - m)) <= STATS_TOL
    assert int(_np(fused.step)) == 3


@pytest.mark.parametrize("mode", ["ema_stats_folding", "batch_stats_folding"])
def test_freeze_stops_statistics_and_uses_them(mode):
    _, fused_model, fused, x = fused_pair(
        "conv2d", folding_mode=mode, ema_freeze_delay=2, kernel_quantizer=FakeQuant(8))
    history = []
    outputs = []
    for step in range(5):
        assert fused.is_frozen() == (step >= 2)
        outputs.append(_np(fused_model(x + step, training=True)))
        history.append((_np(fused.moving_mean), _np(fused.moving_variance)))
        assert int(_np(fused.step)) == step + 1
    assert not np.array_equal(history[0][0], history[1][0])  # updating before the freeze
    for mean, var in history[2:]:  # fixed from step 2 on
        np.testing.assert_array_equal(mean, history[1][0])
        np.testing.assert_array_equal(var, history[1][1])
    # After the freeze, training uses the moving statistics: same as inference.
    for step in (2, 3, 4):
        assert rel(outputs[step], fused_model(x + step, training=False)) <= 1e-6


@pytest.mark.parametrize("per_channel", [False, True])
def test_modes_differ_before_freeze_and_agree_after(per_channel):
    """Per tensor, the kernel the quantizer sees matters. Per output channel with a max|w|
    scale, Q(W·s) = Q(W)·s for any per-channel s, so both modes give the same output (the
    kernels still differ by their per-channel scale)."""
    spies = {}
    models = {}
    for mode in ("ema_stats_folding", "batch_stats_folding"):
        spies[mode] = Spy()
        quant = FakeQuant(4, per_channel=per_channel)  # coarse: makes differences visible
        _, models[mode], fused, x = fused_pair(
            "conv2d", folding_mode=mode, ema_freeze_delay=1,
            kernel_quantizer=lambda w, s=spies[mode], q=quant: q(s(w)))
    ema, batch = models["ema_stats_folding"], models["batch_stats_folding"]
    layer = ema.get_layer("layer")
    kernel = _np(layer.kernel).astype(np.float64)
    gamma = _np(layer.gamma).astype(np.float64)
    sigma_mv = np.sqrt(_np(layer.moving_variance).astype(np.float64) + layer.epsilon)
    y_raw = _np(keras.ops.conv(x, layer.kernel, padding="same")) + _np(layer.bias)
    sigma_b = np.sqrt(y_raw.astype(np.float64).var((0, 1, 2)) + layer.epsilon)

    y_ema, y_batch = _np(ema(x, training=True)), _np(batch(x, training=True))
    # Before the freeze: ema folds with the moving σ, batch mode with the batch σ.
    np.testing.assert_allclose(spies["ema_stats_folding"].seen[-1], kernel * gamma / sigma_mv,
                               rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(spies["batch_stats_folding"].seen[-1], kernel * gamma / sigma_b,
                               rtol=1e-5, atol=1e-7)
    before = rel(y_ema, y_batch)
    if per_channel:
        assert before <= RTOL, before
    else:
        assert before > 1e-2, before
    # Both updated their moving statistics identically; now frozen, they agree.
    np.testing.assert_array_equal(_np(ema.get_layer("layer").moving_variance),
                                  _np(batch.get_layer("layer").moving_variance))
    after = rel(ema(x, training=True), batch(x, training=True))
    assert after <= 1e-6, after
    np.testing.assert_array_equal(spies["ema_stats_folding"].seen[-1],
                                  spies["batch_stats_folding"].seen[-1])


def test_without_quantizer_modes_are_the_same_function():
    _, ema, _, x = fused_pair("depthwise2d_mult2", folding_mode="ema_stats_folding")
    _, batch, _, _ = fused_pair("depthwise2d_mult2", folding_mode="batch_stats_folding")
    assert rel(ema(x, training=True), batch(x, training=True)) <= RTOL


def test_kernel_quantizer_applies_to_folded_kernel_in_inference():
    _, fused_model, fused, x = fused_pair("depthwise2d_mult2", kernel_quantizer=FakeQuant(8))
    kernel, bias = fused.get_folded_weights()
    w = _np(fused.kernel).astype(np.float64)
    s = _np(fused.gamma) / np.sqrt(_np(fused.moving_variance).astype(np.float64) + fused.epsilon)
    folded = w * s.reshape(w.shape[-2:])  # depthwise output channel c*mult + m
    # Per output channel (c, m): max|w| / 127 steps, at most 255 levels, within half a step.
    step = np.abs(folded).max(axis=(0, 1)) / 127
    levels = kernel / step
    np.testing.assert_allclose(levels, np.round(levels), atol=1e-3)
    assert np.all(np.abs(kernel - folded) <= step / 2 + 1e-7)
    # Inference uses exactly that kernel: the plain layer is bit-compatible up to round-off.
    plain = L.DepthwiseConv2D(3, depth_multiplier=2, padding="same")
    plain.build(x.shape)
    plain.set_weights([kernel, bias])
    assert rel(plain(x), fused_model(x)) <= RTOL


def test_trainable_false_runs_in_inference_mode():
    _, fused_model, fused, x = fused_pair("conv2d")
    fused.trainable = False
    before = _np(fused.moving_mean)
    assert rel(fused_model(x, training=True), fused_model(x, training=False)) == 0.0
    np.testing.assert_array_equal(_np(fused.moving_mean), before)
    assert int(_np(fused.step)) == 0


@tensorflow_only("tf.GradientTape")
def test_gradients_reach_kernel_and_gamma_through_fake_quant():
    import tensorflow as tf

    _, fused_model, fused, x = fused_pair("conv2d", kernel_quantizer=FakeQuant(8))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(fused_model(x, training=True)))
    grads = tape.gradient(loss, fused.trainable_weights)
    assert [w.path.split("/")[-1] for w in fused.trainable_weights] == [
        "kernel", "bias", "gamma", "beta"]
    for w, g in zip(fused.trainable_weights, grads):
        assert g is not None, w.path
        if w.path.endswith(("kernel", "gamma", "beta")):
            assert np.abs(_np(g)).max() > 0, w.path


# --------------------------------------------------------------------------- FakeQuant


@tensorflow_only("tf.GradientTape")
def test_fake_quant_values_and_straight_through_gradient():
    import tensorflow as tf

    w = np.array([[0.1, -1.0, 0.0], [0.7, 0.26, 0.0]], "float32")
    q = _np(FakeQuant(bits=4)(w))  # 7 levels each side, per column
    np.testing.assert_allclose(q, [[0.1, -1.0, 0.0], [0.7, 2 / 7, 0.0]], rtol=1e-6)
    q_tensor = _np(FakeQuant(bits=4, per_channel=False)(w))  # one step, 1/7
    np.testing.assert_allclose(q_tensor, np.round(w * 7) / 7, rtol=1e-6)
    q_rows = _np(FakeQuant(bits=4, axis=0)(w))  # per row: steps 1/7 and 0.7/7
    np.testing.assert_allclose(q_rows, [[1 / 7, -1.0, 0.0], [0.7, 0.3, 0.0]], rtol=1e-6)
    v = tf.Variable(w)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(FakeQuant(bits=2)(v) * np.arange(6, dtype="float32").reshape(2, 3))
    np.testing.assert_array_equal(tape.gradient(loss, v), np.arange(6).reshape(2, 3))


def test_fake_quant_config_and_serialization():
    q = FakeQuant(bits=6, per_channel=False, axis=0)
    assert FakeQuant.from_config(q.get_config()) == q
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(q))
    assert restored == q and restored is not q
    for bad in ({"bits": 1}, {"bits": 8.0}, {"bits": True}, {"axis": "last"}):
        with pytest.raises(ValueError):
            FakeQuant(**bad)


# --------------------------------------------------------------------------- config, saving


@pytest.mark.parametrize("cls, args", [
    (FoldedConv2D, (4, 3)), (FoldedConv1D, (4, 3)), (FoldedDense, (4,)),
    (FoldedDepthwiseConv2D, (3,)), (FoldedDepthwiseConv1D, (3,)),
])
def test_get_config_from_config(cls, args):
    import json

    layer = cls(*args, folding_mode="batch_stats_folding", ema_freeze_delay=7,
                kernel_quantizer=FakeQuant(6), momentum=0.8, epsilon=1e-4, center=False,
                gamma_initializer="random_normal", activation="relu", name="f")
    config = layer.get_config()
    json.dumps(config)  # serializable as is
    clone = cls.from_config(config)
    assert clone.get_config() == config
    assert clone.kernel_quantizer == FakeQuant(6)
    assert (clone.folding_mode, clone.ema_freeze_delay, clone.momentum, clone.epsilon,
            clone.center) == ("batch_stats_folding", 7, 0.8, 1e-4, False)


def test_invalid_arguments():
    with pytest.raises(ValueError, match="folding_mode"):
        FoldedConv2D(4, 3, folding_mode="ema")
    with pytest.raises(ValueError, match="ema_freeze_delay"):
        FoldedDense(4, ema_freeze_delay=-1)
    with pytest.raises(ValueError, match="ema_freeze_delay"):
        FoldedDense(4, ema_freeze_delay=2.5)
    with pytest.raises(ValueError, match="kernel_quantizer"):
        FoldedDense(4, kernel_quantizer="int8")
    with pytest.raises(ValueError, match="channels_last"):
        FoldedConv2D(4, 3, data_format="channels_first")
    with pytest.raises(ValueError, match="folding_mode"):
        fuse_for_training(pair_model("dense")[0], folding_mode="batch")


def test_keras_save_load_keeps_step_and_statistics(tmp_path):
    _, fused_model, fused, x = fused_pair(
        "depthwise2d_mult2", ema_freeze_delay=3, kernel_quantizer=FakeQuant(8))
    for step in range(4):
        fused_model(x + step, training=True)
    path = tmp_path / "fused.keras"
    fused_model.save(path)
    loaded = keras.saving.load_model(path)  # no custom_objects: registered under "cle"
    layer = loaded.get_layer("layer")
    assert type(layer) is FoldedDepthwiseConv2D
    assert int(_np(layer.step)) == 4 and layer.is_frozen()
    assert layer.kernel_quantizer == FakeQuant(8)
    for a, b in zip(fused.weights, layer.weights):
        assert a.path == b.path
        np.testing.assert_array_equal(_np(a), _np(b))
    np.testing.assert_array_equal(_np(loaded(x, training=False)), _np(fused_model(x)))
    # Still frozen after loading: training does not move the statistics.
    loaded(x * 3, training=True)
    np.testing.assert_array_equal(_np(layer.moving_mean), _np(fused.moving_mean))


# --------------------------------------------------------------------------- model level


def test_fuse_for_training_fit_export():
    model = small_model()
    snapshot = [w.copy() for w in model.get_weights()]
    rng = np.random.default_rng(1)
    x = rng.normal(0.0, 1.0, (16, 12, 12, 3)).astype("float32")
    y = rng.integers(0, 3, 16)

    fused_model, pairs = fuse_for_training(
        model, kernel_quantizer=FakeQuant(8), ema_freeze_delay=2, return_pairs=True)
    assert isinstance(pairs, FoldedPairs)
    assert [(type(f).__name__, f.name, bn.name) for f, bn in pairs] == [
        ("FoldedConv2D", "conv1", "bn1"), ("FoldedDepthwiseConv2D", "dw2", "bn2"),
        ("FoldedDense", "fc5", "bn5")]
    assert all(p.bn_after and any(p.layer is l for l in fused_model.layers) for p in pairs)
    reasons = {s.bn.name: s.reason for s in pairs.skipped}
    assert set(reasons) == {"bn3", "bn_pre4"}, reasons
    assert "'sep3' is a SeparableConv2D; fused training layers exist for" in reasons["bn3"]
    assert "forward fold" in reasons["bn_pre4"]
    names = [l.name for l in fused_model.layers]
    assert "bn1" not in names and "bn3" in names and "conv1" in names
    # Inference: the 8-bit fake-quantized kernels change the function a little.
    assert rel(fused_model(x), model(x)) <= 0.05

    # Without a quantizer: inference and training mode equal the original model's.
    plain_fused = fuse_for_training(model)
    assert rel(plain_fused(x, training=False), model(x, training=False)) <= RTOL
    assert rel(plain_fused(x, training=True), model(x, training=True)) <= RTOL
    model.set_weights(snapshot)  # undo the BN updates of that training call

    fused_model.compile(keras.optimizers.SGD(0.05),
                        keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    fused_model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    for layer, _ in pairs:
        assert int(_np(layer.step)) == 4 and layer.is_frozen()
    exported = export_folded(fused_model)
    assert not any(isinstance(l, FUSED) for l in exported.layers)
    assert [l.name for l in exported.layers] == names
    assert {type(exported.get_layer(n)).__name__ for n in ("conv1", "dw2", "fc5")} == {
        "Conv2D", "DepthwiseConv2D", "Dense"}
    err = rel(exported(x), fused_model(x, training=False))
    assert err <= RTOL, err
    # The input model is untouched.
    for a, b in zip(snapshot, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_fit_statistics_match_keras_bn_and_freeze_in_graph_mode():
    """In model.fit (tf.function), with a zero learning rate, the fused layers' moving
    statistics follow the original BNs' step for step, and stop at the freeze."""
    model = small_model(seed=2)
    rng = np.random.default_rng(3)
    x = rng.normal(0.0, 1.0, (12, 12, 12, 3)).astype("float32")
    y = rng.integers(0, 3, 12)
    fused_model, pairs = fuse_for_training(model, ema_freeze_delay=2, return_pairs=True)
    for m in (model, fused_model):
        m.compile(keras.optimizers.SGD(0.0),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    fused_model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)  # 3 steps
    model.fit(x[:8], y[:8], batch_size=4, epochs=1, shuffle=False, verbose=0)  # 2 steps
    for fused, bn in pairs:
        assert int(_np(fused.step)) == 3
        assert rel(fused.moving_mean, bn.moving_mean) <= STATS_TOL, fused.name
        assert rel(fused.moving_variance, bn.moving_variance) <= STATS_TOL, fused.name


def test_sequential_and_bn_as_model_output():
    keras.utils.set_random_seed(4)
    model = keras.Sequential([
        keras.Input((10, 4)),
        L.Conv1D(6, 3, padding="causal", name="c1"),
        L.BatchNormalization(name="bn1"),
        L.ReLU(),
        L.Flatten(),
        L.Dense(5, name="d2"),
        L.BatchNormalization(name="bn_out"),
    ], name="seq")
    rng = np.random.default_rng(5)
    for layer in model.layers:
        if isinstance(layer, L.BatchNormalization):
            randomize_bn(layer, rng)
    x = rng.normal(0.0, 1.0, (8, 10, 4)).astype("float32")
    fused_model = fuse_for_training(model)
    assert isinstance(fused_model, keras.Sequential)
    assert [type(l).__name__ for l in fused_model.layers] == [
        "FoldedConv1D", "ReLU", "Flatten", "FoldedDense", "Identity"]
    assert fused_model.layers[-1].name == "bn_out"  # keeps the output name
    assert rel(fused_model(x), model(x)) <= RTOL
    exported = export_folded(fused_model)
    assert [type(l).__name__ for l in exported.layers] == [
        "Conv1D", "ReLU", "Flatten", "Dense", "Identity"]
    assert rel(exported(x), model(x)) <= RTOL


def test_skip_reasons():
    keras.utils.set_random_seed(6)
    inp = keras.Input((8, 8, 4))
    a = L.Conv2D(4, 3, padding="same", name="conv_a")(inp)
    a = L.BatchNormalization(name="bn_a1")(a)
    a = L.BatchNormalization(name="bn_a2")(a)  # a second BN after the same conv
    b = L.Conv2D(4, 3, padding="same", name="conv_b")(inp)
    b = L.BatchNormalization(renorm=True, name="bn_renorm")(b)
    c = L.Conv2D(4, 3, padding="same", name="conv_c")(inp)
    bn_c = L.BatchNormalization(name="bn_frozen")
    bn_c.trainable = False
    c = bn_c(c)
    d = L.Conv2DTranspose(4, 3, padding="same", name="deconv")(inp)
    d = L.BatchNormalization(name="bn_t")(d)
    e = L.Conv2D(4, 3, padding="same", activation="relu", name="conv_relu")(inp)
    e = L.BatchNormalization(name="bn_relu")(e)
    out = L.Add()([a, b, c, d, e])
    model = keras.Model(inp, out)
    fused_model, pairs = fuse_for_training(model, return_pairs=True)
    assert [(f.name, bn.name) for f, bn in pairs] == [("conv_a", "bn_a1")]
    reasons = {s.bn.name: s.reason for s in pairs.skipped}
    assert "a batch norm that is fused into 'conv_a' already" in reasons["bn_a2"]
    assert "renorm=True" in reasons["bn_renorm"]
    assert "it has trainable=False but 'conv_c' has trainable=True" in reasons["bn_frozen"]
    assert "'deconv' is a Conv2DTranspose" in reasons["bn_t"]
    assert "applies activation 'relu'" in reasons["bn_relu"]
    x = np.random.default_rng(7).normal(size=(2, 8, 8, 4)).astype("float32")
    assert rel(fused_model(x), model(x)) <= RTOL


def test_channels_first_is_skipped():
    keras.utils.set_random_seed(8)
    inp = keras.Input((3, 8, 8))
    h = L.Conv2D(4, 3, padding="same", data_format="channels_first", name="conv")(inp)
    out = L.BatchNormalization(axis=1, name="bn")(h)
    model = keras.Model(inp, out)
    fused_model, pairs = fuse_for_training(model, return_pairs=True)
    assert not pairs
    assert "channels_first" in pairs.skipped[0].reason


# --------------------------------------------------------------------------- example


@pytest.mark.slow
def test_example_qat_finetune():
    root = pathlib.Path(__file__).resolve().parents[1]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(
        [sys.executable, str(root / "examples" / "qat_finetune.py")],
        cwd=root, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    out = proc.stdout
    assert "4 fused: conv1 (FoldedConv2D), dw2 (FoldedDepthwiseConv2D), pw3 (FoldedConv2D), " \
           "fc4 (FoldedDense); 0 skipped" in out, out
    assert "input int8" in out and "'CONV_2D'" in out and "'DEPTHWISE_CONV_2D'" in out, out
    diff = float(out.split("max|exported - fused| / max|fused| = ")[1].split()[0])
    assert diff <= RTOL, out
