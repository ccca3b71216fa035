"""What a batch norm's moving statistics say of the activations it normalizes.

Keras starts a ``BatchNormalization`` layer's moving mean at 0 and its moving variance at 1,
and each training step updates them towards the batch's statistics,
``new = momentum * old + (1 - momentum) * batch``: after ``N`` steps the starting values still
weigh ``w = momentum ** N``. A network trained to convergence holds none of them (``w`` is
tiny), but one trained briefly keeps a share: 160 steps at Keras' default momentum of 0.99
leave a fifth of them, and every channel's moving variance is then the activations' own
variance (times ``1 - w``) plus ``w``. The model computes with those statistics as they are
(folding keeps them exactly). What they say of the activations' distribution is read with the
start taken out, ``mean / (1 - w)`` and ``(variance - w) / (1 - w)``, where that decides a
range: the input range a first batch norm implies (:func:`cle._measure.input_range.bn_fit`; a
briefly trained pre-activation ResNet's [0, 1] input was put at the torch convention, marked
sure).

``N`` is the model's optimizer's step count (``model.optimizer.iterations``, which a ``.keras``
file saved with its optimizer keeps). A layer's statistics are taken to hold the start only
where they can (:func:`start_weight`): the layer trainable, its moving statistics started at
Keras' values, every channel's variance at least ``w`` (a layer that did not start there for
those steps, such as a pretrained one, has channels below it), and some channel at most
:data:`FLOOR_SLACK` times ``w`` (a briefly trained layer has channels of little variance of
their own; one whose every channel stands well above ``w``, set from data by hand, say, is read
as it is).

The distillation's targets keep the statistics as the model holds them (measured on two
briefly trained nets, CHANGELOG): inputs distilled to the corrected statistics matched them,
but the layers after the last batch norm, which nothing constrains, then took far smaller
values than real inputs give them, and a file calibrated on them clipped its logits; inputs
distilled to the inflated statistics excite those layers more than real ones, which costs
resolution, not clipping.
"""

from __future__ import annotations

import keras
import numpy as np

__all__ = ["FLOOR_SLACK", "MIN_START_WEIGHT", "moments", "start_weight", "training_steps"]

#: Below this share of its starting values, a batch norm's statistics are read as they are.
MIN_START_WEIGHT = 0.01
#: The smallest channel variance of a briefly trained batch norm is at most this many times
#: the share ``w`` (its channel of least variance of its own).
FLOOR_SLACK = 1.5


def training_steps(model) -> int | None:
    """How many optimizer steps trained ``model`` (its optimizer's ``iterations``), or None
    for a model without an optimizer (never compiled, or saved without it)."""
    optimizer = getattr(model, "optimizer", None)
    iterations = getattr(optimizer, "iterations", None)
    if iterations is None:
        return None
    try:
        steps = int(keras.ops.convert_to_numpy(iterations))
    except (TypeError, ValueError):
        return None
    return steps if steps > 0 else None


def _initializer(bn, which) -> str:
    config = bn.get_config().get(f"moving_{which}_initializer")
    if isinstance(config, dict):
        return str(config.get("class_name", ""))
    return str(config)


def start_weight(bn, steps: int | None) -> float:
    """The share ``w`` of its starting values that batch norm ``bn``'s moving statistics hold
    after ``steps`` training steps (module docstring), or 0.0 where they cannot be told to
    hold it."""
    if not steps or not bn.trainable:
        return 0.0
    if (_initializer(bn, "mean").lower() not in ("zeros", "zero")
            or _initializer(bn, "variance").lower() not in ("ones", "one")):
        return 0.0
    w = float(bn.momentum) ** int(steps)
    if w < MIN_START_WEIGHT:
        return 0.0
    var = np.asarray(keras.ops.convert_to_numpy(bn.moving_variance), np.float64)
    # w + (1 - w) * (an average of variances) is at least w in every channel, up to float32
    # rounding; a smaller one says the layer did not start from Keras' values for these steps.
    # And a layer trained briefly has channels of little variance of their own, at w or just
    # above it: statistics whose every channel stands well above w (set by hand from data, or
    # a pretrained layer's) are read as they are.
    if var.size == 0 or not w * (1.0 - 1e-4) <= float(var.min()) <= FLOOR_SLACK * w:
        return 0.0
    return w


def moments(bn, steps: int | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """``(mean, variance, w)``: the per-channel mean and variance of the activations batch norm
    ``bn`` normalizes, as its moving statistics tell them after ``steps`` training steps
    (their start taken out, :func:`start_weight`; as they are for ``w`` = 0)."""
    mu = np.asarray(keras.ops.convert_to_numpy(bn.moving_mean), np.float64)
    var = np.asarray(keras.ops.convert_to_numpy(bn.moving_variance), np.float64)
    w = start_weight(bn, steps)
    if w:
        mu = mu / (1.0 - w)
        var = np.maximum(var - w, 0.0) / (1.0 - w)
    return mu, var, w
