"""``cle.analyze`` on kinds of model ``cle.quantize`` takes and helper-55's sweep of the
zoo and the hunts found it stopping on: a mel spectrogram front end (a RESHAPE to a scalar
shape reads a constant of no elements, which the float and INT8 graphs' pairing took for an
activation) and, without data, a backbone nested in the model (the float kernels the
rounding snapped were put back by a name looked up among the outer model's layers only)."""

import keras
import numpy as np

import cle

from conftest import no_tflite_on_torch

L = keras.layers

pytestmark = no_tflite_on_torch


def test_a_mel_spectrogram_front_end_is_analysed():
    keras.utils.set_random_seed(0)
    inp = keras.Input((2112,), name="audio")
    m = L.MelSpectrogram(fft_length=256, sequence_stride=128, sampling_rate=8000,
                         num_mel_bins=16, min_freq=0.0, max_freq=4000.0)(inp)
    h = L.Conv2D(4, 3, 2, activation="relu")(L.Reshape((16, -1, 1))(m))
    model = keras.Model(inp, L.Dense(3, activation="softmax")(L.GlobalAveragePooling2D()(h)))
    rng = np.random.default_rng(0)
    x = (0.3 * np.sin(np.arange(2112)[None] * rng.uniform(0.05, 0.5, (48, 1)))
         + 0.05 * rng.standard_normal((48, 2112))).astype("float32")
    report = cle.analyze(model, x, layer_inputs=8)
    assert any(r.kind == "Conv2D" for r in report.layers)
    assert np.isfinite(report.output["sqnr_db"]), report.output


def test_a_nested_backbone_is_analysed_without_data():
    keras.utils.set_random_seed(0)
    i = keras.Input((16, 16, 3))
    h = L.ReLU()(L.BatchNormalization()(L.Conv2D(8, 3, padding="same", name="conv")(i)))
    h = L.ReLU()(L.BatchNormalization()(L.Conv2D(8, 3, strides=2, padding="same")(h)))
    inner = keras.Model(i, L.GlobalAveragePooling2D()(h), name="backbone")
    x_in = keras.Input((16, 16, 3))
    model = keras.Model(x_in, L.Dense(4, activation="softmax")(inner(x_in)))
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (128, 16, 16, 3)).astype("float32")
    model.compile("adam", "sparse_categorical_crossentropy")
    model.fit(x, rng.integers(0, 4, 128), epochs=1, verbose=0)  # BN statistics of the data
    report = cle.analyze(model, None, input_range=(-1.0, 1.0), layer_inputs=8)
    assert any("conv" in [la.split("/")[-1] for la in r.layers] or r.name == "conv"
               for r in report.layers), [r.name for r in report.layers]


def test_a_layer_norm_whose_variance_rounds_to_zero_keeps_the_simulation_finite():
    """A token of zeros: its variance plus epsilon rounds to 0 in the INT8 model, whose RSQRT
    kernel saturates at its output range; the simulation's float RSQRT gave inf there, and
    every layer after it NaN (hunt17's MLP-Mixer, hunt9's ConvNeXt). Now the simulation of
    the whole INT8 model is finite and close to the file's own figure."""
    import math

    keras.utils.set_random_seed(0)
    inp = keras.Input((4, 8))
    h = L.LayerNormalization()(L.Dense(8, use_bias=False)(inp))
    model = keras.Model(inp, L.Dense(3)(L.Flatten()(h)))
    x = np.random.default_rng(0).standard_normal((64, 4, 8)).astype("float32")
    x[:, 3, :] = 0.0
    report = cle.analyze(model, x)
    simulated = report.simulation["output_sqnr_db"]
    assert math.isfinite(simulated) and abs(simulated - report.output["sqnr_db"]) < 3.0
    assert all(r.simulated_sqnr_db is None or math.isfinite(r.simulated_sqnr_db)
               for r in report.layers)


def test_snapped_kernels_of_same_named_layers_in_two_nested_models_come_back():
    """Two nested models each with a Conv2D named 'conv': the rounding's snapped kernels are
    kept by scope and name, so each layer gets its own float kernel back (by name alone the
    second overwrote the first: helper-58's review)."""
    from cle._quantize import weight_stages
    from cle._quantize.options import QuantizeOptions

    keras.utils.set_random_seed(0)

    def branch(name):
        i = keras.Input((8, 8, 3))
        return keras.Model(i, L.Conv2D(4, 3, padding="same", name="conv")(i), name=name)

    inp = keras.Input((8, 8, 3))
    model = keras.Model(inp, L.Add()([branch("a")(inp), branch("b")(inp)]))
    kernels = [np.array(m.get_layer("conv").kernel) for m in model.layers[1:3]]
    snapped = weight_stages.snap_stage(model, QuantizeOptions.from_call(None), lambda _: None)
    assert len(snapped) == 2
    weight_stages.unsnap(model, snapped)
    for m, k in zip(model.layers[1:3], kernels):
        np.testing.assert_array_equal(np.array(m.get_layer("conv").kernel), k)
