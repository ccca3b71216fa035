"""A read view of a TF Lite flatbuffer's main graph, and the alignment of a float model with
the INT8 model TF Lite's quantize step made from it.

The converter's quantize step (:func:`cle._tflite.converter.quantize_calibrated`) keeps the float
model's operators, in order, and adds conversions: a QUANTIZE of the float input, a DEQUANTIZE
of the output, and a QUANTIZE (int8 to int8) wherever an operator needs its input at another
scale (a requantization). :func:`align` pairs the two models' operators on that rule and
checks it (same operator kinds, same output shapes, every input accounted for): a model it does
not hold for is refused with the operator where it failed, never paired by guess.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cle._tflite import internals

__all__ = ["Alignment", "FlatGraph", "Op", "align", "dequantize", "with_constants"]

# TensorType codes of TF Lite's schema.
FLOAT32, INT32, INT8 = 0, 2, 9
_NUMPY = {0: np.float32, 1: np.float16, 2: np.int32, 3: np.uint8, 4: np.int64, 6: np.bool_,
          7: np.int16, 9: np.int8, 10: np.float64, 12: np.uint64, 15: np.uint32, 16: np.uint16}
#: Operators the quantize step adds around and between the float model's operators.
CONVERSIONS = ("QUANTIZE", "DEQUANTIZE")


@dataclasses.dataclass(eq=False)
class Op:
    """One operator: its position, builtin name, input and output tensor indices (an absent
    optional input is -1) and the schema object (``OperatorT``) it was read from."""

    index: int
    kind: str
    inputs: list[int]
    outputs: list[int]
    obj: object = dataclasses.field(repr=False, default=None)


class FlatGraph:
    """The main subgraph of a flatbuffer: operators in execution order, each tensor's producer
    and consumers, names, shapes, types, constant values and quantization parameters.

    ``model`` is the mutable object tree (:func:`cle._tflite.internals.read_model`);
    :mod:`cle._tflite.quant_sim` edits a copy of it."""

    def __init__(self, content: bytes):
        self.model = internals.read_model(content)
        self.graph = self.model.subgraphs[0]
        names = internals.builtin_operator_names()
        self.ops: list[Op] = []
        for i, op in enumerate(self.graph.operators):
            code = self.model.operatorCodes[op.opcodeIndex]
            kind = names.get(max(int(code.builtinCode), int(code.deprecatedBuiltinCode)),
                             "CUSTOM")
            self.ops.append(Op(i, kind, _ints(op.inputs), _ints(op.outputs), op))
        self.producer = {t: op.index for op in self.ops for t in op.outputs}
        self.consumers: dict[int, list[int]] = {}
        for op in self.ops:
            for t in op.inputs:
                if t >= 0:
                    self.consumers.setdefault(t, []).append(op.index)
        self.inputs = _ints(self.graph.inputs)
        self.outputs = _ints(self.graph.outputs)

    def name(self, t: int) -> str:
        name = self.graph.tensors[t].name
        return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)

    def shape(self, t: int) -> tuple:
        shape = self.graph.tensors[t].shape
        return tuple(int(d) for d in (shape if shape is not None else ()))

    def signature(self, t: int) -> tuple:
        """Tensor ``t``'s shape with -1 where it is not fixed (its shape signature; the shape
        alone writes 1 there)."""
        sig = self.graph.tensors[t].shapeSignature
        return tuple(int(d) for d in sig) if sig is not None and len(sig) else self.shape(t)

    def type(self, t: int) -> int:
        return int(self.graph.tensors[t].type)

    def constant(self, t: int) -> np.ndarray | None:
        """The value of a constant tensor (one whose buffer holds data, or one of no elements
        no operator makes: the empty shape of a RESHAPE to a scalar), else None."""
        tensor = self.graph.tensors[t]
        data = self.model.buffers[tensor.buffer].data if tensor.buffer > 0 else None
        dtype = _NUMPY.get(int(tensor.type))
        if dtype is None:
            return None
        if data is None or len(data) == 0:
            empty = (tensor.buffer > 0 and 0 in self.shape(t) and t not in self.producer
                     and t not in self.inputs)
            return np.zeros(self.shape(t), dtype) if empty else None
        return np.frombuffer(np.asarray(data, np.uint8).tobytes(), dtype).reshape(
            self.shape(t))

    def params(self, t: int):
        """``(scales, zero_points, quantized_dimension)`` of a quantized tensor, else None."""
        q = self.graph.tensors[t].quantization
        if q is None or q.scale is None or len(q.scale) == 0:
            return None
        zero = q.zeroPoint if q.zeroPoint is not None else np.zeros(len(q.scale), np.int64)
        return (np.asarray(q.scale, np.float64), np.asarray(zero, np.int64),
                int(q.quantizedDimension))

    def constant_derived(self) -> set[int]:
        """Float tensors computed from constants alone (a weight, or on JAX a bias broadcast
        to the batch): their quantization is a weight's, not an activation's."""
        out = {t for t in range(len(self.graph.tensors)) if self.constant(t) is not None}
        for op in self.ops:
            floats = [t for t in op.inputs if t >= 0 and self.type(t) == FLOAT32]
            if all(t in out for t in floats):
                out.update(op.outputs)
        return out


def _ints(values) -> list[int]:
    return [int(v) for v in (values if values is not None else [])]


def dequantize(values: np.ndarray, params) -> np.ndarray:
    """Integer values times their scale, less the zero point, per tensor or along the
    quantized dimension, in float64."""
    scales, zeros, axis = params
    v = np.asarray(values, np.float64)
    if scales.size == 1:
        return (v - zeros[0]) * scales[0]
    shape = [1] * v.ndim
    shape[axis] = scales.size
    return (v - zeros.reshape(shape)) * scales.reshape(shape)


@dataclasses.dataclass
class Alignment:
    """How the INT8 model ``q`` holds the float model ``f``.

    Attributes:
        op_of: float operator -> its INT8 operator.
        tensor_of: float tensor -> the INT8 model's tensor in its place (float inputs stay
            float; the rest int8 or int32 where quantized).
        int8_of: float activation tensor -> the int8 tensor holding its quantized value (a
            float input's is the output of the QUANTIZE the INT8 model adds).
        requantized: ``(float operator, input position, int8 tensor)`` for every input an
            INT8 operator reads at another scale than its producer wrote (through a QUANTIZE
            the quantize step added). An operator the INT8 model runs in float (no INT8
            kernel: NEG, SQUARE, ...) reads its input through a DEQUANTIZE: the value of the
            input's own quantization, not requantized, so it is not listed.
    """

    op_of: dict[int, int]
    tensor_of: dict[int, int]
    int8_of: dict[int, int]
    requantized: list[tuple[int, int, int]]


def _pair_ops(f: FlatGraph, q: FlatGraph) -> dict[int, int]:
    op_of, j = {}, 0
    for op in f.ops:
        while j < len(q.ops) and q.ops[j].kind != op.kind and q.ops[j].kind in CONVERSIONS:
            j += 1
        if j == len(q.ops) or q.ops[j].kind != op.kind or len(q.ops[j].outputs) != len(
                op.outputs):
            found = q.ops[j].kind if j < len(q.ops) else "the end of the model"
            raise ValueError(
                f"The INT8 model's operators are not the float model's with conversions "
                f"added: float operator {op.index} ({op.kind}, output '{f.name(op.outputs[0])}')"
                f" meets {found}. Received: INT8 operator {j}")
        for a, b in zip(op.outputs, q.ops[j].outputs):
            if f.shape(a) != q.shape(b):
                raise ValueError(
                    f"Float tensor '{f.name(a)}' has shape {f.shape(a)} but its place in the "
                    f"INT8 model has shape {q.shape(b)}. Received: float operator {op.index} "
                    f"({op.kind})")
        op_of[op.index] = j
        j += 1
    extra = [q.ops[k].kind for k in range(j, len(q.ops)) if q.ops[k].kind not in CONVERSIONS]
    if extra:
        raise ValueError(f"The INT8 model has operators the float model lacks: {extra}. "
                         f"Received: {len(q.ops)} INT8 operators")
    return op_of


def _requantized_from(q: FlatGraph, t: int, sources) -> bool:
    """Whether ``t`` is one of ``sources`` or made from one by the quantize step's
    conversions alone."""
    while t not in sources:
        k = q.producer.get(t)
        if k is None or q.ops[k].kind not in CONVERSIONS:
            return False
        t = q.ops[k].inputs[0]
    return True


def _quantized_read(q: FlatGraph, t: int, sources) -> int | None:
    """The quantized tensor whose value an operator reading ``t`` (made from one of
    ``sources`` by conversions) sees: ``t`` itself when quantized, else, for a float read
    (an operator the INT8 model runs in float, after a DEQUANTIZE), the nearest quantized
    tensor back along the conversions; None when that is a source itself or there is none
    (the operator reads the source's own value, in float)."""
    while q.params(t) is None and t not in sources:
        k = q.producer.get(t)
        if k is None or q.ops[k].kind not in CONVERSIONS:
            return None
        t = q.ops[k].inputs[0]
    return None if t in sources or q.params(t) is None else t


def align(f: FlatGraph, q: FlatGraph) -> Alignment:
    """Pair the float model ``f`` with the INT8 model ``q`` made from it (see the module's
    docstring). Raises ValueError naming the first operator where they differ."""
    if len(f.inputs) != len(q.inputs) or len(f.outputs) != len(q.outputs):
        raise ValueError("The float and INT8 models have different inputs or outputs. "
                         f"Received: {len(f.inputs)}/{len(f.outputs)} and "
                         f"{len(q.inputs)}/{len(q.outputs)}")
    op_of = _pair_ops(f, q)
    tensor_of = dict(zip(f.inputs, q.inputs))
    for i, j in op_of.items():
        tensor_of.update(zip(f.ops[i].outputs, q.ops[j].outputs))
    int8_of = {}
    for a, b in tensor_of.items():
        if q.type(b) == INT8:
            int8_of[a] = b
        elif f.type(a) == FLOAT32:
            for k in q.consumers.get(b, []):
                if q.ops[k].kind == "QUANTIZE" and q.type(q.ops[k].outputs[0]) == INT8:
                    int8_of[a] = q.ops[k].outputs[0]
                    break
    requantized = []
    for i, j in op_of.items():
        for p, (a, b) in enumerate(zip(f.ops[i].inputs, q.ops[j].inputs)):
            if a < 0 or f.constant(a) is not None:
                continue
            sources = {tensor_of.get(a), int8_of.get(a)}
            if b in sources:
                continue
            if not _requantized_from(q, b, sources):
                raise ValueError(
                    f"Input {p} of float operator {i} ({f.ops[i].kind}) is '{f.name(a)}', but "
                    f"its INT8 operator reads '{q.name(b)}', which is not made from it. "
                    f"Received: INT8 operator {j}")
            read = _quantized_read(q, b, sources)
            if read is not None:
                requantized.append((i, p, read))
    return Alignment(op_of, tensor_of, int8_of, requantized)


def with_constants(content: bytes, values: dict) -> bytes:
    """``content`` with the constant tensors of ``values`` (tensor index -> array of the
    tensor's shape and type) holding the new values."""
    graph = FlatGraph(content)
    for t, value in values.items():
        tensor = graph.graph.tensors[t]
        old = graph.constant(t)
        if old is None or old.shape != np.shape(value):
            raise ValueError(f"Tensor {t} ('{graph.name(t)}') is not a constant of shape "
                             f"{np.shape(value)}. Received: {None if old is None else old.shape}")
        data = np.ascontiguousarray(np.asarray(value, old.dtype)).tobytes()
        graph.model.buffers[tensor.buffer].data = np.frombuffer(data, np.uint8)
    return internals.write_model(graph.model)
