"""The TF Lite converter in two steps, with the activation ranges in between ours to set.

TF Lite's full-INT8 conversion calibrates every activation tensor's range as the min and max
it saw on the representative data, then quantizes. The converter runs those two steps
internally (``TFLiteConverter._quantize``): a *calibrate-only* conversion
(``_experimental_calibrate_only``) returns the float flatbuffer with the recorded min/max in
each tensor's quantization parameters, and ``convert.mlir_quantize`` turns such a flatbuffer
into the INT8 model. Between the two this module reads the ranges, measures the tensors on
data with LiteRT's interpreter (``experimental_preserve_all_tensors``), and writes chosen
ranges back with the flatbuffer object API (``tensorflow.lite.tools.flatbuffer_utils``).

Those private and experimental names are reached through :mod:`cle._tflite.internals`
alone. ``tests/test_quantize.py`` checks that the two-step route with untouched ranges gives the
same INT8 model as the converter's one-step route, so a TensorFlow change that breaks the
route is caught.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

import keras
import numpy as np

from cle._core import graph as _graph
from cle._core.inputs import input_names, integer_inputs
from cle._core.keras_internals import fed
from cle._tflite import internals
from cle._tflite.export import (  # noqa: F401  (read as converter's by callers)
    export_batch, export_shapes, fixed_sizes, quiet, read_exported, shared_exports,
    static_batch, traced_batch)
from cle._tflite.convertible import (  # noqa: F401  (read as converter's by callers)
    check_convertible, check_tflite_backend, converter_refusal, tanh_gelu_note,
    unconvertible_layers)
from cle._tflite.runtime import input_details_by_name, interpreter
from cle._tflite.roles import (  # noqa: F401  (read as converter's by callers)
    SCORE_OPS, logit_indices, max_kept_indices, output_indices, padded_below, parsed,
    pooled_indices, pooled_sources, protected_indices, score_bounds, softmax_logits,
    softmax_outputs, tensor_name, upstream_indices)

# Values kept per tensor to choose its range (a uniform sample of all positions of all
# inputs, plus the exact extremes).
SAMPLE_PER_TENSOR = 1 << 20


@dataclasses.dataclass
class TensorRange:
    """One activation tensor of a calibrated flatbuffer: its index, name and shape, the
    range the converter calibrated (min, max over the data) and the range that will be
    written (``lo``, ``hi``; the calibrated one until a choice replaces it)."""

    index: int
    name: str
    shape: tuple
    calibrated: tuple[float, float]
    lo: float
    hi: float
    how: str = "min/max"
    #: ``(classes, widening)`` for the logits of a softmax whose range
    #: :func:`cle._quantize.ranges.logit_range` sets (None: any other tensor).
    logit: tuple | None = None


def _representative(x, by_name):
    """The converter's representative dataset: one sample at a time, a list with one array
    per input in the order of the model's inputs (:class:`cle._core.inputs.ModelInputs`, or
    one array for a one-input model); ``by_name``: for several inputs a dict ``{input name:
    array}``, which the calibrator matches to the SavedModel signature's inputs by name
    (``from_keras_model`` does not keep the Keras model's input order: from JAX the inputs
    come sorted by name). A traced function has no signature and keeps the order."""
    arrays = x.arrays if hasattr(x, "arrays") else (x,)
    names = getattr(x, "names", None)

    def gen():
        for i in range(len(arrays[0])):
            sample = [a[i: i + 1] for a in arrays]
            yield dict(zip(names, sample)) if by_name and len(sample) > 1 else sample
    return gen


def _uses_keras_route(model, keras_route=False) -> bool:
    """Whether :func:`_from_model` reads ``model`` through ``from_keras_model`` (a SavedModel
    with a signature) rather than a traced function."""
    return (keras_route or keras.backend.backend() != "tensorflow"
            or _graph.inner_function(model) is None)


def _from_model(model, keras_route=False, x=None):
    """TF Lite's converter reading ``model`` (``x``: the data it will be calibrated on).

    On the TensorFlow backend a Functional or Sequential model is traced once (inference
    mode, batch dimension free) and handed to the converter as a concrete function, whose
    variables it freezes into constants: the route TF Lite takes for Keras 2 models.
    ``from_keras_model`` (``keras_route``, and every other model or backend) first writes a
    Keras 3 model out as a SavedModel through Keras' ``ExportArchive`` and reads it back,
    which takes most of a conversion's time for the same flatbuffer (tests/test_quantize.py
    checks both routes give the same ranges and the same INT8 outputs).
    """
    import tensorflow as tf

    if _uses_keras_route(model, keras_route):
        return read_exported(model, _graph.inner_function(model) is not None,
                             export_shapes(model, x))
    batch = traced_batch()  # a device's file: shape arithmetic on a free batch (an
    # unrolled recurrent layer's zero state: SHAPE, FILL) is operators its runtime lacks
    specs = [tf.TensorSpec(t.shape if batch is None else (batch,) + tuple(t.shape[1:]),
                           t.dtype, name=name)
             for t, name in zip(model.inputs, input_names(model))]
    call = tf.function(lambda *ts: model(fed(model, ts), training=False),
                       input_signature=specs)
    # The tf.function as the "trackable object": the converter freezes the function's
    # variables instead of saving the model as a SavedModel first.
    return tf.lite.TFLiteConverter.from_concrete_functions([call.get_concrete_function()],
                                                           call)


def _converter(model, x, per_channel=True, io_type=None, keras_route=False):
    """The converter set up for full-integer quantization calibrated on ``x``; ``io_type``, if
    given, is the type of the model's input and output."""
    import tensorflow as tf

    converter = _from_model(model, keras_route, x)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = _representative(x, _uses_keras_route(model, keras_route))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    if not per_channel:
        internals.disable_per_channel(converter)
    if io_type is not None:
        converter.inference_input_type = io_type
        converter.inference_output_type = io_type
    return converter


def convert_int8(model, x, per_channel=True, integer_io=False, keras_route=False) -> bytes:
    """The converter's one-step full-INT8 flatbuffer of ``model``, calibrated on ``x``;
    ``keras_route``: read the model with ``from_keras_model`` (see :func:`_from_model`)."""
    import tensorflow as tf

    converter = _converter(model, x, per_channel, tf.int8 if integer_io else tf.float32,
                           keras_route)
    return _converted(converter, model)


def _converted(converter, model) -> bytes:
    """``converter.convert()``, quiet; an operation outside TF Lite's builtin ops raises the
    ``ValueError`` that names it (:func:`cle._tflite.convertible.converter_refusal`)."""
    try:
        with quiet():
            return bytes(converter.convert())
    except Exception as error:
        refusal = converter_refusal(error, model)
        if refusal is None:
            raise
        raise refusal from error


def calibrate(model, x, keras_route=False) -> bytes:
    """The float flatbuffer of ``model`` with every activation tensor's min/max over ``x``
    (the converter's calibration step alone); ``keras_route``: read the model with
    ``from_keras_model`` (see :func:`_from_model`)."""
    check_tflite_backend("cle.quantize")
    converter = _converter(model, x, keras_route=keras_route)
    internals.calibrate_only(converter)
    return _converted(converter, model)


class PlainConversion:
    """TF Lite's plain full-INT8 conversion of ``model`` calibrated on one set of inputs after
    another, the model converted once: the first :meth:`on` converts it calibrated on its
    inputs (:func:`calibrate`); each later one has the converter's calibrator record that
    flatbuffer's ranges again on its own inputs. Each then takes the converter's quantize
    step. What :meth:`on` returns has the tensors, quantization and outputs of
    :func:`convert_int8` on the same inputs, its metadata in another order
    (tests/test_quantize.py)."""

    def __init__(self, model, per_channel=True, integer_io=False):
        self.model, self.per_channel, self.integer_io = model, per_channel, integer_io
        self._calibrated = None

    def on(self, x) -> bytes:
        """The plain conversion calibrated on ``x`` (:class:`cle._core.inputs.ModelInputs`)."""
        if self._calibrated is None:
            self._calibrated = calibrated = calibrate(self.model, x)
        else:
            with quiet():
                calibrated = internals.calibrate_again(
                    self._calibrated, _representative(x, _uses_keras_route(self.model)))
        return quantize_calibrated(calibrated, self.per_channel, self.integer_io)

    @property
    def float_model(self) -> bytes | None:
        """The float flatbuffer the first :meth:`on` converted (its ranges recorded, its
        tensors float: the interpreter runs it as TF Lite computes the model before any
        quantization); None before."""
        return self._calibrated


def quantize_calibrated(calibrated: bytes, per_channel=True, integer_io=False) -> bytes:
    """The full-INT8 flatbuffer of a calibrated one (the converter's quantization step)."""
    import tensorflow as tf

    io_type = tf.int8 if integer_io else tf.float32
    with quiet():
        return internals.quantize_calibrated_model(calibrated, per_channel, io_type)


def _int16_refusal(what) -> ValueError:
    return ValueError(f"TF Lite's 16x8 mode cannot quantize this model: its calibrator records "
                      f"no range for {what}; use activation_bits=8. Received: activation_bits=16")


def check_int16(model) -> None:
    """Refuse, before any work, a model TF Lite's 16x8 mode cannot calibrate: one with an
    integer input (token ids, indices), for which its calibrator records no range and stops
    (helper-22's hunt)."""
    ints = integer_inputs(model)
    if ints:
        raise _int16_refusal(f"the model's integer input{'s' if len(ints) > 1 else ''} "
                             f"{', '.join(repr(n) for n in ints)} (token ids or indices)")


def convert_int16(model, x, integer_io=False) -> bytes:
    """TF Lite's 16-bit activation / 8-bit weight mode (``16x8``), calibrated by the
    converter on ``x`` (its own min/max; int16 leaves little to gain from clipping)."""
    import tensorflow as tf

    check_tflite_backend("cle.quantize")
    if keras.backend.backend() != "tensorflow":  # read with a batch of one (export_batch)
        raise RuntimeError(
            f"TF Lite's 16x8 mode, given the {keras.backend.backend()} backend's export of "
            "this model, writes a file whose outputs do not follow the model's; use "
            "activation_bits=8, or convert on the TensorFlow backend. Received: "
            "activation_bits=16")
    converter = _converter(model, x, io_type=tf.int16 if integer_io else tf.float32)
    converter.target_spec.supported_ops = [
        tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
    with quiet():
        try:
            return bytes(converter.convert())
        except Exception as exc:
            ops = sorted(set(re.findall(r"not yet supported for op: '(\w+)'", str(exc))))
            unranged = re.search(r"Max and min for dynamic tensors should be recorded during "
                                 r"calibration: Failed for tensor (\S+)", str(exc))
            if unranged:  # another tensor than an integer input (check_int16)
                raise _int16_refusal(f"tensor '{unranged.group(1)}'") from exc
            if not ops:  # an op outside the builtins: the ValueError that names it, as INT8's
                refusal = converter_refusal(exc, model, int16=True)
                if refusal is None:
                    raise
                raise refusal from exc
    raise RuntimeError(
        f"TF Lite's 16x8 mode cannot quantize the ops {', '.join(ops)} of this model (as the "
        f"{keras.backend.backend()} backend exports it); use activation_bits=8. Received: "
        "activation_bits=16")


def ranges_of(calibrated: bytes) -> list[TensorRange]:
    """Every tensor of the main subgraph that carries a calibrated min/max."""
    graph = parsed(calibrated).subgraphs[0]
    out = []
    for i, t in enumerate(graph.tensors):
        q = t.quantization
        if q is None or q.min is None or len(q.min) != 1:
            continue
        lo, hi = float(q.min[0]), float(q.max[0])
        shape = tuple(int(d) for d in t.shape) if t.shape is not None else ()  # () a scalar
        out.append(TensorRange(i, tensor_name(t), shape, (lo, hi),
                               lo, hi))
    return out


#: How a padding below its input's values before a max pooling is set (:func:`with_ranges`).
PADDED = "its input's (a padding below it, before a max pooling)"


def with_ranges(calibrated: bytes, ranges: list[TensorRange]) -> bytes:
    """``calibrated`` with each listed tensor's min/max replaced by its ``lo``/``hi``. A bound
    no float32 holds (an overflow in the float model on the calibration inputs: JAX's
    polynomial of exact GELU's erf reached inf) raises a ValueError naming the tensor: TF
    Lite's quantizer died on it (a segmentation fault).

    A padding by a constant below its input's values that only max poolings read
    (:func:`cle._tflite.roles.padded_below`: a ``-inf`` padding) first takes its input's range,
    in ``ranges`` too (``how``: :data:`PADDED`), whatever range a build chose for it: any other
    puts the lowest float in the scale the quantizer gives both."""
    largest = float(np.finfo(np.float32).max)
    try:
        padded = padded_below(calibrated)
    except Exception:  # noqa: BLE001 - no graph to read: no padding, ranges said as they are
        padded = {}
    for r in ranges:
        if not all(np.isfinite(v) and abs(v) <= largest for v in (r.lo, r.hi)):
            if r.index in padded:  # its input's range replaces it below
                continue
            raise ValueError(
                f"the 8-bit range of tensor '{r.name}' would be [{r.lo:.4g}, {r.hi:.4g}], "
                "which float32 cannot hold: the model computes values there that overflow "
                "on the calibration inputs, and no 8-bit scale holds them; keep the values of "
                "the layer that makes that tensor finite")
    by_index = {r.index: r for r in ranges}
    for out, inp in padded.items():
        if out in by_index:
            r, source = by_index[out], by_index.get(inp)
            if source is None:
                q = parsed(calibrated).subgraphs[0].tensors[inp].quantization
                r.lo, r.hi = float(q.min[0]), float(q.max[0])
            else:
                r.lo, r.hi = source.lo, source.hi
            r.how = PADDED
    obj = parsed(calibrated)
    tensors = obj.subgraphs[0].tensors
    before = [(q, q.min, q.max) for q in (tensors[r.index].quantization for r in ranges)]
    try:
        for r in ranges:
            q = tensors[r.index].quantization
            q.min = [np.float32(min(r.lo, 0.0))]
            q.max = [np.float32(max(r.hi, 0.0))]
        return internals.write_model(obj)
    finally:  # the parsed tree is shared (:func:`cle._tflite.roles.parsed`): as it was read
        for q, lo, hi in reversed(before):
            q.min, q.max = lo, hi


def observe(calibrated: bytes, x, indices, progress: Callable | None = None,
            per_tensor=SAMPLE_PER_TENSOR, seed=0, extremes: dict | None = None,
            moments: dict | None = None) -> dict[int, np.ndarray]:
    """A uniform sample of the values each tensor of ``indices`` takes on ``x``
    (:class:`cle._core.inputs.ModelInputs`; float interpreter, one sample at a time), with each
    tensor's exact min and max over ``x`` as its last two values. Every input gives each
    tensor the same number of values (:func:`sample_per_input`), in the order of ``x``; with
    ``extremes`` (a dict), ``extremes[index]`` becomes ``(lows, highs)``: the tensor's min and
    max on each input. With ``moments`` (a dict whose keys are tensors, channels
    last), ``moments[index]`` becomes ``(means, squares)``: each channel's mean over the
    positions of each input, ``(N, channels)``, and its mean square over every position of
    every input, ``(channels,)`` (float64)."""
    interp = interpreter(calibrated, preserve_all_tensors=True)
    ins = input_details_by_name(interp, x.names)
    for d, a in zip(ins, x.arrays):
        interp.resize_tensor_input(d["index"], (1,) + a.shape[1:], strict=False)
    interp.allocate_tensors()
    rng = np.random.default_rng(seed)
    n = len(x)
    per_input = sample_per_input(n, per_tensor)
    # Each tensor's sample is written in place into one array (its values input by input,
    # then the extremes), not joined from pieces at the end (a copy of every sample more); a
    # tensor whose size changes from input to input keeps a list of pieces.
    kept: dict[int, Any] = {}
    lows = {i: np.empty(n) for i in indices}
    highs = {i: np.empty(n) for i in indices}
    sums = {i: [[], 0.0] for i in (moments or {})}
    for k in range(n):
        for d, a in zip(ins, x.arrays):
            interp.set_tensor(d["index"], a[k: k + 1])
        interp.invoke()
        for i, kept_sums in sums.items():
            t = interp.get_tensor(i)
            v = t.reshape(-1, t.shape[-1]).astype(np.float64)
            kept_sums[0].append(v.mean(axis=0))
            kept_sums[1] = kept_sums[1] + (v * v).mean(axis=0) / n
        for i in indices:
            v = interp.get_tensor(i).ravel()
            lows[i][k], highs[i][k] = float(v.min()), float(v.max())
            if v.size > per_input:  # a random sample of positions (with replacement: fast)
                v = v[rng.integers(0, v.size, per_input)]
            into = kept.get(i)
            if into is None:
                into = kept[i] = np.empty(n * v.size + 2, np.result_type(v.dtype, np.float32))
            if isinstance(into, np.ndarray) and into.size == n * v.size + 2:
                into[k * v.size: (k + 1) * v.size] = v
                continue
            if isinstance(into, np.ndarray):  # the size changed: pieces from here on
                m = (into.size - 2) // n
                into = kept[i] = [into[j * m: (j + 1) * m] for j in range(k)]
            into.append(v)
        if progress is not None and (k + 1) % 16 == 0:
            progress(f"measured activations on {k + 1} of {n} inputs")
    if extremes is not None:
        extremes.update({i: (lows[i], highs[i]) for i in indices})
    if moments is not None:
        moments.update({i: (np.stack(m), sq) for i, (m, sq) in sums.items()})
    for i in indices:
        ends = np.array([lows[i].min(), highs[i].max()], np.float32)
        if isinstance(kept[i], list):
            kept[i] = np.concatenate(kept[i] + [ends])
        else:
            kept[i][-2:] = ends
    return kept


def sample_per_input(n: int, per_tensor=SAMPLE_PER_TENSOR) -> int:
    """How many values of a tensor :func:`observe` keeps from each of ``n`` inputs (at most:
    all of them when the tensor is smaller)."""
    return max(1, per_tensor // n)

