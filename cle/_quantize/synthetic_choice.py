"""Without data, the choice between cle's build (activation ranges at their tails) and the
same equalized model with every range at its min/max over the synthetic calibration inputs
(but the logits of a softmax or sigmoid output, widened in both: :func:`minmax_build`), made
on the check's own synthetic sets (:mod:`cle._quantize.choice` makes it with data).

The tails suit the ImageNet networks, and cut ranges some models need (with data the
cross-fitted choice then writes min/max ranges); min/max ranges of synthetic inputs are no
answer either, as their rare extremes are not the real ones. Without data the only inputs no
range was calibrated on are the check's: natural-image-like inputs and inputs distilled apart
(:mod:`cle._quantize.pipeline`). The check reads each output as the lower of its figures on
those sets, and the choice reads both builds the same way: min/max ranges replace the tails
when that figure, in mean over the outputs, is higher by more than :data:`SWITCH_DB`, in
more than :data:`SUPPORT` of the resamples of a bootstrap of each set's inputs (the same resample
for both builds). A set on which the tails read better and another on which min/max do is
no evidence for either unless the lower of the two moves: the lower figure is the one the
check states. The report says which was written and both figures (``report.choice``, a
:class:`NoDataChoice`, whose line and dictionary take the shape of the choice with data), and
that its check's figures are those of the build chosen on them.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from cle._math.json_numbers import sqnr_words
from cle._measure import check as _check
from cle._measure.inference import outputs_once
from cle._quantize.choice import SWITCH_DB
from cle._quantize.ranges import LOGITS, as_kind, tensor_roles
from cle._tflite import converter as tflite

__all__ = ["MINMAX", "SUPPORT", "SWITCH_DB", "NoDataChoice", "choose", "chooses"]

#: The share of the bootstrap's resamples in which min/max ranges must read higher than the
#: tails, on the lower figure over the check's sets, to be written: most of them, not nearly
#: all as with data (:data:`cle._quantize.choice.SUPPORT`). With data the tails are the
#: default a few inputs must not overturn; without data neither build has that standing (both
#: are ranges of synthetic inputs), the check states the point figure, and its distilled set
#: is small (sixteen inputs, one of which can carry most of the tails' clipping, which is the
#: evidence).
SUPPORT = 0.5
#: Resamples of the bootstrap, and its seed.
BOOTSTRAP, SEED = 1000, 0
#: The other build's name (as :data:`cle._quantize.choice.CANDIDATES` names it).
MINMAX = "cle, min/max ranges"


@dataclasses.dataclass
class NoDataChoice:
    """Without data, which build was written (``report.choice``).

    Attributes:
        written: ``"cle"`` (the tails) or :data:`MINMAX`.
        sets: the check's synthetic sets both builds ran on (their names).
        n: their inputs, in all.
        sqnr_db: ``{build: [SQNR of each output]}``, each the lower over the sets.
        support: the share of the bootstrap's resamples in which min/max ranges read higher
            (on the mean over the outputs of the lower figures).
    """

    written: str
    sets: list
    n: int
    sqnr_db: dict
    support: float
    #: What the choice with data has and this one has not (no calibration input held out,
    #: no cross-fitting, no float conversion): the same names keep the report's readers one.
    n_all: int = 0
    crossfit: dict = dataclasses.field(default_factory=dict)
    float_db: list = dataclasses.field(default_factory=list)

    def means(self) -> tuple[float, float]:
        """The mean over the outputs of each build's lower figure: (tails, min/max)."""
        kept = _kept(self.sqnr_db["cle"], self.sqnr_db[MINMAX])
        return tuple(float(np.mean([self.sqnr_db[k][i] for i in kept])) if kept else math.nan
                     for k in ("cle", MINMAX))

    def line(self) -> str:
        tails, minmax = self.means()
        measured = (f"on the check's {len(self.sets)} synthetic sets ({self.n} inputs), each "
                    f"build's lower figure over them in mean SQNR over the outputs: tails "
                    f"{sqnr_words(tails, 2)}, min/max {sqnr_words(minmax, 2)}, min/max higher "
                    f"in {self.support:.0%} of the resamples of the inputs")
        if self.written == "cle":
            return (f"written without data: cle's build (activation ranges at their tails); "
                    f"min/max ranges would need to be higher by more than {SWITCH_DB:g} dB in "
                    f"more than {SUPPORT:.0%} of the resamples ({measured})")
        return (f"written without data: cle's equalized model with every activation range at "
                f"its min/max over the synthetic calibration inputs, but the logits' (widened as "
                f"in cle's build) ({measured}; the stages above describe cle's build)")

    def warning(self) -> str | None:
        if self.written == "cle":
            return None
        tails, minmax = self.means()
        return ("without data the file written has min/max activation ranges (cle's equalized "
                "model, every range at its min/max over the synthetic calibration inputs but "
                "the logits') "
                "instead of their tails: on the check's synthetic inputs its lower figure over "
                f"the sets was higher ({minmax:.2f} against {tails:.2f} dB in mean SQNR over "
                f"the outputs, in {self.support:.0%} of the resamples of the inputs); the "
                "check's figures are those of the build chosen on the inputs they are "
                "measured on")

    def to_dict(self) -> dict:
        return {"written": self.written, "calibration": "synthetic", "sets": list(self.sets),
                "n": self.n, "sqnr_db": {k: [_check.json_number(f) for f in v]
                                         for k, v in self.sqnr_db.items()},
                "support": self.support, "support_needed": SUPPORT, "switch_db": SWITCH_DB,
                "n_all": 0, "crossfit": {}, "float_db": []}


def chooses(build) -> bool:
    """Whether the choice runs for ``build``: without data, ``ranges="auto"``, tail ranges
    written into a calibrated flatbuffer, 8-bit weights the converter stores (no rounding
    stage), 8-bit activations, no tuning (which chooses its own ranges)."""
    opts = build.opts
    return (build.calibration == "synthetic" and build.calibrated is not None
            and bool(build.extremes) and len(build.inputs.checks) > 1
            and opts.weight_bits == 8 and opts.activation_bits == 8 and not opts.rounds
            and opts.ranges == "auto" and not opts.tune)


def choose(model, build, say) -> tuple[NoDataChoice | None, None]:
    """When :func:`chooses`, measure min/max ranges against the tails on the check's sets and
    write the build chosen into ``build`` (its ``content`` and ``ranges``). Returns
    ``(choice, None)``: the :class:`NoDataChoice` made (None where none ran) and no plain
    conversion (the pipeline's pair)."""
    if not chooses(build):
        return None, None
    start = time.perf_counter()
    say("without data: measuring min/max activation ranges against the tails on the check's "
        "synthetic inputs")
    content, ranges = minmax_build(build)
    sets = build.inputs.checks
    refs = [outputs_once(build.runs, model, x) for _, x in sets]
    mine = [outputs_once(build.runs, build.content, x) for _, x in sets]
    theirs = [outputs_once(build.runs, content, x) for _, x in sets]
    tails, minmax = _lower_figures(refs, mine), _lower_figures(refs, theirs)
    gain, support, _ = _gain(minmax, tails)
    build.seconds["choose"] = time.perf_counter() - start
    switch = gain > SWITCH_DB and support > SUPPORT
    if switch:
        build.content, build.ranges = content, ranges
    figures = {"cle": tails[0].tolist(), MINMAX: minmax[0].tolist()}
    return NoDataChoice(MINMAX if switch else "cle", [name for name, _ in sets],
                        sum(len(ref[0]) for ref in refs), figures, support), None


def minmax_build(build) -> tuple[bytes, list]:
    """``(tflite bytes, ranges)``: ``build``'s calibrated model with every tail range set
    back to its min/max (:func:`cle._quantize.ranges.as_kind`), but the logits of a softmax
    or sigmoid output, which keep the range the tails build widened them to
    (:data:`cle._quantize.ranges.LOGITS`): synthetic inputs are less sure of their class
    than real ones, and their largest logits stop short of real inputs' (the zoo's
    sepconv_bn: its logits' min/max over the synthetic inputs stopped well short of the real
    inputs' highest, and the build written read several dB below the plain converter with
    data; widened, above it). The choice is between the tail and min/max ranges of the
    tensors inside the model; the logits' is not the choice's to undo."""
    roles = tensor_roles(build.calibrated)
    ranges = [dataclasses.replace(r) for r in build.ranges]
    for r in ranges:
        if r.index in build.extremes and r.how != LOGITS:
            as_kind(r, "min/max", *build.extremes[r.index], roles[1], roles[3])
    content = tflite.quantize_calibrated(tflite.with_ranges(build.calibrated, ranges),
                                         per_channel=build.opts.per_channel,
                                         integer_io=build.opts.integer_io)
    return content, ranges


def lower_gain(refs, ys, others) -> tuple[float, float, tuple[float, float]]:
    """``(gain, support, (figure, other figure))``: per set, ``refs[s]``, ``ys[s]`` and
    ``others[s]`` hold one array per output; each build's figure is the mean over the outputs
    of the lowest SQNR over the sets (outputs both builds reproduce exactly, or that are zero
    in float, left out), the gain the difference of the two figures, and the support the
    share of the resamples of each set's inputs (:data:`BOOTSTRAP`, the same for both builds)
    in which it is above 0."""
    return _gain(_lower_figures(refs, ys), _lower_figures(refs, others))


def _lower_figures(refs, ys) -> tuple[np.ndarray, np.ndarray]:
    """``(point, boot)``: per output, the lowest SQNR of ``ys`` over the sets (``(outputs,)``),
    and the same on each of the bootstrap's resamples of each set's inputs (``(outputs,
    resamples)``; the resamples depend on the set and its size only: two builds read on the
    same sets share them)."""
    per_set_point, per_set_boot = [], []
    for s, (ref, y) in enumerate(zip(refs, ys)):
        n = len(ref[0])
        idx = np.random.default_rng(SEED + s).integers(0, n, (BOOTSTRAP, n))
        energies = [_check.energies(r, a) for r, a in zip(ref, y)]
        per_set_point.append([_db(sig.sum(), noise.sum()) for sig, noise in energies])
        per_set_boot.append([_db(sig[idx].sum(axis=1), noise[idx].sum(axis=1))
                             for sig, noise in energies])
    return np.min(np.array(per_set_point), axis=0), np.min(np.array(per_set_boot), axis=0)


def _gain(ys, others) -> tuple[float, float, tuple[float, float]]:
    """:func:`lower_gain` from each build's :func:`_lower_figures`."""
    (point_y, boot_y), (point_o, boot_o) = ys, others
    kept = _kept(point_y, point_o)
    if not kept:
        return 0.0, 0.0, (math.nan, math.nan)
    figure, other = float(np.mean(point_y[kept])), float(np.mean(point_o[kept]))
    gains = np.mean(boot_y[kept] - boot_o[kept], axis=0)
    gains = gains[~np.isnan(gains)]
    support = float(np.mean(gains > 0)) if gains.size else 0.0
    return figure - other, support, (figure, other)


def _kept(a, b) -> list[int]:
    """The outputs two builds' per-output figures ``a`` and ``b`` are compared on: not those
    both reproduce exactly, or that are zero in float (the same infinite figure in both), nor
    those without a number in either."""
    return [k for k, (x, y) in enumerate(zip(a, b))
            if not (x == y and not math.isfinite(x)) and not math.isnan(x + y)]


def _db(signal, noise):
    with np.errstate(divide="ignore", invalid="ignore"):
        return 10.0 * np.log10(np.asarray(signal, np.float64) / np.asarray(noise, np.float64))
