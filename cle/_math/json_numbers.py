"""Figures for a JSON report, which has no infinity and no NaN (strict readers refuse the
tokens ``Infinity`` and ``NaN``): an error-free SQNR is written ``"inf"``, no figure ``null``;
and an SQNR in a sentence, where an infinite one is said in words."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["EXACT", "ZERO_FLOAT", "json_number", "json_safe", "sqnr_label", "sqnr_span",
           "sqnr_words"]

#: What a report says of an output the file reproduces exactly (an infinite SQNR).
EXACT = "exact (the file reproduces it: no quantization error)"
#: What a check says of an output that is zero in float on every check input and not in the file.
ZERO_FLOAT = ("no SQNR: the float output is zero on every check input and the file's is not "
              "(its error has no signal to be measured against)")


def json_safe(value):
    """``value`` (dicts, lists, tuples, numbers, ...) with every float that JSON cannot hold
    written as :func:`json_number` writes it: a report's JSON is read by tools that refuse
    ``Infinity`` and ``NaN`` (an output the file reproduces exactly reads an infinite SQNR)."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (float, np.floating)) and not math.isfinite(value):
        return json_number(value)
    return value


def json_number(value):
    """A figure for a JSON report, which has no infinity: an error-free SQNR is ``"inf"``
    (``"-inf"`` below); None and NaN (no figure) are None."""
    if value is None or value != value:
        return None
    value = float(value)
    return value if math.isfinite(value) else ("inf" if value > 0 else "-inf")


def sqnr_words(sqnr, digits: int = 1) -> str:
    """An SQNR in a sentence: "exact" (inf: no error), "no SQNR (the float output is zero)"
    (-inf: an error without a signal), "no figure" (NaN), else "... dB"; ``sqnr`` a number or
    JSON's ``"inf"``."""
    sqnr = float(sqnr)
    if sqnr != sqnr:
        return "no figure"
    if math.isfinite(sqnr):
        return f"{sqnr:.{digits}f} dB"
    return "exact" if sqnr > 0 else "no SQNR (the float output is zero)"


def sqnr_label(sqnr, digits: int = 2) -> str:
    """An output's SQNR in a report line: :data:`EXACT` (inf), :data:`ZERO_FLOAT` (-inf), else
    "SQNR ... dB" ("no SQNR figure" for NaN); ``sqnr`` a number or JSON's ``"inf"``/``"-inf"``."""
    sqnr = float(sqnr)
    if sqnr != sqnr:
        return "no SQNR figure"
    if math.isfinite(sqnr):
        return f"SQNR {sqnr:.{digits}f} dB"
    return EXACT if sqnr > 0 else ZERO_FLOAT


def sqnr_span(low, high, digits: int = 1) -> str:
    """The ends of an SQNR interval, "low to high" in dB figures, an infinite end in words
    ("exact": some resamples reproduce the output exactly; "no figure" for NaN)."""
    def end(v):
        v = float(v)
        if v != v:
            return "no figure"
        return f"{v:.{digits}f}" if math.isfinite(v) else ("exact" if v > 0 else "no SQNR")
    return f"{end(low)} to {end(high)}"
