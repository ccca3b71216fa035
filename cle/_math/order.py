"""Order statistics near the ends of a sample, without partitioning the whole of it.

An activation range at the 1e-4 tails of a sample of a million values needs the hundred or so
smallest and largest values; ``np.partition`` (and ``np.quantile``, which partitions) moves every
value to find them. :func:`smallest` and :func:`largest` instead read a strided subsample for a
threshold a little past the wanted rank, keep the values beyond it (a comparison, a few thousand
values kept), and partition those. The answer is exact, not estimated: every value not kept is
on the far side of the threshold, so the kept ones hold the ``k`` wanted; when the subsample
misleads (too few values beyond the threshold), the whole sample is partitioned as before.
Ties at the threshold (a ReLU's zeros) are counted, not kept.

:func:`quantiles` gives ``np.quantile``'s default (linear) figures bit for bit: it finds the two
order statistics each quantile interpolates between, and lets ``np.quantile`` interpolate them
with the same weight."""

from __future__ import annotations

import numpy as np

__all__ = ["largest", "quantiles", "smallest"]

#: Values of the strided subsample that sets the threshold.
SUBSAMPLE = 4096
#: A sample shorter than this many times ``k`` is partitioned whole (the subsample buys little).
MIN_RATIO = 16


def smallest(values, k: int) -> np.ndarray:
    """The ``k`` smallest of ``values`` (1-D), sorted: ``np.sort(np.partition(values, k - 1)
    [:k])``, exactly. NaN are not supported."""
    return _ends(np.asarray(values).ravel(), k, low=True)


def largest(values, k: int) -> np.ndarray:
    """The ``k`` largest of ``values`` (1-D), sorted ascending: ``np.sort(np.partition(values,
    n - k)[n - k:])``, exactly. NaN are not supported."""
    return _ends(np.asarray(values).ravel(), k, low=False)


def _ends(x: np.ndarray, k: int, low: bool) -> np.ndarray:
    n = x.size
    if not 0 < k <= n:
        raise ValueError(f"cannot take {k} values from the ends of {n}")
    if n < MIN_RATIO * k or n < 2 * SUBSAMPLE:
        return _whole(x, k, low)
    stride = n // SUBSAMPLE
    sub = x[::stride]
    m = sub.size
    # The subsample's rank a little past the wanted share: k/n of it, doubled, plus a margin.
    rank = min(m - 1, 2 * int(np.ceil(k * m / n)) + 8)
    threshold = np.partition(sub, rank if low else m - 1 - rank)[rank if low else m - 1 - rank]
    beyond = x[x < threshold] if low else x[x > threshold]
    if beyond.size >= k:
        kept = np.partition(beyond, k - 1 if low else beyond.size - k)
        return np.sort(kept[:k] if low else kept[beyond.size - k:])
    ties = int(np.count_nonzero(x == threshold))
    if beyond.size + ties < k:  # the subsample misled: the threshold is not far enough in
        return _whole(x, k, low)
    fill = np.full(k - beyond.size, threshold, dtype=x.dtype)
    beyond = np.sort(beyond)
    return np.concatenate([beyond, fill] if low else [fill, beyond])


def _whole(x: np.ndarray, k: int, low: bool) -> np.ndarray:
    n = x.size
    kept = np.partition(x, k - 1 if low else n - k)
    return np.sort(kept[:k] if low else kept[n - k:])


def quantiles(values, qs) -> np.ndarray:
    """``np.quantile(values, qs)`` (1-D ``values``, default linear method), bit for bit, from
    the order statistics at the ends: each quantile's two neighbouring values are found with
    :func:`smallest` or :func:`largest`, then interpolated by ``np.quantile`` itself with the
    same weight."""
    x = np.asarray(values).ravel()
    n = x.size
    qs = np.asarray(qs, np.float64)
    if n == 0 or qs.ndim != 1:
        return np.quantile(x, qs)
    virtual = (n - 1) * qs
    below = np.floor(virtual).astype(np.int64)
    weight = virtual - below
    lows = [int(b) for b, q in zip(below, qs) if q <= 0.5]
    highs = [int(b) for b, q in zip(below, qs) if q > 0.5]
    small = smallest(x, min(n, max(lows) + 2)) if lows else None
    large = largest(x, min(n, n - min(highs))) if highs else None
    out = []
    for b, w, q in zip(below, weight, qs):
        if q <= 0.5:
            pair = small[b:b + 2]
        else:
            pair = large[b - (n - large.size):][:2]
        if pair.size == 1:  # the last value: np.quantile reads it alone
            pair = np.concatenate([pair, pair])
        # np.quantile on two values at weight w interpolates them as it would in place.
        out.append(np.quantile(pair, w))
    return np.array(out)
