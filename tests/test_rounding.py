"""The rounding math (cle._math.rounding, cle._math.moments; numpy only): GPTQ and AdaRound
lower a layer's output error against rounding to nearest, a kernel already on its grid stays
exactly as it is, the asymmetric target is the kernel when there is no earlier error, the
bias takes the mean error away, and the patch statistics are those of the Keras layer's own
computation."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest

from cle._math import rounding as R
from cle._math.moments import Geometry, moments
from cle._quantize import layer_parts

from conftest import needs_nchw_conv


def _toy_layer(seed=0, rows=16, d=24, samples=4000):
    """A dense layer with correlated, non-zero-mean inputs (as after a ReLU): ``(W with its
    bias column, H over [x, 1], x)``."""
    rng = np.random.default_rng(seed)
    mix = rng.normal(size=(d, d)) / np.sqrt(d)
    x = np.maximum(rng.normal(size=(samples, d)) @ mix + 0.3, 0.0)
    W = rng.normal(size=(1, rows, d)) * rng.uniform(0.2, 1.0, (1, rows, 1))
    b = rng.normal(size=(1, rows, 1))
    xa = np.concatenate([x, np.ones((samples, 1))], 1)
    H = (xa.T @ xa / samples)[None]
    return np.concatenate([W, b], 2), H, x


@pytest.mark.parametrize("bits", [4, 8])
def test_gptq_lowers_the_output_error_against_nearest(bits):
    W, H, _ = _toy_layer()
    d = W.shape[2] - 1
    Qn, bn, s = R.round_rows(W, H, H, bits, "nearest", d, free_bias=False)
    Qm, bm, _ = R.round_rows(W, H, H, bits, "nearest", d)
    Qg, bg, sg = R.round_rows(W, H, H, bits, "gptq", d)
    err_nearest = R.output_error(W, np.concatenate([Qn, bn], 2), H)
    err_mean = R.output_error(W, np.concatenate([Qm, bm], 2), H)
    err_gptq = R.output_error(W, np.concatenate([Qg, bg], 2), H)
    # GPTQ (with its own MSE step and the bias taking the mean error) at least halves the
    # output error of rounding to nearest on correlated inputs, and beats it by a quarter
    # when the bias of the nearest rounding takes its mean error away too.
    assert err_gptq < 0.5 * err_nearest
    assert err_gptq < 0.75 * err_mean < 0.75 * err_nearest
    # every value on its row's grid, within the grid's range
    k = Qg / sg[..., None]
    assert np.allclose(k, np.round(k), atol=1e-9)
    assert R.grid_min(bits) <= np.round(k).min() and np.round(k).max() <= R.grid_max(bits)


def test_the_grid_uses_its_negative_end_below_8_bits():
    """Below 8 bits the grid is the whole two's-complement range (INT4 holds -8); at 8 bits the
    symmetric range of TF Lite's INT8 weights. A row whose largest weight is negative puts it
    on -8, a finer step than on -7."""
    assert [(R.grid_min(b), R.grid_max(b)) for b in (2, 4, 8)] == [(-2, 1), (-8, 7),
                                                                   (-127, 127)]
    W = np.array([[[-1.6, 0.75, 0.1], [1.4, -0.2, 0.0]]])
    s = R.scale_maxabs(W, 7, qmin=-8)
    np.testing.assert_allclose(s, [[0.2, 0.2]])  # -1.6 / -8 and 1.4 / 7
    np.testing.assert_allclose(R.scale_maxabs(W, 7), [[1.6 / 7, 0.2]])
    Q, _, s4 = R.round_rows(W, None, None, 4, "nearest", 3)
    np.testing.assert_allclose(Q / s4[..., None], [[[-8, 4, 0], [7, -1, 0]]])
    _, _, s8 = R.round_rows(W, None, None, 8, "nearest", 3)
    np.testing.assert_allclose(s8, [[1.6 / 127, 1.4 / 127]])


def test_nearest_with_free_bias_takes_the_mean_output_error_away():
    """Rounded to nearest with ``H`` and ``G`` given, the bias makes the quantized layer's
    mean output on the quantized stream equal the float layer's on the float stream."""
    rng = np.random.default_rng(5)
    W, _, x = _toy_layer(seed=5)
    xq = x + rng.normal(0.3, 0.2, x.shape)  # the quantized stream: shifted, noisier inputs
    ones = np.ones((len(x), 1))
    xa, xqa = np.concatenate([x, ones], 1), np.concatenate([xq, ones], 1)
    H, G = (xqa.T @ xqa / len(x))[None], (xqa.T @ xa / len(x))[None]
    d = W.shape[2] - 1
    Q, b, _ = R.round_rows(W, H, G, 4, "nearest", d)
    float_mean = (xa @ W[0].T).mean(0)
    quant_mean = (xqa @ np.concatenate([Q, b], 2)[0].T).mean(0)
    np.testing.assert_allclose(quant_mean, float_mean, rtol=0, atol=1e-9)
    assert not np.allclose(b, W[:, :, d:])
    Q2, b2, _ = R.round_rows(W, H, G, 4, "nearest", d, free_bias=False)
    np.testing.assert_array_equal(Q2, Q)
    np.testing.assert_array_equal(b2, W[:, :, d:])  # without free_bias: as it was


def test_mean_bias_per_problem():
    """:func:`mean_bias` for several problems at once (a depthwise or grouped layer's rows):
    each problem's bias is ``b + mean(x_f)·w − mean(x_q)·q`` of its own inputs."""
    rng = np.random.default_rng(6)
    B, rows, D, N = 3, 4, 6, 500
    xf = rng.normal(0.5, 1.0, (B, N, D))
    xq = xf + rng.normal(0.1, 0.3, (B, N, D))
    aug = lambda x: np.concatenate([x, np.ones((B, N, 1))], 2)  # noqa: E731
    H = np.einsum("bni,bnj->bij", aug(xq), aug(xq)) / N
    G = np.einsum("bni,bnj->bij", aug(xq), aug(xf)) / N
    W = rng.normal(size=(B, rows, D + 1))
    Q, b, _ = R.round_rows(W, H, G, 4, "nearest", D)
    want = W[:, :, D] + np.einsum("bi,bri->br", xf.mean(1), W[:, :, :D]) - np.einsum(
        "bi,bri->br", xq.mean(1), Q)
    np.testing.assert_allclose(b[:, :, 0], want, rtol=0, atol=1e-10)


def test_adaround_lowers_the_output_error_against_nearest():
    W, H, _ = _toy_layer(seed=1)
    d = W.shape[2] - 1
    Qn, bn, _ = R.round_rows(W, H, H, 4, "nearest", d, free_bias=False)
    Qm, bm, _ = R.round_rows(W, H, H, 4, "nearest", d)
    Qa, ba, _ = R.round_rows(W, H, H, 4, "adaround", d)
    err = R.output_error(W, np.concatenate([Qa, ba], 2), H)
    assert err < 0.5 * R.output_error(W, np.concatenate([Qn, bn], 2), H)
    assert err < 0.75 * R.output_error(W, np.concatenate([Qm, bm], 2), H)


@pytest.mark.parametrize("method", ["nearest", "gptq", "adaround"])
@pytest.mark.parametrize("per_tensor", [False, True])
def test_a_kernel_on_its_grid_stays_exactly(method, per_tensor):
    rng = np.random.default_rng(3)
    _, H, _ = _toy_layer(seed=2, rows=6, d=10)
    k = rng.integers(-8, 8, size=(1, 6, 10)).astype(np.float64)
    k[:, :, 0] = 7  # every row reaches the grid's end, so the largest weight sets the step
    s = np.full((1, 6, 1), 0.02) if per_tensor else rng.uniform(0.01, 0.1, (1, 6, 1))
    bias = rng.normal(size=(1, 6, 1))
    W = np.concatenate([k * s, bias], 2)
    Q, b, steps = R.round_rows(W, H, H, 4, method, 10, per_tensor=per_tensor)
    np.testing.assert_array_equal(Q, k * s)
    np.testing.assert_allclose(b, bias, rtol=0, atol=1e-12)
    np.testing.assert_allclose(steps, np.broadcast_to(s[..., 0], steps.shape), rtol=1e-15)


def test_per_tensor_steps_are_one_step():
    W, H, _ = _toy_layer(seed=4)
    for method in ("nearest", "gptq"):
        _, _, s = R.round_rows(W, H, H, 4, method, W.shape[2] - 1, per_tensor=True)
        assert np.unique(s).size == 1


def test_asymmetric_target_is_the_kernel_without_earlier_error():
    W, H, _ = _toy_layer(seed=5)
    np.testing.assert_allclose(R.asymmetric_target(W, H, H.copy()), W, rtol=0, atol=1e-10)


def test_asymmetric_target_undoes_a_known_input_error():
    """The quantized stream's inputs are the float inputs mixed by a known matrix; the target
    reproduces the float outputs from them (up to the ridge)."""
    rng = np.random.default_rng(6)
    xf = rng.normal(size=(5000, 8))
    mix = np.eye(8) + 0.1 * rng.normal(size=(8, 8))
    xq = xf @ mix
    w = rng.normal(size=(1, 3, 8))
    H = (xq.T @ xq / len(xq))[None]
    G = (xq.T @ xf / len(xq))[None]
    v = R.asymmetric_target(w, H, G, damp=1e-9)
    np.testing.assert_allclose(xq @ v[0].T, xf @ w[0].T, rtol=0, atol=1e-5)


def test_best_bias_takes_the_mean_error_away():
    W, H, x = _toy_layer(seed=7)
    d = W.shape[2] - 1
    Qn, _, _ = R.round_rows(W, H, H, 4, "nearest", d)
    b = R.best_bias(W, Qn, H, d)
    y_float = x @ W[0, :, :d].T + W[0, :, d]
    y_rounded = x @ Qn[0].T + b[0, :, 0]
    np.testing.assert_allclose((y_rounded - y_float).mean(axis=0), 0, atol=1e-9)


@pytest.mark.parametrize("kind, shape, groups", [
    ("conv", (3, 3, 4, 6), 1), ("conv", (3, 3, 2, 6), 2), ("depthwise", (3, 3, 4, 2), 1),
    ("dense", (5, 7), 1)])
def test_rows_round_trip(kind, shape, groups):
    k = np.random.default_rng(8).normal(size=shape)
    W = R.to_rows(k, None, kind, groups)
    np.testing.assert_array_equal(R.from_rows(W, kind, shape, groups), k)
    out = shape[-1] * (shape[-2] if kind == "depthwise" else 1)
    assert R.channel_order(W[..., 0]).size == out


# ------------------------------------------------------------------------- patch statistics


def _layer_cases():
    L = keras.layers
    return [
        (L.Conv2D(6, 3, strides=2, padding="same"), (2, 9, 8, 4), 1),
        (L.Conv2D(6, 3, dilation_rate=2, padding="valid"), (2, 9, 9, 4), 1),
        (L.Conv2D(6, 3, padding="same", groups=2), (2, 7, 7, 4), 2),
        (L.DepthwiseConv2D(3, strides=2, padding="same", depth_multiplier=2), (2, 8, 9, 3), 1),
        (L.Dense(5), (2, 6, 4), 1),
        (L.Conv1D(6, 3, strides=2, padding="same"), (3, 11, 4), 1),
        (L.Conv1D(6, 3, dilation_rate=2, padding="valid", groups=2), (3, 12, 4), 2),
        (L.DepthwiseConv1D(3, strides=2, padding="same", depth_multiplier=2), (3, 11, 4), 1),
    ]


@pytest.mark.parametrize("case", range(len(_layer_cases())))
def test_moments_are_the_layers_own_patches(case):
    """For each output channel ``o`` of a layer, ``[w_o, b_o]ᵀ H [w_o, b_o]`` is the mean
    square of the layer's own output channel over every position: the patches hold the
    inputs (order, padding, strides, groups) the layer multiplies. The geometry and the
    channels-last input are the rounding stage's own (a Conv1D's sequence read as one row)."""
    layer, shape, groups = _layer_cases()[case]
    rng = np.random.default_rng(case)
    x = rng.normal(size=shape).astype(np.float32)
    y = keras.ops.convert_to_numpy(layer(x)).astype(np.float64)
    layer.bias.assign(rng.normal(size=layer.bias.shape).astype(np.float32))
    y = keras.ops.convert_to_numpy(layer(x)).astype(np.float64)
    (part,) = layer_parts.parts(layer)
    kind = part.kind
    assert part.geometry.groups == part.groups == groups
    a = layer_parts.channels_last(layer, x)
    H, G = moments(a, a, part.geometry, bias=True)
    assert G is H
    W = R.to_rows(keras.ops.convert_to_numpy(layer.kernel),
                  keras.ops.convert_to_numpy(layer.bias), kind, groups)
    predicted = np.einsum("brd,bde,bre->br", W, H, W)
    measured = (y.reshape(-1, y.shape[-1]) ** 2).mean(axis=0)
    np.testing.assert_allclose(R.channel_order(predicted), measured, rtol=1e-4)


@needs_nchw_conv
@pytest.mark.parametrize("make", [
    lambda: keras.layers.Conv1D(5, 3, strides=2, padding="same", data_format="channels_first"),
    lambda: keras.layers.DepthwiseConv1D(3, padding="valid", depth_multiplier=2,
                                         data_format="channels_first")])
def test_moments_of_channels_first_1d_layers(make):
    """A channels_first 1-D layer's input ``(N, C, L)`` is read channels last, as one row."""
    layer = make()
    x = np.random.default_rng(4).normal(size=(3, 4, 11)).astype(np.float32)
    layer.build(x.shape)
    layer.bias.assign(np.random.default_rng(5).normal(size=layer.bias.shape).astype(np.float32))
    y = np.moveaxis(keras.ops.convert_to_numpy(layer(x)).astype(np.float64), 1, -1)
    (part,) = layer_parts.parts(layer)
    a = layer_parts.channels_last(layer, x)
    assert a.shape == (3, 1, 11, 4)
    H, _ = moments(a, a, part.geometry, bias=True)
    W = R.to_rows(keras.ops.convert_to_numpy(layer.kernel),
                  keras.ops.convert_to_numpy(layer.bias), part.kind, part.groups)
    predicted = np.einsum("brd,bde,bre->br", W, H, W)
    measured = (y.reshape(-1, y.shape[-1]) ** 2).mean(axis=0)
    np.testing.assert_allclose(R.channel_order(predicted), measured, rtol=1e-4)


def test_moments_sample_the_same_positions_in_both_streams():
    rng = np.random.default_rng(9)
    xf = rng.normal(size=(4, 16, 16, 3)).astype(np.float32)
    g = Geometry("conv", (3, 3), (1, 1), (1, 1), "same")
    H, G = moments(xf, xf.copy(), g, bias=True, max_positions=200, seed=1)
    # same values, same positions (float32 products: BLAS may sum a product with itself
    # in another order than one with a copy)
    np.testing.assert_allclose(G, H, rtol=0, atol=1e-6 * np.abs(H).max())
    H2, _ = moments(xf, xf, g, bias=True, max_positions=200, seed=2)
    assert not np.allclose(H2, H)  # other positions
    assert H[0, -1, -1] == 1.0  # the bias input


def test_smallest_within_takes_the_smallest_kernels_within_the_share():
    sizes = [900, 10, 40, 30, 20]  # 1000 in all
    # 5 % = 50: 10 and 20 (30 more would overrun), ascending order of size
    assert R.smallest_within(sizes, 0.05) == [1, 4]
    # 10 % = 100: 10 + 20 + 30 + 40 = 100, exactly the budget
    assert R.smallest_within(sizes, 0.10) == [1, 2, 3, 4]
    # a kernel that would overrun is skipped, a smaller later one still fits
    assert R.smallest_within([5, 60, 935], 0.06) == [0]
    assert R.smallest_within([60, 5, 935], 0.065) == [0, 1]
    assert R.smallest_within(sizes, 0.0) == []
    assert R.smallest_within(sizes, 1.0) == [0, 1, 2, 3, 4]


def test_noisiest_within_takes_the_most_noise_per_weight_within_the_share():
    sizes = [900, 10, 40, 30, 20]  # 1000 in all
    noise = [9.0, 0.01, 2.0, 0.3, 0.1]  # per weight: 0.01, 0.001, 0.05, 0.01, 0.005
    # 5 % = 50: the 40 (most per weight), then 900 and the 30 would overrun, the 10 fits
    assert R.noisiest_within(sizes, noise, 0.05) == [1, 2]
    # the smallest kernels are not what it takes: the largest noise per weight is
    assert R.noisiest_within(sizes, noise, 0.05) != R.smallest_within(sizes, 0.05)
    # ties keep their order; a kernel larger than the budget is never taken
    assert R.noisiest_within([10, 10, 10], [1.0, 1.0, 1.0], 0.34) == [0]
    assert R.noisiest_within(sizes, noise, 0.0) == []
    assert R.noisiest_within(sizes, noise, 1.0) == [0, 1, 2, 3, 4]


def test_shrunk_scales_the_correlations_and_keeps_variances_means_and_definiteness():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 4)) @ rng.normal(size=(4, 4)) + rng.normal(size=4)
    y = x + 0.1 * rng.normal(size=x.shape)
    p, q = np.c_[x, np.ones(500)], np.c_[y, np.ones(500)]
    H, G = (p.T @ p / 500)[None], (p.T @ q / 500)[None]
    Hs, Gs = R.shrunk(H, G, 0.3, 4)
    for M, Ms, a, b in ((H, Hs, x, x), (G, Gs, x, y)):
        np.testing.assert_allclose(Ms[0, :, 4], M[0, :, 4])  # means (and the bias input)
        np.testing.assert_allclose(Ms[0, 4, :], M[0, 4, :])
        C = (a - a.mean(0)).T @ (b - b.mean(0)) / 500  # the (cross-)covariance
        Cs = Ms[0, :4, :4] - np.outer(a.mean(0), b.mean(0))
        np.testing.assert_allclose(np.diag(Cs), np.diag(C), atol=1e-9)  # variances
        off = ~np.eye(4, dtype=bool)
        np.testing.assert_allclose(Cs[off], 0.7 * C[off], atol=1e-9)
    assert np.linalg.eigvalsh(Hs[0]).min() > 0  # still a second-moment matrix
    h, g = R.shrunk(H, H, 0.3, 4)
    assert g is h  # one stream stays one stream
    np.testing.assert_allclose(R.shrunk(H, H, 0.0, 4)[0], H)
    # without a bias column: the second moments about the origin, the same rule
    Hn = H[:, :4, :4]
    off = ~np.eye(4, dtype=bool)
    Hns = R.shrunk(Hn, Hn, 0.5, 4)[0][0]
    np.testing.assert_allclose(np.diag(Hns), np.diag(Hn[0]))
    np.testing.assert_allclose(Hns[off], 0.5 * Hn[0][off])


def test_the_rounding_summary_leaves_a_layer_exact_both_ways_out_of_its_gain():
    """A layer whose output both roundings reproduce exactly reads inf dB each way: its gain,
    inf - inf, printed "gain nan dB" (helper-24's review); the gain is of the other layers,
    and with none left the clause is not printed."""
    from cle._quantize.rounding import RoundedLayer, RoundingReport

    exact = RoundedLayer("zero", "conv", (1, 1, 2, 2), math.inf, math.inf)
    report = RoundingReport("adaround", 4, True, "calibration inputs", 8,
                            [exact, RoundedLayer("c", "conv", (3, 3, 2, 4), 20.0, 23.0)])
    line = [s for s in report.summary_lines() if "layer output SQNR" in s][0]
    assert "nan" not in line and "(gain 3.0 dB at the median, 3.0 dB at the least)" in line
    report.layers = [exact]
    line = [s for s in report.summary_lines() if "layer output SQNR" in s][0]
    assert "nan" not in line and "(gain" not in line
    assert exact.line().startswith("zero (conv 1x1x2x2): output SQNR exact to nearest -> exact")
