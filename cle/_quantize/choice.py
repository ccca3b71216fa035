"""Never worse than TF Lite's own converter, by measurement: with calibration data, the build
:func:`cle.quantize` made is measured against two others made from the same data, and the
closest to the float model is written.

The candidates, in order of preference:

1. ``cle``: the build as the pipeline made it (equalized, bias-corrected, each activation
   tensor at its tails);
2. ``cle, min/max ranges``: the same equalized and corrected float model with every
   activation range at its min/max over the calibration inputs (what the converter does):
   the tails cut ranges some models need (a range halved in a grayscale classifier lost
   several dB against the plain converter);
3. ``cle, widened ranges``: the same with every range but the inputs' widened past its
   min/max to the extremes :data:`cle._quantize.ranges.WIDEN_INPUTS` times as many inputs
   would reach (:func:`cle._quantize.ranges.as_kind`) — built only for a model with a value
   output, and always cross-fitted: a regression head's SQNR is ruled by the few inputs
   that leave the calibrated ranges, which a held-out quarter seldom holds;
4. ``plain``: the float model straight into TF Lite's converter, calibrated on the same
   inputs — what the user had.

The score of a candidate is its mean SQNR over the model's outputs, in dB. Each is first run
on the held-out quarter of the data; a candidate whose gain there cannot reach
:data:`SWITCH_DB` (the upper end of its interval lies below) is out. The others and cle's
build are then cross-fitted (:mod:`cle._quantize.crossfit`): every calibration input checked
by a build of that kind not calibrated on it. Another candidate replaces cle's build only when
it is closer on all of them by more than :data:`SWITCH_DB` *and* the inputs back it: in at
least :data:`SUPPORT` of the resamples of a paired bootstrap over the inputs
(:func:`cle._measure.check.sqnr_gain`) it is closer. The bar is lower for the plain
conversion than for min/max ranges: the plain conversion written is the float model converted
with all the data, what the user had, so switching to it on weaker evidence can cost cle's gain
but never falls below the converter; min/max ranges on cle's model are neither, and one input
that carries most of the noise must not decide for them. Widened ranges need only most of the
resamples: on a value output the inputs that carry most of the noise are the evidence.

On a value output, the cross-fitted figures cannot see the few new inputs that will leave a
range calibrated on a few dozen: the choice adds to each candidate's noise on that output the
clipping new inputs are expected to add to it, the output's range calibrated as the
candidate calibrates it (:func:`cle._quantize.ranges.expected_clipping`: min/max, or widened),
by the extreme-value law the widened ranges are read from (none on an output whose range TF
Lite fixes, :data:`FIXED_OUTPUTS`). On a regression head of the zoo the plain conversion's
cross-fitted figure was several dB above its figure on new inputs, and widened ranges lost to
it by that blind spot alone (docs/design.md). ``Choice.expected``
holds the figures compared; the check's interval reaches down to the written build's.
On a softmax output the same blind spot is its logits' range (cle's build widens it,
:func:`cle._quantize.ranges.as_kind`, as far as its calibration inputs left out one at a
time say; the converter keeps its min/max): the check's interval (not the choice) reaches
down to the figure with the clipping of the logits new inputs are expected to bring
(:func:`cle._quantize.ranges.softmax_clipping`, :func:`_logit_clipping`). Weighed in the
choice, that law (fitted to a few dozen extremes, and pessimistic where their tail is
light) charged a small classifier's plain conversion for clipping new inputs hardly met, and
cle's build written read below it on new inputs (hunt6's hard-swish classifier, CHANGELOG).

Against the plain conversion the burden of proof is cle's: the promise is never to be worse
than the converter, so cle's build (or its min/max variant) is written only when, cross-fitted
on every input, it is closer to the float model than the plain conversion on *every* output
by more than :data:`PLAIN_MARGIN_DB` (closer by hundredths of a decibel is a tie), and the
inputs back it: closer in at least :data:`PLAIN_SUPPORT` of the resamples of a paired
bootstrap over them. Where it is not, the plain conversion is written, whatever the mean over
the outputs says (it gives up what cle's build gained on the others; the report says which
output decided). A close call is a coin toss between the two on the inputs at hand, and on new
inputs it fell the converter's way more often than not on the zoo of
``benchmarks/bench_zoo.py``; a gain of a few dB on 64 inputs whose errors have a heavy tail
was a loss on the held-out ones (digits_sequential, retrained); the converter's own file
loses nothing on that toss. The plain conversion is cross-fitted unless the held-out inputs
already put it clearly below cle's build (its gain's interval there wholly
:data:`PLAIN_SCREEN_DB` + :data:`PLAIN_MARGIN_DB` below 0 or further: on the ImageNet networks
by several dB), as each of its folds costs the converter's calibration again.

The build written is the chosen kind calibrated on every input (the cross-fitted figures are
those of builds calibrated on three quarters: the file's own are at least as good in
expectation). The choice and every candidate's figures are in the report
(``report.choice``): the choice is made on the inputs the check then measures, so the figure
of the written file can flatter by the luck of the draw among them; the report says so.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from cle._math.json_numbers import sqnr_words
from cle._measure import check as _check
from cle._measure.inference import outputs_once
from cle._measure.ties import tie_floor
from cle._quantize.crossfit import KIND, CrossFit
from cle._quantize.ranges import (WIDEN_INPUTS, as_kind, expected_clipping, softmax_clipping,
                                  tensor_roles)
from cle._tflite import converter as tflite

__all__ = ["CANDIDATES", "FIXED_OUTPUTS", "PLAIN_MARGIN_DB", "PLAIN_SCREEN_DB", "PLAIN_SUPPORT",
           "SUPPORT", "SWITCH_DB", "Choice", "choose", "chooses"]

#: A candidate replaces the pipeline's build when its mean SQNR over the outputs on the
#: held-out inputs is higher by more than this (dB).
SWITCH_DB = 0.3
#: The share of the bootstrap's resamples of the inputs in which a candidate must be closer
#: than cle's build to replace it. Min/max ranges: nearly all (the lower end of a 90 % interval
#: above 0), as one input often carries most of the noise, and a gain it makes is no evidence.
#: Widened ranges (made only for a value output): half, as there the few inputs that leave
#: the calibrated ranges are what the figure measures (docs/design.md).
SUPPORT = {"cle, min/max ranges": 0.95, "cle, widened ranges": 0.5}
#: The plain conversion is written unless, cross-fitted, the build that would be written is
#: closer to the float model than it on every output by more than this (dB): a tie goes to
#: what the user had, and hundredths of a decibel are a tie (on a confident classifier every
#: build gives nearly every input the same quantized softmax: hunt8's attention-pooling
#: classifier read 49.11 against 49.10, backed by every resample, and below the converter on
#: new inputs) ...
PLAIN_MARGIN_DB = 0.1
#: ... and closer on every output in at least this share of the resamples of a paired
#: bootstrap over the inputs: a gain the inputs do not back is a tie.
PLAIN_SUPPORT = 0.95
#: The held-out quarter rules the plain conversion out, uncross-fitted, only where its gain
#: over cle's build has its interval there wholly this far below -PLAIN_MARGIN_DB (dB) or
#: further: sixteen inputs with a heavy tail of errors put it on the wrong side of cle's build
#: by a few dB.
PLAIN_SCREEN_DB = 2.0
#: Output endings whose 8-bit output range TF Lite's int8 kernels fix whatever the calibration
#: (LOGISTIC and SOFTMAX [0, 1), TANH [-1, 1), LOG_SOFTMAX [-16, 0)): new inputs cannot leave
#: it.
FIXED_OUTPUTS = ("sigmoid", "tanh", "softmax", "softmax, not last axis", "log_softmax")
#: The candidates' names, in order of preference.
CANDIDATES = ("cle", "cle, min/max ranges", "cle, widened ranges", "plain")
#: The candidate made only for a model with a value output (:func:`_has_values`), and always
#: cross-fitted.
WIDENED = "cle, widened ranges"
#: What each candidate is, in words.
SAID = {"cle": "cle's build (activation ranges at their tails)",
        "cle, min/max ranges": "cle's equalized model with min/max activation ranges",
        WIDENED: "cle's equalized model with min/max activation ranges widened to the "
                 f"extremes {WIDEN_INPUTS:g} times as many inputs would reach (a classifier's "
                 "softmax logits as in cle's build)",
        "plain": "the float model straight into TF Lite's converter"}


@dataclasses.dataclass
class Choice:
    """Which build was written, and why.

    Attributes:
        written: the name of the build written (one of :data:`CANDIDATES`).
        n: the held-out inputs every candidate was first measured on.
        sqnr_db: ``{candidate: [SQNR of each output]}`` on those inputs.
        n_all: every calibration input, on which the cross-fitted candidates were measured
            (:mod:`cle._quantize.crossfit`).
        crossfit: ``{candidate: [SQNR of each output]}`` cross-fitted on the ``n_all``
            inputs: cle's build, the build written and each candidate the held-out inputs
            could not rule out.
        farther: the outputs on which the build that would have been written (cle's, or its
            min/max variant) was not shown closer than the plain conversion, cross-fitted
            (:func:`_farther_outputs`; the plain conversion is then written, whatever the
            mean says).
        expected: ``{candidate: [SQNR of each output]}``, the cross-fitted figures with the
            clipping new inputs are expected to add on each value output (:func:`_clipping`),
            which the choice compares; empty when the model has no value output.
        float_db: per output, the SQNR of TF Lite's float conversion of the model (the plain
            conversion's flatbuffer before its quantize step) against the Keras model on the
            ``n`` held-out inputs: what no quantized file can pass
            (:func:`cle._quantize.caveats.float_gap`).
    """

    written: str
    n: int
    sqnr_db: dict
    n_all: int = 0
    crossfit: dict = dataclasses.field(default_factory=dict)
    farther: list = dataclasses.field(default_factory=list)
    expected: dict = dataclasses.field(default_factory=dict)
    float_db: list = dataclasses.field(default_factory=list)

    def score(self, name) -> float:
        figures = (self.expected if name in self.expected else
                   self.crossfit if name in self.crossfit else self.sqnr_db)
        return _mean_db(figures[name], _exact(figures))

    def line(self) -> str:
        def means(figures):
            exact = _exact(figures)
            if len(exact) == len(next(iter(figures.values()))):
                return "no figure (every output exact, or zero in float, in every build)"
            return ", ".join(f"{name} {_mean_words(_mean_db(v, exact))}"
                             for name, v in figures.items())

        measured = (f"mean SQNR over the outputs on the {self.n} held-out inputs: "
                    f"{means(self.sqnr_db)}")
        if self.crossfit:
            measured += f"; cross-fitted on all {self.n_all} inputs: {means(self.crossfit)}"
        if self.expected:
            measured += ("; with the clipping expected of new inputs on the value outputs: "
                         + means(self.expected))
        if self.written == "cle":
            return f"written: {SAID['cle']}, the closest ({measured})"
        if self.farther:
            return (f"written: {SAID['plain']}: cle's build was not shown closer to the float "
                    f"model on output {', '.join(repr(n) for n in self.farther)}, cross-fitted "
                    f"(farther, closer by {PLAIN_MARGIN_DB:g} dB or less, or closer in fewer "
                    f"than {PLAIN_SUPPORT:.0%} of the resamples of the inputs; {measured}; "
                    "the stages above describe cle's build)")
        return (f"written: {SAID[self.written]}, closer than cle's build by more than "
                f"{SWITCH_DB:g} dB, on {SUPPORT[self.written]:.0%} of the resamples of the "
                "inputs or more "
                f"({measured}; the stages above describe cle's build)")

    def warning(self) -> str | None:
        if self.written == "cle":
            return None
        if self.farther:
            return (f"the file written is {SAID['plain']}: on the calibration inputs, each "
                    "checked by a build not calibrated on it, cle's build was not shown "
                    f"closer to the float model than the plain conversion (by more than "
                    f"{PLAIN_MARGIN_DB:g} dB) on output "
                    f"{', '.join(repr(n) for n in self.farther)}; "
                    "the plain conversion keeps every output at the converter's level, and "
                    "gives up what cle's build gained on the others")
        return (f"the file written is {SAID[self.written]}: on the calibration inputs, each "
                "checked by a build not calibrated on it, it was closer to the float model "
                f"than cle's build ({self.score(self.written):.2f} against "
                f"{self.score('cle'):.2f} dB); the figures are those of that kind of build, "
                "chosen on the inputs they are measured on")

    def to_dict(self) -> dict:
        return {"written": self.written, "n": self.n,
                "sqnr_db": {k: list(v) for k, v in self.sqnr_db.items()},
                "n_all": self.n_all,
                "crossfit": {k: list(v) for k, v in self.crossfit.items()},
                "farther": list(self.farther),
                "expected": {k: list(v) for k, v in self.expected.items()},
                "float_db": [_check.json_number(v) for v in self.float_db],
                "switch_db": SWITCH_DB}


def _mean_words(mean) -> str:
    """A build's mean in the choice's line: an output exact, or zero in float, in this build
    and not in another leaves no finite mean, which no one word describes."""
    return sqnr_words(mean, 2) if math.isfinite(mean) else (
        "no mean figure (an output exact, or zero in float, in this build alone)")


def _mean_db(figures, exact=()) -> float:
    """The mean of per-output figures over the outputs not in ``exact`` (those every build
    reproduces exactly, a constant or an input passed through: inf for every build, they
    would make every mean inf); inf when none is left."""
    kept = [float(f) for k, f in enumerate(figures) if k not in exact]
    return float(np.mean(kept)) if kept else math.inf


def _exact(figures: dict) -> set:
    """The outputs no build in ``figures`` (``{build: [SQNR of each output]}``) can be told
    from another on: every build exact (inf), or every build -inf (the float output zero on
    the inputs: an error without a signal)."""
    rows = list(figures.values())
    return {k for k in range(len(rows[0]))
            if any(all(row[k] == v for row in rows) for v in (math.inf, -math.inf))
            } if rows else set()


def chooses(build) -> bool:
    """Whether the choice runs for ``build``: ``ranges="auto"``, with calibration data held
    out for the check, 8-bit weights rounded by the converter, 8-bit activations, no tuning
    (the tuning chooses its own ranges)."""
    opts = build.opts
    return (build.calibration == "data" and build.calibrated is not None
            and build.inputs.held_out
            and opts.weight_bits == 8 and opts.activation_bits == 8 and not opts.rounds
            and opts.ranges == "auto" and not opts.tune)


def _variant(build, name) -> bytes:
    """Candidate ``name``'s build from cle's equalized model, calibrated on the calibration
    inputs (as cle's build)."""
    roles = tensor_roles(build.calibrated)
    ranges = [dataclasses.replace(r) for r in build.ranges]
    for r in ranges:
        as_kind(r, KIND[name], *build.extremes[r.index], roles[1], roles[3])
    return tflite.quantize_calibrated(tflite.with_ranges(build.calibrated, ranges),
                                      per_channel=build.opts.per_channel,
                                      integer_io=build.opts.integer_io)


def _has_values(model, declared) -> bool:
    """Whether ``model`` has a value output that widened ranges are for: one checked as
    values that is not an undeclared linear vector of :data:`cle._measure.check.MIN_CLASSES`
    entries or more (class logits, likely: widening costs them resolution, and on the
    ImageNet networks it read several dB farther on the held-out inputs)."""
    logits = set(_check.undeclared_scores(model, declared))
    return any(kind == "values" and name not in logits for kind, name in zip(
        _check.output_kinds(model, declared), _check.output_names(model)))


def _sqnrs(reference, y) -> list[float]:
    return [c.sqnr_db for c in _check.check_outputs(reference, y, ["?"] * len(y),
                                                    ["values"] * len(y))]


def choose(model, build, say) -> tuple[Choice, bytes | None]:
    """Measure the candidates; write the closest, its ranges calibrated on every input, into
    ``build.content`` (and its ranges into ``build.ranges``), and the check's figures on
    every calibration input into ``build.crossfit``. Returns ``(choice, the plain
    conversion's bytes on the first three quarters)`` (for ``compare``).

    First on the held-out inputs alone: a candidate whose gain over cle's build has its
    interval below :data:`SWITCH_DB` there is out (on the ImageNet networks both are, by
    several dB, and nothing more is built). The others, and the build written, are then
    cross-fitted (:class:`cle._quantize.crossfit.CrossFit`): every calibration input checked
    by a build of that kind not calibrated on it, and the choice made on all of them."""
    x = build.inputs.checks[0][1]
    say(f"measuring cle's build against min/max ranges and TF Lite's plain conversion on "
        f"the {len(x)} held-out inputs")
    reference = outputs_once(build.runs, model, x)
    plain_of = tflite.PlainConversion(model, build.opts.per_channel, build.opts.integer_io)
    plain = plain_of.on(build.inputs.calibration)
    float_db = [_sqnr(r, y) for r, y in
                zip(reference, outputs_once(build.runs, plain_of.float_model, x))]
    values = _has_values(model, build.opts.output_kinds)
    contents = {"cle": build.content, "cle, min/max ranges": _variant(build, "cle, min/max ranges"),
                **({WIDENED: _variant(build, WIDENED)} if values else {}), "plain": plain}
    outputs = {name: outputs_once(build.runs, content, x) for name, content in contents.items()}
    sqnr = {name: _sqnrs(reference, y) for name, y in outputs.items()}
    usable = [name for name in CANDIDATES[1:] if name in contents
              and not any(math.isnan(s) or s == -math.inf for s in sqnr[name])]
    undecided = [name for name in usable if name == WIDENED
                 or _may_switch(_check.sqnr_gain(reference, outputs[name], outputs["cle"]))
                 or name == "plain" and any(_may_switch(g, -PLAIN_MARGIN_DB - PLAIN_SCREEN_DB)
                                            for g in _output_gains(reference, outputs[name],
                                                                   outputs["cle"]))]
    if build.opts.compare and "plain" not in undecided:
        undecided.append("plain")  # --compare's verdict is measured on every input too
    fit, pooled_ref, pooled = _cross_fit(model, build, contents, undecided, say, plain_of)
    clip = _clipping(model, build, pooled_ref)
    gains = {name: _check.sqnr_gain(pooled_ref, pooled[name], pooled["cle"],
                                    clipping=clip[name], clipping_other=clip["cle"])
             for name in undecided if name in usable}
    better = {name: gain for name, (gain, _, support) in gains.items()
              if name in SUPPORT and gain > SWITCH_DB and support >= SUPPORT[name]}
    written = max(better, key=better.get) if better else "cle"
    held = "plain" in gains
    if not held and "plain" in usable and _fell(pooled_ref, pooled[written], sqnr["plain"]):
        pooled["plain"], held = fit.outputs("plain"), True  # the screen's verdict fell
    farther = _farther_outputs(model, pooled_ref, pooled, written, clip) if held else []
    if farther:  # the converter's file keeps every output at the converter's level
        written = "plain"
    _write_refit(fit, build, written, pooled_ref, pooled, say, clip)
    expected = ({name: [_check.sqnr_with_clipping(r, y, c) for r, y, c in
                        zip(pooled_ref, pooled[name], clip[name])] for name in pooled}
                if any(any(c) for c in clip.values()) else {})
    return Choice(written, len(x), sqnr, fit.n,
                  {name: _sqnrs(pooled_ref, y) for name, y in pooled.items()},
                  farther, expected, float_db), plain


def unchosen_clipping(model, build) -> list:
    """Per output, the clipping new inputs are expected to add (noise energy per input) to a
    build written without the choice (:func:`chooses`: 16-bit activations, 4-bit weights or a
    rounding of the kernels, ``tune=True``, ranges "minmax" or "percentile"), whose value
    outputs keep the min/max of the calibration inputs (none where TF Lite fixes the output's
    range, :data:`FIXED_OUTPUTS`; softmax logits are not modelled here): the held-out
    check's interval reaches down to it, as the choice's does (helper-22's hunt: such a build
    of a regression head claimed far above its real figure, the few new inputs beyond the
    range carrying most of the noise)."""
    reference = outputs_once(build.runs, model, build.inputs.calibration)
    return _clipping(model, build, reference)["plain"]


def _clipping(model, build, reference) -> dict:
    """``{candidate: [noise energy per input, per output]}``: the clipping new inputs are
    expected to add on each value output, its range calibrated on ``reference`` (the float
    model's outputs on every calibration input) as the candidate calibrates it: widened, or
    min/max (every other candidate keeps an output's min/max).
    :func:`cle._quantize.ranges.expected_clipping`; 0 on class scores (their range is
    bounded, or a top class clipped stays the top class) and on an output made by an operation
    whose 8-bit output range TF Lite fixes (:data:`FIXED_OUTPUTS`: no input is clipped there;
    the law charged hunt8's sigmoid heads for clipping their outputs, which held every new
    input, and the widened ranges it favoured read below the converter on them)."""
    kinds = _check.output_kinds(model, build.opts.output_kinds)
    fixed = [_check.ends_in(out) in FIXED_OUTPUTS for out in model.outputs]
    return {name: [expected_clipping(r, KIND.get(name, "min/max"))
                   if kind == "values" and not held else 0.0
                   for r, kind, held in zip(reference, kinds, fixed)] for name in CANDIDATES}


def _logit_clipping(fit, build, reference, kinds, names) -> dict:
    """``{candidate: [noise energy per input, per output]}`` for the candidates ``names``: the
    clipping of its logits new inputs are expected to add on each softmax output (its logits'
    range calibrated as the candidate calibrates it: widened in cle's build and the widened
    one, min/max in the others), :func:`cle._quantize.ranges.softmax_clipping` from the
    logits' extremes on every calibration input; 0 elsewhere. The check's interval reaches
    down to it; the choice does not weigh it (module docstring)."""
    logits = tflite.softmax_logits(build.calibrated)
    law = {name: "widened" if KIND.get(name) in ("tails", "widened") else "min/max"
           for name in names}  # cle's own build widens the logits too (ranges.as_kind)
    out = {name: [0.0] * len(reference) for name in names}
    for k, (r, output_kind, index) in enumerate(zip(reference, kinds, logits)):
        if output_kind != "probabilities" or index is None or index not in build.extremes:
            continue
        lows, highs = fit.extremes(index)
        logit = next((t.logit for t in build.ranges if t.index == index), None)
        noise = {kind: softmax_clipping(r, lows, highs, kind, logit[1] if logit else None)
                 for kind in set(law.values())}
        for name in names:
            out[name][k] = noise[law[name]]
    return out


def _output_gains(reference, ys, others, clip=None, clip_other=None) -> list:
    """:func:`cle._measure.check.sqnr_gain` of each output alone (``clip``/``clip_other``:
    each output's expected clipping per input of ``ys``/``others``; none by default)."""
    zeros = [0.0] * len(reference)
    return [_check.sqnr_gain([r], [a], [b], clipping=[ca], clipping_other=[cb])
            for r, a, b, ca, cb in zip(reference, ys, others, clip or zeros, clip_other or zeros)]


def _sqnr(reference, y) -> float:
    """One output's SQNR (dB) of ``y`` against ``reference``, as :func:`_output_gains` reads
    its point (float64, no clipping added)."""
    return _check.sqnr_with_clipping(np.asarray(reference, np.float64), np.asarray(y, np.float64))


def _farther_outputs(model, reference, pooled, mine="cle", clip=None) -> list[str]:
    """The outputs on which the build ``mine`` is not shown closer to the float model than the
    plain conversion, on the pooled cross-fitted outputs with each one's expected clipping
    (``clip``, :func:`_clipping`): farther, closer by no more than :data:`PLAIN_MARGIN_DB`,
    or closer in fewer than :data:`PLAIN_SUPPORT` of the resamples of the inputs (the promise
    is per output: a better mean does not excuse a worse head, and a tie, or a gain the inputs
    do not back, goes to what the user had); or farther as measured, without the expected
    clipping (the margin is asked of the figures with it: on a value output the law that
    expects new inputs' clipping is the evidence, and on hunt8's signal denoiser, widened
    ranges a few hundredths closer without it and well closer with it read far above the
    plain conversion on new inputs, which clipped its output). That alone, a law fitted to a few
    dozen extremes, does not make a gain: where the extremes' tail is lighter than the law's
    (an image output), it charged the plain conversion's min/max output for clipping new
    inputs hardly made, and a build the cross-fit put below it was written, below it on new
    inputs too."""
    clip = clip or {}
    weighed = _output_gains(reference, pooled["plain"], pooled[mine], clip.get("plain"),
                            clip.get(mine))
    figures = [(_sqnr(r, p), _sqnr(r, m))  # the point alone: no bootstrap to read
               for r, p, m in zip(reference, pooled["plain"], pooled[mine])]
    return [name for name, (gain, _, support), (p, m) in zip(
        _check.output_names(model), weighed, figures)
        if not (p == m == math.inf)  # both exact: no output to be closer on
        and (gain > -PLAIN_MARGIN_DB or support > 1.0 - PLAIN_SUPPORT or p > m)]


def refit_cle(model, build, say) -> None:
    """What :func:`choose` does when it keeps cle's build, without measuring the others
    (``cle.analyze``, which analyses cle's build): its ranges calibrated on every input,
    its check cross-fitted."""
    fit, pooled_ref, pooled = _cross_fit(model, build, {"cle": build.content}, [], say)
    _write_refit(fit, build, "cle", pooled_ref, pooled, say, _clipping(model, build, pooled_ref))


def _cross_fit(model, build, contents, candidates, say, plain=None):
    """``(fit, reference, {name: outputs})``: the float model's and the builds' outputs on
    every calibration input, cross-fitted, for cle's build and ``candidates`` (``plain``: the
    :class:`cle._tflite.converter.PlainConversion` that made ``contents["plain"]``)."""
    fit = CrossFit(model, build, contents, plain)
    say(f"cross-fitting the check on all {fit.n} calibration inputs (each by a build not "
        "calibrated on it" + (f"; candidates: {', '.join(candidates)}" if candidates else "")
        + ")")
    return fit, fit.reference(), {name: fit.outputs(name) for name in ["cle", *candidates]}


def _write_refit(fit, build, name, reference, pooled, say, clip) -> None:
    """Write the build of kind ``name`` calibrated on every input into ``build``, and the
    cross-fitted check's figures (of that kind, and of the plain conversion when measured)
    and their expected clipping (``clip``, :func:`_clipping`) into ``build.crossfit``."""
    say(f"writing {SAID[name]}, calibrated on all {fit.n} inputs")
    content, ranges = fit.refit(name)
    build.content = content
    if ranges is not None:
        build.ranges = ranges
    kinds = _check.output_kinds(fit.model, build.opts.output_kinds)
    logits = _logit_clipping(fit, build, reference, kinds, {name, "plain"})
    build.crossfit = {"written": name, "inputs": fit.label(), "n": fit.n, "reference": reference,
                      "test": pooled[name], "plain": pooled.get("plain"),
                      "clipping": [a + b for a, b in zip(clip[name], logits[name])],
                      "clipping_plain": [a + b for a, b in zip(clip["plain"], logits["plain"])],
                      "ties": tie_floor(fit.model, content, fit.inputs(), reference, kinds,
                                        sigmoids=_sigmoids(fit.model))}


def _sigmoids(model) -> list[bool]:
    """Per output of ``model``, whether it ends in a sigmoid (probed for ties at 0.5)."""
    return [_check.ends_in(out) == "sigmoid" for out in model.outputs]


def _fell(reference, pooled, plain_held) -> bool:
    """Whether the build about to be written, cross-fitted (``pooled``), reads some output
    more than :data:`PLAIN_SCREEN_DB` below the plain conversion's figure on the held-out
    quarter (``plain_held``): the screen that left the plain conversion out judged cle's build
    calibrated on three quarters, and a build of the same kind on other inputs fell far below
    it (a channel silent on the three quarters, amplified without bound, once made every
    cross-fitted build a constant). The plain conversion is then cross-fitted too."""
    return any(s < p - PLAIN_SCREEN_DB for s, p in zip(_sqnrs(reference, pooled), plain_held))


def _may_switch(gain, margin=SWITCH_DB) -> bool:
    """Whether a candidate's ``(gain, interval, support)`` on the held-out inputs leaves it a
    chance to gain ``margin`` (its interval reaches that high, or there is none)."""
    _, interval, _ = gain
    return interval is None or interval[1] > margin
