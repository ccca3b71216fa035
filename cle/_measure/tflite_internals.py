"""Every use of TensorFlow's and LiteRT's private or experimental API in keras-cle, each behind
one small function.

TF Lite's converter runs its calibration and its quantization as two internal steps; the
package runs them apart to choose the activation ranges in between (:mod:`cle._measure.tflite`),
and reads and writes the flatbuffer between them. None of that has a public API. The functions
here are the only place in the package that touches those names (``tests/test_layout.py``
fails on any other use), so a TensorFlow or LiteRT upgrade that moves one of them breaks here
and nowhere else; ``tests/test_quantize.py`` checks that the two-step route with untouched
ranges gives the converter's own INT8 model. Each docstring ends with the public API that would
replace it.
"""

from __future__ import annotations


def calibrate_only(converter):
    """Make ``converter.convert()`` return the float flatbuffer with each activation tensor's
    calibrated min/max in its quantization parameters, instead of the INT8 model.

    Public replacement: none (``TFLiteConverter._experimental_calibrate_only``).
    """
    converter._experimental_calibrate_only = True


def disable_per_channel(converter):
    """One weight scale per tensor instead of one per output channel.

    Public replacement: none (``TFLiteConverter._experimental_disable_per_channel``).
    """
    converter._experimental_disable_per_channel = True


def quantize_calibrated_model(calibrated: bytes, per_channel: bool, io_type) -> bytes:
    """The converter's quantization step on a calibrated flatbuffer: the full-INT8 model whose
    input and output have type ``io_type`` (``tf.float32`` or ``tf.int8``).

    Public replacement: none (``tensorflow.lite.python.convert.mlir_quantize``, which
    ``TFLiteConverter._quantize`` calls after calibrating).
    """
    from tensorflow.lite.python import convert

    return bytes(convert.mlir_quantize(calibrated, disable_per_channel=not per_channel,
                                       input_data_type=io_type, output_data_type=io_type))


def read_model(content: bytes):
    """The flatbuffer as a mutable object tree (``ModelT``: subgraphs, tensors, operators,
    buffers, operator codes).

    Public replacement: the ``flatbuffers`` package with a schema module generated from
    TF Lite's ``schema.fbs`` (``tensorflow.lite.tools.flatbuffer_utils``).
    """
    from tensorflow.lite.tools import flatbuffer_utils

    return flatbuffer_utils.convert_bytearray_to_object(bytearray(content))


def write_model(model) -> bytes:
    """The flatbuffer of an object tree from :func:`read_model`.

    Public replacement: as for :func:`read_model`.
    """
    from tensorflow.lite.tools import flatbuffer_utils

    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def builtin_operator_names() -> dict[int, str]:
    """``{builtin operator code: name}`` of TF Lite's schema (``3: "CONV_2D"``, ...).

    Public replacement: none (``tensorflow.lite.python.schema_py_generated.BuiltinOperator``).
    """
    from tensorflow.lite.python import schema_py_generated as schema

    return {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}


def ops_details(interpreter) -> list[dict]:
    """Every operator of the interpreter's model in execution order: ``op_name``, ``inputs``,
    ``outputs`` (tensor indices).

    Public replacement: ``ai_edge_litert``'s ``Interpreter`` exposes tensors, not operators
    (``Interpreter._get_ops_details``).
    """
    return interpreter._get_ops_details()


def tensor_type_codes() -> dict[str, int]:
    """``{name: code}`` of the schema's tensor types (``"INT4": 17``, ``"INT8": 9``, ...).

    Public replacement: none (``tensorflow.lite.python.schema_py_generated.TensorType``).
    """
    from tensorflow.lite.python import schema_py_generated as schema

    return {k: v for k, v in vars(schema.TensorType).items() if not k.startswith("_")}


def new_buffer(data):
    """A buffer of the object tree from :func:`read_model` holding ``data`` (a uint8 array;
    the generated ``Pack`` writes an int32 array's length in elements, not bytes).

    Public replacement: as for :func:`read_model` (``schema_py_generated.BufferT``).
    """
    from tensorflow.lite.python import schema_py_generated as schema

    buffer = schema.BufferT()
    buffer.data = data
    return buffer


__all__ = ["builtin_operator_names", "calibrate_only", "disable_per_channel", "new_buffer",
           "ops_details", "quantize_calibrated_model", "read_model", "tensor_type_codes",
           "write_model"]
