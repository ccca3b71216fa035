"""Without data, the choice between cle's build (activation ranges at their tails) and the
same equalized model with every range at its min/max over the synthetic calibration inputs,
made on the check's own synthetic sets (:mod:`cle._quantize.choice` makes it with data).

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
check states. The report says which was written,
and that its check's figures are those of the build chosen on them.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from cle._measure import check as _check
from cle._measure.inference import outputs_once
from cle._quantize.choice import SWITCH_DB
from cle._quantize.ranges import as_kind, tensor_roles
from cle._tflite import converter as tflite

__all__ = ["SUPPORT", "SWITCH_DB", "choose", "chooses"]

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


def chooses(build) -> bool:
    """Whether the choice runs for ``build``: without data, ``ranges="auto"``, tail ranges
    written into a calibrated flatbuffer, 8-bit weights the converter stores (no rounding
    stage), 8-bit activations, no tuning (which chooses its own ranges)."""
    opts = build.opts
    return (build.calibration == "synthetic" and build.calibrated is not None
            and bool(build.extremes) and len(build.inputs.checks) > 1
            and opts.weight_bits == 8 and opts.activation_bits == 8 and not opts.rounds
            and opts.ranges == "auto" and not opts.tune)


def choose(model, build, say) -> tuple[None, None]:
    """When :func:`chooses`, measure min/max ranges against the tails on the check's sets and
    write the build chosen into ``build`` (its ``content`` and ``ranges``; a note for the
    report when min/max ranges are written). Returns ``(None, None)``: no
    :class:`cle._quantize.choice.Choice` and no plain conversion (the pipeline's pair)."""
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
    gain, support, figures = lower_gain(refs, theirs, mine)
    build.seconds["choose"] = time.perf_counter() - start
    if not (gain > SWITCH_DB and support > SUPPORT):
        return None, None
    build.content, build.ranges = content, ranges
    build.notes.append(
        "without data the file written has min/max activation ranges (cle's equalized model, "
        "every range at its min/max over the synthetic calibration inputs) instead of their "
        f"tails: on the check's synthetic inputs its lower figure over the sets was higher "
        f"({figures[0]:.2f} against {figures[1]:.2f} dB in mean SQNR over the outputs, in "
        f"{support:.0%} of the resamples of the inputs); the check's figures are those of the "
        "build chosen on the inputs they are measured on")
    return None, None


def minmax_build(build) -> tuple[bytes, list]:
    """``(tflite bytes, ranges)``: ``build``'s calibrated model with every tail range set
    back to its min/max (:func:`cle._quantize.ranges.as_kind`)."""
    roles = tensor_roles(build.calibrated, synthetic=True)
    ranges = [dataclasses.replace(r) for r in build.ranges]
    for r in ranges:
        if r.index in build.extremes:
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
    point, boot = {}, {}
    for name, outs in (("ys", ys), ("others", others)):
        per_set_point, per_set_boot = [], []
        for s, (ref, y) in enumerate(zip(refs, outs)):
            idx = np.random.default_rng(SEED + s).integers(0, len(ref[0]), (BOOTSTRAP,
                                                                            len(ref[0])))
            energies = [_check.energies(r, a) for r, a in zip(ref, y)]
            per_set_point.append([_db(sig.sum(), noise.sum()) for sig, noise in energies])
            per_set_boot.append([_db(sig[idx].sum(axis=1), noise[idx].sum(axis=1))
                                 for sig, noise in energies])
        point[name] = np.min(np.array(per_set_point), axis=0)  # (outputs,)
        boot[name] = np.min(np.array(per_set_boot), axis=0)  # (outputs, resamples)
    kept = [k for k in range(len(point["ys"]))
            if not (point["ys"][k] == point["others"][k] and not math.isfinite(point["ys"][k]))
            and not math.isnan(point["ys"][k] + point["others"][k])]
    if not kept:
        return 0.0, 0.0, (math.nan, math.nan)
    figure, other = (float(np.mean(point[n][kept])) for n in ("ys", "others"))
    gains = np.mean(boot["ys"][kept] - boot["others"][kept], axis=0)
    gains = gains[~np.isnan(gains)]
    support = float(np.mean(gains > 0)) if gains.size else 0.0
    return figure - other, support, (figure, other)


def _db(signal, noise):
    with np.errstate(divide="ignore", invalid="ignore"):
        return 10.0 * np.log10(np.asarray(signal, np.float64) / np.asarray(noise, np.float64))
