"""What activations compute, in one place: which layers are ReLUs capped at 6 (and how they
sit in a model) and the clip interval of every ReLU-like layer or activation function.

Used by the set search (:mod:`cle._transforms.sets`), ReLU6 handling (:mod:`cle._transforms.relu6`) and bias
correction (:mod:`cle.bias_correction`).
"""

from __future__ import annotations

import functools

import keras
import numpy as np

from cle._core.layouts import layout_of
from cle.layers import ClippedReLU

__all__ = ["activation_clip", "activation_name", "clip_of", "plain_relu_cap", "relu6_kind"]

L = keras.layers


def activation_name(fn) -> str:
    """The name Keras gives activation ``fn`` ("relu", "linear" for None); for a callable
    Keras cannot serialize (``functools.partial``, an object without ``get_config``), a
    description that names no known activation ("partial(leaky_relu, negative_slope=0.1)")."""
    if fn is None:
        return "linear"
    try:
        name = keras.activations.serialize(fn)
    except TypeError:
        if isinstance(fn, functools.partial):
            args = [*map(repr, fn.args), *(f"{k}={v!r}" for k, v in fn.keywords.items())]
            return f"partial({getattr(fn.func, '__name__', 'function')}, {', '.join(args)})"
        return getattr(fn, "__name__", type(fn).__name__)
    return name if isinstance(name, str) else str(name)


def plain_relu_cap(layer):
    """For an exact ``keras.layers.ReLU`` without negative slope or threshold: its cap
    (``inf`` if none); else None."""
    if type(layer) is not L.ReLU:
        return None
    if float(layer.negative_slope) != 0.0 or float(layer.threshold) != 0.0:
        return None
    return np.inf if layer.max_value is None else float(layer.max_value)


def relu6_kind(layer) -> str | None:
    """"standalone" if ``layer`` is a ReLU capped at 6 (``ReLU(max_value=6)``,
    ``Activation("relu6")``), "fused" if it is a scalable layer with ``activation="relu6"``,
    else None."""
    if type(layer) is L.ReLU:
        return "standalone" if plain_relu_cap(layer) == 6.0 else None
    if type(layer) is L.Activation:
        return "standalone" if activation_name(layer.activation) == "relu6" else None
    if layout_of(layer) is not None and activation_name(layer.activation) == "relu6":
        return "fused"
    return None


def activation_clip(fn):
    """``(lo, hi)`` an activation function clips to (linear: unbounded), or None if it is not
    a clip."""
    name = activation_name(fn)
    if name == "linear":
        return -np.inf, np.inf
    if name == "relu":
        return 0.0, np.inf
    if name == "relu6":
        return 0.0, 6.0
    return None


def clip_of(layer):
    """``(lo, hi)`` if ``layer`` is a (capped) ReLU, else None (``hi`` per channel for a
    :class:`ClippedReLU`)."""
    if isinstance(layer, ClippedReLU) and type(layer) is ClippedReLU:
        return 0.0, np.asarray(keras.ops.convert_to_numpy(layer.caps), dtype=np.float64)
    cap = plain_relu_cap(layer)
    if cap is not None:
        return 0.0, cap
    if type(layer) is L.Activation:
        return activation_clip(layer.activation)
    return None
