"""Model kinds (Sequential, multi-input/output, nested), guarantees (untouched input, names,
save/load) and bad input."""

import keras
import numpy as np
import pytest
from conftest import (
    assert_folds,
    inputs_for,
    max_rel_error,
    outputs,
    randomize_batch_norms,
    randomize_biases,
    tensorflow_only,
)

import cle

L = keras.layers


def _rand(model):
    return randomize_biases(randomize_batch_norms(model))


def test_sequential():
    model = _rand(keras.Sequential([
        keras.Input((12, 12, 3)),
        L.Conv2D(8, 3, name="c1"), L.BatchNormalization(name="b1"), L.ReLU(),
        L.DepthwiseConv2D(3, name="dw"), L.BatchNormalization(name="b2"), L.ReLU(),
        L.BatchNormalization(name="b3"), L.Flatten(), L.Dense(5, name="fc"),
    ], name="seq"))
    pairs, folded, _ = assert_folds(model, 3, 0, forward=1)
    assert isinstance(folded, keras.Sequential) and folded.name == "seq"
    assert [(p.layer.name, p.bn.name) for p in pairs] == [("c1", "b1"), ("dw", "b2"), ("fc", "b3")]


def test_multi_input_multi_output():
    a, b = keras.Input((8, 8, 3), name="a"), keras.Input((8, 8, 3), name="b")
    xa = L.ReLU()(L.BatchNormalization(name="ba")(L.Conv2D(4, 3, name="ca")(a)))
    xb = L.ReLU()(L.BatchNormalization(name="bb")(L.Conv2D(4, 3, name="cb")(b)))
    x = L.Concatenate()([xa, xb])
    o1 = L.BatchNormalization(name="bo")(L.Conv2D(2, 1, name="co")(x))  # BN is an output
    o2 = L.Dense(3, name="d")(L.GlobalAveragePooling2D()(x))
    model = _rand(keras.Model([a, b], [o1, o2]))
    pairs, folded, _ = assert_folds(model, 3, 0)
    # The BN that produced an output became an Identity with its name: output names kept.
    assert isinstance(folded.get_layer("bo"), L.Identity)
    assert folded.output_names == model.output_names == ["bo", "d"]


def test_identity_kept_for_output_bn_saves(tmp_path):
    inp = keras.Input((6, 6, 3))
    model = _rand(keras.Model(inp, L.BatchNormalization(name="bo")(L.Conv2D(2, 1, name="c")(inp))))
    _, folded = cle.fold_all_batch_norms(model)
    folded.save(tmp_path / "f.keras")
    loaded = keras.models.load_model(tmp_path / "f.keras")
    assert loaded.output_names == ["bo"]
    assert max_rel_error(model, loaded, inputs_for(model)) <= 1e-5


def test_dict_inputs_and_outputs():
    a, b = keras.Input((6, 3), name="a"), keras.Input((6, 3), name="b")
    x = L.Concatenate()([a, b])
    x = L.BatchNormalization(name="bn")(L.Conv1D(4, 3, name="c")(x))
    model = _rand(keras.Model({"a": a, "b": b}, {"out": L.ReLU(name="r")(x)}))
    x = {"a": np.random.rand(2, 6, 3).astype("float32"), "b": np.random.rand(2, 6, 3).astype("float32")}
    pairs, folded = cle.fold_all_batch_norms(model)
    assert len(pairs) == 1
    ya, yb = model(x), folded(x)
    assert set(yb) == {"out"}
    # convert_to_numpy, not np.asarray: on PyTorch the outputs are tensors that require grad.
    ya, yb = (keras.ops.convert_to_numpy(y["out"]) for y in (ya, yb))
    assert np.abs(ya - yb).max() <= 1e-5 * np.abs(ya).max()


def test_nested_models_are_seen_through():
    inner_seq = keras.Sequential([
        keras.Input((10, 10, 3)), L.Conv2D(6, 3, name="s_conv"), L.BatchNormalization(name="s_bn"),
        L.ReLU(name="s_relu"),
    ], name="inner_seq")
    ii = keras.Input((8, 8, 6))
    inner_fn = keras.Model(
        ii, L.ReLU()(L.BatchNormalization(name="f_bn")(L.Conv2D(5, 3, name="f_conv")(ii))),
        name="inner_fn")
    inp = keras.Input((10, 10, 3), name="image")
    x = inner_fn(inner_seq(inp))
    x = L.BatchNormalization(name="outer_bn")(L.Conv2D(4, 3, name="outer_conv")(x))
    model = _rand(keras.Model(inp, x))
    pairs, folded, _ = assert_folds(model, 3, 0)
    assert isinstance(folded.get_layer("inner_seq"), keras.Sequential)
    assert [la.name for la in folded.get_layer("inner_seq").layers] == ["s_conv", "s_relu"]
    inner_names = [la.name for la in folded.get_layer("inner_fn").layers]
    assert "f_conv" in inner_names and "f_bn" not in inner_names
    assert not any(isinstance(la, L.BatchNormalization) for la in folded._flatten_layers())


def test_bn_across_a_submodel_boundary_is_skipped_with_reason():
    ii = keras.Input((8, 8, 3))
    sub = keras.Model(ii, L.Conv2D(4, 3, name="sub_conv")(ii), name="sub")
    inp = keras.Input((8, 8, 3))
    model = _rand(keras.Model(inp, L.BatchNormalization(name="bn")(sub(inp))))
    pairs, _, _ = assert_folds(model, 0, 1)
    assert "'sub/sub_conv' is also an output of model 'sub'" in pairs.skipped[0].reason


def test_sequential_wrapping_mobilenet():
    base = keras.applications.MobileNetV2(weights=None, include_top=False,
                                          input_shape=(64, 64, 3), pooling="avg")
    model = _rand(keras.Sequential([keras.Input((64, 64, 3)), base, L.Dense(10, name="head")]))
    pairs, folded, err = assert_folds(model, 52, 0)
    assert isinstance(folded.layers[0], keras.Model) and folded.layers[0].name == base.name


def test_shared_submodel_is_not_folded():
    ii = keras.Input((8, 8, 3))
    sub = keras.Model(ii, L.ReLU()(L.BatchNormalization(name="bn")(L.Conv2D(3, 3, padding="same", name="c")(ii))),
                      name="sub")
    inp = keras.Input((8, 8, 3))
    model = _rand(keras.Model(inp, sub(sub(inp))))
    pairs, _, _ = assert_folds(model, 0, 1)
    assert "shared layer, called 2 times" in pairs.skipped[0].reason


def test_result_is_independent_and_saves(tmp_path):
    inp = keras.Input((8, 8, 3), name="pixels")
    x = L.ReLU(name="r")(L.BatchNormalization(name="bn")(L.Conv2D(4, 3, use_bias=False, name="c")(inp)))
    model = _rand(keras.Model(inp, L.Dense(2, name="out")(L.Flatten()(x)), name="net"))
    pairs, folded = cle.fold_all_batch_norms(model)
    assert folded.name == "net" and folded is not model
    # The new model's weights are its own: changing them does not touch the input model.
    before = outputs(model, inputs_for(model))
    folded.get_layer("c").kernel.assign(np.zeros(folded.get_layer("c").kernel.shape))
    np.testing.assert_array_equal(before[0], outputs(model, inputs_for(model))[0])
    # Save / load round trip.
    _, folded = cle.fold_all_batch_norms(model)
    path = tmp_path / "folded.keras"
    folded.save(path)
    loaded = keras.models.load_model(path)
    x = inputs_for(model)
    np.testing.assert_array_equal(outputs(folded, x)[0], outputs(loaded, x)[0])
    assert [la.name for la in loaded.layers] == [la.name for la in folded.layers]
    assert max_rel_error(model, loaded, x) <= 1e-5


def test_compiled_model_stays_compiled():
    model = _rand(keras.Sequential([keras.Input((4,)), L.Dense(3), L.BatchNormalization()]))
    model.compile(optimizer="sgd", loss="mse")
    _, folded = cle.fold_all_batch_norms(model)
    assert folded.compiled
    folded.fit(np.zeros((4, 4)), np.zeros((4, 3)), verbose=0)  # still trainable end to end


def test_not_a_model():
    with pytest.raises(TypeError, match="Expected a keras.Model.*Received: model of type Conv2D"):
        cle.fold_all_batch_norms(L.Conv2D(3, 3))
    with pytest.raises(TypeError):
        cle.fold_given_batch_norms("model.keras", [])
    with pytest.raises(TypeError):
        cle.find_foldable_batch_norms(None)


class _Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.conv = L.Conv2D(3, 3)
        self.bn = L.BatchNormalization()

    def call(self, x):
        return self.bn(self.conv(x))


def test_subclassed_model_is_refused_with_advice():
    model = _Subclassed()
    model(np.zeros((1, 8, 8, 3), "float32"))
    with pytest.raises(ValueError, match="subclassed model.*Rebuild it with the Functional API"):
        cle.fold_all_batch_norms(model)


def test_unbuilt_sequential_is_refused():
    model = keras.Sequential([L.Dense(3), L.BatchNormalization()])
    with pytest.raises(ValueError, match="no known input shape.*keras.Input"):
        cle.fold_all_batch_norms(model)


@tensorflow_only("Keras' own float64 BatchNormalization is float32-accurate on JAX and PyTorch "
                 "(1e-7 relative); the fold is checked against a float64 numpy reference on "
                 "every backend in test_backends")
def test_dtype_float64_model():
    inp = keras.Input((6, 6, 3), dtype="float64")
    x = L.BatchNormalization(dtype="float64")(L.Conv2D(4, 3, dtype="float64", name="c")(inp))
    model = _rand(keras.Model(inp, x))
    pairs, folded = cle.fold_all_batch_norms(model)
    assert folded.get_layer("c").kernel.dtype == "float64"
    x = np.random.rand(2, 6, 6, 3)
    err = max_rel_error(model, folded, x)
    assert err < 1e-12  # float64 all the way: exact to rounding
