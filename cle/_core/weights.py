"""Reading weights: one place for how a variable, a BN's statistics and a layer's name are read.

No Keras internals; numpy arrays in the variable's own dtype unless a function says float64.
"""

from __future__ import annotations

import keras
import numpy as np

__all__ = ["bn_arrays", "gamma_beta", "normalization_arrays", "quote", "read_weight"]


def read_weight(variable) -> np.ndarray:
    """A weight's value as a numpy array in its own dtype, read once.

    ``np.asarray`` of a Keras variable (its public ``__array__``) copies once on TensorFlow
    (``keras.ops.convert_to_numpy`` copies twice, half the time of a whole-model fold on
    ResNet50) and not at all on JAX. Where the array shares the variable's memory (JAX, and
    PyTorch's CPU tensors) it is made read-only, so that no transform can write into the
    model it reads.
    """
    a = np.asarray(variable)
    if not a.flags.owndata and a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


def bn_arrays(bn):
    """``(γ, β, μ, σ²)`` of a BatchNormalization in their own dtype (γ, β None when absent)."""
    gamma = read_weight(bn.gamma) if bn.scale else None
    beta = read_weight(bn.beta) if bn.center else None
    return gamma, beta, read_weight(bn.moving_mean), read_weight(bn.moving_variance)


def gamma_beta(bn):
    """``(γ, β)`` of a BN as float64 arrays (1 and 0 where the BN has none)."""
    gamma, beta, mean, _ = bn_arrays(bn)
    n = mean.shape[0]
    return (np.ones(n) if gamma is None else gamma.astype(np.float64),
            np.zeros(n) if beta is None else beta.astype(np.float64))


def normalization_arrays(layer):
    """``(mean, variance, scale)`` of a built ``keras.layers.Normalization`` that is not
    inverted, as float64 arrays of its broadcast shape, ``scale`` the factor it applies,
    ``1 / max(sqrt(variance), epsilon)`` (Keras' own divisor); None for an inverted or an
    unbuilt layer."""
    if layer.invert or getattr(layer, "mean", None) is None:
        return None
    mean = np.asarray(keras.ops.convert_to_numpy(layer.mean), dtype=np.float64)
    variance = np.asarray(keras.ops.convert_to_numpy(layer.variance), dtype=np.float64)
    return mean, variance, 1.0 / np.maximum(np.sqrt(variance), keras.config.epsilon())


def quote(call_or_layer) -> str:
    """A layer's (or call's) name in quotes, as reasons name layers."""
    return f"'{call_or_layer.name}'"
