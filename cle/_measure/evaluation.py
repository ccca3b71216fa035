"""Weight-only fake quantization, TF Lite INT8 conversion and runs, and the metrics: the
implementation behind :mod:`cle.quantization` (its public face, where the API is documented)."""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Iterable

import keras
import numpy as np

from cle._core.backend import check_runnable
from cle._core.checks import check_model, check_single_io
from cle._core.graph import graph_view
from cle._core.inputs import ModelInputs
from cle._core.layouts import kernel_layers, kernel_specs
from cle._core.rebuild import rebuild
from cle._math.checks import check_bits, check_bool, check_inputs, check_pair
from cle._math.kernel_quant import quantize_kernel
from cle._measure.inference import predict
from cle._tflite import converter as _tflite
from cle._tflite.convertible import check_convertible, check_tflite_backend
from cle._tflite.runtime import (TFLITE_BATCH, input_name, interpreter,
                                 output_details_in_order, run_all)

__all__ = [
    "convert_to_tflite_int8",
    "evaluate",
    "fake_quantize_weights",
    "quantize_kernel",
    "run_tflite",
    "sqnr_db",
    "top1_agreement",
    "weight_range_spread",
]


# --------------------------------------------------------------------- weight quantization


def fake_quantize_weights(model, bits=8, per_channel=False) -> keras.Model:
    """A new model whose kernels hold their symmetric ``bits``-bit quantized values.

    Every kernel of a Conv1D/2D/3D, DepthwiseConv1D/2D, SeparableConv1D/2D (depthwise and
    pointwise kernels), Conv*Transpose or Dense layer (exact classes, as in
    :func:`cle._core.layouts.layout_of`; also inside nested sub-models and custom layers) is replaced
    by :func:`quantize_kernel` of itself: one scale per tensor, or with ``per_channel`` one per
    output channel (axis -1, or -2 for transposed convolutions; a depthwise kernel
    ``(*k, in, mult)`` per output channel ``c * mult + m``). Biases, batch norms and all other
    weights are copied unchanged, so quantize a model whose batch norms are folded
    (:func:`cle.fold_all_batch_norms`) to simulate what an INT8 runtime does.

    Args:
        model: a Functional or Sequential ``keras.Model``; it is not modified.
        bits: weight bit width, 2 to 32.
        per_channel: one scale per output channel instead of per tensor.

    Returns:
        A new model with the same layer names, input and output names.

    Raises:
        TypeError: ``model`` is not a ``keras.Model``.
        ValueError: bad ``bits``/``per_channel``, the model's graph cannot be read (subclassed
            model), a kernel is not finite, or a layer is already quantized by Keras or has
            LoRA enabled (its kernel is not a plain float variable).

    Example:
        >>> _, folded = cle.fold_all_batch_norms(model)
        >>> w8 = fake_quantize_weights(folded, bits=8, per_channel=False)
    """
    graph_view(model)  # TypeError / ValueError with a clear message for unusable models
    bits = check_bits(bits)
    per_channel = check_bool(per_channel, "per_channel")
    for layer in kernel_layers(model):
        if getattr(layer, "quantization_mode", None) or getattr(layer, "lora_enabled", False):
            what = (f"quantized ({layer.quantization_mode})"
                    if getattr(layer, "quantization_mode", None) else "LoRA-enabled")
            raise ValueError(
                f"Layer '{layer.name}' is {what}; its kernel is not a plain float variable and "
                f"can not be fake-quantized. Received: model '{model.name}'"
            )
    new_model, _ = rebuild(model)
    _quantize_kernels_into(new_model, new_model, bits, per_channel)
    return new_model


def _quantize_kernels_into(target, source, bits, per_channel):
    """Assign to every kernel of ``target`` the quantized kernel of ``source`` (the same
    architecture: ``target`` is ``source`` or a rebuilt copy of it)."""
    for dst, src in zip(kernel_layers(target), kernel_layers(source), strict=True):
        for attr, axis, depthwise in kernel_specs(dst):
            var = getattr(dst, attr)
            w = keras.ops.convert_to_numpy(getattr(src, attr))
            q = quantize_kernel(w, bits, axis if per_channel else None, depthwise)
            var.assign(keras.ops.convert_to_tensor(q, dtype=var.dtype))


def weight_range_spread(model) -> dict[str, float]:
    """How uneven each kernel's output-channel ranges are: largest / median range.

    A channel's range is ``max |W|`` over all axes but its output channel (a depthwise kernel's
    output channel is ``c * mult + m``). With one scale per tensor, a channel whose range is
    ``spread`` times below the largest gets only ``~1/spread`` of the grid; cross-layer
    equalization exists to bring this ratio down. Channels whose range is zero (dead channels)
    are left out of the median.

    Args:
        model: a ``keras.Model``; layers are found through nested sub-models and custom layers.

    Returns:
        ``{layer name: spread}`` in layer order for every layer with a layout
        (:func:`cle._core.layouts.layout_of`). A separable convolution has two kernels and gives two
        entries, ``"<name>/depthwise_kernel"`` and ``"<name>/pointwise_kernel"``. An all-zero
        kernel gives NaN. Layers quantized by Keras or with LoRA enabled are left out.

    Raises:
        TypeError: ``model`` is not a ``keras.Model``.
    """
    check_model(model)
    out: dict[str, float] = {}
    for layer in kernel_layers(model):
        if getattr(layer, "quantization_mode", None) or getattr(layer, "lora_enabled", False):
            continue
        specs = kernel_specs(layer)
        for attr, axis, depthwise in specs:
            w = np.abs(keras.ops.convert_to_numpy(getattr(layer, attr)).astype(np.float64))
            if depthwise:
                ranges = w.reshape(-1, w.shape[-2] * w.shape[-1]).max(axis=0)
            else:
                ranges = np.moveaxis(w, axis, -1).reshape(-1, w.shape[axis]).max(axis=0)
            nonzero = ranges[ranges > 0]
            key = layer.name if len(specs) == 1 else f"{layer.name}/{attr}"
            out[key] = float(ranges.max() / np.median(nonzero)) if nonzero.size else math.nan
    return out


# -------------------------------------------------------------------------------- metrics


def top1_agreement(reference, test) -> float:
    """Fraction of samples whose argmax over the last axis is the same in both arrays.

    Args:
        reference: array ``(..., classes)``, e.g. float logits.
        test: array of the same shape.

    Returns:
        A float in ``[0, 1]``.

    Raises:
        ValueError: shapes differ or the arrays are empty.

    Example:
        >>> top1_agreement([[0, 1], [1, 0]], [[0, 2], [0, 3]])
        0.5
    """
    ref, tst = check_pair(reference, test)
    return float(np.mean(ref.argmax(axis=-1) == tst.argmax(axis=-1)))


def sqnr_db(reference, test) -> float:
    """Signal-to-quantization-noise ratio ``10 log10(Σ ref² / Σ (ref − test)²)`` in dB.

    Args:
        reference: the float reference array.
        test: array of the same shape.

    Returns:
        The SQNR in dB; ``+inf`` when the arrays are identical.

    Raises:
        ValueError: shapes differ or the arrays are empty.

    Example:
        >>> sqnr_db([3.0, 4.0], [3.0, 4.5])  # 25 / 0.25
        20.0
    """
    ref, tst = check_pair(reference, test)
    noise = float(np.sum((ref - tst) ** 2))
    if noise == 0.0:
        return math.inf
    signal = float(np.sum(ref**2))
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


# --------------------------------------------------------------------------------- TF Lite


def convert_to_tflite_int8(model, representative_inputs, per_channel=True,
                           num_calibration=None, integer_io=False) -> bytes:
    """Full-integer INT8 TF Lite model, with float32 (default) or int8 input and output.

    TF Lite's converter with ``optimizations=[tf.lite.Optimize.DEFAULT]``,
    ``supported_ops=[TFLITE_BUILTINS_INT8]`` (every op in INT8, no float fallback) and a
    representative dataset that yields ``representative_inputs`` one sample at a time for
    calibrating the activation ranges. Input and output stay float32 (the model quantizes and
    dequantizes at its boundary), so :func:`run_tflite` is fed floats. Batch norms are folded by
    the converter. :class:`cle.ClippedReLU` converts to a ``RELU`` fused into the producing op
    followed by an INT8 ``MINIMUM``. The converter's logs are silenced.

    Args:
        model: a Functional or Sequential ``keras.Model`` (or a subclassed one, traced);
            it is not modified.
        representative_inputs: array ``(N, *input_shape)`` of model inputs (preprocessed as for
            ``model``) used for calibration; for a model with several inputs, a dict
            ``{input name: array}`` or a tuple of arrays (the forms ``cle.quantize`` takes).
        per_channel: one weight scale per output channel (TF Lite's default) or, with False,
            one per weight tensor (the converter's ``_experimental_disable_per_channel``).
        num_calibration: use only the first ``num_calibration`` samples (None: all).
        integer_io: int8 input and output tensors (for integer-only runtimes) instead of
            float32; :func:`run_tflite` (de)quantizes them.

    Returns:
        The ``.tflite`` flatbuffer as bytes.

    Raises:
        TypeError: ``model`` is not a ``keras.Model``.
        ValueError: a model whose graph cannot be read (an unbuilt Sequential one, or a
            subclassed one but with ``representative_inputs`` of its one input, an array: its
            ``call()`` is traced, :mod:`cle._core.traced`), ``representative_inputs`` is empty
            or does not match the model's inputs,
            or ``per_channel``/``num_calibration`` is invalid, or a layer the converter
            cannot write (:func:`cle._tflite.convertible.unconvertible_layers`, each named).
        Exception: whatever the TF Lite converter raises (e.g. an op without an INT8 builtin
            kernel); the converter's captured log is written to ``sys.stderr`` first.
        RuntimeError: the Keras backend is PyTorch, whose models TF Lite's converter cannot
            read (docs/backends.md); the message says how to convert on TensorFlow instead.

    Warns:
        UserWarning: on a backend other than TensorFlow, a model with a free size beyond the
            batch (a fully convolutional net on ``(None, None, 3)``) is written at the size of
            ``representative_inputs``, which the warning names (docs/backends.md).

    Example:
        >>> content = convert_to_tflite_int8(model, x[:64], per_channel=False)
        >>> y_int8 = run_tflite(content, x, batch_size=32)
    """
    check_model(model)
    per_channel = check_bool(per_channel, "per_channel")
    from cle._core.inputs import check_calibration_data, integer_inputs
    from cle._core.traced import functional_for

    # A subclassed model, traced with its one input's data (TF Lite's converter writes it);
    # without such data refused: it has no inputs to check the data against.
    model, _ = functional_for(model, representative_inputs if isinstance(
        representative_inputs, np.ndarray) else None)

    if len(model.inputs) == 1 and not integer_inputs(model):
        x = check_inputs(representative_inputs, model.inputs[0].shape[1:],
                         "representative_inputs")
    else:  # several inputs, or token ids (kept integers: the converter feeds them as they are)
        x = check_calibration_data(model, representative_inputs, "representative_inputs")
    if num_calibration is not None:
        if isinstance(num_calibration, bool) or not isinstance(
            num_calibration, (int, np.integer)
        ) or num_calibration < 1:
            raise ValueError(
                "`num_calibration` must be None or a positive integer. "
                f"Received: num_calibration={num_calibration!r}"
            )
        x = x[: int(num_calibration)]
    if len(x) == 0:
        raise ValueError(
            "`representative_inputs` must hold at least one sample. "
            f"Received: representative_inputs with {len(x)} samples"
        )
    check_convertible(model, "convert_to_tflite_int8")
    if fixed := _tflite.fixed_sizes(model, x):
        warnings.warn(f"convert_to_tflite_int8: {fixed} (docs/backends.md)", stacklevel=2)
    return _tflite.convert_int8(model, x, per_channel=per_channel, integer_io=integer_io)


def run_tflite(tflite_model: bytes, inputs, batch_size=1):
    """Run a TF Lite model on a batch of inputs.

    Uses LiteRT's interpreter (``ai_edge_litert.interpreter.Interpreter``) with its builtin
    kernels and without default delegates (no XNNPACK, so the INT8 kernels
    that TF Lite's quantization targets are the ones measured) on 2 threads. Inputs are fed
    ``batch_size`` samples per invocation (the input tensor is resized; samples never interact,
    but LiteRT may choose other kernels for another batch size, so outputs can differ in the
    last bits; a larger batch runs several times faster per image). INT8/UINT8 inputs and outputs are
    (de)quantized with the tensor's scale and zero point, so float arrays go in and out either
    way.

    Args:
        tflite_model: the flatbuffer, e.g. from :func:`convert_to_tflite_int8` or
            :func:`cle.quantize`.
        inputs: array ``(N, *input_shape)``; for a model with several inputs, a dict
            ``{input name: array}`` or a tuple of arrays in the Keras model's input order.
        batch_size: samples per invocation, >= 1.

    Returns:
        float32 array ``(N, *output_shape)``: the outputs of all samples, stacked; for a model
        with several outputs, a list of such arrays in the Keras model's output order.

    Raises:
        ValueError: ``batch_size`` is not a positive integer, or ``inputs`` does not match the
            model's inputs.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or (
        batch_size < 1
    ):
        raise ValueError(
            f"`batch_size` must be a positive integer. Received: batch_size={batch_size!r}"
        )
    interp = interpreter(tflite_model)
    x = _model_inputs(inputs, sorted(interp.get_input_details(), key=lambda d: d["index"]))
    if len(x) == 0:
        ys = [np.zeros((0,) + tuple(int(n) for n in d["shape"][1:]), np.float32)
              for d in output_details_in_order(interp)]
    else:
        ys = run_all(tflite_model, x, batch_size=int(batch_size), interp=interp)
    return ys if len(ys) > 1 else ys[0]


def _model_inputs(inputs, details) -> ModelInputs:
    """``inputs`` of :func:`run_tflite` (one array; a dict or a tuple for several inputs)
    checked against the flatbuffer's input ``details`` (in tensor order)."""
    names = [input_name(d["name"]) for d in details]
    shapes = [[int(n) for n in d.get("shape_signature", d["shape"])[1:]] for d in details]
    if len(names) == 1:
        x = check_inputs(inputs, shapes[0], "inputs")
        return ModelInputs((x,), tuple(names), (x.shape[1:],))
    if isinstance(inputs, dict):
        missing = sorted(set(names) - set(inputs))
        if missing or len(inputs) != len(names):
            raise ValueError(f"`inputs` as a dict needs one array per model input, keyed by "
                             f"{names}. Received: keys {sorted(inputs)}")
        arrays = [inputs[n] for n in names]
    elif isinstance(inputs, (tuple, list)) and len(inputs) == len(names):
        arrays = list(inputs)
    else:
        raise ValueError(f"`inputs` must be a dict or a tuple with one array per input "
                         f"{names}. Received: {type(inputs).__name__}")
    checked = [check_inputs(a, shape, f"inputs['{n}']")
               for a, shape, n in zip(arrays, shapes, names)]
    if len({len(a) for a in checked}) > 1:
        raise ValueError(f"`inputs` must hold as many samples of every input. Received: "
                         f"{[len(a) for a in checked]}")
    return ModelInputs(tuple(checked), tuple(names), tuple(a.shape[1:] for a in checked))


# ------------------------------------------------------------------------------- evaluate


def _checked_evaluate_args(model, inputs, reference_outputs, weight_bits, tflite, per_channel,
                           num_calibration, progress):
    """:func:`evaluate`'s arguments, checked: ``(x, ref, weight_bits, tflite, granularities)``."""
    check_model(model)
    check_single_io(model, "evaluate")
    x = check_inputs(inputs, model.inputs[0].shape[1:], "inputs")
    ref = np.asarray(reference_outputs, dtype=np.float64)
    if ref.ndim < 1 or ref.shape[0] != len(x) or len(x) == 0:
        raise ValueError(
            "`reference_outputs` must hold one output per input (and inputs must not be "
            f"empty). Received: inputs with shape {x.shape}, reference_outputs with shape "
            f"{ref.shape}"
        )
    weight_bits = check_bits(weight_bits, "weight_bits")
    tflite = check_bool(tflite, "tflite")
    if isinstance(per_channel, (bool, np.bool_)):
        per_channel = (per_channel,)
    if not isinstance(per_channel, Iterable) or isinstance(per_channel, str):
        raise ValueError(
            f"`per_channel` must be a tuple of bools. Received: per_channel={per_channel!r}"
        )
    granularities = tuple(per_channel)
    for pc in granularities:
        check_bool(pc, "per_channel")
    if num_calibration is not None and (
        isinstance(num_calibration, bool) or not isinstance(num_calibration, (int, np.integer))
        or num_calibration < 1
    ):
        raise ValueError(
            "`num_calibration` must be None or a positive integer. "
            f"Received: num_calibration={num_calibration!r}"
        )
    if progress is not None and not callable(progress):
        raise ValueError(f"`progress` must be None or a callable. Received: progress={progress!r}")
    if tflite:
        check_tflite_backend("evaluate(tflite=True)")
    check_runnable(model, "evaluate")
    return x, ref, weight_bits, tflite, granularities


def evaluate(model, inputs, reference_outputs, *, float_outputs=None, weight_bits=8,
             tflite=True, per_channel=(False, True), num_calibration=None,
             progress: Callable[[str], Any] | None = None) -> list[dict]:
    """Compare ``model`` and its quantized versions with reference outputs.

    Rows, in this order (one per entry of ``per_channel`` for the quantized ones):

    * ``"float"``: ``model`` itself, which shows what a transform such as
      :func:`cle.equalize_model` changed in float;
    * ``"weights int{weight_bits} per-tensor"`` / ``"... per-channel"``: weights only,
      :func:`fake_quantize_weights` of ``model`` with its batch norms folded first
      (:func:`cle.fold_all_batch_norms`: an INT8 runtime quantizes folded kernels, and the
      folded per-channel BN scales are what spread the channel ranges), activations float;
    * ``"TFLite int8 per-tensor"`` / ``"TFLite int8 per-channel"`` (if ``tflite``): full integer
      INT8 as :func:`convert_to_tflite_int8` makes it, calibrated once on the first
      ``num_calibration`` of ``inputs`` (all by default) for both granularities, run by
      :func:`run_tflite` on all of them.

    Args:
        model: a Functional or Sequential ``keras.Model`` with one input and one output.
        inputs: array ``(N, *input_shape)``, preprocessed for ``model``.
        reference_outputs: array ``(N, *output_shape)``, usually the original float model's
            outputs on ``inputs``.
        float_outputs: ``model``'s own outputs on ``inputs`` if already known (saves one
            inference); computed otherwise.
        weight_bits: bit width of the weight-only rows, 2 to 32.
        tflite: also convert to TF Lite INT8 and run it.
        per_channel: which granularities to measure, in order: a tuple of bools (False:
            per-tensor, True: per-channel); a single bool means just that one.
        num_calibration: calibrate the TF Lite conversions on the first ``num_calibration``
            inputs only (None: all); calibration is most of a conversion's time.
        progress: optional ``callable(str)`` called with a description before each long step.

    Returns:
        A list of dicts ``{"name": str, "top1_agreement": float, "sqnr_db": float}``, metrics
        of each variant's outputs against ``reference_outputs`` (:func:`top1_agreement`,
        :func:`sqnr_db`).

    Raises:
        TypeError: ``model`` is not a ``keras.Model``.
        ValueError: bad arguments (shapes, bits, ``per_channel``, ``progress``), or an error
            of the functions above.
        RuntimeError: ``tflite`` on the PyTorch backend (see :func:`convert_to_tflite_int8`).

    Example:
        >>> y_ref = model.predict(x, verbose=0)
        >>> rows = evaluate(cle.equalize_model(model), x, y_ref, progress=print)
    """
    from cle._transforms.bn_fold import fold_all_batch_norms

    x, ref, weight_bits, tflite, granularities = _checked_evaluate_args(
        model, inputs, reference_outputs, weight_bits, tflite, per_channel, num_calibration,
        progress)
    say = progress if progress is not None else (lambda message: None)

    def row(name, outputs):
        outputs = np.asarray(outputs, dtype=np.float64)
        if outputs.shape != ref.shape:
            raise ValueError(
                f"The outputs of '{name}' do not match `reference_outputs`. Received: outputs "
                f"with shape {outputs.shape}, reference_outputs with shape {ref.shape}"
            )
        return {"name": name, "top1_agreement": top1_agreement(ref, outputs),
                "sqnr_db": sqnr_db(ref, outputs)}

    def label(pc):
        return "per-channel" if pc else "per-tensor"

    if float_outputs is None:
        say(f"float: inference on {len(x)} inputs")
        float_outputs = predict(model, x)
    rows = [row("float", float_outputs)]

    folded = quantized = None
    for pc in granularities:
        name = f"weights int{weight_bits} {label(pc)}"
        if folded is None:
            say("folding batch norms")
            with warnings.catch_warnings():  # cle predicts it exactly; the user never has it
                warnings.filterwarnings("ignore", message=".*TensorFlow's graph mode")
                _, folded = fold_all_batch_norms(model)
        say(f"{name}: quantizing kernels")
        if quantized is None:
            quantized = fake_quantize_weights(folded, bits=weight_bits, per_channel=pc)
        else:  # the same model with other kernels: its compiled inference is reused
            _quantize_kernels_into(quantized, folded, weight_bits, pc)
        say(f"{name}: inference on {len(x)} inputs")
        rows.append(row(name, predict(quantized, x)))
    del quantized

    if tflite:
        # One calibration serves every granularity: the converter's calibrate and quantize
        # steps, run apart (cle._tflite.converter), give what convert_to_tflite_int8 gives.
        n_cal = len(x) if num_calibration is None else min(len(x), int(num_calibration))
        calibrated = None
        for pc in granularities:
            name = f"TFLite int8 {label(pc)}"
            if calibrated is None:
                say(f"{name}: converting (calibration on {n_cal} inputs)")
                calibrated = _tflite.calibrate(model, x[:n_cal])
            else:
                say(f"{name}: converting (the same calibration)")
            content = _tflite.quantize_calibrated(calibrated, per_channel=pc)
            say(f"{name}: inference on {len(x)} inputs")
            rows.append(row(name, run_tflite(content, x, batch_size=TFLITE_BATCH)))
    return rows