"""Tests for cle.quantization: kernel fake quantization, weight-only models, TF Lite INT8
conversion and inference, metrics, and (slow) the real MobileNetV2 before/after equalization."""

from __future__ import annotations

import time

import keras
import numpy as np
import pytest
from keras import layers as L

import cle
from cle import quantization as Q
from cle._measure import inference as _inference
from cle._tflite import runtime
from cle._tflite.flatgraph import FlatGraph
from cle.layers import ClippedReLU

from conftest import (
    BACKEND,
    NO_TFLITE_ON_TORCH_REASON,
    RTOL,
    input_names,
    no_tflite_on_torch,
    output_names,
    real_mobilenet_v2,
    weights_snapshot,
)


def _np(x):
    return keras.ops.convert_to_numpy(x)


def _uneven_kernel(shape, seed=0, axis=-1, low=1e-3, high=1.0):
    """Random kernel whose channels along ``axis`` have log-uniform ranges in [low, high]."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0.0, 1.0, shape)
    n = shape[axis]
    ranges = np.exp(rng.uniform(np.log(low), np.log(high), n))
    bshape = [1] * len(shape)
    bshape[axis] = n
    moved = np.moveaxis(np.abs(w), axis, -1).reshape(-1, n).max(axis=0)
    return w / moved.reshape(bshape) * ranges.reshape(bshape)


# ------------------------------------------------------------------------- quantize_kernel


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("axis", [None, -1, 0])
def test_error_at_most_half_a_step(bits, axis):
    w = _uneven_kernel((3, 3, 5, 7), seed=bits, axis=-1)
    q = Q.quantize_kernel(w, bits=bits, axis=axis)
    assert q.shape == w.shape and q.dtype == np.float64
    qmax = 2 ** (bits - 1) - 1
    if axis is None:
        scale = np.abs(w).max() / qmax
    else:
        other = tuple(i for i in range(w.ndim) if i != axis % w.ndim)
        scale = np.abs(w).max(axis=other, keepdims=True) / qmax
    assert (np.abs(q - w) <= scale / 2 * (1 + 1e-9)).all()
    # The largest value of each group lands exactly on the top of the grid.
    steps = q / scale
    np.testing.assert_allclose(np.abs(steps).max(axis=None if axis is None else other), qmax)


def test_per_channel_error_below_per_tensor():
    w = _uneven_kernel((3, 3, 16, 32), seed=1)
    pt = Q.quantize_kernel(w, axis=None)
    pc = Q.quantize_kernel(w, axis=-1)
    # Every channel's worst error is bounded by its own (smaller) half step ...
    tensor_step = np.abs(w).max() / 127
    per_ch_err = np.abs(pc - w).reshape(-1, 32).max(axis=0)
    assert (per_ch_err <= tensor_step / 2).all()
    # ... and overall the error is far smaller (channel ranges span 3 decades here).
    mse_pt, mse_pc = np.mean((pt - w) ** 2), np.mean((pc - w) ** 2)
    assert mse_pc < mse_pt / 4, (mse_pc, mse_pt)


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_symmetric_grid(bits):
    rng = np.random.default_rng(bits)
    w = rng.normal(0.0, 1.0, (5, 6, 7))
    qmax = 2 ** (bits - 1) - 1
    for axis in (None, 1):
        q = Q.quantize_kernel(w, bits=bits, axis=axis)
        r = np.abs(w).max() if axis is None else np.abs(w).max(axis=(0, 2), keepdims=True)
        steps = q / (r / qmax)
        np.testing.assert_allclose(steps, np.round(steps), atol=1e-9)  # on the grid
        assert np.round(steps).min() >= -qmax and np.round(steps).max() <= qmax  # no -2^(b-1)
        np.testing.assert_array_equal(Q.quantize_kernel(-w, bits=bits, axis=axis), -q)
    # Per tensor, the whole kernel uses at most 2^bits - 1 levels.
    assert len(np.unique(Q.quantize_kernel(w, bits=bits))) <= 2 * qmax + 1


def test_four_bits():
    w = np.array([[0.7, -0.1], [0.33, 0.04], [-0.26, 0.0]])
    q = Q.quantize_kernel(w, bits=4)  # 7 steps of 0.1
    np.testing.assert_allclose(q, [[0.7, -0.1], [0.3, 0.0], [-0.3, 0.0]], atol=1e-12)
    q = Q.quantize_kernel(w, bits=4, axis=1)  # steps 0.1 and 0.1 / 7
    np.testing.assert_allclose(q[:, 0], [0.7, 0.3, -0.3], atol=1e-12)
    np.testing.assert_allclose(q[:, 1], [-0.1, 0.3 / 7, 0.0], atol=1e-12)  # 2.8 steps -> 3
    assert len(np.unique(Q.quantize_kernel(np.linspace(-1, 1, 101), bits=4))) == 15


def test_zero_channel_stays_zero():
    w = _uneven_kernel((3, 3, 4, 6), seed=2)
    w[..., 2] = 0.0
    q = Q.quantize_kernel(w, axis=-1)
    assert np.isfinite(q).all()
    np.testing.assert_array_equal(q[..., 2], 0.0)
    np.testing.assert_array_equal(Q.quantize_kernel(np.zeros((2, 3)), axis=None), 0.0)
    np.testing.assert_array_equal(Q.quantize_kernel(np.zeros((2, 3)), axis=0), 0.0)
    # Depthwise: one (c, m) output channel all zero.
    d = np.random.default_rng(3).normal(size=(3, 3, 4, 2))
    d[:, :, 1, 0] = 0.0
    qd = Q.quantize_kernel(d, axis=-1, depthwise=True)
    np.testing.assert_array_equal(qd[:, :, 1, 0], 0.0)
    assert np.isfinite(qd).all()


def test_depthwise_per_output_channel_grouping():
    # Output channel c*mult + m of a (*k, in, mult) kernel gets its own scale.
    k, cin, mult = (3, 3), 4, 3
    rng = np.random.default_rng(4)
    w = rng.normal(size=k + (cin, mult))
    ranges = 10.0 ** rng.uniform(-3, 0, (cin, mult))
    w = w / np.abs(w).max(axis=(0, 1)) * ranges
    q = Q.quantize_kernel(w, bits=8, axis=-1, depthwise=True)
    # Same as quantizing the flattened (taps, in*mult) kernel per column.
    flat = Q.quantize_kernel(w.reshape(-1, cin * mult), bits=8, axis=-1)
    np.testing.assert_array_equal(q, flat.reshape(w.shape))
    # Each (c, m) is within half of its own step, and its peak is exactly on +-127 steps.
    step = ranges / 127
    assert (np.abs(q - w) <= step / 2 * (1 + 1e-9)).all()
    np.testing.assert_allclose(np.abs(q).max(axis=(0, 1)), ranges, rtol=1e-12)
    # Grouping by input channel only (axis -2) or by multiplier only (plain axis -1) differs.
    assert not np.allclose(q, Q.quantize_kernel(w, axis=-1))
    assert not np.allclose(q, Q.quantize_kernel(w, axis=-2))
    # Per tensor, depthwise=True changes nothing.
    np.testing.assert_array_equal(Q.quantize_kernel(w, depthwise=True), Q.quantize_kernel(w))


def test_quantize_kernel_leaves_input_alone():
    w = np.random.default_rng(5).normal(size=(4, 4)).astype("float32")
    before = w.copy()
    Q.quantize_kernel(w, axis=0)
    np.testing.assert_array_equal(w, before)


@pytest.mark.parametrize("kwargs", [
    {"bits": 1}, {"bits": 33}, {"bits": True}, {"bits": 8.0}, {"axis": 4}, {"axis": -5},
    {"axis": 1.0}, {"axis": -2, "depthwise": True}, {"depthwise": "yes"},
])
def test_quantize_kernel_bad_args(kwargs):
    with pytest.raises(ValueError, match="Received: "):
        Q.quantize_kernel(np.ones((3, 3, 2, 2)), **kwargs)


def test_quantize_kernel_rejects_non_finite():
    with pytest.raises(ValueError, match="Received: "):
        Q.quantize_kernel(np.array([1.0, np.nan]))


# ------------------------------------------------------------------ fake_quantize_weights


def _zoo_model():
    """Every kernel kind, uneven channel ranges, a BN, a nested sub-model and a shared layer."""
    keras.utils.set_random_seed(11)
    inner_in = keras.Input((8, 8, 6))
    inner = keras.Model(inner_in, L.Conv2D(6, 1, name="inner_conv")(inner_in), name="inner")
    inp = keras.Input((8, 8, 3), name="image")
    h = L.Conv2D(6, 3, padding="same", name="conv")(inp)
    h = L.BatchNormalization(name="bn")(h)
    h = L.ReLU(name="relu")(h)
    h = L.DepthwiseConv2D(3, padding="same", depth_multiplier=2, name="dw")(h)  # 12 channels
    h = L.SeparableConv2D(6, 3, padding="same", name="sep")(h)
    h = inner(h)
    h = L.Conv2DTranspose(5, 3, padding="same", name="tconv")(h)
    h = L.GlobalAveragePooling2D(name="gap")(h)
    shared = L.Dense(5, name="shared_dense")
    h = shared(shared(h))
    out = L.Dense(4, name="logits")(h)
    model = keras.Model(inp, out, name="zoo")
    rng = np.random.default_rng(12)
    for layer in model._flatten_layers():
        for var in layer.weights:
            shape = tuple(var.shape)
            attr = var.path.split("/")[-1]
            if "kernel" in attr:
                # Output-channel ranges spread 30x; overall gain ~1 so that the output depends
                # on the input through all seven kernels.
                transpose = isinstance(layer, L.Conv2DTranspose)
                w = _uneven_kernel(shape, seed=int(rng.integers(1 << 30)), low=1 / 30, high=1,
                                   axis=-2 if transpose else -1)
                depthwise = isinstance(layer, L.DepthwiseConv2D) or attr == "depthwise_kernel"
                fan_in = w.size / (shape[-2] * shape[-1] if depthwise else shape[-2 if transpose
                                                                                 else -1])
                var.assign(w * 1.5 / (np.sqrt(fan_in) * np.sqrt(np.mean(w**2))))
            elif attr in ("moving_variance", "gamma"):
                var.assign(rng.uniform(0.5, 2.0, shape))
            else:
                var.assign(rng.normal(0.0, 0.05, shape))
    return model


_EXPECTED_KERNELS = {  # layer: [(attr, per-channel axis, depthwise)]
    "conv": [("kernel", -1, False)],
    "dw": [("kernel", -1, True)],
    "sep": [("depthwise_kernel", -1, True), ("pointwise_kernel", -1, False)],
    "inner_conv": [("kernel", -1, False)],
    "tconv": [("kernel", -2, False)],
    "shared_dense": [("kernel", -1, False)],
    "logits": [("kernel", -1, False)],
}


def _layers_by_name(model):
    return {layer.name: layer for layer in model._flatten_layers()}


@pytest.mark.parametrize("per_channel", [False, True])
def test_fake_quantize_weights_changes_only_kernels(per_channel):
    model = _zoo_model()
    snapshot = weights_snapshot(model)
    names = [layer.name for layer in model._flatten_layers()]
    new = Q.fake_quantize_weights(model, bits=8, per_channel=per_channel)
    # The input model is untouched.
    assert [layer.name for layer in model._flatten_layers()] == names
    for a, b in zip(snapshot, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    # Names kept, new layer objects.
    assert [layer.name for layer in new._flatten_layers()] == names
    assert input_names(new) == input_names(model) == ["image"]
    assert output_names(new) == output_names(model)
    old_layers, new_layers = _layers_by_name(model), _layers_by_name(new)
    assert not {id(x) for x in old_layers.values()} & {id(x) for x in new_layers.values()}
    # Shared layer stays shared (called twice in the new graph too).
    assert len(new.get_layer("shared_dense")._inbound_nodes) == 2
    # Kernels are exactly quantize_kernel of the old ones; every other weight is unchanged.
    changed = set()
    for name, specs in _EXPECTED_KERNELS.items():
        old, lay = old_layers[name], new_layers[name]
        for attr, axis, depthwise in specs:
            w = _np(getattr(old, attr))
            expected = Q.quantize_kernel(w, 8, axis if per_channel else None, depthwise)
            np.testing.assert_array_equal(_np(getattr(lay, attr)), expected.astype(w.dtype))
            assert not np.array_equal(_np(getattr(lay, attr)), w)
            changed.add(getattr(lay, attr).path)
    for name, old in old_layers.items():
        for v_old, v_new in zip(old.weights, new_layers[name].weights):
            if v_new.path not in changed:
                np.testing.assert_array_equal(_np(v_old), _np(v_new), err_msg=v_new.path)
    assert len(changed) == 8


def test_fake_quantize_per_channel_error_smaller():
    model = _zoo_model()
    pt = _layers_by_name(Q.fake_quantize_weights(model, per_channel=False))
    pc = _layers_by_name(Q.fake_quantize_weights(model, per_channel=True))
    old = _layers_by_name(model)
    for name, specs in _EXPECTED_KERNELS.items():
        for attr, _, _ in specs:
            w = _np(getattr(old[name], attr)).astype(np.float64)
            e_pt = np.sum((_np(getattr(pt[name], attr)) - w) ** 2)
            e_pc = np.sum((_np(getattr(pc[name], attr)) - w) ** 2)
            assert e_pc < e_pt, (name, attr, e_pc, e_pt)
    x = np.random.default_rng(13).normal(size=(8, 8, 8, 3)).astype("float32")
    y = _np(model(x)).astype(np.float64)
    y_pt = _np(Q.fake_quantize_weights(model, per_channel=False)(x))
    y_pc = _np(Q.fake_quantize_weights(model, per_channel=True)(x))
    assert Q.sqnr_db(y, y_pc) > Q.sqnr_db(y, y_pt) + 10
    assert Q.sqnr_db(y, _inference.predict(Q.fake_quantize_weights(model, bits=16), x)) > 60


def test_fake_quantize_sequential_and_bits():
    keras.utils.set_random_seed(14)
    model = keras.Sequential([keras.Input((6,)), L.Dense(4, name="d1"), L.Dense(3, name="d2")])
    new = Q.fake_quantize_weights(model, bits=4, per_channel=True)
    assert isinstance(new, keras.Sequential)
    assert [la.name for la in new.layers] == ["d1", "d2"]
    for name in ("d1", "d2"):
        w = _np(model.get_layer(name).kernel)
        q = _np(new.get_layer(name).kernel)
        np.testing.assert_array_equal(q, Q.quantize_kernel(w, 4, -1).astype("float32"))
        assert len(np.unique(q[:, 0])) <= 15
        np.testing.assert_array_equal(_np(new.get_layer(name).bias),
                                      _np(model.get_layer(name).bias))


def test_fake_quantize_bad_args():
    model = keras.Sequential([keras.Input((6,)), L.Dense(4)])
    with pytest.raises(ValueError, match="Received: "):
        Q.fake_quantize_weights(model, bits=0)
    with pytest.raises(ValueError, match="Received: "):
        Q.fake_quantize_weights(model, per_channel="yes")
    with pytest.raises(TypeError, match="Received: "):
        Q.fake_quantize_weights(L.Dense(3))

    class Sub(keras.Model):
        def __init__(self):
            super().__init__()
            self.d = L.Dense(2)

        def call(self, x):
            return self.d(x)

    sub = Sub()
    sub(np.zeros((1, 3), "float32"))
    with pytest.raises(ValueError, match="subclassed"):
        Q.fake_quantize_weights(sub)
    # the converter's own route too (an AttributeError on model.inputs before), without an
    # array of its input; with one it is traced (tests/test_traced.py), as TF Lite traces it
    with pytest.raises(ValueError, match="subclassed model whose call"):
        Q.convert_to_tflite_int8(Sub(), np.zeros((4, 3), "float32")[:0])  # no input at all
    assert Q.run_tflite(Q.convert_to_tflite_int8(sub, np.ones((4, 3), "float32")),
                        np.ones((2, 3), "float32")).shape == (2, 2)
    # and quantize's door without data, compiled (its loss read for the outputs' kinds: an
    # AttributeError on model.outputs before its graph was read, found by helper-18's hunt);
    # with data of its one input it is traced (tests/test_traced.py)
    sub.compile(optimizer="adam", loss="mse")
    with pytest.raises(ValueError, match="subclassed model whose call.*traces its call"):
        cle.quantize(Sub())  # not built: no shape to trace it with
    with pytest.raises(ValueError, match="subclassed model whose call.*traces its call"):
        cle.analyze(sub, {"x": np.zeros((16, 3), "float32")})


@pytest.mark.filterwarnings("ignore:Layer InputLayer does not have a `quantize` method")
def test_fake_quantize_rejects_keras_quantized_layer():
    model = keras.Sequential([keras.Input((8,)), L.Dense(4, name="d")])
    model.quantize("int8")
    with pytest.raises(ValueError, match="quantized"):
        Q.fake_quantize_weights(model)


# ---------------------------------------------------------------------------------- spread


def test_weight_range_spread():
    inp = keras.Input((6, 6, 2))
    h = L.Conv2D(5, 1, use_bias=False, name="conv")(inp)
    h = L.DepthwiseConv2D(1, depth_multiplier=2, use_bias=False, name="dw")(h)
    h = L.SeparableConv2D(3, 1, use_bias=False, name="sep")(h)
    h = L.Conv2DTranspose(2, 1, use_bias=False, name="tconv")(h)
    model = keras.Model(inp, L.Dense(2, use_bias=False, name="zero")(h))
    ranges = np.array([1.0, 2.0, 0.0, 4.0, 8.0])  # the dead channel is left out: median 3
    model.get_layer("conv").kernel.assign(
        np.broadcast_to(ranges, (1, 1, 2, 5)) * np.array([1.0, -0.5])[:, None])
    dw = np.zeros((1, 1, 5, 2))
    dw[0, 0, :, 0], dw[0, 0, :, 1] = [1, 1, 1, 1, 1], [-9, 1, 1, 1, 1]  # c*2+m: one is 9
    model.get_layer("dw").kernel.assign(dw)
    model.get_layer("sep").depthwise_kernel.assign(np.ones((1, 1, 10, 1)))
    pw = np.ones((1, 1, 10, 3))
    pw[..., 2] = 5.0
    model.get_layer("sep").pointwise_kernel.assign(pw)
    tk = np.ones((1, 1, 2, 3))  # (*k, out, in): output axis -2
    tk[0, 0, 1, :] = -4.0
    model.get_layer("tconv").kernel.assign(tk)
    model.get_layer("zero").kernel.assign(np.zeros((2, 2)))
    spread = Q.weight_range_spread(model)
    assert list(spread) == ["conv", "dw", "sep/depthwise_kernel", "sep/pointwise_kernel",
                            "tconv", "zero"]
    assert spread["conv"] == pytest.approx(8.0 / 3.0)
    assert spread["dw"] == pytest.approx(9.0)
    assert spread["sep/depthwise_kernel"] == 1.0
    assert spread["sep/pointwise_kernel"] == 5.0
    assert spread["tconv"] == pytest.approx(4.0 / 2.5)
    assert np.isnan(spread["zero"])
    with pytest.raises(TypeError, match="Received: "):
        Q.weight_range_spread("model")


# --------------------------------------------------------------------------------- metrics


def test_metrics_on_known_arrays():
    assert Q.sqnr_db([3.0, 4.0], [3.0, 4.5]) == pytest.approx(20.0)
    assert Q.sqnr_db([[1.0, -1.0]], [[1.1, -0.9]]) == pytest.approx(10 * np.log10(2 / 0.02))
    assert Q.sqnr_db([1.0, 2.0], [1.0, 2.0]) == np.inf
    assert Q.sqnr_db([0.0, 0.0], [0.0, 1.0]) == -np.inf
    ref = np.array([[0.1, 0.9, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 2.0]])
    test = np.array([[0.0, 1.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 5.0], [9.0, 1.0, 2.0]])
    assert Q.top1_agreement(ref, test) == 0.5
    assert Q.top1_agreement(ref, ref) == 1.0
    assert Q.top1_agreement(ref[None], test[None]) == 0.5  # argmax over the last axis only
    for f in (Q.sqnr_db, Q.top1_agreement):
        with pytest.raises(ValueError, match="Received: "):
            f(ref, test[:3])
        with pytest.raises(ValueError, match="Received: "):
            f([], [])


# ---------------------------------------------------------------------------------- TF Lite


def _small_conv_model():
    """Well-conditioned small CNN with a ClippedReLU (its caps partly inside the range)."""
    keras.utils.set_random_seed(21)
    inp = keras.Input((16, 16, 3), name="image")
    h = L.Conv2D(8, 3, padding="same", name="conv_a")(inp)
    h = ClippedReLU(name="clip")(h)
    h = L.DepthwiseConv2D(3, padding="same", name="dw")(h)
    h = L.ReLU(name="relu")(h)
    h = L.Conv2D(12, 1, name="conv_b")(h)
    h = L.GlobalAveragePooling2D(name="gap")(h)
    out = L.Dense(10, name="logits")(h)
    model = keras.Model(inp, out)
    rng = np.random.default_rng(22)
    for layer in model.layers:
        if hasattr(layer, "bias") and layer.bias is not None:
            layer.bias.assign(rng.normal(0.0, 0.1, layer.bias.shape))
    # Uneven output-channel ranges, so per-tensor and per-channel weights really differ.
    model.get_layer("conv_a").kernel.assign(
        _uneven_kernel((3, 3, 3, 8), seed=23, low=0.05, high=0.5))
    model.get_layer("clip").caps.assign(np.linspace(0.3, 3.0, 8))
    return model


@pytest.fixture(scope="module")
def tflite_small():
    pytest.importorskip("tensorflow")
    if BACKEND == "torch":
        pytest.skip(NO_TFLITE_ON_TORCH_REASON)
    model = _small_conv_model()
    x = np.random.default_rng(24).normal(0.0, 1.0, (40, 16, 16, 3)).astype("float32")
    content = {pc: Q.convert_to_tflite_int8(model, x[:32], per_channel=pc) for pc in (True, False)}
    return model, x, content


def test_tflite_weight_scales(tflite_small):
    model, _, content = tflite_small
    kernels = {  # TF Lite op -> (Keras kernel, TF Lite stores it as)
        "conv_a": lambda k: k.transpose(3, 0, 1, 2),  # (out, kh, kw, in)
        "dw": lambda k: k.reshape(k.shape[:2] + (1, -1)).transpose(2, 0, 1, 3),  # (1, kh, kw, C)
        "conv_b": lambda k: k.transpose(3, 0, 1, 2),
        "logits": lambda k: k.T,  # (out, in)
    }
    for pc in (True, False):
        info = runtime.weight_quantization(content[pc])
        # JAX's export (a batch of one) pools by SUM and folds 1/(h·w) into the kernel after
        ops = {op.kind for op in FlatGraph(content[pc]).ops}
        pooled = {"logits": 16.0 * 16.0} if "SUM" in ops and "MEAN" not in ops else {}
        assert [d["op"] for d in info] == ["CONV_2D", "DEPTHWISE_CONV_2D", "CONV_2D",
                                           "FULLY_CONNECTED"]
        for d, (name, layout) in zip(info, kernels.items()):
            k = layout(_np(model.get_layer(name).kernel).astype(np.float64))
            k = k / pooled.get(name, 1.0)
            assert d["dtype"] == np.int8 and d["shape"] == k.shape
            np.testing.assert_array_equal(d["zero_points"], 0)
            axis = d["quantized_dimension"]
            if pc:  # one scale per output channel, TF Lite's own max|W| / 127
                assert axis == (3 if d["op"] == "DEPTHWISE_CONV_2D" else 0)
                other = tuple(i for i in range(k.ndim) if i != axis)
                expected = np.abs(k).max(axis=other) / 127
            else:  # a single scale for the whole tensor
                expected = np.array([np.abs(k).max() / 127])
            assert d["scales"].shape == expected.shape, (name, d["scales"].shape)
            np.testing.assert_allclose(d["scales"], expected, rtol=1e-6)


def test_tflite_output_close_to_keras(tflite_small):
    model, x, content = tflite_small
    y = _np(model(x)).astype(np.float64)
    sqnr = {pc: Q.sqnr_db(y, Q.run_tflite(content[pc], x, batch_size=8)) for pc in content}
    assert sqnr[True] > 25.0, sqnr
    assert sqnr[False] > 15.0, sqnr
    y_tfl = Q.run_tflite(content[True], x)
    assert y_tfl.dtype == np.float32 and y_tfl.shape == (40, 10)
    assert Q.top1_agreement(y, y_tfl) >= 0.8


def test_run_tflite_batches(tflite_small):
    _, x, content = tflite_small
    y1 = Q.run_tflite(content[True], x, batch_size=1)
    assert y1.shape == (40, 10)
    for bs in (3, 16, 40, 64):  # 3 and 16 leave a partial last batch, 64 > N
        # The INT8 results are identical; only the final float DEQUANTIZE may round in the
        # last bit differently with the batch size (vectorized vs scalar loop).
        np.testing.assert_allclose(Q.run_tflite(content[True], x, batch_size=bs), y1,
                                   rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(Q.run_tflite(content[True], x[7:8]), y1[7:8])
    np.testing.assert_allclose(Q.run_tflite(content[True], x[5:30][::-1], batch_size=4),
                               y1[5:30][::-1], rtol=1e-6, atol=1e-7)
    assert Q.run_tflite(content[True], x[:0]).shape == (0, 10)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="Received: "):
            Q.run_tflite(content[True], x, batch_size=bad)
    with pytest.raises(ValueError, match="Received: "):
        Q.run_tflite(content[True], x[:, :8])


@no_tflite_on_torch
def test_run_tflite_int8_io():
    """run_tflite (de)quantizes INT8 inputs and outputs of a model converted with them."""
    model = _small_conv_model()
    x = np.random.default_rng(25).normal(0.0, 1.0, (12, 16, 16, 3)).astype("float32")
    content = Q.convert_to_tflite_int8(model, x, integer_io=True)
    from ai_edge_litert.interpreter import Interpreter

    details = Interpreter(model_content=content).get_input_details()
    assert details[0]["dtype"] == np.int8
    y = _np(model(x)).astype(np.float64)
    y_int8 = Q.run_tflite(content, x, batch_size=5)
    assert y_int8.dtype == np.float32
    assert Q.sqnr_db(y, y_int8) > 20.0


@no_tflite_on_torch
def test_convert_is_quiet_and_uses_num_calibration(capfd):
    model = _small_conv_model()
    x = np.random.default_rng(26).normal(0.0, 1.0, (6, 16, 16, 3)).astype("float32")
    x[2:] *= 100.0  # would widen the calibrated ranges if it were used
    content = Q.convert_to_tflite_int8(model, x, per_channel=True, num_calibration=2)
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out[:500], err[:500])
    assert isinstance(content, bytes) and content[4:8] == b"TFL3"
    assert content == Q.convert_to_tflite_int8(model, x[:2], per_channel=True)
    assert content != Q.convert_to_tflite_int8(model, x, per_channel=True)
    capfd.readouterr()
    assert Q.run_tflite(content, x, batch_size=4).shape == (6, 10)
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out[:500], err[:500])


@no_tflite_on_torch
def test_convert_failure_shows_converter_output(capfd):
    """When conversion fails, the captured converter log is written to stderr."""
    inp = keras.Input((4,))
    out = L.Lambda(lambda t: keras.ops.fft((t, t))[0], name="fft")(inp)
    model = keras.Model(inp, out)
    with pytest.raises(Exception):
        Q.convert_to_tflite_int8(model, np.ones((2, 4), "float32"))
    _, err = capfd.readouterr()
    assert "TF Lite converter output" in err


def test_convert_bad_args():
    model = _small_conv_model()
    x = np.zeros((4, 16, 16, 3), "float32")
    for kwargs in ({"per_channel": "no"}, {"num_calibration": 0}, {"num_calibration": 1.5}):
        with pytest.raises(ValueError, match="Received: "):
            Q.convert_to_tflite_int8(model, x, **kwargs)
    with pytest.raises(ValueError, match="Received: "):
        Q.convert_to_tflite_int8(model, x[:0])
    with pytest.raises(ValueError, match="Received: "):
        Q.convert_to_tflite_int8(model, x[:, :8])
    with pytest.raises(TypeError, match="Received: "):
        Q.convert_to_tflite_int8("model", x)
    a, b = keras.Input((3,)), keras.Input((3,))
    two = keras.Model([a, b], L.Add()([a, b]))
    with pytest.raises(ValueError, match="2 inputs"):
        Q.convert_to_tflite_int8(two, np.zeros((2, 3)))


@pytest.mark.skipif(BACKEND != "torch", reason=f"PyTorch backend only; running on {BACKEND}")
def test_tflite_conversion_on_torch_says_how(tmp_path):
    """TF Lite's converter cannot read a PyTorch-backend model (it failed with "AttributeError:
    'Functional' object has no attribute '_get_save_spec'"). cle says so before converting, in
    convert_to_tflite_int8 and in evaluate (before its float and weight-only rows), and the way
    it names works: the saved model converts in a TensorFlow-backend process."""
    import os
    import subprocess
    import sys
    import textwrap

    model = _small_conv_model()
    x = np.random.default_rng(27).normal(0.0, 1.0, (6, 16, 16, 3)).astype("float32")
    for call in (lambda: Q.convert_to_tflite_int8(model, x),
                 lambda: Q.evaluate(model, x, np.zeros((6, 10)), progress=pytest.fail)):
        with pytest.raises(RuntimeError, match="TensorFlow or JAX Keras backend.*"
                           "KERAS_BACKEND=tensorflow.*Received: KERAS_BACKEND=torch"):
            call()
    assert len(Q.evaluate(model, x, np.zeros((6, 10)), tflite=False)) == 3

    model.save(tmp_path / "m.keras")
    np.save(tmp_path / "x.npy", x)
    env = {**os.environ, "KERAS_BACKEND": "tensorflow"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys
        import numpy as np
        import cle
        from cle import quantization as Q
        x = np.load(sys.argv[2])
        np.save(sys.argv[3], Q.run_tflite(Q.convert_to_tflite_int8(cle.load_model(sys.argv[1]), x), x))
    """), tmp_path / "m.keras", tmp_path / "x.npy", tmp_path / "y.npy"],
        capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    y_int8 = np.load(tmp_path / "y.npy")
    assert Q.sqnr_db(_np(model(x)).astype(np.float64), y_int8) > 20.0


# -------------------------------------------------------------------------------- evaluate


def test_evaluate_rows_without_tflite():
    model = _zoo_model()
    x = np.random.default_rng(31).normal(size=(16, 8, 8, 3)).astype("float32")
    y = _inference.predict(model, x)
    messages = []
    rows = Q.evaluate(model, x, y, tflite=False, progress=messages.append)
    assert [r["name"] for r in rows] == [
        "float", "weights int8 per-tensor", "weights int8 per-channel"]
    assert all(set(r) == {"name", "top1_agreement", "sqnr_db"} for r in rows)
    assert rows[0]["top1_agreement"] == 1.0 and rows[0]["sqnr_db"] == np.inf
    # Weight rows quantize the model with its batch norms folded.
    _, folded = cle.fold_all_batch_norms(model)
    for row, pc in zip(rows[1:], (False, True)):
        y_q = _inference.predict(Q.fake_quantize_weights(folded, per_channel=pc), x)
        assert row["sqnr_db"] == pytest.approx(Q.sqnr_db(y, y_q))
        assert row["top1_agreement"] == Q.top1_agreement(y, y_q)
    assert rows[2]["sqnr_db"] > rows[1]["sqnr_db"]
    assert messages and all(isinstance(m, str) for m in messages)
    # float_outputs is used as given; weight_bits and per_channel select the rows.
    rows = Q.evaluate(model, x, y, float_outputs=y * 1.1, weight_bits=4, tflite=False,
                      per_channel=(True,))
    assert [r["name"] for r in rows] == ["float", "weights int4 per-channel"]
    assert rows[0]["sqnr_db"] == pytest.approx(20.0)


def test_evaluate_with_tflite(tflite_small):
    model, x, _ = tflite_small
    y = _np(model(x)).astype(np.float64)
    messages = []
    rows = Q.evaluate(model, x, y, per_channel=(True,), progress=messages.append)
    assert [r["name"] for r in rows] == [
        "float", "weights int8 per-channel", "TFLite int8 per-channel"]
    assert rows[2]["sqnr_db"] > 25.0
    assert any("TFLite" in m for m in messages)


def test_evaluate_shares_one_calibration_and_matches_the_converter(tflite_small):
    """Both TFLite rows come from one calibration, and each is what convert_to_tflite_int8
    gives on its own (the same calibration inputs, the same granularity)."""
    model, x, _ = tflite_small
    y = _np(model(x)).astype(np.float64)
    messages = []
    rows = Q.evaluate(model, x, y, num_calibration=4, progress=messages.append)
    assert sum("converting (calibration on 4 inputs)" in m for m in messages) == 1
    for pc, row in zip((False, True), rows[3:]):
        alone = Q.run_tflite(Q.convert_to_tflite_int8(model, x[:4], per_channel=pc), x,
                             batch_size=runtime.TFLITE_BATCH)
        assert row["sqnr_db"] == Q.sqnr_db(y, alone), pc
        assert row["top1_agreement"] == Q.top1_agreement(y, alone)


@pytest.mark.parametrize("kwargs", [
    {"weight_bits": 1}, {"tflite": 1}, {"per_channel": ("no",)}, {"per_channel": None},
    {"progress": "print"},
])
def test_evaluate_bad_args(kwargs):
    model = keras.Sequential([keras.Input((3,)), L.Dense(2)])
    x = np.zeros((4, 3), "float32")
    with pytest.raises(ValueError, match="Received: "):
        Q.evaluate(model, x, np.zeros((4, 2)), **kwargs)
    with pytest.raises(ValueError, match="Received: "):
        Q.evaluate(model, x, np.zeros((3, 2)))


def test_module_does_not_import_tensorflow_at_top_level():
    import ast
    import inspect

    from cle._measure import evaluation

    tree = ast.parse(inspect.getsource(evaluation))
    top = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            top.add(node.module.split(".")[0])
    assert "tensorflow" not in top and "keras" in top


# ------------------------------------------------------------------ real MobileNetV2 (slow)


def _print_table(title, rows, timings):
    print(f"\n{title}")
    print(f"  {'variant':28s} {'top-1 agree':>11s} {'SQNR dB':>8s}")
    for r in rows:
        print(f"  {r['name']:28s} {r['top1_agreement']:11.1%} {r['sqnr_db']:8.2f}")
    print("  time per step:")
    for message, seconds in timings:
        print(f"    {seconds:6.2f} s  {message}")


def _timed_evaluate(model, x, y):
    marks = []
    # Weight-only rows: the TF Lite rows of the same two models are tests/test_cli.py's
    # test_run_demo (cle demo runs this comparison).
    rows = Q.evaluate(model, x, y, tflite=False,
                      progress=lambda m: marks.append((time.perf_counter(), m)))
    end = time.perf_counter()
    times = [(m, t2 - t) for (t, m), (t2, _) in zip(marks, marks[1:] + [(end, None)])]
    return rows, times


@pytest.mark.slow
def test_real_mobilenet_v2_quantization_table():
    from cle import pretrained as P

    t0 = time.perf_counter()
    model = real_mobilenet_v2()
    x = P.preprocess_imagenet(P.sample_images(64, seed=0))
    y = _inference.predict(model, x)
    setup = time.perf_counter() - t0

    rows_orig, times_orig = _timed_evaluate(model, x, y)
    t0 = time.perf_counter()
    # Weight-range equalization: what per-tensor weights need (the default objective targets
    # the per-channel flow and scales only sets whose modelled noise drops).
    equalized = cle.equalize_model(model, objective="weights")
    t_eq = time.perf_counter() - t0
    rows_eq, times_eq = _timed_evaluate(equalized, x, y)

    print(f"\nreal MobileNetV2, 64 sample photos (seed 0); reference: original float model. "
          f"setup {setup:.1f} s, equalize_model {t_eq:.1f} s")
    _print_table("original model", rows_orig, times_orig)
    _print_table("cle.equalize_model(model, objective='weights')", rows_eq, times_eq)

    orig = {r["name"]: r for r in rows_orig}
    eq = {r["name"]: r for r in rows_eq}
    assert orig["float"]["top1_agreement"] == 1.0 and orig["float"]["sqnr_db"] == np.inf
    # The defaults are exact (high_bias_fold="none"): the equalized float model computes the
    # original function to the suite's bound.
    y_eq = _inference.predict(equalized, x)
    assert np.abs(y_eq - y).max() <= RTOL * np.abs(y).max()
    # Per-tensor weights are where equalization matters: folded BN scales spread the
    # channel ranges of the original; equalization evens them out.
    assert eq["weights int8 per-tensor"]["sqnr_db"] > orig["weights int8 per-tensor"]["sqnr_db"] + 3
    assert orig["weights int8 per-channel"]["sqnr_db"] > orig["weights int8 per-tensor"]["sqnr_db"]
    for rows in (rows_orig, rows_eq):
        for r in rows:
            assert r["top1_agreement"] >= 0.6, r
