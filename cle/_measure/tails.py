"""A heavy tail of the check's errors: what a thousand new inputs may read.

The SQNR of a set of inputs is its signal energy over its noise energy, so its noise is a sum
over the inputs, and on some models that sum is ruled by a few inputs: one of a thousand held
out photo crops that lies beyond what the calibration inputs reached inside the network (a
global pooling's largest value half as large again as any calibration input's) holds two
thirds of the noise of all thousand. A few dozen check inputs seldom hold such an input, and a
bootstrap over them cannot move the figure below what they hold: the claim and its interval
stand far above the figure of many new inputs (docs/design.md, "With data").

The check's own inputs show when this is so: their largest errors fall off as a power law.
This module fits one to the largest :data:`TAIL_SHARE` of the per-input noise energies (the
Hill estimator of its index ξ; above ξ = 1 such a law has no finite mean) and draws
:data:`SIMULATIONS` sets of :data:`NEW_INPUTS` new inputs, each input's noise from the
check's own below the tail's threshold or, in the tail's share, from the fitted law (capped
at the largest error the output can have, :func:`noise_cap`): :func:`new_figures`. Eight
errors of sixty-four tell the index roughly, so each set draws its own index from those
they allow (above its threshold a power law's k log-spacings sum to ξ times a Gamma(k)
variable, so ``k ξ̂ / ξ`` is one): with the fitted index alone, the lower end covered the
figure of a thousand new inputs in far fewer simulated power-law worlds than the interval's
level means; drawing the index, about as often as meant (``tests/test_tails.py``). The
check's interval reaches down to the figure all but :data:`QUANTILE` of those sets read
(:func:`heavy_tail`), the lower tail of its :data:`cle._measure.check.INTERVAL` interval. On
a light tail that is above the bootstrap's lower end and changes nothing; on a heavy one it
is lower. It moves the interval's lower end only, never the figure.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["MIN_INPUTS", "NEW_INPUTS", "QUANTILE", "SIMULATIONS", "TAIL_SHARE", "Tail",
           "heavy_tail", "new_figures", "noise_cap", "tail_caveats", "tail_index"]

#: The share of the check's inputs, those with the largest noise, the power law is fitted to.
TAIL_SHARE = 0.125
#: How many new inputs a drawn set holds.
NEW_INPUTS = 1000
#: Draws of :data:`NEW_INPUTS` inputs the lower end is read from.
SIMULATIONS = 500
#: The share of those draws whose figure is below the lower end: the lower tail of the check's
#: :data:`cle._measure.check.INTERVAL` interval.
QUANTILE = 0.05
#: Fewer check inputs than this fit no tail: the tail's share of them is too few to fit.
MIN_INPUTS = 32
#: The lower end a heavy tail sets this far below the figure or further is said in the report.
SAID_DB = 3.0


def tail_index(noise) -> tuple[float, float, int] | None:
    """``(xi, threshold, k)``: the Hill estimate ``xi`` of the power law the ``k`` largest of
    the per-input noise energies ``noise`` follow (``k``: :data:`TAIL_SHARE` of them) above
    ``threshold``, the (k + 1)-th largest; None with fewer than :data:`MIN_INPUTS` values or
    a threshold of 0 (most inputs exact)."""
    noise = np.asarray(noise, np.float64)
    if len(noise) < MIN_INPUTS:
        return None
    k = int(round(TAIL_SHARE * len(noise)))
    largest = np.sort(noise)[::-1]
    threshold = float(largest[k])
    if not threshold > 0:
        return None
    return float(np.mean(np.log(largest[:k] / threshold))), threshold, k


def new_figures(signal, noise, cap=None, seed=0) -> np.ndarray | None:
    """The SQNRs (dB) of :data:`SIMULATIONS` draws of :data:`NEW_INPUTS` new inputs whose noise
    energies follow the check's (``signal``, ``noise``: per input) with its largest
    :data:`TAIL_SHARE` continued as the power law :func:`tail_index` fits, each noise at most
    ``cap`` (None: no bound); the signal is the check's mean per input. None where
    :func:`tail_index` fits no tail."""
    fit = tail_index(noise)
    if fit is None:
        return None
    xi, threshold, k = fit
    noise = np.asarray(noise, np.float64)
    below = np.sort(noise)[: len(noise) - k]
    rng = np.random.default_rng(seed)
    in_tail = rng.random((SIMULATIONS, NEW_INPUTS)) < k / len(noise)
    bulk = below[rng.integers(0, len(below), size=in_tail.shape)]
    # each set's own index, drawn from those its k errors allow: k xi_hat / xi is a Gamma(k)
    xis = xi * k / rng.gamma(k, 1.0, size=(SIMULATIONS, 1))
    with np.errstate(over="ignore"):  # a steep law's rare draws: capped or infinite, both fine
        tail = threshold * (1.0 - rng.random(in_tail.shape)) ** -xis
    if cap is not None:
        tail = np.minimum(tail, cap)
    totals = np.where(in_tail, tail, bulk).sum(axis=1)
    signal_total = float(np.mean(signal)) * NEW_INPUTS
    if not signal_total > 0:  # no signal: no figure to reach down from
        return None
    with np.errstate(divide="ignore"):
        return 10.0 * np.log10(signal_total / totals)


@dataclasses.dataclass(frozen=True)
class Tail:
    """What :func:`heavy_tail` read of one output's check: the fitted law's index ``xi``, and
    the figures of sets of :data:`NEW_INPUTS` new inputs drawn from it: ``typical`` (their
    median) and ``floor`` (all but :data:`QUANTILE` of them read more)."""

    xi: float
    typical: float
    floor: float


def heavy_tail(signal, noise, cap=None) -> Tail | None:
    """The :class:`Tail` of the check's per-input ``signal`` and ``noise`` energies (each
    drawn noise at most ``cap``, :func:`new_figures`); None where no tail is fitted or its
    lower end is not finite. The quantiles are drawn figures, not interpolated: some may be
    minus infinity where a draw overflowed."""
    figures = new_figures(signal, noise, cap)
    if figures is None:
        return None
    floor = float(np.quantile(figures, QUANTILE, method="inverted_cdf"))
    if not np.isfinite(floor):
        return None
    return Tail(tail_index(noise)[0], float(np.quantile(figures, 0.5, method="inverted_cdf")),
                floor)


def noise_cap(reference, kind) -> float | None:
    """The largest noise energy one input of an output can have, where its ``kind``
    (:func:`cle._measure.check.output_kinds`) and its float values ``reference``
    (``(N, ...)``) bound it: probabilities of a softmax (every row of the last axis summing to
    1: 2 per row, two one-hot rows apart) or of a sigmoid (1 per entry); None otherwise."""
    r = np.asarray(reference, np.float64)
    if kind != "probabilities" or r.ndim < 2 or not r.size or r.min() < 0 or r.max() > 1:
        return None
    per_input = int(np.prod(r.shape[1:]))
    if r.shape[-1] >= 2 and np.all(np.abs(r.sum(axis=-1) - 1.0) < 1e-3):
        return 2.0 * per_input / r.shape[-1]
    return float(per_input)


def tail_caveats(checked, names) -> list[str]:
    """A sentence per output of the check set ``checked`` (its ``outputs``, each
    :class:`cle._measure.check.OutputCheck` with the :class:`Tail` its check read) whose
    heavy tail sets the interval's lower end at least :data:`SAID_DB` below the figure."""
    out = []
    for name, o in zip(names, checked.get("outputs") or []):
        tail = o.tail
        if tail is None or o.sqnr_interval is None or not (
                tail.floor <= o.sqnr_db - SAID_DB and tail.floor <= o.sqnr_interval[0] + 0.05):
            continue  # no heavy tail, or ties or clipping set the lower end lower
        out.append(f"output '{name}': a few of the check's inputs hold most of its error (the "
                   f"largest {TAIL_SHARE:.1%} of the errors fall off as a power law of index "
                   f"{tail.xi:.1f}), and new inputs hold more such: {NEW_INPUTS} of them would "
                   f"typically read about {tail.typical:.1f} dB, and {tail.floor:.1f} dB or "
                   f"less one time in {round(1 / QUANTILE)} (the interval's lower end)")
    return out
