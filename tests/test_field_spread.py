"""Without data, natural-image-like inputs the batch norms would not recognize are left out of
the calibration (cle._measure.field_spread)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import cle
from cle._core.inputs import ModelInputs
from cle._measure import field_spread as FS


def _net(seed=0):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((12, 12, 3), name="img")
    h = keras.layers.Conv2D(6, 3, name="conv")(inp)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.ReLU()(h)
    h = keras.layers.Conv2D(5, 3, name="conv2")(h)
    h = keras.layers.BatchNormalization(name="bn2")(h)
    out = keras.layers.Dense(3, activation="softmax")(keras.layers.GlobalAveragePooling2D()(h))
    return keras.Model(inp, out)


def _inputs(n, seed):
    x = np.random.default_rng(seed).normal(0.5, 0.3, (n, 12, 12, 3)).astype(np.float32)
    return ModelInputs((x,), ("img",), ((12, 12, 3),))


def _remember(model, x, scales):
    """Sets each batch norm's moving statistics to its input's on ``x``, the variance times
    that batch norm's entry of ``scales``."""
    for name, scale in zip(("bn", "bn2"), scales):
        bn = model.get_layer(name)
        a = keras.Model(model.inputs, bn.input).predict(x, verbose=0)
        a = a.reshape(-1, a.shape[-1])
        bn.moving_mean.assign(a.mean(0))
        bn.moving_variance.assign(a.var(0) * scale - bn.epsilon)


def test_the_spread_is_the_median_width_over_what_the_batch_norms_remember():
    model, x = _net(), _inputs(20, 1)  # 20: not a multiple of the batch of 8
    _remember(model, x.arrays[0], (1.0, 1.0))
    assert FS.spread(model, x) == pytest.approx(1.0, rel=1e-5)
    _remember(model, x.arrays[0], (1 / 4, 1 / 9))  # remembered 2 and 3 times narrower
    assert FS.spread(model, x) == pytest.approx(2.5, rel=1e-5)  # the median of 2 and 3
    # a median over the channels: one channel remembered wider does not move it
    bn = model.get_layer("bn2")  # the last: what it remembers changes no other's input
    v = np.array(bn.moving_variance)
    v[0] *= 16
    bn.moving_variance.assign(v)
    assert FS.spread(model, x) == pytest.approx(2.5, rel=1e-5)  # still the median of 2 and 3


def test_fields_unlike_the_data_are_left_out_of_the_calibration_and_the_words_say_so():
    model, distilled, fields = _net(), _inputs(8, 2), _inputs(10, 3)
    _remember(model, fields.arrays[0], (1.0, 1.0))
    both, what = FS.calibration_inputs(model, distilled, fields)
    assert len(both) == 18
    np.testing.assert_array_equal(both.arrays[0][:8], distilled.arrays[0])
    np.testing.assert_array_equal(both.arrays[0][8:], fields.arrays[0])
    assert what == ("8 distilled from the model's batch-norm statistics and 10 "
                    "natural-image-like inputs across the input range")
    # the fields spread both batch norms' inputs 1.3 times as wide as they remember
    _remember(model, fields.arrays[0], (1 / 1.3 ** 2, 1 / 1.3 ** 2))
    alone, what = FS.calibration_inputs(model, distilled, fields)
    assert alone is distilled
    assert "natural-image-like inputs left out" in what and "1.30 times as wide" in what
    assert f"past {FS.SPREAD_LIMIT:g}" in what
    _remember(model, fields.arrays[0], (1 / 1.2 ** 2, 1 / 1.2 ** 2))  # within the limit
    assert len(FS.calibration_inputs(model, distilled, fields)[0]) == 18


def test_without_data_the_pipeline_calibrates_on_what_the_spread_allows(monkeypatch):
    """quantize's synthetic calibration takes the distilled inputs alone when the fields are
    unlike the data to the batch norms, and says so in the report's calibration words; the
    check still runs on the fields, marked as not bounding the figures."""
    from cle._measure import input_range as IR
    from cle._quantize import pipeline as P
    from cle._quantize.options import QuantizeOptions

    model = _net()
    ranges = [IR.InputRange("img", 0.0, 1.0, "stated", True)]
    calls = []

    def distill(model_, n, **kwargs):  # stands in for the distillation (seconds): fixed inputs
        calls.append(n)
        return _inputs(n, 10 + len(calls)), [0.0]

    monkeypatch.setattr(P._synthetic, "distill", distill)
    opts = QuantizeOptions()
    fields = P._fields(_inputs(1, 0), ranges, P.SYNTHETIC_CHECK, opts.seed + 1)
    for scale, n in ((1.0, P.SYNTHETIC_CALIBRATION + P.SYNTHETIC_CHECK),
                     (0.25, P.SYNTHETIC_CALIBRATION)):
        _remember(model, fields.arrays[0], (scale, scale))
        got = P._calibration_inputs(model, None, ranges, opts, lambda m: None, {})
        assert len(got.calibration) == n
        assert ("left out" in got.what) == (scale < 1)
        assert [name for name, _ in got.checks] == [
            "natural-image-like inputs across the input range",
            "inputs distilled apart from the calibration inputs"]
        # the fields left out of the calibration do not bound the figures either
        assert got.unlike == (("natural-image-like inputs across the input range",)
                              if scale < 1 else ())


def test_a_check_set_unlike_the_data_is_reported_and_not_counted():
    """The report's figures are the lower over the sets that bound them (the zoo's sepconv_bn
    without data: the fields the calibration left out read 16.1 dB, the inputs distilled apart
    37.0, real inputs 32.7): the set marked is reported, with why, and the figures are the
    others'; with every set marked (none left), all of them count."""
    from cle._measure import check as C
    from cle._quantize import check_sets as S
    from cle._quantize.report import QuantizeReport

    fields = {"inputs": "natural-image-like inputs across the input range", "n": 32,
              "outputs": [C.OutputCheck("y", "probabilities", 16.1, 0.9)], "bounds": False}
    apart = {"inputs": "inputs distilled apart from the calibration inputs", "n": 16,
             "outputs": [C.OutputCheck("y", "probabilities", 37.0, 1.0)]}
    (y,) = S.lower([fields, apart])
    assert (y.sqnr_db, y.top1_agreement) == (37.0, 1.0)
    assert S.lower([fields, dict(apart, bounds=True)])[0].sqnr_db == 37.0
    assert S.lower([fields])[0].sqnr_db == 16.1  # nothing else to take
    assert S.lower([dict(fields, bounds=True), apart])[0].sqnr_db == 16.1
    report = QuantizeReport(target={"weight_bits": 8, "per_channel": True,
                                    "activation_bits": 8, "integer_io": False},
                            calibration="synthetic", n_calibration=32,
                            check_inputs=S.check_label([fields, apart]), n_check=48,
                            equalization=cle.EqualizationReport([], [], [], [], [], [], []),
                            outputs=[y],
                            check_sets=[S.public(fields), S.public(apart)])
    lines = report._check_lines()
    said = [line for line in lines if "natural-image-like" in line]
    assert said and "not counted: unlike the data to the batch norms" in said[0]
    assert not any("not counted" in line for line in lines if "distilled apart" in line)
    assert [c["bounds"] for c in report.to_dict()["check"]["sets"]] == [False, True]
