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

import keras
import numpy as np
import pytest
from conftest import (
    RTOL,
    assert_unchanged,
    max_rel_error,
    no_tflite_on_torch,
    randomize_biases,
    real_mobilenet_v2,
    weights_snapshot,
)

import cle
from cle import _qnoise, _scale_choice, cli
from cle._qnoise import ChainWeights, QuantTarget, chain_noise

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


@pytest.fixture(scope="module")
def spread_chain():
    """Spread enough that the defaults scale every set (modelled gains of about 3 to 5 dB,
    well clear of the 2 dB margin); wide pre-activations that clip at every junction, in
    float64 so that the check of exactness sees nothing but the rewrite."""
    return _chain(0.02, gain=30.0, dtype="float64")


@pytest.fixture(scope="module")
def margin_chain():
    """Spread so that, under the defaults, the first pair and the last triplet gain less than
    the margin (about 1.7 and 1.4 dB modelled) and the two sets between them more."""
    return _chain(0.1)


@pytest.fixture(scope="module")
def mild_chain():
    """Spread so little that the defaults scale nothing."""
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
        assert d.noise_change_db <= -_qnoise.MIN_GAIN_DB - 0.5, str(d)  # clear of the margin
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
    """Under the 2 dB margin the first pair and the last triplet are left (their best
    candidates gain about 1.7 and 1.4 dB); with no margin both are scaled, with a margin
    between their gains only the pair is. The model stays exact every time."""
    assert _qnoise.MIN_GAIN_DB == 2.0
    x = _big_inputs(margin_chain)
    new, report = cle.equalize_model(margin_chain, return_report=True)
    assert _pattern(report) == [False, True, True, False], [str(d) for d in report.scaling]
    for d in (report.scaling[0], report.scaling[3]):
        assert "2 dB the model can tell apart" in d.reason and d.noise_after == d.noise_before
    assert {la.name for la in new.layers if isinstance(la, cle.ClippedReLU)} == {
        "c2_relu", "dw1_relu", "c3_relu"}
    assert max_rel_error(margin_chain, new, x) <= RTOL

    monkeypatch.setattr(_qnoise, "MIN_GAIN_DB", 0.0)
    new0, report0 = cle.equalize_model(margin_chain, return_report=True)
    assert _pattern(report0) == [True] * 4
    gain_pair, gain_triplet = (-report0.scaling[k].noise_change_db for k in (0, 3))
    assert 0.5 < gain_triplet < gain_pair < 2.0, (gain_pair, gain_triplet)
    assert max_rel_error(margin_chain, new0, x) <= RTOL

    monkeypatch.setattr(_qnoise, "MIN_GAIN_DB", (gain_pair + gain_triplet) / 2)
    _, report_mid = cle.equalize_model(margin_chain, return_report=True)
    assert _pattern(report_mid) == [True, True, True, False]
    assert report_mid.scaling[0].noise_change_db == pytest.approx(-gain_pair)


# ---------------------------------------------------------------------------- target options


@pytest.fixture
def decide_spy(monkeypatch):
    """Records the target and the measured statistics every set decision receives."""
    seen = []
    real = _scale_choice.decide_set

    def spy(links, value, bn_stats, target, activation_stats=None):
        seen.append((target, activation_stats))
        return real(links, value, bn_stats, target, activation_stats)

    monkeypatch.setattr(_scale_choice, "decide_set", spy)
    return seen


def _calibration(model, n=8):
    return np.random.default_rng(5).normal(size=(n,) + tuple(model.inputs[0].shape[1:])).astype(
        "float32") * 3


# (option, chain, default pattern, pattern with the option): each option changes which sets
# the defaults scale on that chain, so an option that stopped reaching the choice shows.
OPTION_CASES = [
    ({"per_channel_weights": False}, "margin_chain", [False, True, True, False],
     [False, False, True, False]),
    ({"weight_bits": 4}, "margin_chain", [False, True, True, False], [False] * 4),
    ({"activation_bits": 4}, "mild_chain", [False] * 4, [False, True, True, False]),
    ({"activation_ranges": "calibration"}, "margin_chain", [False, True, True, False],
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


def test_target_options_reach_the_scale_choice_from_the_cli(margin_chain, decide_spy, tmp_path,
                                                            capsys):
    """`cle equalize --per-tensor --weight-bits N --activation-bits N --activation-ranges
    calibration` decides the sets as the API does with the same options."""
    src, out, rep = tmp_path / "in.keras", tmp_path / "out.keras", tmp_path / "r.json"
    margin_chain.save(src)
    data = _calibration(margin_chain)
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
        margin_chain, return_report=True, per_channel_weights=False, weight_bits=6,
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
