"""Without data, the ranges of the global averages that gate a map (squeeze-and-excitation,
ECA: :func:`cle._tflite.roles.pooled_sources`), from the spread of the map they average.

A synthetic input distilled to the batch norms' statistics resembles every other one: its
averages over a map's positions stay near each channel's mean, where real inputs' averages
spread as far as the inputs differ (the share of a channel's variance that lies between
inputs), and a gate clips every average past its range into the whole map it multiplies.
That share is not known without data, but it is at most the whole: by the law of total
variance, the variance of one input's average is no more than the channel's variance over
every position of every input, which the synthetic inputs do reproduce. So each such average
reaches :data:`SPREAD` standard deviations of its channel past the channel's mean
(:func:`spread_ranges`), no further than the map's own range (an average of it cannot pass
its ends), and never less far than the synthetic inputs' own averages reached.
"""

from __future__ import annotations

import numpy as np

__all__ = ["POOL_SPREAD", "SPREAD", "spread_ranges"]

#: How such an average's range is set without data (:func:`spread_ranges`).
POOL_SPREAD = "min/max, or as far as its map spreads (a global average)"
#: How many of its channel's standard deviations (over every position of every input) past
#: the channel's mean an average of one input's map is taken to reach.
SPREAD = 4.0


def spread_ranges(tensor_ranges, sources: dict, moments: dict) -> None:
    """Set the range of each tensor of ``sources`` (``{tensor: map}``, as
    :func:`cle._tflite.roles.pooled_sources` gives them) that ``tensor_ranges`` lists: its
    min/max on the calibration inputs, each side widened by the factor that takes the
    averages of its map (on those inputs) out to where the map's spread says an average may
    reach on that side, within the map's min/max. ``moments``: ``{map: (means, squares)}`` as
    :func:`cle._tflite.converter.observe` gives them; a factor below one is not applied. (What
    only reshapes the pooling's output, or multiplies it by a positive constant, as JAX's
    export of a mean does, takes the same factors.)"""
    by_index = {r.index: r for r in tensor_ranges}
    factors = {}
    for source in set(sources.values()):
        if source in moments and source in by_index:
            factors[source] = _factors(*moments[source], by_index[source].calibrated)
    for tensor, source in sources.items():
        r = by_index.get(tensor)
        if r is None or source not in factors:
            continue
        (lo, hi), (low, high) = r.calibrated, factors[source]
        r.lo, r.hi, r.how = min(lo * low, 0.0), max(hi * high, 0.0), POOL_SPREAD


def _factors(means, squares, ends) -> tuple[float, float]:
    """How many times further than the lowest and the highest of ``means``
    (``(inputs, channels)``) an average may reach: to :data:`SPREAD` standard deviations of
    a channel past its mean (from ``squares``, each channel's mean square), within ``ends``
    (the map's min and max); at least once."""
    mu = means.mean(axis=0)
    sd = np.sqrt(np.maximum(squares - mu * mu, 0.0))
    low, high = float(means.min()), float(means.max())
    return (max(1.0, max(float(np.min(mu - SPREAD * sd)), ends[0]) / low) if low < 0 else 1.0,
            max(1.0, min(float(np.max(mu + SPREAD * sd)), ends[1]) / high) if high > 0 else 1.0)
