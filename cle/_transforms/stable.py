"""Activations that TF Lite's converter writes through ``exp(x)`` put in a form that 8-bit
activations can hold (:class:`cle.layers.StableActivation`): an exact edit, made for
:func:`cle.quantize` (``EqualizeOptions.stable_activations``).

TF Lite's converter writes ``softplus(x)`` as ``log(exp(x) + 1)`` (mish and log-sigmoid hold
the same softplus), and a SELU with ``exp(x)`` of positive inputs too; with 8-bit activations
the tensor ``exp(x)`` gets one range from 0 to ``exp`` of the largest pre-activation, and its
steps are then far coarser than the values below the largest need. Without data the largest
pre-activation comes from synthetic inputs, which reach further than real ones, and with data
from whichever calibration inputs reach furthest; ``exp`` turns a little further into several
times coarser. :class:`cle.layers.StableActivation` is the same function with every ``exp``
of a value at most 0 (docs/design.md).
"""

from __future__ import annotations

import keras

import numpy as np

from cle._core import keras_internals as internals
from cle._core.layouts import layout_of
from cle._core.rebuild import LayerEdit
from cle._core.semantics import activation_name
from cle._core.weights import normalization_arrays
from cle.layers import STABLE, ChannelAffine, OneHot, StableActivation

__all__ = ["AFFINE_SPREAD", "all_normalizations", "all_one_hots", "all_stable",
           "normalization_edit", "one_hot_edit", "stable_edit"]

#: A ``Normalization`` becomes a :class:`cle.layers.ChannelAffine` when its largest scale is
#: more than this many times its smallest: one 8-bit scale for them then puts a relative
#: error of up to this over 254 on the smallest (3 % at 8).
AFFINE_SPREAD = 8.0
#: ... and when ``mean * scale`` stays below this on every feature: ``x * scale + offset``
#: cancels where ``(x - mean) * scale`` does not, and float32 keeps about 7 digits.
AFFINE_MAX_OFFSET = 1e3

L = keras.layers
#: The operations of ``keras.ops`` (``keras.ops.softplus(x)`` and ``keras.activations.selu(x)``
#: on a Functional model's tensors leave them in its graph) that compute one of
#: :data:`cle.layers.STABLE` (mish has none: ``keras.activations.mish`` takes no symbolic
#: tensor on TensorFlow).
OPERATIONS = {"Softplus": "softplus", "Selu": "selu", "LogSigmoid": "log_sigmoid"}


def all_stable(view):
    """``(layer, kind, activation)`` for every distinct layer of the view that applies one of
    :data:`cle.layers.STABLE`: kind "standalone" (an ``Activation`` layer, or one of the
    :data:`OPERATIONS`) or "fused" (a layer keras-cle knows with ``activation=`` that one)."""
    out = []
    for call in view.first_calls():
        layer = call.layer
        op = OPERATIONS.get(internals.nn_operation(layer))
        if op is not None:
            out.append((layer, "standalone", op))
            continue
        if type(layer) is L.Activation:
            kind = "standalone"
        elif layout_of(layer) is not None and hasattr(layer, "activation"):
            kind = "fused"
        else:
            continue
        name = activation_name(layer.activation)
        if name in STABLE:
            out.append((layer, kind, name))
    return out


def stable_edit(layer, kind, name) -> LayerEdit:
    """The edit that puts a :class:`cle.layers.StableActivation` in place of ``layer``'s
    activation: the layer itself when it is an ``Activation`` (or an operation), else one
    applied to its output (named ``"<layer>_<activation>"``) with the layer's own activation
    made linear."""
    def made(old, suffix=""):
        policy = getattr(old, "dtype_policy", None)
        return StableActivation(name, name=old.name + suffix,
                                dtype=policy.name if policy is not None else None)

    if kind == "standalone":
        return LayerEdit(replace=made)
    return LayerEdit(config={"activation": "linear"},
                     insert_after=lambda old: made(old, f"_{name}"))


def _scales(layer):
    """``(mean, scale)`` of a ``Normalization`` over its last axis alone, as float64 vectors,
    or None (another axis, ``invert=True``, not built)."""
    arrays = normalization_arrays(layer) if type(layer) is L.Normalization else None
    if arrays is None:
        return None
    mean, _, scale = arrays
    last = mean.ndim - 1
    if mean.ndim < 2 or tuple(a % mean.ndim for a in layer.axis) != (last,):
        return None
    if any(n != 1 for n in mean.shape[:-1]):
        return None
    return mean.reshape(-1), scale.reshape(-1)


def all_normalizations(view):
    """``(layer, mean, scale)`` for every distinct ``Normalization`` of the view over its last
    axis whose scales spread more than :data:`AFFINE_SPREAD` (and whose offsets stay below
    :data:`AFFINE_MAX_OFFSET`), called on inputs of known sizes."""
    out = []
    for call in view.first_calls():
        layer = call.layer
        if type(layer) is not L.Normalization or None in tuple(call.inputs[0].shape[1:]):
            continue
        found = _scales(layer)
        if found is None:
            continue
        mean, scale = found
        if (scale.max() > AFFINE_SPREAD * scale.min()
                and np.all(np.abs(mean * scale) <= AFFINE_MAX_OFFSET)):
            out.append((layer, mean, scale))
    return out


def normalization_edit(layer, mean, scale) -> LayerEdit:
    """The edit that puts a :class:`cle.layers.ChannelAffine` (``x * scale - mean * scale``)
    in place of a ``Normalization``."""
    return LayerEdit(
        replace=lambda old: ChannelAffine(name=old.name, dtype=old.dtype_policy.name),
        made_variables={"scale": scale, "offset": -mean * scale})


def all_one_hots(view):
    """Every distinct ``CategoryEncoding`` of the view with ``output_mode="one_hot"`` (dense):
    TF Lite's ``ONE_HOT`` loses its values in an INT8 model (:class:`cle.layers.OneHot`)."""
    return [call.layer for call in view.first_calls()
            if type(call.layer) is L.CategoryEncoding and call.layer.output_mode == "one_hot"
            and not getattr(call.layer, "sparse", False)]


def one_hot_edit(layer) -> LayerEdit:
    """The edit that puts a :class:`cle.layers.OneHot` in place of a ``CategoryEncoding``."""
    return LayerEdit(replace=lambda old: OneHot(old.num_tokens, name=old.name,
                                                dtype=old.dtype_policy.name))
