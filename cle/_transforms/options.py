"""The options of :func:`cle.equalize_model`, checked once (the checks are shared with
``CrossLayerScaling.scale_model``; the command line checks its flags before importing the
library)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from cle._math import noise

__all__ = ["BIAS_CORRECTIONS", "EqualizeOptions", "HBF_MODES", "OBJECTIVES", "RELU6_MODES",
           "check_choice", "quant_target"]

RELU6_MODES = ("bound", "replace", "keep")
HBF_MODES = ("unpadded", "all", "none")
OBJECTIVES = ("quantized", "weights")
BIAS_CORRECTIONS = ("none", "analytic", "empirical")
ACTIVATION_RANGES = ("bn", "calibration")
#: How the weights bias correction corrects for are rounded onto their grid
#: (:func:`cle._math.kernel_quant.round_kernel`).
WEIGHT_ROUNDINGS = ("nearest", "tapsum")


def check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}. Received: {name}={value!r}")


def quant_target(weight_bits, per_channel_weights, activation_bits) -> noise.QuantTarget:
    """The INT8 target, checked: integer bits in [2, 16], a bool for per-channel weights."""
    for name, bits in (("weight_bits", weight_bits), ("activation_bits", activation_bits)):
        if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 2 <= bits <= 16:
            raise ValueError(f"{name} must be an integer in [2, 16]. Received: {name}={bits!r}")
    if not isinstance(per_channel_weights, (bool, np.bool_)):
        raise ValueError(
            f"per_channel_weights must be a bool. Received: per_channel_weights={per_channel_weights!r}")
    return noise.QuantTarget(bool(per_channel_weights), int(weight_bits), int(activation_bits))


@dataclasses.dataclass(frozen=True)
class EqualizeOptions:
    """Every option of :func:`cle.equalize_model` but the model, the data and ``progress``,
    validated when made (``ValueError`` naming the option), in the order the checks ran before.

    ``has_data`` says whether calibration data comes with the options: it is needed for, and
    only for, ``bias_correction="empirical"`` or ``activation_ranges="calibration"``.
    """

    relu6: str = "bound"
    high_bias_fold: str = "none"
    margin: float = 3.0
    bias_correction: str = "none"
    weight_bits: int = 8
    per_channel_weights: bool = True
    objective: str = "quantized"
    activation_bits: int = 8
    activation_ranges: str = "bn"
    weight_rounding: str = "nearest"
    #: softplus, mish, log-sigmoid and SELU, Normalizations of widely spread scales, and
    #: one-hot CategoryEncodings, put in a form 8-bit tensors can hold
    #: (:mod:`cle._transforms.stable`): for a model that will be quantized
    #: (:func:`cle.quantize`); exact, but new layer classes
    stable_activations: bool = False
    has_data: bool = False
    calibration_type: str = dataclasses.field(default="None", compare=False, repr=False)

    def __post_init__(self):
        check_choice("relu6", self.relu6, RELU6_MODES)
        check_choice("high_bias_fold", self.high_bias_fold, HBF_MODES)
        check_choice("bias_correction", self.bias_correction, BIAS_CORRECTIONS)
        check_choice("activation_ranges", self.activation_ranges, ACTIVATION_RANGES)
        check_choice("weight_rounding", self.weight_rounding, WEIGHT_ROUNDINGS)
        if self.wants_data != self.has_data:
            raise ValueError(
                "calibration_data is needed for, and only for, bias_correction='empirical' or "
                f"activation_ranges='calibration'. Received: bias_correction="
                f"{self.bias_correction!r}, activation_ranges={self.activation_ranges!r}, "
                f"calibration_data={self.calibration_type}"
            )
        if not float(self.margin) >= 0:
            raise ValueError(f"margin must be >= 0. Received: margin={self.margin!r}")
        check_choice("objective", self.objective, OBJECTIVES)
        if self.activation_ranges == "calibration" and self.objective != "quantized":
            raise ValueError(
                "activation_ranges='calibration' is for objective='quantized' (the measured "
                "ranges choose its scales). Received: activation_ranges='calibration', "
                f"objective={self.objective!r}")
        self.target  # checks the bits and per_channel_weights

    @classmethod
    def from_call(cls, calibration_data: Any = None, **options) -> EqualizeOptions:
        """The options of one ``equalize_model`` call, with its calibration data's presence."""
        return cls(**options, has_data=calibration_data is not None,
                   calibration_type="None" if calibration_data is None
                   else type(calibration_data).__name__)

    @property
    def wants_data(self) -> bool:
        return self.bias_correction == "empirical" or self.activation_ranges == "calibration"

    @property
    def target(self) -> noise.QuantTarget:
        return quant_target(self.weight_bits, self.per_channel_weights, self.activation_bits)

    @property
    def data_use(self) -> str:
        """What the calibration data is for, as the option that asks for it."""
        return ("bias_correction='empirical'" if self.bias_correction == "empirical"
                else "activation_ranges='calibration'")
