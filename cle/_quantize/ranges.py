"""Activation ranges chosen from a tensor's sampled values: its tails (what ``cle.quantize``
writes, :data:`TAIL` on each side) and the range of least quantization MSE (one of the ranges
``tune=True`` tries)."""

from __future__ import annotations

import numpy as np

__all__ = ["MIN_WIDTH", "TAIL", "mse_range", "tail_range"]

#: The share of a tensor's values left outside its range on each side (``ranges="percentile"``).
TAIL = 1e-4
#: A tail range narrower than this share of the min/max range keeps min/max (a tensor that is
#: almost always 0, e.g. a rarely firing ReLU, would otherwise get a range of width 0).
MIN_WIDTH = 1e-2
#: Values of a tensor's sample the MSE search uses.
MSE_SAMPLE = 1 << 18
_GRID = np.linspace(0.05, 1.0, 39)


def tail_range(values, calibrated, tail: float = TAIL):
    """``(low, high)``: the ``tail`` and ``1 - tail`` quantiles of ``values``, within the
    calibrated min/max (the interpreter's sums may round differently) and with 0 inside; None
    when that is narrower than :data:`MIN_WIDTH` of the min/max range."""
    lo, hi = np.quantile(values, [tail, 1.0 - tail])
    lo = min(max(float(lo), calibrated[0]), 0.0)
    hi = max(min(float(hi), calibrated[1]), 0.0)
    if hi - lo < MIN_WIDTH * (calibrated[1] - calibrated[0]):
        return None
    return lo, hi


def mse_range(values, low: float, high: float) -> tuple[float, float]:
    """The range, a shrinking of ``[low, high]`` (both ends by the same factor, 0 kept inside),
    whose asymmetric int8 quantization of ``values`` has the least mean squared error."""
    v = np.asarray(values, np.float64)
    if v.size > MSE_SAMPLE:
        v = v[np.random.default_rng(0).integers(0, v.size, MSE_SAMPLE)]
    low, high = min(low, 0.0), max(high, 0.0)
    best, pick = np.inf, (low, high)
    for a in _GRID:
        lo, hi = a * low, a * high
        if hi - lo <= 0:
            continue
        scale = (hi - lo) / 255.0
        zero = np.clip(np.round(-128 - lo / scale), -128, 127)
        dq = (np.clip(np.round(v / scale) + zero, -128, 127) - zero) * scale
        err = float(np.mean((dq - v) ** 2))
        if err < best:
            best, pick = err, (lo, hi)
    return pick
