"""A ``Normalization`` adapted on data in which some feature never varied: its scale there is
``1 / epsilon`` (Keras divides by ``max(sqrt(variance), epsilon)``), some ten million times the
others'. TF Lite's converter holds the layer's vector of scales on one 8-bit scale, and every
other feature's scale then reads 0: the plain converter's file, and cle's, computed nearly
nothing of the float model (sklearn digits' always-zero pixels, hunt10's ``selu_mlp``).

With calibration data, a feature that is also constant on every calibration input normalizes
to one value there, which any scale can give with the right mean. :func:`tame` gives such
features the smallest scale of the layer's other features (the largest variance) and that
mean, in the prepared model (a new ``Normalization`` made from its public arguments), and
checks on every calibration input that the model computes what it did. (A ``Normalization``
whose offsets ``mean × scale`` are small is a :class:`cle.layers.ChannelAffine` by then:
:mod:`cle._transforms.stable`.) A ``Normalization`` inside a nested model is not reached.
The float model is then unchanged wherever those features keep that value; an input that
moves them reads them far smaller than the float model does, which the report says.
"""

from __future__ import annotations

import keras
import numpy as np

from cle._core.rebuild import LayerEdit, rebuild
from cle._core.weights import normalization_arrays
from cle._measure.inference import predict_all

__all__ = ["SPREAD", "tame"]

#: A feature whose scale is more than this many times the largest scale of the layer's
#: features that vary is one the layer's 8-bit scale vector cannot hold beside them.
SPREAD = 2.0 ** 7


def _constant_features(arrays, values):
    """``(features, value)``: the features of a ``Normalization`` (its
    :func:`cle._core.weights.normalization_arrays`, given its input ``values``) to give a
    smaller scale, as a boolean array of the layer's mean's shape, and each feature's value on
    every calibration input; or None."""
    mean, variance, scale = arrays
    varies = variance > keras.config.epsilon() ** 2
    if not varies.any() or varies.all():
        return None
    wild = ~varies & (scale > SPREAD * scale[varies].max())
    if not wild.any():
        return None
    axes = tuple(i for i in range(values.ndim) if i == 0 or mean.shape[i] == 1)
    first = values[(slice(0, 1),) + (slice(None),) * (values.ndim - 1)]
    still = np.all(values == first, axis=axes, keepdims=True)
    value = np.max(first, axis=axes, keepdims=True)
    return np.reshape(wild & still, mean.shape), np.reshape(value, mean.shape)


def tame(model, x):
    """``(model, notes)``: ``model`` (a prepared float model, cle's own) with each
    ``Normalization`` feature that never varied, neither when the layer was adapted nor on the
    calibration inputs ``x``, given the layer's smallest other scale; ``notes`` says which, one
    line per layer. ``model`` itself when there is none."""
    edits, notes = {}, []
    for layer in model.layers:
        arrays = (normalization_arrays(layer) if type(layer) is keras.layers.Normalization
                  else None)
        if arrays is None:
            continue
        try:
            values = predict_all(keras.Model(model.inputs, layer.input), x)[0]
            found = _constant_features(arrays, values)
        except Exception:  # noqa: BLE001 - a layer called twice, an input it cannot reach
            continue
        if found is None or not found[0].any():
            continue
        fix, value = found
        mean, variance, scale = arrays
        new_variance = np.where(fix, variance[~fix & (variance > 0)].max(initial=1.0), variance)
        # What the feature normalizes to on every calibration input, kept: the mean moves to
        # value - normalized * sqrt(new variance).
        normalized = (value - mean) * scale
        mean = np.where(fix, value - normalized * np.sqrt(new_variance), mean)
        # the constructor takes them over the kept axes only
        kept = [mean.shape[a % mean.ndim] for a in sorted(a % mean.ndim for a in layer.axis)]
        edits[id(layer)] = LayerEdit(replace=lambda old, m=mean.reshape(kept),
                                     v=new_variance.reshape(kept): keras.layers.Normalization(
                                         axis=old.axis, mean=m, variance=v, name=old.name,
                                         dtype=old.dtype_policy.name))
        wild = float(np.max(scale[fix]))
        notes.append(
            f"Normalization '{layer.name}': {int(fix.sum())} of its features had no variance "
            f"when it was adapted, so the float model multiplies them by {wild:.3g} "
            f"(1/epsilon), which TF Lite's one 8-bit scale for the layer's scales cannot hold "
            f"beside the others (they would all read 0, as in the plain converter's file); "
            f"they are constant on every calibration input, so the file uses the layer's "
            f"smallest other scale for them, its mean moved to keep what they normalize to "
            f"there. An input that moves them changes the float model's output far more than any "
            f"calibration input shows, which the file does not follow and the check cannot "
            f"see: on such inputs the figures above do not hold")
    if not edits:
        return model, []
    new, _ = rebuild(model, edits=edits)
    before, after = predict_all(model, x), predict_all(new, x)
    if not all(np.allclose(a, b, rtol=1e-5, atol=1e-6 * max(1.0, float(np.abs(a).max())))
               for a, b in zip(before, after)):
        return model, []
    return new, notes
