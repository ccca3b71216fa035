"""Decisions near a tie: what a few dozen check inputs cannot show of a softmax output.

On a softmax output the noise of new inputs is ruled by the few whose top two classes are
nearly tied: there a small change of their log-ratio moves both probabilities most, and the
quantized model may change it more than elsewhere. A few dozen calibration inputs hold one
such input or none, so the check's figure and its bootstrap interval (over those inputs)
cannot show that noise, and new inputs can read far lower (docs/design.md, "With data").

This module measures the file at ties the float model makes: pairs of check inputs whose float
top classes differ are mixed, ``(1 - λ) a + λ b`` on every model input, with ``λ`` found where
the float model's probabilities of the two classes are equal (regula falsi on their log-ratio;
kept where those two are its top two there). The file's noise at those inputs, their mean, is
what one unseen tie would add; the check's interval reaches down to the figure with
:data:`UNSEEN_TIES` of them added (:func:`tie_floor`): the rule of three, the upper end (95 %)
of how many of n new decisions a kind never seen among n may hold. Mixed inputs are not natural
ones: their noise is a probe of the file near the float model's decision boundaries, not a
measurement of new inputs, and only moves the interval's lower end.

The other side: where none of the check's decisions is close to a tie (:func:`close_calls`),
its top-1 agreement can hardly fall below 100 % whatever the error, and the report says so
(:func:`idle_top1`).
"""

from __future__ import annotations

import math

import numpy as np

from cle._core.inputs import ModelInputs
from cle._measure.inference import outputs_once

__all__ = ["CLOSE_LEAD", "FLOOR", "PAIRS", "SIGMOID_UNITS", "STEPS", "TIE", "UNSEEN_TIES",
           "agreement",
           "close_calls", "idle_top1", "independent_labels", "softmax_probabilities",
           "tie_floor", "tie_inputs"]

#: Pairs of check inputs mixed to a tie (at most; fewer when fewer have different classes).
PAIRS = 32
#: Runs of the float model that find the pairs' mixing weights, at most.
STEPS = 12
#: A pair is at a tie when the float model's probabilities of its two classes differ by less.
TIE = 1e-2
#: Probabilities below this are read as this (a float32 softmax's zeros) in their logs.
FLOOR = 1e-30
#: Ties added to the interval's lower end: none seen among n inputs, up to this many expected
#: among n new ones at the 95 % level.
UNSEEN_TIES = 3
#: Sigmoid units of one output probed for ties, at most (:func:`tie_floor`).
SIGMOID_UNITS = 4
#: A decision is close when the float model's lead of its top class over the runner-up is
#: less than this many times the typical change (root mean square over the inputs) the
#: quantized model makes to that lead.
CLOSE_LEAD = 2.0


def softmax_probabilities(reference) -> bool:
    """Whether ``reference`` (an output's float values, ``(N, classes)``) holds a softmax's
    probabilities: two classes or more, each row non-negative and summing to 1."""
    r = np.asarray(reference, np.float64)
    return (r.ndim == 2 and r.shape[1] >= 2 and len(r) >= 2 and bool(np.all(r >= 0))
            and bool(np.all(np.abs(r.sum(axis=1) - 1.0) < 1e-3)))


def _mixed(x: ModelInputs, a, b, lam) -> ModelInputs:
    arrays = []
    for arr in x.arrays:
        w = lam.reshape((-1,) + (1,) * (arr.ndim - 1)).astype(np.float32)
        arrays.append(((1.0 - w) * arr[a] + w * arr[b]).astype(np.float32))
    return ModelInputs(tuple(arrays), x.names, x.shapes)


def tie_inputs(model, x: ModelInputs, output: int, probabilities, seed: int = 0):
    """Inputs mixed from pairs of ``x`` to a tie of the float ``model``'s output ``output``
    (``probabilities``: its float values on ``x``), or None when no pair ties there."""
    return _ties(model, x, output, probabilities, seed)[0]


def _log_ratio(p, ca, cb):
    """Per pair, the log of the float model's probability of class ``ca`` over ``cb``'s (the
    difference of their logits), its probabilities ``p`` read from :data:`FLOOR` up."""
    rows = np.arange(len(p))
    return (np.log(np.maximum(p[rows, ca], FLOOR)) - np.log(np.maximum(p[rows, cb], FLOOR)))


def _ties(model, x: ModelInputs, output: int, probabilities, seed: int, view=None,
          pairs: int = PAIRS):
    """``(inputs, float outputs there)`` of :func:`tie_inputs`, ``(None, None)`` without.

    Each pair's mixing weight is found where the log-ratio of the two classes' probabilities
    (the difference of their logits, close to linear along the mix in a network of ReLUs) is
    0, by regula falsi with the Illinois rule (an end kept twice in a row has its value
    halved), from the ends the float model's outputs on ``x`` give, until every pair's two
    probabilities are within :data:`TIE` of each other (a few runs of the model; at most
    :data:`STEPS`, which bisection took every time). ``view`` reads the probabilities from the
    model's output (default: the output itself), as :func:`_sigmoid_unit` does for one
    sigmoid; ``pairs``: at most that many."""
    probabilities = np.asarray(probabilities, np.float64)
    top = probabilities.argmax(axis=1)
    a, b = np.nonzero(top[:, None] != top[None, :])
    if not len(a):
        return None, None
    pick = np.random.default_rng(seed).permutation(len(a))[:pairs]
    a, b = a[pick], b[pick]
    ca, cb, rows = top[a], top[b], np.arange(len(a))
    lo, hi = np.zeros(len(a)), np.ones(len(a))
    f_lo, f_hi = _log_ratio(probabilities[a], ca, cb), _log_ratio(probabilities[b], ca, cb)
    kept_end = np.zeros(len(a))  # +1: the last step moved the low end, -1: the high end
    best, gap, at = np.full(len(a), 0.5), np.full(len(a), np.inf), None
    for _ in range(STEPS):
        span = f_hi - f_lo  # < 0 but where both ends read as a tie (then: the midpoint)
        with np.errstate(divide="ignore", invalid="ignore"):
            lam = np.where(span < 0, np.clip((lo * f_hi - hi * f_lo) / span, lo, hi),
                           (lo + hi) / 2)
        p = np.asarray(outputs_once({}, model, _mixed(x, a, b, lam))[output], np.float64)
        p = p if view is None else view(p)
        here = np.abs(p[rows, ca] - p[rows, cb])
        closer = here < gap
        best, at = np.where(closer, lam, best), p if at is None else np.where(
            closer[:, None], p, at)
        gap = np.fmin(here, gap)
        if np.all(gap < TIE):
            break
        f = _log_ratio(p, ca, cb)
        ahead = f > 0
        f_hi = np.where(ahead & (kept_end > 0), f_hi / 2, f_hi)
        f_lo = np.where(~ahead & (kept_end < 0), f_lo / 2, f_lo)
        lo, f_lo = np.where(ahead, lam, lo), np.where(ahead, f, f_lo)
        hi, f_hi = np.where(ahead, hi, lam), np.where(ahead, f_hi, f)
        kept_end = np.where(ahead, 1, -1)
    two = np.sort(np.argsort(-at, axis=1)[:, :2], axis=1)
    kept = np.nonzero(np.all(two == np.sort(np.stack([ca, cb], axis=1), axis=1), axis=1))[0]
    return (_mixed(x, a, b, best)[kept], at[kept]) if len(kept) else (None, None)


def _sigmoid_unit(unit):
    """The view of :func:`_ties` that reads sigmoid ``unit`` of an ``(N, units)`` output as
    the probabilities of two classes, ``[1 - p, p]``: its tie is ``p = 0.5``."""
    def view(p):
        return np.stack([1.0 - p[:, unit], p[:, unit]], axis=1)
    return view


def _sigmoid_ties(model, x: ModelInputs, k: int, ref, seed: int):
    """Inputs mixed to ``p = 0.5`` of the sigmoid output ``k`` (``ref``: ``(N, units)``, its
    float values on ``x``) for up to :data:`SIGMOID_UNITS` units (those whose decisions
    split most evenly), or None."""
    decided = (ref > 0.5).mean(axis=0)
    units = [u for u in np.argsort(np.abs(decided - 0.5), kind="stable")
             if 0.0 < decided[u] < 1.0][:SIGMOID_UNITS]
    found = []
    for u in units:
        ties, _ = _ties(model, x, k, _sigmoid_unit(u)(ref), seed, view=_sigmoid_unit(u),
                        pairs=max(8, PAIRS // len(units)))
        if ties is not None:
            found.append(ties)
    if not found:
        return None
    return ModelInputs(tuple(np.concatenate(parts) for parts in zip(*(t.arrays for t in found))),
                       x.names, x.shapes)


def tie_floor(model, content: bytes, x: ModelInputs, reference, kinds, seed: int = 0,
              sigmoids=None) -> list:
    """Per output, the noise energy :data:`UNSEEN_TIES` ties would add to the check's noise:
    that many times the mean noise of the ``.tflite`` ``content`` on inputs of ``x`` mixed
    to a tie of the float ``model`` (:func:`tie_inputs`); 0.0 for an output that is neither
    a softmax's probabilities nor a sigmoid's (``reference``: the float outputs on ``x``,
    ``kinds``: as :func:`cle._measure.check.output_kinds` says; ``sigmoids``: per output,
    whether it ends in a sigmoid) or when no pair ties.

    A sigmoid output of shape ``(N, units)`` (a binary classifier's one unit, checked as
    values, or independent labels) ties where a unit reads 0.5: its noise is largest
    there, where the sigmoid is steepest, and a check whose inputs all read near 0 or 1
    claimed several dB above the figure of new inputs (hunt11's siamese pair, CHANGELOG)."""
    out = []
    for k, (ref, kind) in enumerate(zip(reference, kinds)):
        ref = np.asarray(ref, np.float64)
        ties, p = None, None
        if kind != "values" and softmax_probabilities(ref):
            ties, p = _ties(model, x, k, ref, seed)  # the float outputs there as they are
        elif sigmoids and sigmoids[k] and ref.ndim == 2 and len(ref) >= 2:
            ties = _sigmoid_ties(model, x, k, ref, seed)  # read as two classes: run again
        if ties is None:
            out.append(0.0)
            continue
        if p is None:
            p = np.asarray(outputs_once({}, model, ties)[k], np.float64)
        q = np.asarray(outputs_once({}, content, ties)[k], np.float64)
        out.append(UNSEEN_TIES * float(np.mean(np.sum((p - q) ** 2, axis=1))))
    return out


def independent_labels(reference, kind) -> bool:
    """Whether probabilities ``reference`` (the float model's, ``(N, ..., entries)``) are
    independent labels: scores that do not sum to one over the last axis (sigmoids, a
    multi-label output; a softmax sums to one). Their top class means little: several labels
    near 1 (or all near 0) leave it to the error's last digits (hunt9's multi-label
    attributes read a low top-1 agreement where nearly every label agreed). Read on
    the mean distance of the sums from one (above 1e-2), which a float16 softmax's rounding
    does not reach."""
    r = np.asarray(reference, np.float64)
    return (kind == "probabilities" and r.ndim >= 2 and r.shape[-1] >= 2 and r.size > 0
            and float(np.mean(np.abs(r.sum(axis=-1) - 1.0))) > 1e-2)


def agreement(reference, test, kind) -> tuple[float, bool]:
    """``(agreement, labels)`` of one output: for class scores the share of decisions
    (samples, or pixels) whose top class is the float model's, for independent labels
    (``labels``, :func:`independent_labels`) the share of decisions whose set of labels (the
    scores above 0.5) is the float model's: every label must agree, so the many easy
    negatives of a large label set do not flatter it; NaN for values."""
    if kind == "values":
        return math.nan, False  # the one NaN object: checks compare equal
    r, y = np.asarray(reference), np.asarray(test)
    if independent_labels(r, kind):
        return float(np.mean(np.all((r > 0.5) == (y > 0.5), axis=-1))), True
    return float(np.mean(r.argmax(axis=-1) == y.argmax(axis=-1))), False


def close_calls(reference, test) -> tuple[int, int]:
    """``(close, decisions)`` of one class output (``(N, ..., classes)``; each sample, or
    pixel, a decision): how many decisions have a float lead of the top class over the
    runner-up below :data:`CLOSE_LEAD` times the root mean square change the quantized model
    makes to that lead, out of how many. Close decisions are the ones that flip: where none
    is, a top-1 agreement of 100 % says little of the error (``close`` is 0 also when the lead
    never changes)."""
    r = np.asarray(reference, np.float64)
    r = r.reshape(-1, r.shape[-1])
    y = np.asarray(test, np.float64).reshape(r.shape)
    if r.shape[0] == 0 or r.shape[1] < 2:
        return 0, r.shape[0]
    top = np.argsort(-r, axis=1, kind="stable")[:, :2]
    rows = np.arange(r.shape[0])
    lead = r[rows, top[:, 0]] - r[rows, top[:, 1]]
    change = (y[rows, top[:, 0]] - y[rows, top[:, 1]]) - lead
    rms = float(np.sqrt(np.mean(change ** 2)))
    return int(np.sum(lead < CLOSE_LEAD * rms)) if rms > 0 else 0, r.shape[0]


def idle_top1(reference, test, names, kinds, label) -> list[str]:
    """A sentence per class output whose top-1 agreement on these inputs (``label``) cannot
    tell the error: none of its decisions is close (:func:`close_calls`)."""
    out = []
    for ref, y, name, kind in zip(reference, test, names, kinds):
        if kind == "values" or independent_labels(ref, kind):
            continue
        close, n = close_calls(ref, y)
        if close == 0 and n and not np.array_equal(ref, y):
            out.append(f"output '{name}': its top-1 agreement on the {label} tells little: "
                       f"none of their {n} decisions is close (the float model's lead over "
                       f"the runner-up under {CLOSE_LEAD:g} times the typical change the "
                       "quantized model makes to it), so hardly any could flip; read its SQNR")
    return out
