"""The weight stages of :func:`cle.quantize`: the rounding of the kernels (after equalizing,
before converting) and the storage of the rounded kernels in the ``.tflite`` (after
converting): 4-bit weights (W4A8) and rounding chosen for the output, at 4 or 8 bits."""

from __future__ import annotations

import collections

from cle._measure.weight_store import store_weights, weight_storage
from cle._quantize.rounding import METHODS, round_model

__all__ = ["AUTO_ROUNDING", "ROUNDINGS", "WEIGHT_BITS", "check_weight_options",
           "equalize_bias_mode", "round_stage", "storage_lines", "store_stage"]

#: Weight bits :func:`cle.quantize` writes.
WEIGHT_BITS = (4, 8)
#: What ``rounding`` may be.
ROUNDINGS = ("auto",) + METHODS
#: The rounding ``"auto"`` takes at each weight width (chosen by measurement on the two real
#: networks: docs/quantize_w4.md).
AUTO_ROUNDING = {4: "gptq", 8: "nearest"}


def check_weight_options(weight_bits, activation_bits, rounding, bias_correction) -> str:
    """The rounding method the options ask for (``"auto"`` resolved); ``ValueError`` naming
    the option for a request that cannot be honoured."""
    if isinstance(weight_bits, bool) or weight_bits not in WEIGHT_BITS:
        raise ValueError("`weight_bits` must be 8 (INT8 weights) or 4 (INT4 weights, where "
                         f"LiteRT runs them). Received: weight_bits={weight_bits!r}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"`rounding` must be one of {ROUNDINGS}. Received: "
                         f"rounding={rounding!r}")
    if weight_bits == 4 and activation_bits != 8:
        raise ValueError("4-bit weights go with 8-bit activations (W4A8): TF Lite's 16x8 mode "
                         "has 8-bit weights. Received: weight_bits=4, "
                         f"activation_bits={activation_bits!r}")
    method = AUTO_ROUNDING[weight_bits] if rounding == "auto" else rounding
    if method != "nearest" and activation_bits == 16:
        raise ValueError(f"rounding={method!r} is for 8-bit activations (its integers are "
                         "written into the INT8 model; TF Lite's 16x8 mode is converted in one "
                         "step). Received: rounding="
                         f"{rounding!r}, activation_bits=16")
    if method != "nearest" and bias_correction in ("analytic", "empirical"):
        raise ValueError(f"rounding={method!r} sets the bias of every layer it rounds (the "
                         "bias takes the layer's mean output error away, on the calibration "
                         "inputs); use bias_correction='auto', or 'none' to leave biases as "
                         f"they are. Received: bias_correction={bias_correction!r}, "
                         f"rounding={rounding!r}")
    return method


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
