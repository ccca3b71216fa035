"""Never worse than TF Lite's own converter, by measurement: with calibration data, the build
:func:`cle.quantize` made is measured on the held-out inputs against two others made from the
same data, and the closest to the float model is written.

The candidates, in order of preference:

1. ``cle``: the build as the pipeline made it (equalized, bias-corrected, each activation
   tensor at its tails);
2. ``cle, min/max ranges``: the same equalized and corrected float model with every
   activation range at its min/max over the calibration inputs (what the converter does):
   the tails cut ranges some models need (a range halved in a grayscale classifier lost
   several dB against the plain converter);
3. ``plain``: the float model straight into TF Lite's converter, calibrated on the same
   inputs — what the user had.

Each is run on the held-out inputs; the score of a candidate is its mean SQNR over the
model's outputs, in dB. Another candidate replaces the pipeline's build only when it is closer
by more than :data:`SWITCH_DB` *and* the held-out inputs back it: in at least
:data:`SUPPORT` of the resamples of a paired bootstrap over the inputs
(:func:`cle._measure.check.sqnr_gain`) it is closer. So on the models where cle's build wins
nothing changes, and a gain that one or two inputs make changes nothing either: with
few held-out inputs the choice rarely switches (cross-fitting the check would give it more). The choice and every candidate's figures are in the
report (``report.choice``): the choice is made on the inputs the check then measures, so the
figure of the written file can flatter by the luck of the draw among three; the report says so.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from cle._measure import check as _check
from cle._measure import tflite
from cle._measure.inference import outputs_once

__all__ = ["CANDIDATES", "SUPPORT", "SWITCH_DB", "Choice", "choose", "chooses"]

#: A candidate replaces the pipeline's build when its mean SQNR over the outputs on the
#: held-out inputs is higher by more than this (dB).
SWITCH_DB = 0.3
#: The share of the bootstrap's resamples of the held-out inputs in which a candidate must be
#: closer than cle's build to replace it: nearly all (the lower end of a 90 % interval above
#: 0). The held-out inputs are few, and one of them often carries most of the noise: a gain it
#: makes is no evidence, and switching on it wrote a file far worse than cle's on the zoo's
#: MobileNetV3 (benchmarks/bench_zoo.py), where the plain conversion looked better on the
#: held-out inputs only.
SUPPORT = 0.95
#: The candidates' names, in order of preference.
CANDIDATES = ("cle", "cle, min/max ranges", "plain")
#: What each candidate is, in words.
SAID = {"cle": "cle's build (activation ranges at their tails)",
        "cle, min/max ranges": "cle's equalized model with min/max activation ranges",
        "plain": "the float model straight into TF Lite's converter"}


@dataclasses.dataclass
class Choice:
    """Which build was written, and why.

    Attributes:
        written: the name of the build written (one of :data:`CANDIDATES`).
        n: the held-out inputs the candidates were measured on.
        sqnr_db: ``{candidate: [SQNR of each output]}`` on those inputs.
    """

    written: str
    n: int
    sqnr_db: dict

    def score(self, name) -> float:
        return float(np.mean(self.sqnr_db[name]))

    def line(self) -> str:
        figures = ", ".join(f"{name} {self.score(name):.2f} dB" for name in self.sqnr_db)
        measured = f"mean SQNR over the outputs on the {self.n} held-out inputs: {figures}"
        if self.written == "cle":
            return f"written: {SAID['cle']}, the closest ({measured})"
        return (f"written: {SAID[self.written]}, closer than cle's build by more than "
                f"{SWITCH_DB:g} dB, on {SUPPORT:.0%} of the resamples of the held-out inputs or "
                "more "
                f"({measured}; the stages above describe cle's build)")

    def warning(self) -> str | None:
        if self.written == "cle":
            return None
        return (f"the file written is {SAID[self.written]}: on the held-out inputs it was "
                f"closer to the float model than cle's build ({self.score(self.written):.2f} "
                f"against {self.score('cle'):.2f} dB); the figures are those of the file "
                "written, chosen on the inputs they are measured on")

    def to_dict(self) -> dict:
        return {"written": self.written, "n": self.n,
                "sqnr_db": {k: list(v) for k, v in self.sqnr_db.items()},
                "switch_db": SWITCH_DB}


def chooses(build) -> bool:
    """Whether the choice runs for ``build``: ``ranges="auto"``, with calibration data held
    out for the check, 8-bit weights rounded by the converter, 8-bit activations, no tuning
    (the tuning chooses its own ranges)."""
    opts = build.opts
    return (build.calibration == "data" and build.calibrated is not None
            and build.inputs.checks[0][0] == "held-out calibration inputs"
            and opts.weight_bits == 8 and opts.activation_bits == 8 and not opts.rounds
            and opts.ranges == "auto" and not opts.tune)


def _minmax(build) -> bytes:
    ranges = [dataclasses.replace(r, lo=r.calibrated[0], hi=r.calibrated[1], how="min/max")
              for r in build.ranges]
    return tflite.quantize_calibrated(tflite.with_ranges(build.calibrated, ranges),
                                      per_channel=build.opts.per_channel,
                                      integer_io=build.opts.integer_io)


def _sqnrs(reference, y) -> list[float]:
    return [c.sqnr_db for c in _check.check_outputs(reference, y, ["?"] * len(y),
                                                    ["values"] * len(y))]


def choose(model, build, say) -> tuple[Choice, bytes | None]:
    """Measure the candidates on the build's held-out inputs; write the closest into
    ``build.content`` (and its ranges' ``how`` into ``build.ranges`` for the min/max one).
    Returns ``(choice, the plain conversion's bytes)`` (for ``compare``, which needs it too)."""
    x = build.inputs.checks[0][1]
    say(f"measuring cle's build against min/max ranges and TF Lite's plain conversion on "
        f"the {len(x)} held-out inputs")
    reference = outputs_once(build.runs, model, x)
    plain = tflite.convert_int8(model, build.inputs.calibration,
                                per_channel=build.opts.per_channel,
                                integer_io=build.opts.integer_io)
    contents = {"cle": build.content, "cle, min/max ranges": _minmax(build), "plain": plain}
    outputs = {name: outputs_once(build.runs, content, x) for name, content in contents.items()}
    sqnr = {name: _sqnrs(reference, y) for name, y in outputs.items()}
    gains = {name: _check.sqnr_gain(reference, y, outputs["cle"])
             for name, y in outputs.items() if name != "cle"
             and not any(math.isnan(s) or s == -math.inf for s in sqnr[name])}
    better = {name: gain for name, (gain, _, support) in gains.items()
              if gain > SWITCH_DB and support >= SUPPORT}
    written = max(better, key=better.get) if better else "cle"
    if written != "cle":
        build.content = contents[written]
        if written == "cle, min/max ranges":
            for r in build.ranges:
                if r.how == "percentile":
                    r.lo, r.hi, r.how = r.calibrated[0], r.calibrated[1], "min/max (chosen)"
    return Choice(written, len(x), sqnr), plain
