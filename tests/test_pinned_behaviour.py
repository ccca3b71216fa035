"""Pins of the default path of ``equalize_model()`` (issue #20, part 1), before any code moves.

Each test would catch a silent change of what the defaults do, without the real weights:

* a synthetic chain whose BN statistics make the default objective scale pairs *and* triplets,
  checked for exactness with inputs large enough that the caps ``6/s`` of the ClippedReLUs clip;
* the do-no-harm margin flipping sets between scaled and left;
* the noise model against a simulated quantizer, for pairs and triplets, to a tight ratio;
* the target options (``per_channel_weights``, ``weight_bits``, ``activation_bits``,
  ``activation_ranges``) reaching the scale choice, from the API and from the CLI;
* (slow) do no harm on the real MobileNetV2 through TFLite.
"""

import json
import sys

import keras
import numpy as np
import pytest
from conftest import (
    RTOL,
    WEIGHTS_SKIP_REASON,
    assert_unchanged,
    max_rel_error,
    no_tflite_on_torch,
    randomize_biases,
    real_mobilenet_v2,
    require_mobilenet_weights,
    require_weights_package,
    weights_snapshot,
)

import cle
from cle import cli
from cle._math import noise as _qnoise
from cle._transforms import scale_choice
from cle._math.noise import ChainWeights, QuantTarget, chain_noise

L = keras.layers

# ---------------------------------------------------------------------------- a synthetic chain

# c1 -> c2 (pair), c2 -> dw1 -> c3 (triplet), c3 -> c4 (pair), c4 -> dw2 -> head (triplet).
SETS = [("c1", "c2"), ("c2", "dw1", "c3"), ("c3", "c4"), ("c4", "dw2", "head")]


def _chain(gamma_low, gain=1.0, dtype="float32", seed=0):
    """Conv/depthwise chain with a ReLU6 after every BN; every BN has random statistics and a
    γ spread log-uniformly over [gamma_low, 1] (per-channel activation ranges spread that
    much: the lower ``gamma_low``, the more the default objective gains from scaling).
    ``gain`` multiplies the kernels of the layers between c1 and the head (their BNs' moving
    variance unchanged: pre-activations that much wider, so the ReLU6 deep in the chain clip
    too)."""
    keras.utils.set_random_seed(seed)
    f64 = {"dtype": dtype}
    inp = keras.Input((12, 12, 6), dtype=dtype)

    def bn_relu6(x, name):
        x = L.BatchNormalization(name=f"{name}_bn", **f64)(x)
        return L.ReLU(6.0, name=f"{name}_relu", **f64)(x)

    x = bn_relu6(L.Conv2D(16, 3, padding="same", name="c1", **f64)(inp), "c1")
    x = bn_relu6(L.Conv2D(24, 1, name="c2", **f64)(x), "c2")
    x = bn_relu6(L.DepthwiseConv2D(3, padding="same", name="dw1", **f64)(x), "dw1")
    x = bn_relu6(L.Conv2D(16, 1, name="c3", **f64)(x), "c3")
    x = bn_relu6(L.Conv2D(24, 1, name="c4", **f64)(x), "c4")
    x = bn_relu6(L.DepthwiseConv2D(3, padding="same", name="dw2", **f64)(x), "dw2")
    model = keras.Model(inp, L.Conv2D(10, 1, name="head", **f64)(x))
    rng = np.random.default_rng(seed)
    for bn in model.layers:
        if hasattr(bn, "kernel"):  # numpy draws: the same chain on every backend
            shape = tuple(bn.kernel.shape)
            taps = int(np.prod(shape[:-2]))
            lim = np.sqrt(6.0 / (taps * (shape[-2] + shape[-1])))
            bn.kernel.assign(rng.uniform(-lim, lim, shape).astype(dtype))
        if isinstance(bn, L.BatchNormalization):
            c = bn.moving_mean.shape[0]
            gamma = np.exp(rng.uniform(np.log(gamma_low), 0.0, c)) * rng.choice([-1.0, 1.0], c)
            bn.gamma.assign(gamma)
            bn.beta.assign(rng.normal(0.0, 0.3, c) * np.abs(gamma))
            bn.moving_mean.assign(rng.normal(0.0, 0.5, c))
            bn.moving_variance.assign(rng.uniform(0.2, 3.0, c))
        elif bn.name not in ("head", "c1") and hasattr(bn, "kernel"):
            bn.kernel.assign(bn.kernel * gain)
    return randomize_biases(model, scale=0.2)


@pytest.fixture(scope="module", autouse=True)
def _float64_on_jax():
    """JAX computes float64 only with x64 enabled (it truncates to float32 otherwise); the
    spread chain is a float64 model."""
    if keras.backend.backend() != "jax":
        yield
        return
    import jax

    with jax.enable_x64(True):
        yield


@pytest.fixture(scope="module")
def spread_chain():
    """Spread enough that the defaults scale every set (modelled gains of about 2.4 to 7 dB,
    clear of the 2 dB margin); wide pre-activations that clip at every junction, in float64
    so that the check of exactness sees nothing but the rewrite."""
    return _chain(0.01, gain=30.0, dtype="float64")


@pytest.fixture(scope="module")
def options_chain():
    """Spread so that the defaults scale three sets of four, the first one not (modelled gain
    below the margin)."""
    return _chain(0.05)


@pytest.fixture(scope="module")
def margin_chain():
    """Spread so little that every set's best candidate gains less than the margin (about 1
    to 1.6 dB modelled): the defaults scale nothing."""
    return _chain(0.15)


def _pattern(report):
    return [d.scaled for d in report.scaling]


def _big_inputs(model, batch=4, scale=10.0, seed=3):
    """Inputs large enough that ReLU6 pre-activations exceed 6 on many positions."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch,) + tuple(model.inputs[0].shape[1:])) * scale
    return x.astype(model.inputs[0].dtype)


def _clipped_inputs(model, names, x):
    """The input of each named layer of ``model`` on ``x`` (numpy, channels last)."""
    probe = keras.Model(model.inputs[0], [model.get_layer(n).input for n in names])
    outs = probe(x, training=False)
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    return [keras.ops.convert_to_numpy(o).astype(np.float64) for o in outs]


def test_default_scales_pairs_and_triplets_exactly_through_clipping_caps(spread_chain):
    """The defaults scale both pairs and both triplets; every ReLU6 on them becomes a
    ClippedReLU with caps exactly 6/s; with inputs that drive those caps (a large share of the
    channels whose scale is far from 1 clip), the model computes what it computed."""
    model = spread_chain
    snap, names = weights_snapshot(model), [la.name for la in model._flatten_layers()]
    new, report = cle.equalize_model(model, return_report=True)
    assert report.objective == "quantized"
    assert [d.layers for d in report.scaling] == SETS
    assert _pattern(report) == [True] * 4, [str(d) for d in report.scaling]
    for d in report.scaling:
        assert d.noise_change_db <= -_qnoise.MIN_GAIN_DB - 0.25, str(d)  # clear of the margin
        assert len(d.scales) == len(d.layers) - 1
    # The caps are 6/s, junction by junction (the ReLU6 after layer k of the set).
    junctions = [(f"{d.layers[k]}_relu", s) for d in report.scaling for k, s in enumerate(d.scales)]
    assert len(junctions) == 6
    clipped = {la.name for la in new.layers if isinstance(la, cle.ClippedReLU)}
    assert clipped == {name for name, _ in junctions}
    for name, s in junctions:
        assert np.ptp(np.log(s)) > 1.0, name  # scales far from uniform: caps far from 6
        caps = keras.ops.convert_to_numpy(new.get_layer(name).caps).astype(np.float64)
        np.testing.assert_allclose(caps, 6.0 / s, rtol=1e-12, err_msg=name)
    # The caps are driven: in the equalized model, the input of every ClippedReLU exceeds its
    # cap on many positions of the channels whose scale moved most.
    x, driven = _big_inputs(model), 0
    for (name, s), pre in zip(junctions, _clipped_inputs(new, [n for n, _ in junctions], x)):
        caps = 6.0 / s
        moved = np.abs(np.log(s)) > 0.5
        assert moved.sum() >= 5, name
        above = (pre[..., moved] > caps[moved]).mean(axis=(0, 1, 2))
        assert (above > 0.05).sum() >= 1, (name, above)
        driven += (above > 0.05).sum()
    assert driven >= 20
    assert max_rel_error(model, new, x) <= RTOL
    assert max_rel_error(model, new, x / 10.0) <= RTOL
    assert_unchanged(model, snap, names)
    # Applied as decided.
    for info, d in zip(report.sets, report.scaling):
        for pair, s in zip(info.cls_pair_info_list, d.scales):
            np.testing.assert_allclose(pair.scale_factor, s)


def test_per_tensor_default_is_exact_too(spread_chain):
    new, report = cle.equalize_model(spread_chain, per_channel_weights=False, return_report=True)
    assert sum(_pattern(report)) >= 2
    x = _big_inputs(spread_chain)
    assert max_rel_error(spread_chain, new, x) <= RTOL


def test_the_margin_flips_sets_between_scaled_and_left(margin_chain, monkeypatch):
    """Under the 2 dB margin every set of this chain is left (their best candidates gain
    about 1 to 1.6 dB); with no margin every one is scaled; a margin just above or just below
    the first set's gain (the first set's gain does not depend on the others) flips it. The
    model stays exact every time."""
    assert _qnoise.MIN_GAIN_DB == 2.0
    x = _big_inputs(margin_chain)
    new, report = cle.equalize_model(margin_chain, return_report=True)
    assert _pattern(report) == [False] * 4, [str(d) for d in report.scaling]
    for d in report.scaling:
        assert "2 dB the model can tell apart" in d.reason and d.noise_after == d.noise_before
    assert not [la for la in new.layers if isinstance(la, cle.ClippedReLU)]
    assert max_rel_error(margin_chain, new, x) <= RTOL

    monkeypatch.setattr(_qnoise, "MIN_GAIN_DB", 0.0)
    new0, report0 = cle.equalize_model(margin_chain, return_report=True)
    assert _pattern(report0) == [True] * 4
    gains = [-d.noise_change_db for d in report0.scaling]
    assert all(0.5 < g < 2.0 for g in gains), gains
    assert len([la for la in new0.layers if isinstance(la, cle.ClippedReLU)]) == 6
    assert max_rel_error(margin_chain, new0, x) <= RTOL

    for margin, scaled in ((gains[0] - 0.05, True), (gains[0] + 0.05, False)):
        monkeypatch.setattr(_qnoise, "MIN_GAIN_DB", margin)
        _, report_at = cle.equalize_model(margin_chain, return_report=True)
        assert report_at.scaling[0].scaled is scaled, (margin, str(report_at.scaling[0]))
        if scaled:
            assert report_at.scaling[0].noise_change_db == pytest.approx(-gains[0])


# ---------------------------------------------------------------------------- target options


@pytest.fixture
def decide_spy(monkeypatch):
    """Records the target and the measured statistics every set decision receives."""
    seen = []
    real = scale_choice.decide_set

    def spy(links, value, bn_stats, target, activation_stats=None):
        seen.append((target, activation_stats))
        return real(links, value, bn_stats, target, activation_stats)

    monkeypatch.setattr(scale_choice, "decide_set", spy)
    return seen


def _calibration(model, n=8):
    return np.random.default_rng(5).normal(size=(n,) + tuple(model.inputs[0].shape[1:])).astype(
        "float32") * 3


# (option, chain, default pattern, pattern with the option): each option changes which sets
# the defaults scale on that chain, so an option that stopped reaching the choice shows.
OPTION_CASES = [
    ({"per_channel_weights": False}, "options_chain", [False, True, True, True], [True] * 4),
    ({"weight_bits": 4}, "options_chain", [False, True, True, True], [False] * 4),
    ({"activation_bits": 4}, "margin_chain", [False] * 4, [False, False, True, False]),
    ({"activation_ranges": "calibration"}, "options_chain", [False, True, True, True],
     [True, False, False, False]),
]


@pytest.mark.parametrize("option, chain, default, expected", OPTION_CASES,
                         ids=[next(iter(c[0])) for c in OPTION_CASES])
def test_target_options_reach_the_scale_choice(request, decide_spy, option, chain, default,
                                               expected):
    model = request.getfixturevalue(chain)
    _, report = cle.equalize_model(model, return_report=True)
    assert _pattern(report) == default
    assert all(t == QuantTarget() and a is None for t, a in decide_spy)
    decide_spy.clear()
    kwargs = dict(option)
    if kwargs.get("activation_ranges") == "calibration":
        kwargs["calibration_data"] = _calibration(model)
    new, report = cle.equalize_model(model, return_report=True, **kwargs)
    assert _pattern(report) == expected, [str(d) for d in report.scaling]
    assert len(decide_spy) == 4
    want = QuantTarget(option.get("per_channel_weights", True), option.get("weight_bits", 8),
                       option.get("activation_bits", 8))
    for target, measured in decide_spy:
        assert target == want
        if "activation_ranges" in option:
            assert measured is not None and len(measured) == 6  # every junction measured
        else:
            assert measured is None
    assert max_rel_error(model, new, _big_inputs(model)) <= RTOL


def test_target_options_reach_the_scale_choice_from_the_cli(options_chain, decide_spy,
                                                            tmp_path, capsys):
    """`cle equalize --per-tensor --weight-bits N --activation-bits N --activation-ranges
    calibration` decides the sets as the API does with the same options."""
    src, out, rep = tmp_path / "in.keras", tmp_path / "out.keras", tmp_path / "r.json"
    options_chain.save(src)
    data = _calibration(options_chain)
    np.save(tmp_path / "calib.npy", data)
    code = cli.main([str(a) for a in (
        "equalize", src, "-o", out, "--report", rep, "--per-tensor", "--weight-bits", 6,
        "--activation-bits", 7, "--activation-ranges", "calibration",
        "--calibration", tmp_path / "calib.npy")])
    assert code == 0, capsys.readouterr().err
    assert len(decide_spy) == 4
    for target, measured in decide_spy:
        assert target == QuantTarget(per_channel=False, weight_bits=6, activation_bits=7)
        assert measured is not None and len(measured) == 6
    _, expected = cle.equalize_model(
        options_chain, return_report=True, per_channel_weights=False, weight_bits=6,
        activation_bits=7, activation_ranges="calibration", calibration_data=data)
    got = json.loads(rep.read_text())["scaling"]
    assert got == json.loads(json.dumps([d.to_dict() for d in expected.scaling]))
    # ... and differently from the defaults (so the options changed something).
    decide_spy.clear()
    assert cli.main([str(a) for a in ("equalize", src, "-o", tmp_path / "d.keras", "--report",
                                      tmp_path / "d.json")]) == 0
    assert all(t == QuantTarget() and a is None for t, a in decide_spy)
    default = json.loads((tmp_path / "d.json").read_text())["scaling"]
    assert [d["scaled"] for d in default] != [d["scaled"] for d in got] or [
        d["noise_before"] for d in default] != [d["noise_before"] for d in got]


# ---------------------------------------------------------------------------- noise model


def _quant_sym(w, bits, per_channel):
    """Symmetric weight quantization, per tensor or per output channel (the last axis)."""
    q = 2 ** (bits - 1) - 1
    axes = tuple(range(w.ndim - 1))
    step = np.abs(w).max(axis=axes if per_channel else None, keepdims=per_channel) / q
    return np.round(w / step) * step


def _quant_capped(y, cap, top, bits):
    """A ReLU fused into its producer and a MINIMUM against ``cap``, quantized as TFLite runs a
    ClippedReLU: one asymmetric grid from 0 to the calibrated top of the capped output, the
    caps rounded to it."""
    step = top / (2 ** bits - 1)
    pre = np.clip(np.round(np.maximum(y, 0.0) / step) * step, 0.0, top)
    return np.minimum(pre, np.round(cap / step) * step)


def _dw(a, d):
    """Depthwise 1-D convolution ('valid') of ``a`` (n, T, C) with taps ``d`` (K, C)."""
    k = d.shape[0]
    return sum(a[:, i: i + a.shape[1] - k + 1] * d[i] for i in range(k))


def _random_chain(kind, seed=0, n=1500, t=8, c_in=32, c=48, c_out=48, taps=3):
    """Weights of a pair (dense → ClippedReLU → dense) or a triplet (dense → ClippedReLU →
    depthwise → ClippedReLU → dense) over sequences, channel ranges spread like folded BNs'."""
    rng = np.random.default_rng(seed)
    net = {
        "x": rng.normal(size=(n, t, c_in)),
        "w1": rng.normal(size=(c_in, c)) * rng.uniform(0.05, 1.0, size=c),
        "b1": rng.normal(size=c) * 0.5,
        "w3": rng.normal(size=(c, c_out)) * rng.uniform(0.1, 1.0, size=(c, 1)),
    }
    if kind == "triplet":
        net["d"] = rng.normal(size=(taps, c)) * rng.uniform(0.1, 1.5, size=c)
        net["bd"] = rng.normal(size=c) * 0.3
    return net


def _simulate(net, scales, target, cap=6.0):
    """Noise power at the output (summed over outputs, mean over samples) of the chain scaled
    by ``scales`` and quantized as TFLite runs it, against the same chain unquantized."""
    x, w1, b1, w3 = net["x"], net["w1"], net["b1"], net["w3"]
    wb, ab, pc = target.weight_bits, target.activation_bits, target.per_channel
    s1, s_last = scales[0], scales[-1]
    c1 = cap / s1
    a1 = np.minimum(np.maximum(x @ (w1 / s1) + b1 / s1, 0.0), c1)
    a1q = _quant_capped(x @ _quant_sym(w1 / s1, wb, pc) + b1 / s1, c1, a1.max(), ab)
    if "d" in net:
        s2 = scales[1]
        ds, bds, c2 = net["d"] * s1 / s2, net["bd"] / s2, cap / s2
        a_last = np.minimum(np.maximum(_dw(a1, ds) + bds, 0.0), c2)
        a_last_q = _quant_capped(_dw(a1q, _quant_sym(ds, wb, pc)) + bds, c2, a_last.max(), ab)
    else:
        a_last, a_last_q = a1, a1q
    w3s = w3 * s_last[:, None]
    err = a_last_q @ _quant_sym(w3s, wb, pc) - a_last @ w3s
    return float(np.mean(np.sum(err ** 2, axis=-1)))


def _modelled(net, cap=6.0):
    """The library's model of the chain: ChainWeights and junctions measured on its samples
    (unscaled units; chain_noise divides by the scales itself)."""
    x, w1, b1, w3 = net["x"], net["w1"], net["b1"], net["w3"]
    c = w1.shape[1]
    caps = np.full(c, cap)
    y1 = x @ w1 + b1
    junctions = [_qnoise.junction_from_samples(y1.reshape(-1, c), "clipped", caps)]
    mid = {}
    if "d" in net:
        d = net["d"]
        y2 = _dw(np.minimum(np.maximum(y1, 0.0), caps), d) + net["bd"]
        junctions.append(_qnoise.junction_from_samples(y2.reshape(-1, c), "clipped", caps))
        mid = {"r_mid": np.abs(d).max(axis=0), "d_mid": (d ** 2).sum(axis=0),
               "taps_mid": d.shape[0]}
    w = ChainWeights(r_first=np.abs(w1).max(axis=0), g_first=float((x ** 2).mean() * x.shape[-1]),
                     r_last=np.abs(w3), sq_last=w3 ** 2, taps_last=1,
                     p_first=((x @ w1) ** 2).reshape(-1, c).mean(axis=0), **mid)
    return w, junctions


# The decision the model drives is a 2 dB margin; the model must be tighter than that.
NOISE_DB_TOLERANCE = 1.5

PER_TENSOR_TRIPLET_XFAIL = pytest.mark.xfail(strict=True, reason=(
    "known limitation of the noise model: with per-tensor weights the model over-predicts the "
    "depthwise weights' noise of a triplet whose scaled depthwise ranges are spread (its "
    "depthwise term alone by up to 4 dB on this chain, the total by 2.5 dB at 8 bits). Bounding "
    "each depthwise channel by its own power (as the last layer's weights are) brings it to "
    "1.8 dB at 8 bits and 2.0 at 6, still over the tolerance; that bound never binds with "
    "per-channel weights, so a fix changes only per-tensor targets' decisions. Open"))


@pytest.mark.parametrize("bits", [8, 6])
@pytest.mark.parametrize("per_channel", [True, False], ids=["per_channel", "per_tensor"])
@pytest.mark.parametrize("kind", ["pair", "triplet"])
def test_noise_model_matches_a_simulated_quantizer(kind, per_channel, bits, request):
    """Identity and five random scalings (log-normal, σ = 0.8) of each junction: the modelled
    noise is within NOISE_DB_TOLERANCE of the simulated one, and both pick the same scaling."""
    if kind == "triplet" and not per_channel:
        request.applymarker(PER_TENSOR_TRIPLET_XFAIL)
    net = _random_chain(kind)
    w, junctions = _modelled(net)
    target = QuantTarget(per_channel=per_channel, weight_bits=bits, activation_bits=bits)
    c = net["w1"].shape[1]
    rng = np.random.default_rng(1)
    modelled, simulated = [], []
    for trial in range(6):
        scales = [np.exp(rng.normal(scale=0.8, size=c)) if trial else np.ones(c)
                  for _ in junctions]
        modelled.append(chain_noise(w, junctions, scales, target)[0])
        simulated.append(_simulate(net, scales, target))
    db = 10 * np.log10(np.array(modelled) / np.array(simulated))
    assert np.all(np.abs(db) <= NOISE_DB_TOLERANCE), np.round(db, 2)
    assert np.argmin(modelled) == np.argmin(simulated)


# ---------------------------------------------------------------------------- real network


@pytest.mark.parametrize("ci, fails", [("true", True), ("1", True), ("false", False),
                                       (None, False)])
def test_missing_weights_fail_in_ci_and_skip_locally(monkeypatch, ci, fails):
    """Under CI=true a missing real-weights package fails the test that needs it (a CI run
    would otherwise pass having pinned nothing of the real networks); locally it skips."""
    from cle import pretrained

    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    monkeypatch.setitem(sys.modules, pretrained.WEIGHTS_PACKAGE, None)
    monkeypatch.setitem(sys.modules, pretrained.LITE1_WEIGHTS_PACKAGE, None)
    expected = pytest.fail.Exception if fails else pytest.skip.Exception
    for helper in (require_mobilenet_weights, real_mobilenet_v2,
                   lambda: require_weights_package(pretrained.LITE1_WEIGHTS_PACKAGE, "Lite1")):
        with pytest.raises(expected) as info:
            helper()
        if helper is not require_mobilenet_weights or not fails:
            continue
        assert WEIGHTS_SKIP_REASON in str(info.value) and "CI=true" in str(info.value)


# Do no harm, judged on both figures (a logit SQNR alone can mislead): per-channel INT8 after
# equalize_model() may trail BN folding only by at most this much. The same 128 photo crops and
# the same 32 calibration inputs for both models, so what differs is the rewrite; the margins
# cover the spread of one calibration set to the next (docs/quantization_aware_scaling.md).
DO_NO_HARM_AGREEMENT = 0.02  # top-1 agreement, absolute (under 3 of 128 crops)
DO_NO_HARM_SQNR_DB = 0.25


@pytest.mark.slow
@no_tflite_on_torch
def test_defaults_do_no_harm_on_real_mobilenet_v2_through_tflite():
    from cle import pretrained, quantization

    model = real_mobilenet_v2()
    x = pretrained.preprocess_imagenet(pretrained.sample_images(n=128, seed=1))
    y_ref = keras.ops.convert_to_numpy(model.predict(x, batch_size=32, verbose=0))
    _, folded = cle.fold_all_batch_norms(model)
    equalized, report = cle.equalize_model(model, return_report=True)
    assert 0 < sum(_pattern(report)) < len(report.scaling)  # the margin leaves most sets

    def per_channel_int8(m):
        y = quantization.run_tflite(quantization.convert_to_tflite_int8(m, x[:32]), x,
                                    batch_size=32)
        return quantization.top1_agreement(y_ref, y), quantization.sqnr_db(y_ref, y)

    fold_agree, fold_sqnr = per_channel_int8(folded)
    eq_agree, eq_sqnr = per_channel_int8(equalized)
    msg = (f"BN folding only {fold_agree:.3f} / {fold_sqnr:.2f} dB, equalize_model() "
           f"{eq_agree:.3f} / {eq_sqnr:.2f} dB")
    assert eq_agree >= fold_agree - DO_NO_HARM_AGREEMENT, msg
    assert eq_sqnr >= fold_sqnr - DO_NO_HARM_SQNR_DB, msg
    print(msg)


# ---------------------------------------------------------------------------- house-keeping


def test_the_version_has_one_source():
    """pyproject.toml reads the version from cle.__version__ rather than repeating it."""
    import os

    tomllib = pytest.importorskip("tomllib")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "cle.__version__"}
    assert isinstance(cle.__version__, str) and cle.__version__
