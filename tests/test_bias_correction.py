"""Bias correction (issue 5): analytic means, the bias formula, analytic and empirical modes."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import pytest

import cle
from cle._core.inputs import check_calibration_data
from cle import bias_correction as BC
from cle._core.graph import graph_view
from cle._core.layouts import layout_of, read_weight
from cle._transforms import bias_correction as BCI
from cle._transforms import bias_pass, bias_steps
from cle.quantization import fake_quantize_weights, quantize_kernel
from conftest import real_mobilenet_v2

import bias_correction_reference as reference

L = keras.layers


# --------------------------------------------------------------------------- math


@pytest.mark.parametrize("beta,gamma", [(0.3, 1.0), (-1.5, 0.7), (2.0, 0.5), (0.0, 2.0),
                                        (-0.2, -1.3)])
def test_relu_normal_mean_matches_monte_carlo(beta, gamma):
    rng = np.random.default_rng(0)
    x = rng.normal(beta, abs(gamma), 1_000_000)
    mc = np.maximum(x, 0).mean()
    assert BC.expected_relu_normal(beta, gamma) == pytest.approx(mc, rel=1e-2)


@pytest.mark.parametrize("beta,gamma,cap", [(0.3, 1.0, 1.0), (2.0, 3.0, 6.0), (5.5, 1.0, 6.0),
                                            (-0.5, 1.0, 0.4), (1.0, 0.3, 0.8)])
def test_clipped_normal_mean_matches_monte_carlo(beta, gamma, cap):
    rng = np.random.default_rng(1)
    x = rng.normal(beta, gamma, 1_000_000)
    mc = np.clip(x, 0, cap).mean()
    assert BC.expected_clipped_normal(beta, gamma, 0.0, cap) == pytest.approx(mc, rel=1e-2)


def test_clipped_normal_limits():
    beta = np.array([-1.0, 0.5, 3.0])
    gamma = np.array([0.5, 1.0, 2.0])
    # no bounds: the mean; no cap: the ReLU mean; zero std: clip(mean)
    np.testing.assert_allclose(BC.expected_clipped_normal(beta, gamma, -np.inf, np.inf), beta)
    np.testing.assert_allclose(BC.expected_clipped_normal(beta, gamma, 0.0, 1e6),
                               BC.expected_relu_normal(beta, gamma))
    np.testing.assert_allclose(BC.expected_clipped_normal(beta, 0.0, 0.0, 2.0), [0, 0.5, 2.0])
    # per-channel caps broadcast (means well above Monte Carlo noise)
    beta = np.array([-0.3, 0.5, 3.0])
    caps = np.array([1.0, 2.0, 3.0])
    rng = np.random.default_rng(2)
    x = rng.normal(beta, gamma, (1_000_000, 3))
    np.testing.assert_allclose(BC.expected_clipped_normal(beta, gamma, 0.0, caps),
                               np.clip(x, 0, caps).mean(axis=0), rtol=1e-2)


@pytest.mark.parametrize("kind", ["conv", "depthwise", "dense", "grouped"])
def test_bias_delta_equals_output_mean_shift(kind):
    """Σ ε·E[x] is the shift of a (valid-padding) layer's output mean, computed by Keras."""
    rng = np.random.default_rng(3)
    c = 4
    if kind == "conv":
        layer = L.Conv2D(6, 3, use_bias=False)
    elif kind == "grouped":
        layer = L.Conv2D(6, 3, groups=2, use_bias=False)
    elif kind == "depthwise":
        layer = L.DepthwiseConv2D(3, depth_multiplier=2, use_bias=False)
    else:
        layer = L.Dense(5, use_bias=False)
    shape = (c,) if kind == "dense" else (5, 5, c)
    layer.build((None,) + shape)
    eps = rng.normal(size=layer.kernel.shape)
    layer.kernel.assign(eps)
    mean_x = rng.normal(size=c)
    x = np.broadcast_to(mean_x, (1,) + shape).astype(np.float32)  # constant input = its mean
    y = keras.ops.convert_to_numpy(layer(x))
    y = y.reshape(-1, y.shape[-1]).mean(axis=0)
    kind = "conv" if kind == "grouped" else kind
    delta = BCI._bias_delta(kind, eps, mean_x, int(getattr(layer, "groups", 1)))
    np.testing.assert_allclose(delta, y, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- single conv, analytic


def _single_conv(c_in=8, c_out=16, seed=0):
    """Conv2D whose input comes from ReLU of a Conv2D 'src' with known (γ, β) statistics."""
    inp = keras.Input((None, None, c_in), name="x")
    h = L.ReLU(name="relu")(L.Identity(name="src")(inp))
    out = L.Conv2D(c_out, 3, padding="valid", name="conv")(h)
    model = keras.Model(inp, out)
    rng = np.random.default_rng(seed)
    conv = model.get_layer("conv")
    # Uneven channel ranges so per-tensor INT8 has a visible mean error.
    k = rng.normal(0, 1, conv.kernel.shape) * rng.uniform(0.01, 1, c_out)
    conv.kernel.assign(k)
    conv.bias.assign(rng.normal(0, 0.1, c_out))
    return model


def _quantized_mean_error(model, corrected, x, bits=4, per_channel=False):
    y = model.predict(x, verbose=0)
    yq = fake_quantize_weights(corrected, bits=bits, per_channel=per_channel).predict(
        x, verbose=0)
    return np.abs((yq - y).reshape(-1, y.shape[-1]).mean(axis=0))


@pytest.mark.parametrize("per_channel", [False, True])
def test_analytic_single_conv_keeps_output_mean(per_channel):
    c_in = 8
    rng = np.random.default_rng(10)
    gamma, beta = rng.uniform(0.5, 2.0, c_in), rng.normal(0, 1, c_in)
    model = _single_conv(c_in)
    # The statistics are those of src's output, which the test feeds as N(β, γ²) exactly.
    x = rng.normal(beta, gamma, (256, 32, 32, c_in)).astype(np.float32)
    before = [w.copy() for w in model.get_weights()]
    # 'src' is an Identity, not a layout layer: hand its name to bn_stats.
    corrected, records = BC.correct_bias(model, bn_stats={"src": (gamma, beta)}, bits=4,
                                         per_channel=per_channel, return_report=True)
    err_plain = _quantized_mean_error(model, model, x, per_channel=per_channel)
    err_corr = _quantized_mean_error(model, corrected, x, per_channel=per_channel)
    assert err_corr.max() < err_plain.max() / 10
    # what is left is the sampling noise of the test inputs (measured ~8e-4 of the output std)
    assert err_corr.max() < 2e-3 * model.predict(x, verbose=0).std()
    rec = {r.layer: r for r in records}["conv"]
    assert rec.mode == "analytic" and rec.max_abs_delta > 0
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)  # input model untouched
    # exactly the formula: b' = b - Σ ε E[ReLU(N(β, γ²))]
    w = model.get_layer("conv").kernel.numpy().astype(np.float64)
    eps = quantize_kernel(w, 4, -1 if per_channel else None) - w
    want = model.get_layer("conv").bias.numpy() - np.einsum(
        "hwco,c->o", eps, BC.expected_relu_normal(beta, gamma))
    np.testing.assert_allclose(corrected.get_layer("conv").bias.numpy(), want, rtol=1e-6,
                               atol=1e-7)


def test_analytic_clipped_relu_and_added_bias():
    c_in, c_out = 6, 5
    rng = np.random.default_rng(11)
    gamma, beta = rng.uniform(0.5, 2.0, c_in), rng.normal(1, 1, c_in)
    caps = rng.uniform(0.5, 3.0, c_in)
    inp = keras.Input((None, None, c_in), name="x")
    h = cle.ClippedReLU(caps=caps, name="crelu")(L.Identity(name="src")(inp))
    h = L.AveragePooling2D(2, name="pool")(h)
    out = L.Conv2D(c_out, 1, use_bias=False, name="conv")(h)
    model = keras.Model(inp, out)
    conv = model.get_layer("conv")
    conv.kernel.assign(rng.normal(0, 1, conv.kernel.shape) * rng.uniform(0.01, 1, c_out))
    corrected, records = BC.correct_bias(model, bn_stats={"src": (gamma, beta)}, bits=4,
                                         return_report=True)
    assert not model.get_layer("conv").use_bias
    assert corrected.get_layer("conv").use_bias
    assert records[0].added_bias
    x = rng.normal(beta, gamma, (64, 8, 8, c_in)).astype(np.float32)
    err_plain = _quantized_mean_error(model, model, x)
    err_corr = _quantized_mean_error(model, corrected, x)
    assert err_corr.max() < err_plain.max() / 10


def test_analytic_skip_reasons():
    inp = keras.Input((8, 8, 3), name="x")
    a = L.Conv2D(4, 3, padding="same", name="first")(inp)  # model input: unknown stats
    b = L.Conv2D(4, 3, padding="same", name="nostats")(a)  # 'first' has no stats
    t = L.Activation("tanh", name="tanh")(b)
    c = L.Conv2D(4, 1, name="after_tanh")(t)
    d = L.Conv2D(4, 1, name="after_add")(L.ReLU(name="relu_add")(L.Add(name="add")([c, b])))
    e = L.SeparableConv2D(4, 3, name="sep")(d)
    model = keras.Model(inp, e)
    stats = {"nostats": (np.ones(4), np.zeros(4)), "after_tanh": (np.ones(4), np.zeros(4)),
             "after_add": (np.ones(4), np.zeros(4))}
    _, records = BC.correct_bias(model, bn_stats=stats, return_report=True)
    rec = {r.layer: r for r in records}
    assert "model input" in rec["first"].reason
    assert "no statistics for the output of 'first'" in rec["nostats"].reason
    assert "tanh" in rec["after_tanh"].reason
    assert "a ReLU follows 'add'" in rec["after_add"].reason
    assert "SeparableConv2D" in rec["sep"].reason
    assert all(r.mode == "skipped" for r in records)


def test_analytic_through_add_concatenate_flatten():
    """Means add through Add, concatenate through Concatenate and are repeated per position
    through Flatten (channels_last: position-major)."""
    inp = keras.Input((4, 4, 3), name="x")
    a = L.Conv2D(3, 1, name="a")(inp)
    b = L.Conv2D(3, 1, name="b")(inp)
    s = L.Add(name="add")([a, b])
    cat = L.Concatenate(name="cat")([s, L.ReLU(name="relu_b")(b)])
    c = L.Conv2D(5, 1, name="c")(cat)
    d = L.Dense(2, name="d")(L.Flatten(name="flat")(L.MaxPooling2D(2, name="pool")(cat)))
    model = keras.Model(inp, [c, d])
    rng = np.random.default_rng(6)
    ga, ba = rng.uniform(0.5, 1, 3), rng.normal(0, 1, 3)
    gb, bb = rng.uniform(0.5, 1, 3), rng.normal(0, 1, 3)
    for layer in (model.get_layer("c"), model.get_layer("d")):
        layer.kernel.assign(rng.normal(0, 1, layer.kernel.shape))
    corrected, records = BC.correct_bias(model, bn_stats={"a": (ga, ba), "b": (gb, bb)},
                                         return_report=True)
    rec = {r.layer: r for r in records}
    assert rec["c"].mode == "analytic" and rec["d"].mode == "analytic"
    assert "'pool' taken as keeping the mean" in rec["d"].note
    mean_cat = np.concatenate([ba + bb, BC.expected_relu_normal(bb, gb)])
    for name, mean in (("c", mean_cat), ("d", np.tile(mean_cat, 4))):
        w = model.get_layer(name).kernel.numpy().astype(np.float64)
        kind = "dense" if name == "d" else "conv"
        want = model.get_layer(name).bias.numpy() - BCI._bias_delta(
            kind, quantize_kernel(w, 8) - w, mean)
        np.testing.assert_allclose(corrected.get_layer(name).bias.numpy(), want, rtol=1e-6,
                                   atol=1e-7)


def test_bn_stats_from_report_divides_by_scale():
    inp = keras.Input((8, 8, 3), name="x")
    h = L.Conv2D(6, 3, padding="same", use_bias=False, name="c1")(inp)
    h = L.BatchNormalization(name="bn1")(h)
    h = L.ReLU(name="r1")(h)
    out = L.Conv2D(4, 3, padding="same", name="c2")(h)
    model = keras.Model(inp, out)
    rng = np.random.default_rng(4)
    bn = model.get_layer("bn1")
    bn.gamma.assign(rng.uniform(0.5, 2, 6))
    bn.beta.assign(rng.normal(0, 1, 6))
    model.get_layer("c1").kernel.assign(
        rng.normal(size=(3, 3, 3, 6)) * rng.uniform(0.05, 2, 6))
    eq, report = cle.equalize_model(model, objective="weights", return_report=True)
    stats = BC.bn_stats_from_report(report)
    (layer, (g, b)), = stats.items()
    assert layer.name == "c1"
    s = report.sets[0].cls_pair_info_list[0].scale_factor
    np.testing.assert_allclose(g, bn.gamma.numpy() / s, rtol=1e-6)
    np.testing.assert_allclose(b, bn.beta.numpy() / s, rtol=1e-6)
    # without CLS, bn_stats_from_folded_pairs gives the raw γ, β
    pairs, _ = cle.fold_all_batch_norms(model)
    (_, (g0, _)), = BC.bn_stats_from_folded_pairs(pairs).items()
    np.testing.assert_allclose(g0, bn.gamma.numpy())
    _, records = BC.correct_bias(eq, bn_stats=stats, return_report=True)
    rec = {r.layer: r for r in records}
    assert rec["c2"].mode == "analytic" and rec["c1"].mode == "skipped"
    # high-bias folding changed c1's bias by an unrecorded amount: no statistics for it
    bn.beta.assign(np.full(6, 5.0))
    _, report = cle.equalize_model(model, objective="weights", high_bias_fold="all", return_report=True)
    assert any(r.absorbed for r in report.bias_absorptions)
    assert BC.bn_stats_from_report(report) == {}


# ------------------------------------------------------------------------ empirical


def _three_conv_net(seed=0):
    inp = keras.Input((12, 12, 3), name="x")
    h = inp
    for i, c in enumerate((8, 8, 6)):
        h = L.Conv2D(c, 3, padding="same", use_bias=False, name=f"conv{i}")(h)
        h = L.BatchNormalization(name=f"bn{i}")(h)
        h = L.ReLU(name=f"relu{i}")(h)
    out = L.Dense(5, name="head")(L.GlobalAveragePooling2D(name="gap")(h))
    model = keras.Model(inp, out)
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, L.BatchNormalization):
            c = layer.gamma.shape[0]
            layer.gamma.assign(rng.uniform(0.5, 1.5, c))
            layer.beta.assign(rng.normal(0.5, 0.5, c))
            layer.moving_mean.assign(rng.normal(0, 0.3, c))
            layer.moving_variance.assign(rng.uniform(0.5, 2, c))
        elif isinstance(layer, L.Conv2D):
            k = layer.kernel
            layer.kernel.assign(rng.normal(0, 0.3, k.shape) * rng.uniform(0.02, 1, k.shape[-1]))
    head = model.get_layer("head")
    head.kernel.assign(rng.normal(0, 0.5, head.kernel.shape))
    return model


def _mean_errors(reference, model, x, bits):
    y = reference.predict(x, verbose=0)
    yq = fake_quantize_weights(model, bits).predict(x, verbose=0)
    return np.abs((yq - y).mean(axis=0)), np.abs(y).mean()


@pytest.mark.parametrize("bits", [4, 8])
def test_empirical_three_conv_net(bits):
    """Each layer's quantized output mean is matched to the float one with the quantized,
    already-corrected layers upstream: on the calibration data the final (linear) output mean
    is then exact; on other data of the same distribution the error drops by a lot."""
    model = _three_conv_net()
    _, folded = cle.fold_all_batch_norms(model)
    rng = np.random.default_rng(5)
    x = rng.normal(0, 1, (64, 12, 12, 3)).astype(np.float32)
    held_out = rng.normal(0, 1, (256, 12, 12, 3)).astype(np.float32)
    before = [w.copy() for w in folded.get_weights()]
    messages = []
    corrected, records = BC.correct_bias(folded, calibration_data=x, bits=bits,
                                         progress=messages.append, return_report=True)
    assert [r.mode for r in records] == ["empirical"] * 4
    assert all(r.max_abs_delta > 0 for r in records)
    assert len(messages) == 4 and "conv0" in messages[0]
    for a, b in zip(before, folded.get_weights()):
        np.testing.assert_array_equal(a, b)  # input model untouched
    err_plain, scale = _mean_errors(folded, folded, x, bits)
    err_corr, _ = _mean_errors(folded, corrected, x, bits)
    assert err_corr.max() < 1e-5 * scale < err_plain.max() / 1000
    err_plain, _ = _mean_errors(folded, folded, held_out, bits)
    err_corr, _ = _mean_errors(folded, corrected, held_out, bits)
    print(f"held-out mean error {bits} bits: {err_plain.max():.3g} -> {err_corr.max():.3g}")
    assert err_corr.max() < err_plain.max() / 3
    # a list of (x, y) batches gives the same correction
    batches = [(x[i:i + 16], None) for i in range(0, 64, 16)]
    again = BC.correct_bias(folded, calibration_data=batches, bits=bits)
    for a, b in zip(corrected.get_weights(), again.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    if bits == 8:  # and so does a tf.data.Dataset
        import tensorflow as tf
        ds = BC.correct_bias(folded, calibration_data=tf.data.Dataset.from_tensor_slices(x)
                             .batch(16), bits=bits)
        for a, b in zip(corrected.get_weights(), ds.get_weights()):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_empirical_sequential_depthwise():
    rng = np.random.default_rng(7)
    model = keras.Sequential([
        keras.Input((10, 10, 4), name="x"),
        L.Conv2D(6, 3, padding="same", activation="relu", name="c"),
        L.DepthwiseConv2D(3, depth_multiplier=2, padding="same", use_bias=False, name="dw"),
        L.ReLU(name="r"),
        L.GlobalAveragePooling2D(name="gap"),
        L.Dense(3, name="head"),
    ])
    for layer in model.layers:
        if hasattr(layer, "kernel"):
            k = layer.kernel.shape
            layer.kernel.assign(rng.normal(0, 0.5, k) * rng.uniform(0.02, 1, k[-1]))
    x = rng.normal(0.3, 1, (32, 10, 10, 4)).astype(np.float32)
    corrected, records = BC.correct_bias(model, calibration_data=x, bits=5,
                                         return_report=True)
    assert isinstance(corrected, keras.Sequential)
    assert [r.mode for r in records] == ["empirical"] * 3
    assert records[1].added_bias and not model.get_layer("dw").use_bias
    err_plain, scale = _mean_errors(model, model, x, 5)
    err_corr, _ = _mean_errors(model, corrected, x, 5)
    assert err_corr.max() < 1e-5 * scale < err_plain.max() / 100


def _assert_same_as_reference(model, corrected, x, bits=8, per_channel=False):
    """Per layer, the correction of the one-pass implementation equals the one of the old
    layer-by-layer implementation (tests/bias_correction_reference.py) to 1e-5 of the layer's
    largest correction plus 1e-6 of the layer's mean |output| (both measure a difference of
    float32 means: on the real MobileNetV2 they differ by up to ~1.3e-7 where the correction
    is 4.5e-4) plus one float32 step of the stored bias (the new bias is rounded to float32
    once, the reference delta is float64)."""
    want = reference.empirical_deltas(model, x, bits=bits, per_channel=per_channel)
    assert want
    for name, (delta, scale) in want.items():
        before = model.get_layer(name)
        b0 = (before.bias.numpy().astype(np.float64) if before.use_bias
              else np.zeros(delta.shape))
        b1 = corrected.get_layer(name).bias.numpy()
        got = b0 - b1.astype(np.float64)
        tol = 1e-5 * np.abs(delta).max() + 1e-6 * scale + np.spacing(np.abs(b1))
        assert np.all(np.abs(got - delta) <= tol), (
            name, np.abs(got - delta).max(), np.abs(delta).max())


@pytest.mark.parametrize("per_channel", [False, True])
def test_empirical_matches_layer_by_layer_reference(per_channel):
    model = _three_conv_net(seed=3)
    _, folded = cle.fold_all_batch_norms(model)
    x = np.random.default_rng(8).normal(0, 1, (40, 12, 12, 3)).astype(np.float32)
    corrected = BC.correct_bias(folded, calibration_data=x, bits=4, per_channel=per_channel)
    _assert_same_as_reference(folded, corrected, x, bits=4, per_channel=per_channel)


def _branchy_net(seed=0):
    """Fused non-linear activations (kernel-only measurement), a residual Add and a
    Concatenate (several tensors alive at once), a layer without bias, and an output that is
    not on the way to the last corrected layer."""
    inp = keras.Input((10, 10, 4), name="x")
    a = L.Conv2D(8, 3, padding="same", activation="relu", name="a")(inp)
    b = L.DepthwiseConv2D(3, padding="same", use_bias=False, name="b")(a)
    c = L.Conv2D(8, 1, activation="relu6", name="c")(L.ReLU(name="rb")(b))
    s = L.Add(name="add")([a, c])
    side = L.Conv2D(3, 1, name="side")(s)
    cat = L.Concatenate(name="cat")([s, L.MaxPooling2D(1, name="pool")(a)])
    d = L.Conv2D(6, 3, padding="same", name="d")(cat)
    out = L.Dense(3, name="head")(L.GlobalAveragePooling2D(name="gap")(d))
    model = keras.Model(inp, [out, L.Identity(name="side_out")(side)])
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if getattr(layer, "kernel", None) is not None:
            k = layer.kernel.shape
            layer.kernel.assign(rng.normal(0, 0.5, k) * rng.uniform(0.02, 1, k[-1]))
    return model


def test_empirical_branches_match_reference_and_leave_input_untouched():
    model = _branchy_net()
    before = [w.copy() for w in model.get_weights()]
    n_nodes = {layer.name: len(layer._inbound_nodes) for layer in model.layers}
    x = np.random.default_rng(9).normal(0.2, 1, (48, 10, 10, 4)).astype(np.float32)
    messages = []
    corrected, records = BC.correct_bias(model, calibration_data=x, bits=4,
                                         progress=messages.append, return_report=True)
    assert sorted(r.layer for r in records) == ["a", "b", "c", "d", "head", "side"]
    assert all(r.mode == "empirical" for r in records)
    assert [m.split("]")[0] for m in messages] == [f"[{i}/6" for i in range(1, 7)]
    _assert_same_as_reference(model, corrected, x, bits=4)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    # neither the input model nor the result got nodes from the traced passes
    assert {la.name: len(la._inbound_nodes) for la in model.layers} == n_nodes
    assert all(len(la._inbound_nodes) == n_nodes[la.name] for la in corrected.layers)
    # the pass on its own: the same corrections, one per planned call, in order
    view = graph_view(model)
    plan = [c for c in view.calls if layout_of(c.layer) is not None]
    deltas = {}
    data = check_calibration_data(model, x)
    for call, d in bias_pass.empirical_pass(view, plan, data, 4, False, lambda m: None):
        deltas[call.layer.name] = d
    assert list(deltas) == [c.layer.name for c in plan]
    for r in records:
        assert np.abs(deltas[r.layer]).max() == pytest.approx(r.max_abs_delta, rel=1e-6)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------- compiled steps of the pass (cle._transforms.bias_steps)


def _chain(n_blocks, seed=0):
    """``n_blocks`` blocks Conv2D(6, 3, 'same') → ReLU, with a depthwise block without bias
    and a fused ReLU6 in the middle (another kind of segment) and an unfolded
    BatchNormalization (weights, not corrected) after it, then GlobalAveragePooling → Dense."""
    rng = np.random.default_rng(seed)
    inp = keras.Input((8, 8, 6), name="x")
    h = inp
    for i in range(n_blocks):
        h = L.ReLU(name=f"relu{i}")(L.Conv2D(6, 3, padding="same", name=f"conv{i}")(h))
        if i == n_blocks // 2:
            h = L.DepthwiseConv2D(3, padding="same", use_bias=False, activation="relu6",
                                  name="dw")(h)
            h = L.BatchNormalization(name="bn")(h)
    model = keras.Model(inp, L.Dense(3, name="head")(L.GlobalAveragePooling2D(name="gap")(h)))
    for layer in model.layers:
        for w in layer.weights:
            if "moving_variance" in w.path or "gamma" in w.path:
                w.assign(rng.uniform(0.5, 1.5, w.shape))
            elif len(w.shape) > 1:  # He-like scale, uneven channel ranges
                fan_in = int(np.prod(w.shape[:-1])) if "depthwise" not in w.path else 9
                w.assign(rng.normal(0, np.sqrt(2 / fan_in), w.shape)
                         * rng.uniform(0.1, 1, w.shape[-1]))
            else:
                w.assign(rng.normal(0, 0.1, w.shape))
    x = rng.normal(0, 1, (24, 8, 8, 6)).astype(np.float32)
    return model, x


def _needs_compiler():
    if bias_steps.compiler() is None:
        pytest.skip(f"no compiler on {keras.backend.backend()}: the pass is eager there")


def _pass_deltas(model, x, bits=8, per_channel=False, min_uses=None):
    view = graph_view(model)
    plan = [c for c in view.calls
            if layout_of(c.layer) is not None
            and not BCI._target_reason(view, c, lambda la: read_weight(la.kernel))]
    data = check_calibration_data(model, x)
    return {c.layer.name: d for c, d in bias_pass.empirical_pass(view, plan, data, bits,
                                                                 per_channel, lambda m: None,
                                                                 min_uses)}


@pytest.fixture
def compiled_units(monkeypatch):
    """The units of every compiled step the pass runs, as lists of layer names."""
    seen = []
    get = bias_steps.Steps.get

    def spy(self, call, x):
        out = get(self, call, x)
        if out is not None:
            seen.append([c.layer.name for c in out[1]])
        return out

    monkeypatch.setattr(bias_steps.Steps, "get", spy)
    return seen


@pytest.mark.parametrize("min_uses", [1, 2])
@pytest.mark.parametrize("per_channel", [False, True])
def test_compiled_pass_matches_layer_by_layer_reference(monkeypatch, compiled_units,
                                                        min_uses, per_channel):
    """With every kind compiled (1) or runs of blocks compiled as units (2), the corrections
    are those of the layer-by-layer reference, and the input model is untouched."""
    _needs_compiler()
    monkeypatch.setattr(bias_steps, "MIN_USES", min_uses)
    model, x = _chain(12)
    before = [w.copy() for w in model.get_weights()]
    corrected, records = BC.correct_bias(model, calibration_data=x, bits=4,
                                         per_channel=per_channel, return_report=True)
    assert [r.layer for r in records if r.corrected] == (
        [f"conv{i}" for i in range(7)] + ["dw"] + [f"conv{i}" for i in range(7, 12)] + ["head"])
    _assert_same_as_reference(model, corrected, x, bits=4, per_channel=per_channel)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    if min_uses == 1:  # every kind: runs of blocks of one kind, dw, bn and head alone
        assert compiled_units == [
            [n for i in range(7) for n in (f"conv{i}", f"relu{i}")], ["dw"], ["bn"],
            [n for i in range(7, 11) for n in (f"conv{i}", f"relu{i}")],
            ["conv11", "relu11", "gap"], ["head"]]
    else:  # the two runs are different kinds: the blocks one by one
        assert compiled_units == [[f"conv{i}", f"relu{i}"] for i in range(11)]


def test_deep_chain_compiles_by_default_and_matches_the_eager_pass(compiled_units):
    """Past MIN_USES blocks of one kind, the pass compiles them (units of UNIT blocks); its
    corrections equal the eager pass's to float32 round-off."""
    _needs_compiler()
    n = bias_steps.MIN_USES + 2
    model, x = _chain(n)
    compiled = _pass_deltas(model, x)
    assert compiled_units, "nothing was compiled"
    assert sum(len(u) for u in compiled_units) >= 2 * bias_steps.MIN_USES
    compiled_units.clear()
    eager = _pass_deltas(model, x, min_uses=10**9)
    assert not compiled_units
    assert list(compiled) == list(eager)
    for name, d in eager.items():
        np.testing.assert_allclose(compiled[name], d, rtol=1e-4, atol=1e-5 * np.abs(d).max(),
                                   err_msg=name)


def test_units_are_runs_of_up_to_UNIT_segments_else_segments_else_calls():
    _needs_compiler()
    model, _ = _chain(2 * bias_steps.UNIT + 6)
    view = graph_view(model)
    plan = [c for c in view.calls if layout_of(c.layer) is not None]
    calls = view.calls
    uses = {}
    for call in calls:
        for t in call.inputs:
            uses[id(t)] = uses.get(id(t), 0) + 1
    steps = bias_steps.Steps(calls, {id(c) for c in plan}, uses, min_uses=2)
    units = [[[c.layer.name for c in seg] for seg in unit] for _, unit in steps._units.values()]
    # conv0..relu11 (12 blocks, dw after block 11): one unit of UNIT blocks, then 4 blocks
    # (their unit kind occurs once: blocks one by one); after bn, conv12..relu20 (9 blocks,
    # conv21 → relu21 → gap is another kind): one unit of UNIT blocks, then 1 block; dw, bn,
    # the last block and head occur once: eager.
    sizes = sorted(len(u) for u in units)
    assert sizes == [1] * 5 + [bias_steps.UNIT] * 2, units
    assert all(seg[0].startswith("conv") and seg[1].startswith("relu") and len(seg) == 2
               for u in units for seg in u)


def test_a_failing_compiled_step_falls_back_to_the_eager_pass(monkeypatch, caplog):
    _needs_compiler()

    def broken_compiler():
        def compile_fn(fn):
            def call(*args):
                raise RuntimeError("injected tracing failure")
            return call
        return compile_fn

    model, x = _chain(6)
    eager = _pass_deltas(model, x, min_uses=10**9)
    monkeypatch.setattr(bias_steps, "compiler", broken_compiler)
    with caplog.at_level("WARNING", logger="cle.bias_correction"):
        fallback = _pass_deltas(model, x, min_uses=1)
    assert "injected tracing failure" in caplog.text
    assert list(fallback) == list(eager)
    for name, d in eager.items():
        np.testing.assert_array_equal(fallback[name], d, err_msg=name)
    # each layer is announced once, although its compiled unit was announced before failing
    monkeypatch.setattr(bias_steps, "MIN_USES", 1)
    messages = []
    BC.correct_bias(model, calibration_data=x, progress=messages.append)
    n = len(eager)
    assert sorted(m.split("]")[0] for m in messages) == sorted(
        f"[{i}/{n}" for i in range(1, n + 1))


def test_same_kind_at_different_sizes_gets_one_step_per_size(monkeypatch, compiled_units):
    """'valid' convolutions of one config on an input of open size: one kind, a smaller
    activation at each call. Each size gets its own compiled step (a TensorFlow concrete
    function takes one shape), and the corrections are the reference's."""
    _needs_compiler()
    monkeypatch.setattr(bias_steps, "MIN_USES", 2)
    rng = np.random.default_rng(4)
    inp = keras.Input((None, None, 4), name="x")
    h = inp
    for i in range(bias_steps.UNIT + 2):
        h = L.ReLU(name=f"relu{i}")(L.Conv2D(4, 3, name=f"conv{i}")(h))
    model = keras.Model(inp, h)
    for layer in model.layers:
        if isinstance(layer, L.Conv2D):
            layer.kernel.assign(rng.normal(0, 0.4, layer.kernel.shape)
                                * rng.uniform(0.1, 1, 4))
            layer.bias.assign(rng.normal(0, 0.1, 4))
    x = rng.normal(0, 1, (16, 2 * bias_steps.UNIT + 8, 2 * bias_steps.UNIT + 8, 4)).astype(
        np.float32)
    corrected = BC.correct_bias(model, calibration_data=x, bits=4)
    # the unit of UNIT blocks and the one of 2 are different kinds (each once): block by
    # block; the last conv has no ReLU to run (nothing after it is corrected): eager
    assert compiled_units == [[f"conv{i}", f"relu{i}"] for i in range(bias_steps.UNIT + 1)]
    _assert_same_as_reference(model, corrected, x, bits=4)


def test_only_layers_whose_call_reads_their_weights_are_compiled():
    from cle._transforms.bias_steps import _weights_are_read_when_called as reads

    norm = L.Normalization()
    norm.adapt(np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32))
    lora = L.Dense(4)
    lora.build((None, 3))
    lora.enable_lora(2)
    assert not reads(norm) and not reads(lora)
    conv = L.Conv2D(2, 1)
    conv.build((None, 4, 4, 3))
    bn = L.BatchNormalization()
    bn.build((None, 3))
    assert reads(conv) and reads(bn) and reads(L.ReLU()) and reads(cle.ClippedReLU())


def test_gc_paused_restores_the_collector_and_leaves_freezes_alone():
    import gc

    from cle._core.rebuild import gc_paused

    assert gc.isenabled()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with gc_paused():
            assert not gc.isenabled()
            assert gc.get_freeze_count() == frozen
        assert gc.isenabled() and gc.get_freeze_count() == frozen  # nothing unfrozen
    finally:
        gc.unfreeze()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # a caller's choice to collect by hand is kept
    finally:
        gc.enable()


def test_empirical_nested_sub_model():
    """Layers inside a nested sub-model are reached by the walk (the old sub-model per layer
    could not read their input and skipped them)."""
    inner_in = keras.Input((8, 8, 6), name="inner_x")
    h = L.Conv2D(6, 3, padding="same", name="inner_conv")(inner_in)
    inner = keras.Model(inner_in, L.ReLU(name="inner_relu")(h), name="inner")
    inp = keras.Input((8, 8, 3), name="x")
    h = L.Conv2D(6, 1, activation="relu", name="outer_conv")(inp)
    out = L.Conv2D(2, 1, name="last")(inner(h))
    model = keras.Model(inp, out)
    rng = np.random.default_rng(12)
    for layer in (model.get_layer("outer_conv"), inner.get_layer("inner_conv"),
                  model.get_layer("last")):
        k = layer.kernel.shape
        layer.kernel.assign(rng.normal(0, 0.5, k) * rng.uniform(0.02, 1, k[-1]))
    x = rng.normal(0, 1, (32, 8, 8, 3)).astype(np.float32)
    corrected, records = BC.correct_bias(model, calibration_data=x, bits=4,
                                         return_report=True)
    assert [(r.layer, r.mode) for r in records] == [
        ("outer_conv", "empirical"), ("inner_conv", "empirical"), ("last", "empirical")]
    y = model.predict(x, verbose=0).reshape(-1, 2)
    errors = [np.abs((fake_quantize_weights(m, 4).predict(x, verbose=0).reshape(-1, 2) - y)
                     .mean(axis=0)).max() for m in (model, corrected)]
    assert errors[1] < 1e-5 * np.abs(y).mean() < errors[0] / 100


def test_empirical_takes_several_inputs():
    a, b = keras.Input((4,), name="a"), keras.Input((4,), name="b")
    model = keras.Model([a, b], L.Dense(2, name="d")(L.Add(name="add")([a, b])))
    with pytest.raises(ValueError, match=r"2 inputs, a dict .* \(inputs \['a', 'b'\]\)"):
        BC.correct_bias(model, calibration_data=np.zeros((4, 4), "float32"))
    rng = np.random.default_rng(0)
    x = tuple(rng.normal(1.0, 1.0, (64, 4)).astype("float32") for _ in range(2))
    corrected, records = BC.correct_bias(model, calibration_data=x, bits=4, return_report=True)
    assert [(r.layer, r.mode) for r in records] == [("d", "empirical")]
    y = model.predict(x, verbose=0)
    errors = [np.abs((fake_quantize_weights(m, 4).predict(x, verbose=0) - y).mean(axis=0)).max()
              for m in (model, corrected)]
    assert errors[1] < 1e-5 * np.abs(y).mean() < errors[0] / 100


def test_analytic_three_conv_net_via_folded_pairs():
    model = _three_conv_net()
    pairs, folded = cle.fold_all_batch_norms(model)
    _, records = BC.correct_bias(folded, bn_stats=BC.bn_stats_from_folded_pairs(pairs),
                                 bits=4, return_report=True)
    modes = {r.layer: r.mode for r in records}
    assert modes == {"conv0": "skipped", "conv1": "analytic", "conv2": "analytic",
                     "head": "analytic"}


def test_argument_errors():
    model = _single_conv()
    with pytest.raises(ValueError, match="exactly one"):
        BC.correct_bias(model)
    with pytest.raises(ValueError, match="exactly one"):
        BC.correct_bias(model, bn_stats={}, calibration_data=np.zeros((1, 5, 5, 8)))
    with pytest.raises(ValueError):
        BC.correct_bias(model, bn_stats={"src": (np.ones(3), np.ones(4))})
    with pytest.raises(ValueError):
        BC.correct_bias(model, bn_stats={}, bits=1)
    with pytest.raises(TypeError):
        BC.correct_bias("model", bn_stats={})


# ------------------------------------------------------------- real MobileNetV2 (slow)


@pytest.mark.slow
def test_mobilenet_v2_bias_correction(capsys):
    from cle import pretrained as P
    from cle.quantization import sqnr_db, top1_agreement

    model = real_mobilenet_v2()
    x = P.preprocess_imagenet(P.sample_images(64, seed=0))
    calib = P.preprocess_imagenet(P.sample_images(32, seed=1))
    y_ref = model.predict(x, batch_size=32, verbose=0)
    eq, report = cle.equalize_model(model, objective="weights", return_report=True)
    analytic, rec_a = BC.correct_bias(eq, bn_stats=BC.bn_stats_from_report(report),
                                      return_report=True)
    empirical, rec_e = BC.correct_bias(eq, calibration_data=calib, return_report=True)
    pairs, folded = cle.fold_all_batch_norms(model)
    folded_bc = BC.correct_bias(folded, bn_stats=BC.bn_stats_from_folded_pairs(pairs))
    rows = []
    for name, m in (("folded (no CLS)", folded), ("folded + BC analytic", folded_bc),
                    ("CLS", eq), ("CLS + BC analytic", analytic),
                    ("CLS + BC empirical", empirical)):
        y = fake_quantize_weights(m, bits=8, per_channel=False).predict(x, batch_size=32,
                                                                       verbose=0)
        rows.append((name, top1_agreement(y_ref, y), sqnr_db(y_ref, y)))
    # The table goes to the captured output (shown on failure, or with -rP), not between
    # pytest -q's dots.
    n_a = sum(r.mode == "analytic" for r in rec_a)
    n_e = sum(r.mode == "empirical" for r in rec_e)
    print(f"\nMobileNetV2 weight-only INT8 per-tensor vs float ({len(x)} images); "
          f"analytic corrected {n_a}/{len(rec_a)}, empirical {n_e}/{len(rec_e)}")
    for name, top1, sq in rows:
        print(f"  {name:22s} top-1 {top1:6.1%}  SQNR {sq:5.1f} dB")
    for r in rec_a:
        if not r.corrected:
            print(f"  analytic skip {r}")
    assert n_a > len(rec_a) // 2 and n_e == len(rec_e)
    sq = {name: s for name, _, s in rows}
    # Per-tensor INT8 weights: equalization helps, and bias correction helps on top of either
    # model, each by at least 1 dB (a gain worth having; a correction with the wrong sign or
    # the wrong E[x] makes the SQNR fall instead).
    assert sq["CLS"] > sq["folded (no CLS)"] + 1.0, rows
    assert sq["folded + BC analytic"] > sq["folded (no CLS)"] + 1.0, rows
    assert sq["CLS + BC analytic"] > sq["CLS"] + 1.0, rows
    assert sq["CLS + BC empirical"] > sq["CLS"] + 1.0, rows


@pytest.mark.slow
def test_mobilenet_v2_empirical_matches_layer_by_layer_reference():
    """The one-pass eager walk gives the corrections of the old sub-model-per-layer
    implementation on the real network (every layer corrected)."""
    from cle import pretrained as P

    eq = cle.equalize_model(real_mobilenet_v2())
    calib = P.preprocess_imagenet(P.sample_images(8, seed=1))
    corrected, records = BC.correct_bias(eq, calibration_data=calib, return_report=True)
    assert all(r.mode == "empirical" for r in records) and len(records) > 50
    _assert_same_as_reference(eq, corrected, calib)


# ------------------------------------------------------- failures are skips only when expected


def _nested_model():
    si = keras.Input((6, 6, 4), name="sub_in")
    sub = keras.Model(si, L.Conv2D(4, 1, name="inner")(L.ReLU(name="inner_relu")(si)), name="sub")
    inp = keras.Input((6, 6, 3), name="x")
    x = L.Conv2D(4, 1, name="outer")(inp)
    return keras.Model(inp, L.Conv2D(2, 1, name="last")(sub(x)))


def test_unexpected_error_while_measuring_reaches_the_user(monkeypatch):
    # (Layers inside a nested sub-model are corrected: test_empirical_nested_sub_model.)
    def broken(*args, **kwargs):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(bias_steps, "_template", broken)
    model = _nested_model()
    x = np.random.default_rng(0).normal(size=(8, 6, 6, 3)).astype(np.float32)
    with pytest.raises(RuntimeError, match="injected failure"):
        BC.correct_bias(model, calibration_data=x, bits=4)


def _crelu_model(c_in=6):
    inp = keras.Input((4, 4, c_in), name="x")
    h = cle.ClippedReLU(caps=np.linspace(1.0, 3.0, c_in), name="crelu")(L.Identity(name="src")(inp))
    return keras.Model(inp, L.Conv2D(3, 1, name="conv")(h))


def test_analytic_caps_that_do_not_match_the_statistics_are_a_skip():
    _, (rec,) = BC.correct_bias(_crelu_model(6), bn_stats={"src": (np.ones(5), np.zeros(5))},
                                return_report=True)
    assert rec.mode == "skipped"
    assert rec.reason == "the caps on the path do not match the statistics' channel count"


def test_unexpected_value_error_in_the_analytic_mean_reaches_the_user(monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("injected failure")

    from cle._transforms import bias_stats  # where the analytic mean looks it up

    monkeypatch.setattr(bias_stats, "expected_clipped_normal", broken)
    with pytest.raises(ValueError, match="injected failure"):
        BC.correct_bias(_crelu_model(6), bn_stats={"src": (np.ones(6), np.zeros(6))})
