"""LiteRT runs of a ``.tflite``: the interpreter (:func:`interpreter`), every output on any
number of inputs (:func:`run_all`), the matching of the flatbuffer's inputs and outputs to the
Keras model's (:func:`input_details_by_name`, :func:`output_details_in_order`) and the weight
quantization a flatbuffer holds (:func:`weight_quantization`). The one run path: the pipeline,
its check and :func:`cle.quantization.run_tflite` all run files here."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from cle._tflite import internals

# Batch size of LiteRT runs. On MobileNetV2 (224x224, INT8, 2 threads, builtin kernels)
# batches of 16-32 run several times faster per image than batch 1, with bit-identical
# outputs; inputs are independent, so batching cannot change results.
TFLITE_BATCH = 32
# TF Lite ops whose input 1 is a weight tensor (what weight_quantization reports).
WEIGHT_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "CONV_3D", "TRANSPOSE_CONV", "FULLY_CONNECTED")


def input_name(tflite_name) -> str:
    """The Keras input name of a TF Lite input tensor: its own name (a traced function) or
    ``serving_default_<name>:0`` (Keras' export)."""
    return re.sub(r"^serving_default_", "", re.sub(r":\d+$", "", str(tflite_name)))


def input_details_by_name(interp, names, details=None) -> list[dict]:
    """The interpreter's input details (or those of ``details``) in the order of the model
    input ``names``: matched by name (``name``, or ``serving_default_<name>:0`` as Keras'
    export writes it), else in the order of the input tensors (the order of the model's
    inputs, as the converter writes them)."""
    details = interp.get_input_details() if details is None else details
    found = {input_name(d["name"]): d for d in details}
    if all(n in found for n in names):
        return [found[n] for n in names]
    if len(details) == len(names):  # the converter keeps the order of the model's inputs
        return sorted(details, key=lambda d: d["index"])
    raise RuntimeError(f"the TF Lite model's inputs {sorted(found)} are not the Keras model's "
                       f"{list(names)}")


def fixed_batch(interp, details=None) -> bool:
    """Whether the file's inputs (``details``: some of them) hold a fixed batch
    (:func:`cle._tflite.converter.export_batch`): such a file runs one input at a time."""
    details = interp.get_input_details() if details is None else details
    return any(int(d.get("shape_signature", d["shape"])[0]) > 0 for d in details)


def output_details_in_order(interp) -> list[dict]:
    """The interpreter's output details in the order of the Keras model's outputs: the
    converter names them ``Identity``, ``Identity_1``, ... (a traced function) or ``...:k``
    (Keras' export), numbered in that order."""
    details = interp.get_output_details()
    inputs = [d["name"] for d in interp.get_input_details()]
    return [details[k] for k in keras_output_order([d["name"] for d in details], inputs)]


def keras_output_order(names, input_names=()) -> list[int]:
    """The positions of a flatbuffer's output tensors, given their ``names``, in the order of
    the Keras model's outputs (see :func:`output_details_in_order`); ``input_names``: the
    flatbuffer's input tensors', which a model input returned as an output keeps."""
    inputs = set(input_names)

    def passed(name):  # 16x8 mode requantizes an input returned as an output: "<input>_int16"
        return name in inputs or re.sub(r"_int(?:8|16)$", "", name) in inputs

    def position(name):
        if passed(name):
            return None
        m = re.search(r":(\d+)$", name) or re.fullmatch(r"Identity(?:_(\d+))?", name)
        return None if m is None else int(m.group(1) or 0)

    names = list(names)
    n = len(names)
    if n == 1:
        return [0]
    order, taken = [None] * n, set()
    for k, p in enumerate(position(name) for name in names):
        if p is not None and p < n and p not in taken:
            order[k] = p
            taken.add(p)
    missing = [p for p in range(n) if p not in taken]
    free = [k for k in range(n) if order[k] is None]
    # A tensor the model lists twice is listed twice under one name (either copy will do); a
    # model input returned as an output keeps the input's name, in the place of its number.
    seen = {names[k] for k in range(n) if order[k] is not None}
    through = [k for k in free if passed(names[k])]
    if len(free) == len(missing) and len(through) <= 1 and all(
            names[k] in seen or k in through for k in free):
        for k, p in zip(free, missing):
            order[k] = p
        return sorted(range(n), key=lambda k: order[k])
    raise RuntimeError(f"cannot tell which TF Lite output is which Keras output: {names}")


def _quantized(detail) -> bool:
    """Whether a tensor ``detail`` holds quantized values: an 8- or 16-bit integer with a
    scale. A model's own uint8 (or int8) input, pixels the model rescales itself, is an
    integer tensor with no quantization (scale 0): its values are what they say."""
    return (np.dtype(detail["dtype"]) in (np.int8, np.uint8, np.int16)
            and float(detail["quantization"][0]) != 0.0)


def _to_float(y, detail):
    if _quantized(detail):
        scale, zero = detail["quantization"]
        return (y.astype(np.float32) - zero) * np.float32(scale)
    return np.array(y, dtype=np.float32)


def to_input(chunk, detail):
    """Float model inputs ``chunk`` as the interpreter's input ``detail`` takes them:
    quantized to its scale and zero point for a quantized input, rounded into an integer
    input's type where it takes integers as they are, else cast."""
    dtype, chunk = np.dtype(detail["dtype"]), np.asarray(chunk)
    if _quantized(detail):
        scale, zero = detail["quantization"]
        chunk = np.round(chunk / scale) + zero
    elif dtype.kind in "iu" and chunk.dtype.kind == "f":
        chunk = np.round(chunk)
    else:
        return chunk.astype(dtype)
    info = np.iinfo(dtype)
    return np.clip(chunk, info.min, info.max).astype(dtype)


def run_all(tflite_model, x, batch_size=TFLITE_BATCH, interp=None) -> list[np.ndarray]:
    """Every output of a ``.tflite`` on :class:`cle._core.inputs.ModelInputs` ``x`` (float
    arrays in the Keras model's output order; integer inputs and outputs (de)quantized), fed
    ``batch_size`` inputs per invocation; ``interp``: the file's :func:`interpreter`, if the
    caller made one."""
    interp = interpreter(tflite_model) if interp is None else interp
    ins = input_details_by_name(interp, x.names)
    if fixed_batch(interp, ins):
        batch_size = 1
    results, current = [], None
    for start in range(0, len(x), int(batch_size)):
        chunk = x[start: start + int(batch_size)]
        shapes = tuple(a.shape for a in chunk.arrays)
        if current != shapes:
            for d, a in zip(ins, chunk.arrays):
                interp.resize_tensor_input(d["index"], a.shape, strict=False)
            interp.allocate_tensors()
            current = shapes
            outs = output_details_in_order(interp)
        for d, a in zip(ins, chunk.arrays):
            interp.set_tensor(d["index"], to_input(a, d))
        interp.invoke()
        results.append([_to_float(interp.get_tensor(d["index"]), d) for d in outs])
    return [np.concatenate(parts, axis=0) for parts in zip(*results)]


def interpreter(tflite_model, num_threads=2, preserve_all_tensors=False, delegates=False):
    """LiteRT's interpreter (``ai_edge_litert``, the supported successor of the deprecated
    ``tf.lite.Interpreter``), builtin kernels without default delegates; with
    ``preserve_all_tensors`` every intermediate tensor stays readable after ``invoke``. With
    ``delegates`` LiteRT's default delegate (XNNPACK) runs what it supports: several times
    faster for float models, but not the INT8 kernels TF Lite's quantization targets."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    resolver = (OpResolverType.AUTO if delegates
                else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    return Interpreter(
        model_content=bytes(tflite_model),
        num_threads=num_threads,
        experimental_op_resolver_type=resolver,
        experimental_preserve_all_tensors=preserve_all_tensors,
    )


def weight_quantization(tflite_model: bytes) -> list[dict[str, Any]]:
    """Quantization of the weight tensor of every conv / depthwise / transposed-conv /
    fully-connected op in a TF Lite model, read from the interpreter's tensor details.

    Returns:
        One dict per op, in execution order: ``op`` (builtin name), ``tensor`` (weight tensor
        name), ``shape``, ``dtype``, ``scales`` and ``zero_points`` (arrays; one entry for
        per-tensor quantization, one per output channel otherwise) and
        ``quantized_dimension``.
    """
    interp = interpreter(tflite_model)
    interp.allocate_tensors()
    tensors = {t["index"]: t for t in interp.get_tensor_details()}
    out = []
    for op in internals.ops_details(interp):
        if op["op_name"] not in WEIGHT_OPS or len(op["inputs"]) < 2:
            continue
        t = tensors[int(op["inputs"][1])]
        q = t["quantization_parameters"]
        out.append({
            "op": op["op_name"],
            "tensor": t["name"],
            "shape": tuple(int(d) for d in t["shape"]),
            "dtype": np.dtype(t["dtype"]),
            "scales": np.asarray(q["scales"]),
            "zero_points": np.asarray(q["zero_points"]),
            "quantized_dimension": int(q["quantized_dimension"]),
        })
    return out
