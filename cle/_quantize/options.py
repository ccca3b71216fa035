"""The options of :func:`cle.quantization.quantize`, checked once, in one place, by the
library and the command line alike (``cle quantize`` builds them from its flags before the
model is loaded). Standard library only: the command line checks them before importing
NumPy or Keras."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

from cle._tflite.targets import DEFAULT_TARGET, EXTRA, target_named

__all__ = ["AUTO_ROUNDING", "AUTO_ROUNDING_LOW_BITS", "AUTO_ROUNDING_TAPSUM", "BIAS_CORRECTIONS",
           "GRID_ROUNDINGS", "METHODS", "OUTPUT_KINDS", "QuantizeOptions", "RANGES", "ROUNDINGS",
           "WEIGHT_BITS", "normalize_output_kinds", "resolve_rounding", "stage_rounds"]

#: "auto": each tensor at its tails ("percentile"), and with data the written file is the
#: closest of that build, the same with min/max ranges (and widened ones for a model with a
#: value output) and the plain conversion (:mod:`cle._quantize.choice`); "percentile": the
#: tails, always; "minmax": the converter's.
RANGES = ("auto", "percentile", "minmax")
BIAS_CORRECTIONS = ("auto", "empirical", "analytic", "none")
#: Weight bits :func:`cle.quantization.quantize` writes.
WEIGHT_BITS = (4, 8)
#: The rounding methods of the rounding stage (:data:`cle._math.rounding.METHODS`).
METHODS = ("nearest", "gptq", "adaround")
#: The 8-bit roundings TF Lite's converter keeps: "nearest" is its own; "tapsum" puts each
#: kernel on its grid before the converter (:func:`cle._math.kernel_quant.round_kernel`),
#: which then rounds every weight to itself.
GRID_ROUNDINGS = ("nearest", "tapsum")
#: What ``rounding`` may be.
ROUNDINGS = ("auto", "nearest", "tapsum", "gptq", "adaround")
#: The rounding ``"auto"`` takes at 8 bits with per-channel weights and calibration data (and
#: in 16x8 mode), chosen by measurement on the two real networks (docs/quantize_w4.md):
#: "nearest", TF Lite's own ("tapsum" gained on both of them but lost SQNR on a real network
#: outside this repository).
AUTO_ROUNDING = {8: "nearest"}
#: The same at 8 bits with per-tensor weights, or without data: "tapsum" (closer to the float
#: model in SQNR than "nearest", measured on both real networks and, without data, on two
#: real networks outside this repository; top-1 agreement level or better).
AUTO_ROUNDING_TAPSUM = {8: "tapsum"}
#: The rounding ``"auto"`` takes at 4 bits, with calibration data or without (keyed by
#: ``has_data``): with data "adaround", closer to the float model than "gptq" in SQNR on both
#: real networks (on three sets of crops) and on the two real networks outside this
#: repository, top-1 agreement mixed and within its noise between sets of crops; without
#: data "gptq", closer than "adaround" on the synthetic calibration inputs
#: (docs/quantize_w4.md).
AUTO_ROUNDING_LOW_BITS = {True: "adaround", False: "gptq"}


def stage_rounds(weight_bits: int, method: str) -> bool:
    """Whether the rounding stage runs for the resolved rounding ``method`` at ``weight_bits``:
    anything but an 8-bit rounding the converter keeps (:data:`GRID_ROUNDINGS`)."""
    return weight_bits != 8 or method not in GRID_ROUNDINGS


def resolve_rounding(rounding: str, weight_bits: int, per_channel: bool, has_data: bool = True,
                     activation_bits: int = 8) -> str:
    """The rounding that runs for ``rounding``: ``"auto"`` is, below 8 bits,
    :data:`AUTO_ROUNDING_LOW_BITS` of ``has_data``; at 8 bits :data:`AUTO_ROUNDING_TAPSUM`
    with per-tensor weights or, with 8-bit activations, without data, else
    :data:`AUTO_ROUNDING`; any other is itself."""
    if rounding != "auto":
        return rounding
    if weight_bits < 8:
        return AUTO_ROUNDING_LOW_BITS[bool(has_data)]
    tapsum = not per_channel or (not has_data and activation_bits == 8)
    return (AUTO_ROUNDING_TAPSUM if tapsum else AUTO_ROUNDING)[weight_bits]


def _is_bool(value) -> bool:
    return isinstance(value, bool) or type(value).__name__ == "bool_"


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not _is_bool(value)


def _pair(value, what):
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"`input_range` must be None, (low, high) or {{input name: (low, "
                         f"high)}}. Received: {what}={value!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"`input_range` must be finite with low < high. Received: "
                         f"{what}={value!r}")
    return lo, hi


#: What an output may be declared as (``output_kinds``, ``--output-kind NAME=KIND``).
OUTPUT_KINDS = ("classes", "values")


def normalize_output_kinds(value):
    """None, or ``{output name: "classes" | "values"}`` (names are checked against the model
    at :func:`cle.quantize`'s door)."""
    if value is None:
        return None
    if not isinstance(value, dict) or not value:
        raise ValueError("`output_kinds` must be None or a dict {output name: 'classes' or "
                         "'values'} naming at least one output. Received: "
                         f"output_kinds={value!r}")
    for name, kind in value.items():
        if not isinstance(name, str) or kind not in OUTPUT_KINDS:
            raise ValueError(f"`output_kinds` maps output names to one of {OUTPUT_KINDS}. "
                             f"Received: output_kinds[{name!r}]={kind!r}")
    return dict(value)


def normalize_input_range(value):
    """None, ``(lo, hi)`` for every input, or ``{name: (lo, hi)}`` (tuples of floats)."""
    if value is None:
        return None
    if isinstance(value, dict):
        if not value:
            raise ValueError("`input_range` as a dict must name at least one input. Received: "
                             "input_range={}")
        return {str(k): _pair(v, f"input_range[{k!r}]") for k, v in value.items()}
    return _pair(value, "input_range")


@dataclasses.dataclass(frozen=True)
class QuantizeOptions:
    """Every option of :func:`cle.quantization.quantize` but the model, the data and
    ``progress``, validated when made (``ValueError`` naming the option and echoing what was
    received). ``has_data`` says whether calibration data comes with them: it is needed for
    ``bias_correction="empirical"``, and ``input_range`` is for runs without it.
    """

    per_channel: bool = True
    weight_bits: int = 8
    activation_bits: int = 8
    integer_io: Any = None
    bias_correction: str = "auto"
    ranges: str = "auto"
    input_range: Any = None
    compare: bool = False
    seed: int = 0
    tune: bool = False
    rounding: str = "auto"
    output_kinds: Any = None
    has_data: bool = False
    target: str = DEFAULT_TARGET

    def __post_init__(self):
        spec = target_named(self.target)
        if self.integer_io is None:  # the target's own input/output type
            object.__setattr__(self, "integer_io", spec.integer_io)
        for name in ("per_channel", "integer_io", "compare", "tune"):
            if not _is_bool(getattr(self, name)):
                raise ValueError(f"`{name}` must be True or False. Received: "
                                 f"{name}={getattr(self, name)!r}")
        if not _is_int(self.activation_bits) or self.activation_bits not in (8, 16):
            raise ValueError("TF Lite's converter quantizes activations to 8 or 16 bits (16x8 "
                             f"mode). Received: activation_bits={self.activation_bits!r}")
        self._check_weights()
        self._check_target(spec)
        if self.activation_bits == 16 and not self.per_channel:
            raise ValueError("TF Lite's 16x8 mode quantizes weights per channel. Received: "
                             "activation_bits=16 with per_channel=False")
        if self.bias_correction not in BIAS_CORRECTIONS:
            raise ValueError(f"`bias_correction` must be one of {BIAS_CORRECTIONS}. Received: "
                             f"bias_correction={self.bias_correction!r}")
        if self.ranges not in RANGES:
            raise ValueError(f"`ranges` must be one of {RANGES}. Received: "
                             f"ranges={self.ranges!r}")
        if self.tune and (self.activation_bits != 8 or not self.tails):
            raise ValueError("tune=True chooses 8-bit activation ranges among those measured on "
                             "the calibration data (ranges='auto' or 'percentile'). Received: "
                             "tune=True "
                             f"with activation_bits={self.activation_bits!r}, "
                             f"ranges={self.ranges!r}")
        if self.tune and self.rounds:
            raise ValueError("tune=True requantizes the converter's INT8 model with TF Lite's "
                             "own rounding, which would undo the kernels the rounding stage "
                             "stored; it takes 8-bit weights rounded to nearest (or "
                             "'tapsum'). Received: "
                             f"tune=True with weight_bits={self.weight_bits!r}, "
                             f"rounding={self.rounding!r}")
        if not _is_int(self.seed):
            raise ValueError(f"`seed` must be an integer. Received: seed={self.seed!r}")
        object.__setattr__(self, "input_range", normalize_input_range(self.input_range))
        object.__setattr__(self, "output_kinds", normalize_output_kinds(self.output_kinds))
        if self.bias_correction == "empirical" and not self.has_data:
            raise ValueError("bias_correction='empirical' needs calibration_data. Received: "
                             "calibration_data=None")
        if self.input_range is not None and self.has_data:
            raise ValueError(
                "input_range is for quantizing without data (the input range of the synthetic "
                "inputs); with calibration_data the data sets it. Received: "
                f"input_range={self.input_range!r} with calibration_data")

    def _check_target(self, spec):
        """The options against what the target takes, and the target's tools installed."""
        if self.activation_bits not in spec.activation_bits:
            raise ValueError(f"target {spec.name!r} takes {spec.activation_bits[0]}-bit "
                             "activations only. Received: "
                             f"activation_bits={self.activation_bits!r}, "
                             f"target={spec.name!r}")
        missing = spec.missing()
        if missing:
            raise ValueError(f"target {spec.name!r} needs {', '.join(missing)}: install them "
                             f"with `pip install {EXTRA}`. Received: target={spec.name!r}")

    @property
    def target_spec(self):
        """The :class:`cle._tflite.targets.Target` of :attr:`target`."""
        return target_named(self.target)

    def _check_weights(self):
        """``weight_bits`` and ``rounding``, alone and against the activations and the bias
        correction."""
        if not _is_int(self.weight_bits) or self.weight_bits not in WEIGHT_BITS:
            raise ValueError("`weight_bits` must be 8 (INT8 weights) or 4 (INT4 weights, where "
                             f"LiteRT runs them). Received: weight_bits={self.weight_bits!r}")
        if not isinstance(self.rounding, str) or self.rounding not in ROUNDINGS:
            raise ValueError(f"`rounding` must be one of {ROUNDINGS}. Received: "
                             f"rounding={self.rounding!r}")
        if self.weight_bits == 4 and self.activation_bits != 8:
            raise ValueError("4-bit weights go with 8-bit activations (W4A8): TF Lite's 16x8 "
                             "mode has 8-bit weights. Received: weight_bits=4, "
                             f"activation_bits={self.activation_bits!r}")
        method = self.rounding_method
        if method == "tapsum" and self.weight_bits != 8:
            raise ValueError("rounding='tapsum' puts 8-bit kernels on their grid for TF Lite's "
                             "converter. Received: rounding='tapsum', "
                             f"weight_bits={self.weight_bits!r}")
        if self.rounds and self.bias_correction in ("analytic", "empirical"):
            raise ValueError(f"rounding={method!r} at {self.weight_bits} bits sets the bias of "
                             "every layer it rounds (the bias takes the layer's mean output "
                             "error away, on the calibration inputs); use "
                             "bias_correction='auto', or 'none' to leave biases as they are. "
                             f"Received: bias_correction={self.bias_correction!r}, "
                             f"rounding={self.rounding!r}, weight_bits={self.weight_bits!r}")
        if method in GRID_ROUNDINGS:
            return
        if self.activation_bits == 16:
            raise ValueError(f"rounding={method!r} is for 8-bit activations (its integers are "
                             "written into the INT8 model; TF Lite's 16x8 mode is converted in "
                             f"one step). Received: rounding={self.rounding!r}, "
                             "activation_bits=16")

    @property
    def tails(self) -> bool:
        """Whether the activation ranges start at each tensor's tails (``ranges`` "auto" or
        "percentile")."""
        return self.ranges != "minmax"

    @property
    def rounding_method(self) -> str:
        """The rounding that runs: ``"auto"`` is "adaround" at 4 bits with data, "gptq"
        without; at 8, "tapsum" with per-tensor weights or without data (8-bit activations),
        else "nearest"."""
        return resolve_rounding(self.rounding, self.weight_bits, self.per_channel,
                                self.has_data, self.activation_bits)

    @property
    def rounds(self) -> bool:
        """Whether the rounding stage runs (anything but an 8-bit rounding the converter
        keeps, :data:`GRID_ROUNDINGS`)."""
        return stage_rounds(self.weight_bits, self.rounding_method)

    @classmethod
    def from_call(cls, calibration_data=None, **options) -> QuantizeOptions:
        return cls(**options, has_data=calibration_data is not None)

    @property
    def bias_mode(self) -> str:
        """The bias correction that runs: "auto" is empirical with data, analytic without;
        "rounding" when the rounding stage sets the biases (whenever it runs, unless
        ``bias_correction="none"``: it knows the grid it rounds to, which below 8 bits is not
        the symmetric one the equalize stage's simulation uses)."""
        if self.rounds and self.bias_correction != "none":
            return "rounding"
        if self.bias_correction != "auto":
            return self.bias_correction
        return "empirical" if self.has_data else "analytic"

    @property
    def settings(self) -> dict:
        """What the file is made for, as the report gives it (``report.target``)."""
        return {"name": self.target, "per_channel": bool(self.per_channel),
                "weight_bits": int(self.weight_bits),
                "activation_bits": int(self.activation_bits),
                "integer_io": bool(self.integer_io), "rounding": self.rounding_method}
