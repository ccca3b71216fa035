"""Without data, the choice between tail and min/max activation ranges on the check's own
synthetic sets (cle._quantize.synthetic_choice)."""

import json

import numpy as np
import pytest

import cle
from cle._measure.synthetic import NeedsData
from cle._quantize import ranges as _ranges
from cle._quantize import synthetic_choice as S
from conftest import no_tflite_on_torch, small_classifier

pytestmark = no_tflite_on_torch
LOGITS = {"logits": "classes"}


def _noisy(ref, scale, seed=0):
    """``ref`` plus noise of ``scale`` times the RMS of ``ref`` (the same draw at every
    scale: SQNR -20 log10(scale), exactly)."""
    noise = np.random.default_rng(seed).normal(0, 1, ref.shape)
    return ref + noise * scale * np.sqrt(np.mean(ref ** 2) / np.mean(noise ** 2))


def test_the_lower_figure_over_the_sets_decides():
    """A build far better on one set and worse on the other, the lower one, loses: the
    check states the lower figure, and the choice reads both builds as the check does."""
    refs = [[np.random.default_rng(s).normal(0, 1, (32, 10))] for s in (1, 2)]
    # set 0: ys far closer (40 dB against 20); set 1, the lower: ys 10 dB, others 15 dB
    ys = [[_noisy(refs[0][0], 0.01)], [_noisy(refs[1][0], 10 ** -0.5)]]
    others = [[_noisy(refs[0][0], 0.1)], [_noisy(refs[1][0], 10 ** -0.75)]]
    gain, support, (mine, theirs) = S.lower_gain(refs, ys, others)
    assert gain == pytest.approx(-5.0) and support < 0.05
    assert mine == pytest.approx(10.0) and theirs == pytest.approx(15.0)
    gain, support, _ = S.lower_gain(refs, others, ys)
    assert gain == pytest.approx(5.0) and support > S.SUPPORT


def test_outputs_exact_in_both_builds_are_left_out():
    refs = [[np.ones((20, 3)), np.random.default_rng(s).normal(0, 1, (20, 4))] for s in (1, 2)]
    ys = [[r[0].copy(), _noisy(r[1], 0.1)] for r in refs]
    others = [[r[0].copy(), _noisy(r[1], 0.05)] for r in refs]
    gain, support, figures = S.lower_gain(refs, others, ys)
    assert gain == pytest.approx(20 * np.log10(2)) and support > S.SUPPORT
    assert all(np.isfinite(figures))


@pytest.fixture(scope="module")
def net():
    return small_classifier()


def test_tails_that_cut_the_synthetic_inputs_give_way_to_min_max(net, monkeypatch):
    """Tails far too narrow (a tenth of the values cut on each side) read far below min/max
    ranges on the check's synthetic sets: min/max ranges are written, the report's ranges and
    a note say so."""
    monkeypatch.setattr(_ranges, "TAIL", 0.1)
    content, report = cle.quantize(net, input_range=(-1.0, 1.0), output_kinds=LOGITS)
    text = report.summary()
    assert "activation ranges: min/max of" in text
    assert any("the file written has min/max activation ranges" in w for w in report.warnings)
    assert not any(r.how == "percentile" for r in report.ranges)
    # the choice is the report's, in its summary and its dictionary
    assert isinstance(report.choice, S.NoDataChoice)
    assert report.choice.written == S.MINMAX and report.choice.support > S.SUPPORT
    tails, minmax = report.choice.means()
    assert minmax > tails + S.SWITCH_DB
    assert "written without data: cle's equalized model with every activation range" in text
    said = json.loads(json.dumps(report.to_dict()))["choice"]
    assert said["written"] == S.MINMAX and said["calibration"] == "synthetic"
    assert said["sqnr_db"]["cle"] == pytest.approx(report.choice.sqnr_db["cle"])
    # and with the tails forced, the figure is the tails' and lower: so low on JAX's
    # synthetic inputs (under 6 dB) that the file is refused
    try:
        _, forced = cle.quantize(net, input_range=(-1.0, 1.0), output_kinds=LOGITS,
                                 ranges="percentile")
    except NeedsData as refused:
        assert "came out far from the float model" in str(refused)
        return
    assert any(r.how == "percentile" for r in forced.ranges)
    assert forced.sqnr_db < report.sqnr_db


def test_min_max_ranges_keep_the_logits_widened(net, monkeypatch):
    """The min/max build sets the tensors inside the model back to their min/max, but the
    logits of a softmax output keep the range cle's build widened them to: synthetic inputs
    are less sure of their class than real ones, and the min/max of their logits cut real
    inputs' largest (the zoo's sepconv_bn)."""
    import keras

    probs = keras.Model(net.input, keras.layers.Softmax(name="probs")(net.output))
    monkeypatch.setattr(_ranges, "TAIL", 0.1)
    _, report = cle.quantize(probs, input_range=(-1.0, 1.0))
    assert report.choice.written == S.MINMAX
    assert not any(r.how == "percentile" for r in report.ranges)
    (logits,) = [r for r in report.ranges if r.how == _ranges.LOGITS]
    low, high = logits.calibrated
    assert logits.hi > high and logits.lo <= low
    assert "but the logits' (widened as in cle's build)" in report.summary()


def test_tails_kept_are_said_too(net, monkeypatch):
    """Where the tails hold (here: min/max must gain more than any figure can), the report's
    choice says cle's build was written, with both builds' figures, and no warning; the
    check's figure is the tails' lower figure."""
    monkeypatch.setattr(S, "SWITCH_DB", 1e9)
    content, report = cle.quantize(net, input_range=(-1.0, 1.0), output_kinds=LOGITS)
    choice = report.choice
    assert choice.written == "cle" and choice.warning() is None
    assert any(r.how == "percentile" for r in report.ranges)
    assert not any("min/max activation ranges" in w for w in report.warnings)
    assert "written without data: cle's build (activation ranges at their tails)" in (
        report.summary())
    assert choice.sqnr_db["cle"][0] == pytest.approx(report.outputs[0].sqnr_db, abs=1e-6)
    assert choice.n == report.n_check



def test_fields_unlike_the_data_do_not_bound_the_figures_and_still_choose(net, monkeypatch):
    """Where the batch norms say the natural-image-like fields are unlike the data (here: any
    spread passes a limit of 0), the calibration leaves them out, and so do the check's
    figures, which are the inputs distilled apart's; the fields' set is still measured and
    reported, and the choice of ranges still reads both sets (read on the distilled set
    alone it moved the zoo's sepconv_bn up by 2.4 dB and its unet_bn down by 5.0)."""
    from cle._measure import field_spread

    monkeypatch.setattr(field_spread, "SPREAD_LIMIT", 0.0)
    _, report = cle.quantize(net, input_range=(-1.0, 1.0), output_kinds=LOGITS)
    apart = "inputs distilled apart from the calibration inputs"
    assert "left out" in report.calibration_inputs
    assert [(c["inputs"] == apart, c["bounds"]) for c in report.check_sets] == [
        (False, False), (True, True)]
    assert len(report.choice.sets) == 2 and report.choice.n == 48
    (mine,) = [c["outputs"][0] for c in report.check_sets if c["bounds"]]
    assert report.outputs[0].sqnr_db == mine.sqnr_db
    assert "(not counted: unlike the data to the batch norms" in report.summary()
