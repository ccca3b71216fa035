"""The check of a quantized model against the float model, output by output.

Every output gets its SQNR against the float model's; an output of class scores also gets its
top-1 agreement (the share of samples, or of pixels, whose highest score is the float
model's). An output counts as class scores when it ends in a softmax (over its last axis) or
a sigmoid (any rank, two classes or more), in a log_softmax (two classes or more: checked as
logits, its log-probabilities as they are), when the caller declares it so
(``output_kinds={name: "classes"}``, ``--output-kind NAME=classes``), or when the model was
compiled with a cross-entropy over its classes from logits (:mod:`cle._measure.losses`);
anything else (a regression value, box or landmark coordinates, an image, and a linear vector
nobody declared) gets its SQNR only, since the position of its largest entry may mean
nothing. A linear vector of at least :data:`MIN_CLASSES` entries may well be logits: the
report says how to declare it (:func:`undeclared_scores`).

The figures come with what makes them rough: fewer than :data:`MIN_RELIABLE` inputs, or the
two halves of the inputs disagreeing by more than :data:`DISAGREE_DB` in SQNR. Non-finite
outputs are an error, never a figure. A top-1 agreement measured on inputs none of whose
decisions is close (:func:`cle._measure.ties.close_calls`) can hardly fall below 100 %
whatever the error, and the report says so (:func:`cle._measure.ties.idle_top1`).
"""

from __future__ import annotations

import dataclasses
import math

import keras
import numpy as np

from cle._core import keras_internals as internals
from cle._core.graph import call_inputs
from cle._core.outputs import output_names
from cle._math.json_numbers import EXACT, ZERO_FLOAT, sqnr_label, sqnr_span
from cle._math.json_numbers import json_number  # noqa: F401 (here before)
from cle._measure import losses as _losses
from cle._measure.ties import (CLOSE_LEAD, agreement, close_calls,  # noqa: F401 (here before)
                               idle_top1)
from cle._measure import tails as _tails
from cle._measure.input_range import SPREAD, spread_inputs

__all__ = ["EXACT", "MIN_CLASSES", "OutputCheck", "ZERO_FLOAT", "check_outputs", "close_calls",
           "compare_verdict", "compiled_kinds", "declared_kinds", "ends_in", "sqnr_gain",
           "sqnr_interval", "estimate_caveat", "guessed_scores", "idle_top1", "json_number",
           "energies", "output_kinds", "output_names", "held_out_caveats", "poor_outputs",
           "rough_figures",
           "spread_inputs", "sqnr_with_clipping", "undeclared_scores"]

#: A linear vector output with at least this many entries may be class logits: the report
#: says how to declare it, and the distillation without data steers it as such.
MIN_CLASSES = 10
#: Activations whose output, over two classes or more, is class scores.
SCORE_ACTIVATIONS = ("softmax", "sigmoid")
#: Activations whose output, over two classes or more, is the logarithm of class scores (a
#: log_softmax's log-probabilities): class scores, checked as logits are.
LOG_SCORE_ACTIVATIONS = ("log_softmax",)
#: Fewer check inputs than this give rough figures (said in the report).
MIN_RELIABLE = 16
#: The two halves of the check inputs disagreeing by more SQNR than this: rough figures.
DISAGREE_DB = 3.0
#: Without data: how much lower than the synthetic check's SQNR real inputs have read, at most:
#: a bound above the largest gap measured, on the models benchmarks/bench_quantize_nodata.py
#: measures, on real ImageNet networks that are not in this repository, per-channel and
#: per-tensor, and on the zoo of benchmarks/bench_zoo.py (detection heads, regression,
#: grayscale and other models unlike ImageNet classifiers; docs/results.md), and on the
#: models of the hunts for failures on kinds of model the zoo lacks (a pre-activation ResNet
#: trained briefly, a small DenseNet; hunt6's small classifier with a batch norm on its raw
#: 0..255 input, whose layers after its last batch norm real inputs drive harder than the
#: synthetic ones: CHANGELOG). Said on every run without data.
SYNTHETIC_OVERSHOOT_DB = 17.0
#: The coverage of the SQNR intervals (a bootstrap over the check's inputs).
INTERVAL = 0.9
#: Bootstrap resamples of an interval.
BOOTSTRAP = 2000
#: Fewer inputs than this get no interval.
MIN_INTERVAL = 4
#: An interval narrower than this (dB): every check input read the same figure (said).
FLAT_DB = 0.05
#: An output (or one entry of a value vector) whose SQNR is under this follows the float model
#: too little for its figure to be read as a small error (class scores: and their top-1
#: agreement under POOR_TOP1, so a well-separated classifier's scores pass): the report says so.
POOR_DB, POOR_TOP1 = 10.0, 0.9
#: Value vectors of at most this many entries are also checked entry by entry.
MAX_ENTRIES = 64


def _activation_name(layer):
    fn = getattr(layer, "activation", None)
    return getattr(fn, "__name__", "") if fn is not None else ""


def _maker(out):
    """``(layer, its output)`` that makes ``out`` (in a nested model: its own output's)."""
    producer = internals.producer_of(out)
    while isinstance(producer, keras.Model) and getattr(producer, "outputs", None):
        out = producer.outputs[internals.output_position(out)]  # a nested model's own output
        producer = internals.producer_of(out)
    return producer, out


def ends_in(out) -> str:
    """The activation that makes the output tensor ``out`` ("" for none): a softmax over
    another axis than the last (the classes of a per-position output stand elsewhere) is
    "softmax, not last axis", which top-1 agreement, read along the last axis, cannot use.
    An output a nested model makes ends as that model's output does, one a layer that passes
    its input through at inference makes (:data:`PASS_THROUGH`) as its input does, so does a
    ``Reshape`` of a sigmoid, or of a softmax that keeps its last axis, and an
    ``Average`` of outputs that all end in the same softmax or sigmoid ends in it too."""
    producer, out = _maker(out)
    inputs = call_inputs(out)
    if len(inputs) == 1 and _passes(producer):
        return ends_in(inputs[0])
    if len(inputs) == 1 and isinstance(producer, keras.layers.Reshape):
        ending = ends_in(inputs[0])  # a map's softmax per position, reshaped back to the map
        if ending == "sigmoid" or (_classes(inputs[0]) == _classes(out) and ending in (
                "softmax",) + LOG_SCORE_ACTIVATIONS):
            return ending
    if isinstance(producer, keras.layers.Average):  # an ensemble's mean of its members' scores
        endings = {ends_in(t) for t in inputs}
        if len(endings) == 1 and endings <= set(SCORE_ACTIVATIONS):
            return endings.pop()
    if isinstance(producer, keras.layers.Softmax):
        axes = [producer.axis] if isinstance(producer.axis, int) else list(producer.axis)
        rank = len(tuple(out.shape))
        return "softmax" if [a % rank for a in axes] == [rank - 1] else "softmax, not last axis"
    return _activation_name(producer)


#: Layers that pass their input through unchanged at inference (and ``Activation("linear")``:
#: the float32 cast after a softmax that Keras' mixed-precision guide shows).
PASS_THROUGH = (keras.layers.Identity, keras.layers.Dropout, keras.layers.GaussianNoise,
                keras.layers.GaussianDropout, keras.layers.AlphaDropout,
                keras.layers.ActivityRegularization)


def _passes(layer) -> bool:
    return isinstance(layer, PASS_THROUGH) or (isinstance(layer, keras.layers.Activation)
                                               and _activation_name(layer) == "linear")


def _classes(out) -> int:
    shape = tuple(out.shape)
    return shape[-1] if shape and shape[-1] is not None else 0


def _output_index(model, name) -> int | None:
    """The index of the output ``name`` names (the layer that makes it, or the model's output
    name), None when none."""
    names, keras_names = output_names(model), list(getattr(model, "output_names", []) or [])
    hits = [k for k, n in enumerate(names) if n == name] or [
        k for k, n in enumerate(keras_names) if n == name]
    return hits[0] if hits else None


def compiled_kinds(model, loss=None) -> dict[int, str]:
    """``{output index: "classes" | "values"}`` of the outputs whose loss tells what they hold
    (:func:`cle._measure.losses.loss_kinds`): the model's compiled loss, or ``loss`` (read
    from its file, :func:`cle._measure.losses.file_loss`); not class scores for an output
    ending in a softmax or a sigmoid, which tells it already, or of fewer than two entries,
    nor values for a softmax's (a regression loss on a sigmoid: boxes, an image, is values)."""
    if not getattr(model, "outputs", None):  # a subclassed model: refused at its graph
        return {}
    told = _losses.loss_kinds(model, lambda name: _output_index(model, name), loss)
    return {k: kind for k, kind in told.items() if _told(model.outputs[k], kind)}


def _told(out, kind) -> bool:
    ending = ends_in(out)
    if kind == "values":
        return ending not in ("softmax",) + LOG_SCORE_ACTIVATIONS
    return _classes(out) >= 2 and ending not in SCORE_ACTIVATIONS


def declared_kinds(model, declared) -> dict[int, str]:
    """``{output index: "classes" | "values"}`` of the outputs ``declared`` names (by the
    name of the layer that makes the output, or by the model's output name) and of those the
    model's compiled loss tells (:func:`compiled_kinds`; ``declared`` first).

    Raises:
        ValueError: a name that is no output of ``model``, or "classes" for an output with
            fewer than two entries.
    """
    out = compiled_kinds(model)
    for name, kind in (declared or {}).items():
        k = _output_index(model, name)
        if k is None:
            raise ValueError(f"output_kinds names an output model '{model.name}' does not have. "
                             f"Received: {name!r}; its outputs: {output_names(model)}")
        if kind == "classes" and _classes(model.outputs[k]) < 2:
            raise ValueError(f"output '{name}' has {_classes(model.outputs[k])} entries per "
                             "sample: class scores need two or more. Received: "
                             f"output_kinds[{name!r}]='classes'")
        out[k] = kind
    return out


def output_kinds(model, declared=None) -> list[str]:
    """``"probabilities"``, ``"logits"`` or ``"values"`` for each output of ``model``: an
    output ending in a softmax or a sigmoid over two entries or more is probabilities, an
    output ``declared`` (``{name: "classes" | "values"}``), or whose compiled loss tells
    (:func:`declared_kinds`), is what it says (class scores without such an ending are
    logits), one ending in a log_softmax over two entries or more is logits
    (:data:`LOG_SCORE_ACTIVATIONS`), anything else is values."""
    given = declared_kinds(model, declared)
    kinds = []
    for k, out in enumerate(model.outputs):
        ending = ends_in(out)
        if given.get(k) == "values":
            kinds.append("values")
        elif _classes(out) >= 2 and ending in SCORE_ACTIVATIONS:
            kinds.append("probabilities")
        elif given.get(k) == "classes" or (_classes(out) >= 2
                                           and ending in LOG_SCORE_ACTIVATIONS):
            kinds.append("logits")
        else:
            kinds.append("values")
    return kinds


#: Layers whose output vector is no logits: a normalized embedding, or a function nothing
#: here reads (hunt8's unit-length embeddings were pushed as logits without data).
NOT_LOGITS = (keras.layers.UnitNormalization, keras.layers.LayerNormalization,
              keras.layers.GroupNormalization, keras.layers.Lambda)


def _linear_vector(out) -> bool:
    return (len(tuple(out.shape)) == 2 and _classes(out) >= MIN_CLASSES and ends_in(out)
            in ("", "linear") and not isinstance(_maker(out)[0], NOT_LOGITS))


def undeclared_scores(model, declared=None) -> list[str]:
    """The names of the outputs that may be class logits (a linear vector of at least
    :data:`MIN_CLASSES` entries) and that ``declared`` does not name: checked as values."""
    given = declared_kinds(model, declared)
    return [name for k, (out, name) in enumerate(zip(model.outputs, output_names(model)))
            if k not in given and _linear_vector(out)]


def guessed_scores(model, declared=None) -> list[str]:
    """Per output, what the distillation without data pushes inputs towards:
    ``"probabilities"`` (a softmax, any rank, two classes or more), ``"logits"`` (a linear
    vector of at least :data:`MIN_CLASSES` entries, or of two or more that ``declared`` or the
    compiled loss calls class scores, or that ends in a log_softmax) or ``"values"``
    (nothing; so for any output declared or compiled as values, which is then checked as
    values and, without data, may be refused)."""
    given = declared_kinds(model, declared)
    guess = []
    for k, out in enumerate(model.outputs):
        if given.get(k) == "values":
            guess.append("values")
        elif _classes(out) >= 2 and ends_in(out) == "softmax":
            guess.append("probabilities")
        elif _linear_vector(out) or (len(tuple(out.shape)) == 2 and _classes(out) >= 2 and (
                ends_in(out) in LOG_SCORE_ACTIVATIONS
                or (given.get(k) == "classes" and ends_in(out) in ("", "linear")))):
            guess.append("logits")
        else:
            guess.append("values")
    return guess


@dataclasses.dataclass
class OutputCheck:
    """The check's figures for one output.

    Attributes:
        name: the output (the layer that makes it).
        kind: "probabilities", "logits" (class scores) or "values".
        sqnr_db: SQNR of the quantized output against the float one, in dB.
        top1_agreement: for class scores, the share of samples (or pixels) whose top class is
            the float model's; for independent labels (``labels``), the share of decisions
            (samples, or pixels) whose every label is on the float model's side of 0.5 (the
            same label set); NaN for other outputs.
        sqnr_interval: ``(low, high)``, the :data:`INTERVAL` bootstrap interval of the SQNR
            over the inputs (:func:`sqnr_interval`); None with fewer than
            :data:`MIN_INTERVAL` inputs.
        tail: the heavy tail of the per-input errors (:func:`cle._measure.tails.heavy_tail`)
            its lower end reaches down for; None where none is fitted.
        labels: probabilities that are independent labels (sigmoids: a multi-label output,
            :func:`cle._measure.ties.independent_labels`), whose agreement is per label, not
            of a top class.
    """

    name: str
    kind: str
    sqnr_db: float
    top1_agreement: float = math.nan
    sqnr_interval: tuple | None = None
    tail: _tails.Tail | None = None
    labels: bool = False

    @property
    def class_scores(self) -> bool:
        return self.kind != "values"

    def text(self) -> str:
        top1 = (f"{self.agreement} agreement {self.top1_agreement:.1%}, "
                if self.class_scores else "")
        bound = self.sqnr_interval is not None and math.isfinite(self.sqnr_db)
        interval = f" ({INTERVAL:.0%} interval {sqnr_span(*self.sqnr_interval)})" if bound else ""
        return f"{top1}{sqnr_label(self.sqnr_db)}{interval}"

    @property
    def agreement(self) -> str | None:
        """What ``top1_agreement`` counts: ``"top-1"``, ``"label-set"`` or None (values)."""
        return None if not self.class_scores else "label-set" if self.labels else "top-1"

    def to_dict(self) -> dict:
        return {"output": self.name, "kind": self.kind, "sqnr_db": self.sqnr_db,
                "sqnr_interval_db": None if self.sqnr_interval is None else
                [float(v) for v in self.sqnr_interval],
                "top1_agreement": None if not self.class_scores else self.top1_agreement,
                "agreement": self.agreement}


def _sqnr(ref, y):
    noise = float(np.sum((ref - y) ** 2))
    if noise == 0.0:
        return math.inf
    signal = float(np.sum(ref ** 2))
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def _finite(arrays, what):
    for k, a in enumerate(arrays):
        bad = ~np.isfinite(a)
        if bad.any():
            raise RuntimeError(
                f"{what} are not finite ({int(bad.sum())} NaN or infinite values in output "
                f"{k}): the check cannot give a figure")


def energies(ref, y):
    """Per input, the signal and the noise energy (sums over everything but the batch)."""
    ref = np.asarray(ref, np.float64).reshape(len(ref), -1)
    y = np.asarray(y, np.float64).reshape(ref.shape)
    return np.sum(ref ** 2, axis=1), np.sum((ref - y) ** 2, axis=1)


def _resamples(n, seed=0):
    return np.random.default_rng(seed).integers(0, n, size=(BOOTSTRAP, n))


def _db(signal, noise):
    with np.errstate(divide="ignore", invalid="ignore"):
        return 10.0 * np.log10(signal / noise)


def _apart(noise, noise_other):
    """The SQNR gain (dB) of a noise energy over another on the same signal, which cancels:
    10 log10(noise_other / noise); 0 where both are 0 (an output both reproduce exactly,
    whatever its signal: inf - inf, and 0/0 on an all-zero output, made every gain NaN and
    froze the choice), +-inf where one is."""
    noise, noise_other = np.asarray(noise, np.float64), np.asarray(noise_other, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((noise == 0) & (noise_other == 0), 0.0,
                        10.0 * np.log10(noise_other / noise))


def _bounds(values):
    finite = values[~np.isnan(values)]
    if not finite.size:
        return None
    tail = (1.0 - INTERVAL) / 2 * 100
    with np.errstate(invalid="ignore"):  # an exact output: infinite SQNRs, no warning
        lo, hi = np.percentile(finite, [tail, 100 - tail])
        if np.isnan(lo) or np.isnan(hi):  # between two infinities: the nearer one
            lo, hi = np.percentile(finite, [tail, 100 - tail], method="nearest")
    return float(lo), float(hi)


def sqnr_interval(ref, y, seed=0) -> tuple | None:
    """The :data:`INTERVAL` interval of the SQNR of ``y`` against ``ref`` over their inputs
    (``(N, ...)`` arrays), by a bootstrap over the inputs: how much the figure would move on
    another draw of as many inputs of the same kind. None with fewer than
    :data:`MIN_INTERVAL` inputs."""
    if len(ref) < MIN_INTERVAL:
        return None
    signal, noise = energies(ref, y)
    idx = _resamples(len(ref), seed)
    return _bounds(_db(signal[idx].sum(axis=1), noise[idx].sum(axis=1)))


def sqnr_with_clipping(ref, y, clipping=0.0) -> float:
    """The SQNR (dB) of ``y`` against ``ref`` (``(N, ...)`` arrays) with ``clipping``, a noise
    energy per input, added to the noise."""
    if not clipping:
        return _sqnr(ref, y)
    signal, noise = energies(ref, y)
    return float(_db(signal.sum(), noise.sum() + clipping * len(noise)))


def sqnr_gain(references, ys, others, seed=0, clipping=None,
              clipping_other=None) -> tuple[float, tuple | None, float]:
    """``(gain, interval, support)``: how much closer ``ys`` are to ``references`` than
    ``others`` (one array ``(N, ...)`` per output, the same ``N`` inputs), as the mean over
    the outputs of the SQNR difference in dB (0 on an output both reproduce exactly); its
    :data:`INTERVAL` interval by a paired
    bootstrap over the inputs (None with fewer than :data:`MIN_INTERVAL` inputs); and the
    share of the bootstrap's resamples in which the gain is above 0 (NaN without them).
    ``clipping``/``clipping_other``: per output, a noise energy per input added to every
    input's noise of ``ys``/``others`` (the expected clipping of inputs beyond the calibrated
    ranges, :func:`cle._quantize.ranges.expected_clipping`); none by default."""
    clip = clipping or [0.0] * len(references)
    clip_other = clipping_other or [0.0] * len(references)
    noises = []
    for r, a, b, ca, cb in zip(references, ys, others, clip, clip_other):
        _, noise = energies(r, a)
        _, noise_other = energies(r, b)
        noises.append((noise + ca, noise_other + cb))
    point = float(np.mean([_apart(a.sum(), b.sum()) for a, b in noises]))
    n = len(references[0])
    if n < MIN_INTERVAL:
        return point, None, math.nan
    idx = _resamples(n, seed)
    gains = np.mean([_apart(a[idx].sum(axis=1), b[idx].sum(axis=1)) for a, b in noises], axis=0)
    return point, _bounds(gains), float(np.mean(gains > 0))


def compare_verdict(ref, y, y_other, seed=0, clipping=(0.0, 0.0)) -> tuple[str, tuple | None]:
    """``(verdict, interval)``: whether ``y`` is closer to ``ref`` than ``y_other`` in SQNR,
    by a paired bootstrap over the inputs (:func:`sqnr_gain`, ``clipping``: the expected
    clipping per input of ``y`` and of ``y_other``): "better" when the :data:`INTERVAL`
    interval of the difference (dB) lies above 0, "worse" below 0, else
    "not distinguishable"."""
    if len(ref) < MIN_INTERVAL:
        return "not distinguishable (too few inputs)", None
    _, bounds, _ = sqnr_gain([ref], [y], [y_other], seed, clipping=[clipping[0]],
                             clipping_other=[clipping[1]])
    if bounds is None:
        return "not distinguishable", None
    verdict = ("better" if bounds[0] > 0 else "worse" if bounds[1] < 0 else
               "not distinguishable")
    return verdict, bounds


def check_outputs(reference, test, names, kinds, clipping=None, ties=None) -> list[OutputCheck]:
    """One :class:`OutputCheck` per output. Its interval (:func:`sqnr_interval`) reaches down
    to the figure new inputs may read where a few inputs hold most of the noise
    (:func:`cle._measure.tails.heavy_tail`), and to the figures with ``clipping`` and ``ties``
    added.

    Args:
        reference, test: lists of arrays ``(N, ...)``, one per output: the float model's and
            the quantized model's outputs on the same inputs.
        names, kinds: of each output (:func:`output_names`, :func:`output_kinds`).
        clipping: per output, the noise energy per input that new inputs beyond the
            calibrated ranges are expected to add (:func:`cle._quantize.ranges.expected_clipping`),
            or None: the interval's lower end reaches down to the SQNR with it (the inputs at
            hand seldom hold one that leaves the ranges; new inputs will).
        ties: per output, a noise energy the inputs at hand cannot show (decisions near a tie
            between two classes, :func:`cle._measure.ties.tie_floor`), or None: the
            interval's lower end reaches down to the SQNR with it added.

    Raises:
        RuntimeError: an output is not finite.
    """
    _finite(reference, "the float model's outputs")
    _finite(test, "the quantized model's outputs")
    out = []
    for k, (ref, y, name, kind) in enumerate(zip(reference, test, names, kinds)):
        ref, y = np.asarray(ref, np.float64), np.asarray(y, np.float64)
        top1, labels = agreement(ref, y, kind)
        interval = sqnr_interval(ref, y)
        unseen = (clipping[k] * len(ref) if clipping else 0.0) + (ties[k] if ties else 0.0)
        tail = None
        if interval is not None:  # noise the inputs at hand cannot show
            signal, noise = energies(ref, y)
            tail = _tails.heavy_tail(signal, noise, _tails.noise_cap(ref, kind))
            lows = [interval[0], None if tail is None else tail.floor]
            if unseen:
                with np.errstate(divide="ignore"):
                    lows.append(float(_db(signal.sum(), noise.sum() + unseen)))
            interval = (min((v for v in lows if v is not None and not math.isnan(v)),
                            default=math.nan), interval[1])
        out.append(OutputCheck(name, kind, _sqnr(ref, y), top1, interval, tail, labels))
    return out


def estimate_caveat() -> str:
    """What every check without real data says of its own figures."""
    return (f"no real data was seen: the check's figures are an estimate from synthetic inputs; "
            f"on real inputs they have read up to {SYNTHETIC_OVERSHOOT_DB:g} dB lower in SQNR "
            "(and lower in top-1 agreement) on the models measured for the documentation and "
            "its hunts for failures; "
            "check on your own inputs, or give calibration data")


def rough_figures(reference, test, names, n) -> list[str]:
    """Why the check's figures are rough (each a sentence), or nothing."""
    why = []
    if n < MIN_RELIABLE:
        why.append(f"the check ran on {n} inputs only (fewer than {MIN_RELIABLE}): its "
                   "figures are rough")
        if n < 4:
            return why
    half = n // 2
    for ref, y, name in zip(reference, test, names):
        a = _sqnr(np.asarray(ref[:half], np.float64), np.asarray(y[:half], np.float64))
        b = _sqnr(np.asarray(ref[half:], np.float64), np.asarray(y[half:], np.float64))
        if math.isfinite(a) and math.isfinite(b) and abs(a - b) > DISAGREE_DB:
            why.append(f"output '{name}': the two halves of the check inputs disagree "
                       f"({a:.1f} dB against {b:.1f} dB): its figures are rough")
    return why


def _entries_apart(spans, few) -> float:
    """How many times wider the widest span is than the widest of ``few`` (inf: those are
    constant, and their loss is not the spread's)."""
    narrow = float(np.max(spans[few]))
    return math.inf if narrow == 0 else float(np.max(spans)) / narrow


def poor_outputs(reference, test, names, kinds) -> list[str]:
    """A sentence for each output the file follows poorly (SQNR under :data:`POOR_DB`; class
    scores: and top-1 agreement under :data:`POOR_TOP1`), and for each value vector of 2 to
    :data:`MAX_ENTRIES` entries whose figure hides entries under it, with the cause when their
    values span far less than the widest entry's (:data:`SPREAD`): one 8-bit range holds the
    whole output."""
    out = []
    for ref, y, name, kind in zip(reference, test, names, kinds):
        ref, y = np.asarray(ref, np.float64), np.asarray(y, np.float64)
        whole, scores = _sqnr(ref, y), kind != "values" and ref.shape[-1] > 1
        agree = np.mean(ref.argmax(-1) == y.argmax(-1)) if scores else 0.0
        if math.isfinite(whole) and whole < POOR_DB and agree < POOR_TOP1:
            top1 = f", top-1 agreement {100 * agree:.0f} %" if scores else ""
            out.append(f"output '{name}': the file follows it poorly ({whole:.1f} dB SQNR{top1} "
                       "against the float model): check it on your own inputs before use "
                       "('cle analyze' shows which layers lose it)")
        if kind != "values" or ref.ndim != 2 or not 1 < ref.shape[1] <= MAX_ENTRIES:
            continue
        dbs = [_sqnr(ref[:, j], y[:, j]) for j in range(ref.shape[1])]
        poor = [j for j, db in enumerate(dbs) if math.isfinite(db) and db < POOR_DB]
        if not poor or len(poor) == len(dbs):
            continue
        text = (f"output '{name}': {len(poor)} of its {len(dbs)} entries follow the float "
                "model poorly (" + ", ".join(f"entry {j}: {dbs[j]:.1f} dB" for j in poor[:4])
                + ("" if len(poor) <= 4 else ", ...") + f", counting from 0) though the "
                f"output reads {whole:.1f} dB")
        apart = _entries_apart(np.ptp(ref, axis=0), poor)
        if math.isfinite(apart) and apart > SPREAD:
            text += (f": their values span 1/{apart:.3g} of the widest entry's, and one 8-bit "
                     "range for the whole output leaves them a few steps or none; give the "
                     "entries similar ranges in the model (e.g. standardized targets, undone "
                     "after the .tflite)")
        out.append(text)
    return out


def held_out_caveats(checked, names, kinds, x) -> list[str]:
    """With data, what makes the figures of the one check set ``checked`` (its
    ``reference``, ``test`` and ``n``) rough or hides a poor part of them, and the vector
    inputs of the calibration data ``x`` whose features lie far apart: :func:`rough_figures`,
    :func:`poor_outputs`, the ties of :mod:`cle._measure.ties`, the heavy tails of
    :mod:`cle._measure.tails`, :func:`spread_inputs`."""
    ref, test = checked["reference"], checked["test"]
    return (rough_figures(ref, test, names, checked["n"]) + poor_outputs(ref, test, names, kinds)
            + _tie_caveats(checked, names) + _tails.tail_caveats(checked, names)
            + _flat_caveats(checked, names) + spread_inputs(x))


def _flat_caveats(checked, names) -> list[str]:
    """A sentence per output whose interval has no width: every check input read the same
    figure (outputs saturated at their range's ends, each quantized to within the same
    fraction of a step), so the inputs say nothing of one that quantizes less cleanly (on a
    softmax whose every calibration output was one-hot, the claim read the 8-bit ceiling, and
    one held-out input in hundreds held most of the real error)."""
    out = []
    for name, o in zip(names, checked.get("outputs") or []):
        iv = o.sqnr_interval
        if iv is not None and np.isfinite(o.sqnr_db) and abs(iv[1] - iv[0]) < FLAT_DB:
            out.append(f"output '{name}': every check input reads the same figure "
                       f"({o.sqnr_db:.1f} dB), so its interval has no width and says nothing of "
                       "new inputs that quantize less cleanly; check it on more varied inputs")
    return out


def _tie_caveats(checked, names) -> list[str]:
    """A sentence per output whose interval reaches down for ties (:mod:`cle._measure.ties`)."""
    out = []
    for name, tie, o in zip(names, checked.get("ties") or [], checked.get("outputs") or []):
        if tie and o.sqnr_interval is not None and o.sqnr_interval[0] < o.sqnr_db - DISAGREE_DB:
            where = "a tie between two classes" if o.kind != "values" and not o.labels else \
                "0.5 of a sigmoid (a tie of its two decisions)"
            out.append(f"output '{name}': new inputs near {where}, which the check inputs hardly "
                       "hold, can rule its figure; probed on inputs mixed to a tie, the file could "
                       f"read as low as {o.sqnr_interval[0]:.1f} dB (the interval's lower end)")
    return out
