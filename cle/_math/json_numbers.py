"""Figures for a JSON report, which has no infinity and no NaN (strict readers refuse the
tokens ``Infinity`` and ``NaN``): an error-free SQNR is written ``"inf"``, no figure ``null``;
and an SQNR in a sentence, where an infinite one is said in words."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["json_number", "json_safe", "sqnr_words"]


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
    (-inf: an error without a signal), else "... dB"."""
    if math.isfinite(sqnr):
        return f"{sqnr:.{digits}f} dB"
    return "exact" if sqnr > 0 else "no SQNR (the float output is zero)"
