"""The weight stages of :func:`cle.quantization.quantize`: the rounding of the kernels (after
equalizing, before converting) and the storage of the rounded kernels in the ``.tflite``
(after converting): 4-bit weights (W4A8) and rounding chosen for the output, at 4 or 8 bits."""

from __future__ import annotations

from cle._math.rounding import DAMP
from cle._measure.weight_store import store_weights, weight_storage
from cle._quantize.rounding import round_model

__all__ = ["SYNTHETIC_DAMP", "SYNTHETIC_WIDE_SHARE", "round_stage", "store_stage"]

#: Without data, below 8 bits: the share of the rounded weights kept on 8-bit grids, the
#: smallest kernels first (depthwise 3x3, the first convolution, the early blocks: on
#: MobileNetV2 5 % of the weights, about 3 % more file than all 4-bit, well inside the 0.6x
#: of the 8-bit file); the synthetic inputs' statistics guess real inputs' correlations too
#: roughly for the 4-bit error of those layers to be undone downstream (docs/quantize_w4.md).
SYNTHETIC_WIDE_SHARE = 0.05
#: Without data: GPTQ's relative ridge on the synthetic inputs' statistics (ten times
#: :data:`cle._math.rounding.DAMP`: their correlations are trusted less than real data's).
SYNTHETIC_DAMP = 0.1


def round_stage(equalized, x_cal, opts, source, say):
    """``(RoundingReport, [LayerWeights])``, or ``(None, None)`` when the converter's own
    rounding is the one asked for (8 bits, to nearest). Rounds ``equalized`` in place, on
    ``x_cal`` (a :class:`cle._core.inputs.ModelInputs`: the calibration inputs, real or
    synthetic; never the check's). Without data, the smallest kernels stay on 8-bit grids
    (:data:`SYNTHETIC_WIDE_SHARE`) and GPTQ is damped more (:data:`SYNTHETIC_DAMP`)."""
    if not opts.rounds:
        return None, None
    method, bits = opts.rounding_method, opts.weight_bits
    say(f"rounding the kernels onto their {bits}-bit grids ({method}"
        + (f", on {len(x_cal)} {source}" if method != "nearest" else "") + ")")
    synthetic = not opts.has_data
    return round_model(equalized, list(x_cal.arrays), bits=bits, per_channel=opts.per_channel,
                       method=method, free_bias=opts.bias_correction != "none", source=source,
                       say=say, wide_share=SYNTHETIC_WIDE_SHARE if synthetic else 0.0,
                       damp=SYNTHETIC_DAMP if synthetic else DAMP)


def store_stage(content, entries, say):
    """``(content, [StoredWeight])``: the rounded kernels stored exactly (INT4 where LiteRT
    runs it), or, without a rounding stage, what the converter stored."""
    if entries is None:
        return content, weight_storage(content)
    say("storing the rounded kernels in the .tflite")
    return store_weights(content, entries)
