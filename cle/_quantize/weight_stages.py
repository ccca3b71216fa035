"""The weight stages of :func:`cle.quantization.quantize`: the rounding of the kernels (after
equalizing, before converting) and the storage of the rounded kernels in the ``.tflite``
(after converting): 4-bit weights (W4A8) and rounding chosen for the output, at 4 or 8 bits."""

from __future__ import annotations

from cle._measure.weight_store import store_weights, weight_storage
from cle._quantize.rounding import round_model

__all__ = ["round_stage", "store_stage"]


def round_stage(equalized, x_cal, opts, source, say):
    """``(RoundingReport, [LayerWeights])``, or ``(None, None)`` when the converter's own
    rounding is the one asked for (8 bits, to nearest). Rounds ``equalized`` in place, on
    ``x_cal`` (a :class:`cle._core.inputs.ModelInputs`: the calibration inputs, real or
    synthetic; never the check's)."""
    if not opts.rounds:
        return None, None
    method, bits = opts.rounding_method, opts.weight_bits
    say(f"rounding the kernels onto their {bits}-bit grids ({method}"
        + (f", on {len(x_cal)} {source}" if method != "nearest" else "") + ")")
    return round_model(equalized, list(x_cal.arrays), bits=bits, per_channel=opts.per_channel,
                       method=method, free_bias=opts.bias_correction != "none", source=source,
                       say=say)


def store_stage(content, entries, say):
    """``(content, [StoredWeight])``: the rounded kernels stored exactly (INT4 where LiteRT
    runs it), or, without a rounding stage, what the converter stored."""
    if entries is None:
        return content, weight_storage(content)
    say("storing the rounded kernels in the .tflite")
    return store_weights(content, entries)
