"""rounding="tapsum": kernels rounded to nearest, then each (input, output) channel pair's sum
over the taps kept within half a step; put on their grid before TF Lite's converter, which
gives every weight back as it is."""

import keras
import numpy as np
import pytest
from conftest import randomize_batch_norms, randomize_biases

import cle
from cle._math.kernel_quant import quantize_kernel, round_kernel
from cle._math.rounding import keep_tap_sums
from cle._quantize.options import QuantizeOptions
from cle._quantize.pipeline import build_checked
from cle._tflite.flatgraph import FlatGraph, dequantize

L = keras.layers


def _steps(w, axis, depthwise):
    a = np.abs(w)
    if axis is None:
        return np.full(w.shape[-2:], a.max() / 127)
    if depthwise:
        return a.reshape((-1,) + w.shape[-2:]).max(axis=0) / 127
    return np.broadcast_to(a.reshape(-1, w.shape[-1]).max(axis=0) / 127, w.shape[-2:])


@pytest.mark.parametrize("shape, depthwise", [((3, 3, 8, 1), True), ((5, 5, 6, 2), True),
                                              ((3, 3, 4, 6), False)])
@pytest.mark.parametrize("axis", [None, -1])
def test_tap_sums_within_half_a_step_on_the_same_grid(shape, depthwise, axis):
    rng = np.random.default_rng(0)
    w = rng.normal(size=shape) * rng.uniform(0.1, 3.0, size=shape[-2])[:, None]
    near, kept = quantize_kernel(w, 8, axis, depthwise), round_kernel(w, 8, axis, depthwise,
                                                                      "tapsum")
    step = _steps(w, axis, depthwise)
    off = np.abs((kept - w).reshape((-1,) + shape[-2:]).sum(axis=0)) / step
    assert off.max() <= 0.5 + 1e-9
    assert (np.abs((near - w).reshape((-1,) + shape[-2:]).sum(axis=0)) / step).max() > 0.5
    # The same grid: every weight a multiple of its step, at most one step from nearest, and
    # the largest weight (the grid's end) where it was.
    moved = np.abs(kept - near) / step
    assert np.all(np.isclose(moved, 0) | np.isclose(moved, 1))
    np.testing.assert_allclose(np.abs(kept).max(), np.abs(w).max(), rtol=1e-12)
    np.testing.assert_array_equal(round_kernel(w, 8, axis, depthwise, "nearest"), near)


def test_fewest_moves_and_grid_ends_stay():
    z = np.array([[0.6, -127.0], [0.6, 0.4], [0.6, 0.4], [0.2, 0.4]])
    q = keep_tap_sums(z, np.round(z), 127)
    # column 0: 1+1+1+0 = 3 against 2.0: one of the 0.6s goes down; column 1: -127+0+0+0
    # against -125.8: one step up, on a 0.4 (the -127 stays).
    np.testing.assert_array_equal(q, [[0, -127], [1, 1], [1, 0], [0, 0]])


def test_one_tap_kernels_round_to_nearest():
    w = np.random.default_rng(1).normal(size=(1, 1, 5, 4))
    np.testing.assert_array_equal(round_kernel(w, 8, None, False, "tapsum"),
                                  quantize_kernel(w, 8))
    with pytest.raises(ValueError, match="rounding"):
        round_kernel(w, rounding="up")


def _net():
    inp = keras.Input((12, 12, 3))
    x = L.ReLU(6.0)(L.BatchNormalization()(L.Conv2D(8, 3, padding="same", name="stem")(inp)))
    x = L.ReLU(6.0)(L.BatchNormalization()(L.DepthwiseConv2D(3, padding="same", name="dw")(x)))
    x = L.BatchNormalization()(L.Conv2D(4, 1, name="project")(x))
    return randomize_biases(randomize_batch_norms(keras.Model(inp, x)))


@pytest.mark.parametrize("per_channel", [True, False])
def test_the_converter_keeps_the_kernels_as_put_on_their_grid(per_channel):
    model = _net()
    x = np.random.default_rng(2).uniform(-1, 1, (16, 12, 12, 3)).astype(np.float32)
    opts = QuantizeOptions.from_call(x, per_channel=per_channel, rounding="tapsum")
    assert not opts.rounds and opts.bias_mode == "empirical"
    build = build_checked(model, x, opts, lambda m: None)
    graph = FlatGraph(build.content)
    seen = 0
    for op in graph.ops:
        if op.kind not in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            continue
        t = op.inputs[1]
        stored = dequantize(graph.constant(t), graph.params(t))
        name = "dw" if op.kind == "DEPTHWISE_CONV_2D" else (
            "stem" if stored.shape[1] == 3 else "project")
        kernel = np.asarray(build.equalized.get_layer(name).kernel, np.float64)
        # TF Lite keeps (out, kh, kw, in) for CONV_2D and (1, kh, kw, C) for depthwise.
        back = np.transpose(stored, (1, 2, 3, 0))
        if name == "project":  # one tap: left to the converter, rounded to nearest
            kernel = quantize_kernel(kernel, 8, -1 if per_channel else None)
        else:
            seen += 1
        np.testing.assert_allclose(back, kernel, rtol=1e-5, atol=1e-6 * np.abs(kernel).max())
    assert seen == 2


def test_auto_is_tapsum_with_per_tensor_weights_or_without_data():
    """rounding="auto" at 8 bits: "nearest" only with data and per-channel weights (and in
    16x8 mode); at 4 bits "adaround" with data, "gptq" without, whatever the weights."""
    def method(**kw):
        return QuantizeOptions(**kw).rounding_method

    assert method(has_data=True) == "nearest"
    assert method(has_data=False) == "tapsum"
    assert method(has_data=True, per_channel=False) == "tapsum"
    assert method(has_data=False, per_channel=False) == "tapsum"
    assert method(has_data=False, activation_bits=16) == "nearest"
    for per_channel in (True, False):
        assert method(has_data=True, weight_bits=4, per_channel=per_channel) == "adaround"
        assert method(has_data=False, weight_bits=4, per_channel=per_channel) == "gptq"


def test_options():
    with pytest.raises(ValueError, match="8-bit kernels"):
        QuantizeOptions(rounding="tapsum", weight_bits=4)
    opts = QuantizeOptions(rounding="tapsum", tune=True, has_data=True)
    assert not opts.rounds and opts.bias_mode == "empirical"
    QuantizeOptions(rounding="tapsum", bias_correction="analytic", activation_bits=16)


def test_analyze_measures_the_snapped_kernels_against_their_float_values(monkeypatch):
    """Per-tensor, cle.analyze analyses what cle.quantize writes when its choice keeps cle's
    build (kernels on their grid, tap sums kept) against the float kernels: a layer whose
    kernel was put on its grid still shows its weight error."""
    from cle._quantize import choice

    # cle's build, the one cle.analyze analyses: no other candidate may replace it here
    monkeypatch.setattr(choice, "SUPPORT", {k: 2.0 for k in choice.SUPPORT})
    monkeypatch.setattr(choice, "_farther_outputs", lambda *args, **kwargs: [])
    model = _net()
    x = np.random.default_rng(2).uniform(-1, 1, (16, 12, 12, 3)).astype(np.float32)
    content, quantized = cle.quantize(model, x, per_channel=False)
    assert quantized.target["rounding"] == "tapsum"
    report = cle.analyze(model, x, per_channel=False)
    assert report.tflite == content and report.output["sqnr_db"] == quantized.sqnr_db
    rows = {r.name: r for r in report.layers}
    assert rows["dw"].weight_sqnr_db is not None and np.isfinite(rows["dw"].weight_sqnr_db)
    assert rows["dw"].weight_share > 0 and rows["stem"].weight_share > 0
