"""Without data, whether the natural-image-like inputs look like data to the model's batch norms.

The calibration without data takes inputs distilled from the batch norms' statistics and as
many natural-image-like inputs (random fields with the spectrum and contrast of photos,
:func:`cle._measure.input_range.natural_inputs`): the fields bring a variety of images that
the distillation alone does not reach (attention nets of the hunts lost several dB without
them). But a batch norm remembers how far its inputs spread on the data the model was trained
on, and on some models the fields spread them much further: on a small EfficientNet-B0 trained
on photo crops, the fields spread the inputs of its batch norms far wider than the statistics
remember (real crops and the distilled inputs near them), widest deep in the net, so every
range calibrated on them was several times what real inputs reach, and the file read well
below the plain converter's (CHANGELOG).

:func:`spread` measures that width: per batch norm the median over its channels of the
standard deviation its input takes on the inputs over the one its moving variance remembers,
then the median over the batch norms. Past :data:`SPREAD_LIMIT` the fields are left out of the
calibration (they stay in the check, which measures on inputs no range was calibrated on).
"""

from __future__ import annotations

import keras
import numpy as np

from cle._core.inputs import ModelInputs
from cle._measure.synthetic import check_distillable, reachable

__all__ = ["SPREAD_LIMIT", "calibration_inputs", "spread"]

#: The widest :func:`spread` of natural-image-like inputs that still calibrate: a quarter past
#: what the batch norms remember. Real inputs spread near 1 on well-trained models (a briefly
#: trained one, whose moving statistics lag its weights, further); the fields of most models
#: measured spread below it; of the three past it, two files lost several dB to them and one
#: gained under a dB from them (the measurements: CHANGELOG).
SPREAD_LIMIT = 1.25
#: Inputs run through the model at once (the batch norms' inputs of a 224-pixel network take
#: tens of megabytes per input).
BATCH = 8


def spread(model, inputs: ModelInputs) -> float:
    """The median over the batch norms the distillation reads
    (:func:`cle._measure.synthetic.check_distillable`) of the median over each one's channels
    of the standard deviation of its input on ``inputs`` over the square root of its moving
    variance (plus epsilon). 1 where the inputs spread the batch norms' inputs as the
    statistics remember; NaN where a batch norm's channels cannot be read."""
    bns, _ = check_distillable(model)
    graph = reachable(model)
    features = keras.Model(list(graph.inputs), [t for _, t in bns])  # fed in that order
    sums = [None] * len(bns)
    for start in range(0, len(inputs), BATCH):
        outs = features([a[start:start + BATCH] for a in inputs.arrays], training=False)
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        for k, ((bn, _), out) in enumerate(zip(bns, outs)):
            a = np.moveaxis(np.asarray(keras.ops.convert_to_numpy(out), np.float64),
                            bn.axis if isinstance(bn.axis, int) else bn.axis[0], -1)
            a = a.reshape(-1, a.shape[-1])
            got = np.stack([np.full(a.shape[1], len(a)), a.sum(0), (a * a).sum(0)])
            sums[k] = got if sums[k] is None else sums[k] + got
    ratios = []
    for (bn, _), (n, s, ss) in zip(bns, sums):
        var = np.maximum(ss / n - (s / n) ** 2, 0.0)
        remembered = np.asarray(keras.ops.convert_to_numpy(bn.moving_variance), np.float64)
        ratios.append(np.median(np.sqrt(var / (remembered + bn.epsilon))))
    return float(np.median(ratios)) if ratios else float("nan")


def calibration_inputs(model, distilled: ModelInputs, fields: ModelInputs
                       ) -> tuple[ModelInputs, str]:
    """``(calibration inputs, what they are)`` without data: the inputs ``distilled`` from the
    batch norms' statistics and the natural-image-like ``fields``, or the distilled ones alone
    where the fields' :func:`spread` is past :data:`SPREAD_LIMIT` (the words say so, and by
    how much)."""
    what = f"{len(distilled)} distilled from the model's batch-norm statistics"
    width = spread(model, fields)
    if width > SPREAD_LIMIT:
        return distilled, what + (
            f" (the natural-image-like inputs left out: they spread the inputs of its batch "
            f"norms {width:.2f} times as wide as their statistics remember, past "
            f"{SPREAD_LIMIT:g})")
    both = ModelInputs(tuple(np.concatenate([a, b]) for a, b in zip(distilled.arrays,
                                                                     fields.arrays)),
                       distilled.names, distilled.shapes)
    return both, what + f" and {len(fields)} natural-image-like inputs across the input range"
