"""Activation ranges chosen from a tensor's sampled values: its tails (what ``cle.quantize``
writes, :data:`TAIL` on each side; :func:`choose_percentile_ranges` sets them for a whole
flatbuffer) and the range of least quantization MSE (one of the ranges ``tune=True``
tries)."""

from __future__ import annotations

import numpy as np

from cle._math.order import quantiles
from cle._quantize.pool_spread import POOL_SPREAD, spread_ranges
from cle._tflite import converter as tflite
from cle._tflite.runtime import input_name

__all__ = ["KINDS", "LOGITS", "LOGIT_WIDENINGS", "MAX_KEPT", "MIN_WIDTH", "PEAKED", "PEAK_SHARE",
           "PEAK_TOP", "POOLED", "POOL_WIDENING", "SOFTMAX_STEPS", "TAIL", "USUAL_RANGES",
           "USUAL_SHARE", "WIDEN_INPUTS",
           "as_kind", "choose_percentile_ranges", "clipping_noise", "expected_clipping",
           "logit_range", "logit_widening", "mse_range", "peak_share", "peaked_maps",
           "pick_range", "softmax_clipping", "softmax_floor", "tail_range", "tensor_roles",
           "usual_range", "widened"]

#: The share of a tensor's values left outside its range on each side (``ranges="percentile"``).
TAIL = 1e-4
#: A tail range narrower than this share of the min/max range keeps min/max (a tensor that is
#: almost always 0, e.g. a rarely firing ReLU, would otherwise get a range of width 0).
MIN_WIDTH = 1e-2
#: Widened ranges reach the extremes this many times as many inputs as calibrated them would
#: be expected to reach (:func:`as_kind`).
WIDEN_INPUTS = 3.0
#: How the logits before a softmax (or a sigmoid) are set in cle's own build: widened like
#: the ``"widened"`` kind's ranges (:func:`as_kind`).
LOGITS = "widened (decides an output)"
#: How a tensor whose largest values a global max pooling keeps is set: at its min/max (its
#: tails are what the pooling passes on; :func:`cle._tflite.converter.max_kept_indices`).
MAX_KEPT = "min/max (max-pooled)"
#: How the output of a global average pooling that gates a map (one value per channel and
#: input, read by a squeeze-and-excitation or ECA gate: :func:`cle._tflite.roles.pooled_indices`)
#: is set with data: its min/max, widened to the
#: extremes :data:`POOL_WIDENING` times as many inputs would be expected to reach
#: (:func:`widened`). Its values are one per input: a few dozen calibration inputs sample its
#: extremes as thinly as a model output's, where a map's tensor has every position of every
#: input, and new inputs' averages pass them (an ECA net's gate multiplies the clip into the
#: whole map: CHANGELOG). Not a pooling only a classifier's head reads (widened, it moved the
#: cross-fit's choice on two residual nets), and not without data: synthetic inputs' averages
#: reach short of real inputs' on some models and far past them on others (without data:
#: :mod:`cle._quantize.pool_spread`).
POOLED, POOL_WIDENING = "min/max widened (a global average)", 3.0
#: How a tensor is set, without data, when a map output of sparse peaks is computed from it
#: (:func:`peaked_maps`): at its min/max.
PEAKED = "min/max (before a map of sparse peaks)"
#: How a sum of class scores (an ensemble's mean of softmaxes) is set: at the bounds the scores
#: give it (:func:`cle._tflite.converter.score_bounds`), once its calibration values reach past
#: :data:`SCORE_REACH` of its upper bound (without data the synthetic inputs' mean stopped
#: short of the 1 real inputs reach, and every confident input was clipped).
SCORE_BOUNDED, SCORE_REACH = "bounds (a sum of class scores)", 0.5
#: A map output (values at positions: heatmaps, masks, images) is one of sparse peaks when its
#: largest :data:`PEAK_TOP` of values (by magnitude) carry :data:`PEAK_SHARE` of its energy or
#: more on the synthetic inputs (:func:`peak_share`).
PEAK_TOP, PEAK_SHARE = 1e-2, 0.25
#: The kinds of range :func:`as_kind` makes from the ranges :func:`pick_range` sets.
KINDS = ("tails", "min/max", "widened")
#: The usual ranges of a model input's values (pixels and normalized signals) ...
USUAL_RANGES = ((0.0, 1.0), (-1.0, 1.0), (0.0, 255.0))
#: ... an input takes whole when its calibration values lie within one and span at least this
#: share of its width (:func:`usual_range`).
USUAL_SHARE = 0.9
#: A new input whose largest logit passes a softmax's range is drawn after this share of the
#: calibration inputs, those whose largest logit is largest (at most :data:`LOGIT_INPUTS` of
#: them), and :data:`TAIL_POINTS` points of the law's tail beyond the range
#: (:func:`softmax_clipping`).
LOGIT_TAIL, LOGIT_INPUTS, TAIL_POINTS = 0.125, 32, 256
#: The logits of a softmax reach the extremes this many times as many inputs as calibrated
#: them would reach: the one of least expected error (:func:`logit_widening`).
LOGIT_WIDENINGS = (3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)
#: The steps of an 8-bit softmax's output (TF Lite fixes its scale at 1/256).
SOFTMAX_STEPS = 256
#: The softmax floor (:func:`softmax_floor`) lies below the smallest largest logit this many
#: times as many inputs as calibrated it would be expected to reach: a new input less sure
#: than any calibration input, its largest logit near or below the floor, has every logit
#: below it raised to it, and its softmax spread over the classes (three times as many, as
#: other ranges take: blob-grid classifiers of 50 and 100 classes read far below the plain
#: conversion on new inputs, from the few such inputs; ten times: about the plain
#: conversion's, and the zoo's and hunt7's other classifiers alike or closer: CHANGELOG).
FLOOR_WIDENING = 10.0
#: Values of a tensor's sample the MSE search uses.
MSE_SAMPLE = 1 << 18
_GRID = np.linspace(0.05, 1.0, 39)


def tail_range(values, calibrated, tail: float = TAIL):
    """``(low, high)``: the ``tail`` and ``1 - tail`` quantiles of ``values``, within the
    calibrated min/max (the interpreter's sums may round differently) and with 0 inside; None
    when that is narrower than :data:`MIN_WIDTH` of the min/max range."""
    if hasattr(values, "quantile"):  # a sample known by its ends (cle._quantize.crossfit)
        lo, hi = values.quantile(tail), values.quantile(1.0 - tail)
    else:
        lo, hi = quantiles(values, [tail, 1.0 - tail])  # np.quantile's, bit for bit
    lo = min(max(float(lo), calibrated[0]), 0.0)
    hi = max(min(float(hi), calibrated[1]), 0.0)
    if hi - lo < MIN_WIDTH * (calibrated[1] - calibrated[0]):
        return None
    return lo, hi


def usual_range(lo, hi) -> tuple[float, float] | None:
    """The narrowest of :data:`USUAL_RANGES` that holds ``[lo, hi]`` (a model input's values
    on the calibration inputs) and whose width they span by :data:`USUAL_SHARE` or more, else
    None. A few dozen calibration inputs seldom reach the ends their kind of data reaches
    (pixels in [0, 1]: the brightest of a few dozen image patches can stay short of white,
    where many new patches reach it): an input range at their extremes clips the new inputs
    that go further, and on an autoencoder that clipping ruled the error of new inputs; the
    usual range costs at most a tenth of the input's resolution."""
    for low, high in sorted(USUAL_RANGES, key=lambda r: r[1] - r[0]):
        if low <= lo and hi <= high and hi - lo >= USUAL_SHARE * (high - low):
            return low, high
    return None


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


def choose_percentile_ranges(calibrated, x, tensor_ranges, stated, integer_io, say,
                             extremes=None, synthetic=False):
    """Set each tensor's ``lo``/``hi`` to its :data:`TAIL` quantiles on ``x``, and return the
    values each tensor took (a sample, by tensor index, as
    :func:`cle._tflite.converter.observe` keeps it). Kept at min/max: the tensors that decide an
    output (the outputs, and the logits before a softmax, which are then widened where
    ``extremes`` is given, :func:`as_kind`; :func:`cle._tflite.converter.protected_indices`),
    an input tensor with ``integer_io`` (its
    range is the int8 input's scale: real extremes must not clip); an input with a ``stated``
    range (``{input name: (lo, hi)}``, without data) takes it; and a tensor whose tail range
    would be narrower than :data:`MIN_WIDTH` of its min/max range keeps min/max. An input whose
    values lie within one of :data:`USUAL_RANGES` and nearly span it takes that range
    (:func:`usual_range`). The tensors whose largest values a global max pooling keeps keep
    min/max too (:func:`tensor_roles`), and on ``synthetic`` inputs (without data) so do the
    tensors a map output of sparse peaks is computed from (:func:`peaked_maps`,
    :data:`PEAKED`). The outputs of a global average pooling that gate a map take their
    min/max, with data widened where ``extremes`` is given (:data:`POOLED`), on ``synthetic``
    inputs widened as far as the map they average spreads
    (:func:`cle._quantize.pool_spread.spread_ranges`). Every range includes 0, as the
    converter's do.

    Each tensor's ``calibrated`` range becomes its min/max over all of ``x`` as the float
    interpreter computes it, so ``calibrated`` needs only the converter's tensor layout: one
    input calibrates it (the converter's own calibration pass would cost as much again, and
    its min/max of a tensor that feeds a residual ``ADD`` can be wider than the tensor's
    values). ``extremes``: as :func:`cle._tflite.converter.observe` takes it (each tensor's min
    and max on each input, for the cross-fitted builds of :mod:`cle._quantize.crossfit`)."""
    say(f"measuring {len(tensor_ranges)} activation tensors")
    sources = tflite.pooled_sources(calibrated) if synthetic else {}
    moments = dict.fromkeys(sources.values()) if sources else None
    values = tflite.observe(calibrated, x, [r.index for r in tensor_ranges], extremes=extremes,
                            moments=moments)
    peaked = peaked_maps(tensor_ranges, values, tflite.output_indices(calibrated)
                         - tflite.softmax_outputs(calibrated)) if synthetic else ()
    roles = tensor_roles(calibrated, peaked, pooled=not synthetic)
    for r in tensor_ranges:
        # The min/max over all of ``x``, as the interpreter computes it (``calibrated`` may
        # have been calibrated on fewer inputs; observe keeps each tensor's min and max last).
        pick_range(r, values[r.index], (float(values[r.index][-2]),
                                         float(values[r.index][-1])), roles, stated, integer_io)
        if extremes is not None and r.index in extremes:
            r.logit = _softmax_logit(r, values[r.index], roles[3], len(x), synthetic)
            as_kind(r, "tails", *extremes[r.index], roles[1], roles[3])
    if sources:
        spread_ranges(tensor_ranges, sources, moments)
    return values


def _softmax_logit(r, values, logits, n, synthetic=False):
    """``(classes, widening)`` for tensor ``r`` when it holds the logits of a softmax, one
    vector per input, and ``values`` (:func:`cle._tflite.converter.observe`'s sample of it on
    ``n`` inputs) holds every one of them (:func:`logit_widening` reads them: a sample holds
    them all while inputs × classes stays within the sample's size); else None (its range is
    :func:`widened` as any output's, without the floor)."""
    op, classes = logits.get(r.index, ("", 0))
    if op != "SOFTMAX" or int(np.prod(r.shape[1:])) != classes or classes < 2:
        return None
    if not isinstance(values, np.ndarray) or values.size != n * classes + 2:
        return None
    z = np.asarray(values[:-2], np.float64).reshape(n, classes)
    return classes, logit_widening(z, synthetic)


def tensor_roles(calibrated, peaked=(), pooled=True) -> tuple:
    """``(protected, inputs, outputs, logits, max_kept, before_peaks, score_sums, pooled)``: the
    indices of the tensors that keep
    min/max (:func:`cle._tflite.converter.protected_indices`), of the inputs, of the outputs,
    of the logits of a softmax or sigmoid output (:func:`cle._tflite.converter.logit_indices`:
    ``{index: (op, classes)}``), of the tensors whose largest values a global max pooling
    keeps (:func:`cle._tflite.converter.max_kept_indices`: min/max too; their tails are every
    value the pooling passes on: without data the tails of synthetic inputs stop far short of
    real inputs' maxima there, and with data the tails of a few dozen inputs cut what new
    inputs reach: CHANGELOG), and of the tensors the output tensors ``peaked``
    (maps of sparse peaks, :func:`peaked_maps`; none by default) are computed from
    (:func:`cle._tflite.converter.upstream_indices`), and ``{index: bounds}`` of the sums of
    class scores (:func:`cle._tflite.converter.score_bounds`), and the indices of the outputs of
    a global average pooling that gates a map (:func:`cle._tflite.converter.pooled_indices`,
    :data:`POOLED`;
    none with ``pooled`` False: without data)."""
    protected, inputs = tflite.protected_indices(calibrated)
    return (protected, inputs, tflite.output_indices(calibrated),
            tflite.logit_indices(calibrated),
            tflite.max_kept_indices(calibrated),
            tflite.upstream_indices(calibrated, peaked) if peaked else set(),
            tflite.score_bounds(calibrated),
            tflite.pooled_indices(calibrated) if pooled else set())


def peak_share(values, top: float = PEAK_TOP) -> float:
    """The share of the energy (the sum of squares) of ``values`` that their largest ``top``
    share (by magnitude, at least one value) carries."""
    v = np.abs(np.asarray(values, np.float64)).ravel()
    k = min(v.size, max(1, int(np.ceil(top * v.size))))
    energy = float(np.sum(v * v))
    if energy == 0.0:
        return 0.0
    largest = np.partition(v, v.size - k)[v.size - k:]
    return float(np.sum(largest * largest)) / energy


def peaked_maps(tensor_ranges, values, outputs) -> list[int]:
    """The outputs among ``outputs`` (tensor indices; not class scores: a confident softmax
    over many classes at each position puts most of its energy in each position's top class,
    which is no peak) that are maps of sparse peaks on the
    inputs ``values`` were measured on (:func:`cle._tflite.converter.observe`'s samples): a
    value at each of several positions (a shape of rank 3 or more, its axes between the
    batch and the last holding more than one position: keypoint heatmaps, masks, images),
    whose largest :data:`PEAK_TOP` of values carry :data:`PEAK_SHARE` of its energy or more
    (:func:`peak_share`). Such an output's error is ruled by its peaks, made of the largest
    values of every tensor it is computed from: the tails of those tensors cut exactly what
    makes the peaks (hunt9's keypoint heatmaps without data, every hidden range at its tails:
    far below the converter; at min/max, above it: CHANGELOG). The test reads the synthetic
    outputs, whose share was the real inputs' on every map output measured (CHANGELOG)."""
    found = []
    for r in tensor_ranges:
        if r.index not in outputs or len(r.shape) < 3 or int(np.prod(r.shape[1:-1])) < 2:
            continue
        sample = values.get(r.index)
        if sample is not None and len(sample) > 2 and peak_share(sample[:-2]) >= PEAK_SHARE:
            found.append(r.index)
    return found


def pick_range(r, values, extremes, roles, stated, integer_io) -> None:
    """Set ``r``'s ``calibrated`` to ``extremes`` (``(min, max)`` of the tensor over the
    inputs) and its ``lo``/``hi``/``how`` as :func:`choose_percentile_ranges` says, from
    ``values`` (a sample of the tensor's values on those inputs)."""
    protected, inputs, outputs = roles[:3]
    lo, hi = extremes
    # A tensor constant over all of the inputs keeps the converter's range: it widens a
    # range of width 0 (e.g. a ReLU that never fires gets (0, FLT_MIN)).
    if hi > lo:
        r.calibrated = (lo, hi)
    r.lo, r.hi = r.calibrated
    if r.index in inputs and input_name(r.name) in stated:
        lo, hi = stated[input_name(r.name)]
        r.lo, r.hi, r.how = min(lo, 0.0), max(hi, 0.0), "input range"
    elif r.index in inputs and usual_range(*r.calibrated) is not None:
        r.lo, r.hi = usual_range(*r.calibrated)
        r.how = "usual range"
    elif r.index in inputs and integer_io:
        r.how = "min/max (integer input)"
    elif r.index in roles[6] and hi >= SCORE_REACH * roles[6][r.index][1]:
        (r.lo, r.hi), r.how = roles[6][r.index], SCORE_BOUNDED
    elif r.index in protected:  # min/max: the largest outputs decide the top-1 class
        r.how = "min/max (output)" if r.index in outputs else "min/max (decides an output)"
    elif r.index in roles[7] and r.index not in roles[5]:  # one value per input: widened
        r.how = POOLED  # by as_kind, past min/max (what a global max pooling passes on too)
    elif r.index in roles[4]:  # its tails are what a global max pooling passes on
        r.how = MAX_KEPT
    elif r.index in roles[5]:  # its tails make a map's peaks
        r.how = PEAKED
    else:
        picked = tail_range(values, r.calibrated, TAIL)
        if picked is None:
            r.how = "min/max (sparse)"
        else:
            r.lo, r.hi, r.how = picked[0], picked[1], "percentile"


def as_kind(r, kind: str, lows, highs, inputs, logits=frozenset()) -> None:
    """Make ``r``, as :func:`pick_range` set it, a range of ``kind`` (one of :data:`KINDS`):
    ``"tails"`` keeps it but for the logits before a softmax (or a sigmoid), which are widened
    as below (:data:`LOGITS`); ``"min/max"`` sets a tail range back to the tensor's min/max;
    ``"widened"`` takes the min/max and, but for a model input, widens it to the extremes
    :data:`WIDEN_INPUTS` times as many inputs would be expected to reach: ``lows``/``highs``
    are the tensor's min and max on each input, and a Gumbel law fitted to them (its scale
    their standard deviation × √6/π) puts the extreme of k times as many inputs further by
    scale × ln k. A side at 0 (a ReLU's) stays there. On a value output (a regression head)
    the SQNR is ruled by the few inputs whose values leave the calibrated ranges, which few
    calibration inputs seldom contain; a classifier's outputs lose resolution for nothing.
    The output of a global average pooling (:data:`POOLED`) is widened from its min/max
    whatever the kind (by :data:`POOL_WIDENING`).
    ``inputs``: the indices of the model's input tensors; ``logits``: of the logits of a
    softmax or sigmoid output (:func:`cle._tflite.converter.logit_indices`).

    The logits before a softmax keep the top class where it is at any range, but a new input
    whose largest logit passes the range has it cut, and its probabilities move: on a small
    classifier of signals such inputs ruled the error of new inputs, and widening its logits
    alone took the file's figure on them most of the way to its claim, at the cost of a
    little of their resolution (which a softmax hardly sees). So cle's own build widens them
    too."""
    if r.how in (SCORE_BOUNDED, POOL_SPREAD):  # no input leaves them; set from the map
        return
    if r.how == POOLED:  # widened from its min/max whatever the kind (again: the same)
        r.lo, r.hi = widened(*r.calibrated, lows, highs, POOL_WIDENING)
        return
    if r.how == LOGITS:  # back to the min/max pick_range set
        r.lo, r.hi, r.how = r.calibrated[0], r.calibrated[1], "min/max (decides an output)"
    if kind == "tails":
        if r.how == "min/max (decides an output)" and r.index in logits:
            r.lo, r.hi = _widened(r, lows, highs, logits)
            r.how = LOGITS
        return
    if r.how == "percentile":
        r.lo, r.hi, r.how = r.calibrated[0], r.calibrated[1], "min/max (chosen)"
    if kind == "widened" and r.index not in inputs:
        r.lo, r.hi = _widened(r, lows, highs, logits)
        r.how = f"{r.how}, widened"


def _widened(r, lows, highs, logits) -> tuple[float, float]:
    """``r``'s range widened: by :func:`logit_range` for a classifier's softmax logits whose
    widening was measured (``r.logit``), else by :func:`widened`."""
    if r.index in logits and r.logit:
        return logit_range(r.lo, r.hi, lows, highs, *r.logit)
    return widened(r.lo, r.hi, lows, highs)


def _gumbel(extremes):
    """``(location, scale)`` of the Gumbel law (of maxima) fitted to ``extremes`` by its
    moments: scale = standard deviation × √6/π, location = mean − Euler's γ × scale."""
    scale = float(np.std(extremes)) * np.sqrt(6.0) / np.pi
    return float(np.mean(extremes)) - np.euler_gamma * scale, scale


def widened(lo, hi, lows, highs, times=WIDEN_INPUTS) -> tuple[float, float]:
    """``(lo, hi)`` moved out to the extremes ``times`` (:data:`WIDEN_INPUTS`) times as many
    inputs would be expected to reach, by the Gumbel laws fitted to the per-input minima
    ``lows`` and maxima ``highs`` (the extreme of k times as many inputs is further by scale ×
    ln k); a side at 0 or beyond it (a ReLU's) stays."""
    if lo < 0:
        lo = float(_out(lo, np.std(lows), times, -1.0))
    if hi > 0:
        hi = float(_out(hi, np.std(highs), times, 1.0))
    return lo, hi


def _out(end, sd, times, side):
    """``end`` moved outward (``side`` −1: a low end below 0, down; +1: a high end above 0,
    up) to where ``times`` as many inputs would be expected to reach, ``sd`` being the
    standard deviation of the per-input extremes; an end at 0 or on the other side stays
    (numbers, or arrays of them)."""
    return np.where(side * end > 0, end + side * _shift(times) * sd, end)


def _shift(times) -> float:
    """How far the extreme of ``times`` as many inputs lies beyond theirs, per standard
    deviation of the per-input extremes: the scale of :func:`_gumbel`, × ln ``times``."""
    return np.sqrt(6.0) / np.pi * np.log(times)


def softmax_floor(highs, classes) -> float:
    """The lowest logit of a softmax over ``classes`` that its 8-bit output can tell from a
    lower one: ln(2 · :data:`SOFTMAX_STEPS` · classes) below the smallest of the per-input
    largest logits ``highs``, taken down to where :data:`FLOOR_WIDENING` times as many inputs
    would be expected to reach (:func:`widened`'s margin). Raising every logit below it to it
    moves each probability, and their sum, by less than half a step, on an input whose
    largest logit is no lower than that."""
    highs = np.asarray(highs, np.float64)
    return float(_floor(highs.min(), np.std(highs), classes))


def _floor(least_high, sd_highs, classes):
    """:func:`softmax_floor` from the smallest largest logit and the standard deviation of
    the largest logits (numbers, or arrays of them)."""
    return least_high - _shift(FLOOR_WIDENING) * sd_highs - np.log(2.0 * SOFTMAX_STEPS * classes)


def logit_range(lo, hi, lows, highs, classes, widening) -> tuple[float, float]:
    """The range of the logits of a softmax over ``classes`` (one vector per input; ``lo``,
    ``hi``: their min/max, ``lows``/``highs``: their min and max on each input): up to the
    extremes ``widening`` times as many inputs would reach (:func:`widened`), and down to
    :func:`widened`'s lower end but no lower than :func:`softmax_floor` (what lies below it
    the softmax's output cannot show: a range that reaches there spends its steps on
    nothing)."""
    highs = np.asarray(highs, np.float64)
    low, high = _logit_bounds(lo, hi, np.std(lows), np.std(highs), highs.min(), classes,
                              widening)
    return float(low), float(high)


def _logit_bounds(lo, hi, sd_lows, sd_highs, least_high, classes, widening):
    """:func:`logit_range`'s ends from the statistics it reads (numbers, or arrays of them:
    one range per entry, as :func:`_left_out` takes them)."""
    low = _out(lo, sd_lows, WIDEN_INPUTS, -1.0)
    low = np.minimum(np.maximum(low, _floor(least_high, sd_highs, classes)), 0.0)
    return low, _out(hi, sd_highs, widening, 1.0)


def logit_widening(logits, synthetic=False) -> float:
    """The widening of :data:`LOGIT_WIDENINGS` whose :func:`logit_range` adds the least noise
    to a softmax's output on inputs it was not set from (``logits``: ``(N, classes)``, the
    calibration inputs'): the rounding of the logits on the range's 8-bit grid (a step² / 12
    per logit, through the softmax's Jacobian diag(p) − ppᵀ, whose squared norm is averaged
    over the inputs) plus the clipping each input meets in the range the others set (leave
    one out: how often, and how far, a new input passes a range of that many). A wider range
    costs every input a little; a narrower one costs the few inputs beyond it much (a
    100-class classifier's new inputs, whose largest logits passed every calibration input's,
    read a tie of the classes clipped). The left-out inputs, not the Gumbel law of
    :func:`softmax_clipping`: the law charged confident small classifiers for clipping new
    inputs hardly met (hunt6 re-run: a digits classifier's build, its logits reaching the
    extremes of 30 times as many inputs, lost its lead to the plain conversion, which then
    read several decibels lower on new inputs). But ``synthetic`` inputs (without data)
    reach less far than real ones, and their left-out ones would miss what real inputs pass:
    there the law stands in for them (hunt6 without data: a ``Rescaling(1/127.5, -1)``
    classifier came to the plain conversion with real data with the law, far below it
    without: CHANGELOG)."""
    z = np.asarray(logits, np.float64)
    n, classes = z.shape
    p = _softmax(z)
    squares = (p ** 2).sum(axis=1)
    jacobian = float(np.mean(squares - 2.0 * (p ** 3).sum(axis=1) + squares ** 2))
    lows, highs = z.min(axis=1), z.max(axis=1)
    best = None
    for widening in LOGIT_WIDENINGS:
        low, high = logit_range(min(lows.min(), 0.0), max(highs.max(), 0.0), lows, highs,
                                classes, widening)
        clipped = (_clipped(p, lows, highs, low, high) if synthetic else
                   _left_out(z, p, widening))
        noise = ((high - low) / 255.0) ** 2 / 12.0 * jacobian + clipped
        if best is None or noise < best[0]:
            best = (noise, widening)
    return best[1]


def _left_out(z, p, widening) -> float:
    """The mean squared change of each input's softmax once its logits ``z`` are clipped into
    the :func:`logit_range` the other inputs set (0 with fewer than two). Every input's range
    at once (:func:`_logit_bounds` on arrays): the others' extremes and standard deviations
    (as ``np.std``) from the whole set's, less the input's own share, so the cost grows with
    the inputs, not their square."""
    n, classes = z.shape
    if n < 2:
        return 0.0
    lows, highs = z.min(axis=1), z.max(axis=1)
    low, high = _logit_bounds(
        np.minimum(_without(lows, np.min), 0.0), np.maximum(_without(highs, np.max), 0.0),
        _std_without(lows), _std_without(highs), _without(highs, np.min), classes, widening)
    clipped = (lows < low) | (highs > high)
    if not clipped.any():
        return 0.0
    moved = _softmax(np.clip(z[clipped], low[clipped, None], high[clipped, None]))
    return float(np.sum((p[clipped] - moved) ** 2)) / n


def _without(values, extreme):
    """Per entry, ``extreme`` (np.min or np.max) of ``values`` with that entry left out."""
    order = np.argsort(values) if extreme is np.min else np.argsort(-values)
    out = np.full(len(values), values[order[0]])
    out[order[0]] = values[order[1]]
    return out


def _std_without(values):
    """Per entry, the standard deviation (ddof 0) of ``values`` with that entry left out."""
    n = len(values)
    d = values - values.mean()
    return np.sqrt(np.maximum((np.sum(d ** 2) - d ** 2 * n / (n - 1)) / (n - 1), 0.0))


def _excess(bound, extremes) -> float:
    """E[(Y - bound)²; Y > bound] for Y of the Gumbel law fitted to ``extremes``."""
    location, scale = _gumbel(extremes)
    if scale <= 0:
        return 0.0
    start = (bound - location) / scale
    t = np.linspace(start, max(start, 0.0) + 50.0, 4001)
    survival = -np.expm1(-np.exp(-t))
    f = (t - start) * survival
    return float(2.0 * scale ** 2 * np.sum((f[1:] + f[:-1]) / 2 * np.diff(t)))


def clipping_noise(lo, hi, lows, highs) -> float:
    """The expected squared excess of a new input's extremes beyond the range ``[lo, hi]``:
    the noise a tensor's clipping adds per input, by the Gumbel laws :func:`widened` fits to
    the per-input minima ``lows`` and maxima ``highs`` (its largest entry beyond ``hi`` and its
    smallest below ``lo``). An 8-bit range holds 0 (TF Lite's converter makes it so): a side at
    0 clips nothing (a ReLU's, or a positive output's lower side)."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    noise = _excess(hi, np.asarray(highs, np.float64)) if hi > 0 else 0.0
    if lo < 0:
        noise += _excess(-lo, -np.asarray(lows, np.float64))
    return noise


def expected_clipping(outputs, kind: str) -> float:
    """:func:`clipping_noise` per input of an output tensor whose range was calibrated as
    ``kind`` (:data:`KINDS`; an output keeps its min/max unless widened) on ``outputs``
    (``(N, ...)``, the float model's): what its SQNR on new inputs loses, in expectation, to
    the few that leave the range (on a regression head they rule it, and a few dozen
    calibration inputs seldom hold one)."""
    flat = np.asarray(outputs, np.float64).reshape(len(outputs), -1)
    lows, highs = flat.min(axis=1), flat.max(axis=1)
    lo, hi = float(lows.min()), float(highs.max())
    if kind == "widened":
        lo, hi = widened(lo, hi, lows, highs)
    return clipping_noise(lo, hi, lows, highs)


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_clipping(probabilities, lows, highs, kind: str, widening=None) -> float:
    """The noise energy per new input that the clipping of its logits is expected to add to a
    softmax output (``probabilities``: ``(N, classes)``, the float model's on the calibration
    inputs; ``lows``/``highs``: the logits' min and max on each of them), the logits' range
    calibrated as ``kind`` (:data:`KINDS`; the logits keep their min/max unless widened: by
    :func:`logit_range` with ``widening`` where the build chose one, else :func:`widened`).

    A new input whose largest logit passes the range has it cut to the range's end, and its
    probabilities move (on a small classifier of signals a few such inputs ruled the error of
    new inputs, for the plain conversion as for cle's build). The largest logit of a new input
    follows the Gumbel law :func:`widened` fits to ``highs``; beyond the range, the input is
    taken to be one of the :data:`LOGIT_TAIL` calibration inputs with the largest logits, its
    logits (recovered from its probabilities and its largest logit) spread about their mean
    until the largest reaches the drawn value, as a more confident input of that kind would
    be: the expected squared change of its probabilities once every logit is clipped into the
    range. 0 for an output that is not ``(N, classes)``. The law is fitted to the calibration
    inputs' extremes, and where their tail is lighter than a Gumbel's this is conservative."""
    p = np.asarray(probabilities, np.float64)
    lows, highs = np.asarray(lows, np.float64), np.asarray(highs, np.float64)
    if p.ndim != 2 or p.shape[1] < 2 or len(highs) != len(p) or len(p) < 2:
        return 0.0
    lo, hi = min(float(lows.min()), 0.0), max(float(highs.max()), 0.0)
    if kind == "widened":
        lo, hi = (logit_range(lo, hi, lows, highs, p.shape[1], widening) if widening else
                  widened(lo, hi, lows, highs))
    return _clipped(p, lows, highs, lo, hi)


def _clipped(p, lows, highs, lo, hi) -> float:
    """:func:`softmax_clipping` for the logits' range ``[lo, hi]``."""
    location, scale = _gumbel(highs)
    if not scale > 0:
        return 0.0
    below = float(np.exp(-np.exp(-(hi - location) / scale)))  # the law's CDF at hi
    if below >= 1.0:
        return 0.0
    u = below + (1.0 - below) * (np.arange(TAIL_POINTS) + 0.5) / TAIL_POINTS
    drawn = location - scale * np.log(-np.log(u))  # largest logits beyond hi
    z = np.log(np.maximum(p, np.finfo(np.float32).tiny))
    z = z - z.max(axis=1, keepdims=True) + highs[:, None]
    k = min(LOGIT_INPUTS, max(1, int(round(LOGIT_TAIL * len(p)))))
    noise = 0.0
    for j in np.argsort(highs)[::-1][:k]:
        centre = float(z[j].mean())
        spread = max(float(highs[j]) - centre, 1e-6)
        logits = centre + (z[j][None, :] - centre) * ((drawn[:, None] - centre) / spread)
        change = _softmax(logits) - _softmax(np.clip(logits, lo, hi))
        noise += float(np.mean(np.sum(change ** 2, axis=1)))
    return (1.0 - below) * noise / k
