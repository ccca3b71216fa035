"""A layer of more inputs per output than the rounding's limit (issue #41: a Dense of 61,952
inputs made 30 GB matrices) is rounded on the diagonal blocks of its statistics, one block at a
time: the blocks' moments are the whole moments' diagonal blocks, one block is the whole
rounding, the blocked rounding still beats rounding to nearest, and the report says which
layers took it and why. The limit is lowered here so that a tiny model takes that path;
``benchmarks/bench_w4_fan_in.py`` measures the memory of the real case."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from keras import layers as L

import cle
from cle._math import moments as M
from cle._math import rounding as R
from cle._math.moments import Geometry, column_blocks, moments
from cle._quantize import rounding as stage

from conftest import no_tflite_on_torch


def test_column_blocks_cover_the_columns_in_even_contiguous_blocks():
    assert column_blocks(10, 4) == [(0, 3), (3, 6), (6, 10)]
    assert column_blocks(4, 4) == [(0, 4)]
    assert column_blocks(3, 4) == [(0, 3)]
    blocks = column_blocks(61_952, 4096)
    assert len(blocks) == 16 and blocks[0][0] == 0 and blocks[-1][1] == 61_952
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
    assert {stop - start for start, stop in blocks} == {3872}


@pytest.mark.parametrize("geometry, shape", [
    (Geometry("conv", (3, 3), (2, 1), (1, 1), "same", 2), (3, 9, 7, 6)),
    (Geometry("conv", (3, 2), (1, 1), (2, 1), "valid"), (2, 11, 8, 5)),
    (Geometry("dense"), (5, 3, 13)),
])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("same", [True, False])
def test_block_moments_are_the_diagonal_blocks_of_the_whole(monkeypatch, geometry, shape, bias,
                                                            same):
    """On the same positions (over several chunks of them), with the bias's row and column;
    ``G is H`` when the streams are one."""
    monkeypatch.setattr(M, "CHUNK", 16)
    rng = np.random.default_rng(0)
    x_q = rng.normal(size=shape).astype(np.float32)
    x_f = x_q if same else x_q + 0.1 * rng.normal(size=shape).astype(np.float32)
    H, G = moments(x_q, x_f, geometry, bias, max_positions=50, seed=3)
    d = H.shape[1] - bias
    for start, stop in column_blocks(d, 7):
        Hb, Gb = moments(x_q, x_f, geometry, bias, max_positions=50, seed=3,
                         columns=(start, stop))
        idx = list(range(start, stop)) + [d] * bias
        np.testing.assert_allclose(Hb, H[:, idx][:, :, idx], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(Gb, G[:, idx][:, :, idx], rtol=1e-6, atol=1e-6)
        assert (Gb is Hb) == same


def _dense_case(seed=0, rows=6, d=30, samples=500):
    """A dense layer's ``W`` (with its bias column) and inputs in both streams, correlated
    and not centred (as after a ReLU)."""
    rng = np.random.default_rng(seed)
    mix = rng.normal(size=(d, d)) / np.sqrt(d)
    x_f = np.maximum(rng.normal(size=(samples, d)) @ mix + 0.3, 0.0).astype(np.float32)
    x_q = (x_f + 0.05 * rng.normal(size=x_f.shape)).astype(np.float32)
    W = np.concatenate([rng.normal(size=(1, rows, d)), rng.normal(size=(1, rows, 1))], 2)
    return W, x_q, x_f


@pytest.mark.parametrize("method", ["nearest", "gptq", "adaround"])
@pytest.mark.parametrize("free_bias", [True, False])
@pytest.mark.parametrize("streams", [1, 2])
def test_one_block_is_the_whole_rounding(method, free_bias, streams):
    W, x_q, x_f = _dense_case()
    x_f = x_q if streams == 1 else x_f
    d = W.shape[2] - 1
    H, G = moments(x_q, x_f, Geometry("dense"), True)
    Q, bias, s = R.round_rows(W, H, G, 4, method, d, False, free_bias, 0.3)
    Qb, bias_b, s_b = R.round_rows_blocked(
        W, lambda a, b: moments(x_q, x_f, Geometry("dense"), True, columns=(a, b)),
        [(0, d)], 4, method, d, False, free_bias, 0.3)
    np.testing.assert_allclose(s_b, s, rtol=1e-9)  # (the same up to the sums' order)
    np.testing.assert_array_equal(np.round(Qb / s_b[..., None]), np.round(Q / s[..., None]))
    np.testing.assert_allclose(bias_b, bias, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("method", ["gptq", "adaround"])
@pytest.mark.parametrize("per_tensor", [False, True])
@pytest.mark.parametrize("streams", [1, 2])
def test_blocked_rounding_beats_nearest_and_holds_one_block_at_a_time(method, per_tensor,
                                                                      streams):
    """On four blocks of inputs correlated across blocks (the worst case for blocks): less
    output error against the float layer than rounding to nearest with the mean-error bias,
    every step on the whole row (or kernel), and no matrix wider than a block (with the bias),
    each block's measured once to nearest and for the rounding, and with two streams once more
    for its target but the last."""
    W, x_q, x_f = _dense_case()
    x_f = x_q if streams == 1 else x_f
    d = W.shape[2] - 1
    blocks = column_blocks(d, 8)
    widths = []

    def moments_of(a, b):
        H, G = moments(x_q, x_f, Geometry("dense"), True, columns=(a, b))
        widths.append(H.shape[1])
        return H, G

    Q, bias, s = R.round_rows_blocked(W, moments_of, blocks, 4, method, d, per_tensor)
    Qn, bias_n, s_n = R.round_rows_blocked(W, moments_of, blocks, 4, "nearest", d, per_tensor)
    assert max(widths) == max(b - a for a, b in blocks) + 1
    assert len(widths) == 2 * len(blocks) + (len(blocks) - 1 if streams == 2 else 0)

    def error(Qx, bx):  # the mean squared output error against the float layer
        y_f = x_f @ W[0, :, :d].T + W[0, :, d]
        y_q = x_q @ Qx[0].T + bx[0, :, 0]
        return float(((y_f - y_q) ** 2).mean())

    assert error(Q, bias) < error(Qn, bias_n)
    assert s.shape == (1, W.shape[1])
    if per_tensor:
        assert np.ptp(s) == 0
    k = np.round(Q / s[..., None])
    np.testing.assert_allclose(k * s[..., None], Q, atol=1e-12)
    assert k.min() >= R.grid_min(4) and k.max() <= R.grid_max(4)


def _wide_model(seed=0):
    """conv → BN → ReLU → pool → Flatten (200 inputs) → Dense "wide" → Dense "head"."""
    keras.utils.set_random_seed(seed)
    inp = keras.Input((12, 12, 2))
    x = L.Conv2D(8, 3, name="c1")(inp)
    x = L.BatchNormalization(name="bn")(x)
    x = L.ReLU()(x)
    x = L.MaxPooling2D()(x)
    x = L.Dense(16, activation="relu", name="wide")(L.Flatten()(x))
    return keras.Model(inp, L.Dense(5, name="head")(x))


@pytest.mark.parametrize("method", ["nearest", "gptq", "adaround"])
def test_a_layer_over_the_limit_takes_the_blocked_path(monkeypatch, method):
    """With the limit lowered to 64, the Dense of 200 inputs is rounded on 4 blocks (no
    statistics of more than a block's inputs are measured), at least as well as to nearest;
    its record and the summary say so and why; the layers under the limit are rounded as
    without a limit."""
    model = _wide_model()
    x = np.random.default_rng(1).normal(size=(64, 12, 12, 2)).astype(np.float32)

    def rounded(limit):
        monkeypatch.setattr(stage, "MAX_FAN_IN", limit)
        folded = cle.fold_all_batch_norms(model)[1]
        widths = []

        def spy(*args, **kwargs):
            H, G = moments(*args, **kwargs)
            widths.append(H.shape[1])
            return H, G

        monkeypatch.setattr(stage, "moments", spy)
        report, _ = stage.round_model(folded, [x], bits=4, per_channel=True, method=method,
                                      damp=0.3)
        kernels = {layer.name: keras.ops.convert_to_numpy(layer.kernel)
                   for layer in folded.layers if hasattr(layer, "kernel")}
        return report, kernels, widths

    whole, kernels, widths = rounded(4096)
    assert max(widths) == 201 and all(r.reason is None for r in whole.layers)
    report, blocked, widths = rounded(64)
    assert max(widths) == 51
    records = {r.layer: r for r in report.layers}
    assert records["c1"].reason is None and records["head"].reason is None
    np.testing.assert_array_equal(blocked["c1"], kernels["c1"])
    reason = records["wide"].reason
    assert reason.startswith("200 inputs per output, more than 64 (their whole second-moment "
                             "matrix would take 0.323 MB): rounded on 4 blocks of at most 50 "
                             "inputs, ")
    assert ("the same correction" if method == "nearest" else
            "the correlations between blocks left out") in reason
    assert records["wide"].line().endswith("; " + reason)
    assert records["wide"].sqnr_db >= records["wide"].sqnr_nearest_db
    if method != "nearest":
        assert records["wide"].sqnr_db > records["wide"].sqnr_nearest_db + 2
    assert ("  1 kernels rounded on blocks of their inputs (more than 64 inputs per output): "
            "wide (dense)") in report.summary_lines()
    assert report.to_dict()["layers"][1]["reason"] == reason


@no_tflite_on_torch
def test_quantize_reports_the_blocked_layer(monkeypatch):
    """Through ``cle.quantize(..., weight_bits=4)`` without data (gptq on the synthetic
    inputs): the wide layer is rounded on blocks, stored INT4, and the summary names it."""
    monkeypatch.setattr(stage, "MAX_FAN_IN", 64)
    messages = []
    _, report = cle.quantize(_wide_model(), weight_bits=4, input_range=(-2, 2),
                             progress=messages.append, output_kinds={"head": "classes"})
    records = {r.layer: r for r in report.rounding.layers}
    assert report.rounding.method == "gptq"
    assert records["wide"].reason.startswith("200 inputs per output, more than 64")
    assert records["c1"].reason is None
    assert any(m.startswith("rounding [2/3] wide (dense 200x16): ") and
               m.endswith(records["wide"].reason) for m in messages)
    assert "1 kernels rounded on blocks of their inputs" in report.summary()
    assert {w.layer: w.storage for w in report.weights}["wide"] == "INT4"


@pytest.mark.parametrize("method", ["gptq", "adaround"])
def test_a_grouped_convolution_over_the_limit_is_rounded_on_blocks_of_each_group(monkeypatch,
                                                                                 method):
    """A strided, padded convolution of two groups (3x3x4 = 36 inputs per output in each)
    with the limit at 10: four blocks of each group's patch columns, no statistics wider than
    a block, and its output closer to the float layer's than to nearest; on white inputs (no
    correlations for the blocks to leave out) about as close as on the whole statistics, as
    it is only if every block reads its own columns."""
    keras.utils.set_random_seed(2)
    inp = keras.Input((9, 9, 8))
    x = L.Conv2D(6, 3, strides=2, padding="same", groups=2, name="grouped")(inp)
    model = keras.Model(inp, L.Dense(3, name="head")(L.GlobalAveragePooling2D()(x)))
    x = np.random.default_rng(3).normal(size=(32, 9, 9, 8)).astype(np.float32)
    twin = keras.models.clone_model(model)
    twin.set_weights(model.get_weights())
    whole = stage.round_model(twin, [x], bits=4, per_channel=True, method=method)[0].layers[0]
    assert whole.reason is None
    monkeypatch.setattr(stage, "MAX_FAN_IN", 10)
    widths = []

    def spy(*args, **kwargs):
        H, G = moments(*args, **kwargs)
        widths.append(H.shape[1:])
        return H, G

    monkeypatch.setattr(stage, "moments", spy)
    report, _ = stage.round_model(model, [x], bits=4, per_channel=True, method=method)
    record = report.layers[0]
    assert record.layer == "grouped"
    assert record.reason.startswith("36 inputs per output, more than 10 ")
    assert "rounded on 4 blocks of at most 9 inputs" in record.reason
    assert max(w[0] for w in widths) == 10  # 9 inputs and the bias
    assert record.sqnr_db > record.sqnr_nearest_db
    assert record.sqnr_db == pytest.approx(whole.sqnr_db, abs=0.2)
