"""The clipping new inputs are expected to add on a value output
(:func:`cle._quantize.ranges.expected_clipping`): how the choice weighs it and how the check's
interval states it. A regression head's SQNR is ruled by the few inputs beyond the calibrated
range, which a few dozen calibration inputs seldom hold: the cross-fitted figure alone cannot
see them."""

import math

import keras
import numpy as np
import pytest

from cle._measure import check as C
from cle._quantize import choice as _choice
from cle._quantize import ranges as R
from cle._quantize.pool_spread import POOL_SPREAD, SPREAD, spread_ranges

from conftest import no_tflite_on_torch

L = keras.layers


@pytest.mark.parametrize("bound", [4.0, 6.0, 9.0])
def test_the_expected_excess_is_the_gumbel_laws_own(bound):
    """On a large Gumbel sample the fitted law's E[(Y - bound)²; Y > bound] is the sample's
    mean squared excess (the law and its fit are right), within a few percent."""
    y = np.random.default_rng(0).gumbel(3.0, 1.5, size=400_000)
    empirical = np.mean(np.clip(y - bound, 0, None) ** 2)
    assert R.clipping_noise(-1.0, bound, -np.ones_like(y), y) == pytest.approx(empirical, rel=0.05)


def test_a_side_at_zero_clips_nothing_and_both_sides_add():
    """An 8-bit range holds 0: a positive output's lower side and a ReLU's clip nothing;
    a signed tensor clips on both sides, each by its own law."""
    rng = np.random.default_rng(1)
    highs = 10.0 + rng.gumbel(0.0, 1.0, 64)
    upper = R.clipping_noise(5.0, highs.max(), highs - 5.0, highs)  # lo 5 > 0: the range is [0, hi]
    assert upper > 0
    assert R.clipping_noise(0.0, highs.max(), rng.uniform(0, 1, 64), highs) == upper
    lows = -highs[::-1]
    both = R.clipping_noise(lows.min(), highs.max(), lows, highs)
    assert both == pytest.approx(upper + R.clipping_noise(lows.min(), 0.0, lows, highs),
                                 rel=1e-12)
    assert R.clipping_noise(lows.min(), 0.0, lows, highs) == pytest.approx(upper, rel=1e-9)
    assert R.clipping_noise(0.0, 1.0, np.zeros(64), np.ones(64)) == 0.0  # constant: no law


def test_widened_ranges_expect_less_clipping_and_predict_new_inputs():
    """The range of a regression output calibrated on 64 inputs, min/max or widened as the
    candidates calibrate it: widened expects less clipping; and over many draws of the 64,
    the expected clipping of either range is, on average, what new inputs of the same law
    give it, within a factor of 2 (the law is fitted to 64 values: its scale runs low)."""
    rng = np.random.default_rng(2)
    new = rng.gumbel(140.0, 10.0, size=200_000)
    estimated, real = np.zeros((2, 100)), np.zeros((2, 100))
    for k in range(100):
        calibrating = rng.gumbel(140.0, 10.0, size=(64, 1))
        minmax = R.expected_clipping(calibrating, "min/max")
        wide = R.expected_clipping(calibrating, "widened")
        assert 0 < wide < minmax / 2
        lo, hi = R.widened(0.0, float(calibrating.max()), calibrating[:, 0], calibrating[:, 0])
        assert lo == 0.0 and hi > calibrating.max()
        assert wide == pytest.approx(R.clipping_noise(lo, hi, calibrating[:, 0],
                                                      calibrating[:, 0]))
        estimated[:, k] = minmax, wide
        real[:, k] = [np.mean(np.clip(new - top, 0, None) ** 2)
                      for top in (calibrating.max(), hi)]
    ratio = estimated.mean(axis=1) / real.mean(axis=1)
    assert np.all((0.5 < ratio) & (ratio < 2.0)), ratio


def test_the_interval_reaches_down_to_the_figure_with_the_expected_clipping():
    """The check's point figure is what the inputs at hand gave; the lower end of its interval
    also covers the expected clipping (given per output); without it, nothing changes."""
    rng = np.random.default_rng(3)
    ref = [rng.normal(size=(64, 4)), rng.normal(size=(64, 1))]
    y = [r + 0.01 * rng.normal(size=r.shape) for r in ref]
    plain = C.check_outputs(ref, y, ["a", "b"], ["values", "values"])
    clipped = C.check_outputs(ref, y, ["a", "b"], ["values", "values"], [0.0, 0.01])
    assert clipped[0] == plain[0]
    assert clipped[1].sqnr_db == plain[1].sqnr_db
    with_clip = C.sqnr_with_clipping(ref[1], y[1], 0.01)
    signal, noise = np.sum(ref[1] ** 2), np.sum((ref[1] - y[1]) ** 2)
    assert with_clip == pytest.approx(10 * math.log10(signal / (noise + 0.01 * 64)))
    assert clipped[1].sqnr_interval == (pytest.approx(with_clip), plain[1].sqnr_interval[1])
    assert with_clip < plain[1].sqnr_interval[0]


def test_sqnr_gain_weighs_each_sides_expected_clipping():
    """A build a hair farther on the inputs at hand but expected to clip far less on new ones
    gains; the same clipping on both sides leaves the sign of the gain."""
    rng = np.random.default_rng(4)
    ref = [rng.normal(size=(64, 2))]
    near = [ref[0] + 0.010 * rng.normal(size=(64, 2))]
    hair = [ref[0] + 0.011 * rng.normal(size=(64, 2))]
    assert C.sqnr_gain(ref, hair, near)[0] < 0
    assert C.sqnr_gain(ref, hair, near, clipping=[1e-4], clipping_other=[1e-2])[0] > 0
    gain, _, support = C.sqnr_gain(ref, hair, near, clipping=[1e-3], clipping_other=[1e-3])
    assert gain < 0 and support < 0.5


def test_the_plain_rule_weighs_the_clipping_each_build_is_expected_to_add():
    """The per-output rule against the plain conversion: widened ranges a hair closer on the
    inputs at hand (by less than PLAIN_MARGIN_DB), which alone would not back them, but
    expected to clip far less on new ones, are not farther (the margin is asked of the figures
    with the clipping); a hair farther on the inputs at hand they are, whatever the expected
    clipping (a law fitted to a few dozen extremes, which on two models of a failure
    hunt charged the plain conversion for clipping new inputs hardly made)."""
    inp = keras.Input((4,), name="x")
    model = keras.Model(inp, L.Dense(1, name="ink")(inp))
    rng = np.random.default_rng(5)
    ref = [140.0 + 10.0 * rng.gumbel(size=(64, 1))]
    noise = rng.normal(size=(64, 1))
    plain = [ref[0] + 0.01 * noise]
    clip = {"plain": [R.expected_clipping(ref[0], "min/max")],
            _choice.WIDENED: [R.expected_clipping(ref[0], "widened")]}
    other = rng.normal(size=(64, 1))
    other *= np.sqrt(np.sum(noise ** 2) / np.sum(other ** 2))  # as far as the plain one
    # closer by a hair (by less than PLAIN_MARGIN_DB: the expected clipping makes the gain),
    # a hair farther
    for share, weighed in ((0.99, []), (1.02, ["ink"])):
        wide = [ref[0] + 0.01 * np.sqrt(share) * other]
        pooled = {"plain": plain, _choice.WIDENED: wide}
        assert _choice._farther_outputs(model, ref, pooled, _choice.WIDENED) == ["ink"]
        assert _choice._farther_outputs(model, ref, pooled, _choice.WIDENED, clip) == weighed


def test_class_scores_expect_no_clipping_and_each_candidate_its_own_range():
    """The clipping each candidate is expected to add: 0 on class scores; on a value output,
    min/max for every candidate but the widened one."""
    inp = keras.Input((4,), name="x")
    model = keras.Model(inp, [L.Dense(3, activation="softmax", name="cls")(inp),
                              L.Dense(1, name="ink")(inp)])
    rng = np.random.default_rng(6)
    ref = [rng.dirichlet(np.ones(3), 64), 140.0 + 10.0 * rng.gumbel(size=(64, 1))]

    class Build:
        class opts:
            output_kinds = None

    clip = _choice._clipping(model, Build, ref)
    assert set(clip) == set(_choice.CANDIDATES)
    assert all(c[0] == 0.0 for c in clip.values())
    minmax = R.expected_clipping(ref[1], "min/max")
    assert clip["cle"][1] == clip["plain"][1] == clip["cle, min/max ranges"][1] == minmax
    assert 0 < clip[_choice.WIDENED][1] < minmax


def test_outputs_whose_range_tflite_fixes_expect_no_clipping():
    """A sigmoid or tanh value output (a bounded regression, a similarity score): TF Lite's
    int8 LOGISTIC and TANH fix their output range whatever the calibration, so no new input
    is clipped there (the extreme-value law charged hunt8's sigmoid heads as if their outputs
    kept their calibrated min/max, and the widened ranges it favoured read below the
    converter); a linear value output beside them is still charged."""
    inp = keras.Input((4,), name="x")
    model = keras.Model(inp, [L.Dense(1, activation="sigmoid", name="share")(inp),
                              L.Dense(2, activation="tanh", name="balance")(inp),
                              L.Dense(1, name="ink")(inp)])
    rng = np.random.default_rng(8)
    ref = [rng.uniform(0.1, 0.6, (64, 1)), rng.uniform(-0.5, 0.5, (64, 2)),
           140.0 + 10.0 * rng.gumbel(size=(64, 1))]

    class Build:
        class opts:
            output_kinds = None

    assert C.output_kinds(model) == ["values"] * 3
    clip = _choice._clipping(model, Build, ref)
    for name in _choice.CANDIDATES:
        assert clip[name][:2] == [0.0, 0.0] and clip[name][2] > 0.0


def test_the_compare_verdict_weighs_the_expected_clipping():
    """``--compare``'s verdict on a value output uses the figures the choice compared."""
    rng = np.random.default_rng(7)
    ref = rng.normal(size=(64, 2))
    ours = ref + 0.0105 * rng.normal(size=(64, 2))
    theirs = ref + 0.01 * rng.normal(size=(64, 2))
    assert C.compare_verdict(ref, ours, theirs)[0] != "better"
    assert C.compare_verdict(ref, ours, theirs, clipping=(1e-4, 1e-2))[0] == "better"


def test_a_regression_heads_report_states_the_clipping_its_figures_could_not_see():
    """End to end, with data: the choice's figures with the expected clipping are in the
    report, the value output's interval reaches down to the written build's, and
    ``compare=True`` gives its verdict on the same figures."""
    import cle

    keras.utils.set_random_seed(3)
    inp = keras.Input((12,), name="x")
    h = L.Dense(32, activation="relu", name="d1")(inp)
    model = keras.Model(inp, L.Dense(1, name="value")(h), name="regression")
    x = np.random.default_rng(4).normal(size=(64, 12)).astype(np.float32)
    _, report = cle.quantize(model, x, compare=True)
    choice = report.choice
    assert set(choice.expected) == set(choice.crossfit)
    for name, figures in choice.expected.items():
        assert figures[0] < choice.crossfit[name][0]  # every build clips some new input
    low = choice.expected[choice.written][0]
    out = report.outputs[0]  # down to the written build's, or to a heavy tail's lower end
    tail = math.inf if out.tail is None else out.tail.floor
    assert out.sqnr_interval[0] == pytest.approx(min(low, tail)) and out.sqnr_interval[0] <= low
    assert low < out.sqnr_db
    assert report.to_dict()["plain_conversion"]["verdicts"][0]["verdict"]


# ------------------------------------------------------------------ an input's usual range


@pytest.mark.parametrize("calibrated, usual", [
    ((0.0, 0.94), (0.0, 1.0)), ((0.02, 0.93), (0.0, 1.0)), ((0.0, 0.9), (0.0, 1.0)),
    ((-0.95, 0.97), (-1.0, 1.0)), ((0.0, 240.0), (0.0, 255.0)), ((3.0, 250.0), (0.0, 255.0)),
    ((0.0, 0.89), None), ((0.0, 0.5), None), ((-0.5, 1.0), None), ((0.0, 1.01), None),
    ((-1.2, 1.0), None), ((-3.0, 4.0), None)])
def test_an_input_takes_the_usual_range_its_values_nearly_span(calibrated, usual):
    assert R.usual_range(*calibrated) == usual


def test_an_image_input_short_of_white_takes_the_whole_pixel_range():
    """Pixels in [0, 1] whose calibration images stay below 0.93: the file's input range is
    [0, 1], so new images that reach white are not clipped (the input was kept at the
    calibration inputs' extremes, and on an autoencoder that clipping ruled the error of new
    inputs); an input far from any usual range keeps its own."""
    import cle

    keras.utils.set_random_seed(5)
    inp = keras.Input((16, 16, 1))
    h = L.Conv2D(8, 3, padding="same", activation="relu")(inp)
    model = keras.Model(inp, L.Conv2D(1, 3, padding="same", name="image")(h))
    rng = np.random.default_rng(6)
    x = rng.uniform(0.0, 0.93, (32, 16, 16, 1)).astype(np.float32)
    _, report = cle.quantize(model, x)
    first = report.to_dict()["ranges"][0]
    assert first["how"] == "usual range" and first["chosen"] == [0.0, 1.0], first
    assert "takes it ([0, 1])" in report.summary()
    _, report = cle.quantize(model, 0.6 * x)
    first = report.to_dict()["ranges"][0]
    assert first["how"] != "usual range" and first["chosen"][1] <= 0.6 * 0.93 + 1e-6, first


# ------------------------------------------------------------- a softmax's clipped logits


def test_softmax_logits_names_the_tensor_each_softmax_output_is_of():
    """For each output, in the Keras model's order, the logits tensor its SOFTMAX reads (a
    Dense's softmax activation or a Softmax layer), None for an output without one; each is a
    tensor that keeps its min/max (it decides an output)."""
    from cle._tflite import converter as T

    keras.utils.set_random_seed(0)
    inp = keras.Input((8,))
    h = L.Dense(16, activation="relu")(inp)
    model = keras.Model(inp, [L.Dense(5, activation="softmax")(h), L.Dense(2)(h),
                              L.Softmax()(L.Dense(3)(h))])
    calibrated = T.calibrate(model, np.random.default_rng(0).normal(size=(8, 8)).astype("f4"))
    first, second, third = T.softmax_logits(calibrated)
    protected = T.protected_indices(calibrated)[0] - T.output_indices(calibrated)
    assert second is None and first != third and {first, third} <= protected


def _logits_law(seed=0, n=64, classes=5):
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 1.0, (n, classes)) * rng.gamma(4.0, 0.5, (n, 1))
    p = np.exp(z - z.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True), z.min(axis=1), z.max(axis=1)


def test_softmax_clipping_is_the_expectation_of_its_law():
    """The noise :func:`softmax_clipping` gives is what new inputs drawn from its law read: a
    Monte Carlo of four million draws of the largest logit by the Gumbel law fitted to the
    calibration inputs' largest logits, each input one of the calibration inputs with the
    largest logits spread out to reach it, every logit clipped into the range."""
    p, lows, highs = _logits_law()
    got = R.softmax_clipping(p, lows, highs, "min/max")
    rng = np.random.default_rng(1)
    location, scale = R._gumbel(highs)
    drawn = location - scale * np.log(-np.log(rng.random(4_000_000)))
    lo, hi = lows.min(), highs.max()
    z = np.log(p) - np.log(p).max(axis=1, keepdims=True) + highs[:, None]
    k = int(round(R.LOGIT_TAIL * len(p)))
    noise = []
    for j in np.argsort(highs)[::-1][:k]:
        y = drawn[drawn > hi][:, None]
        c = z[j].mean()
        logits = c + (z[j] - c) * (y - c) / (highs[j] - c)
        change = R._softmax(logits) - R._softmax(np.clip(logits, lo, hi))
        noise.append(np.sum(change ** 2) / len(drawn))
    assert got > 0 and got == pytest.approx(np.mean(noise), rel=0.03)


def test_softmax_clipping_weighs_the_range_and_the_spread_of_the_logits():
    p, lows, highs = _logits_law()
    base = R.softmax_clipping(p, lows, highs, "min/max")
    assert R.softmax_clipping(p, lows, highs, "widened") < base
    assert R.softmax_clipping(p, lows, np.full_like(highs, highs.max()), "min/max") == 0.0
    assert R.softmax_clipping(p[:, :1], lows, highs, "min/max") == 0.0  # not class scores
    wide = highs.mean() + 2.0 * (highs - highs.mean())  # the largest logits spread further
    assert R.softmax_clipping(p, lows, wide, "min/max") > base


def test_a_softmax_outputs_interval_reaches_down_to_its_clipped_logits():
    """End to end, with data, on a softmax classifier: the check's interval on its output
    reaches down to the figure with the clipping of the logits new inputs are expected to
    bring (the written build's, and the plain conversion's for ``compare``), weighed by no
    choice (weighed, the law's pessimism wrote a build 1.3 dB below the plain conversion on
    new inputs: hunt6's hard-swish classifier); a value output's is its own expected clipping,
    as before."""
    rng = np.random.default_rng(6)
    inp = keras.Input((8,), name="x")
    h = L.Dense(16, activation="relu")(inp)
    model = keras.Model(inp, [L.Dense(5, activation="softmax", name="probs")(h),
                              L.Dense(2, name="box")(h)])
    model.set_weights([rng.normal(0, 0.5, (8, 16)), rng.normal(0, 0.1, 16),
                       rng.normal(0, 2.0, (16, 5)), rng.normal(0, 0.3, 5),
                       rng.normal(0, 0.5, (16, 2)), np.zeros(2)])
    from cle._quantize.pipeline import QuantizeOptions, quantize_checked

    x = rng.standard_normal((64, 8)).astype(np.float32)
    builds = []  # cle.quantize's own call, its build kept
    _, report = quantize_checked(model, x, QuantizeOptions.from_call(x), builds=builds)
    fit = builds[0].crossfit
    assert fit["clipping"][0] > 0 and fit["clipping_plain"][0] > 0
    expected = C.sqnr_with_clipping(fit["reference"][0], fit["test"][0], fit["clipping"][0])
    assert expected < report.outputs[0].sqnr_db
    assert report.outputs[0].sqnr_interval[0] <= expected + 1e-9
    compared = report.choice.expected[report.choice.written][0]  # what the choice weighed
    assert compared == pytest.approx(report.choice.crossfit[report.choice.written][0])
    # the value output's is its own expected clipping, as before
    assert fit["clipping"][1] == pytest.approx(R.expected_clipping(
        fit["reference"][1], R.KINDS[1] if report.choice.written != "cle, widened ranges"
        else "widened"))


# ------------------------------------------- how far a classifier's logits reach (hunt6)


@pytest.mark.parametrize("classes", [2, 10, 100, 1000])
def test_below_the_softmax_floor_the_8_bit_output_shows_nothing(classes):
    """Every logit below :func:`softmax_floor` raised to it moves each probability by less
    than half a step of the softmax's 8-bit output (1/256), on the inputs it is read from:
    a range that reaches lower spends its steps on what the output cannot show."""
    rng = np.random.default_rng(classes)
    z = rng.normal(0.0, 6.0, (64, classes))
    floor = R.softmax_floor(z.max(axis=1), classes)
    moved = np.abs(R._softmax(np.maximum(z, floor)) - R._softmax(z)).max()
    assert moved < 0.5 / R.SOFTMAX_STEPS
    if classes >= 10:  # wide logits: the floor cuts the min/max range's lower end
        lo, hi = R.logit_range(z.min(), z.max(), z.min(axis=1), z.max(axis=1), classes, 3.0)
        assert z.min() < floor and lo == min(floor, 0.0)
        assert hi == R.widened(z.min(), z.max(), z.min(axis=1), z.max(axis=1))[1]


def test_a_classifiers_logits_reach_as_far_as_the_least_expected_error():
    """:func:`logit_widening` takes the widening whose range adds the least noise on inputs
    it was not set from (each calibration input in the range the others set): where three
    classes lead together and the lead's size has a long tail, an input beyond the others'
    range has them clipped to a tie, and the logits reach further than
    :data:`WIDEN_INPUTS`; where one class leads by a wide margin, clipping its logit hardly
    moves the probabilities, and the range stays the narrowest."""
    rng = np.random.default_rng(0)
    z = rng.normal(0.0, 1.0, (64, 100))
    z[:, :3] = 4.0 + rng.exponential(1.5, (64, 1)) + rng.normal(0.0, 0.3, (64, 3))
    wide = R.logit_widening(z)
    assert wide > R.WIDEN_INPUTS and wide in R.LOGIT_WIDENINGS
    assert R._left_out(z, R._softmax(z), R.WIDEN_INPUTS) > R._left_out(z, R._softmax(z), wide)
    z = rng.normal(0.0, 1.0, (64, 10))
    z[:, 0] = 10.0 + rng.normal(0.0, 3.0, 64)  # one class far ahead, its logit spread wide
    assert R.logit_widening(z) == R.LOGIT_WIDENINGS[0] == R.WIDEN_INPUTS
    # Synthetic inputs (no data) reach less far than real ones: the Gumbel law, which expects
    # more clipping than the left-out inputs show, stands in for them.
    rng = np.random.default_rng(3)
    z = rng.normal(0.0, 1.0, (64, 100)) * rng.gamma(2.0, 2.0, (64, 1))
    assert R.logit_widening(z) == R.WIDEN_INPUTS < R.logit_widening(z, synthetic=True)


def test_each_input_left_out_meets_the_range_the_others_set():
    """:func:`_left_out` takes every input's range at once from the whole set's statistics
    (helper-31's review: one pass per input grew with the square of the inputs); it is the
    same as leaving each input out in turn."""
    for seed, shape in enumerate([(64, 100), (37, 10), (5, 3)]):
        rng = np.random.default_rng(seed)
        z = rng.normal(0.0, 1.0, shape) * rng.gamma(2.0, 2.0, (shape[0], 1))
        p = R._softmax(z)
        for widening in (3.0, 100.0):
            one_by_one = 0.0
            for j in range(len(z)):
                keep = np.arange(len(z)) != j
                low, high = R.logit_range(min(z[keep].min(), 0.0), max(z[keep].max(), 0.0),
                                          z[keep].min(axis=1), z[keep].max(axis=1),
                                          shape[1], widening)
                one_by_one += np.sum((p[j] - R._softmax(np.clip(z[j], low, high))) ** 2)
            assert R._left_out(z, p, widening) == pytest.approx(one_by_one / len(z), rel=1e-9,
                                                                  abs=1e-18)


@no_tflite_on_torch
def test_a_classifier_head_gets_its_logits_range_and_other_logits_the_widened_one():
    """End to end: the logits of a classifier's softmax (one vector per input) take
    :func:`logit_range` at the widening :func:`logit_widening` measured, named in the report;
    a sigmoid's logits and a per-pixel softmax's keep the 3× widening (no vector per input
    to measure); the cross-fitted builds and the candidates use the widening measured once."""
    from cle._quantize.pipeline import QuantizeOptions, quantize_checked

    keras.utils.set_random_seed(2)
    inp = keras.Input((6, 6, 2), name="x")
    h = L.Conv2D(8, 3, padding="same", activation="relu")(inp)
    flat = L.Flatten()(h)
    model = keras.Model(inp, [L.Dense(20, activation="softmax", name="classes")(flat),
                              L.Dense(1, activation="sigmoid", name="gate")(flat),
                              L.Conv2D(3, 1, activation="softmax", name="pixels")(h)])
    x = np.random.default_rng(2).normal(size=(64, 6, 6, 2)).astype(np.float32)
    builds = []
    _, report = quantize_checked(model, x, QuantizeOptions.from_call(x), builds=builds)
    logits = [r for r in builds[0].ranges if r.how == R.LOGITS]
    measured = [r for r in logits if r.logit]
    assert len(logits) == 3 and len(measured) == 1 and measured[0].logit[0] == 20
    (r,) = measured
    assert r.logit[1] in R.LOGIT_WIDENINGS and r.lo <= 0.0 and r.hi > r.calibrated[1]
    assert f"of {R.LOGIT_WIDENINGS[0]:g}× to {R.LOGIT_WIDENINGS[-1]:g}×" in report.summary()


def _max_pooled_model(pool):
    keras.utils.set_random_seed(3)
    inp = keras.Input((12, 12, 3), name="image")
    h = L.MaxPooling2D(2, name="local_pool")(L.ReLU(name="early")(L.Conv2D(8, 3, name="c0")(inp)))
    h = L.Activation("swish", name="late")(L.BatchNormalization(name="bn")(
        L.Conv2D(16, 3, name="c1")(h)))
    pooled = (L.GlobalMaxPooling2D(name="gmp")(h) if pool == "global"
              else L.Flatten()(L.MaxPooling2D(3, name="gmp")(h)))  # 3x3 map: one position
    side = L.GlobalAveragePooling2D(name="gap")(L.Activation("swish", name="side_act")(
        L.BatchNormalization(name="side_bn")(L.Conv2D(8, 3, name="side")(inp))))
    return keras.Model(inp, [L.Dense(6, activation="sigmoid", name="attrs")(pooled),
                             L.Dense(2, activation="softmax", name="aux")(side)])


@pytest.mark.parametrize("pool", ["global", "one_position"])
def test_what_a_global_max_pooling_keeps_is_not_cut_at_its_tails(pool):
    """A global max pooling passes on each channel's largest value: the tails of the tensor it
    pools (and of the elementwise ops before it: the swish and the convolution's sum) are
    every value it keeps, so they keep min/max (hunt7's multi-label classifier, without data:
    its tails cut the features of the inputs that mattered, 5 dB below the converter; with
    min/max, at it). So does what lies before them through convolutions and a local max
    pooling, whose largest values make the pooled map's; a branch the pooling does not read
    keeps its tails. The kept tensors' ranges reach the pooled values' extremes in the file
    written. With data too (the zoo's multi-label classifier read 1.4 dB below the plain
    conversion with its last block's tails, hunt13's CBAM net 6 dB above it without them;
    with its first two blocks' tails too, 1.5 dB below min/max on new inputs)."""
    import cle
    from cle._tflite import converter as T

    model = _max_pooled_model(pool)
    x = np.random.default_rng(0).normal(1.0, 1.0, (48, 12, 12, 3)).astype("f4")
    calibrated = T.calibrate(model, x[:4])
    kept = T.max_kept_indices(calibrated)
    ranges = {r.index: r for r in T.ranges_of(calibrated)}
    from cle._tflite import roles
    producers = roles._producers(roles.parsed(calibrated))
    kinds = sorted(producers[i][0] for i in kept if i in ranges and i in producers)
    assert "CONV_2D" in kinds and "MUL" in kinds, kinds  # the convolution's sum, the swish
    assert "MAX_POOL_2D" in kinds and kinds.count("CONV_2D") == 2, kinds  # c0 (its ReLU
    # fused) and the local pool before c1 too
    named = {r.index: r.name for r in ranges.values()}
    assert not any("side" in named[i] for i in kept if i in named)  # the branch GAP reads
    assert any("side" in r.name for r in ranges.values())
    _, report = cle.quantize(model, ranges="percentile", bias_correction="none",
                             input_range=(-2.0, 4.0))  # without data
    hows = {r.how for r in report.ranges}
    assert R.MAX_KEPT in hows and "percentile" in hows
    for r in report.ranges:
        if r.how == R.MAX_KEPT:
            assert (r.lo, r.hi) == r.calibrated
    kept_count = sum(r.how == R.MAX_KEPT for r in report.ranges)
    assert f"the {kept_count} tensors whose largest values a global max pooling keeps keep " \
        "min/max" in report.summary(), report.summary()
    _, report = cle.quantize(model, x, ranges="percentile", bias_correction="none")
    assert R.MAX_KEPT in {r.how for r in report.ranges}
    for r in report.ranges:
        if r.how == R.MAX_KEPT:
            assert (r.lo, r.hi) == r.calibrated


def test_a_maximum_a_log_sum_exp_subtracts_does_not_reach_back_through_convolutions():
    """A REDUCE_MAX that is not a pooling of positions (``keras.ops.logsumexp`` over the last
    axis subtracts its maximum, as JAX's export of a softmax over another axis does) keeps
    the tensor it reads and the elementwise ops before it at min/max, as before, but not the
    maps before a convolution: those keep their tails. A global max pooling's walk does
    reach them (the test above)."""
    from cle._tflite import converter as T
    from cle._tflite import roles

    keras.utils.set_random_seed(4)
    inp = keras.Input((10, 10, 3), name="image")
    h = L.Conv2D(6, 3, name="c1")(L.ReLU(name="early")(L.Conv2D(8, 3, name="c0")(inp)))
    out = L.Lambda(lambda t: keras.ops.logsumexp(t, axis=-1), name="lse")(h)
    model = keras.Model(inp, out)
    x = np.random.default_rng(0).normal(size=(4, 10, 10, 3)).astype("f4")
    calibrated = T.calibrate(model, x)
    kept = T.max_kept_indices(calibrated)
    producers = roles._producers(roles.parsed(calibrated))
    convs = sorted(i for i, (kind, _) in producers.items() if kind == "CONV_2D")
    assert len(convs) == 2 and kept, (convs, kept)
    assert convs[1] in kept and convs[0] not in kept, (convs, kept)


def _max_seeded(kind):
    """A small model for the cases below: ``kind`` says what its max is."""
    keras.utils.set_random_seed(5)
    length = None if kind == "dynamic_global" else 16
    if kind == "dynamic_local":
        inp = keras.Input((None, None, 3))
        h = L.MaxPooling2D(2)(L.Conv2D(8, 3, activation="relu", name="c0")(inp))
        return keras.Model(inp, L.Conv2D(4, 1, name="c1")(h))
    inp = keras.Input((length, 8))
    h = L.Conv1D(12, 3, activation="relu", name="c1")(L.Conv1D(12, 3, activation="relu",
                                                               name="c0")(inp))
    if kind == "attention_pool":  # a softmax over the positions (JAX: a REDUCE_MAX of them)
        weights = L.Softmax(axis=1)(L.Dense(1, name="score")(h))
        out = L.Lambda(lambda t: keras.ops.sum(t[0] * t[1], axis=1))([h, weights])
    elif kind == "square_channel_max":  # 12 positions x 12 channels, a max over channels
        out = L.Lambda(lambda t: keras.ops.max(t, axis=-1))(h)
    else:  # a global max pooling of a sequence whose length is not fixed
        out = L.GlobalMaxPooling1D()(h)
    return keras.Model(inp, L.Dense(3, name="head")(out))


@pytest.mark.parametrize("kind", ["attention_pool", "square_channel_max", "dynamic_global",
                                  "dynamic_local"])
def test_only_a_max_over_a_maps_positions_reaches_back_through_convolutions(kind):
    """helper-54's review: the walk through convolutions starts from a max over exactly a
    map's positions, read from its axes (a max over the channels of a 12 x 12 map has the
    shapes of one over its positions), whose result no subtraction reads (JAX writes a softmax
    over the positions, an attention pooling, as such a max, subtracted); on a length not
    fixed too (the shape writes 1 there, the signature -1); and a local max pooling of a map
    whose size is not fixed is no global one."""
    from cle._tflite import converter as T
    from cle._tflite import roles

    model = _max_seeded(kind)
    shape = (4, 12, 12, 3) if kind == "dynamic_local" else (4, 16, 8)
    calibrated = T.calibrate(model, np.random.default_rng(0).normal(size=shape).astype("f4"))
    kept = T.max_kept_indices(calibrated)
    producers = roles._producers(roles.parsed(calibrated))
    names = {t: roles.tensor_name(roles.parsed(calibrated).subgraphs[0].tensors[t])
             for t in producers}
    c0 = [t for t in producers if producers[t][0] == "CONV_2D" and "c0" in names[t]]
    assert len(c0) == 1, names
    assert (c0[0] in kept) is (kind == "dynamic_global"), (kind, sorted(names[t] for t in kept
                                                                        if t in names))


def test_logits_the_softmax_is_not_the_only_reader_of_keep_the_widened_range():
    """helper-29's review: logits that are also a model output, or read by another op, serve
    more than the softmax: no floor cut below what the softmax shows (classes 0: the widened
    range, as any output's)."""
    from cle._tflite import converter as T

    keras.utils.set_random_seed(0)
    inp = keras.Input((8,))
    z = L.Dense(50)(L.Dense(16, activation="relu")(inp))
    x = np.random.default_rng(0).normal(size=(8, 8)).astype("f4")
    alone = T.logit_indices(T.calibrate(keras.Model(inp, L.Softmax()(z)), x))
    shared = T.logit_indices(T.calibrate(keras.Model(inp, [z, L.Softmax()(z)]), x))
    assert list(alone.values()) == [("SOFTMAX", 50)]
    assert list(shared.values()) == [("SOFTMAX", 0)]


@no_tflite_on_torch
def test_the_softmax_floor_reads_closer_on_new_inputs_of_a_100_class_head():
    """On a 100-class head of random weights with heavy-tailed inputs (Student's t, 3 degrees
    of freedom; 2,000 new inputs), cle's own build, its logits widened as its left-out inputs
    say (3×, none of them passing the others' range by much) and cut at the softmax floor,
    reads closer to the float model than with the 3× widening and no floor it had before (by
    1.2 dB when measured; seeds 1–5 gained 0.1 to 1.2): the floor's steps, saved below what
    the output shows. (The wider reach is tested on its own above.)"""
    import cle
    from cle._core.inputs import check_calibration_data
    from cle._tflite.runtime import run_all

    rng = np.random.default_rng(0)
    inp = keras.Input((16,), name="x")
    h = L.Dense(64, activation="relu")(inp)
    model = keras.Model(inp, L.Dense(100, activation="softmax")(h))
    model.set_weights([rng.normal(0, 0.4, (16, 64)), rng.normal(0, 0.1, 64),
                       rng.normal(0, 0.5, (64, 100)), rng.normal(0, 0.5, 100)])
    x = rng.standard_t(3.0, (64, 16)).astype(np.float32)
    new = rng.standard_t(3.0, (2000, 16)).astype(np.float32)
    ref = model.predict(new, verbose=0, batch_size=500)

    def read(**kw):
        content, report = cle.quantize(model, x, ranges="percentile", **kw)
        y = run_all(content, check_calibration_data(model, new))[0].reshape(ref.shape)
        read.logit = [r.logit for r in report.ranges if r.logit]
        return C._sqnr(ref, y)

    measured = read()
    assert read.logit == [(100, R.WIDEN_INPUTS)]
    with pytest.MonkeyPatch.context() as mp:  # before: 3× at the top, no floor
        mp.setattr(R, "logit_range", lambda lo, hi, lows, highs, classes, widening:
                   R.widened(lo, hi, lows, highs))
        before = read()
    assert measured > before + 0.5, (measured, before)


def _heatmap_model(bias, head="sigmoid"):
    """Conv+BN+ReLU twice, then a 1x1 sigmoid per position: with a bias far below 0 a map of
    sparse peaks (a keypoint heatmap), with 0 a map of values spread over the positions;
    ``head="softmax"``: confident class scores over 30 classes at each position instead. A
    side branch (its own conv, a pooling, 5 class scores) is a second output."""
    keras.utils.set_random_seed(4)
    inp = keras.Input((12, 12, 3), name="image")
    h = inp
    for width in (8, 8):
        h = L.ReLU()(L.BatchNormalization()(L.Conv2D(width, 3, padding="same")(h)))
    side = L.ReLU(name="side_relu")(L.Conv2D(8, 3, padding="same", name="side_conv")(h))
    kind = L.Dense(5, activation="softmax", name="kind")(L.GlobalAveragePooling2D()(side))
    if head == "softmax":
        maps = L.Conv2D(30, 1, activation="softmax", name="heatmaps")
        model = keras.Model(inp, [maps(h), kind])
        kernel, _ = maps.get_weights()
        maps.set_weights([kernel * 20.0, np.zeros(30, "f4")])
        return model
    maps = L.Conv2D(2, 1, activation="sigmoid", name="heatmaps")
    model = keras.Model(inp, [maps(h), kind])
    kernel, _ = maps.get_weights()
    maps.set_weights([np.abs(kernel) * 4.0, np.full(2, bias, "f4")])
    return model


@pytest.mark.parametrize("bias, head, peaked", [(-11.0, "sigmoid", True),
                                                (0.0, "sigmoid", False),
                                                (0.0, "softmax", False)])
def test_without_data_a_map_of_sparse_peaks_keeps_min_max_before_it(bias, head, peaked):
    """A map output whose largest 1 % of values carry a quarter of its energy or more (a
    keypoint heatmap) is ruled by its peaks, made of the largest values of every tensor
    before it: their tails cut exactly those (hunt9's keypoint heatmaps without data: far
    below the converter; at min/max, above it). Without data they keep min/max, said in the
    summary; a side branch only another output reads, a map of spread values (a mask), class
    scores at each position (a confident softmax over 30 classes: each position's top class
    holds its energy, no peak), and the same model with data keep their tails."""
    import cle
    from cle._tflite import converter as T

    model = _heatmap_model(bias, head)
    # the tails, as ranges="auto" writes them unless min/max read higher on the check's sets
    _, report = cle.quantize(model, bias_correction="none", input_range=(-2.0, 4.0),
                             ranges="percentile")
    hows = {r.name: r.how for r in report.ranges}
    assert (R.PEAKED in hows.values()) == peaked, hows
    side = [name for name in hows if "side_relu" in name or "side_conv" in name]
    assert [hows[name] for name in side] == ["percentile"], hows  # the class scores' alone
    if peaked:
        for r in report.ranges:
            if r.how == R.PEAKED:
                assert (r.lo, r.hi) == r.calibrated
        assert "the tensors a map output of sparse peaks is computed from keep min/max" in \
            report.summary()
        x = np.random.default_rng(0).normal(1.0, 1.0, (48, 12, 12, 3)).astype("f4")
        _, with_data = cle.quantize(model, x, ranges="percentile", bias_correction="none")
        assert R.PEAKED not in {r.how for r in with_data.ranges}
    else:
        assert "percentile" in [hows[n] for n in hows if n not in side]


def test_the_share_of_energy_the_largest_values_carry():
    """:func:`ranges.peak_share` on known samples, and the shapes :func:`ranges.peaked_maps`
    reads as maps (a vector of class scores, however peaked, is not one)."""
    from cle._tflite.converter import TensorRange

    spread = np.ones(1000)
    assert R.peak_share(spread) == pytest.approx(0.01)
    peaks = np.zeros(1000)
    peaks[:5] = 1.0
    assert R.peak_share(peaks) == 1.0 and R.peak_share(np.zeros(10)) == 0.0
    sample = {0: np.concatenate([peaks, [0.0, 1.0]]), 1: np.concatenate([spread, [1.0, 1.0]])}
    shapes = {(1, 10, 10, 10): [0], (1, 1000): []}
    for shape, found in shapes.items():
        ranges = [TensorRange(i, f"t{i}", shape, (0.0, 1.0), 0.0, 1.0) for i in (0, 1)]
        assert R.peaked_maps(ranges, sample, {0, 1}) == found
    ranges = [TensorRange(0, "t0", (1, 10, 10, 10), (0.0, 1.0), 0.0, 1.0)]
    assert R.peaked_maps(ranges, sample, set()) == []  # not an output


def _gated_model():
    """conv+BN+ReLU, then ECA (a global average pooling read across channels by a Conv1D, a
    sigmoid gate multiplying the map), a squeeze-and-excitation (an average pooling of the
    whole 4x4 map, two 1x1 convolutions, a sigmoid gate), a spatial gate from a channel mean
    (CBAM-like: positions kept), and a head on a global average pooling."""
    keras.utils.set_random_seed(4)
    inp = keras.Input((8, 8, 3), name="image")
    h = L.ReLU()(L.BatchNormalization()(L.Conv2D(8, 3, 2, "same", name="c0")(inp)))
    a = L.Reshape((8, 1))(L.GlobalAveragePooling2D(name="gap")(h))
    a = L.Reshape((1, 1, 8))(L.Conv1D(1, 3, padding="same", activation="sigmoid")(a))
    h = L.Multiply()([h, a])
    se = L.Conv2D(4, 1, activation="relu")(L.AveragePooling2D(4, name="whole")(h))
    h = L.Multiply()([h, L.Conv2D(8, 1, activation="sigmoid")(se)])
    spatial = L.Conv2D(8, 1, activation="sigmoid")(keras.ops.mean(h, axis=-1, keepdims=True))
    h = L.Multiply()([h, spatial])
    h = L.GlobalAveragePooling2D(name="head_pool")(h)
    return keras.Model(inp, L.Dense(5, activation="softmax", name="classes")(h))


def test_global_averages_are_widened_past_their_min_max_with_data():
    """A global average pooling's output holds one value per channel and input: a few dozen
    inputs sample its extremes thinly and new inputs' averages pass them (hunt14's ECA net
    with data: its first pooling's range 1.32 on 64 inputs, 1.91 on 1,000 new ones; the gate
    it feeds multiplies the clip into the whole map: 43.7 dB against a claim of 50.1; widened
    3x: 49.7). The MEAN over the positions that gates a map and what only reshapes it are
    pooled, an average pooling to one position that gates one too (squeeze-and-excitation);
    a pooling only a classifier's head reads is not (widened, two of hunt14's residual nets
    lost resolution there and the cross-fit's choice moved), nor a mean over the channels
    (positions kept), a convolution, the gate. In the file written with data each pooled
    range reaches past its min/max on its high side (a ReLU's low side stays at 0), and the
    summary says so; without data none is widened so (synthetic inputs' averages reach past
    real ones' on some models: widened, the zoo's dw_groups lost 8 dB): each reaches as far
    as its map spreads instead (the tests below)."""
    import cle
    from cle._tflite import converter as T
    from cle._tflite import roles

    model = _gated_model()
    x = np.random.default_rng(0).uniform(0, 1, (48, 8, 8, 3)).astype("f4")
    calibrated = T.calibrate(model, x[:4])
    pooled = T.pooled_indices(calibrated)
    producers = roles._producers(roles.parsed(calibrated))
    kinds = sorted(producers[i][0] for i in pooled)
    means = ("MEAN", "SUM")  # JAX's export: a SUM, then a MUL by 1/16
    assert sum(map(kinds.count, means)) == 1 and kinds.count("AVERAGE_POOL_2D") == 1, kinds
    assert {"RESHAPE", "EXPAND_DIMS"} & set(kinds), kinds  # onwards from the pooling
    assert not {"CONV_2D", "DEPTHWISE_CONV_2D", "LOGISTIC"} & set(kinds), kinds
    tensors = roles.parsed(calibrated).subgraphs[0].tensors
    assert all(np.prod(tensors[i].shape[1:]) == 8 for i in pooled)  # not the gate's product
    others = [t for t, (kind, _) in producers.items() if kind in means and t not in pooled]
    assert len(others) == 2  # the channel mean keeps its positions; the head's pooling
    from cle._core.inputs import check_calibration_data

    said = "the outputs of a global average pooling that gate a map are widened past their"
    _, report = cle.quantize(model, x, bias_correction="none")
    widened = [r for r in report.ranges if r.how == R.POOLED]
    assert len(widened) >= 2, {r.how for r in report.ranges}
    for r in widened:
        assert r.lo == min(r.calibrated[0], 0.0) and r.hi > r.calibrated[1]
    assert said in report.summary()
    inputs = check_calibration_data(model, x)
    for synthetic in (False, True):  # the ranges' choice itself: no distillation to run
        ranges = T.ranges_of(calibrated)
        R.choose_percentile_ranges(calibrated, inputs, ranges, {}, False, lambda _: None, {},
                                   synthetic)
        assert bool([r for r in ranges if r.how == R.POOLED]) is not synthetic
        assert ({r.index for r in ranges if r.how == POOL_SPREAD}
                == (pooled if synthetic else set()))


def test_a_pooled_range_is_widened_once_whatever_the_kind():
    """as_kind widens a pooled tensor from its min/max for every kind, and again gives the
    same range (builds copy ranges already made a kind and make them another)."""
    from cle._tflite.converter import TensorRange

    lows, highs = np.zeros(32), np.random.default_rng(0).uniform(1.0, 2.0, 32)
    r = TensorRange(0, "gap", (1, 8), (0.0, 2.0), 0.0, 2.0)
    R.pick_range(r, np.linspace(0, 2, 100), (0.0, 2.0), (set(), set(), set(), {}, set(), set(),
                                                          {}, {0}), {}, False)
    assert r.how == R.POOLED
    seen = set()
    for kind in R.KINDS + R.KINDS:
        R.as_kind(r, kind, lows, highs, set())
        seen.add((r.lo, r.hi, r.how))
    (lo, hi, how), = seen
    assert how == R.POOLED and lo == 0.0
    assert hi == pytest.approx(2.0 + np.sqrt(6) / np.pi * np.log(R.POOL_WIDENING) * np.std(highs))


def test_a_pooled_range_a_global_max_pooling_also_keeps_stays_widened():
    """A gate's global average that a global max pooling's walk reaches too (through the gate's
    dense layers, since the walk passes convolutions: a squeeze-and-excitation net with a max
    pooling head, hunt13's CBAM) keeps its widened range, which holds its min/max and more;
    one that is also in a peaked map's past keeps min/max (as before)."""
    from cle._tflite.converter import TensorRange

    def how(max_kept, peaked):
        r = TensorRange(0, "gap", (1, 8), (0.0, 2.0), 0.0, 2.0)
        roles = (set(), set(), set(), {}, {0} if max_kept else set(), {0} if peaked else set(),
                 {}, {0})
        R.pick_range(r, np.linspace(0, 2, 100), (0.0, 2.0), roles, {}, False)
        return r.how

    assert how(True, False) == R.POOLED
    assert how(True, True) == R.MAX_KEPT and how(False, True) == R.PEAKED


def test_a_gate_s_average_reaches_spread_standard_deviations_of_its_channel():
    """Without data, a pooled range's both sides are widened by the one factor that takes the
    largest average on the calibration inputs out to :data:`SPREAD` standard deviations of its
    channel (over every position of every input) past the channel's mean, within the map's
    own range, never below one; what only reshapes the pooling's output takes the same factor;
    every kind keeps the range (the no-data choice's min/max build copies it)."""
    from cle._tflite.converter import TensorRange

    # channel 0: mean 1 on every input, sd 0.5 -> reaches 1 + SPREAD * 0.5; channel 1 lower.
    means = np.array([[1.0, 0.5], [1.0, 0.5], [1.0, 0.5], [1.0, 0.5]])
    squares = np.array([1.0 + 0.25, 0.25 + 0.01])
    reach = 1.0 + SPREAD * 0.5

    def made(map_hi, sq=squares, m=means):
        ranges = [TensorRange(0, "map", (1, 4, 4, 2), (0.0, map_hi), 0.0, map_hi),
                  TensorRange(1, "gap", (1, 2), (0.0, 1.0), 0.0, 1.0),
                  TensorRange(2, "gap_reshaped", (1, 2, 1), (0.0, 1.0), 0.0, 1.0),
                  TensorRange(3, "other", (1, 2), (0.0, 1.0), 0.0, 1.0)]
        spread_ranges(ranges, {1: 0, 2: 0}, {0: (m, sq)})
        return ranges

    _, gap, moved, other = made(100.0)
    assert gap.how == moved.how == POOL_SPREAD and other.how != POOL_SPREAD
    assert (gap.lo, gap.hi) == (moved.lo, moved.hi) == (0.0, pytest.approx(reach))
    assert (other.lo, other.hi) == (0.0, 1.0)
    assert made(2.0)[1].hi == pytest.approx(2.0)  # no further than the map's own range
    assert made(100.0, sq=means[0] ** 2)[1].hi == 1.0  # no spread: its min/max, not less
    # a side below 0 (a swish's map): each side by its own factor, the high one capped
    ranges = [TensorRange(0, "map", (1, 4, 4, 1), (-10.0, 3.0), -10.0, 3.0),
              TensorRange(1, "gap", (1, 1), (-0.5, 0.25), -0.5, 0.25)]
    m = np.array([[-0.5], [0.25]])
    spread_ranges(ranges, {1: 0}, {0: (m, np.array([np.mean(m ** 2) + 1.0]))})
    low = np.mean(m) - SPREAD * np.sqrt(1.0 + np.var(m))
    assert (ranges[1].lo, ranges[1].hi) == (pytest.approx(low), pytest.approx(3.0))
    gap = made(100.0)[1]
    for kind in R.KINDS:
        R.as_kind(gap, kind, np.zeros(4), np.ones(4), set())
        assert (gap.lo, gap.hi, gap.how) == (0.0, pytest.approx(reach), POOL_SPREAD)


@no_tflite_on_torch
def test_observe_measures_each_channel_s_average_and_mean_square():
    """The moments :func:`cle._tflite.converter.observe` takes of a map are its channels'
    averages on each input (what the global average pooling computes) and their mean squares
    over every position of every input, as the Keras model computes them; and every pooled
    tensor's map is the map its pooling averaged (8 channels), the same for what only reshapes
    the pooling's output."""
    from cle._core.inputs import check_calibration_data
    from cle._tflite import converter as T

    model = _gated_model()
    x = np.random.default_rng(1).uniform(0, 1, (12, 8, 8, 3)).astype("f4")
    calibrated = T.calibrate(model, x[:4])
    sources = T.pooled_sources(calibrated)
    assert set(sources) == T.pooled_indices(calibrated)
    tensors = T.parsed(calibrated).subgraphs[0].tensors
    maps = set(sources.values())
    assert len(maps) == 2 and all(tensors[m].shape[-1] == 8 and np.prod(tensors[m].shape[1:])
                                  > 8 for m in maps)
    moments = dict.fromkeys(maps)
    T.observe(calibrated, check_calibration_data(model, x), sorted(sources), moments=moments)
    first = keras.Model(model.input, model.get_layer("gap").input)
    h = np.asarray(first.predict(x, verbose=0), np.float64)
    fits = [m for m in maps if np.allclose(moments[m][0], h.mean(axis=(1, 2)), atol=1e-5)]
    assert len(fits) == 1, "the ECA pooling's map is not the BN+ReLU map"
    means, squares = moments[fits[0]]
    assert means.shape == (12, 8)
    np.testing.assert_allclose(squares, (h ** 2).mean(axis=(0, 1, 2)), rtol=1e-5, atol=1e-7)


@no_tflite_on_torch
def test_without_data_a_gate_s_average_reaches_as_far_as_its_map_spreads():
    """Without data the averages of the inputs distilled to the batch norms stay near each
    channel's mean where real inputs' spread (hunt14's ECA net: its first gate's pooling
    reached 1.17 on the synthetic inputs, 1.91 on a thousand real ones, and clipped there the
    file read 37.6 dB against the plain converter's 44.6 with data; reaching as far as the
    maps spread, 47.1). The no-data file's pooled ranges reach past their min/max, and the
    summary says how."""
    import cle

    _, report = cle.quantize(_gated_model(), input_range=(0.0, 1.0), bias_correction="none")
    spread = [r for r in report.ranges if r.how == POOL_SPREAD]
    assert len(spread) >= 2, {r.how for r in report.ranges}
    assert all(r.lo <= min(r.calibrated[0], 0.0) and r.hi >= r.calibrated[1] for r in spread)
    assert any(r.hi > r.calibrated[1] * 1.01 for r in spread)
    assert "standard deviations of each channel of the map they average" in report.summary()
