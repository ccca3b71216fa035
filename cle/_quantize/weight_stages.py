"""The weight stages of :func:`cle.quantize`: the rounding of the kernels (after equalizing,
before converting) and the storage of the rounded kernels in the ``.tflite`` (after
converting): 4-bit weights (W4A8) and rounding chosen for the output, at 4 or 8 bits."""

from __future__ import annotations

import collections

from cle._measure.weight_store import store_weights, weight_storage
from cle._quantize.rounding import round_model
from cle._quantize.weight_options import check_weight_options  # noqa: F401  (the pipeline's)

__all__ = ["check_weight_options", "equalize_bias_mode", "round_stage", "storage_lines",
           "store_stage"]

def equalize_bias_mode(method, mode) -> str:
    """The bias correction the equalize stage runs: none when the rounding sets the biases
    (the float model it rounds against must be the uncorrected one)."""
    return "none" if method != "nearest" else mode


def round_stage(equalized, x_cal, weight_bits, per_channel, method, bias_correction, source,
                say):
    """``(RoundingReport, [LayerWeights])``, or ``(None, None)`` when the converter's own
    rounding is the one asked for (8 bits, to nearest). Rounds ``equalized`` in place."""
    if weight_bits == 8 and method == "nearest":
        return None, None
    say(f"rounding the kernels onto their {weight_bits}-bit grids ({method}"
        + (f", on {len(x_cal)} {source}" if method != "nearest" else "") + ")")
    return round_model(equalized, [x_cal], bits=weight_bits, per_channel=per_channel,
                       method=method, free_bias=bias_correction != "none", source=source,
                       say=say)


def store_stage(content, entries, say):
    """``(content, [StoredWeight])``: the rounded kernels stored exactly (INT4 where LiteRT
    runs it), or, without a rounding stage, what the converter stored."""
    if entries is None:
        return content, weight_storage(content)
    say("storing the rounded kernels in the .tflite")
    return store_weights(content, entries)


def storage_lines(stored, size, weight_bits) -> list[str]:
    """The report's lines on the weights as stored: counts by type and operator, and every
    weight the rounding did not store on its grid, with the reason."""
    counts = collections.Counter(w.storage for w in stored if w.storage)
    by_op = collections.defaultdict(collections.Counter)
    for w in stored:
        by_op[w.storage][w.op] += 1
    parts = [f"{n} {storage} ({', '.join(f'{c} {op}' for op, c in by_op[storage].items())})"
             for storage, n in counts.items()]
    lines = [f"weights stored: {'; '.join(parts)}; file {size:,} bytes"]
    for w in stored:
        if not w.rounded and (w.layer or weight_bits == 4):
            lines.append(f"  {w.layer or w.op}: {w.storage or 'as converted'}, {w.reason}")
    return lines
