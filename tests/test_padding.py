"""A padding by ``-inf`` before a max pooling (keras_hub's ResNetV2 and CSPNet stems): TF Lite
calibrates the padding's range down to the lowest float, and its quantizer gives the padding
and its input one scale, so every output of the plain converter's file reads 0. cle's builds
give the padding its input's range (:func:`cle._tflite.roles.padded_below`,
:func:`cle._tflite.converter.with_ranges`)."""

import keras
import numpy as np
import pytest

from cle import quantization as Q
from cle._tflite import converter as T

from conftest import no_tflite_on_torch

L = keras.layers

pytestmark = no_tflite_on_torch


def _sqnr(ref, y):
    ref, y = np.asarray(ref, np.float64), np.asarray(y, np.float64)
    return 10 * np.log10(np.sum(ref ** 2) / np.sum((ref - y) ** 2))


def _stem(value=float("-inf"), pool=3, width=1, reader="pool"):
    """A stem conv (no activation: negative values), a padding by ``value`` of ``width`` on
    each side of the map, then ``reader`` (a max pooling of ``pool``, or a convolution), a
    small head of 5 logits."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((24, 24, 3), name="image")
    h = L.Conv2D(16, 3, strides=2, padding="same", name="stem")(inp)
    pads = [[0, 0], [width, width], [width, width], [0, 0]]
    h = keras.ops.pad(h, pads, constant_values=value)
    h = (L.MaxPooling2D(pool, strides=2, name="pool")(h) if reader == "pool"
         else L.Conv2D(16, 3, name="reader")(h))
    h = L.ReLU()(L.BatchNormalization(name="bn")(L.Conv2D(24, 3, padding="same", name="c1")(h)))
    return keras.Model(inp, L.Dense(5, name="logits")(L.GlobalAveragePooling2D()(h)))


def _images(n, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (n, 24, 24, 3)).astype("float32")


def test_a_minus_inf_padding_before_a_max_pooling_takes_its_inputs_range():
    """The premise (the plain converter's file reads about 0 dB: its stem's 8-bit step is
    1e36 wide), and cle's file, with data and without, as close to the float model as a
    small net's file is (the padding's constant is its lowest 8-bit value there); the report
    says why the padding's range is its input's."""
    import cle

    model = _stem()
    x, new = _images(48), _images(64, seed=1)
    ref = model.predict(new, verbose=0)
    plain = Q.run_tflite(Q.convert_to_tflite_int8(model, x), new)
    assert _sqnr(ref, plain) < 1.0  # the premise: the converter's own file is broken
    calibrated = T.calibrate(model, x[:4])
    padded = T.padded_below(calibrated)
    assert len(padded) == 1
    ranges = {r.index: r for r in T.ranges_of(calibrated)}
    (out, inp), = padded.items()
    assert ranges[out].calibrated[0] < -1e30 and ranges[inp].calibrated[0] > -1e3
    content, report = cle.quantize(model, x)
    assert _sqnr(ref, Q.run_tflite(content, new)) > 25.0
    tied = [r for r in report.ranges if r.how == T.PADDED]
    assert len(tied) == 1
    assert -1e3 < tied[0].lo < 0 < tied[0].hi  # its input's (the stem's: no other so)
    assert any((r.lo, r.hi) == (tied[0].lo, tied[0].hi) and r.how != T.PADDED
               for r in report.ranges)
    assert "a padding by a value below its input's, before a max pooling, takes its input's " \
        "range" in report.summary()
    content, _ = cle.quantize(model, x, ranges="minmax")  # a min/max build: the same
    assert _sqnr(ref, Q.run_tflite(content, new)) > 25.0


@pytest.mark.parametrize("case", ["conv_reads_it", "pool_within_padding", "value_in_range"])
def test_other_paddings_keep_their_own_range(case):
    """Not tied: a padding a convolution reads (its constant is a value the convolution
    sums), one wider than the pooling's window (a window of padding alone gives the constant
    itself), and one by a value inside its input's range (not below it)."""
    model = {"conv_reads_it": lambda: _stem(reader="conv"),
             "pool_within_padding": lambda: _stem(pool=2, width=2),
             "value_in_range": lambda: _stem(value=0.0)}[case]()
    assert T.padded_below(T.calibrate(model, _images(4))) == {}
