"""A custom layer whose class does not take back the config it gives (keras_hub's ViT patching
layer writes a value its constructor derives and refuses; its MiT encoder writes a sublayer's
config, a misspelt rate, and leaves a ratio out): the rebuild makes it from the keys its
constructor takes where that gives the same layer again, and refuses it by name otherwise
(it stopped with Keras' TypeError)."""

import keras
import numpy as np
import pytest

import cle

L = keras.layers


class _Scale(L.Layer):
    """x * w (one weight per channel, or a (channels, channels) mix with ``mix``), its config
    holding ``derived`` (made in the constructor, refused by it) and the rate ``rate`` under
    the key ``rate_``; with ``forget_mix`` the config leaves ``mix`` out."""

    def __init__(self, units, rate=0.0, mix=False, forget_mix=False, **kwargs):
        super().__init__(**kwargs)
        self.units, self.rate_, self.mix, self.forget_mix = units, rate, mix, forget_mix
        self.derived = units * 2

    def build(self, input_shape):
        shape = (self.units, self.units) if self.mix else (self.units,)
        self.w = self.add_weight(shape=shape, initializer="random_normal")

    def call(self, x):
        return keras.ops.matmul(x, self.w) if self.mix else x * self.w

    def get_config(self):
        config = dict(super().get_config(), units=self.units, derived=self.derived,
                      rate_=self.rate_)
        if not self.forget_mix:
            config["mix"] = self.mix
        return config


def _model(**kwargs):
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 3))
    h = L.BatchNormalization(name="bn")(L.Conv2D(4, 3, use_bias=False, name="conv")(inp))
    h = _Scale(4, name="scale", **kwargs)(L.ReLU()(h))
    return keras.Model(inp, L.Dense(2, name="head")(L.GlobalAveragePooling2D()(h)))


def test_a_layer_whose_config_holds_a_derived_value_is_rebuilt_exactly():
    """Its config's extra key is left out, and the layer made so gives the same config back:
    folded and equalized, the model computes what it did (batch norm folded)."""
    model = _model()
    with pytest.raises(TypeError):  # the premise: Keras' own round trip fails
        _Scale.from_config(model.get_layer("scale").get_config())
    x = np.random.default_rng(0).normal(size=(8, 8, 8, 3)).astype("float32")
    pairs, folded = cle.fold_all_batch_norms(model)
    assert len(pairs) == 1
    np.testing.assert_allclose(folded(x), model(x), rtol=1e-4, atol=1e-5)
    equalized = cle.equalize_model(model)
    np.testing.assert_allclose(equalized(x), model(x), rtol=1e-4, atol=1e-5)
    assert folded.get_layer("scale") is not model.get_layer("scale")


@pytest.mark.parametrize("kwargs, refused", [
    (dict(rate=0.1), "'derived', 'rate_'"),  # the rate lost: made again, it is 0
    (dict(mix=True, forget_mix=True), "'derived', 'rate_'"),  # made again: a vector weight
])
def test_a_layer_that_would_come_back_another_is_refused_by_name(kwargs, refused):
    """Made from the keys its constructor takes, a layer whose config lost a value (a rate
    under another key) or leaves out what shapes its weights is another layer: a ValueError
    names it and the keys its constructor refuses, Keras' error chained."""
    model = _model(**kwargs)
    with pytest.raises(ValueError, match=f"layer 'scale' \\(_Scale\\) cannot be rebuilt from "
                                         f"the config .* refuses {refused}") as info:
        cle.fold_all_batch_norms(model)
    assert info.value.__cause__ is not None


class _NoConfig(_Scale):
    """A layer whose get_config() fails (keras_hub 0.32's DeiT encoder reads an attribute it
    never set)."""

    def get_config(self):
        return dict(super().get_config(), key_dim=self.key_dim)


def test_a_layer_whose_get_config_fails_is_refused_by_name():
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 3))
    h = L.BatchNormalization()(L.Conv2D(4, 3, use_bias=False)(inp))
    model = keras.Model(inp, _NoConfig(4, name="opaque")(h))
    with pytest.raises(ValueError, match="layer 'opaque' \\(_NoConfig\\) cannot give its "
                                         "config: its get_config\\(\\) raised "
                                         "AttributeError") as info:
        cle.fold_all_batch_norms(model)
    assert isinstance(info.value.__cause__, AttributeError)
