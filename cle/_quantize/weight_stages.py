"""The weight stages of :func:`cle.quantization.quantize`: the rounding of the kernels (after
equalizing, before converting) and the storage of the rounded kernels in the ``.tflite``
(after converting): 4-bit weights (W4A8) and rounding chosen for the output, at 4 or 8 bits;
or, for an 8-bit rounding TF Lite's converter keeps ("tapsum"), the kernels put on their grid
before converting (:func:`snap_stage`)."""

from __future__ import annotations

import numpy as np

from cle._core.graph import graph_view
from cle._core.layouts import kernel_specs, read_weight
from cle._math.kernel_quant import round_kernel
from cle._math.rounding import DAMP
from cle._measure.weight_store import store_weights, weight_storage
from cle._quantize.rounding import round_model
from cle._transforms.bias_pass import TAPSUM_LAYERS

__all__ = ["SYNTHETIC_DAMP", "SYNTHETIC_SHRINK", "SYNTHETIC_WIDE_BY", "SYNTHETIC_WIDE_SHARE",
           "round_stage", "snap_stage", "store_stage", "unsnap"]

#: Without data, below 8 bits: the share of the rounded weights kept on 8-bit grids (the
#: file grows by half a byte per such weight: with this share a W4A8 file of either real
#: network stays within 0.6x the plain W8A8 conversion's, the goal of docs/quantize_w4.md);
#: the synthetic inputs' statistics guess real inputs' correlations too roughly for the 4-bit
#: error of every layer to be undone downstream.
SYNTHETIC_WIDE_SHARE = 0.07
#: Without data: which kernels those are (:func:`cle._quantize.rounding.round_model`'s
#: ``wide_by``): those whose 4-bit rounding to nearest adds the most noise to their layer's
#: output per weight on the synthetic inputs (the projections of inverted residual blocks,
#: depthwise kernels, the first blocks), measured rather than guessed from their size.
SYNTHETIC_WIDE_BY = "noise"
#: Without data: GPTQ's relative ridge on the synthetic inputs' statistics (ten times
#: :data:`cle._math.rounding.DAMP`: their correlations are trusted less than real data's).
SYNTHETIC_DAMP = 0.1
#: Without data: the correlations between a layer's inputs on the synthetic inputs scaled by
#: ``1 − SYNTHETIC_SHRINK`` (their variances and means kept; :func:`cle._math.rounding.shrunk`):
#: the distillation matches each channel's BN statistics, not how channels move together.
SYNTHETIC_SHRINK = 0.3


def snap_stage(equalized, opts, say) -> dict:
    """For ``rounding="tapsum"`` (the caller's condition): every Conv2D and DepthwiseConv2D
    kernel of ``equalized`` (the pipeline's own copy) with more than one tap put on its 8-bit
    grid in place, each (input, output) channel pair's tap sum kept
    (:func:`cle._math.kernel_quant.round_kernel`: the grid TF Lite's converter will compute
    from the kernel, whose largest weight stays), so that the converter's rounding to nearest
    gives every weight back as it is. The bias
    correction of the equalize stage corrected for these kernels. Returns the float kernels
    as they were, ``{layer name: {attribute: kernel}}`` (what :func:`unsnap` restores)."""
    say("putting the kernels on their 8-bit grids (tap sums kept)")
    done: dict = {}
    for layer in {id(c.layer): c.layer for c in graph_view(equalized).calls}.values():
        if type(layer) not in TAPSUM_LAYERS:
            continue
        for attr, axis, depthwise in kernel_specs(layer):
            var = getattr(layer, attr)
            kernel = read_weight(var)
            if int(np.prod(kernel.shape[:-2])) > 1:
                var.assign(round_kernel(kernel, 8, axis if opts.per_channel else None,
                                        depthwise, "tapsum").astype(kernel.dtype))
                done.setdefault(layer.name, {})[attr] = kernel.copy()
    return done


def unsnap(model, snapped: dict) -> None:
    """Give the layers of ``model`` the float kernels :func:`snap_stage` returned."""
    for name, kernels in snapped.items():
        layer = model.get_layer(name)
        for attr, kernel in kernels.items():
            getattr(layer, attr).assign(kernel)


def round_stage(equalized, x_cal, opts, source, say):
    """``(RoundingReport, [LayerWeights])``, or ``(None, None)`` when the converter's own
    rounding is the one asked for (8 bits, to nearest). Rounds ``equalized`` in place, on
    ``x_cal`` (a :class:`cle._core.inputs.ModelInputs`: the calibration inputs, real or
    synthetic; never the check's). Without data, the kernels adding the most noise per weight
    stay on 8-bit grids (:data:`SYNTHETIC_WIDE_SHARE`, :data:`SYNTHETIC_WIDE_BY`), GPTQ is
    damped more (:data:`SYNTHETIC_DAMP`) and sees the inputs' correlations shrunk
    (:data:`SYNTHETIC_SHRINK`)."""
    if not opts.rounds:
        return None, None
    method, bits = opts.rounding_method, opts.weight_bits
    say(f"rounding the kernels onto their {bits}-bit grids ({method}"
        + (f", on {len(x_cal)} {source}" if method != "nearest" else "") + ")")
    synthetic = not opts.has_data
    return round_model(equalized, list(x_cal.arrays), bits=bits, per_channel=opts.per_channel,
                       method=method, free_bias=opts.bias_correction != "none", source=source,
                       say=say, wide_share=SYNTHETIC_WIDE_SHARE if synthetic else 0.0,
                       wide_by=SYNTHETIC_WIDE_BY if synthetic else "size",
                       damp=SYNTHETIC_DAMP if synthetic else DAMP,
                       shrink=SYNTHETIC_SHRINK if synthetic else 0.0)


def store_stage(content, entries, say):
    """``(content, [StoredWeight])``: the rounded kernels stored exactly (INT4 where LiteRT
    runs it), or, without a rounding stage, what the converter stored."""
    if entries is None:
        return content, weight_storage(content)
    say("storing the rounded kernels in the .tflite")
    return store_weights(content, entries)
