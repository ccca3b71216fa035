"""The implementation of :func:`cle.quantization.quantize` (the stages are documented in
:mod:`cle.quantization`)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import numpy as np

from cle._measure import calibration as _calibration
from cle._measure import synthetic as _synthetic
from cle._measure import tflite
from cle._measure import evaluation as Q
from cle._core.checks import check_model, check_single_io
from cle._core.inputs import check_calibration_data
from cle._measure.inference import TFLITE_BATCH, predict
from cle._quantize import weight_stages
from cle._transforms.equalize import equalize_model

__all__ = ["QuantizeReport", "quantize"]

#: The share of a tensor's values left outside its range on each side (``ranges="percentile"``).
TAIL = 1e-4
#: Share of the calibration data held out for the check (when at least 8 remain to calibrate).
HOLDOUT = 0.25
#: Synthetic inputs made without data: for calibration, and for the check.
SYNTHETIC_CALIBRATION, SYNTHETIC_CHECK = 32, 8
_RANGES = ("percentile", "minmax")
_BIAS_CORRECTION = ("auto", "empirical", "analytic", "none")


@dataclasses.dataclass
class QuantizeReport:
    """What :func:`quantize` did, and how close the INT8 model is to the float model.

    Attributes:
        target: the target: ``per_channel``, ``weight_bits``, ``activation_bits``,
            ``integer_io``, ``rounding`` (the method ``rounding="auto"`` resolved to).
        calibration: "data" (the inputs given) or "synthetic" (distilled from the model).
        n_calibration: inputs the activation ranges were calibrated on.
        check_inputs: what the check ran on ("held-out calibration data", "synthetic inputs",
            or "the calibration data" when too few were given to hold any out).
        n_check: how many.
        equalization: the :class:`cle.EqualizationReport` of the equalize stage.
        bias_correction: the bias correction run ("empirical", "analytic", "none", or
            "rounding": the rounding stage's, each rounded layer's bias taking its mean
            output error away).
        ranges: every activation tensor's calibrated and chosen range
            (:class:`cle._measure.tflite.TensorRange`); empty for 16-bit activations.
        top1_agreement: share of check inputs whose top-1 class is the float model's.
        sqnr_db: SQNR of the INT8 outputs against the float outputs, in dB.
        plain: with ``compare=True``, the same two figures for the float model converted
            straight (TF Lite's defaults, the same calibration inputs): what the user had.
        synthesis_loss: without data, the final BN-statistics loss of each synthetic batch.
        rounding: the :class:`cle._quantize.rounding.RoundingReport` of the rounding stage
            (None when the converter rounds: 8 bits, ``rounding="nearest"``).
        weights: how each weight tensor of the ``.tflite`` is stored and why
            (:class:`cle._measure.weight_store.StoredWeight`).
        size: the ``.tflite``'s size in bytes.
        seconds: wall time of each stage.
    """

    target: dict
    calibration: str
    n_calibration: int
    check_inputs: str
    n_check: int
    equalization: Any
    bias_correction: str = "none"
    ranges: list = dataclasses.field(default_factory=list)
    top1_agreement: float = float("nan")
    sqnr_db: float = float("nan")
    plain: dict | None = None
    synthesis_loss: list | None = None
    rounding: Any = None
    weights: list = dataclasses.field(default_factory=list)
    size: int = 0
    seconds: dict = dataclasses.field(default_factory=dict)

    def _range_lines(self):
        narrowed = [r for r in self.ranges if r.how == "percentile"]
        if not self.ranges:
            return ["activation ranges: the converter's (16-bit activations)"]
        if not narrowed:
            return [f"activation ranges: min/max of {len(self.ranges)} tensors"]
        ratios = np.array([(r.hi - r.lo) / max(r.calibrated[1] - r.calibrated[0], 1e-30)
                           for r in narrowed])
        return [f"activation ranges: {len(narrowed)} of {len(self.ranges)} tensors set to "
                f"their 1e-4 tails (width {np.median(ratios):.2f}× the min/max range at the "
                f"median, {ratios.min():.2f}× at the narrowest); the output, the logits "
                "before a softmax keep min/max"
                + (" (the input: the stated input range)"
                   if any(r.how == "input range" for r in self.ranges) else "")]

    def summary(self) -> str:
        """The report on a few lines: each stage, what changed and why, and the check."""
        t = self.target
        lines = [
            f"target: INT{t['weight_bits']} weights "
            f"{'per-channel' if t['per_channel'] else 'per-tensor'}, "
            f"{t['activation_bits']}-bit activations, "
            f"{'int8' if t['integer_io'] else 'float32'} input/output",
            f"calibration: {self.n_calibration} "
            + ("inputs given" if self.calibration == "data" else
               "synthetic inputs distilled from the model's batch-norm statistics"),
        ]
        lines += ["equalize: " + line for line in self.equalization.summary().splitlines()]
        corrected = [r for r in self.equalization.bias_corrections if r.corrected]
        if self.bias_correction == "rounding":
            lines.append("bias correction (rounding): each rounded layer's bias takes its mean "
                         "output error away")
        else:
            lines.append(f"bias correction ({self.bias_correction}): {len(corrected)} layers "
                         f"corrected, {len(self.equalization.bias_corrections) - len(corrected)}"
                         " left (see the equalization report for why)")
        if self.rounding is not None:
            lines += self.rounding.summary_lines()
        lines += self._range_lines()
        lines += weight_stages.storage_lines(self.weights, self.size, t["weight_bits"])
        lines.append(f"check on {self.n_check} {self.check_inputs}: top-1 agreement "
                     f"{self.top1_agreement:.1%}, SQNR {self.sqnr_db:.2f} dB")
        if self.plain is not None:
            lines.append(f"  the float model converted straight: top-1 agreement "
                         f"{self.plain['top1_agreement']:.1%}, SQNR {self.plain['sqnr_db']:.2f} dB")
        return "\n".join(lines)

    __str__ = summary

    def to_dict(self) -> dict:
        """A JSON-ready dict (what ``cle quantize --report`` writes)."""
        return {
            "target": dict(self.target),
            "calibration": self.calibration,
            "bias_correction": self.bias_correction,
            "n_calibration": self.n_calibration,
            "check": {"inputs": self.check_inputs, "n": self.n_check,
                      "top1_agreement": self.top1_agreement, "sqnr_db": self.sqnr_db},
            "plain_conversion": self.plain,
            "synthesis_loss": self.synthesis_loss,
            "ranges": [{"tensor": r.name, "calibrated": list(r.calibrated),
                        "chosen": [r.lo, r.hi], "how": r.how} for r in self.ranges],
            "equalization": self.equalization.to_dict(),
            "rounding": None if self.rounding is None else self.rounding.to_dict(),
            "weights": [w.to_dict() for w in self.weights],
            "size": self.size,
            "seconds": dict(self.seconds),
        }


def _check_options(per_channel, weight_bits, activation_bits, integer_io, bias_correction,
                   ranges, compare, input_range):
    for name, value in (("per_channel", per_channel), ("integer_io", integer_io),
                        ("compare", compare)):
        if not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"`{name}` must be True or False. Received: {name}={value!r}")
    if activation_bits not in (8, 16) or isinstance(activation_bits, bool):
        raise ValueError("TF Lite's converter quantizes activations to 8 or 16 bits (16x8 "
                         f"mode). Received: activation_bits={activation_bits!r}")
    if activation_bits == 16 and not per_channel:
        raise ValueError("TF Lite's 16x8 mode quantizes weights per channel. Received: "
                         "activation_bits=16 with per_channel=False")
    if bias_correction not in _BIAS_CORRECTION:
        raise ValueError(f"`bias_correction` must be one of {_BIAS_CORRECTION}. Received: "
                         f"bias_correction={bias_correction!r}")
    if ranges not in _RANGES:
        raise ValueError(f"`ranges` must be one of {_RANGES}. Received: ranges={ranges!r}")
    if input_range is not None:
        try:
            lo, hi = (float(v) for v in input_range)
        except (TypeError, ValueError):
            raise ValueError("`input_range` must be None or (low, high). Received: "
                             f"input_range={input_range!r}") from None
        if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
            raise ValueError(f"`input_range` must be finite with low < high. Received: "
                             f"input_range={input_range!r}")
        return lo, hi
    return None


def quantize(model, calibration_data=None, *, per_channel: bool = True, weight_bits: int = 8,
             activation_bits: int = 8, integer_io: bool = False,
             bias_correction: str = "auto", ranges: str = "percentile",
             input_range=None, compare: bool = False, seed: int = 0,
             rounding: str = "auto",
             progress: Callable[[str], Any] | None = None) -> tuple[bytes, QuantizeReport]:
    """A full-integer TF Lite model of ``model`` (8-bit activations and 8- or 4-bit weights),
    as close to it as this library can make it.

    Args:
        model: a Functional or Sequential ``keras.Model`` with one input and one output; it is
            not modified.
        calibration_data: model inputs, preprocessed as the model expects: an array
            ``(N, *input_shape)``, an iterable of batches or a ``tf.data.Dataset``
            (:func:`cle.load_calibration` reads ``.npy``/``.npz`` files and image folders).
            A quarter is held out for the check when at least 8 inputs remain to calibrate on.
            None: synthetic inputs are distilled from the model's BN statistics.
        per_channel: one weight scale per output channel (TF Lite's default) or, with False,
            one per tensor; the scaling is chosen for it.
        weight_bits: 8, or 4: INT4 weights (W4A8) for every Conv2D, DepthwiseConv2D and Dense
            layer (packed two per byte in the ``.tflite``, where LiteRT runs them; the
            report's ``weights`` says per layer what was stored how and why a layer stays
            8-bit).
        activation_bits: 8, or 16 for TF Lite's 16x8 mode (per-channel weights only).
        integer_io: int8 (int16 in 16x8 mode) model input and output instead of float32.
        bias_correction: "auto" (default): empirical with data, analytic without; or
            "empirical" (needs data), "analytic", "none".
        ranges: "percentile" (default): each activation tensor's range holds all but a
            :data:`TAIL` share of its values on each side; "minmax": the converter's own.
        input_range: ``(low, high)`` of the model's inputs (e.g. ``(-1, 1)`` for the ``tf``
            preprocessing); without data, synthetic inputs stay in it and the input tensor
            gets it as its range. Ignored with data.
        compare: also convert the float model straight (TF Lite's defaults, the same
            calibration inputs) and check it the same way: the report then says whether
            this INT8 model is closer to the float model than what the converter alone gives.
        seed: seed of the synthetic inputs.
        rounding: how kernels are rounded onto their grid: "nearest" (what TF Lite's
            converter does), "gptq" (layer by layer for the layer's output on the
            calibration inputs, or without data on the synthetic ones; each layer's bias
            takes its mean output error away), "adaround" (the same aim, learned; slower), or
            "auto" (default): "gptq" at 4 bits, "nearest" at 8 (chosen by measurement:
            docs/quantize_w4.md).
        progress: optional ``callable(str)`` told about each stage.

    Returns:
        ``(tflite_bytes, report)``: the ``.tflite`` flatbuffer and a :class:`QuantizeReport`.

    Raises:
        TypeError: ``model`` is not a ``keras.Model``.
        ValueError: an option out of range, calibration data that does not fit the model's
            input (one line naming what the model expects and what was received), a model
            with several inputs or outputs, or a model without batch norms and without data.
        RuntimeError: the PyTorch backend (TF Lite's converter cannot read its models).

    Example:
        >>> content, report = cle.quantize(model, x_calibration)
        >>> print(report.summary())
    """
    clock = time.perf_counter
    say = progress if progress is not None else (lambda message: None)
    check_model(model)
    check_single_io(model, "quantize")
    input_range = _check_options(per_channel, weight_bits, activation_bits, integer_io,
                                 bias_correction, ranges, compare, input_range)
    method = weight_stages.check_weight_options(weight_bits, activation_bits, rounding,
                                                bias_correction)
    tflite.check_tflite_backend("cle.quantize")
    from cle._core.backend import check_runnable

    check_runnable(model, "cle.quantize")
    x = None
    if calibration_data is not None:
        x = check_calibration_data(model, calibration_data)
    elif bias_correction == "empirical":
        raise ValueError("bias_correction='empirical' needs calibration_data. Received: "
                         "calibration_data=None")
    seconds: dict[str, float] = {}

    # Calibration and check inputs.
    x_cal, x_check, check_inputs, loss = _calibration_inputs(x, model, input_range, seed, say,
                                                             seconds)

    # Equalize, for the target, with bias correction.
    mode = bias_correction if bias_correction != "auto" else (
        "empirical" if x is not None else "analytic")
    mode = weight_stages.equalize_bias_mode(method, mode)
    start = clock()
    say(f"equalizing (cross-layer scaling for {'per-channel' if per_channel else 'per-tensor'} "
        f"INT{weight_bits}, {mode} bias correction)")
    with_data = mode == "empirical" or x is not None
    equalized, eq_report = equalize_model(
        model, return_report=True, per_channel_weights=per_channel, weight_bits=weight_bits,
        activation_bits=activation_bits, bias_correction=mode,
        activation_ranges="calibration" if with_data else "bn",
        calibration_data=x_cal if with_data else None)
    seconds["equalize"] = clock() - start

    # Rounding, for the output.
    start = clock()
    rounded, entries = weight_stages.round_stage(
        equalized, x_cal, weight_bits, per_channel, method, bias_correction,
        "calibration inputs" if x is not None else "synthetic inputs", say)
    if rounded is not None:
        seconds["rounding"] = clock() - start
        if method != "nearest" and bias_correction != "none":
            mode = "rounding"

    # Ranges and conversion.
    start = clock()
    content, tensor_ranges = _convert(equalized, x_cal, per_channel, activation_bits, integer_io,
                                      ranges, input_range if x is None else None, say)
    content, stored = weight_stages.store_stage(content, entries, say)
    seconds["convert"] = clock() - start

    # Check.
    start = clock()
    say(f"checking the quantized model on {len(x_check)} {check_inputs}")
    reference = predict(model, x_check)
    y = Q.run_tflite(content, x_check, batch_size=TFLITE_BATCH)
    seconds["check"] = clock() - start
    plain = None
    if compare:
        start = clock()
        plain = _compare(model, x_cal, x_check, reference, per_channel, activation_bits, say)
        seconds["compare"] = clock() - start
    report = QuantizeReport(
        target={"per_channel": bool(per_channel), "weight_bits": int(weight_bits),
                "activation_bits": int(activation_bits), "integer_io": bool(integer_io),
                "rounding": method},
        calibration="data" if x is not None else "synthetic",
        n_calibration=len(x_cal), check_inputs=check_inputs, n_check=len(x_check),
        equalization=eq_report, bias_correction=mode, ranges=tensor_ranges,
        top1_agreement=Q.top1_agreement(reference, y), sqnr_db=Q.sqnr_db(reference, y),
        plain=plain, synthesis_loss=loss, rounding=rounded, weights=stored, size=len(content),
        seconds=seconds)
    return content, report


def _calibration_inputs(x, model, input_range, seed, say, seconds):
    """``(x_cal, x_check, check_inputs, synthesis_loss)``: the data less a held-out part for
    the check, or without data synthetic inputs distilled from the model's BN statistics."""
    if x is not None:
        x_cal, x_check = _calibration.split_holdout(x, HOLDOUT)
        if x_check is None:
            return x_cal, x_cal, "the calibration data", None
        return x_cal, x_check, "held-out calibration data", None
    start = time.perf_counter()
    say(f"no calibration data: distilling {SYNTHETIC_CALIBRATION + SYNTHETIC_CHECK} "
        "synthetic inputs from the model's batch-norm statistics")
    xs, loss = _synthetic.distill(model, SYNTHETIC_CALIBRATION + SYNTHETIC_CHECK,
                                  input_range=input_range, seed=seed, progress=say)
    seconds["synthesize"] = time.perf_counter() - start
    return xs[:SYNTHETIC_CALIBRATION], xs[SYNTHETIC_CALIBRATION:], "synthetic inputs", loss


def _convert(equalized, x_cal, per_channel, activation_bits, integer_io, ranges, input_range,
             say):
    """``(tflite bytes, tensor ranges)``: the converter's 16x8 mode, or its calibrate step,
    the chosen ranges written in, and its quantize step."""
    if activation_bits == 16:
        say(f"converting (TF Lite 16x8, calibration on {len(x_cal)} inputs)")
        return tflite.convert_int16(equalized, x_cal, integer_io=integer_io), []
    say(f"calibrating activation ranges on {len(x_cal)} inputs")
    calibrated = tflite.calibrate(equalized, x_cal)
    tensor_ranges = tflite.ranges_of(calibrated)
    if ranges == "percentile":
        _choose_percentile_ranges(calibrated, x_cal, tensor_ranges, input_range, integer_io, say)
        calibrated = tflite.with_ranges(calibrated, tensor_ranges)
    say("quantizing")
    return tflite.quantize_calibrated(calibrated, per_channel=per_channel,
                                      integer_io=integer_io), tensor_ranges


def _compare(model, x_cal, x_check, reference, per_channel, activation_bits, say):
    """The check's figures for the float model converted straight (TF Lite's defaults)."""
    say("converting the float model straight, for comparison")
    straight = (tflite.convert_int16(model, x_cal) if activation_bits == 16 else
                Q.convert_to_tflite_int8(model, x_cal, per_channel=per_channel))
    y_plain = Q.run_tflite(straight, x_check, batch_size=TFLITE_BATCH)
    return {"top1_agreement": Q.top1_agreement(reference, y_plain),
            "sqnr_db": Q.sqnr_db(reference, y_plain)}


#: A tail range narrower than this share of the min/max range keeps min/max (a tensor that is
#: almost always 0, e.g. a rarely firing ReLU, would otherwise get a range of width 0).
MIN_WIDTH = 1e-2


def _choose_percentile_ranges(calibrated, x, tensor_ranges, input_range, integer_io, say):
    """Set each tensor's ``lo``/``hi`` to its ``TAIL`` quantiles on ``x``. Kept at min/max: the
    tensors that decide the output's top class (the output, and the logits before a softmax;
    :func:`cle._measure.tflite.protected_indices`), the input tensor with ``integer_io`` (its range is
    the int8 input's scale: real extremes must not clip); without data the input tensor takes
    ``input_range`` when given; and a tensor whose tail range would be narrower than
    :data:`MIN_WIDTH` of its min/max range. Every range includes 0, as the converter's do."""
    say(f"measuring {len(tensor_ranges)} activation tensors")
    values = tflite.observe(calibrated, x, [r.index for r in tensor_ranges])
    protected, inputs = tflite.protected_indices(calibrated)
    for r in tensor_ranges:
        if r.index in inputs and input_range is not None:
            r.lo, r.hi, r.how = min(input_range[0], 0.0), max(input_range[1], 0.0), "input range"
            continue
        if r.index in inputs and integer_io:
            continue
        if r.index in protected:
            continue  # min/max: the largest outputs decide the top-1 class
        lo, hi = np.quantile(values[r.index], [TAIL, 1.0 - TAIL])
        # Within the calibrated range (the interpreter's sums may round differently), with 0.
        lo = min(max(float(lo), r.calibrated[0]), 0.0)
        hi = max(min(float(hi), r.calibrated[1]), 0.0)
        if hi - lo < MIN_WIDTH * (r.calibrated[1] - r.calibrated[0]):
            r.how = "min/max (sparse)"
            continue
        r.lo, r.hi, r.how = lo, hi, "percentile"


def load_calibration(path, model, preprocessing: str | None = None,
                     limit: int | None = None) -> np.ndarray:
    """Calibration inputs for ``model`` from a ``.npy``/``.npz`` file or a folder of images.

    A folder's images are resized (shorter side) and center-cropped to the model's input
    size, then preprocessed with ``preprocessing``: ``"tf"`` ([−1, 1]), ``"torch"`` (ImageNet
    mean/std), ``"caffe"`` (BGR minus the ImageNet mean), ``"raw"`` (0..255) or
    ``"module:function"``.

    Args:
        path: a ``.npy`` file, a ``.npz`` file (one array, or one named ``x``/``inputs``),
            or a folder of images.
        model: the ``keras.Model`` the inputs are for.
        preprocessing: for a folder of images (required there; refused for arrays).
        limit: read at most this many images.

    Returns:
        A float32 array ``(N, *input_shape)``.

    Raises:
        ValueError: one line naming what was expected and what was received.
    """
    return _calibration.load_calibration(path, model, preprocessing, limit)


def input_range_of(preprocessing: str):
    """The input range a named preprocessing gives to 0..255 images, or None."""
    if preprocessing not in _calibration.PREPROCESSING:
        return None
    fn = _calibration.PREPROCESSING[preprocessing]
    corners = fn(np.array([[[[0.0, 0.0, 0.0]], [[255.0, 255.0, 255.0]]]], np.float32))
    return float(corners.min()), float(corners.max())

