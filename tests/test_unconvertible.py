"""Layers TF Lite's converter cannot write in builtin INT8 ops are refused before any work, each
named, by `cle.quantize`, `cle.analyze`, `convert_to_tflite_int8` and the command line (issue
#41: "no crash on what `cle quantize` accepts"; before, the converter's error came after the
equalization, with its cause buried in an MLIR dump). The premise of each refusal is checked on
the converter this package installs: the converter itself fails on that layer."""

from __future__ import annotations

import re

import keras
import numpy as np
import pytest
from keras import layers as L

import cle
from cle import cli
from cle import quantization as Q
from cle._core.inputs import check_calibration_data
from cle._tflite import converter as tflite
from cle._tflite import convertible

from conftest import BACKEND, no_tflite_on_torch

pytestmark = no_tflite_on_torch


def _sequence_model(layer, name):
    inp = keras.Input((12, 4), name="signal")
    return keras.Model(inp, L.Dense(3, name="head")(layer(inp)), name=name)


def _volume_model(pool, name):
    inp = keras.Input((8, 8, 8, 1), name="volume")
    x = L.Conv3D(4, 3, padding="same", activation="relu", name="conv3d")(inp)
    x = pool(2, name="pool3d")(x)
    return keras.Model(inp, L.Dense(3, name="head")(L.GlobalAveragePooling3D()(x)), name=name)


def _lookup_model():
    inp = keras.Input((6,), dtype="int32", name="ids")
    h = L.Embedding(12, 4, name="embed")(L.IntegerLookup(vocabulary=list(range(10)),
                                                          name="lookup")(inp))
    return keras.Model(inp, L.Dense(3, name="head")(L.GlobalAveragePooling1D()(h)),
                       name="lookup_net")


#: model builder, the names the refusal must hold, refused on every backend
CASES = {
    "lstm": (lambda: _sequence_model(L.LSTM(8, name="lstm"), "lstm_net"), ["'lstm' (LSTM)"]),
    "simple_rnn": (lambda: _sequence_model(L.SimpleRNN(8, name="rnn"), "rnn_net"),
                   ["'rnn' (SimpleRNN)"]),
    "bidirectional_gru": (lambda: _sequence_model(L.Bidirectional(L.GRU(8), name="bi"),
                                                  "bi_net"), ["(GRU)"]),
    "max_pool_3d": (lambda: _volume_model(L.MaxPooling3D, "max3d_net"),
                    ["'pool3d' (MaxPooling3D)", "no builtin 3-D pooling"]),
    "avg_pool_3d": (lambda: _volume_model(L.AveragePooling3D, "avg3d_net"),
                    ["'pool3d' (AveragePooling3D)"]),
    # the converter named Conv2D, LookupTableFindV2 and Placeholder, never the layer
    "integer_lookup": (_lookup_model, ["'lookup' (IntegerLookup)", "lookup table"]),
    # a raw ConverterError (helper-20's hunt): on TensorFlow the 1-D convolutions, on JAX the
    # 1-D poolings (each converts on the other backend)
    "channels_first_1d": (
        lambda: _sequence_model(
            L.Conv1D(8, 3, padding="same", data_format="channels_first", name="cf")
            if BACKEND == "tensorflow" else
            L.MaxPooling1D(2, data_format="channels_first", name="cf"), "cf1d_net"),
        ["'cf' (Conv1D): a channels_first 1-D convolution" if BACKEND == "tensorflow" else
         "'cf' (MaxPooling1D): a channels_first 1-D pooling"]),
}
if BACKEND != "tensorflow":  # TF Lite's converter writes it wrong from JAX's export only
    CASES["transpose_3_2_same"] = (
        lambda: keras.Model(inp := keras.Input((8, 8, 4), name="image"), L.Conv2DTranspose(
            4, 3, 2, "same", name="up")(inp), name="up_net"),
        ["'up' (Conv2DTranspose): a transposed convolution of padding 'same'"])


def _data(model, n=8):
    rng = np.random.default_rng(0)
    shape = (n,) + tuple(model.inputs[0].shape[1:])
    if "int" in str(model.inputs[0].dtype):
        return rng.integers(0, 10, size=shape).astype("int32")
    return rng.normal(size=shape).astype("float32")


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_up_front_with_every_layer_named(case, capsys):
    build, names = CASES[case]
    model = build()
    x = _data(model)
    for call in (lambda: cle.quantize(model, x), lambda: cle.analyze(model, x),
                 lambda: cle.quantize(model, input_range=(-3, 3)),
                 lambda: Q.convert_to_tflite_int8(model, x)):
        with pytest.raises(ValueError) as info:
            call()
        message = str(info.value)
        assert f"model '{model.name}'" in message and "\n" not in message
        assert message.endswith(f"Received: model '{model.name}' on the {BACKEND} backend")
        for name in names:
            assert name in message, message
    # before any work: the converter never ran, so it left nothing on stderr
    assert "TF Lite converter output" not in capsys.readouterr().err


#: Cases whose conversion kills the process on this backend: JAX's static export (weights as
#: constants, cle._tflite.export) of a recurrent layer reaches the calibrator, which dies.
DIES = {"lstm", "simple_rnn", "bidirectional_gru"} if BACKEND == "jax" else set()


def _in_a_child(code: str):
    """``code`` run in a new Python process of this backend, with this module importable.
    Its temporary files (the JAX export's folder, which a process that dies cannot delete)
    go to a folder of its own, deleted after."""
    import os
    import shutil
    import subprocess
    import sys
    import tempfile

    tmp = tempfile.mkdtemp(prefix="cle_child_")
    env = dict(os.environ, KERAS_BACKEND=BACKEND, TMPDIR=tmp,
               PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), *sys.path]))
    try:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=300, env=env)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_converter_itself_fails_on_each_refused_layer(case):
    """The premise: without the check, TF Lite's converter raises on the model, or LiteRT
    refuses its file (or, for the cases of ``DIES``, the process dies, checked in a child). If
    a newer converter writes one of them, this fails: drop that layer from
    ``unconvertible_layers``."""
    if case in DIES:
        run = _in_a_child(
            "import test_unconvertible as T\n"
            f"m = T.CASES[{case!r}][0]()\n"
            "T.tflite.convert_int8(m, T.check_calibration_data(m, T._data(m)))\n"
            "print('converted')\n")
        assert run.returncode != 0 and "converted" not in run.stdout, run.stderr[-500:]
        return
    model = CASES[case][0]()
    x = check_calibration_data(model, _data(model))
    with pytest.raises(Exception):  # noqa: B017 - ConverterError on TF, RuntimeError on JAX
        Q.run_tflite(tflite.convert_int8(model, x), _data(model))  # or its kernel refuses it


def test_an_unrolled_lstm_is_not_refused_and_quantizes():
    """On both backends: on JAX the export held uint32 tensors the converter refused until
    it held the weights as constants (cle._tflite.export); then an unrolled LSTM converts."""
    keras.utils.set_random_seed(0)
    model = _sequence_model(L.LSTM(8, unroll=True, name="lstm"), "unrolled")
    assert tflite.unconvertible_layers(model) == []
    x = _data(model, 32)
    content, report = cle.quantize(model, x)
    y = Q.run_tflite(content, x)
    assert y.shape == (32, 3) and np.isfinite(y).all()
    assert report.sqnr_db > 10.0  # a working file, not a refusal in disguise


def test_a_nested_layer_is_found_and_the_command_line_says_it_in_one_line(tmp_path, capsys):
    inner = keras.Sequential([keras.Input((12, 4)), L.SimpleRNN(8, name="inner_rnn")],
                             name="encoder")
    inp = keras.Input((12, 4))
    model = keras.Model(inp, L.Dense(2)(inner(inp)), name="nested")
    assert [m.split(":")[0] for m in tflite.unconvertible_layers(model)] == [
        "'inner_rnn' (SimpleRNN)"]
    path = tmp_path / "m.keras"
    model.save(path)
    np.save(tmp_path / "cal.npy", _data(model))
    code = cli.main(["quantize", str(path), "-o", str(tmp_path / "m.tflite"),
                     "--calibration", str(tmp_path / "cal.npy")])
    err = capsys.readouterr().err
    assert code == 2, err
    refusal = [line for line in err.splitlines() if "inner_rnn" in line]
    assert len(refusal) == 1 and "cannot write model 'nested'" in refusal[0], err
    assert not (tmp_path / "m.tflite").exists()


def test_a_mixed_precision_model_is_refused_naming_its_policy():
    """A model built under ``mixed_bfloat16``: TF Lite's converter fails on it with an MLIR
    dump; quantize refuses before any work, naming the policy and what to do, in one entry
    for every such layer."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        inp = keras.Input((8, 8, 1))
        h = L.Conv2D(4, 3, activation="relu", name="c1")(inp)
        h = L.Conv2D(4, 3, activation="relu", name="c2")(h)
        h = L.Dense(3, name="d")(L.GlobalAveragePooling2D(name="pool")(h))
        model = keras.Model(inp, L.Activation("softmax", dtype="float32")(h))
    finally:
        keras.config.set_dtype_policy(previous)
    (entry,) = tflite.unconvertible_layers(model)
    assert entry.startswith("'c1', 'c2', 'pool', ... (4 layers): compute "
                            "in bfloat16 (dtype policy 'mixed_bfloat16')")
    with pytest.raises(ValueError, match=r"cle\.quantize needs TF Lite's converter, which "
                                         r"cannot write model .* compute in bfloat16"):
        cle.quantize(model, np.zeros((8, 8, 8, 1), np.float32))


def test_a_model_keras_quantized_is_refused_naming_its_layers():
    """A model after Keras' own ``model.quantize("int8")``: TF Lite's converter failed on its
    int8 kernels with an MLIR dump (helper-20's hunt); quantize refuses before any work,
    naming the quantized layers and what to give instead, with data and without."""
    inp = keras.Input((8, 8, 1))
    h = L.ReLU()(L.BatchNormalization()(L.Conv2D(8, 3, padding="same", name="c1")(inp)))
    h = L.Dense(16, activation="relu", name="d1")(L.GlobalAveragePooling2D()(h))
    model = keras.Model(inp, L.Dense(4, activation="softmax", name="d2")(h))
    model.quantize("int8")
    (entry,) = tflite.unconvertible_layers(model)
    assert entry.startswith("'d1', 'd2' (2 layers): quantized by Keras (model.quantize('int8'), "
                            "dtype policy 'int8_from_float32')")
    x = np.random.default_rng(0).random((16, 8, 8, 1)).astype(np.float32)
    for call in (lambda: cle.quantize(model, x), lambda: cle.quantize(model, input_range=(0, 1)),
                 lambda: Q.convert_to_tflite_int8(model, x)):
        with pytest.raises(ValueError, match=r"cannot write model .* quantized by Keras .* the "
                                             r"float model as it was before model\.quantize\. "):
            call()


@pytest.mark.parametrize("dtype", ["float16", "bool"])
def test_an_input_the_calibration_cannot_feed_is_refused_naming_it(dtype):
    """A float16 or a bool ``keras.Input`` (an attention mask): the calibration feeds float32,
    and TF Lite's calibrator stopped on it ("Cannot set tensor: Got value of type FLOAT32 but
    expected type FLOAT16"; a bool input had no route at all: helper-20's hunt). Refused
    before any work, naming the input, with data and without; a float32 input next to it is
    not named."""
    image, other = keras.Input((8,), name="x"), keras.Input((8,), name="m", dtype=dtype)
    h = L.Dense(4, name="d")(image)
    gate = keras.ops.cast(other, "float32")
    model = keras.Model([image, other], L.Dense(2, name="out")(h * L.Dense(4)(gate)))
    (entry,) = tflite.unconvertible_layers(model)
    assert entry.startswith(f"input 'm' ({dtype}): ")
    x = [np.zeros((16, 8), np.float32), np.zeros((16, 8), np.float32)]
    for call in (lambda: cle.quantize(model, x),
                 lambda: cle.quantize(model, input_range=(0.0, 1.0))):
        with pytest.raises(ValueError, match=f"cannot write model .* input 'm' \\({dtype}\\)"):
            call()


def _image_model(layer):
    inp = keras.Input((8, 8, 3), name="image")
    return keras.Model(inp, L.Dense(2, name="head")(L.GlobalAveragePooling2D()(layer(inp))))


def _encoding_model():
    inp = keras.Input((4,), dtype="int32", name="ids")
    return keras.Model(inp, L.Dense(2, name="head")(
        L.CategoryEncoding(num_tokens=10, output_mode="multi_hot", name="enc")(inp)))


#: Layers TF Lite's converter cannot write from the TensorFlow backend's graph (from JAX's
#: export it can): its error named only the TensorFlow op (helper-20's hunt).
TENSORFLOW_ONLY = {
    "bicubic": (lambda: _image_model(L.UpSampling2D(interpolation="bicubic", name="up")),
                "'up' (UpSampling2D): a resize with interpolation='bicubic'"),
    "lanczos3": (lambda: _image_model(L.Resizing(16, 16, interpolation="lanczos3", name="rs")),
                 "'rs' (Resizing): a resize with interpolation='lanczos3'"),
    "dilated_transpose": (lambda: _image_model(L.Conv2DTranspose(4, 3, dilation_rate=2,
                                                                 padding="same", name="ct")),
                          "'ct' (Conv2DTranspose): a dilated transposed convolution"),
    "category_encoding": (_encoding_model, "'enc' (CategoryEncoding): a bincount"),
}


@pytest.mark.parametrize("case", sorted(TENSORFLOW_ONLY))
def test_a_layer_tensorflows_graph_cannot_give_the_converter_is_named(case):
    """Refused on TensorFlow naming the layer (the converter named ResizeBicubic,
    ScaleAndTranslate, Conv2DBackpropInput, DenseBincount); converted on JAX."""
    build, said = TENSORFLOW_ONLY[case]
    model = build()
    x = _data(model)
    if BACKEND != "tensorflow":
        assert tflite.unconvertible_layers(model) == []
        Q.convert_to_tflite_int8(model, x)
        return
    (entry,) = tflite.unconvertible_layers(model)
    assert entry.startswith(said), entry
    with pytest.raises(ValueError, match=re.escape(said)):
        cle.quantize(model, x)
    unchecked = check_calibration_data(model, x)
    with pytest.raises(Exception):  # noqa: B017 - the premise: the converter fails on it
        tflite.convert_int8(model, unchecked)


def test_a_one_hot_category_encoding_is_not_refused():
    """``CategoryEncoding(output_mode="one_hot")`` goes through ``one_hot``, a TF Lite builtin
    (only multi_hot and count take the bincount): it converts, and is not refused (a review
    found the first refusal covered every mode)."""
    inp = keras.Input((1,), dtype="int32", name="ids")
    model = keras.Model(inp, L.Dense(2, name="head")(
        L.CategoryEncoding(num_tokens=10, output_mode="one_hot", name="enc")(inp)))
    assert tflite.unconvertible_layers(model) == []
    Q.convert_to_tflite_int8(model, _data(model))


#: A Keras operation on a Dense layer's output, by the operation's class.
OPERATIONS = {"Argmax": lambda t: keras.ops.argmax(t, axis=-1),
              "Argmin": lambda t: keras.ops.argmin(t, axis=-1),
              "Erf": keras.ops.erf,
              "TopK": lambda t: keras.ops.top_k(t, 2)[0],
              "Sort": lambda t: keras.ops.sort(t, axis=-1),
              "Norm": lambda t: keras.ops.norm(t, axis=-1)}
REFUSED = sorted(convertible.UNCONVERTIBLE_OPERATIONS.get(BACKEND, {}))


def _operation_model(kind):
    inp = keras.Input((8,), name="features")
    return keras.Model(inp, OPERATIONS[kind](L.Dense(6, name="scores")(inp)), name=f"{kind}_net")


@pytest.mark.parametrize("kind", REFUSED)
def test_an_operation_the_converter_cannot_write_is_refused_up_front(kind, capsys):
    """A plain ``keras.ops`` call (not a layer) the converter cannot write on this backend:
    named with its way around before any work, by every entry point (before, the converter's
    error after the equalization: a raw MLIR dump, or an AttributeError on JAX's norm)."""
    model = _operation_model(kind)
    x = _data(model)
    for call in (lambda: cle.quantize(model, x), lambda: Q.convert_to_tflite_int8(model, x)):
        with pytest.raises(ValueError) as info:
            call()
        message = str(info.value)
        assert f"model '{model.name}'" in message and "keras.ops." in message, message
        assert "\n" not in message
    assert "TF Lite converter output" not in capsys.readouterr().err


@pytest.mark.parametrize("kind", REFUSED)
def test_the_converter_itself_fails_on_each_refused_operation(kind):
    """The premise of each entry of ``UNCONVERTIBLE_OPERATIONS``: without the check the
    converter fails. If a newer converter writes one, this fails: drop that entry."""
    model = _operation_model(kind)
    with pytest.raises(Exception):  # noqa: B017 - ConverterError, or the JAX export's error
        tflite.convert_int8(model, check_calibration_data(model, _data(model)))


@pytest.mark.skipif(BACKEND != "tensorflow", reason="the argmax refused is TensorFlow's")
def test_an_argmax_of_integers_is_not_refused():
    inp = keras.Input((8,), dtype="int32")
    model = keras.Model(inp, keras.ops.argmax(inp, axis=-1))
    assert convertible.unconvertible_operations(model) == []


def test_an_operation_no_table_knows_is_refused_in_one_line_by_the_converter(monkeypatch):
    """What the table does not know yet: the converter's own error becomes one ValueError
    naming the ops it could not write (TensorFlow: the BitwiseAnd of Keras' argmax; JAX: the
    StableHLO sort of its export), in the 16x8 mode too (TensorFlow only: JAX refuses it)."""
    kind = "Argmax" if BACKEND == "tensorflow" else "Sort"
    monkeypatch.setitem(convertible.UNCONVERTIBLE_OPERATIONS, BACKEND, {})
    model = _operation_model(kind)
    with pytest.raises(ValueError, match="cannot write model 'Argmax_net|cannot write model "
                                         "'Sort_net") as info:
        Q.convert_to_tflite_int8(model, _data(model))
    expected = "TensorFlow ops BitwiseAnd" if BACKEND == "tensorflow" else "ops of the JAX " \
        "export sort"
    assert expected in str(info.value) and "\n" not in str(info.value)
    if BACKEND == "tensorflow":  # the 16x8 mode's conversion says the same (it was raw)
        with pytest.raises(ValueError, match="cannot write model 'Argmax_net") as info16:
            cle.quantize(model, _data(model), activation_bits=16)
        assert expected in str(info16.value) and "\n" not in str(info16.value)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="JAX's export of this layer converts")
def test_any_other_converter_error_is_said_in_one_line_with_the_converters_words():
    """Any other failure of the converter is raised as one ValueError holding the converter's
    own error lines (hunt17's MLP-Mixer: an EinsumDense whose bias is on the token axis; the
    last line of the converter's error a user saw was a caret), by the plain conversion and
    by ``cle.quantize`` (in the 16x8 mode too, which names ``activation_bits=8``); the
    converter's error is chained."""
    inp = keras.Input((6, 4), name="tokens")
    out = L.EinsumDense("btc,ts->bsc", output_shape=(6, 4), bias_axes="s", name="mix")(inp)
    model = keras.Model(inp, out, name="token_mixer")
    x = np.random.default_rng(0).normal(size=(8, 6, 4)).astype("float32")
    said = r"converter failed on model 'token_mixer' and said: 'tf\.Transpose' op"
    with pytest.raises(ValueError, match=said) as info:
        Q.convert_to_tflite_int8(model, x)
    assert "\n" not in str(info.value) and info.value.__cause__ is not None
    with pytest.raises(ValueError, match=said):
        cle.quantize(model, x)
    # the 16x8 mode's conversion fails on it too: said as that mode's, naming the INT8 one
    said16 = r"converter failed in its 16x8 mode on model 'token_mixer' and said: 'tf\.Trans"
    with pytest.raises(ValueError, match=said16) as info16:
        cle.quantize(model, x, activation_bits=16)
    assert "activation_bits=8" in str(info16.value) and "\n" not in str(info16.value)


def test_a_float64_model_is_refused_naming_its_dtype():
    """A model built with ``dtype="float64"``: the converter failed on it naming Conv2D and
    MatMul as ops it has no builtin for (with data), and without data the distillation
    crashed with a TypeError (float64 times float32). Refused before any work, naming the
    type and the way around it."""
    inp = keras.Input((8, 8, 3), dtype="float64")
    h = L.BatchNormalization(dtype="float64", name="bn")(
        L.Conv2D(4, 3, activation="relu", dtype="float64", name="c1")(inp))
    h = L.GlobalAveragePooling2D(dtype="float64", name="pool")(h)
    model = keras.Model(inp, L.Dense(3, dtype="float64", name="d")(h), name="f64")
    (entry,) = tflite.unconvertible_layers(model)
    assert entry.startswith("'c1', 'bn', 'pool', ... (4 layers): compute in float64")
    x = np.random.default_rng(0).random((8, 8, 8, 3))
    for call in (lambda: cle.quantize(model, x), lambda: cle.quantize(model, input_range=(0, 1)),
                 lambda: Q.convert_to_tflite_int8(model, x)):
        with pytest.raises(ValueError, match="model 'f64' .* compute in float64"):
            call()
    with pytest.raises(Exception):  # noqa: B017 - the premise: the converter cannot write it
        tflite.convert_int8(model, check_calibration_data(model, x))


_EXACT_GELU_FORMS = {
    "activation layer": lambda t: L.Activation("gelu", name="act")(t),
    "fused activation": lambda t: L.Dense(6, activation="gelu", name="act")(t),
    "keras.activations call": keras.activations.gelu,
    "lambda activation": lambda t: L.Activation(
        lambda u: keras.activations.gelu(u, approximate=False), name="act")(t),
    "Lambda layer": lambda t: L.Lambda(
        lambda u: keras.ops.gelu(u, approximate=False), name="act")(t),
}


def _gelu_model(form):
    inp = keras.Input((8,), name="features")
    return keras.Model(inp, L.Dense(3, name="head")(
        _EXACT_GELU_FORMS[form](L.Dense(6, name="scores")(inp))), name="gelu_net")


@pytest.mark.parametrize("form", sorted(_EXACT_GELU_FORMS))
def test_exact_gelu_converts_on_both_backends_in_every_form(form):
    """Exact GELU (Keras' default, also inside a Python function, which no graph shows) is
    found by name, and written: on TensorFlow as one builtin op, on JAX in its tanh form
    (cle._tflite.export.TANH_GELU: the exact form's INT8 file made TF Lite's runtime abort the
    process, see the next test). The file runs and stays close to the exact float model."""
    model = _gelu_model(form)
    assert tflite.unconvertible_layers(model) == []
    assert convertible.exact_gelus(model) == ["act" if form != "keras.activations call"
                                              else model.operations[2].name]
    x = _data(model)
    y, want = Q.run_tflite(Q.convert_to_tflite_int8(model, x), x), model.predict(x, verbose=0)
    assert 10 * np.log10(np.sum(want ** 2) / np.sum((want - y) ** 2)) > 25.0
    approx = keras.Model(model.input, L.Activation(
        lambda u: keras.activations.gelu(u, approximate=True))(model.get_layer("scores").output))
    assert convertible.exact_gelus(approx) == []


@pytest.mark.skipif(BACKEND == "torch", reason="no TF Lite conversion on the torch backend")
def test_cle_quantize_says_when_it_writes_exact_gelu_in_its_tanh_form():
    """On JAX the report says the file holds the tanh form and that the check measured it
    against the exact model; on TensorFlow, which writes the exact form, it says nothing."""
    inp = keras.Input((8, 8, 3), name="image")
    h = L.Activation("gelu", name="act")(L.Conv2D(8, 3, padding="same", name="conv")(inp))
    model = keras.Model(inp, L.Dense(3, name="head")(L.GlobalAveragePooling2D()(h)))
    x = np.random.default_rng(0).normal(size=(32, 8, 8, 3)).astype("float32")
    content, report = cle.quantize(model, x)
    said = [w for w in report.warnings if "tanh form" in w]
    assert said == ([] if BACKEND == "tensorflow" else [said[0]])
    if said:
        assert said[0].startswith("exact GELU (act)") and "exact model" in said[0]
    y, want = Q.run_tflite(content, x), model.predict(x, verbose=0)
    assert 10 * np.log10(np.sum(want ** 2) / np.sum((want - y) ** 2)) > 25.0


@pytest.mark.skipif(BACKEND != "jax", reason="the abort is of JAX's export of exact GELU")
def test_the_runtime_dies_on_the_int8_file_of_exact_gelu_on_jax(tmp_path, monkeypatch):
    """Why the JAX export writes exact GELU in its tanh form: written exact, the converter
    writes the file, and TF Lite's runtime kills the process that runs it (a convolution's
    GELU here). In a child process; if a newer converter or runtime takes it, this fails: set
    cle._tflite.export.TANH_GELU to False."""
    from cle._tflite import export

    monkeypatch.setattr(export, "TANH_GELU", False)
    inp = keras.Input((8, 8, 3), name="image")
    h = L.Activation("gelu")(L.Conv2D(8, 3, padding="same", name="conv")(inp))
    model = keras.Model(inp, L.Dense(3, name="head")(L.GlobalAveragePooling2D()(h)))
    path = tmp_path / "gelu.tflite"
    path.write_bytes(tflite.convert_int8(model, check_calibration_data(model, _data(model))))
    run = _in_a_child("import numpy as np\n"
                      "from ai_edge_litert.interpreter import Interpreter\n"
                      f"it = Interpreter(model_path={str(path)!r}); it.allocate_tensors()\n"
                      "it.set_tensor(it.get_input_details()[0]['index'], "
                      "np.ones((1, 8, 8, 3), np.float32))\n"
                      "it.invoke(); print('ran')\n")
    assert run.returncode != 0 and "ran" not in run.stdout, (run.returncode, run.stderr[-500:])


def _mel_model():
    inp = keras.Input((1024,), name="audio")
    return keras.Model(inp, L.MelSpectrogram(fft_length=128, sequence_stride=64,
                                             sampling_rate=8000, num_mel_bins=16,
                                             name="mel")(inp), name="mel_net")


def _pixel_resize_model():
    """DeepLab's image-pooling branch: a 1 x 1 map out of a convolution, resized back."""
    inp = keras.Input((8, 8, 4), name="image")
    p = L.Conv2D(6, 1, name="pool_conv")(L.GlobalAveragePooling2D(keepdims=True)(inp))
    up = L.UpSampling2D(8, interpolation="bilinear", name="up")(p)
    resized = L.Resizing(8, 8, interpolation="bilinear", name="resize")(p)
    return keras.Model(inp, L.Concatenate()([L.Conv2D(6, 1, name="conv")(inp), up, resized]),
                       name="aspp_net")


def _pixel_dense_model():
    """A squeeze-and-excitation block on a global pooling's 1 x 1 map: an EinsumDense, then
    a Dense."""
    inp = keras.Input((8, 8, 4), name="image")
    h = L.Conv2D(6, 3, padding="same", activation="relu", name="conv")(inp)
    s = L.EinsumDense("abcd,de->abce", (1, 1, 3), bias_axes="e", activation="relu",
                      name="squeeze")(L.GlobalAveragePooling2D(keepdims=True)(h))
    return keras.Model(inp, L.Multiply()([h, L.Dense(6, activation="sigmoid",
                                                    name="excite")(s)]), name="se_net")


#: Models whose JAX export cle writes in another form (cle._tflite.export), with the flag
#: that turns the form off and what TF Lite then does with the model (hunt12 on JAX).
JAX_FORMS = {"melspectrogram": (_mel_model, "DFT_STFT"),  # ConverterError: tfl.transpose
             "one_pixel_resize": (_pixel_resize_model, "PIXEL_RESIZE"),  # TRANSPOSE 4 != 2
             "one_pixel_dense": (_pixel_dense_model, "PIXEL_MATMUL")}  # tfl.batch_matmul rank


@pytest.mark.parametrize("case", sorted(JAX_FORMS))
def test_melspectrogram_and_one_pixel_maps_convert_on_both_backends(case):
    """A MelSpectrogram, and a resize of (DeepLab's image pooling) and a Dense on (a
    squeeze-and-excitation) a 1 x 1 map convert: their float file computes the model (to
    float32 round-off) and cle.quantize's INT8 file follows it. On JAX each crashed (the
    converter's error; LiteRT's at prepare) before its export form (the next tests)."""
    from cle._tflite import export

    keras.utils.set_random_seed(0)
    model = JAX_FORMS[case][0]()
    x = _data(model, 16)
    want = model.predict(x, verbose=0)
    with export.quiet():
        floating = bytes(export.read_exported(model, False).convert())
    assert np.abs(Q.run_tflite(floating, x) - want).max() <= 1e-5 * np.abs(want).max()
    content, _ = cle.quantize(model, x)
    y = Q.run_tflite(content, x)
    assert 10 * np.log10(np.sum(want ** 2) / np.sum((want - y) ** 2)) > 30.0


@pytest.mark.skipif(BACKEND != "jax", reason="the forms are of JAX's export")
def test_the_jax_export_forms_compute_what_keras_does():
    """cle's forms of Keras' JAX STFT, of its resize of a 1 x 1 image and of its matmul of one
    row give Keras' values: windows of every kind (a padded frame, no window, an array),
    centred or not, a 1-D signal; every interpolation, antialiased or not, either data format;
    rows of rank 4 and 5 by a matrix, in a matmul or an einsum (and those left to Keras)."""
    from cle._core import keras_internals

    x = np.random.default_rng(0).normal(size=(3, 1000)).astype("float32")
    for args, kwargs in [((256, 128, 256), {}), ((200, 100, 256), {"window": "hamming"}),
                         ((255, 77, 256), {"center": False}), ((16, 8, 17), {"window": None}),
                         ((16, 8, 16), {"window": np.linspace(0, 1, 16)})]:
        for signal in (x, x[0]):
            want = keras.ops.stft(signal, *args, **kwargs)
            with keras_internals.dft_stft_on_jax():
                got = keras.ops.stft(signal, *args, **kwargs)
            for w, g in zip(want, got):
                assert g.shape == w.shape
                assert np.abs(np.asarray(g) - np.asarray(w)).max() <= 1e-5 * np.abs(
                    np.asarray(want[0])).max(), (args, kwargs)
    pixel = np.random.default_rng(1).normal(size=(2, 1, 1, 3)).astype("float32")
    for method in ("nearest", "bilinear", "bicubic", "lanczos3", "lanczos5"):
        for antialias in (False, True):
            for image, fmt in ((pixel, "channels_last"), (pixel[0].T, "channels_first")):
                want = keras.ops.image.resize(image, (5, 7), method, antialias,
                                              data_format=fmt)
                with keras_internals.pixel_resize_on_jax():
                    got = keras.ops.image.resize(image, (5, 7), method, antialias,
                                                 data_format=fmt)
                np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)
    rng = np.random.default_rng(2)
    kernel = rng.normal(size=(5, 3)).astype("float32")
    for shape in ((1, 1, 1, 5), (1, 1, 1, 1, 5), (1, 2, 2, 5), (1, 1, 5), (3, 1, 1, 5)):
        row = rng.normal(size=shape).astype("float32")
        want = keras.ops.matmul(row, kernel)
        letters = "abcde"[:len(shape)]
        equation = f"{letters},{letters[-1]}z->{letters[:-1]}z"
        want_einsum = keras.ops.einsum(equation, row, kernel)
        with keras_internals.pixel_matmul_on_jax():
            got = keras.ops.matmul(row, kernel)
            got_einsum = keras.ops.einsum(equation, row, kernel)
            other = keras.ops.einsum(f"{letters},z{letters[-1]}->{letters[:-1]}z", row,
                                     kernel.T)
        for g in (got, got_einsum, other):
            np.testing.assert_allclose(np.asarray(g), np.asarray(want), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(want_einsum), np.asarray(want), rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.skipif(BACKEND != "jax", reason="the forms are of JAX's export")
@pytest.mark.parametrize("case", sorted(JAX_FORMS))
def test_without_its_export_form_the_model_fails_on_jax(case, monkeypatch):
    """The premise of each form: JAX's own export of a MelSpectrogram (a complex FFT) and of
    an EinsumDense and a Dense on a 1 x 1 map are ones TF Lite's converter refuses, and of a
    1 x 1 map's resize after a convolution one whose file LiteRT refuses at prepare. If a
    newer converter takes one, this fails: set its flag in cle._tflite.export to False (or
    drop the form)."""
    from cle._tflite import export

    build, flag = JAX_FORMS[case]
    monkeypatch.setattr(export, flag, False)
    model = build()
    x = check_calibration_data(model, _data(model))
    with pytest.raises(Exception):  # noqa: B017 - ConverterError, or RuntimeError at prepare
        Q.run_tflite(tflite.convert_int8(model, x), _data(model))


def _positions_softmax_model():
    """A spatial soft-argmax: logits per position, a softmax over the positions (axis 1), a
    coordinate Dense."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 3), name="heat")
    h = L.Reshape((64, 2))(L.Conv2D(2, 1, name="logits")(inp))
    p = L.Permute((2, 1))(L.Softmax(axis=1, name="over_positions")(h))
    return keras.Model(inp, L.Dense(2, name="coords")(p), name="soft_argmax")


@pytest.mark.parametrize("form", [True, False])
def test_a_softmax_over_positions_is_one_softmax_op_on_every_backend(form, monkeypatch):
    """On JAX a softmax over an axis other than the last is exported over the last axis,
    moved there and back (cle._tflite.export.LAST_AXIS_SOFTMAX): the file holds one SOFTMAX,
    as TensorFlow's does, and computes the model. Without the form (the premise, JAX only) it
    holds its parts, whose denominator is an INT8 tensor of its own (hunt13's soft-argmax on
    JAX: 27.1 dB in the plain converter's file against 36.7 on TensorFlow)."""
    from cle._tflite import export
    from cle._tflite.flatgraph import FlatGraph

    if not form and BACKEND != "jax":
        pytest.skip("the form is of JAX's export")
    monkeypatch.setattr(export, "LAST_AXIS_SOFTMAX", form)
    model = _positions_softmax_model()
    x = np.random.default_rng(0).normal(0, 3, (32, 8, 8, 3)).astype("float32")
    kinds = [op.kind for op in FlatGraph(tflite.convert_int8(
        model, check_calibration_data(model, x))).ops]
    if form:
        assert "SOFTMAX" in kinds and "EXP" not in kinds and "SUM" not in kinds, kinds
        want = model.predict(x, verbose=0)
        with export.quiet():
            floating = bytes(export.read_exported(model, False).convert())
        np.testing.assert_allclose(Q.run_tflite(floating, x), want, rtol=1e-5, atol=1e-5)
    else:
        assert "SOFTMAX" not in kinds and "EXP" in kinds and "SUM" in kinds, kinds
