"""cle.quantize that knows what it does not know (issue #26) and checks once at its door
(issue #28): the check itself pinned (each test names the deliberate bug it catches), models
with several inputs and outputs, calibration data in every accepted form through every path
that takes it, the input range found from the model or a refusal, and non-finite values as
errors, never results."""

from __future__ import annotations

import json
import math

import keras
import numpy as np
import pytest
from keras import layers as L

import cle
from cle import quantization as Q
from cle._core import inputs as _inputs
from cle._core.inputs import check_calibration_data, input_names
from cle._measure import check as C
from cle._measure import synthetic as _synthetic
from cle._quantize import caveats, pipeline
from cle._quantize.choice import Choice
from cle._tflite import converter as tflite
from cle._tflite.runtime import input_name

from conftest import BACKEND, needs_nchw_conv, no_tflite_on_torch, randomize_batch_norms

pytestmark = no_tflite_on_torch


def _net(seed=0):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((16, 16, 3), name="image")
    x = L.ReLU(6.0)(L.BatchNormalization(name="bn1")(L.Conv2D(8, 3, padding="same",
                                                              name="c1")(inp)))
    x = L.ReLU()(L.BatchNormalization(name="bn2")(L.Conv2D(16, 3, strides=2, name="c2")(x)))
    out = L.Dense(10, name="logits")(L.GlobalAveragePooling2D()(x))
    model = keras.Model(inp, out, name="net")
    randomize_batch_norms(model, seed=seed, deep=True)
    return model


#: The test nets end in linear logits: declared, so that the check gives their top-1.
LOGITS = {"logits": "classes"}


@pytest.fixture(scope="module")
def net():
    return _net()


@pytest.fixture(scope="module")
def data():
    return np.random.default_rng(1).uniform(-1, 1, (40, 16, 16, 3)).astype(np.float32)


# ------------------------------------------------------------- the check, pinned


def _folds(n, n_check):
    """The cross-fitted check's folds of ``n`` inputs whose last ``n_check`` are held out
    (cle._quantize.crossfit): three parts of the calibration inputs, then the held-out ones."""
    return [*np.array_split(np.arange(n - n_check), 3), np.arange(n - n_check, n)]


def test_compare_gives_the_plain_conversions_own_figures(net, data):
    """Bug caught: `compare`'s plain figure computed from the INT8 model's own output. With
    data the check is cross-fitted: each input is checked by a plain conversion calibrated on
    every other fold's inputs (recomputed here with the public API)."""
    content, report = cle.quantize(net, data, compare=True, output_kinds=LOGITS)
    folds = _folds(len(data), 10)
    plain = [Q.run_tflite(Q.convert_to_tflite_int8(
        net, data[np.setdiff1d(np.arange(len(data)), idx)]), data[idx]) for idx in folds]
    plain[-1] = Q.run_tflite(Q.convert_to_tflite_int8(net, data[:30]), data[30:])
    ref = net.predict(data[np.concatenate(folds)], verbose=0)
    y = np.concatenate(plain)
    assert report.n_check == 40 and report.check_inputs.startswith("calibration inputs, each")
    assert report.plain["sqnr_db"] == pytest.approx(Q.sqnr_db(ref, y), abs=1e-4)
    assert report.plain["top1_agreement"] == Q.top1_agreement(ref, y)
    # the file written has its ranges calibrated on all 40 inputs; its figures are those of
    # the builds of its kind, each not calibrated on the inputs it checks
    (first,) = [r for r in report.ranges if input_name(r.name) == input_names(net)[0]]
    assert first.calibrated == pytest.approx((float(data.min()), float(data.max())), abs=1e-6)
    assert report.choice.crossfit["cle"][0] == pytest.approx(report.sqnr_db, abs=1e-9)
    assert abs(report.plain["sqnr_db"] - report.sqnr_db) > 0.1  # two different models
    assert "the float model converted straight: top-1 agreement" in report.summary()


def test_percentile_ranges_leave_out_the_documented_tail(net, data, monkeypatch):
    """Bug caught: the tail share changed (1e-4 -> 1e-2) while the docs say 1e-4. The share
    of each tensor's measured values left outside its chosen range, summed over all tensors,
    is what a 1e-4 tail on each side gives."""
    documented = 1e-4  # docs/design.md, docs/quantize_int8.md
    seen = {}
    observe = tflite.observe

    def spy(calibrated, x, indices, *args, **kwargs):
        values = observe(calibrated, x, indices, *args, **kwargs)
        if not seen:  # the build's measurement (the cross-fitted check measures again)
            seen.update(values)
        return values

    monkeypatch.setattr(tflite, "observe", spy)
    # "percentile": the tails without the choice, so the ranges written are those measured
    _, report = cle.quantize(net, data, bias_correction="none", ranges="percentile")
    narrowed = [r for r in report.ranges if r.how == "percentile"]
    assert len(narrowed) >= 3
    outside = total = 0
    for r in narrowed:
        v = seen[r.index]
        below, above = int((v < r.lo).sum()), int((v > r.hi).sum())
        assert below <= documented * len(v) + 2 and above <= documented * len(v) + 2, r
        outside, total = outside + below + above, total + len(v)
    assert 0.2 * documented <= outside / total <= 2.5 * documented
    assert f"their {documented:g} tails" in report.summary()


def test_held_out_inputs_never_reach_the_calibration(net, data, monkeypatch):
    """Bug caught: the held-out quarter leaking into the calibration of the build it first
    checks. The held-out inputs here are 20 times larger: none of their values may reach the
    calibrated input range of that build (``ranges="percentile"``, the build written as it
    is) or the empirical bias correction (on the default route too, whose file then takes
    its ranges from every input, its check being cross-fitted)."""
    from cle._quantize import pipeline

    x = data.copy()
    x[30:] *= 20.0
    clean_x = np.concatenate([x[:30], data[30:]])
    _, report = cle.quantize(net, x, ranges="percentile")
    (first,) = [r for r in report.ranges if input_name(r.name) == input_names(net)[0]]
    assert first.calibrated == pytest.approx((float(x[:30].min()), float(x[:30].max())),
                                             abs=1e-6)
    _, clean = cle.quantize(net, clean_x, ranges="percentile")
    assert [r.calibrated for r in report.ranges] == [r.calibrated for r in clean.ranges]
    assert report.n_calibration == 30 and report.n_check == 10
    builds = [pipeline.build_checked(net, inputs, pipeline.QuantizeOptions.from_call(inputs),
                                     lambda message: None) for inputs in (x, clean_x)]
    for a, b in zip(*(build.equalized.get_weights() for build in builds)):
        np.testing.assert_array_equal(a, b)  # the bias correction never saw them
    from cle._quantize import choice  # the default route, its choice made to keep cle's build

    monkeypatch.setattr(choice, "SUPPORT", {k: 2.0 for k in choice.SUPPORT})
    monkeypatch.setattr(choice, "_farther_outputs", lambda *args, **kwargs: [])
    _, report = cle.quantize(net, x)  # the default route: the file's ranges see every input
    assert report.choice.written == "cle"
    (first,) = [r for r in report.ranges if input_name(r.name) == input_names(net)[0]]
    assert first.calibrated == pytest.approx((float(x.min()), float(x.max())), abs=1e-6)
    assert report.n_calibration == 40 and report.choice.n == 10 and report.n_check == 40


@pytest.mark.parametrize("part", [0, 1, 2])
def test_each_cross_fitted_build_never_saw_its_own_inputs(net, data, part):
    """Bug caught: a cross-fitted build calibrated on the inputs it then checks (its figure
    would flatter). One part of the calibration inputs is made 20 times larger: the ranges
    of the build that checks that part (at their tails and at min/max) are the same as with
    that part left as it was, its input range is the other inputs' (the held-out quarter
    included), and the builds that check the other parts do see it."""
    from cle._quantize import crossfit, pipeline

    folds = _folds(len(data), 10)
    x = data.copy()
    x[folds[part]] *= 20.0
    rest = np.setdiff1d(np.arange(len(x)), folds[part])
    ranges = {}
    for name, inputs in (("scaled", x), ("as it was", data)):
        # no bias correction: the equalized model is then the same for both
        opts = pipeline.QuantizeOptions.from_call(inputs, bias_correction="none")
        fit = crossfit.CrossFit(net, pipeline.build_checked(net, inputs, opts, print), {})
        ranges[name] = {(k, minmax): [(r.name, r.lo, r.hi, r.calibrated)
                                      for r in fit._ranges(k, minmax)]
                        for k in range(3) for minmax in (True, False)}
    for minmax in (True, False):
        assert ranges["scaled"][part, minmax] == ranges["as it was"][part, minmax]
        assert ranges["scaled"][(part + 1) % 3, minmax] != \
            ranges["as it was"][(part + 1) % 3, minmax]
    (first,) = [r for r in ranges["scaled"][part, True] if input_name(r[0]) == "image"]
    assert first[3] == pytest.approx((float(x[rest].min()), float(x[rest].max())), abs=1e-6)


def _dead_channel_net():
    """A model whose first BN has a channel with moving variance 0 (a dead channel, as
    trained networks have)."""
    model = _net(seed=2)
    bn = model.get_layer("bn1")
    var = keras.ops.convert_to_numpy(bn.moving_variance).copy()
    var[3] = 0.0
    bn.moving_variance.assign(var)
    return model


def test_a_zero_variance_channel_distills_finite_inputs():
    """Bug caught: the distillation's epsilon dropped (a channel with variance 0 divides by
    0: NaN synthetic inputs, a broken model reported as a result)."""
    model = _dead_channel_net()
    x, losses = _synthetic.distill(model, 8, steps=5, input_range=(-1.0, 1.0))
    assert np.isfinite(x.arrays[0]).all() and np.isfinite(losses).all()
    # channel 3 is not dead (its kernel is not zero): no input matches a variance of 0, the
    # distillation does not converge, and the run stops with the loss it ended at (finite)
    with pytest.raises(_synthetic.NeedsData, match=r"final batch-norm loss [0-9.e+]+, above 1: "):
        cle.quantize(model, input_range=(-1.0, 1.0))


def test_a_dead_channel_distills_finite_inputs():
    """A channel that is constant on every input (its kernel all zero: the batch norm after it
    holds variance 0 and the batch's standard deviation is 0 too), as trained networks have.
    Bug it catches: the epsilon dropped from the batch's standard deviation in the
    distillation's loss (the gradient of sqrt at 0 is infinite: NaN synthetic inputs)."""
    model = _net(seed=4)
    conv, bn = model.get_layer("c1"), model.get_layer("bn1")
    kernel = keras.ops.convert_to_numpy(conv.kernel).copy()
    kernel[..., 5] = 0.0
    conv.kernel.assign(kernel)
    bias = keras.ops.convert_to_numpy(conv.bias).copy()
    mean = keras.ops.convert_to_numpy(bn.moving_mean).copy()
    var = keras.ops.convert_to_numpy(bn.moving_variance).copy()
    mean[5], var[5] = bias[5], 0.0
    bn.moving_mean.assign(mean)
    bn.moving_variance.assign(var)
    x, losses = _synthetic.distill(model, 4, steps=5, input_range=(-1.0, 1.0))
    assert np.isfinite(x.arrays[0]).all() and np.isfinite(losses).all()
    assert float(np.std(x.arrays[0])) > 0.01  # the inputs moved, and not to NaN


def test_non_finite_distillation_is_an_error(monkeypatch):
    """Without the epsilon the loss turns non-finite: an error, never synthetic inputs."""
    monkeypatch.setattr(_synthetic, "EPS", 0.0)
    with pytest.raises(RuntimeError, match=r"the distillation of synthetic inputs diverged"):
        cle.quantize(_dead_channel_net(), input_range=(-1.0, 1.0))
    bad = _net(seed=3)
    var = keras.ops.convert_to_numpy(bad.get_layer("bn2").moving_variance).copy()
    var[0] = np.nan
    bad.get_layer("bn2").moving_variance.assign(var)
    for refuse in (lambda: _synthetic.distill(bad, 4),
                   lambda: cle.quantize(bad, input_range=(-1.0, 1.0))):
        with pytest.raises(_synthetic.NeedsData, match=r"batch norm 'bn2' holds non-finite or "
                                                       r"negative moving statistics \(1 non-finite"):
            refuse()


def test_non_finite_outputs_are_an_error():
    ref = [np.ones((4, 3))]
    with pytest.raises(RuntimeError, match=r"the quantized model's outputs are not finite"):
        C.check_outputs(ref, [np.full((4, 3), np.nan)], ["y"], ["values"])


def test_figures_from_few_or_disagreeing_inputs_are_called_rough():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(8, 10))
    assert C.rough_figures([ref], [ref * 1.001], ["y"], 8) == [
        "the check ran on 8 inputs only (fewer than 16): its figures are rough"]
    ref = rng.normal(size=(32, 10))
    y = ref.copy()
    y[16:] += rng.normal(scale=0.3, size=(16, 10))  # the second half is much noisier
    y[:16] += rng.normal(scale=0.01, size=(16, 10))
    (why,) = C.rough_figures([ref], [y], ["y"], 32)
    assert why.startswith("output 'y': the two halves of the check inputs disagree")


def test_a_top1_agreement_no_decision_could_lose_is_called_idle():
    """Top-1 agreement tells the error only through close decisions: inputs on which every
    float decision leads its runner-up by far more than the quantized model moves it (as
    synthetic inputs often are, decided with a huge margin) get a sentence saying so; inputs
    with close decisions, an unchanged output and value outputs get none."""
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(32, 10))
    ref[np.arange(32), rng.integers(0, 10, 32)] += 50.0  # every decision far ahead
    noisy = ref + rng.normal(scale=0.5, size=ref.shape)
    assert C.close_calls(ref, noisy) == (0, 32)
    (idle,) = C.idle_top1([ref], [noisy], ["y"], ["logits"], "synthetic inputs")
    assert idle.startswith("output 'y': its top-1 agreement on the synthetic inputs tells "
                           "little: none of their 32 decisions is close")
    assert C.idle_top1([ref], [ref], ["y"], ["logits"], "x") == []  # exact: nothing to flip
    assert C.idle_top1([ref], [noisy], ["y"], ["values"], "x") == []
    plain = rng.normal(size=(32, 10))  # leads of the order of the change: many close calls
    close, n = C.close_calls(plain, plain + rng.normal(scale=0.5, size=plain.shape))
    assert n == 32 and close >= 8
    assert C.idle_top1([plain], [plain + 0.5 * rng.normal(size=plain.shape)], ["y"],
                       ["logits"], "x") == []
    # per pixel for a segmentation output: (N, H, W, classes) decisions are N*H*W
    seg = rng.normal(size=(2, 3, 4, 5))
    assert C.close_calls(seg, seg + 1.0)[1] == 24


def test_without_data_every_run_warns_its_figures_are_an_estimate():
    """The warnings of a run without data: always the estimate's caveat; the two synthetic
    sets that disagree by more than DISAGREE_DB; a distillation that did not converge."""
    model = _net()
    name = C.output_names(model)[0]

    def sets(a, b):
        return [{"inputs": "set a", "outputs": [C.OutputCheck(name, "logits", a, 1.0)]},
                {"inputs": "set b", "outputs": [C.OutputCheck(name, "logits", b, 1.0)]}]

    inputs = pipeline._Inputs(None, [], loss=[0.2, 0.3])
    assert caveats.caveats(model, sets(20.0, 18.0), inputs, [], LOGITS) == [C.estimate_caveat()]
    warned = caveats.caveats(model, sets(20.0, 16.5), inputs, [], LOGITS)
    assert warned[0] == C.estimate_caveat() and len(warned) == 2
    assert warned[1].startswith(f"output '{name}': the check's two sets of synthetic inputs "
                                "disagree (20.0 dB on set a, 16.5 dB on set b)")
    exact = caveats.caveats(model, sets(math.inf, 16.5), inputs, [], LOGITS)[1]
    assert "disagree (exact on set a, 16.5 dB on set b)" in exact and "inf" not in exact
    # An output exact on both sets only because its float values are saturated there (0 or 1
    # everywhere: hunt5's sparsemax head, nowhere near exact on real inputs) is said; one
    # exact with varied values (a passed-through input) is not.
    one_hot = np.eye(4, dtype=np.float32)[np.arange(8) % 4]
    varied = np.linspace(0, 1, 32, dtype=np.float32).reshape(8, 4)
    three = np.tile(np.array([0.0, 0.5, 1.0, 0.0], np.float32), (8, 1))
    for refs, sqnr, said in (((one_hot, one_hot), math.inf, True),
                             ((varied, varied), math.inf, False),
                             ((three, three), math.inf, False),  # three values: not saturated
                             ((one_hot, one_hot), 40.0, False),  # not exact: its SQNR is read
                             ((one_hot, varied), math.inf, False)):  # saturated in one set only
        exact = [{"inputs": f"set {t}", "reference": [ref], "test": [ref],
                  "outputs": [C.OutputCheck(name, "logits", sqnr, 1.0)]}
                 for t, ref in zip("ab", refs)]
        warned = caveats.caveats(model, exact, inputs, [], LOGITS)
        assert any("saturated" in w and f"output '{name}'" in w for w in warned) == said
    inputs.loss = [0.2, caveats.CONVERGED_LOSS * 2]
    diverged, caveat = caveats.caveats(model, sets(20.0, 18.0), inputs, [], LOGITS)
    assert diverged.startswith("the distillation of the check's inputs did not converge (final "
                               "batch-norm loss 2,")
    assert caveat == C.estimate_caveat()


def test_an_output_the_float_conversion_bounds_is_said_and_no_other():
    """The float conversion's own SQNR against Keras (``Choice.float_db``) is said where it is
    within FLOAT_GAP_DB of the figure and below FLOAT_SOUND_DB; a sound conversion (float32
    rounding alone) or one far above the figure says nothing. Caught: the test reversed or
    either bound dropped."""
    def said(float_db, figure):
        choice = Choice("cle", 16, {}, float_db=[float_db])
        return caveats.float_gap(choice, [C.OutputCheck("y", "values", figure, math.nan)])

    bounded = said(18.9, 18.4)
    assert len(bounded) == 1 and bounded[0].startswith(
        "output 'y': TF Lite's float conversion of the model, before any quantization, reads "
        "18.9 dB against the Keras model on the 16 held-out inputs")
    assert len(said(45.0, 40.0)) == 1
    assert said(140.0, 44.0) == [] and said(55.0, 40.0) == []  # sound; far above the figure
    assert said(math.inf, 44.0) == [] and said(70.0, 65.0) == []
    assert caveats.float_gap(None, []) == [] and caveats.float_gap(Choice("cle", 16, {}), []) == []


def _square_channels_first(seed=0):
    """A channels_first net whose conv maps have as many columns as channels (8 x 8 x 8): Keras'
    TensorFlow backend adds those layers' biases on the last axis (docs/backends.md)."""
    keras.utils.set_random_seed(seed)
    inp = keras.Input((3, 8, 8), name="image")
    x = L.ReLU()(L.Conv2D(8, 3, padding="same", data_format="channels_first", name="c1",
                          bias_initializer="random_normal")(inp))
    x = L.ReLU()(L.Conv2D(8, 3, padding="same", data_format="channels_first", name="c2",
                          bias_initializer="random_normal")(x))
    out = L.Dense(4, name="logits")(L.GlobalAveragePooling2D(data_format="channels_first")(x))
    return keras.Model(inp, out, name="square_cf")


@needs_nchw_conv
def test_a_float_conversion_that_differs_from_keras_is_said(net, data):
    """Where TF Lite computes the model differently before any quantization (on TensorFlow, a
    channels_first conv whose bias Keras adds on the last axis), the report says the float
    conversion bounds the figure; the test net's conversion is sound and says nothing. On the
    other backends Keras adds the bias per channel and nothing is said. Caught: float_db not
    measured, or measured on cle's equalized (bias-corrected) flatbuffer, which reads near the
    INT8 figure on every model."""
    model = _square_channels_first()
    x = np.random.default_rng(2).uniform(0, 1, (40, 3, 8, 8)).astype(np.float32)
    _, report = cle.quantize(model, x)
    told = [w for w in report.warnings if "float conversion of the model" in w]
    if BACKEND == "tensorflow":
        assert report.choice.float_db[0] < caveats.FLOAT_GAP_DB + report.outputs[0].sqnr_db
        assert len(told) == 1 and told[0].startswith("output 'logits': ")
    else:
        assert told == [] and report.choice.float_db[0] > caveats.FLOAT_SOUND_DB
    _, report = cle.quantize(net, data, output_kinds=LOGITS)
    assert report.choice.float_db[0] > caveats.FLOAT_SOUND_DB
    assert not any("float conversion of the model" in w for w in report.warnings)


def test_without_data_a_model_of_non_image_inputs_is_refused_naming_them(net):
    """The estimate's bound was measured on image models; without data on a model of signals
    (or audio, or latent vectors) synthetic inputs missed real ones by more, above and below
    (helper-20's hunt: a float audio net claimed far above its real figure, files far below
    the plain converter's), so such a model is refused before any work, whatever range is
    stated, in one refusal that names every input that is not an image and asks for data."""
    keras.utils.set_random_seed(0)
    signal = keras.Input((32, 2), name="signal")
    h = L.ReLU()(L.BatchNormalization(name="bn")(L.Conv1D(8, 3, name="c")(signal)))
    model = keras.Model(signal, L.Dense(4, activation="softmax", name="p")(
        L.GlobalAveragePooling1D()(h)))
    randomize_batch_norms(model)
    for stated in ((-1.0, 1.0), None):
        with pytest.raises(_synthetic.NeedsData) as caught:
            cle.quantize(model, input_range=stated)
        assert "input 'signal' (sample shape (32, 2)) is not:" in str(caught.value)
        assert str(caught.value).endswith("; pass calibration_data")
    # An image and a vector: only the vector is named. (Images of any channel count run.)
    image, vector = keras.Input((8, 8, 3), name="image"), keras.Input((5,), name="meta")
    h = L.GlobalAveragePooling2D()(L.BatchNormalization(name="bn2")(L.Conv2D(4, 3)(image)))
    both = keras.Model([image, vector], L.Dense(12, name="q")(L.Concatenate()([h, vector])))
    meta = r"and input 'meta' \(sample shape \(5,\)\) is not:"
    with pytest.raises(_synthetic.NeedsData, match=meta):
        cle.quantize(both, input_range=(0.0, 1.0))
    content, _ = cle.quantize(model, np.random.default_rng(0).normal(size=(40, 32, 2)))
    assert content  # with data the same model quantizes
    # A map that is not an image of 1 or 3 channels runs, with its range stated, and is named.
    four = keras.Input((8, 8, 4), name="rgbd")
    h = L.GlobalAveragePooling2D()(L.ReLU()(L.BatchNormalization(name="bn4")(
        L.Conv2D(6, 3, name="c4")(four))))
    maps = keras.Model(four, L.Dense(12, name="o4")(h))
    randomize_batch_norms(maps)
    _, named = cle.quantize(maps, input_range=(0.0, 1.0), output_kinds={"o4": "classes"})
    assert [w for w in named.warnings if "not an image of 1 or 3 channels" in w] == [
        "the input 'rgbd' is not an image of 1 or 3 channels: the bound above was measured on "
        "such images, not on maps of other kinds, so these figures are less sure; give "
        "calibration data to know them"]
    _, image_net = cle.quantize(net, input_range=(-1.0, 1.0), output_kinds=LOGITS)
    assert image_net.calibration != "data"


def test_headline_figures_are_the_lower_of_each_over_the_check_sets():
    """Without data the headline takes the lower SQNR and the lower top-1 agreement, each
    from whichever set gave it: the set with the lower SQNR may agree more often."""
    sets = [{"inputs": "a", "outputs": [C.OutputCheck("y", "logits", 18.0, 1.0),
                                        C.OutputCheck("v", "values", 30.0)]},
            {"inputs": "b", "outputs": [C.OutputCheck("y", "logits", 20.0, 0.9),
                                        C.OutputCheck("v", "values", 25.0)]}]
    y, v = pipeline.lower(sets)
    assert (y.name, y.sqnr_db, y.top1_agreement) == ("y", 18.0, 0.9)
    assert (v.name, v.sqnr_db) == ("v", 25.0) and math.isnan(v.top1_agreement)


# ------------------------------------------------------------- outputs and inputs


def _kinds_model():
    inp = keras.Input((8,))
    outs = [L.Dense(10, name="logits")(inp), L.Dense(4, name="boxes")(inp),
            L.Dense(3, activation="softmax", name="probs")(inp), L.Dense(1, name="value")(inp),
            L.Dense(12, activation="sigmoid", name="tags")(inp),
            L.Dense(2, activation="softmax", name="two")(inp),
            L.Dense(1, activation="sigmoid", name="binary")(inp),
            L.Softmax(name="soft")(L.Dense(6)(inp)), L.Dense(6, name="six")(inp)]
    return keras.Model(inp, outs)


def test_output_kinds_take_top1_for_class_scores_only():
    """Class scores end in a softmax or a sigmoid over two entries or more; a linear vector is
    values (10 landmark coordinates are no classes) unless declared."""
    model = _kinds_model()
    assert C.output_kinds(model) == ["values", "values", "probabilities", "values",
                                     "probabilities", "probabilities", "values",
                                     "probabilities", "values"]
    assert C.output_names(model) == ["logits", "boxes", "probs", "value", "tags", "two",
                                     "binary", "soft", "six"]
    assert C.undeclared_scores(model) == ["logits"]  # a linear vector of 10: maybe logits
    declared = {"logits": "classes", "six": "classes", "probs": "values"}
    assert C.output_kinds(model, declared) == ["logits", "values", "values", "values",
                                               "probabilities", "probabilities", "values",
                                               "probabilities", "logits"]
    assert C.undeclared_scores(model, declared) == []
    # What the distillation without data pushes: a linear vector of 10 as logits unless
    # declared values; a shorter one only once declared class scores.
    assert C.guessed_scores(model) == ["logits", "values", "probabilities", "values",
                                       "values", "probabilities", "values", "probabilities",
                                       "values"]
    assert C.guessed_scores(model, declared) == ["logits", "values", "values", "values",
                                                 "values", "probabilities", "values",
                                                 "probabilities", "logits"]
    assert C.guessed_scores(model, {"logits": "values"})[0] == "values"


@pytest.mark.parametrize("head, counted", [("sigmoid", "label-set"), (None, None)])
def test_the_reports_first_figures_say_what_their_agreement_counts(data, head, counted):
    """Bug caught: the report's top-level agreement (the first output's, the plain
    conversion's alike) carried no word of what it counts, so a reader of the JSON took a
    label-set agreement for a top-1 agreement, and a value output's missing one for a gap."""
    keras.utils.set_random_seed(3)
    inp = keras.Input((16, 16, 3), name="image")
    x = L.GlobalAveragePooling2D()(L.ReLU()(L.BatchNormalization()(L.Conv2D(8, 3)(inp))))
    model = keras.Model(inp, L.Dense(6, activation=head, name="attrs")(x))
    _, report = cle.quantize(model, data, compare=True)
    out = report.to_dict()
    assert out["check"]["agreement"] == out["check"]["outputs"][0]["agreement"] == counted
    assert out["plain_conversion"]["agreement"] == counted
    assert (out["check"]["top1_agreement"] is None) == (counted is None)


def test_independent_sigmoid_labels_agree_per_label_not_by_their_top_class():
    """Sigmoids over several entries (a multi-label output) are independent labels: their top
    class is decided by the error's last digits where several labels are near 1 (hunt9's
    multi-label attributes read "top-1 agreement 67 %" where 99.9 % of the labels agreed).
    Their agreement is the share of inputs whose labels above 0.5 are all the float model's,
    said so (not the share of labels: a large set's easy negatives would flatter it); a
    softmax keeps its top-1 agreement; no "tells little" sentence for labels."""
    rng = np.random.default_rng(0)
    ref = np.clip(rng.normal(0.95, 0.03, (40, 6)), 0.0, 1.0)  # every label near 1
    ref[:, 3] = 0.02
    test = np.clip(ref + rng.normal(0.0, 0.01, ref.shape), 0.0, 1.0)
    soft = rng.dirichlet(np.full(6, 0.3), 40)
    sig, sm = C.check_outputs([ref, soft], [test, soft + 1e-4], ["attrs", "cls"],
                              ["probabilities", "probabilities"])
    assert sig.labels and sig.agreement == "label-set" and sig.top1_agreement == 1.0
    assert _top1_of(ref, test) < 0.9  # what the top class would have said
    assert not sm.labels and sm.agreement == "top-1" and sm.top1_agreement == 1.0
    assert sig.text().startswith("label-set agreement 100.0%, ")
    assert sm.text().startswith("top-1 agreement 100.0%, ")
    assert sig.to_dict()["agreement"] == "label-set" and sm.to_dict()["agreement"] == "top-1"
    flipped = test.copy()
    flipped[:10, 3] = 0.9  # one label of a quarter of the inputs: 1/24 of the labels
    assert C.check_outputs([ref], [flipped], ["attrs"], ["probabilities"])[0] \
        .top1_agreement == 0.75
    assert C.idle_top1([ref], [test], ["attrs"], ["probabilities"], "inputs") == []


def _top1_of(ref, test):
    return float(np.mean(ref.argmax(-1) == test.argmax(-1)))


def test_a_softmax_over_another_axis_than_the_last_is_no_top1_output():
    """``Softmax(axis=1)`` over a (positions, classes) output normalizes each class over the
    positions: top-1 agreement, read along the last axis, measured nothing there (helper-15's
    hunt). It is checked as values, still bounded (no refusal without data), and
    the distillation does not push it towards a class."""
    inp = keras.Input((8, 8, 3), name="image")
    h = L.Reshape((36, 6))(L.Conv2D(6, 3, name="c")(inp))
    model = keras.Model(inp, [L.Softmax(axis=1, name="over_positions")(h),
                              L.Softmax(name="over_classes")(h),
                              L.Softmax(axis=-2, name="minus_two")(h)])
    assert C.output_kinds(model) == ["values", "probabilities", "values"]
    assert C.guessed_scores(model) == ["values", "probabilities", "values"]
    assert _synthetic.regression_outputs(model) == []


@pytest.mark.parametrize("declared, message", [
    ({"nope": "classes"}, r"output_kinds names an output model '.*' does not have\. "
                          r"Received: 'nope'; its outputs: \['logits', 'boxes'"),
    ({"value": "classes"}, r"output 'value' has 1 entries per sample: class scores need two"),
    ({"logits": "scores"}, r"maps output names to one of \('classes', 'values'\)\. "
                           r"Received: output_kinds\['logits'\]='scores'"),
    ({}, r"must be None or a dict"),
])
def test_output_kinds_refuses_what_it_cannot_honour(declared, message):
    model = _kinds_model()
    with pytest.raises(ValueError, match=message):
        cle.quantize(model, np.zeros((16, 8), np.float32), output_kinds=declared)


def test_an_output_a_nested_model_makes_ends_as_that_models_output():
    """A head built as a nested Sequential that ends in a softmax is class scores (it was
    checked as values, and without data told to be declared: helper-18's hunt); a nested
    model of two outputs gives each its own ending."""
    inp = keras.Input((8,))
    head = keras.Sequential([keras.Input((8,)), L.Dense(4, activation="softmax")], name="head")
    a = keras.Input((8,))
    two = keras.Model(a, [L.Dense(3)(a), L.Dense(5, activation="softmax")(a)], name="two")
    first, second = two(inp)
    model = keras.Model(inp, [head(inp), first, second])
    assert C.output_kinds(model) == ["probabilities", "values", "probabilities"]


def test_a_log_softmax_output_is_class_scores(net, data):
    """An output ending in a log_softmax (log-probabilities, trained with a loss from logits)
    is class scores checked as logits: it was values, refused without data as a regression
    head's (hunt13's log_softmax_out), and its logits were not widened as a softmax's."""
    from cle._quantize.ranges import LOGITS as WIDENED_LOGITS

    inp = keras.Input((8,))
    model = keras.Model(inp, [L.Activation("log_softmax", name="a")(L.Dense(5)(inp)),
                              L.Dense(4, activation="log_softmax", name="b")(inp),
                              L.Dense(1, activation="log_softmax", name="one")(inp)])
    assert C.output_kinds(model) == ["logits", "logits", "values"]
    assert C.guessed_scores(model) == ["logits", "logits", "values"]
    assert C.output_kinds(model, {"a": "values"})[0] == "values"
    assert C.undeclared_scores(model) == []
    logsm = keras.Model(net.input, L.Activation("log_softmax", name="logp")(net.output))
    _, report = cle.quantize(logsm, input_range=(-1.0, 1.0))  # was refused: NeedsData
    assert report.outputs[0].kind == "logits" and 0.0 <= report.outputs[0].top1_agreement <= 1
    _, report = cle.quantize(logsm, data)
    assert report.outputs[0].kind == "logits" and "top-1 agreement" in report.summary()
    widened = [r for r in report.ranges if r.how == WIDENED_LOGITS]
    assert len(widened) == 1 and widened[0].hi > widened[0].calibrated[1], report.ranges


def test_an_output_a_layer_passes_through_ends_as_its_input(net):
    """The float32 cast after a softmax of Keras' mixed-precision guide
    (``Activation("linear", dtype="float32")``), an ``Identity`` or a dropout after it: the
    output is still class scores (it was values: no top-1, and without data refused as a
    regression head's)."""
    inp = keras.Input((8,))
    soft = L.Dense(5, activation="softmax")(inp)
    model = keras.Model(inp, [L.Activation("linear", dtype="float32", name="cast")(soft),
                              L.Identity(name="same")(soft),
                              L.Dropout(0.5, name="drop")(L.Dense(4, activation="sigmoid")(inp)),
                              L.Activation("linear", name="lin")(L.Dense(3)(inp))])
    assert C.output_kinds(model) == ["probabilities"] * 3 + ["values"]
    assert C.output_names(model) == ["cast", "same", "drop", "lin"]
    maps = keras.Input((4, 4, 3))  # a map's softmax per position, reshaped back to the map
    flat = L.Softmax()(L.Reshape((16, 3))(maps))
    reshaped = keras.Model(maps, [L.Reshape((4, 4, 3))(flat), L.Reshape((8, 6))(flat),
                                  L.Reshape((48,))(L.Activation("sigmoid")(maps))])
    assert C.output_kinds(reshaped) == ["probabilities", "values", "probabilities"]
    cast = keras.Model(net.input, L.Activation("linear", name="out")(L.Softmax()(net.output)))
    _, report = cle.quantize(cast, input_range=(-1.0, 1.0))  # was refused: NeedsData
    assert report.outputs[0].kind == "probabilities"


def test_an_average_of_class_scores_is_class_scores(net, data):
    """An ensemble's ``Average`` of softmax outputs is probabilities (it was values, refused
    without data as a regression head's: hunt13's ensemble_avg); an average of a softmax and
    anything else is not."""
    from cle._quantize.ranges import LOGITS as WIDENED_LOGITS, SCORE_BOUNDED

    inp = keras.Input((8,))
    soft = [L.Dense(5, activation="softmax")(inp) for _ in range(3)]
    model = keras.Model(inp, [L.Average(name="mean")(soft),
                              L.Average(name="mixed")([soft[0], L.Dense(5)(inp)]),
                              L.Average(name="tags")([L.Dense(3, activation="sigmoid")(inp)] * 2)])
    assert C.ends_in(model.outputs[0]) == "softmax"
    assert C.output_kinds(model) == ["probabilities", "values", "probabilities"]
    assert C.guessed_scores(model) == ["probabilities", "values", "values"]
    keras.utils.set_random_seed(3)
    members = [L.Softmax()(L.Rescaling(100.0)(L.Dense(10, name=f"m{k}")(  # sure of a class
        L.GlobalAveragePooling2D()(net.layers[-3].output)))) for k in range(2)]
    ensemble = keras.Model(net.input, L.Average(name="photo")(members))
    _, report = cle.quantize(ensemble, input_range=(-1.0, 1.0))  # was refused: NeedsData
    assert report.outputs[0].kind == "probabilities"
    assert 0.0 <= report.outputs[0].top1_agreement <= 1
    # The mean's range is its bounds, [0, 1], not where synthetic inputs stopped (hunt13's
    # ensemble: at 0.96, clipping every confident real input), and so is its sum's, [0, 2].
    bounded = sorted((r.lo, r.hi) for r in report.ranges if r.how == SCORE_BOUNDED)
    assert bounded == [(0.0, 1.0), (0.0, 2.0)], report.ranges
    content, report = cle.quantize(ensemble, data)
    assert sorted((r.lo, r.hi) for r in report.ranges if r.how == SCORE_BOUNDED) == bounded
    # and each member's logits are widened as an output softmax's are
    assert sum(r.how == WIDENED_LOGITS for r in report.ranges) == 2, report.ranges
    assert tflite.score_bounds(tflite.calibrate(ensemble, data[:2])) != {}
    assert tflite.score_bounds(tflite.calibrate(net, data[:2])) == {}


class _OwnLoss(keras.losses.Loss):
    def call(self, y_true, y_pred):
        return keras.ops.mean(keras.ops.abs(y_true - y_pred))


@pytest.mark.parametrize("loss, kinds", [
    # by output name: logits from a cross-entropy over them, values from a regression loss;
    # an output ending in a softmax keeps what its graph says whatever its loss
    ({"logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      "boxes": "huber", "probs": "mse", "six": keras.losses.CategoricalCrossentropy(
          from_logits=True), "value": "sparse_categorical_crossentropy"},
     {"logits": "logits", "boxes": "values", "probs": "probabilities", "six": "logits",
      "value": "values"}),
    # one loss for every output: class scores where there are two classes or more
    (keras.losses.SparseCategoricalCrossentropy(from_logits=True),
     {"logits": "logits", "boxes": "logits", "value": "values", "binary": "values",
      "six": "logits"}),
    # a cross-entropy that expects probabilities, a custom loss: nothing said
    ({"logits": "categorical_crossentropy", "six": _OwnLoss()},
     {"logits": "values", "six": "values"}),
])
def test_a_compiled_models_loss_says_what_its_outputs_hold(loss, kinds, tmp_path):
    """A model compiled (and saved) with its training loss tells its outputs' kinds: a
    linear vector trained with a cross-entropy from logits is class scores (top-1 agreement,
    no "may hold class scores" hint), one trained with a regression loss is values; what the
    caller declares comes first."""
    model = _kinds_model()
    model.compile(optimizer="adam", loss=loss)
    got = dict(zip(C.output_names(model), C.output_kinds(model)))
    assert {name: got[name] for name in kinds} == kinds
    assert ("logits" in C.undeclared_scores(model)) == (kinds["logits"] == "values")
    if kinds["logits"] == "logits":
        assert dict(zip(C.output_names(model), C.output_kinds(
            model, {"logits": "values"})))["logits"] == "values"
    if isinstance(loss, dict) and "boxes" in loss:  # and a saved .keras file keeps its loss
        from cle._measure.losses import file_loss

        model.save(tmp_path / "m.keras")
        again = keras.models.load_model(tmp_path / "m.keras")
        assert C.output_kinds(again) == C.output_kinds(model)
        bare = keras.models.load_model(tmp_path / "m.keras", compile=False)  # as cle's CLI
        assert C.compiled_kinds(bare) == {}
        assert C.compiled_kinds(bare, file_loss(tmp_path / "m.keras")) == C.compiled_kinds(model)
        assert file_loss(tmp_path / "nothing.keras") is None


def test_a_loss_that_cannot_say_says_nothing():
    """A loss whose config does not serialize (as Keras' own wrapper of a ``functools.partial``
    does) stopped ``cle.quantize`` with its TypeError (helper-19's review); a regression loss
    on a sigmoid's output (boxes in [0, 1]) says values, on a softmax's nothing."""

    class Unsaid(keras.losses.Loss):
        def call(self, y_true, y_pred):
            return keras.ops.mean(keras.ops.abs(y_true - y_pred))

        def get_config(self):
            raise TypeError("Cannot serialize object functools.partial(...)")

    inp = keras.Input((8,))
    model = keras.Model(inp, [L.Dense(4, activation="sigmoid", name="boxes")(inp),
                              L.Dense(3, activation="softmax", name="probs")(inp)])
    model.compile(loss=[Unsaid(name="categorical_crossentropy"), "mse"])
    assert C.output_kinds(model) == ["probabilities", "probabilities"]
    _, report = cle.quantize(model, np.random.default_rng(0).normal(size=(32, 8)).astype(
        np.float32))
    assert [o.kind for o in report.outputs] == ["probabilities", "probabilities"]
    model.compile(loss=["mse", "mse"])
    assert C.output_kinds(model) == ["values", "probabilities"]


def test_a_few_logits_trained_from_logits_are_class_scores_without_data_too():
    """Three logits nobody declared used to be a regression output: without data a refusal
    (their range unknown), with data no top-1 agreement. Compiled with the cross-entropy they
    were trained with, they are class scores in both."""
    model = _net()
    logits = keras.Model(model.inputs, L.Dense(3, name="three")(model.layers[-2].output))
    x = np.random.default_rng(0).uniform(-1, 1, (48,) + tuple(model.inputs[0].shape[1:]))
    with pytest.raises(ValueError, match="output 'three' .*cannot be found"):
        cle.quantize(logits, input_range=(-1.0, 1.0))
    logits.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    _, report = cle.quantize(logits, input_range=(-1.0, 1.0))
    assert report.outputs[0].kind == "logits" and 0.0 <= report.outputs[0].top1_agreement <= 1
    _, report = cle.quantize(logits, x.astype(np.float32))
    assert report.outputs[0].kind == "logits" and "top-1 agreement" in report.summary()


def test_two_outputs_each_checked_and_protected(zoo):
    """A detection-like head (class scores, 4 box values): each output gets its own check
    (top-1 for the scores only) and keeps its min/max range. Without data it is refused
    before any work: synthetic inputs cannot tell the range of the box values."""
    from cle._measure.synthetic import NeedsData

    model = zoo("two_output", 48)
    import _zoo

    x = _zoo.inputs("two_output", 24, seed=_zoo.BUILD_SEED, size=48)
    with pytest.raises(NeedsData, match=r"the range of output 'boxes' \(4 values\) cannot be "
                                        r"found: .*output_kinds=.*; pass calibration_data$"):
        cle.quantize(model, output_kinds={"scores": "classes"})
    for data in (x,):
        content, report = cle.quantize(model, data, output_kinds={"scores": "classes"})
        assert [(o.name, o.kind) for o in report.outputs] == [("scores", "logits"),
                                                              ("boxes", "values")]
        assert math.isnan(report.outputs[1].top1_agreement)
        assert all(o.sqnr_db > 10 for o in report.outputs), report.summary()
        # min/max, or widened past it when that build is written: never cut
        kept = [r for r in report.ranges if r.how.startswith("min/max (output)")
                and r.lo <= r.calibrated[0] and r.hi >= r.calibrated[1]]
        assert len(kept) == 2
        text = report.summary()
        assert "output 'scores': top-1 agreement" in text and "output 'boxes': SQNR" in text
        assert "output 'boxes': top-1" not in text
        if data is not None:  # the held-out inputs' figures, per output, are the file's own
            ref = model.predict(x[18:], verbose=0)
            got = Q.run_tflite(content, x[18:], batch_size=4)
            assert isinstance(got, list) and [g.shape for g in got] == [r.shape for r in ref]
            # the check is cross-fitted on every input, per output
            assert [o.sqnr_db for o in report.outputs] == pytest.approx(
                report.choice.crossfit[report.choice.written], abs=1e-9)
            assert report.n_check == 24


def test_a_one_value_output_prints_no_top1(zoo):
    import _zoo

    model = zoo("regression_cnn", 48)
    _, report = cle.quantize(model, _zoo.inputs("regression_cnn", 12, size=48))
    assert report.outputs[0].kind == "values" and "top-1" not in report.summary()
    assert report.to_dict()["check"]["top1_agreement"] is None


def _forms(model, x):
    """The same calibration data in every accepted form: dict, tuple, one-shot generator of
    batches, list of batches, tf.data.Dataset (TensorFlow)."""
    names = input_names(model)
    forms = {"dict": dict(zip(names, x)), "tuple": tuple(x),
             "generator": (tuple(a[i: i + 5] for a in x) for i in range(0, len(x[0]), 5)),
             "batches": [dict(zip(names, (a[i: i + 7] for a in x)))
                         for i in range(0, len(x[0]), 7)]}
    if BACKEND == "tensorflow":
        import tensorflow as tf

        forms["dataset"] = tf.data.Dataset.from_tensor_slices(tuple(x)).batch(6)
    return forms


def test_two_inputs_in_every_form(zoo):
    """Calibration data for a two-input model as a dict, a tuple, a one-shot generator, a list
    of batches or a tf.data.Dataset: the same checked inputs; quantized from the generator
    with data, and without data with one input's range stated and the other's found."""
    import _zoo

    model = zoo("two_input", 48)
    x = _zoo.inputs("two_input", 24, seed=_zoo.BUILD_SEED, size=48)
    for form, data in _forms(model, x).items():
        got = check_calibration_data(model, data)
        assert got.names == ("view", "thumb"), form
        for a, b in zip(got.arrays, x):
            np.testing.assert_array_equal(a, b)
    names = input_names(model)
    gen = (dict(zip(names, (a[i: i + 5] for a in x))) for i in range(0, 24, 5))
    content, report = cle.quantize(model, gen)
    # 6 held out; the cross-fitted check then covers all 24
    assert (report.n_calibration, report.choice.n, report.n_check) == (24, 6, 24)
    assert content == cle.quantize(model, tuple(x))[0]
    _, nodata = cle.quantize(model, input_range={"view": (0.0, 255.0)})
    assert [(r["input"], r["range"]) for r in nodata.input_ranges] == [
        ("view", [0.0, 255.0]), ("thumb", [-1.0, 1.0])]
    assert nodata.input_ranges[0]["source"] == "stated"
    assert nodata.input_ranges[1]["source"].startswith("the statistics of its first batch norm")
    assert nodata.outputs[0].sqnr_db > 10


@pytest.mark.parametrize("keras_route", [False, True], ids=["traced", "from_keras_model"])
def test_each_input_calibrates_on_its_own_data_by_either_route(zoo, keras_route):
    """The converter's SavedModel route does not keep the Keras input order (from JAX, and
    from ``from_keras_model``, the inputs come sorted by name: 'thumb' before 'view'); each
    input tensor is still calibrated on its own input's data."""
    import _zoo

    model = zoo("two_input", 48)
    x = check_calibration_data(model, tuple(_zoo.inputs("two_input", 6, size=48)))
    calibrated = tflite.calibrate(model, x, keras_route=keras_route)
    _, inputs = tflite.protected_indices(calibrated)
    got = {input_name(r.name): r.calibrated for r in tflite.ranges_of(calibrated)
           if r.index in inputs}
    want = {n: (float(a.min()), float(a.max())) for n, a in zip(x.names, x.arrays)}
    assert got.keys() == want.keys()
    for n in want:
        assert got[n] == pytest.approx(want[n], rel=1e-6), n


def test_calibration_data_is_checked_once_per_call(net, data, monkeypatch):
    """One float32 copy per public call: the data is read and joined once at the door, and
    every later stage takes the checked value as it is."""
    calls = []
    joined = _inputs._joined

    def count(*args):
        calls.append(1)
        return joined(*args)

    monkeypatch.setattr(_inputs, "_joined", count)
    cle.quantize(net, data)
    assert len(calls) == 1
    calls.clear()
    cle.equalize_model(net, bias_correction="empirical", activation_ranges="calibration",
                       calibration_data=data)
    assert len(calls) == 1


def test_a_one_shot_generator_reaches_every_path_that_takes_data(net, data):
    """A generator can be read once; every public path that takes calibration data checks it
    once at its door, so a generator gives what the array gives."""

    def gen():
        return (data[i: i + 8] for i in range(0, len(data), 8))

    kwargs = dict(bias_correction="empirical", activation_ranges="calibration")
    x_test = data[:4]
    want = cle.equalize_model(net, calibration_data=data, **kwargs).predict(x_test, verbose=0)
    got = cle.equalize_model(net, calibration_data=gen(), **kwargs).predict(x_test, verbose=0)
    np.testing.assert_array_equal(got, want)
    want = cle.correct_bias(net, calibration_data=data).predict(x_test, verbose=0)
    got = cle.correct_bias(net, calibration_data=gen()).predict(x_test, verbose=0)
    np.testing.assert_array_equal(got, want)
    assert cle.quantize(net, gen())[0] == cle.quantize(net, data)[0]
    if BACKEND == "tensorflow":
        import tensorflow as tf

        ds = tf.data.Dataset.from_tensor_slices(data).batch(8)
        got = cle.equalize_model(net, calibration_data=ds, **kwargs).predict(x_test, verbose=0)
        np.testing.assert_array_equal(got, cle.equalize_model(
            net, calibration_data=data, **kwargs).predict(x_test, verbose=0))


def test_multi_input_data_refused_with_one_line(zoo):
    import _zoo

    model = zoo("two_input", 48)
    a, b = _zoo.inputs("two_input", 4, size=48)
    with pytest.raises(ValueError, match=r"as a dict needs one array per model input, keyed by "
                                         r"the input names \['view', 'thumb'\]"):
        check_calibration_data(model, {"view": a})
    with pytest.raises(ValueError, match=r"input 'thumb' has the wrong shape: the model expects "
                                         r"\(N, 24, 24, 3\)\. Received: shape \(4, 48, 48, 3\)"):
        check_calibration_data(model, (a, a))
    with pytest.raises(ValueError, match=r"as many samples of every input\. Received: 4 for "
                                         r"'view', 3 for 'thumb'"):
        check_calibration_data(model, (a, b[:3]))
    with pytest.raises(ValueError, match=r"for a model with 2 inputs, a dict"):
        check_calibration_data(model, a)


# ------------------------------------------------------------- the input range


def test_a_model_that_cannot_tell_its_range_is_refused_before_any_work(zoo, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("work started")

    monkeypatch.setattr(_synthetic, "distill", fail)
    monkeypatch.setattr(pipeline, "equalize_checked", fail)
    with pytest.raises(pipeline.InputRangeUnknown, match=(
            r"^cannot tell the input range of model 'late_bn_cnn' \(input 'image': no "
            r"preprocessing layer, and the path to its first batch norm '.*' is not linear "
            r"\(it passes an activation\)\); pass input_range=\(low, high\) or "
            r"calibration_data\. Received: input_range=None, calibration_data=None$")):
        cle.quantize(zoo("late_bn_cnn"))


def test_an_input_no_batch_norm_sees_keeps_its_start_without_data():
    """Without data, an input that reaches no batch norm and no class score (here a small map
    of side values into a bounded head: a linear regression head is refused without data)
    gets no gradient: it keeps its starting draw in its stated range, and the model
    quantizes."""
    keras.utils.set_random_seed(0)
    image, side = keras.Input((16, 16, 3), name="image"), keras.Input((2, 2, 1), name="side")
    x = L.ReLU()(L.BatchNormalization(name="bn")(L.Conv2D(8, 3, name="c")(image)))
    x = L.Concatenate()([L.GlobalAveragePooling2D()(x),
                         L.Dense(4, name="side_dense")(L.Flatten()(side))])
    model = keras.Model([image, side], L.Dense(1, activation="sigmoid", name="value")(x),
                        name="side_values")
    randomize_batch_norms(model, deep=True)
    x, _ = _synthetic.distill(model, 4, steps=3, input_range=[(-1.0, 1.0), (0.0, 2.0)])
    assert np.isfinite(x.arrays[1]).all() and x.arrays[1].min() >= 0 and x.arrays[1].max() <= 2
    content, report = cle.quantize(model, input_range={"image": (-1, 1), "side": (0, 2)})
    assert np.isfinite(report.outputs[0].sqnr_db) and report.input_ranges[1]["range"] == [0.0, 2.0]
    assert len(content) > 0


def test_a_loaded_sequential_model_quantizes_without_data(zoo):
    """A Sequential model loaded from .keras has several Keras nodes per layer: its batch
    norms are found all the same (once refused: 'has no BatchNormalization layer')."""
    model = zoo("sequential_tf", 48)
    assert isinstance(model, keras.Sequential)
    assert len(_synthetic.batch_norms(model)) == 3
    _, report = cle.quantize(model)
    assert report.input_ranges[0]["range"] == [-1.0, 1.0]
    assert report.outputs[0].sqnr_db > 10


@pytest.mark.parametrize("kwargs, message", [
    ({"input_range": {"nope": (0, 1)}}, r"input_range names inputs the model does not have: "
                                        r"\['nope'\]; its inputs are \['image'\]"),
    ({"input_range": (0, 1), "calibration_data": "data"}, r"input_range is for quantizing "
                                                          r"without data"),
    ({"input_range": {}}, r"must name at least one input"),
])
def test_input_range_misuse_refused(net, data, kwargs, message):
    if kwargs.get("calibration_data") == "data":
        kwargs = dict(kwargs, calibration_data=data)
    with pytest.raises(ValueError, match=message):
        cle.quantize(net, **kwargs)


# ------------------------------------------------------------- the command line


def _agree(argv, library, tmp_path, command="quantize"):
    """``(cli refuses, library refuses)`` for the same options: the command line's checks
    before loading anything, and the library's own."""
    from cle._cli import main as cli_main
    from cle._cli.common import CliError

    args = cli_main.build_parser().parse_args([command, str(tmp_path / "m.keras")] + (
        ["-o", str(tmp_path / ("m.tflite" if command == "quantize" else "o.keras"))]
        if command != "inspect" else []) + argv)
    try:
        cli_main._check_option_combinations(args)
        cli = False
    except CliError as exc:
        assert exc.code == 2
        cli = True
    try:
        library()
        lib = False
    except ValueError:
        lib = True
    return cli, lib


def test_the_command_line_and_the_library_agree_on_every_quantize_combination(tmp_path):
    import itertools

    from cle._quantize.options import QuantizeOptions

    np.save(tmp_path / "c.npy", np.zeros((2, 4), np.float32))
    for per_channel, bits, bias, data, rng, io in itertools.product(
            (True, False), (8, 16), ("auto", "empirical", "analytic", "none"), (False, True),
            (None, (-1.0, 1.0)), (False, True)):
        argv = ["--activation-bits", str(bits), "--bias-correction", bias]
        argv += [] if per_channel else ["--per-tensor"]
        argv += ["--calibration", str(tmp_path / "c.npy")] if data else []
        argv += [f"--input-range={rng[0]},{rng[1]}"] if rng else []
        argv += ["--integer-io"] if io else []
        cli, lib = _agree(argv, lambda: QuantizeOptions.from_call(
            "data" if data else None, per_channel=per_channel, activation_bits=bits,
            bias_correction=bias, input_range=rng, integer_io=io), tmp_path)
        assert cli == lib, argv
    # The weight options (4-bit weights, the rounding) against the activations, the bias
    # correction, the data and the tuning.
    # With --per-tensor, "auto" is another rounding at 8 bits.
    for bits, bias, data, weight_bits, rounding, tune, per_channel in itertools.product(
            (8, 16), ("auto", "empirical", "analytic", "none"), (False, True), (4, 8),
            ("auto", "nearest", "tapsum", "gptq", "adaround"), (False, True), (True, False)):
        argv = ["--activation-bits", str(bits), "--bias-correction", bias,
                "--weight-bits", str(weight_bits), "--rounding", rounding]
        argv += ["--calibration", str(tmp_path / "c.npy")] if data else []
        argv += ["--tune"] if tune else []
        argv += [] if per_channel else ["--per-tensor"]
        cli, lib = _agree(argv, lambda: QuantizeOptions.from_call(
            "data" if data else None, activation_bits=bits, bias_correction=bias,
            weight_bits=weight_bits, rounding=rounding, tune=tune,
            per_channel=per_channel), tmp_path)
        assert cli == lib, argv


def test_the_command_line_and_the_library_agree_on_every_equalize_combination(tmp_path):
    import itertools

    from cle._transforms.options import EqualizeOptions

    np.save(tmp_path / "c.npy", np.zeros((2, 4), np.float32))
    for command, bias, ranges, objective, data in itertools.product(
            ("equalize", "inspect"), ("none", "analytic", "empirical"), ("bn", "calibration"),
            ("quantized", "weights"), (False, True)):
        argv = ["--bias-correction", bias, "--activation-ranges", ranges,
                "--objective", objective]
        argv += ["--calibration", str(tmp_path / "c.npy")] if data else []
        cli, lib = _agree(argv, lambda: EqualizeOptions.from_call(
            "data" if data else None, bias_correction=bias, activation_ranges=ranges,
            objective=objective), tmp_path, command)
        assert cli == lib, (command, argv)


@pytest.mark.parametrize("argv, message", [
    (["--preprocessing", "tf", "--input-range=0,1"],
     r"--preprocessing tf means the input range -1,1, which contradicts --input-range "
     r"\(every input: 0,1\); give one of them"),
    (["--input-range=0,1", "--input-range=view=0,255"],
     r"--input-range LOW,HIGH sets every input's range; give it once"),
    (["--input-range=a=1,0"], r"expected LOW < HIGH"),
])
def test_contradictory_input_ranges_refused(tmp_path, capsys, argv, message):
    from cle import cli

    (tmp_path / "m.keras").write_bytes(b"")
    import zipfile

    with zipfile.ZipFile(tmp_path / "m.keras", "w") as z:
        z.writestr("x", "y")
    code = cli.main(["quantize", str(tmp_path / "m.keras"), "-o", str(tmp_path / "m.tflite"),
                     *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("cle: error: ")
    import re

    assert re.search(message, err[0]), err[0]


def test_cli_quantize_without_data_says_what_it_found_or_refuses(zoo, tmp_path, capsys):
    """`cle quantize m.keras -o m.tflite` with no flag: the input range found and where from,
    the check on inputs the distillation did not shape, 'no real data'; a model that cannot
    tell its range is refused in one line naming the three options."""
    from cle import cli

    zoo("two_input", 48).save(tmp_path / "two.keras")
    names = input_names(zoo("two_input", 48))
    import _zoo

    x = _zoo.inputs("two_input", 12, size=48)
    np.savez(tmp_path / "c.npz", **dict(zip(names, x)))
    code = cli.main(["quantize", str(tmp_path / "two.keras"), "-o", str(tmp_path / "a.tflite"),
                     "--calibration", str(tmp_path / "c.npz")])
    out = capsys.readouterr().out
    assert code == 0 and "calibration: 12 inputs given, all of them setting the activation " \
        "ranges; the last 3 held out" in out
    np.savez(tmp_path / "bad.npz", view=x[0])
    code = cli.main(["quantize", str(tmp_path / "two.keras"), "-o", str(tmp_path / "b.tflite"),
                     "--calibration", str(tmp_path / "bad.npz")])
    err = capsys.readouterr().err
    assert code == 2 and "must hold one array per model input, named ['view', 'thumb']" in err
    zoo("late_bn_cnn").save(tmp_path / "late.keras")
    code = cli.main(["quantize", str(tmp_path / "late.keras"), "-o", str(tmp_path / "c.tflite")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].endswith("pass --input-range=LOW,HIGH, --preprocessing NAME or --calibration "
                           "PATH")
    assert not (tmp_path / "c.tflite").exists()


def test_cli_equalize_reads_calibration_with_the_same_reader(zoo, tmp_path, capsys):
    """`cle equalize --calibration` reads what `cle quantize` reads (.npz included); data that
    does not fit is exit 2."""
    from cle import cli

    model = zoo("unit_cnn", 48)
    model.save(tmp_path / "m.keras")
    import _zoo

    x = _zoo.inputs("unit_cnn", 8, size=48)
    np.savez(tmp_path / "c.npz", **{input_names(model)[0]: x})
    np.save(tmp_path / "bad.npy", x[:, :, :, :2])
    code = cli.main(["equalize", str(tmp_path / "m.keras"), "-o", str(tmp_path / "e.keras"),
                     "--bias-correction", "empirical", "--calibration", str(tmp_path / "c.npz")])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    code = cli.main(["equalize", str(tmp_path / "m.keras"), "-o", str(tmp_path / "f.keras"),
                     "--bias-correction", "empirical", "--calibration", str(tmp_path / "bad.npy")])
    err = capsys.readouterr().err
    assert code == 2 and "has the wrong channel count" in err


def test_an_undeclared_linear_vector_is_values_and_the_report_says_how_to_declare_it():
    """No top-1 agreement (never "nan%") for a linear vector nobody declared; one sentence
    naming the option that would give it."""
    inp = keras.Input((8,))
    h = L.Dense(16, activation="relu")(inp)
    model = keras.Model(inp, [L.Dense(10, name="landmarks")(h),
                              L.Dense(3, activation="softmax", name="cls")(h)])
    x = np.random.default_rng(0).normal(0, 1, (64, 8)).astype(np.float32)
    _, report = cle.quantize(model, x)
    assert [o.kind for o in report.outputs] == ["values", "probabilities"]
    text = report.summary()
    assert "nan" not in text
    assert "output 'landmarks': SQNR" in text and "output 'cls': top-1 agreement" in text
    hint = [w for w in report.warnings if "output 'landmarks' is a linear vector" in w]
    assert len(hint) == 1 and "--output-kind landmarks=classes" in hint[0]
    _, report = cle.quantize(model, x, output_kinds={"landmarks": "values"})
    assert not [w for w in report.warnings if "linear vector" in w]


# ------------------------------------------------- never worse than the plain converter


def test_with_data_the_closest_build_is_written_and_said(net, data, monkeypatch):
    """With data, cle's build, the same with min/max ranges and the plain conversion are
    measured (on the held-out inputs, then cross-fitted on all of them) and the closest kind
    is written, calibrated on every input: on this net cle's own; with ranges cut far too
    deep (tails of 5 %), the min/max one; if that one is no better either, the plain
    conversion. Each time the report says which and the figures are the file's kind's."""
    from cle._quantize import choice as _choice
    from cle._quantize import ranges as _ranges

    content, report = cle.quantize(net, data, compare=True, output_kinds=LOGITS)
    assert report.choice.written == "cle"
    # widened ranges are built only for a model with a value output; this one has class scores
    assert set(report.choice.sqnr_db) == set(_choice.CANDIDATES) - {_choice.WIDENED}
    assert report.choice.crossfit["cle"][0] == pytest.approx(report.sqnr_db, abs=1e-6)
    assert report.choice.crossfit["plain"][0] == pytest.approx(report.plain["sqnr_db"],
                                                               abs=1e-6)
    assert "written: cle's build (activation ranges at their tails), the closest" in \
        report.summary()
    assert report.to_dict()["choice"]["written"] == "cle"

    monkeypatch.setattr(_ranges, "TAIL", 0.05)
    content, report = cle.quantize(net, data, output_kinds=LOGITS)
    # the choice is made on every input, cross-fitted; the file's figures are that build's
    scores = {k: np.mean(v) for k, v in report.choice.crossfit.items()}
    assert scores["cle, min/max ranges"] > scores["cle"] + _choice.SWITCH_DB
    assert report.choice.written == max(scores, key=scores.get)
    assert report.sqnr_db == pytest.approx(scores[report.choice.written], abs=1e-6)
    assert any(w.startswith("the file written is ") for w in report.warnings)

    # min/max ranges no better than the tails: then the plain conversion
    from cle._quantize import crossfit

    tails = crossfit.CrossFit._ranges
    monkeypatch.setattr(_choice, "_variant", lambda build, name: build.content)
    monkeypatch.setattr(crossfit.CrossFit, "_ranges", lambda self, k, kind: tails(self, k, "tails"))
    content, report = cle.quantize(net, data, output_kinds=LOGITS)
    assert report.choice.written == "plain"
    assert content == Q.convert_to_tflite_int8(net, data)  # the float model, all the data
    assert "written: the float model straight into TF Lite's converter" in report.summary()


def test_widened_ranges_reach_past_the_calibrated_extremes():
    """``as_kind``: tails kept; min/max puts a tail range back to the calibrated extremes;
    widened moves each side off 0 by the Gumbel step to 3x as many inputs (scale: the std of
    the per-input extremes x sqrt(6)/pi, step: scale x ln 3); a ReLU's 0 and a model input
    stay where they are."""
    from cle._quantize.ranges import WIDEN_INPUTS, as_kind

    def tensor(calibrated, index=3):
        return tflite.TensorRange(index, "t", (1, 4), calibrated, 0.5 * calibrated[0],
                                  0.5 * calibrated[1], "percentile")

    lows, highs = np.array([-1.0, -2.0, -1.5, -1.2]), np.array([4.0, 5.0, 3.0, 3.5])
    r = tensor((-2.0, 5.0))
    as_kind(r, "tails", lows, highs, [0])
    assert (r.lo, r.hi, r.how) == (-1.0, 2.5, "percentile")
    as_kind(r, "min/max", lows, highs, [0])
    assert (r.lo, r.hi) == (-2.0, 5.0)
    step = math.sqrt(6.0) / math.pi * math.log(WIDEN_INPUTS)
    r = tensor((-2.0, 5.0))
    as_kind(r, "widened", lows, highs, [0])
    assert r.lo == pytest.approx(-2.0 - step * lows.std(), rel=1e-12)
    assert r.hi == pytest.approx(5.0 + step * highs.std(), rel=1e-12)
    assert r.how == "min/max (chosen), widened"
    relu = tensor((0.0, 5.0))
    as_kind(relu, "widened", np.zeros(4), highs, [0])
    assert relu.lo == 0.0 and relu.hi > 5.0
    given = tensor((-2.0, 5.0), index=0)  # a model input keeps its min/max
    as_kind(given, "widened", lows, highs, [0])
    assert (given.lo, given.hi) == (-2.0, 5.0)


def test_a_regression_head_whose_rare_inputs_leave_the_ranges_gets_them_widened():
    """A value output's SQNR is ruled by the few inputs that reach beyond what the others
    do: here one input in eight is four times larger. Cross-fitted, a build not calibrated
    on those loses them to clipping; the widened candidate is built for a model with a value
    output (never for class scores, above), measured on every input, written when it is
    closer, and the file's figures are its own."""
    from cle._quantize import choice as _choice

    keras.utils.set_random_seed(3)
    inp = keras.Input((12,), name="x")
    h = L.Dense(32, activation="relu", name="d1")(inp)
    h = L.Dense(32, activation="relu", name="d2")(h)
    model = keras.Model(inp, L.Dense(2, name="value")(h), name="regression")
    rng = np.random.default_rng(4)
    x = rng.normal(size=(96, 12)).astype(np.float32)
    x[::8] *= 4.0
    rng.shuffle(x)
    # not for a linear vector of MIN_CLASSES or more that nobody declared (likely logits)
    assert not _choice._has_values(_net(), None)
    assert _choice._has_values(_net(), {"logits": "values"}) and _choice._has_values(model, None)
    content, report = cle.quantize(model, x)
    assert _choice.WIDENED in report.choice.sqnr_db
    scores = {k: np.mean(v) for k, v in report.choice.crossfit.items()}
    assert scores[_choice.WIDENED] > scores["cle"] + _choice.SWITCH_DB
    assert report.choice.written == _choice.WIDENED
    assert report.sqnr_db == pytest.approx(scores[_choice.WIDENED], abs=1e-6)
    assert any(r.how.endswith(", widened") for r in report.ranges)
    assert " tensors widened past their min/max to the extremes 3× as many inputs" in \
        report.summary()
    # and on new inputs of the same kind it is closer than cle's build with the tails
    new = rng.normal(size=(400, 12)).astype(np.float32)
    new[::8] *= 4.0
    reference = model.predict(new, verbose=0)
    tails, _ = cle.quantize(model, x, ranges="percentile")
    assert Q.sqnr_db(reference, Q.run_tflite(content, new)) > \
        Q.sqnr_db(reference, Q.run_tflite(tails, new)) + 1.0


def test_off_the_choice_a_value_outputs_interval_reaches_down_to_its_expected_clipping(
        monkeypatch):
    """Off the choice's route (here ranges="minmax"; also 16-bit activations and tune=True) a
    value output keeps the min/max of the calibration inputs, and the few new inputs beyond it
    rule its SQNR: the held-out check's interval reaches down to the clipping they are
    expected to add, as the choice's does (helper-22's hunt: a 16-bit regression head's
    interval lay far above its real figure). Without it, the same check's interval stays
    high; the real figure on new inputs of the same kind lies inside the interval."""
    from cle._quantize import choice as _choice

    keras.utils.set_random_seed(3)
    inp = keras.Input((12,), name="x")
    h = L.Dense(32, activation="relu", name="d2")(L.Dense(32, activation="relu", name="d1")(inp))
    model = keras.Model(inp, L.Dense(2, name="value")(h), name="regression")
    rng = np.random.default_rng(4)
    x = rng.normal(size=(96, 12)).astype(np.float32)
    x[::8] *= 4.0
    rng.shuffle(x)
    content, report = cle.quantize(model, x, ranges="minmax")
    low, high = report.outputs[0].sqnr_interval
    new = rng.normal(size=(400, 12)).astype(np.float32)
    new[::8] *= 4.0
    real = Q.sqnr_db(model.predict(new, verbose=0), Q.run_tflite(content, new))
    assert low <= real <= high
    monkeypatch.setattr(_choice, "unchosen_clipping", lambda model, build: None)
    _, unclipped = cle.quantize(model, x, ranges="minmax")
    assert unclipped.outputs[0].sqnr_db == report.outputs[0].sqnr_db  # the point: the same
    assert unclipped.outputs[0].sqnr_interval[0] > low + 3


@pytest.mark.parametrize("constant", [keras.ops.ones_like, keras.ops.zeros_like])
def test_an_output_every_build_gets_exactly_leaves_the_choice_to_the_others(constant):
    """An output every build reproduces exactly (a constant here; an input passed through, an
    integer output) reads inf dB for each: the gains over it were inf - inf, NaN, so no
    candidate could pass cle's build, and the written line read "inf dB" for every build
    (helper-20's hunt: a scalar regression output lost the widened build it gets alone).
    The exact output is no difference, and the means leave it out."""
    from cle._quantize import choice as _choice

    keras.utils.set_random_seed(3)
    inp = keras.Input((12,), name="x")
    h = L.Dense(32, activation="relu", name="d1")(inp)
    h = L.Dense(32, activation="relu", name="d2")(h)
    const = constant(inp[:, :3])  # all zeros: 0/0 in the SQNR, not inf (helper-21's review)
    model = keras.Model(inp, [L.Dense(2, name="value")(h), const], name="with_constant")
    rng = np.random.default_rng(4)
    x = rng.normal(size=(96, 12)).astype(np.float32)
    x[::8] *= 4.0
    rng.shuffle(x)
    _, report = cle.quantize(model, x)
    assert report.outputs[1].sqnr_db == math.inf  # the premise: exact in every build
    assert report.choice.written == _choice.WIDENED  # as without the constant (the test above)
    assert " inf dB" not in report.choice.line()
    # Said as exact, and written as strict JSON (helper-22's hunt: "SQNR inf dB" and the
    # token Infinity, which JSON readers refuse, in the report and the --report file).
    assert "inf dB" not in report.summary() and C.EXACT in report.summary()
    text = json.dumps(report.to_dict(), allow_nan=False)
    assert json.loads(text)["check"]["outputs"][1]["sqnr_db"] == "inf"
    from cle._quantize.report import _target_lines  # a target's check says it the same way

    assert _target_lines({"runtime_check": {"n": 4, "inputs": "held-out inputs", "outputs": [
        {"name": "zero", "sqnr_db": "inf", "litert_sqnr_db": "inf", "tflm_vs_litert_db": "inf"},
        {"name": "y", "sqnr_db": 20.0, "litert_sqnr_db": 21.0, "tflm_vs_litert_db": 50.0}]}}) == [
        "TF Lite Micro ran the file on 4 held-out inputs: zero: exact (LiteRT exact, TFLM against "
        "LiteRT identical); y: SQNR 20.00 dB (LiteRT 21.00 dB, TFLM against LiteRT 50.00 dB)"]
    for exact in (np.ones((20, 3)), np.zeros((20, 3))):
        gain = C.sqnr_gain([exact, np.ones((20, 3))], [exact, np.zeros((20, 3))],
                           [exact, np.full((20, 3), 0.1)])
        assert gain[0] == pytest.approx(-10 * math.log10(1 / 0.81) / 2)  # 0 on the exact one
        assert gain[2] == 0.0 and not any(math.isnan(b) for b in gain[1])


def test_an_output_zero_in_float_and_not_in_the_file_says_so():
    # helper-24's review: it printed "SQNR -inf dB" (the SQNR of an error without a signal).
    from cle._quantize.analysis_report import output_figures

    zero = C.OutputCheck("gate", "values", C._sqnr(np.zeros(4), np.full(4, 0.1)), math.nan)
    assert zero.sqnr_db == -math.inf and zero.text() == C.ZERO_FLOAT
    assert "-inf" not in zero.text() and "dB" not in zero.text()
    assert output_figures({"sqnr_db": "-inf", "top1_agreement": None}) == C.ZERO_FLOAT
    assert output_figures({"sqnr_db": math.inf, "top1_agreement": None}) == C.EXACT
    # Every sentence that names an SQNR says an infinite one in words (helper-25's review).
    from cle._math.json_numbers import sqnr_words
    from cle._quantize import choice as _choice
    from cle._quantize.report import _target_lines

    assert [sqnr_words(v) for v in (math.inf, -math.inf, 12.345)] == [
        "exact", "no SQNR (the float output is zero)", "12.3 dB"]
    with pytest.raises(_synthetic.NeedsData, match=r"output 'gate': no SQNR \(the float"):
        _synthetic.refuse_far_file([zero])
    line = _target_lines({"runtime_check": {"n": 4, "inputs": "held-out inputs", "outputs": [
        {"name": "gate", "sqnr_db": "-inf", "litert_sqnr_db": "-inf",
         "tflm_vs_litert_db": 40.0}]}})[0]
    assert "-inf" not in line and "gate: no SQNR (the float output is zero)" in line
    # An output zero in float for every build ranks none: the others' mean decides.
    assert _choice._exact({"cle": [-math.inf, 20.0], "plain": [-math.inf, 18.0]}) == {0}
    assert _choice._mean_db([-math.inf, 20.0], {0}) == 20.0
    line = Choice("cle", 16, {"cle": [-math.inf], "plain": [-math.inf]}, 64,
                  {"cle": [-math.inf]}).line()  # helper-26's review: it read "cle inf dB"
    assert "inf" not in line and line.count("no figure (every output exact, or zero") == 2
    line = Choice("cle", 16, {"cle": [math.inf, 20.0], "plain": [60.0, 18.0]}, 64).line()
    assert "cle no mean figure" in line and "plain 39.00 dB" in line  # not "cle exact"
    fitted = {"n": 8, "outputs": [C.OutputCheck("gate", "values", 30.0)]}
    assert caveats.rounding_fit(fitted, [zero]) == []  # no held-out figure to fall short of
    # Nor an interval's end, a demo cell, an analyze table or plot figure (stop 64's list).
    from cle._cli.demo import _fmt_interval, check_cell
    from cle._quantize.analysis_report import _fmt

    ends = C.OutputCheck("y", "values", 47.25, sqnr_interval=(41.04, math.inf)).text()
    assert ends == "SQNR 47.25 dB (90% interval 41.0 to exact)"
    assert check_cell({"sqnr_db": "inf", "n": 16, "on": "held-out photos"}) == (
        "exact on 16 held-out photos")
    assert _fmt_interval({"sqnr_db": 20.04, "sqnr_interval": [18.0, math.inf]}) == (
        "20.0 (18.0 to exact)")
    assert [_fmt(v) for v in (math.inf, -math.inf, None, 3.21, math.nan)] == [
        "exact", "no SQNR (a zero or non-finite output)", "-", "3.2 dB", "no figure"]
    assert C.OutputCheck("y", "values", math.nan).text() == "no SQNR figure"  # not "nan dB"


def test_no_choice_of_the_plain_conversion_without_data(net):
    """Without data no plain conversion is made or chosen: the choice is between cle's ranges
    only (tests/test_synthetic_choice.py), and off the default route there is none."""
    _, report = cle.quantize(net, input_range=(-1.0, 1.0), output_kinds=LOGITS)
    assert report.choice.written in ("cle", "cle, min/max ranges") and not report.choice.n_all
    assert "plain" not in report.to_dict()["choice"]["sqnr_db"]
    _, report = cle.quantize(net, input_range=(-1.0, 1.0), output_kinds=LOGITS,
                             ranges="percentile")
    assert report.choice is None and report.to_dict()["choice"] is None


# ------------------------------------------------------- intervals and the compare verdict


def test_the_sqnr_interval_covers_the_figure_and_narrows_with_more_inputs():
    rng = np.random.default_rng(5)
    ref = rng.normal(size=(400, 12))
    y = ref + 0.05 * rng.normal(size=ref.shape) * rng.uniform(0.2, 3.0, size=(400, 1))
    point = C._sqnr(ref, y)
    small, large = C.sqnr_interval(ref[:16], y[:16]), C.sqnr_interval(ref, y)
    assert small[0] < C._sqnr(ref[:16], y[:16]) < small[1]
    assert large[0] < point < large[1]
    assert large[1] - large[0] < small[1] - small[0]
    assert C.sqnr_interval(ref[:3], y[:3]) is None  # under MIN_INTERVAL: no interval
    (out,) = C.check_outputs([ref[:16]], [y[:16]], ["y"], ["values"])
    assert out.sqnr_interval == small
    assert f"(90% interval {small[0]:.1f} to {small[1]:.1f})" in out.text()
    assert out.to_dict()["sqnr_interval_db"] == list(small)


def test_the_compare_verdict_says_better_worse_or_not_distinguishable():
    rng = np.random.default_rng(6)
    ref = rng.normal(size=(64, 10))
    noise = rng.normal(size=ref.shape)
    close, far = ref + 0.01 * noise, ref + 0.1 * rng.normal(size=ref.shape)
    verdict, (lo, hi) = C.compare_verdict(ref, close, far)
    assert verdict == "better" and 15 < lo < hi < 25
    assert C.compare_verdict(ref, far, close)[0] == "worse"
    twin = ref + 0.01 * rng.normal(size=ref.shape)
    verdict, (lo, hi) = C.compare_verdict(ref, close, twin)
    assert verdict == "not distinguishable" and lo < 0 < hi
    assert C.compare_verdict(ref[:3], close[:3], far[:3]) == (
        "not distinguishable (too few inputs)", None)


def test_compare_gives_a_verdict_per_output(net, data):
    _, report = cle.quantize(net, data, compare=True, output_kinds=LOGITS)
    (verdict,) = report.plain["verdicts"]
    assert verdict["verdict"] in ("better", "worse", "not distinguishable")
    lo, hi = verdict["interval_db"]
    assert lo <= report.sqnr_db - report.plain["sqnr_db"] <= hi
    assert "  verdict: " in report.summary()
    assert report.to_dict()["plain_conversion"]["verdicts"][0]["verdict"] == verdict["verdict"]


def test_sqnr_gain_is_the_mean_over_outputs_with_its_interval_and_support():
    rng = np.random.default_rng(7)
    refs = [rng.normal(size=(32, 6)), rng.normal(size=(32, 3))]
    close = [r + 0.01 * rng.normal(size=r.shape) for r in refs]
    far = [r + 0.1 * rng.normal(size=r.shape) for r in refs]
    gain, (lo, hi), support = C.sqnr_gain(refs, close, far)
    assert gain == pytest.approx(np.mean([C._sqnr(r, a) - C._sqnr(r, b)
                                          for r, a, b in zip(refs, close, far)]))
    assert 15 < lo < gain < hi < 25 and support == 1.0
    assert C.sqnr_gain(refs, far, close)[2] == 0.0
    gain, interval, support = C.sqnr_gain([r[:3] for r in refs], [a[:3] for a in close],
                                          [b[:3] for b in far])
    assert gain > 0 and interval is None and math.isnan(support)  # too few inputs to resample


def test_a_head_farther_than_the_converters_writes_the_plain_conversion():
    """The promise is per output: cle's build far closer on one head and farther on the
    other (better on the mean) gives way to the plain conversion, naming that head; so does a
    head farther by a hair, as close, or closer by less than PLAIN_MARGIN_DB (a tie goes to
    what the user had), and a one-output model farther; a build closer on every head by more
    is kept."""
    from cle._quantize import choice as _choice

    inp = keras.Input((4,), name="x")
    model = keras.Model(inp, [L.Dense(3, name="head_a")(inp), L.Dense(2, name="head_b")(inp)])
    rng = np.random.default_rng(3)
    ref = [rng.normal(size=(64, 3)), rng.normal(size=(64, 2))]

    def near(a, scale):
        return a + scale * rng.normal(size=a.shape)

    cle_out = [near(ref[0], 0.001), near(ref[1], 0.02)]  # head_b: about 6 dB farther
    plain_out = [near(ref[0], 0.01), near(ref[1], 0.01)]
    pooled = {"cle": cle_out, "plain": plain_out}
    assert np.mean([C._sqnr(r, a) - C._sqnr(r, b) for r, a, b in
                    zip(ref, cle_out, plain_out)]) > 5  # the mean favours cle's build
    assert _choice._farther_outputs(model, ref, pooled) == ["head_b"]
    hair = ref[1] + (plain_out[1] - ref[1]) * 1.01  # the plain conversion's error, 1 % more
    assert C._sqnr(ref[1], plain_out[1]) - 0.1 < C._sqnr(ref[1], hair) < C._sqnr(
        ref[1], plain_out[1])
    pooled["cle"] = [cle_out[0], hair]  # farther by a hair: the plain conversion
    assert _choice._farther_outputs(model, ref, pooled) == ["head_b"]
    for db, farther in ((0.0, ["head_b"]), (0.05, ["head_b"]), (0.2, [])):
        # as close as the plain conversion, or closer by hundredths of a decibel: a tie, the
        # plain conversion (hunt8's attention-pooling classifier); closer by more: kept
        closer = ref[1] + (plain_out[1] - ref[1]) * 10.0 ** (-db / 20.0)
        pooled["cle"] = [cle_out[0], closer]
        assert _choice._farther_outputs(model, ref, pooled) == farther, db
    one = keras.Model(inp, L.Dense(2, name="only")(inp))
    assert _choice._farther_outputs(one, ref[1:], {"cle": cle_out[1:],
                                                   "plain": plain_out[1:]}) == ["only"]
    # the min/max variant, when it would be written, is the one held to the plain conversion
    assert _choice._farther_outputs(one, ref[1:], {"cle": cle_out[1:], "plain": plain_out[1:],
                                                   "cle, min/max ranges": [ref[1]]},
                                    "cle, min/max ranges") == []
    text = _choice.Choice("plain", 16, {"cle": [1.0, 2.0], "plain": [1.0, 2.0]}, 64,
                          {"cle": [40.0, 20.0], "plain": [30.0, 26.0]}, ["head_b"])
    assert "not shown closer to the float model on output 'head_b'" in text.line()
    assert "'head_b'" in text.warning() and text.to_dict()["farther"] == ["head_b"]


def test_a_gain_made_by_the_expected_clipping_alone_writes_the_plain_conversion():
    """The expected clipping charges a min/max output (the plain conversion's) for new inputs
    beyond it, by a law fitted to a few dozen extremes; on two models of helper-15's hunt (an
    image output, logits of hard-swish blocks) it charged the plain conversion enough that a
    widened build the cross-fit put 0.1 and 0.8 dB below it was written, and it read 0.8 dB
    below on new inputs. Farther as measured is farther: the plain conversion is written.
    Closer as measured, the expected clipping still decides."""
    from cle._quantize import choice as _choice

    rng = np.random.default_rng(6)
    inp = keras.Input((4,))
    model = keras.Model(inp, L.Dense(3, name="image")(inp))
    ref = [rng.normal(size=(64, 3))]
    plain = [ref[0] + rng.normal(scale=0.010, size=(64, 3))]
    mine = [ref[0] + rng.normal(scale=0.011, size=(64, 3))]  # a little farther, every input
    pooled = {"plain": plain, "cle, widened ranges": mine}
    wide = "cle, widened ranges"
    charged = {"plain": [5e-4], wide: [0.0]}  # the plain output's expected clipping
    # charged, the plain conversion is the farther one, with the inputs' backing
    gain, _, support = _choice._output_gains(ref, plain, mine, charged["plain"],
                                             charged[wide])[0]
    assert gain < 0 and support < 1.0 - _choice.PLAIN_SUPPORT
    assert _choice._farther_outputs(model, ref, pooled, wide, charged) == ["image"]
    pooled[wide] = [ref[0] + rng.normal(scale=0.009, size=(64, 3))]  # closer as measured
    assert _choice._farther_outputs(model, ref, pooled, wide, charged) == []


def test_a_build_that_falls_in_the_cross_fit_brings_the_plain_conversion_back(
        net, data, monkeypatch):
    """The screen on the held-out quarter leaves the plain conversion out when cle's build,
    calibrated on three quarters, is clearly closer there; the build written is then made
    from every input, and its cross-fit checks builds of its kind on other inputs. When those
    fall far below the plain conversion's figure on the quarter (once, a channel silent on
    the three quarters amplified without bound made every one a constant: 5 dB against
    plain's 42), the plain conversion is cross-fitted after all and the rule against it
    applies."""
    from cle._quantize import choice as _choice
    from cle._quantize.crossfit import CrossFit

    monkeypatch.setattr(_choice, "_may_switch", lambda gain, margin=0.0: False)  # screened
    _, kept = cle.quantize(net, data, output_kinds=LOGITS)
    assert kept.choice.written == "cle" and "plain" not in kept.choice.crossfit
    outputs = CrossFit.outputs

    def fallen(self, name):
        ys = outputs(self, name)
        return ys if name == "plain" else [y + 100.0 * np.std(y) for y in ys]

    monkeypatch.setattr(CrossFit, "outputs", fallen)
    _, report = cle.quantize(net, data, output_kinds=LOGITS)
    assert "plain" in report.choice.crossfit and report.choice.written == "plain"
    assert report.choice.crossfit["plain"][0] > report.choice.crossfit["cle"][0] + 20


def test_a_gain_the_inputs_do_not_back_writes_the_plain_conversion():
    """cle's build closer on the mean of the inputs at hand but not in PLAIN_SUPPORT of the
    bootstrap's resamples (a few inputs decide) is a tie: the plain conversion is written; the
    same gain spread over every input is kept."""
    from cle._quantize import choice as _choice

    inp = keras.Input((4,), name="x")
    model = keras.Model(inp, L.Dense(2, name="only")(inp))
    rng = np.random.default_rng(8)
    ref = [rng.normal(size=(64, 2))]
    plain_err = 0.01 * rng.normal(size=(64, 2))
    scale = np.where(rng.random(64) < 0.1, 2.0, 0.8)[:, None]  # most inputs closer, a few far
    noisy = [ref[0] + plain_err * scale]
    gain, _, support = C.sqnr_gain(ref, noisy, [ref[0] + plain_err])
    assert gain > 0 and support < _choice.PLAIN_SUPPORT  # the premise
    pooled = {"cle": noisy, "plain": [ref[0] + plain_err]}
    assert _choice._farther_outputs(model, ref, pooled) == ["only"]
    pooled["cle"] = [ref[0] + plain_err * 0.9]  # closer on every input: backed
    assert _choice._farther_outputs(model, ref, pooled) == []


def test_without_data_a_regression_output_is_refused_and_a_bounded_one_is_not():
    """What synthetic inputs cannot know, asked for before any work: a linear output of a few
    values (a regression value, a box) needs data; class scores (declared, or a softmax or
    sigmoid), a bounded ending (tanh) and a vector of MIN_CLASSES entries or more do not. The
    command line says it in one line naming --calibration."""
    from cle._measure.synthetic import NeedsData

    inp = keras.Input((8, 8, 3), name="image")
    h = L.GlobalAveragePooling2D()(L.BatchNormalization(name="bn")(L.Conv2D(4, 3, name="c")(inp)))
    outs = {"value": L.Dense(1, name="value")(h), "box": L.Dense(4, name="box")(h),
            "angle": L.Dense(2, activation="tanh", name="angle")(h),
            "two": L.Dense(2, name="two")(h), "logits": L.Dense(C.MIN_CLASSES, name="logits")(h)}
    model = keras.Model(inp, outs)
    assert _synthetic.regression_outputs(model) == [("box", 4), ("two", 2), ("value", 1)]
    assert _synthetic.regression_outputs(model, {"two": "classes"}) == [("box", 4), ("value", 1)]
    with pytest.raises(NeedsData, match=r"output 'box' \(4 values\), output 'two' \(2 "
                                        r"values\), output 'value' \(1 value\)"):
        cle.quantize(model, input_range=(-1.0, 1.0))
    only = keras.Model(inp, [outs["angle"], outs["logits"]])
    assert _synthetic.regression_outputs(only) == []


def test_without_data_values_joined_to_class_scores_are_refused():
    """hunt12: one output concatenating a softmax's probabilities and a box in pixels (12
    entries, no ending) was taken for logits; without data the box's range came from synthetic
    inputs (four times the real one), every probability read 0 in the file, and the check,
    ruled by the box's energy, claimed a fair figure: silent corruption. A concatenation of
    such values is refused as they are; one of bounded parts is not."""
    from cle._measure.synthetic import NeedsData

    inp = keras.Input((8, 8, 3), name="image")
    h = L.GlobalAveragePooling2D()(L.BatchNormalization(name="bn")(L.Conv2D(4, 3, name="c")(inp)))
    probs = L.Dense(8, activation="softmax", name="probs")(h)
    joined = L.Concatenate(name="probs_box")([probs, L.Dense(4, name="box")(h)])
    model = keras.Model(inp, joined)
    assert _synthetic.regression_outputs(model) == [("probs_box", 12)]
    with pytest.raises(NeedsData, match=r"output 'probs_box' \(12 values\)"):
        cle.quantize(model, input_range=(-1.0, 1.0))
    bounded = L.Concatenate()([probs, L.Dense(4, activation="sigmoid", name="s")(h)])
    assert _synthetic.regression_outputs(keras.Model(inp, bounded)) == []


def test_without_data_a_map_of_values_made_past_the_last_batch_norm_is_refused():
    """A map of a few channels that a layer with weights makes past the last batch norm on
    every path holds values per position as a regression head does (hunt9's raw detection
    grid, 4x4x8: without data its size channels were clipped where synthetic inputs stopped,
    12 dB below the converter, its check 9.5 dB above the real figure): refused. Not refused
    (helper-38's review): a map of one channel (a binary segmentation's logits, which cannot
    be declared class scores), an image-to-image net's image (the input's channels, a whole
    multiple of its size), a map the input joins unweighted (a residual denoiser's input +
    its correction), a bounded ending (a sigmoid mask), a map of MIN_CLASSES channels or more
    (segmentation logits, maybe), one declared class scores."""
    from cle._measure.synthetic import NeedsData

    inp = keras.Input((8, 8, 3), name="image")
    h = L.ReLU()(L.BatchNormalization(name="bn")(L.Conv2D(6, 3, padding="same", name="c")(inp)))
    small = C.MIN_CLASSES - 2
    outs = {"grid": L.Conv2D(small, 1, name="grid")(h),
            "half": L.Conv2D(3, 2, strides=2, name="half")(h),  # a coarser grid of 3 channels
            "logit": L.Conv2D(1, 1, name="logit")(h),
            "upscaled": L.Conv2DTranspose(3, 2, strides=2, name="upscaled")(h),
            "clean": L.Add(name="clean")([inp, L.Conv2D(3, 1, name="corr")(h)]),
            "mask": L.Conv2D(1, 1, activation="sigmoid", name="mask")(h),
            "seg": L.Conv2D(C.MIN_CLASSES, 1, name="seg")(h)}
    model = keras.Model(inp, outs)
    assert _synthetic.regression_outputs(model) == [("grid", 64 * small), ("half", 48)]
    assert _synthetic.regression_outputs(model, {"grid": "classes"}) == [("half", 48)]
    with pytest.raises(NeedsData, match=rf"output 'grid' \({64 * small} values\), output "
                                        r"'half' \(48 values\)"):
        cle.quantize(model, input_range=(-1.0, 1.0))
    only = keras.Model(inp, [outs[k] for k in ("logit", "upscaled", "clean", "mask", "seg")])
    assert _synthetic.regression_outputs(only) == []


def test_a_model_quantized_twice_without_data_distills_both_times():
    """The distillation's step is kept for the model's life (cle._measure.synthetic._runner);
    on JAX, Keras' jitted predict donates the model's arrays, so a step that read them once
    crashed the next call ("Buffer has been deleted or donated") after the first call's check
    had run the model. Caught: the weights read once, when the step is made (on JAX)."""
    model = _net(seed=3)
    first = cle.quantize(model, input_range=(-1.0, 1.0), output_kinds=LOGITS)[1].sqnr_db
    again = cle.quantize(model, input_range=(-1.0, 1.0), output_kinds=LOGITS)[1].sqnr_db
    assert again == pytest.approx(first, abs=1e-6)


def test_an_integer_or_bool_output_is_no_regression_head():
    """A bool or integer output (a comparison, an argmax) is not quantized and has no range
    to find: without data it was refused as "a regression head" (helper-20's hunt). A float
    one of as few entries still is."""
    inp = keras.Input((6,), name="x")
    p = L.Dense(3, name="value")(inp)
    model = keras.Model(inp, [p, keras.ops.greater(p, 0.0),
                              keras.ops.cast(keras.ops.argmax(p, axis=-1), "int32")])
    names = C.output_names(model)
    assert _synthetic.regression_outputs(model) == [(names[0], 3)]


def test_without_data_a_file_far_from_its_float_model_is_refused(net, monkeypatch):
    """A file made without data whose check reads an output below FAR_DB on the synthetic
    inputs is no answer (helper-15: a net of selu/softplus/mish blocks got a 0.4 dB file, top-1
    40 %, exit 0): refused, naming the output and its figure, and what would settle it."""
    from cle._measure import synthetic
    from cle._measure.check import OutputCheck

    far = OutputCheck("scores", "values", 0.4, float("nan"))
    with pytest.raises(synthetic.NeedsData, match=r"output 'scores': 0\.4 dB; a file needs 6 dB.*"
                                                   r"pass calibration_data$"):
        synthetic.refuse_far_file([OutputCheck("near", "values", 30.0, float("nan")), far])
    synthetic.refuse_far_file([OutputCheck("near", "values", 30.0, float("nan"))])
    _, report = cle.quantize(net, input_range=(-1.0, 1.0), output_kinds=LOGITS)  # passes
    monkeypatch.setattr(synthetic, "FAR_DB", report.sqnr_db + 1.0)  # the same file, too far
    with pytest.raises(synthetic.NeedsData, match="far from the float model"):
        cle.quantize(net, input_range=(-1.0, 1.0), output_kinds=LOGITS)


def test_an_interval_without_width_is_said_to_say_nothing():
    """Every calibration output of a softmax one-hot, each quantized within the same fraction
    of a step: every input read the 8-bit ceiling, and the claim came with an interval of no
    width, while one held-out input in 320 held most of the real error (helper-16). Said."""
    from cle._measure.check import OutputCheck, _flat_caveats

    flat = OutputCheck("softmax", "values", 48.16, float("nan"), sqnr_interval=(48.16, 48.16))
    wide = OutputCheck("other", "values", 30.0, float("nan"), sqnr_interval=(28.0, 31.0))
    (said,) = _flat_caveats({"outputs": [flat, wide]}, ["softmax", "other"])
    assert said.startswith("output 'softmax': every check input reads the same figure (48.2 dB)")


def test_without_data_one_refusal_names_the_output_and_the_input_range():
    """A regression output and an input whose range the model cannot tell (an activation
    before its first batch norm): the refusal named the output and said to declare it; once
    declared, a second refusal asked for the input range. One refusal names both."""
    from cle._measure.synthetic import NeedsData
    from cle._quantize.input_ranges import InputRangeUnknown

    inp = keras.Input((8, 8, 3), name="image")
    h = L.Conv2D(4, 3, activation="relu", name="c")(inp)
    h = L.GlobalAveragePooling2D()(L.BatchNormalization(name="bn")(h))
    model = keras.Model(inp, L.Dense(4, name="scores")(h))
    with pytest.raises(NeedsData) as info:
        cle.quantize(model)
    message = str(info.value)
    assert "output 'scores' (4 values) cannot be found" in message
    assert "state the input range, which the model cannot tell either (input 'image'" in message
    assert "input_range=(low, high)" in message and message.endswith("pass calibration_data")
    with pytest.raises(InputRangeUnknown):  # declared: the input range is what is left
        cle.quantize(model, output_kinds={"scores": "classes"})
    with pytest.raises(NeedsData) as stated:  # the range stated: the output alone
        cle.quantize(model, input_range=(0, 1))
    assert "input range" not in str(stated.value)


def test_the_command_line_refuses_a_regression_output_without_data(tmp_path, capsys):
    from cle import cli

    inp = keras.Input((8, 8, 3), name="image")
    h = L.GlobalAveragePooling2D()(L.BatchNormalization(name="bn")(L.Conv2D(4, 3, name="c")(inp)))
    keras.Model(inp, L.Dense(4, name="box")(h), name="boxer").save(tmp_path / "m.keras")
    code = cli.main(["quantize", str(tmp_path / "m.keras"), "-o", str(tmp_path / "m.tflite"),
                     "--input-range=-1,1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and not (tmp_path / "m.tflite").exists()
    assert "the range of output 'box' (4 values) cannot be found" in err[0]
    assert err[0].endswith("; pass --calibration PATH")


def test_without_data_an_output_decoded_from_a_code_is_refused_naming_the_code():
    """An autoencoder whose decoder has no batch norm (hunt7: without data 11 dB below TF
    Lite's converter, its check 12 dB above the real figure): the reconstruction is a map of
    bounded values, not a regression head, but every path back from it passes a vector
    synthetic inputs cannot tell (the narrowest, the code, is named). A U-Net-like map (no
    vector past its last batch norm), a map a squeeze-excitation gate or a context vector only
    joins (helper-34's review: both were refused at first), and a classifier are not."""
    from cle._measure.synthetic import NeedsData, coded_outputs

    inp = keras.Input((8, 8, 1), name="gray")
    h = L.ReLU()(L.BatchNormalization(name="bn")(L.Conv2D(4, 3, 2, "same", name="c")(inp)))
    code = L.Dense(6, name="code")(L.Flatten()(h))
    g = L.Reshape((4, 4, 2))(L.Dense(32, activation="relu", name="grow")(code))
    # (a kernel of 2: on JAX one of 3 at stride 2 is refused first, tests/test_unconvertible)
    recon = L.Conv2DTranspose(1, 2, 2, "same", activation="sigmoid", name="recon")(g)
    unet = L.Conv2D(1, 1, activation="sigmoid", name="mask")(L.UpSampling2D()(h))
    gate = L.Dense(4, activation="sigmoid", name="gate")(L.GlobalAveragePooling2D()(h))
    # (sigmoid maps: a linear map of one channel is a map of values per position, refused as
    # a regression head is: test_without_data_a_map_of_values_made_past_the_last_batch_norm_...)
    se = L.Conv2D(1, 1, activation="sigmoid", name="se_map")(
        L.Multiply()([h, L.Reshape((1, 1, 4))(gate)]))
    context = L.Reshape((1, 1, 4))(L.Dense(4, name="context")(L.GlobalAveragePooling2D()(h)))
    joined = L.Conv2D(1, 1, activation="sigmoid", name="context_map")(L.Add()([h, context]))
    scores = L.Dense(3, activation="softmax", name="scores")(L.GlobalAveragePooling2D()(h))
    model = keras.Model(inp, [recon, unet, se, joined, scores], name="ae")
    assert coded_outputs(model) == [("recon", "code", 6)]
    with pytest.raises(NeedsData) as info:
        cle.quantize(model, input_range=(0, 1))
    message = str(info.value)
    assert ("output 'recon' comes from the vector of layer 'code' (6 values), past the "
            "last batch norm on every path") in message
    assert not any(f"'{name}'" in message for name in ("mask", "se_map", "context_map"))
    assert message.endswith("pass calibration_data")


@pytest.mark.parametrize("norm", ["unit", "layer", "group", "lambda"])
def test_without_data_a_bounded_vector_past_the_last_batch_norm_is_refused(norm):
    """A vector output whose ending bounds it still has a range synthetic inputs cannot tell
    before that ending (hunt8, without data: a tanh regression head 13 dB below TF Lite's
    converter, L2-normalized embeddings 9 and 11 dB below it with their checks 11 dB above
    the real figures): refused, naming the vector; a unit-length embedding is no linear
    vector, nor is a layer-normalized one or a Lambda's (no logits for the distillation to
    push, no offer to declare it class scores; the refusal says how to declare one). A
    single sigmoid is refused only when it is said to hold values (its loss, or
    output_kinds): a binary classifier's score saturates where synthetic inputs stop."""
    from cle._measure import check
    from cle._measure.synthetic import NeedsData, coded_outputs

    inp = keras.Input((8, 8, 3), name="image")
    h = L.ReLU()(L.BatchNormalization(name="bn")(L.Conv2D(4, 3, name="c")(inp)))
    pooled = L.GlobalAveragePooling2D()(h)
    tanh = L.Dense(2, activation="tanh", name="balance")(pooled)
    normalize = {"unit": lambda: L.UnitNormalization(name="embedding"),
                 "layer": lambda: L.LayerNormalization(name="embedding"),
                 "group": lambda: L.GroupNormalization(groups=4, name="embedding"),
                 "lambda": lambda: L.Lambda(keras.ops.normalize, name="embedding")}[norm]()
    embed = normalize(L.Dense(12, name="embed")(pooled))
    score = L.Dense(1, activation="sigmoid", name="score")(L.Dense(8, activation="relu")(pooled))
    model = keras.Model(inp, [tanh, embed, score], name="heads")
    assert check.undeclared_scores(model) == []  # the embedding is not taken for logits
    assert check.guessed_scores(model) == ["values"] * 3
    assert coded_outputs(model) == [("balance", "balance", 2), ("embedding", "embed", 12)]
    assert coded_outputs(model, {"score": "values"})[-1] == ("score", "score", 1)
    with pytest.raises(NeedsData) as info:
        cle.quantize(model, input_range=(0, 1))
    message = str(info.value)
    assert ("output 'balance' comes from the vector of layer 'balance' (2 values), output "
            "'embedding' comes from the vector of layer 'embed' (12 values), past the last "
            "batch norm on every path") in message
    assert "'score'" not in message
    assert "if such an output holds class scores, declare it" in message
    model.compile(loss=["mse", "cosine_similarity", "mse"])  # the loss says values
    assert coded_outputs(model)[-1] == ("score", "score", 1)


def test_without_data_a_linear_vector_declared_values_is_not_pushed_as_logits():
    """A linear vector of 10 entries or more may be logits: without data the distillation
    pushes it towards a class, and it is not refused. Declared values (or compiled with a
    regression loss) it is neither pushed nor left unrefused: it is a vector past the last
    batch norm like any embedding (a review's finding: the declaration was read for the check
    and ignored by the distillation)."""
    from cle._measure import check
    from cle._measure.synthetic import NeedsData, coded_outputs

    inp = keras.Input((8, 8, 3), name="image")
    h = L.ReLU()(L.BatchNormalization(name="bn")(L.Conv2D(4, 3, name="c")(inp)))
    model = keras.Model(inp, L.Dense(16, name="embed")(L.GlobalAveragePooling2D()(h)))
    assert check.guessed_scores(model) == ["logits"]
    assert coded_outputs(model) == []
    assert check.guessed_scores(model, {"embed": "values"}) == ["values"]
    assert coded_outputs(model, {"embed": "values"}) == [("embed", "embed", 16)]
    with pytest.raises(NeedsData, match="output 'embed' comes from the vector of layer "
                                        "'embed' \\(16 values\\)"):
        cle.quantize(model, input_range=(0, 1), output_kinds={"embed": "values"})
    model.compile(loss="mse")
    assert check.guessed_scores(model) == ["values"]
    assert coded_outputs(model) == [("embed", "embed", 16)]


class _FakeInterpreter:
    """What :func:`cle._tflite.converter.observe` asks of LiteRT's interpreter, with tensor 0
    of a fixed size and tensor 1 whose size changes from input to input."""

    def __init__(self, sizes):
        self.sizes, self.k, self.x = sizes, -1, None

    def get_input_details(self):
        return [{"name": "x", "index": 99}]

    def resize_tensor_input(self, *args, **kwargs):
        pass

    def allocate_tensors(self):
        pass

    def set_tensor(self, index, value):
        self.x = value

    def invoke(self):
        self.k += 1

    def get_tensor(self, index):
        size = 3000 if index == 0 else self.sizes[self.k]
        return float(self.x.ravel()[0]) + np.arange(size, dtype=np.float32) / size


@pytest.mark.parametrize("sizes", [(50, 50, 50, 50), (50, 50, 4000, 20)])
def test_observe_keeps_each_inputs_sample_in_order(monkeypatch, sizes):
    """Bug caught: the sample written in place losing or reordering an input's values, or a
    tensor whose size changes between inputs (kept as pieces) breaking the measurement.
    Against the definition: per input, the tensor whole or ``per_input`` positions drawn with
    replacement, then the exact min and max."""
    per_tensor = 1000  # per input: 250 of 4 inputs
    fake = _FakeInterpreter(sizes)
    monkeypatch.setattr(tflite, "interpreter", lambda *a, **k: fake)
    monkeypatch.setattr(tflite, "input_details_by_name", lambda interp, names: [
        {"name": "x", "index": 99}])
    x = _inputs.ModelInputs((np.arange(4, dtype=np.float32).reshape(4, 1),), ("x",), ((1,),))
    extremes = {}
    got = tflite.observe(b"", x, [0, 1], per_tensor=per_tensor, seed=3, extremes=extremes)
    rng = np.random.default_rng(3)
    want = {0: [], 1: []}
    for k in range(4):
        for i in (0, 1):
            size = 3000 if i == 0 else sizes[k]
            v = k + np.arange(size, dtype=np.float32) / size
            want[i].append(v[rng.integers(0, size, 250)] if size > 250 else v)
    for i in (0, 1):
        full = [k + np.arange(3000 if i == 0 else sizes[k]) / (3000 if i == 0 else sizes[k])
                for k in range(4)]
        ends = [min(float(np.float32(f).min()) for f in full),
                max(float(np.float32(f).max()) for f in full)]
        expected = np.concatenate(want[i] + [np.array(ends, np.float32)])
        assert got[i].dtype == np.float32
        np.testing.assert_array_equal(got[i], expected)
        np.testing.assert_array_equal(extremes[i][0], [float(np.float32(f).min()) for f in full])


def test_a_nested_models_outputs_are_told_apart_by_position():
    """A nested model's outputs share its name: the regression head it makes must not hide
    the tanh head beside it from the refusal of vectors (helper-36's review)."""
    from cle._measure.synthetic import coded_outputs, regression_outputs

    inp = keras.Input((8, 8, 3), name="image")
    h = L.ReLU()(L.BatchNormalization(name="bn")(L.Conv2D(4, 3, name="c")(inp)))
    pooled = L.GlobalAveragePooling2D()(h)
    inner = keras.Model(inp, [L.Dense(1, name="value")(pooled),
                              L.Dense(2, activation="tanh", name="balance")(pooled)], name="inner")
    outer = keras.Model(inp, inner(inp), name="outer")
    assert [name for name, _ in regression_outputs(outer)] == ["inner"]
    assert [(name, n) for name, _, n in coded_outputs(outer)] == [("inner", 2)]
