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

from cle._core import keras_internals as internals
from cle._core.layouts import layout_of
from cle._core.rebuild import LayerEdit
from cle._core.semantics import activation_name
from cle.layers import STABLE, StableActivation

__all__ = ["all_stable", "stable_edit"]

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
    seen, out = set(), []
    for call in view.calls:
        layer = call.layer
        if id(layer) in seen:
            continue
        seen.add(id(layer))
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
