"""The check's sets of inputs, as :func:`cle._quantize.pipeline.check_sets` measures them
(``{"inputs", "n", "reference", "test", "outputs", ...}``): which of them bound the figures
the report gives, and those figures.

Without data each set of synthetic inputs is a guess of what real ones do, and the figures
are the lower over the sets, so that the check cannot flatter; but a set the model's batch
norms say is unlike its data (natural-image-like fields spreading their inputs past
:data:`cle._measure.field_spread.SPREAD_LIMIT`, which the calibration leaves out for that
reason) measures the file on inputs real ones do not resemble. Its figures are reported
with it, and the figures of the others are the report's (``"bounds"`` False on it).
"""

from __future__ import annotations

import dataclasses

__all__ = ["bounding", "check_label", "lower", "public"]


def bounding(sets) -> list:
    """The sets whose figures bound the report's: all but those marked ``"bounds"`` False,
    or all of them where none would be left."""
    kept = [c for c in sets if c.get("bounds", True)]
    return kept or list(sets)


def lower(sets) -> list:
    """Per output, the lowest SQNR and the lowest top-1 agreement over the :func:`bounding`
    sets."""
    return [dataclasses.replace(
        min(per_set, key=lambda o: o.sqnr_db),
        top1_agreement=min(o.top1_agreement for o in per_set))
        for per_set in zip(*(c["outputs"] for c in bounding(sets)))]


def check_label(sets) -> str:
    """What the check ran on, in words (the report's ``check_inputs``)."""
    return sets[0]["inputs"] if len(sets) == 1 else (
        "inputs the calibration never saw: " + " and ".join(c["inputs"] for c in sets))


def public(check_set) -> dict:
    """What the report keeps of a set: its inputs in words, how many, each output's check, and
    whether it bounds the figures."""
    return {"inputs": check_set["inputs"], "n": check_set["n"],
            "outputs": check_set["outputs"], "bounds": check_set.get("bounds", True)}
