"""Softplus, mish, log-sigmoid and SELU in a form 8-bit activations can hold
(cle.layers.StableActivation): the layer's numerics, why it is there (TF Lite's converter
writes softplus as log(exp(x) + 1), whose exp(x) tensor swamps one 8-bit range), and
cle.quantize putting it in place exactly."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from keras import layers as L

import cle
from cle import quantization as Q
from cle._core.graph import graph_view
from cle._core.inputs import check_calibration_data
from cle._measure.inference import predict_all
from cle._tflite.runtime import interpreter, run_all
from cle._transforms.equalize import equalize_checked
from cle._transforms.options import EqualizeOptions
from cle.layers import STABLE, ChannelAffine, StableActivation

from conftest import (no_tflite_on_torch, randomize_batch_norms, settle_batch_norms,
                      tensorflow_only)


def _np(x):
    return keras.ops.convert_to_numpy(x)


# ---------------------------------------------------------------------------- the layer


def test_stable_activations_are_keras_own_over_the_whole_float_range():
    x = np.concatenate([np.linspace(-90, 90, 4001), [-1e30, 1e30, 0.0]]).astype("float32")
    x64 = x.astype(np.float64)
    soft = np.logaddexp(0.0, x64)
    exact = {"softplus": soft, "log_sigmoid": -np.logaddexp(0.0, -x64),
             "selu": np.where(x64 > 0, x64, 1.6732632423543772 * np.expm1(np.minimum(x64, 0)))
             * 1.0507009873554805}
    for name, want in exact.items():
        y = _np(StableActivation(name)(x[None]))[0]
        assert np.all(np.isfinite(y)), name
        np.testing.assert_allclose(y, want, rtol=2e-6, atol=1e-7, err_msg=name)
        keras_own = _np(keras.activations.get(name)(x[None, :-3]))[0]
        np.testing.assert_allclose(y[:-3], keras_own, rtol=2e-6, atol=1e-7, err_msg=name)
    # In float32 1 + exp(-|x|) is 1 below about -16, where softplus is under 1.2e-7: it reads
    # 0 there, and mish, x times it, is off by at most 17 x 4e-8.
    mish = _np(StableActivation("mish")(x[None, :-3]))[0]
    np.testing.assert_allclose(mish, x64[:-3] * np.tanh(soft[:-3]), rtol=2e-6, atol=1e-6)
    with pytest.raises(ValueError, match="'exponential'"):
        StableActivation("exponential")


def test_stable_activation_is_serialized_and_loaded(tmp_path):
    inp = keras.Input((5,))
    model = keras.Model(inp, StableActivation("mish", name="m")(L.Dense(5)(inp)))
    path = str(tmp_path / "m.keras")
    model.save(path)
    back = cle.load_model(path)
    assert isinstance(back.get_layer("m"), StableActivation)
    assert back.get_layer("m").kind == "mish"
    x = np.random.default_rng(0).normal(size=(4, 5)).astype("float32")
    np.testing.assert_array_equal(_np(back(x)), _np(model(x)))


# ------------------------------------------------------------------------- why it is there


def _dense_softplus(activation=None, seed=0, name="softplus"):
    """Dense(16 -> 32) whose pre-activations reach about 11 on normal inputs, a softplus, a
    Dense head: exp(11) is some 60,000, so one 8-bit range over exp(x) reads every softplus
    below the largest as 0."""
    keras.utils.set_random_seed(seed)
    inp = keras.Input((16,))
    h = L.Dense(32, name="d1")(inp)
    h = (activation or L.Activation(name))(h)
    model = keras.Model(inp, L.Dense(4, name="d2")(h), name="dense_softplus")
    kernel = np.random.default_rng(seed).normal(0, 0.6, (16, 32)).astype("float32")
    model.get_layer("d1").set_weights([kernel, np.ones(32, "float32")])
    return model


@pytest.fixture(scope="module")
def inputs():
    return np.random.default_rng(1).normal(0, 1, (192, 16)).astype("float32")


def _sqnr(model, content, x):
    xs = check_calibration_data(model, x)
    ref = predict_all(model, xs)[0]
    got = run_all(content, xs)[0]
    return 10 * np.log10(np.sum(ref ** 2) / np.sum((ref - got) ** 2))


@no_tflite_on_torch
@tensorflow_only("TF Lite conversion")
@pytest.mark.parametrize("name", STABLE)
def test_the_converter_wrecks_these_activations_and_the_stable_form_holds_them(inputs, name):
    """The premise, measured: the same function, converted by TF Lite's converter on the same
    inputs. Measured (Intel Xeon), plain against stable: softplus 2.5 / 40.8 dB, mish
    2.8 / 37.4, log_sigmoid 5.0 / 27.4, selu 10.8 / 36.6."""
    model = _dense_softplus(name=name)
    stable = _dense_softplus(StableActivation(name))
    stable.set_weights(model.get_weights())
    held = inputs[128:]
    np.testing.assert_allclose(_np(stable(held)), _np(model(held)), rtol=1e-5, atol=1e-5)
    plain = _sqnr(model, Q.convert_to_tflite_int8(model, inputs[:128]), held)
    rewritten = _sqnr(stable, Q.convert_to_tflite_int8(stable, inputs[:128]), held)
    assert plain < 15.0 and rewritten > max(25.0, plain + 15.0), (plain, rewritten)


def _float_tensors(content) -> list[str]:
    interp = interpreter(content)
    return [d["name"] for d in interp.get_tensor_details() if d["dtype"] == np.float32]


# --------------------------------------------------------------------- cle.quantize uses it


@no_tflite_on_torch
def test_quantize_puts_softplus_in_its_stable_form_and_leaves_the_model_alone(inputs):
    model = _dense_softplus()
    before = [w.copy() for w in model.get_weights()]
    content, report = Q.quantize(model, inputs[:64])
    assert report.equalization.stable_changed == [model.layers[2].name]
    assert "layers rewritten exactly in a form 8-bit tensors can hold (cle.layers" in report.summary()
    assert report.equalization.to_dict()["stable_changed"] == [model.layers[2].name]
    assert type(model.layers[2]) is L.Activation  # the input model is untouched
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    # cle's build is far closer than the converter's on inputs it never saw, so it is written
    assert report.choice.written != "plain", report.choice.written
    assert _sqnr(model, content, inputs[64:]) > 30.0
    # every operator in INT8: float32 only at the input and the output
    assert len(_float_tensors(content)) == 2, _float_tensors(content)


def _conv_mish_net(seed=0, head="mish"):
    """A fused softplus on a conv whose batch norm comes after it (folded forward into the
    next conv), a mish as an Activation layer, a fused SELU, a log-sigmoid as an Activation
    layer, a Dense head (a fused mish by default)."""
    keras.utils.set_random_seed(seed)
    inp = keras.Input((12, 12, 3))
    h = L.Conv2D(8, 3, activation="softplus", name="c1")(inp)
    h = L.BatchNormalization(name="bn1")(h)
    h = L.Conv2D(8, 3, name="c2")(h)
    h = L.BatchNormalization(name="bn2")(h)
    h = L.Activation("mish", name="mish")(h)
    h = L.Conv2D(8, 3, activation="selu", name="c3")(h)
    h = L.Activation("log_sigmoid", name="logsig")(h)
    h = L.GlobalAveragePooling2D()(h)
    out = L.Dense(5, activation=head, name="head")(h)
    model = keras.Model(inp, out, name="conv_mish")
    randomize_batch_norms(model, seed=seed)
    return model


@no_tflite_on_torch
def test_fused_and_standalone_forms_are_rewritten_exactly():
    model = _conv_mish_net()
    x = np.random.default_rng(2).uniform(0, 1, (16, 12, 12, 3)).astype("float32")
    xs = check_calibration_data(model, x)
    opts = EqualizeOptions(stable_activations=True)
    new, report = equalize_checked(model, graph_view(model), opts, None, guard_inputs=xs)
    assert sorted(report.stable_changed) == sorted(
        ["c1 (fused activation)", "mish", "c3 (fused activation)", "logsig",
         "head (fused activation)"])
    kinds = {la.name: la.kind for la in new.layers if isinstance(la, StableActivation)}
    assert kinds == {"c1_softplus": "softplus", "mish": "mish", "c3_selu": "selu",
                     "logsig": "log_sigmoid", "head_mish": "mish"}
    assert new.get_layer("c1").get_config()["activation"] == "linear"
    ref, got = predict_all(model, xs)[0], predict_all(new, xs)[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())
    # equalize_model itself keeps Keras' own activations
    plain_new = cle.equalize_model(model)
    assert not any(isinstance(la, StableActivation) for la in plain_new.layers)


@no_tflite_on_torch
def test_quantize_without_data_takes_the_stable_form():
    model = _conv_mish_net(head="softmax")
    settle_batch_norms(model, np.random.default_rng(4).uniform(0, 1, (64, 12, 12, 3)))
    content, report = Q.quantize(model, None, input_range=(0.0, 1.0))
    assert sorted(report.equalization.stable_changed) == [
        "c1 (fused activation)", "c3 (fused activation)", "logsig", "mish"]
    x = np.random.default_rng(3).uniform(0, 1, (8, 12, 12, 3)).astype("float32")
    assert _sqnr(model, content, x) > 30.0  # 40.8 dB measured (Intel Xeon)


@no_tflite_on_torch
def test_analyze_says_which_layers_stand_for_the_rewritten_ones(inputs):
    model = _dense_softplus()
    report = cle.analyze(model, inputs[:64])
    name = model.layers[2].name
    assert any(f"stands for each of '{name}'" in note for note in report.notes), report.notes
    assert f"stands for each of '{name}'" in report.summary()


def test_keras_ops_in_a_functional_graph_are_rewritten_exactly():
    """``keras.ops.softplus(x)``, ``keras.activations.selu(x)``, ``keras.ops.log_sigmoid(x)`` on
    a Functional model's tensors leave operations, not layers, in its graph."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((12, 12, 3))
    h = keras.ops.softplus(L.Conv2D(8, 3, name="c1")(inp))
    h = keras.activations.selu(L.Conv2D(8, 3, name="c2")(h))
    h = keras.ops.log_sigmoid(L.Conv2D(8, 3, name="c3")(h))
    model = keras.Model(inp, L.Dense(3, activation="softmax")(L.GlobalAveragePooling2D()(h)))
    x = np.random.default_rng(0).uniform(0, 1, (16, 12, 12, 3)).astype("float32")
    xs = check_calibration_data(model, x)
    new, report = equalize_checked(model, graph_view(model),
                                   EqualizeOptions(stable_activations=True), None,
                                   guard_inputs=xs)
    assert len(report.stable_changed) == 3
    kinds = [la.kind for la in new.layers if isinstance(la, StableActivation)]
    assert kinds == ["softplus", "selu", "log_sigmoid"]
    np.testing.assert_allclose(predict_all(new, xs)[0], predict_all(model, xs)[0], rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("shape", [(5, 6), (5, 4, 6), (5, 3, 4, 6)])
def test_channel_affine_is_a_scale_and_offset_per_channel(shape, tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=shape).astype("float32")
    scale = np.array([1e-4, 0.5, 1.0, 3.0, 1e3, 1e7], "float32")
    offset = rng.normal(size=6).astype("float32")
    inp = keras.Input(shape[1:])
    layer = ChannelAffine(name="affine")
    model = keras.Model(inp, layer(inp))
    layer.set_weights([scale, offset])
    np.testing.assert_allclose(_np(model(x)), x * scale + offset, rtol=1e-6, atol=1e-6)
    path = str(tmp_path / "a.keras")
    model.save(path)
    np.testing.assert_array_equal(_np(cle.load_model(path)(x)), _np(model(x)))
    with pytest.raises(ValueError, match="known sizes"):
        ChannelAffine().build((None, None, 6))
