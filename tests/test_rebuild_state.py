"""The rebuild carries every Keras layer's state, not only its variables.

Each case is a model with one layer class that holds state outside a kernel, between an input
and a Dense → BatchNormalization → Dense head with randomized BN statistics, so that
``fold_all_batch_norms`` rebuilds it; the folded model must compute what the input model does
(:func:`conftest.assert_folds`, ``max|Δ| <= RTOL * max|y|``). An adapted ``Normalization``
came out of the rebuild with mean 0 and variance 1 (Keras derives them in ``finalize_state``,
which loading a file calls and a copy of the variables does not), and an adapted
``IntegerLookup`` without its vocabulary.
"""

import keras
import numpy as np
import pytest

import cle
from conftest import assert_folds, randomize_batch_norms, tensorflow_only

L = keras.layers
RNG = np.random.default_rng(11)
X_FLOAT = RNG.normal(5.0, 3.0, (32, 6)).astype("float32")
X_SEQ = RNG.normal(0.0, 1.0, (32, 5, 4)).astype("float32")
X_INT = RNG.integers(0, 50, (32, 6)).astype("int64")


class ScaleShift(L.Layer):
    """A custom layer whose variables are made in ``build`` (one trainable, one not)."""

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1],), initializer="ones")
        self.c = self.add_weight(shape=(), initializer="zeros", trainable=False)

    def call(self, x):
        return x * self.w + self.c


def _adapted(layer, data):
    layer.adapt(data)
    return layer


def _normalization():
    return _adapted(L.Normalization(), X_FLOAT), X_FLOAT


def _normalization_given():
    return L.Normalization(mean=3.0, variance=4.0), X_FLOAT


def _normalization_axis_none():
    return _adapted(L.Normalization(axis=None), X_FLOAT), X_FLOAT


def _discretization():
    disc = _adapted(L.Discretization(num_bins=4), X_FLOAT)
    return keras.Sequential([disc, L.CategoryEncoding(4, output_mode="count")]), X_FLOAT


def _integer_lookup():
    return _adapted(L.IntegerLookup(output_mode="count"), X_INT), X_INT


def _lstm():
    return L.LSTM(6), X_SEQ


def _gru():
    return L.GRU(6, reset_after=False), X_SEQ


def _rnn_cell():
    return L.RNN(L.SimpleRNNCell(6)), X_SEQ


def _bidirectional():
    return L.Bidirectional(L.LSTM(3)), X_SEQ


def _custom():
    layer = ScaleShift()
    layer.build((None, 6))
    layer.w.assign(RNG.normal(0.0, 1.0, 6).astype("float32"))
    layer.c.assign(3.0)
    return layer, X_FLOAT


SCALE = 1.5


def _lambda_reading_globals():
    """A ``Lambda`` whose function reads names of this module (``keras``, ``SCALE``): rebuilt
    from its config it held the bytecode without those globals and raised ``NameError``."""
    return L.Lambda(lambda t: keras.ops.tanh(t) * SCALE, output_shape=lambda s: s), X_FLOAT


CASES = {
    "lambda-reading-globals": _lambda_reading_globals,
    "normalization-adapted": _normalization,
    "normalization-given": _normalization_given,
    "normalization-axis-none": _normalization_axis_none,
    "discretization-adapted": _discretization,
    "integer-lookup-adapted": _integer_lookup,
    "lstm": _lstm,
    "gru": _gru,
    "rnn-cell": _rnn_cell,
    "bidirectional": _bidirectional,
    "custom-build-variables": _custom,
}
# Lookup layers run on TensorFlow's lookup tables (tf.data only on other backends).
TF_ONLY = {"integer-lookup-adapted"}


def _model(block, x):
    inp = keras.Input(x.shape[1:], dtype=str(x.dtype))
    h = block(inp)
    h = L.Dense(8)(h)
    h = L.BatchNormalization()(h)
    model = keras.Model(inp, L.Dense(3)(h))
    randomize_batch_norms(model, seed=4)
    return model


@pytest.mark.parametrize("case", [
    pytest.param(name, marks=tensorflow_only("a lookup table")) if name in TF_ONLY else name
    for name in CASES])
def test_rebuild_keeps_state_beyond_variables(case):
    block, x = CASES[case]()
    model = _model(block, x)
    assert_folds(model, 1, x=x)


def test_equalize_and_the_saved_round_trip_keep_an_adapted_normalization(tmp_path):
    block, x = _normalization()
    model = _model(block, x)
    equalized = cle.equalize_model(model)
    expected = model.predict(x, verbose=0)
    np.testing.assert_allclose(equalized.predict(x, verbose=0), expected,
                               rtol=0, atol=1e-5 * np.abs(expected).max())
    path = tmp_path / "folded.keras"
    equalized.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), expected,
                               rtol=0, atol=1e-5 * np.abs(expected).max())


@tensorflow_only("a string tensor input")
def test_rebuild_keeps_an_adapted_string_lookup():
    import tensorflow as tf

    words = np.array([["a", "b", "c", "d", "e", "a"]] * 8 + [["f", "g", "a", "b", "h", "i"]] * 8)
    lookup = _adapted(L.StringLookup(output_mode="multi_hot"), words)
    inp = keras.Input((6,), dtype="string")
    h = L.BatchNormalization()(L.Dense(8)(lookup(inp)))
    model = keras.Model(inp, L.Dense(3)(h))
    randomize_batch_norms(model, seed=5)
    _, folded = cle.fold_all_batch_norms(model)
    x = tf.constant(words)
    expected = model(x).numpy()
    assert np.abs(expected).max() > 0.1
    np.testing.assert_allclose(folded(x).numpy(), expected, rtol=0,
                               atol=1e-5 * np.abs(expected).max())
