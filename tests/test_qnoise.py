"""The INT8 noise model of cle._math.noise against simulated quantization, and its choice rule."""

import numpy as np
import pytest

from cle._math import noise as _qnoise
from cle._math.noise import ChainWeights, QuantTarget, chain_noise, choose_scales


def _fake_quant_sym(w, bits, axis=None):
    q = 2 ** (bits - 1) - 1
    if axis is None:
        step = np.abs(w).max() / q
    else:
        step = np.abs(w).max(axis=axis, keepdims=True) / q
    return np.round(w / step) * step


def _fake_quant_act(x, bits, lo, hi):
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    step = (hi - lo) / (2 ** bits - 1)
    return np.clip(np.round((x - lo) / step) * step + lo, lo, hi)


def _simulate_pair(x, w1, b1, w2, s, target, cap):
    """Dense → ClippedReLU(cap / s) → Dense, scaled by ``s``, quantized as TFLite runs it: the
    fused RELU's output on the grid of the MINIMUM's calibrated output range (the converter
    gives both the same scale), the caps rounded to that grid; returns the noise power summed
    over outputs (mean over samples)."""
    w1s, b1s, w2s = w1 / s, b1 / s, w2 * s[:, None]
    y = x @ w1s + b1s
    post_ref = np.minimum(np.maximum(y, 0), cap / s)
    ref = post_ref @ w2s
    axis = 0 if target.per_channel else None
    yq = x @ _fake_quant_sym(w1s, target.weight_bits, axis) + b1s
    top = post_ref.max()
    step = top / (2 ** target.activation_bits - 1)
    pre_q = _fake_quant_act(np.maximum(yq, 0), target.activation_bits, 0.0, top)
    post_q = np.minimum(pre_q, np.round(cap / s / step) * step)
    out = post_q @ _fake_quant_sym(w2s, target.weight_bits, axis)
    return float(np.mean(np.sum((out - ref) ** 2, axis=1)))


def _pair_setup(seed=0, n=20000, c_in=16, c=12, c_out=10):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, c_in))
    # Channel ranges spread like folded BNs do.
    w1 = rng.normal(size=(c_in, c)) * rng.uniform(0.05, 1.0, size=c)
    b1 = rng.normal(size=c) * 0.5
    w2 = rng.normal(size=(c, c_out)) * rng.uniform(0.1, 1.0, size=(c, 1))
    return x, w1, b1, w2


def _model_pair(x, w1, b1, w2, cap):
    pre = x @ w1 + b1
    j = _qnoise.junction_from_samples(pre, "clipped", cap)
    w = ChainWeights(
        r_first=np.abs(w1).max(axis=0), g_first=float((x ** 2).mean() * x.shape[1]),
        r_last=np.abs(w2), sq_last=w2 ** 2, taps_last=1,
        p_first=((x @ w1) ** 2).mean(axis=0))
    return w, j


@pytest.mark.parametrize("per_channel", [True, False])
def test_modelled_noise_tracks_simulated_quantization(per_channel):
    """The model is a model: it must rank scalings as a real quantizer does and get the noise
    within a factor of two, on a pair whose simulation is exact arithmetic."""
    x, w1, b1, w2 = _pair_setup()
    cap = np.full(w1.shape[1], 6.0)
    target = QuantTarget(per_channel=per_channel, weight_bits=6, activation_bits=6)
    w, j = _model_pair(x, w1, b1, w2, cap)
    rng = np.random.default_rng(1)
    modelled, simulated = [], []
    for trial in range(6):
        s = np.exp(rng.normal(scale=0.8, size=w1.shape[1])) if trial else np.ones(w1.shape[1])
        # junction statistics are in unscaled units; the model divides by s itself
        modelled.append(chain_noise(w, [j], [s], target)[0])
        simulated.append(_simulate_pair(x, w1, b1, w2, s, target, cap))
    modelled, simulated = np.array(modelled), np.array(simulated)
    ratio = modelled / simulated
    assert np.all((ratio > 0.5) & (ratio < 2.0)), ratio
    # Same order: the model picks the scaling the simulation prefers.
    assert np.argmin(modelled) == np.argmin(simulated)


def test_per_channel_first_layer_noise_is_scale_invariant():
    x, w1, b1, w2 = _pair_setup(seed=2)
    w, j = _model_pair(x, w1, b1, w2, np.full(w1.shape[1], 6.0))
    s = np.exp(np.random.default_rng(3).normal(size=w1.shape[1]))
    ones = np.ones_like(s)
    pc = QuantTarget(per_channel=True)
    pt = QuantTarget(per_channel=False)
    a = chain_noise(w, [j], [ones], pc)[1]["weights_first"]
    b = chain_noise(w, [j], [s], pc)[1]["weights_first"]
    assert b == pytest.approx(a, rel=1e-12)
    assert chain_noise(w, [j], [s], pt)[1]["weights_first"] != pytest.approx(
        chain_noise(w, [j], [ones], pt)[1]["weights_first"], rel=1e-3)


def test_uniform_scaling_changes_nothing():
    """A common factor on every channel moves no range relative to its step."""
    x, w1, b1, w2 = _pair_setup(seed=4)
    w, j = _model_pair(x, w1, b1, w2, np.full(w1.shape[1], 6.0))
    s = np.exp(np.random.default_rng(5).normal(size=w1.shape[1]))
    for target in (QuantTarget(True), QuantTarget(False)):
        a = chain_noise(w, [j], [s], target)[0]
        b = chain_noise(w, [j], [s * 3.7], target)[0]
        assert b == pytest.approx(a, rel=1e-9)


def test_junction_from_bn_matches_monte_carlo():
    rng = np.random.default_rng(6)
    gamma, beta = rng.uniform(0.3, 2.0, 5), rng.normal(0, 2.0, 5)
    cap = 6.0
    j = _qnoise.junction_from_bn(gamma, beta, "relu6", cap, positions=1)
    y = rng.normal(beta, gamma, size=(400000, 5))
    post = np.clip(y, 0, cap)
    np.testing.assert_allclose(j.mean_sq, (post ** 2).mean(axis=0), rtol=0.02)
    np.testing.assert_allclose(j.positive, (y > 0).mean(axis=0), atol=0.005)
    np.testing.assert_allclose(j.passing, ((y > 0) & (y < cap)).mean(axis=0), atol=0.005)
    # The tail: where the max of `positions * ASSUMED_CALIBRATION_SAMPLES` Laplace draws with
    # standard deviation gamma lies (scale gamma / sqrt(2), P(X - beta > t) = exp(-t/b) / 2).
    n = _qnoise.ASSUMED_CALIBRATION_SAMPLES
    b = gamma / np.sqrt(2)
    t = b * np.log(n / 2)
    np.testing.assert_allclose(0.5 * np.exp(-t / b), 1.0 / n)
    # The range is uncertain per channel: hi, lo are the median (the tail times
    # exp(RANGE_LOG_BIAS)), the draws spread by RANGE_LOG_SPREAD in log around it.
    t_med = t * np.exp(_qnoise.RANGE_LOG_BIAS)
    np.testing.assert_allclose(j.hi, beta + t_med)
    np.testing.assert_allclose(j.lo, beta - t_med)
    assert j.hi_draws.shape == (_qnoise.RANGE_DRAWS, 5)
    logs = np.log((j.hi_draws - beta) / gamma)
    np.testing.assert_allclose(j.lo_draws, 2 * beta - j.hi_draws)
    assert abs(logs.mean() - np.log(t_med / gamma).mean()) < 0.1
    assert abs(logs.std(axis=0).mean() - _qnoise.RANGE_LOG_SPREAD) < 0.05


def test_uncertain_ranges_raise_the_expected_max_of_equalized_channels():
    """With uncertain per-channel ranges, channels made equal do not give the median's range:
    the per-tensor max is the largest of C uncertain values. One dominant channel is nearly
    certain (its own median, times e^(σ²/2) on average)."""
    c = 256
    j = _qnoise.junction_from_bn(np.ones(c), np.zeros(c), "relu", None, positions=196)
    equal, _ = _qnoise.tensor_range(j, np.ones(c))
    assert equal > 2.0 * j.hi.max()  # e^(0.4 · 2.7) ≈ 2.9 for the max of 256
    gamma = np.full(c, 0.01)
    gamma[0] = 1.0
    one = _qnoise.junction_from_bn(gamma, np.zeros(c), "relu", None, positions=196)
    dominant, _ = _qnoise.tensor_range(one, np.ones(c))
    assert dominant == pytest.approx(one.hi[0] * np.exp(_qnoise.RANGE_LOG_SPREAD ** 2 / 2),
                                     rel=0.15)


def test_choice_keeps_identity_when_nothing_to_gain():
    """Channels that are all alike: no scaling can lower the noise, the set stays."""
    c = 8
    w = ChainWeights(r_first=np.ones(c), g_first=1.0, r_last=np.ones((c, 4)),
                     sq_last=np.ones((c, 4)), taps_last=1)
    j = _qnoise.junction_from_bn(np.ones(c), np.full(c, 1.0), "relu6", 6.0, positions=100)
    choice = choose_scales(w, [j], QuantTarget(per_channel=False))
    assert choice.alpha is None and choice.noise_after == choice.noise_before
    for s in choice.scales:
        np.testing.assert_array_equal(s, 1.0)


def _spread_chain(rng, c, low, g_first, top=1.0):
    """``(ChainWeights, r_first)`` of a pair whose first layer's channel ranges spread
    log-uniformly over ``[low, top]`` (the last layer's weights random, 8 outputs)."""
    r1 = np.exp(rng.uniform(np.log(low), np.log(top), c))
    r_last = np.abs(rng.normal(size=(c, 8))) * 0.1
    return ChainWeights(r_first=r1, g_first=g_first, r_last=r_last, sq_last=3 * r_last ** 2,
                        taps_last=9), r1


def test_choice_lowers_per_tensor_noise_of_spread_weights():
    """Weight ranges spread over 100x on one side, per-tensor weights: scaling must help, and
    the chosen scales must be modelled better than Nagel's weight equalization or equal."""
    rng = np.random.default_rng(7)
    c = 16
    w, r1 = _spread_chain(rng, c, 0.01, 1000.0)
    # Activations alike on every channel: the first layer's per-tensor weight noise dominates.
    j = _qnoise.junction_from_bn(np.ones(c), np.ones(c), "relu", None, positions=196)
    target = QuantTarget(per_channel=False)
    nagel = [np.sqrt(r1 / w.r_last.max(axis=1))]
    choice = choose_scales(w, [j], target, extra=[nagel])
    # Scaling trades the first layer's noise against the last layer's: a clear gain, not a
    # free lunch (0.79 of the noise here; Nagel's scales give 1.5x, blind to the last layer).
    assert choice.noise_after < 0.85 * choice.noise_before
    assert choice.noise_after <= chain_noise(w, [j], nagel, target)[0]


@pytest.mark.parametrize("per_channel", [True, False])
def test_float32_last_layer_arrays_change_nothing_that_matters(per_channel):
    """The library passes the last layer's (C, O) arrays in float32 (one pass per candidate
    over half the bytes): every candidate's modelled noise agrees with float64 arrays to 1e-6,
    and the choice is the same."""
    rng = np.random.default_rng(11)
    c, o = 48, 40
    w1 = rng.normal(size=(9 * 16, c)) * rng.uniform(0.02, 1.0, size=c)
    w2 = rng.normal(size=(9, c, o)) * rng.uniform(0.05, 1.0, size=(c, 1))
    w2[:, 3] *= 1e-4  # a nearly dead input channel: the min(step, own power) bound binds
    r64, sq64 = np.abs(w2).max(axis=0), (w2 ** 2).sum(axis=0)
    common = dict(r_first=np.abs(w1).max(axis=0), g_first=float(w1.shape[0]), taps_last=9,
                  p_first=(w1 ** 2).sum(axis=0))
    w64 = ChainWeights(r_last=r64, sq_last=sq64, **common)
    w32 = ChainWeights(r_last=r64.astype(np.float32), sq_last=sq64.astype(np.float32), **common)
    j = _qnoise.junction_from_bn(rng.uniform(0.2, 3, c), rng.normal(0, 1, c), "relu6", 6.0,
                                 positions=196)
    target = QuantTarget(per_channel=per_channel)
    for trial in range(5):
        s = np.exp(rng.normal(scale=0.7, size=c)) if trial else np.ones(c)
        a, pa = chain_noise(w64, [j], [s], target)
        b, pb = chain_noise(w32, [j], [s], target)
        assert b == pytest.approx(a, rel=1e-6)
        assert pb["weights_last"] == pytest.approx(pa["weights_last"], rel=1e-6)
    c64, c32 = choose_scales(w64, [j], target), choose_scales(w32, [j], target)
    assert (c32.alpha, c32.lam) == (c64.alpha, c64.lam)
    assert c32.noise_after == pytest.approx(c64.noise_after, rel=1e-6)


@pytest.mark.parametrize("per_channel", [True, False])
def test_one_tap_layers_need_no_sum_of_squares_array(per_channel):
    """Dense and 1×1 convolutions pass ``sq_last=None`` (SQ = R², one array less); the noise,
    computed in blocks of rows, is the one the explicit array gives, on a set large enough to
    span several blocks."""
    rng = np.random.default_rng(12)
    c, o = 300, 700  # > 1 << 16 elements: several row blocks
    r = (np.abs(rng.normal(size=(c, o))) * rng.uniform(1e-5, 1.0, size=(c, 1))).astype(np.float32)
    common = dict(r_first=rng.uniform(0.1, 2, c), g_first=100.0, taps_last=1)
    implicit = ChainWeights(r_last=r, sq_last=None, **common)
    explicit = ChainWeights(r_last=r, sq_last=np.square(r), **common)
    j = _qnoise.junction_from_bn(rng.uniform(0.2, 3, c), rng.normal(0, 1, c), "relu", None,
                                 positions=49)
    target = QuantTarget(per_channel=per_channel)
    np.testing.assert_array_equal(implicit.q_last, explicit.q_last)
    for trial in range(3):
        s = np.exp(rng.normal(scale=0.7, size=c)) if trial else np.ones(c)
        a = chain_noise(implicit, [j], [s], target)[1]["weights_last"]
        b = chain_noise(explicit, [j], [s], target)[1]["weights_last"]
        assert a == b
        # and it is the plain whole-array expression
        dl = (r * s[:, None]).max(axis=0) / target.qw
        if not per_channel:
            dl[:] = dl.max()
        plain = (j.mean_sq[:, None] / s[:, None] ** 2
                 * np.minimum(dl[None, :] ** 2 / 12, r.astype(np.float64) ** 2 * s[:, None] ** 2))
        assert a == pytest.approx(plain.sum(), rel=1e-6)


def test_triplet_balanced_logs_reduce_to_nagel_at_alpha_zero():
    rng = np.random.default_rng(8)
    c = 6
    w = ChainWeights(r_first=rng.uniform(0.1, 2, c), g_first=1.0,
                     r_last=rng.uniform(0.1, 2, (c, 5)), sq_last=np.ones((c, 5)), taps_last=1,
                     r_mid=rng.uniform(0.1, 2, c), d_mid=np.ones(c), taps_mid=9)
    js = [_qnoise.junction_from_bn(np.ones(c), np.zeros(c), "relu", None)] * 2
    l12, l23 = _qnoise._balanced_logs(w, js, 0.0)
    from cle._math.equalization import triplet_scale
    s12, s23 = triplet_scale(w.r_first, w.r_mid, w.r_last.max(axis=1))
    np.testing.assert_allclose(np.exp(l12), s12, rtol=1e-10)
    np.testing.assert_allclose(np.exp(l23), s23, rtol=1e-10)


def test_tflite_quantizes_a_clipped_relu_on_one_grid():
    """The model's premise for capped junctions: TFLite fuses the ClippedReLU's RELU into the
    conv and gives the conv's output the MINIMUM's own scale (the calibrated range of the
    capped output), so a ClippedReLU costs no extra, wider INT8 tensor. If a converter
    release changes this, the noise model must change with it."""
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "tensorflow":
        pytest.skip("TFLite conversion needs the TensorFlow backend")
    import cle
    from cle._tflite import runtime
    from cle import quantization as q

    inp = keras.Input((8, 8, 4))
    x = keras.layers.Conv2D(4, 3, padding="same")(inp)
    x = cle.ClippedReLU(np.array([1.0, 2.0, 4.0, 6.0]))(x)
    out = keras.layers.Conv2D(3, 1)(x)
    model = keras.Model(inp, out)
    xs = np.random.default_rng(0).normal(size=(8, 8, 8, 4)).astype("float32") * 4
    content = q.convert_to_tflite_int8(model, xs)
    interp = runtime.interpreter(content)
    ops = {op["op_name"]: op for op in interp._get_ops_details()}
    assert "MINIMUM" in ops
    details = {d["index"]: d for d in interp.get_tensor_details()}
    minimum = ops["MINIMUM"]
    relu_out = details[minimum["inputs"][0]]
    cap_out = details[minimum["outputs"][0]]
    assert relu_out["quantization"] == cap_out["quantization"]
    # and that grid spans the capped range [0, 6], not the uncapped conv output
    scale, zero = cap_out["quantization"]
    assert scale * (127 - zero) == pytest.approx(6.0, rel=1e-3)


def test_a_channel_silent_on_the_calibration_data_keeps_scale_one():
    """A ReLU channel that never fired on the calibration data measures a range of 0; the
    balance of log-ranges then amplified it without bound (a hundred-thousandfold, its
    activation weight dominating), and the one input in many that fired it set the tensor's
    range: a small classifier's file read 5 dB against the plain converter's 42 (a failure
    hunt). Its scale is 1; the other channels are scaled as before."""
    rng = np.random.default_rng(3)
    c = 16
    w, _ = _spread_chain(rng, c, 0.05, 1.0, top=0.5)
    hi = np.exp(rng.uniform(np.log(0.05), np.log(2.0), c))
    hi[5] = 0.0  # silent: never above 0 on the data
    j = _qnoise.Junction(hi=hi, lo=-hi, kind="relu", cap=None, mean_sq=(hi / 3) ** 2,
                         passing=np.where(hi > 0, 0.5, 0.0), positive=np.where(hi > 0, 0.5, 0.0))
    # the premise: the balance alone puts that channel's scale off by orders of magnitude
    logs = _qnoise._balanced_logs(w, [j], 0.75)[0]
    assert abs(logs[5]) > 10 * np.median(np.abs(logs))
    choice = choose_scales(w, [j], QuantTarget(per_channel=False))
    (scales,) = choice.scales
    assert scales[5] == 1.0
    assert choice.alpha is not None and not np.allclose(np.delete(scales, 5), 1.0)
