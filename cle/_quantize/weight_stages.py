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
from cle._quantize.rounding import reads_inputs, round_model
from cle._tflite.weight_store import store_weights, weight_storage
from cle._transforms.bias_pass import TAPSUM_LAYERS

__all__ = ["DATA_DAMP_LOW_BITS", "SYNTHETIC_DAMP", "SYNTHETIC_SHRINK", "WIDE_SIZE_RATIO",
           "round_stage", "snap_stage", "store_stage", "unsnap"]

#: Below 8 bits: the share of the model's plain 8-bit ``.tflite`` the file may take. The
#: kernels whose 4-bit rounding to nearest adds the most noise to their own layer's output per
#: weight (measured in a first pass over the calibration inputs, real or synthetic: the first
#: blocks, depthwise kernels, the projections of inverted residual blocks) stay on 8-bit grids
#: until the file, estimated from above (:func:`cle._tflite.weight_store.int8_file_bytes`),
#: reaches it; a 4-bit file alone takes a little over half the 8-bit one, so this spends what
#: remains of the size goal of docs/quantize_w4.md. With data the rounding alone leaves the
#: 4-bit error of some layers too large for the rest of the network (measured there); without
#: data more so.
WIDE_SIZE_RATIO = 0.595
#: With data, below 8 bits: the rounding's relative ridge on the calibration inputs' statistics
#: (GPTQ's and AdaRound's; thirty times :data:`cle._math.rounding.DAMP`). A layer of the late
#: blocks sees its inputs on few positions per crop and a classifier head on one: the rounding
#: then fits the calibration inputs better than it fits others. Chosen from a sweep on
#: MobileNetV2 and EfficientNet-Lite1 with 64 crops (docs/quantize_w4.md): with GPTQ on the
#: whole 4-bit grid at least as close as a tenth in both figures on both networks; with
#: AdaRound neither a tenth nor 1 is closer in both figures on both networks.
DATA_DAMP_LOW_BITS = 0.3
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
    as they were, ``{layer's scoped name: {attribute: kernel}}`` (what :func:`unsnap`
    restores; the scope tells apart layers of one name in two nested models)."""
    say("putting the kernels on their 8-bit grids (tap sums kept)")
    done: dict = {}
    for call in graph_view(equalized).first_calls():
        layer = call.layer
        if type(layer) not in TAPSUM_LAYERS:
            continue
        for attr, axis, depthwise in kernel_specs(layer):
            var = getattr(layer, attr)
            kernel = read_weight(var)
            if int(np.prod(kernel.shape[:-2])) > 1:
                var.assign(round_kernel(kernel, 8, axis if opts.per_channel else None,
                                        depthwise, "tapsum").astype(kernel.dtype))
                done.setdefault(call.name, {})[attr] = kernel.copy()
    return done


def unsnap(model, snapped: dict) -> None:
    """Give the layers of ``model`` the float kernels :func:`snap_stage` returned."""
    layers = {c.name: c.layer for c in graph_view(model).first_calls()}  # nested ones too,
    for name, kernels in snapped.items():  # by scope and name, as snap_stage found them
        layer = layers[name]
        for attr, kernel in kernels.items():
            getattr(layer, attr).assign(kernel)


def round_stage(equalized, x_cal, opts, source, say):
    """``(RoundingReport, [LayerWeights])``, or ``(None, None)`` when the converter's own
    rounding is the one asked for (8 bits, to nearest). Rounds ``equalized`` in place, on
    ``x_cal`` (a :class:`cle._core.inputs.ModelInputs`: the calibration inputs, real or
    synthetic; never the check's). Below 8 bits the kernels adding the most noise per weight
    stay on 8-bit grids within :data:`WIDE_SIZE_RATIO` of the 8-bit file and the statistics
    are damped more (:data:`DATA_DAMP_LOW_BITS`); without data they are damped more at any
    width (:data:`SYNTHETIC_DAMP`) and the inputs' correlations shrunk
    (:data:`SYNTHETIC_SHRINK`)."""
    if not opts.rounds:
        return None, None
    method, bits = opts.rounding_method, opts.weight_bits
    free_bias = opts.bias_correction != "none"
    say(f"rounding the kernels onto their {bits}-bit grids ({method}"
        + (f", on {len(x_cal)} {source}" if reads_inputs(method, free_bias) else "") + ")")
    synthetic = not opts.has_data
    return round_model(equalized, list(x_cal.arrays), bits=bits, per_channel=opts.per_channel,
                       method=method, free_bias=free_bias, source=source,
                       say=say, size_ratio=WIDE_SIZE_RATIO,
                       damp=(SYNTHETIC_DAMP if synthetic else
                             DATA_DAMP_LOW_BITS if bits < 8 else DAMP),
                       shrink=SYNTHETIC_SHRINK if synthetic else 0.0,
                       per_tensor_kinds=(opts.target_spec.per_tensor_kinds(opts.per_channel)
                                         if bits < 8 else None))


def store_stage(content, entries, say, target=None):
    """``(content, [StoredWeight])``: the rounded kernels stored exactly (INT4 where the
    ``target``'s runtime runs it, :class:`cle._tflite.targets.Target`; LiteRT's rules when
    None), or, without a rounding stage, what the converter stored."""
    if entries is None:
        return content, weight_storage(content)
    say("storing the rounded kernels in the .tflite")
    return store_weights(content, entries, target)
