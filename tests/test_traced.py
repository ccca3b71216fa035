"""A subclassed model, traced into a Functional model of its own layers (cle._core.traced):
TF Lite's converter writes such a model, so with data cle.quantize does too."""

import keras
import numpy as np
import pytest

import cle
from cle._core.traced import functional_for
from cle._measure.evaluation import run_tflite

L = keras.layers


class _Net(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.conv = L.Conv2D(8, 3, name="conv")
        self.bn = L.BatchNormalization(name="bn")
        self.pool = L.GlobalAveragePooling2D()
        self.head = L.Dense(4, activation="softmax", name="head")

    def call(self, x, training=None):
        return self.head(self.pool(keras.ops.relu(self.bn(self.conv(x), training=training))))


class _Branchy(_Net):
    def call(self, x, training=None):
        if x.shape[0] > 1:  # reads a size a symbolic input does not have
            x = x * 2.0
        return super().call(x, training)


def _net(cls=_Net):
    keras.utils.set_random_seed(5)
    net = cls(name="net")
    net(np.zeros((1, 8, 8, 3), "float32"))
    rng = np.random.default_rng(1)
    net.bn.moving_mean.assign(rng.normal(0, 0.5, 8).astype("f4"))
    net.bn.moving_variance.assign(rng.uniform(0.5, 2.0, 8).astype("f4"))
    return net


def test_a_subclassed_model_with_data_is_traced_quantized_and_left_untouched():
    """With calibration data of its one input, its call() is traced on a symbolic input into
    a Functional model of the same layers, held to the model's outputs, and quantized; the
    report says so first; the model's weights are not changed; the file is close to it."""
    net = _net()
    x = np.random.default_rng(2).uniform(0, 1, (48, 8, 8, 3)).astype("f4")
    traced, note = functional_for(net, x)
    assert [layer.name for layer in traced.layers if layer.weights] == ["conv", "bn", "head"]
    np.testing.assert_array_equal(traced(x[:4]), net(x[:4], training=False))
    before = [w.copy() for w in net.get_weights()]
    content, report = cle.quantize(net, x)
    assert "subclassed model" in report.warnings[0] and "traced its call()" in report.warnings[0]
    assert "subclassed model" in note
    assert all(np.array_equal(a, b) for a, b in zip(before, net.get_weights()))
    assert report.outputs[0].kind == "probabilities"
    ref, y = np.asarray(net(x, training=False)), run_tflite(content, x)
    assert 10 * np.log10(np.sum(ref ** 2) / np.sum((ref - y) ** 2)) > 30.0


def test_without_data_a_built_subclassed_model_is_traced_at_the_shape_it_was_built_for():
    """Without data, the one input shape the model was built with sets the trace, held to the
    model on random inputs; the distillation then runs on the traced model."""
    net = _net()
    content, report = cle.quantize(net, input_range=(0.0, 1.0))
    assert "traced its call()" in report.warnings[0] and "8 random inputs" in report.warnings[0]
    x = np.random.default_rng(3).uniform(0, 1, (32, 8, 8, 3)).astype("f4")
    ref, y = np.asarray(net(x, training=False)), run_tflite(content, x)
    assert 10 * np.log10(np.sum(ref ** 2) / np.sum((ref - y) ** 2)) > 20.0


def test_a_subclassed_model_that_cannot_be_traced_is_refused_saying_why():
    """Code that reads what a symbolic input does not have (its batch size) cannot be traced:
    the refusal is the subclassed model's, with what failed; data of another form than one
    array, or no data and no shape it was built for, say what would let cle trace it."""
    x = np.zeros((16, 8, 8, 3), "float32")
    with pytest.raises(ValueError, match=r"subclassed model whose call.*Tracing its call\(\) "
                                         r"on a symbolic input failed too: TypeError"):
        cle.quantize(_net(_Branchy), x)
    for net, data in ((_Net(), None), (_net(), [x])):
        with pytest.raises(ValueError, match=r"subclassed model.*cle.quantize traces its "
                                             r"call\(\)"):
            functional_for(net, data)


class _Tokens(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.embed = L.Embedding(50, 4, name="embed")
        self.pool = L.GlobalAveragePooling1D()
        self.head = L.Dense(3, name="head")

    def call(self, ids):
        return self.head(self.pool(self.embed(ids)))


def test_token_ids_are_traced_as_integers_and_not_guessed_without_data():
    """helper-38's review: the trace took float32 whatever the data, so token ids became a
    float input (quantized as an activation with integer I/O). The trace takes the data's
    integer dtype; without data a model that embeds token ids is refused (eight uniform
    floats in [0, 1] would all be id 0: no check at all). A trace is made once per model and
    shape: a second call adds no node to the model's layers."""
    net = _Tokens(name="tokens")
    ids = np.random.default_rng(0).integers(0, 50, (16, 6)).astype("int32")
    net(ids[:1])
    traced, _ = functional_for(net, ids)
    assert traced.inputs[0].dtype == "int32"
    assert functional_for(net, ids)[0] is traced
    with pytest.raises(ValueError, match="embeds token ids"):
        functional_for(net, None)


class _TwoHeads(_Net):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.box = L.Dense(3, name="box_head")

    def call(self, x, training=None):
        h = self.pool(keras.ops.relu(self.bn(self.conv(x), training=training)))
        return {"score": self.head(h), "box": self.box(h)}


def test_dict_outputs_keep_their_keys_through_the_trace():
    """A subclassed model's dict outputs are named by their keys in the traced model (not by
    the layers that made them): output_kinds keyed by them apply, and the report names them."""
    net = _net(_TwoHeads)
    x = np.random.default_rng(2).uniform(0, 1, (48, 8, 8, 3)).astype("f4")
    _, report = cle.quantize(net, x, output_kinds={"box": "values"})
    kinds = {o.name: o.kind for o in report.outputs}
    assert kinds == {"score": "probabilities", "box": "values"}


def test_analyze_says_the_model_it_analysed_was_traced():
    """Bug caught: cle.analyze traced a subclassed model and dropped the note that says so
    (cle.quantize's report and the command line said it): the layers it names are the traced
    model's, and the reader must know."""
    net = _net()
    x = np.random.default_rng(2).uniform(0, 1, (48, 8, 8, 3)).astype("f4")
    report = cle.analyze(net, x)
    assert len(report.notes) == 1 and "traced its call()" in report.notes[0]
    assert f"note: {report.notes[0]}" in report.summary()
    assert report.to_dict()["notes"] == report.notes
