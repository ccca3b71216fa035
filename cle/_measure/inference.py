"""Running the models that :mod:`cle.quantization` and :mod:`cle.int8` compare: the Keras
model's outputs in float64 (:func:`predict`) and LiteRT's interpreter for a ``.tflite``
(:func:`interpreter`), with the weight quantization a flatbuffer holds
(:func:`weight_quantization`)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from cle._measure import tflite_internals as internals

# Batch size evaluate() uses for TF Lite inference. On MobileNetV2 (224x224, INT8, 2 threads,
# builtin kernels) batches of 16-32 run several times faster per image than batch 1, with
# bit-identical outputs; inputs are independent, so batching cannot change results.
TFLITE_BATCH = 32
KERAS_BATCH = 32
# TF Lite ops whose input 1 is a weight tensor (what weight_quantization reports).
WEIGHT_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "CONV_3D", "TRANSPOSE_CONV", "FULLY_CONNECTED")


def predict(model, x):
    """``model.predict(x)`` in batches of :data:`KERAS_BATCH`, as float64."""
    # Every variant is a new model, so TensorFlow warns about tf.function retracing after a few
    # of them; that warning is about this loop, not the user's code.
    tf_logger = logging.getLogger("tensorflow")
    level = tf_logger.level
    tf_logger.setLevel(logging.ERROR)
    try:
        y = model.predict(x, batch_size=KERAS_BATCH, verbose=0)
    finally:
        tf_logger.setLevel(level)
    return np.asarray(y, dtype=np.float64)


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
