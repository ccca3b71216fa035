"""The options of :func:`cle.quantize` about weights (``weight_bits``, ``rounding``), checked
without importing anything heavy: the command line checks its flags with them before it loads
Keras."""

from __future__ import annotations

__all__ = ["AUTO_ROUNDING", "METHODS", "ROUNDINGS", "WEIGHT_BITS", "check_weight_options"]

#: The rounding methods (:data:`cle._math.rounding.METHODS`).
METHODS = ("nearest", "gptq", "adaround")
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


