"""Every input's range without data (:func:`input_ranges_of`): stated, or found from the model
(:mod:`cle._measure.input_range`), or :class:`InputRangeUnknown`."""

from __future__ import annotations

import numpy as np

from cle._core.inputs import input_names
from cle._measure import input_range as _input_range
from cle._measure.check import output_names

__all__ = ["InputRangeUnknown", "input_ranges_of", "ranges_without_data"]


class InputRangeUnknown(ValueError):
    """Without data, the range of some input cannot be told from the model (not at all, or
    only as a guess: a batch-norm fit near no usual convention, or between two) and was not
    stated. ``unknown`` holds the :class:`cle._measure.input_range.InputRange` of each such
    input (its ``source`` says why)."""

    def __init__(self, model_name, unknown):
        self.model_name, self.unknown = model_name, unknown
        super().__init__(
            f"cannot tell the input range of model '{model_name}' ({self.why()}); pass "
            "input_range=(low, high) or calibration_data. Received: input_range=None, "
            "calibration_data=None")

    def why(self) -> str:
        return "; ".join(f"input '{r.name}': {r.source}" for r in self.unknown)


def input_ranges_of(model, stated):
    """Every input's range without data: ``stated`` (``(lo, hi)`` for all, or a dict by input
    name), else found from the model.

    Raises:
        ValueError: ``stated`` names an input the model does not have.
        InputRangeUnknown: an input's range can be neither found nor was stated.
    """
    names = input_names(model)
    if isinstance(stated, dict):
        unknown = sorted(set(stated) - set(names))
        if unknown:
            raise ValueError(f"input_range names inputs the model does not have: {unknown}; "
                             f"its inputs are {names}. Received: input_range={stated!r}")
    elif stated is not None:
        stated = dict.fromkeys(names, stated)
    stated = stated or {}
    found = _input_range.infer_input_ranges(model)
    out = []
    for name, inferred in zip(names, found):
        if name not in stated:
            out.append(inferred)
            continue
        given = _input_range.InputRange(name, *stated[name], "stated")
        if inferred.known and inferred.sure and _far(given, inferred):
            given.note = (f"input '{name}': the stated range [{given.lo:.4g}, {given.hi:.4g}] "
                          f"is not what the model says, [{inferred.lo:.4g}, {inferred.hi:.4g}] "
                          f"({inferred.source}); a wrong input range wrecks the quantized "
                          "model, check it")
        out.append(given)
    # A guess (a batch-norm fit near no usual convention, or between two) is not a range the
    # tool can back: quantized with it, the hunts' models read far below the figure their
    # check claimed. Ask for the range instead, in the one message.
    unknown = [r for r in out if not r.known or (not r.sure and r.source != "stated")]
    if unknown:
        raise InputRangeUnknown(model.name, unknown)
    return out


def _far(a, b) -> bool:
    """Whether two ranges differ by more than a convention's snap distance."""
    wa, wb = a.hi - a.lo, b.hi - b.lo
    return (abs(np.log(wa / wb)) + abs((a.hi + a.lo) / 2 - (b.hi + b.lo) / 2) / wb
            > _input_range.SNAP_MAX)


def ranges_without_data(model, stated, unknown_outputs, coded=()):
    """:func:`input_ranges_of`, for a run without data whose outputs ``unknown_outputs``
    (``[(name, values)]``, :func:`cle._measure.synthetic.regression_outputs`) have ranges synthetic
    inputs cannot tell, or are decoded from a code they cannot tell (``coded``, ``[(name,
    layer, entries)]``, :func:`cle._measure.synthetic.coded_outputs`): with any, one
    :class:`cle._measure.synthetic.NeedsData` names them and, when the model cannot tell it
    either, the input range (not the output, then, once it is declared, the input: one refusal
    names everything that would settle it)."""
    from cle._measure.synthetic import NeedsData

    if not unknown_outputs and not coded:
        return input_ranges_of(model, stated)
    try:
        input_ranges_of(model, stated)
        also = ""
    except InputRangeUnknown as exc:
        also = (", and state the input range, which the model cannot tell either ("
                f"{exc.why()}; input_range=(low, high), --input-range=LOW,HIGH)")
    said = []
    if unknown_outputs:
        said.append(
            "the range of " + ", ".join(
                f"output '{name}' ({n} value{'s' if n > 1 else ''})"
                for name, n in unknown_outputs)
            + " cannot be found: synthetic inputs tell nothing of what a regression head "
            "gives real inputs, and a wrong range clips it; if such an output holds class "
            "scores, declare it (output_kinds={name: 'classes'}, --output-kind NAME=classes)")
    if coded:
        said.append(
            ", ".join(f"output '{name}' comes from the vector of layer '{layer}' ({n} "
                      f"value{'s' if n != 1 else ''})" for name, layer, n in coded)
            + ", past the last batch norm on every path: synthetic inputs tell nothing of what "
            "such a vector holds for real inputs (as of a regression head), and it and the "
            "layers after it would get ranges no real input gives"
            + ("; if such an output holds class scores, declare it (output_kinds={name: "
               "'classes'}, --output-kind NAME=classes)" if _scores_may(model, coded) else ""))
    raise NeedsData("without data " + "; and ".join(said) + also)


def _scores_may(model, coded) -> bool:
    """Whether an output of ``coded`` could be declared class scores: a vector of two entries
    or more (a map, or a single value, cannot). Outputs are matched by name, all of them (a
    nested model's outputs share one)."""
    named = {name for name, _, _ in coded}
    return any(name in named and len(tuple(out.shape)) == 2 and (out.shape[-1] or 0) >= 2
               for name, out in zip(output_names(model), model.outputs))
