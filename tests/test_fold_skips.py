"""BNs that must not be folded carry a readable reason; fold_given_batch_norms refuses them."""

import logging

import keras
import numpy as np
import pytest
from conftest import (
    assert_folds,
    assert_unchanged,
    randomize_batch_norms,
    randomize_biases,
    weights_snapshot,
)

import cle

L = keras.layers


def _model(inp, out):
    return randomize_biases(randomize_batch_norms(keras.Model(inp, out)))


def _only_skip(model):
    pairs, _, _ = assert_folds(model, 0, 1)
    return pairs.skipped[0].reason


def test_skip_fan_out():
    inp = keras.Input((8, 8, 3))
    c = L.Conv2D(4, 3, name="conv", padding="same")(inp)
    b = L.BatchNormalization(name="bn")(c)
    out = L.Add(name="add_3")([b, c])
    reason = _only_skip(_model(inp, out))
    assert "'conv' also feeds 'add_3'" in reason


def test_skip_producer_output_is_model_output():
    inp = keras.Input((8, 8, 3))
    c = L.Conv2D(4, 3, name="conv")(inp)
    b = L.BatchNormalization(name="bn")(c)
    reason = _only_skip(_model(inp, [c, b]))
    assert "'conv' is also an output of model" in reason


def test_skip_nonlinear_activation():
    inp = keras.Input((8, 8, 3))
    x = L.BatchNormalization(name="bn")(L.Conv2D(4, 3, activation="relu", name="conv")(inp))
    reason = _only_skip(_model(inp, L.Conv2D(2, 3, padding="same")(x)))
    assert "'conv' applies activation 'relu'" in reason
    assert "pads its input (padding='same')" in reason  # and why not forward


def test_skip_shared_bn():
    inp = keras.Input((8, 8, 3))
    bn = L.BatchNormalization(name="bn")
    a = bn(L.Conv2D(4, 3, name="c1")(inp))
    b = bn(L.Conv2D(4, 3, name="c2")(inp))
    reason = _only_skip(_model(inp, L.Add()([a, b])))
    assert "shared layer, called 2 times" in reason


def test_skip_shared_conv():
    inp1, inp2 = keras.Input((8, 8, 3)), keras.Input((8, 8, 3))
    conv = L.Conv2D(4, 3, name="conv")
    a = L.BatchNormalization(name="bn")(conv(inp1))
    b = conv(inp2)
    reason = _only_skip(_model([inp1, inp2], [a, b]))
    assert "'conv' is a shared layer, called 2 times" in reason


def test_skip_axis_mismatch():
    inp = keras.Input((8, 8, 3))
    x = L.BatchNormalization(axis=1, name="bn")(L.Conv2D(4, 3, name="conv")(inp))
    reason = _only_skip(_model(inp, L.Flatten()(x)))
    assert "normalizes axis 1" in reason and "axis 3" in reason


@pytest.mark.parametrize(
    "consumer, text",
    [
        (lambda: L.Conv2D(4, 3, padding="same", name="conv"), "pads its input (padding='same')"),
        (lambda: L.Conv2D(6, 3, groups=3, name="conv"), "groups=3"),
        (lambda: L.Conv2DTranspose(4, 3, name="conv"), "transposed convolution"),
        (lambda: L.Conv1D(4, 3, padding="causal", name="conv"), "padding='causal'"),
    ],
    ids=["same", "groups", "transpose", "causal"],
)
def test_skip_inexact_forward(consumer, text):
    layer = consumer()
    shape = (8, 3) if isinstance(layer, L.Conv1D) else (8, 8, 3)
    inp = keras.Input(shape)
    x = L.BatchNormalization(name="bn")(inp)
    reason = _only_skip(_model(inp, layer(x)))
    assert text in reason and "its input is a model input" in reason


def test_skip_flatten_to_non_dense():
    inp = keras.Input((4, 4, 3))
    x = L.Flatten(name="flat")(L.BatchNormalization(name="bn")(inp))
    reason = _only_skip(_model(inp, L.Activation("tanh", name="act")(x)))
    assert "'flat' feeds 'act' (Activation), not a Dense layer" in reason


@pytest.mark.parametrize(
    "stat, value, text",
    [("moving_variance", np.nan, "moving_variance is not finite"),
     ("moving_mean", np.inf, "moving_mean is not finite"),
     ("gamma", np.nan, "gamma is not finite"),
     ("moving_variance", -1.0, "moving_variance + epsilon <= 0")],
)
def test_skip_bad_statistics(stat, value, text):
    inp = keras.Input((8, 8, 3))
    bn = L.BatchNormalization(name="bn")
    model = _model(inp, bn(L.Conv2D(4, 3, name="conv")(inp)))
    arr = np.asarray(getattr(bn, stat)).copy()
    arr[1] = value
    getattr(bn, stat).assign(arr)
    pairs, folded = cle.fold_all_batch_norms(model)
    assert len(pairs) == 0 and text in pairs.skipped[0].reason
    assert all(np.all(np.isfinite(w)) for w in folded.get_layer("conv").get_weights())


def test_skip_bn_forced_to_training():
    inp = keras.Input((8, 8, 3))
    x = L.BatchNormalization(name="bn")(L.Conv2D(4, 3, name="conv")(inp), training=True)
    reason = _only_skip(_model(inp, x))
    assert "training=True" in reason


def test_skip_unknown_producer_and_model_input():
    inp = keras.Input((8, 8, 3))
    x = L.BatchNormalization(name="bn")(L.MaxPooling2D(name="pool")(inp))
    reason = _only_skip(_model(inp, x))
    assert "'pool' (MaxPooling2D), which cannot absorb it" in reason


def test_subclass_of_conv_is_not_trusted():
    class MyConv(L.Conv2D):
        pass

    inp = keras.Input((8, 8, 3))
    x = L.BatchNormalization(name="bn")(MyConv(4, 3, name="myconv")(inp))
    reason = _only_skip(_model(inp, x))
    assert "(MyConv), which cannot absorb it" in reason


class _Block(L.Layer):
    """A custom layer hiding a conv and a BN: keras-cle cannot see inside it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.conv = L.Conv2D(4, 3, padding="same")
        self.bn = L.BatchNormalization()

    def call(self, x):
        return self.bn(self.conv(x))

    def build(self, shape):
        self.conv.build(shape)
        self.bn.build(shape[:-1] + (4,))


def test_custom_layer_passes_through_and_hidden_bn_is_reported():
    inp = keras.Input((8, 8, 3))
    x = _Block(name="block")(inp)
    x = L.BatchNormalization(name="bn")(L.Conv2D(4, 3, name="conv")(x))
    model = _model(inp, x)
    pairs, folded, _ = assert_folds(model, 1, 1)
    assert "inside 'block' (_Block), whose graph keras-cle cannot read" in pairs.skipped[0].reason
    assert isinstance(folded.get_layer("block"), _Block)


def test_skips_are_logged(caplog):
    inp = keras.Input((8, 8, 3))
    x = L.BatchNormalization(name="bn")(L.Conv2D(4, 3, activation="relu", name="conv")(inp))
    model = _model(inp, x)
    with caplog.at_level(logging.INFO, logger="cle.batch_norm_fold"):
        cle.fold_all_batch_norms(model)
    assert any("'bn' not folded" in r.getMessage() and "relu" in r.getMessage()
               for r in caplog.records)
    assert any("0 batch norms folded, 1 skipped" in r.getMessage() for r in caplog.records)


def test_find_foldable_batch_norms_reports_without_changing():
    inp = keras.Input((8, 8, 3))
    x = L.BatchNormalization(name="bn1")(L.Conv2D(4, 3, name="conv1")(inp))
    x = L.BatchNormalization(name="bn2")(L.ReLU()(x))
    model = _model(inp, x)
    snap, names = weights_snapshot(model), [la.name for la in model._flatten_layers()]
    report = cle.find_foldable_batch_norms(model)
    assert [(p.layer.name, p.bn.name, p.bn_after) for p in report.folds] == [
        ("conv1", "bn1", True)]
    assert report.folds[0].layer is model.get_layer("conv1")
    assert [s.bn.name for s in report.skipped] == ["bn2"]
    text = str(report)
    assert "1 batch norms can be folded, 1 skipped" in text and "bn2:" in text
    assert_unchanged(model, snap, names)


# ----------------------------------------------------------------- fold_given_batch_norms


@pytest.fixture()
def two_blocks():
    inp = keras.Input((10, 10, 3), name="image")
    x = L.BatchNormalization(name="bn0")(inp)
    x = L.Conv2D(4, 3, name="conv0")(x)
    x = L.BatchNormalization(name="bn1")(x)
    x = L.ReLU(name="relu1")(x)
    x = L.Conv2D(4, 3, padding="same", name="conv2")(x)
    x = L.BatchNormalization(name="bn2")(x)
    x = L.ReLU(name="relu2")(x)
    return _model(inp, x)


def test_fold_given_by_name_and_object(two_blocks):
    from conftest import inputs_for, max_rel_error

    m = two_blocks
    snap, names = weights_snapshot(m), [la.name for la in m._flatten_layers()]
    folded = cle.fold_given_batch_norms(
        m, [("bn0", "conv0"), (m.get_layer("conv2"), m.get_layer("bn2"), True)]
    )
    kinds = {la.name for la in folded.layers if isinstance(la, L.BatchNormalization)}
    assert kinds == {"bn1"}
    assert max_rel_error(m, folded, inputs_for(m)) <= 1e-5
    assert_unchanged(m, snap, names)
    folded = cle.fold_given_batch_norms(m, [("bn0", "conv0", False), ["conv0", "bn1"]])
    assert {la.name for la in folded.layers if isinstance(la, L.BatchNormalization)} == {"bn2"}
    assert max_rel_error(m, folded, inputs_for(m)) <= 1e-5


@pytest.mark.parametrize(
    "pairs, texts",
    [
        ([("conv2", "bn2"), ("bn1", "conv2")],
         ["Cannot fold BatchNormalization 'bn1' forward into 'conv2'", "'bn1' is not directly before 'conv2'",
          "layer_pairs[1]=('bn1', 'conv2')"]),
        ([("conv0", "bn2")], ["'bn2' is not directly after 'conv0'", "it follows 'conv2'"]),
        ([("bn1", "conv2", False)], ["forward into 'conv2'", "(its output goes to 'relu1')"]),
        ([("bn2", "relu2")], ["its output goes to 'relu2' (ReLU), which cannot absorb it"]),
        ([("conv2", "relu2")], ["'conv2' (Conv2D) is not a BatchNormalization"]),
        ([("conv9", "bn2")], ["No layer named 'conv9' in model"]),
        ([("conv2", "bn2"), ("conv2", "bn2")], ["'bn2' appears twice in layer_pairs"]),
        ([("conv2",)], ["Each entry of layer_pairs must be"]),
        ([("conv2", "bn2", "yes")], ["must be True (BN after the layer) or False"]),
        ([(3, "bn2")], ["Expected a layer or a layer name. Received: layer_pairs[0][0]=3"]),
    ],
    ids=["padding", "not-adjacent", "relu-between", "not-bn", "unknown", "twice", "short",
         "flag", "type", "not-bn-2"],
)
def test_fold_given_refuses(two_blocks, pairs, texts):
    m = two_blocks
    snap, names = weights_snapshot(m), [la.name for la in m._flatten_layers()]
    with pytest.raises(ValueError) as info:
        cle.fold_given_batch_norms(m, pairs)
    for text in texts:
        assert text in str(info.value)
    assert_unchanged(m, snap, names)  # nothing half-done


def test_fold_given_padding_reason():
    inp = keras.Input((8, 8, 3))
    x = L.Conv2D(4, 3, padding="same", name="conv")(L.BatchNormalization(name="bn")(inp))
    with pytest.raises(ValueError, match=r"'conv' pads its input \(padding='same'\)"):
        cle.fold_given_batch_norms(_model(inp, x), [("bn", "conv")])


def test_fold_given_layer_of_other_model(two_blocks):
    other = L.BatchNormalization(name="bn_other")
    with pytest.raises(ValueError, match="Layer 'bn_other' is not part of model"):
        cle.fold_given_batch_norms(two_blocks, [("conv2", other)])
