"""The INT8 model's quantization, each part switchable per sample, in a float TF Lite model.

:func:`build` takes the float flatbuffer the converter calibrated and the INT8 model its
quantize step made of it (paired by :func:`cle._tflite.flatgraph.align`) and writes one float
model in which every quantization the INT8 model applies can be turned on or off, per sample
of a batch, by an extra model input (a *switch*):

* an activation tensor ``t`` becomes ``t + m · (dequantize(quantize(t)) − t)``, with LiteRT's
  own QUANTIZE and DEQUANTIZE operators at the INT8 model's scale and zero point for ``t`` (its
  range: values outside it clip, as they do in the INT8 model);
* an operator with weights (convolution, depthwise, fully connected, transposed convolution)
  gets a second copy of itself run on the same input with the weight *error*: the INT8 model's
  dequantized weights and bias less the float ones, ``W_q − W``. Its output is added,
  times ``m``, to the operator's output before the operator's fused activation, which becomes
  an operator of its own. The operators are linear in their weights, so with ``m = 1`` the sum is
  the operator run with the INT8 model's weights.
* a tensor computed from constants alone (on JAX a bias broadcast to the batch) is a weight:
  its switch is of kind ``weight``;
* an input an INT8 operator reads requantized gets one more quantization, for that operator.

With every switch off the model computes what the float model computes; with every switch on
it is the INT8 model up to the integer kernels' rounding of their sums (which the INT8 model's
real run measures). Switching one layer's quantization alone, on its float inputs, is what
``cle.analyze`` measures with it.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Callable

import numpy as np

from cle._tflite import internals
from cle._tflite.converter import quiet
from cle._tflite.flatgraph import FLOAT32, Alignment, FlatGraph, align, dequantize
from cle._tflite.runtime import fixed_batch, input_details_by_name, interpreter

__all__ = ["QuantSim", "Switch", "build"]

#: Operators with weights: ``kind: (weight input, bias input)``.
WEIGHT_OPS = {"CONV_2D": (1, 2), "DEPTHWISE_CONV_2D": (1, 2), "FULLY_CONNECTED": (1, 2),
              "TRANSPOSE_CONV": (1, 3), "CONV_3D": (1, 2), "CONV_3D_TRANSPOSE": (1, 3)}
#: Operators whose output holds input values only (moved, selected, padded with zeros): with
#: the input's scale and zero point the INT8 model writes them exactly, so they get no switch.
EXACT_OPS = ("PAD", "PADV2", "RESHAPE", "SQUEEZE", "EXPAND_DIMS", "TRANSPOSE", "MAX_POOL_2D",
             "STRIDED_SLICE", "SLICE", "GATHER", "SPACE_TO_DEPTH", "DEPTH_TO_SPACE",
             "CONCATENATION", "SPLIT", "SPLIT_V", "PACK", "UNPACK", "TILE", "BROADCAST_TO",
             "RESIZE_NEAREST_NEIGHBOR", "BATCH_TO_SPACE_ND", "SPACE_TO_BATCH_ND")
# Fused activation codes of the schema and the operator each becomes.
_FUSED = {1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6", 4: "TANH"}


@dataclasses.dataclass
class Switch:
    """One quantization of the INT8 model that the simulation can turn on.

    Attributes:
        index: its column in the switch matrix given to :meth:`QuantSim.run`.
        kind: ``"activation"`` or ``"weight"``.
        tensor: the float model's tensor it quantizes (for a weight switch of an operator,
            that operator's output).
        op: the float model's operator it belongs to: the tensor's producer, the operator
            whose weights it quantizes, or the operator that reads the tensor requantized
            (-1 for a model input).
        params: ``(scales, zero_points, axis)`` of the INT8 tensor (activation switches).
        requantize: an operator's own requantization of its input.
        alternative: 0 for the INT8 model's own quantization; ``k`` for the ``k``-th
            alternative given to :func:`build` for the tensor (switch one of them at a time).
    """

    index: int
    kind: str
    tensor: int
    op: int
    params: tuple | None = None
    requantize: bool = False
    alternative: int = 0


class _Editor:
    """Adds tensors, constants, operator codes and operators to a model object tree."""

    def __init__(self, model):
        self.model = model
        self.graph = model.subgraphs[0]
        self.schema = internals.schema()
        self.names = {v: k for k, v in internals.builtin_operator_names().items()}

    def tensor(self, like: int, name: str, dtype=FLOAT32, params=None, shape=None) -> int:
        s = self.schema
        src = self.graph.tensors[like]
        t = s.TensorT()
        t.shape = np.array(src.shape if shape is None else shape, np.int32)
        signature = src.shapeSignature if shape is None else None
        if signature is not None and len(signature):
            t.shapeSignature = np.array(signature, np.int32)
        elif shape is not None:
            t.shapeSignature = np.array([-1] + list(shape[1:]), np.int32)
        t.type = dtype
        t.name = name.encode()
        if params is not None:
            q = s.QuantizationParametersT()
            q.scale = [float(v) for v in params[0]]
            q.zeroPoint = [int(v) for v in params[1]]
            q.quantizedDimension = int(params[2])
            t.quantization = q
        self.graph.tensors.append(t)
        return len(self.graph.tensors) - 1

    def constant(self, value: np.ndarray, name: str) -> int:
        buffer = self.schema.BufferT()
        buffer.data = np.frombuffer(np.ascontiguousarray(value, np.float32).tobytes(),
                                    np.uint8)
        self.model.buffers.append(buffer)
        t = self.tensor(0, name, shape=value.shape)
        self.graph.tensors[t].shapeSignature = None
        self.graph.tensors[t].buffer = len(self.model.buffers) - 1
        return t

    def code(self, kind: str) -> int:
        number = self.names[kind]
        for i, c in enumerate(self.model.operatorCodes):
            if max(int(c.builtinCode), int(c.deprecatedBuiltinCode)) == number:
                return i
        c = self.schema.OperatorCodeT()
        c.builtinCode, c.deprecatedBuiltinCode, c.version = number, min(number, 127), 1
        self.model.operatorCodes.append(c)
        return len(self.model.operatorCodes) - 1

    def op(self, kind: str, inputs, outputs, options=None, options_type=0):
        o = self.schema.OperatorT()
        o.opcodeIndex = self.code(kind)
        o.inputs = np.array(inputs, np.int32)
        o.outputs = np.array(outputs, np.int32)
        o.builtinOptionsType, o.builtinOptions = options_type, options
        return o

    def arithmetic(self, kind: str, a: int, b: int, out: int):
        s = self.schema
        options = {"ADD": s.AddOptionsT, "SUB": s.SubOptionsT, "MUL": s.MulOptionsT}[kind]()
        number = {"ADD": s.BuiltinOptions.AddOptions, "SUB": s.BuiltinOptions.SubOptions,
                  "MUL": s.BuiltinOptions.MulOptions}[kind]
        return self.op(kind, [a, b], [out], options, number)

    def minmax(self, kind: str, a: int, b: int, out: int):
        s = self.schema
        return self.op(kind, [a, b], [out], s.MaximumMinimumOptionsT(),
                       s.BuiltinOptions.MaximumMinimumOptions)


@dataclasses.dataclass
class QuantSim:
    """The switchable simulation (see the module docstring).

    Attributes:
        content: the float flatbuffer.
        switches: every switch, in the order of the columns of a switch matrix.
        readable: float model tensor -> position among the simulation's outputs of the
            tensor's value in the simulation (switched where it has a switch); with
            ``pre_activations``, also ``("pre", operator)`` for the sum of each operator with
            weights before its activation (its weight error added where switched on).
        float_graph: the float model's :class:`FlatGraph`; ``alignment``: its pairing with
            the INT8 model.
    """

    content: bytes
    switches: list[Switch]
    readable: dict[int, int]
    float_graph: FlatGraph
    alignment: Alignment
    n_inputs: int = 1
    apart: frozenset = frozenset()

    def run(self, x, rows: np.ndarray, masks: np.ndarray,
            consume: Callable[[int, int, Callable], None], batch: int = 16):
        """Run the simulation on ``x[rows[k]]`` with switches ``masks[k]`` (one row of 0/1
        per run, a column per switch), ``batch`` rows per invocation; after each
        invocation ``consume(start, stop, read)`` is called for rows ``start:stop``, where
        ``read(tensor)`` gives a readable tensor's values (a copy), one row per run. ``x``:
        an array (a one-input model) or :class:`cle._core.inputs.ModelInputs`. When a
        switched or readable tensor does not hold one row per sample (:attr:`apart`), the
        rows run one at a time and such a tensor is read whole as its row."""
        arrays, names = (x.arrays, x.names) if hasattr(x, "arrays") else ((x,), ("",))
        with quiet():  # LiteRT announces its XNNPACK delegate on stderr
            interp = interpreter(self.content, delegates=True)
        fixed = fixed_batch(interp, interp.get_input_details()[:self.n_inputs])
        batch = 1 if self.apart or fixed else batch
        size = None
        for start in range(0, len(rows), batch):
            stop = min(start + batch, len(rows))
            if stop - start != size:
                size = stop - start
                model_inputs, switch_inputs, outputs = self._resize(interp, arrays, names,
                                                                    size)
            self._feed(interp, [a[rows[start:stop]] for a in arrays], masks[start:stop],
                       model_inputs, switch_inputs)
            consume(start, stop, lambda t: self._read(interp, outputs, t))

    def _read(self, interp, outputs, t):
        value = interp.get_tensor(outputs[self.readable[t]]["index"])
        tensor = self.float_graph.ops[t[1]].outputs[0] if isinstance(t, tuple) else t
        return value[None] if tensor in self.apart else value

    @staticmethod
    def _feed(interp, arrays, masks, model_inputs, switch_inputs):
        """Set the model inputs and the switches' masks, and invoke."""
        for d, a in zip(model_inputs, arrays):
            interp.set_tensor(d["index"], a)
        for k, d in enumerate(switch_inputs):
            column = masks[:, k].astype(np.float32)
            interp.set_tensor(d["index"], column.reshape((len(masks),) + tuple(d["shape"][1:])))
        interp.invoke()

    def _resize(self, interp, arrays, names, size):
        """Resize the interpreter's inputs to ``size`` rows and allocate; returns the model
        inputs' details (in the order of ``names``), the switches' and the outputs'."""
        details = interp.get_input_details()
        model_inputs = (details[:1] if len(arrays) == 1 else
                        input_details_by_name(interp, names, details[:self.n_inputs]))
        switch_inputs = details[self.n_inputs:]
        for d, a in zip(model_inputs, arrays):
            interp.resize_tensor_input(d["index"], (size,) + a.shape[1:], strict=False)
        for d in switch_inputs:
            interp.resize_tensor_input(d["index"], (size,) + tuple(d["shape"][1:]),
                                       strict=False)
        with quiet():
            interp.allocate_tensors()
        return model_inputs, switch_inputs, interp.get_output_details()


def _rank_mask(editor: _Editor, like: int, k: int) -> int:
    rank = len(editor.graph.tensors[like].shape)
    return editor.tensor(like, f"cle_switch_{k}", shape=(1,) + (1,) * (rank - 1))


def _quantize_switch(ed: _Editor, t: int, params, k: int, base: int | None = None
                     ) -> tuple[int, int]:
    """Emit ``base + m·(dq(q(t)) − t)`` (``base`` defaults to ``t``), the quantization in float
    operators that XNNPACK runs (``q(t) = clamp(round(t / s), −128 − z, 127 − z)``,
    ``dq(q) = q · s``: the int8 value less its zero point); returns ``(switched tensor, mask
    input)``."""
    base = t if base is None else base
    scale, zero = float(params[0][0]), int(params[1][0])
    mask = _rank_mask(ed, t, k)
    name = f"cle_sim_{k}"
    consts = [ed.constant(np.array([v], np.float32), f"{name}/{what}") for what, v in
              (("inv_scale", 1.0 / scale), ("low", -128 - zero), ("high", 127 - zero),
               ("scale", scale))]
    steps = [ed.tensor(t, f"{name}/{what}") for what in
             ("scaled", "rounded", "low", "high", "dq", "err", "m")]
    out = ed.tensor(t, name)
    a, r, lo, hi, dq, err, em = steps
    ed.pending += [ed.arithmetic("MUL", t, consts[0], a), ed.op("ROUND", [a], [r]),
                   ed.minmax("MAXIMUM", r, consts[1], lo), ed.minmax("MINIMUM", lo, consts[2], hi),
                   ed.arithmetic("MUL", hi, consts[3], dq), ed.arithmetic("SUB", dq, t, err),
                   ed.arithmetic("MUL", err, mask, em), ed.arithmetic("ADD", base, em, out)]
    return out, mask


def _rsqrt_floor(ed: _Editor, q: FlatGraph, qop, t: int, op) -> int:
    """The input ``t`` of an RSQRT kept at or above a floor whose inverse square root is
    1000 times the INT8 operator's largest output: where the quantization rounds a
    LayerNormalization's variance plus epsilon to 0, the float RSQRT gave inf (and the layers
    after it NaN) where the INT8 kernel saturates at its output range, which the output's own
    switch then clips to. Float values that low are far past that range already."""
    params = q.params(qop.outputs[0])
    if params is None:
        return t
    top = float((127 - params[1][0]) * params[0][0])
    if not top > 0:
        return t
    floor = ed.constant(np.array([(1e-3 / top) ** 2], np.float32), f"cle_sim_floor_{op.index}")
    out = ed.tensor(t, f"cle_sim_floored_{op.index}")
    ed.pending.append(ed.minmax("MAXIMUM", t, floor, out))
    return out


def _weight_error(f: FlatGraph, q: FlatGraph, op, qop, position) -> np.ndarray | None:
    """The INT8 model's dequantized constant at ``position`` of ``qop`` less the float
    model's, or None when the INT8 model holds it unquantized."""
    t, u = op.inputs[position], qop.inputs[position]
    if t < 0 or u < 0:
        return None
    value, params = q.constant(u), q.params(u)
    if value is None or params is None or q.type(u) == FLOAT32:
        return None
    return (dequantize(value, params) - f.constant(t).astype(np.float64)).astype(np.float32)


def _weight_branch(ed: _Editor, f, q, op, qop, k: int):
    """Emit the operator without its fused activation, its copy on the weight error, the
    switched sum and the activation; returns the mask input, or None without quantized
    weights."""
    w_at, b_at = WEIGHT_OPS[op.kind]
    dw = _weight_error(f, q, op, qop, w_at)
    if dw is None:
        return None
    db = _weight_error(f, q, op, qop, b_at) if b_at < len(op.inputs) else None
    obj, out = op.obj, op.outputs[0]
    options = obj.builtinOptions
    fused = int(getattr(options, "fusedActivationFunction", 0) or 0)
    if fused and fused not in _FUSED:
        raise ValueError(f"Operator {op.index} ({op.kind}) has a fused activation the "
                         f"simulation cannot split. Received: fused activation {fused}")
    name = f"cle_w_{k}"
    pre = ed.tensor(out, name + "/pre")
    delta = copy.copy(obj)
    delta.builtinOptions = copy.copy(options)
    if fused:
        options.fusedActivationFunction = 0
        delta.builtinOptions.fusedActivationFunction = 0
    inputs = list(obj.inputs)
    inputs[w_at] = ed.constant(dw, name + "/dw")
    if b_at < len(inputs) and inputs[b_at] >= 0:
        bias = db if db is not None else np.zeros(f.shape(op.inputs[b_at]), np.float32)
        inputs[b_at] = ed.constant(bias, name + "/db")
    delta.inputs = np.array(inputs, np.int32)
    d, scaled = ed.tensor(out, name + "/d"), ed.tensor(out, name + "/m")
    summed = ed.tensor(out, name + "/sum") if fused else out
    mask = _rank_mask(ed, out, k)
    delta.outputs = np.array([d], np.int32)
    obj.outputs = np.array([pre], np.int32)
    ed.pending += [obj, delta, ed.arithmetic("MUL", d, mask, scaled),
                   ed.arithmetic("ADD", pre, scaled, summed)]
    if fused:
        ed.pending.append(ed.op(_FUSED[fused], [summed], [out]))
    ed.pre[op.index] = summed
    return mask


def _same(a, b) -> bool:
    return (a is not None and b is not None and a[0].size == b[0].size == 1
            and np.allclose(a[0], b[0], rtol=1e-6, atol=0) and np.array_equal(a[1], b[1]))


def _exact(f: FlatGraph, q: FlatGraph, op, qop, u) -> bool:
    """Whether the INT8 operator of an :data:`EXACT_OPS` operator writes ``u`` at the scale
    and zero point of every activation input it reads (so rounding adds nothing)."""
    if op.kind not in EXACT_OPS or u is None:
        return False
    reads = [b for a, b in zip(op.inputs, qop.inputs)
             if a >= 0 and f.type(a) == FLOAT32 and f.constant(a) is None]
    return bool(reads) and all(_same(q.params(b), q.params(u)) for b in reads)


def build(float_content: bytes, int8_content: bytes, watch=(), alternatives=None,
          pre_activations=False, like=None) -> QuantSim:
    """The switchable simulation of ``int8_content`` on ``float_content`` (see the module
    docstring). Every activation tensor with a switch, every model output and the float
    model's tensors in ``watch`` are readable. ``alternatives``: float tensor -> list of
    other ``(scales, zero_points, axis)`` to quantize it with, each under a switch of its own
    (an activation range to try in its place). ``pre_activations`` makes each operator's
    sum before its activation readable too. ``like``: inputs
    (:class:`cle._core.inputs.ModelInputs`, or a one-input model's array) whose sample shapes
    the file is probed at, for an input whose size is free (a fully convolutional net; else
    the file's own shape)."""
    alternatives = alternatives or {}
    f, q = FlatGraph(float_content), FlatGraph(int8_content)
    alignment = align(f, q)
    work = FlatGraph(float_content)  # the copy that is edited
    ed = _Editor(work.model)
    ed.pending, ed.pre = [], {}
    weights_kind = f.constant_derived()
    switches, masks, current = [], [], {}
    requant = {}
    for i, p, u in alignment.requantized:
        requant.setdefault(i, []).append((p, u))

    def switch(t, op, kind, params, requantize=False):
        k = len(switches)
        out, mask = _quantize_switch(ed, current.get(t, t), params, k)
        switches.append(Switch(k, kind, t, op, params, requantize))
        masks.append(mask)
        return out

    def activation(t, op):
        u = alignment.int8_of.get(t)
        if op >= 0 and _exact(f, q, f.ops[op], q.ops[alignment.op_of[op]], u):
            return
        if (u is not None and f.type(t) == FLOAT32 and q.params(u) is not None
                and len(f.shape(t)) >= 2):  # a rank-1 tensor has no row of its own to switch
            kind = "weight" if t in weights_kind else "activation"
            current[t] = switch(t, op, kind, q.params(u))
            for j, params in enumerate(alternatives.get(t, ()), 1):
                k = len(switches)
                current[t], mask = _quantize_switch(ed, t, params, k, base=current[t])
                switches.append(Switch(k, kind, t, op, params, alternative=j))
                masks.append(mask)

    for t in f.inputs:
        activation(t, -1)
    for op, work_op in zip(f.ops, work.ops):
        inputs = [current.get(t, t) if t >= 0 else t for t in op.inputs]
        for p, u in requant.get(op.index, []):
            if len(f.shape(op.inputs[p])) < 2:
                continue
            kind = "weight" if op.inputs[p] in weights_kind else "activation"
            inputs[p] = switch(op.inputs[p], op.index, kind, q.params(u), True)
        qop = q.ops[alignment.op_of[op.index]]
        if op.kind == "RSQRT":  # its input may be switched, or moved from a switched one
            inputs[0] = _rsqrt_floor(ed, q, qop, inputs[0], op)
        work_op.obj.inputs = np.array(inputs, np.int32)
        mask = None
        if op.kind in WEIGHT_OPS:
            mask = _weight_branch(ed, f, q, work_op, qop, len(switches))
        if mask is None:
            ed.pending.append(work_op.obj)
        else:
            switches.append(Switch(len(switches), "weight", op.outputs[0], op.index))
            masks.append(mask)
        for t in op.outputs:
            activation(t, op.index)
    return _finish(ed, work, f, alignment, switches, masks, current, watch, pre_activations,
                   float_content, like)


def _finish(ed, work, f, alignment, switches, masks, current, watch, pre,
            float_content, like) -> QuantSim:
    graph = ed.graph
    graph.operators = ed.pending
    graph.inputs = np.array(list(work.inputs) + masks, np.int32)
    readable = {t: current[t] for t in current}
    for t in list(f.outputs) + list(watch):
        readable.setdefault(t, t)
    if pre:
        readable.update({("pre", op): t for op, t in ed.pre.items()})
    order = list(readable)
    graph.outputs = np.array([readable[t] for t in order], np.int32)
    content = internals.write_model(ed.model)
    tensors = {s.tensor for s in switches} | {
        f.ops[t[1]].outputs[0] if isinstance(t, tuple) else t for t in order}
    return QuantSim(content, switches, {t: p for p, t in enumerate(order)}, f, alignment,
                    n_inputs=len(work.inputs), apart=frozenset(
                        tensors - batch_leading(float_content, tensors, like)))


def batch_leading(content: bytes, tensors, like=None) -> set[int]:
    """The tensors of ``tensors`` that hold one row per sample: shape ``(1, ...)`` on one
    sample and ``(2, ...)`` on two (found by running ``content`` on zeros, each input of the
    sample shape of ``like``'s, when given, else of the file's: an input whose size is free
    has a placeholder of 1 there, too small for a pooling). Others hold several samples in
    one row or one sample in several: JAX's export runs a Dense layer on a sequence as one
    matrix product over ``(samples × positions, features)``."""
    shapes = []
    named = hasattr(like, "names")  # ModelInputs, or one input's array
    for n in (1, 2):
        interp = interpreter(content, preserve_all_tensors=True)
        details = (input_details_by_name(interp, like.names) if named else
                   interp.get_input_details())
        samples = ([tuple(d["shape"][1:]) for d in details] if like is None else
                   [tuple(a.shape[1:]) for a in (like.arrays if named else [like])])
        if n == 2 and fixed_batch(interp, details):  # runs one at a time: (1, ...) is a row
            return {t for t in tensors if shapes[0][t][:1] == (1,)}
        for d, sample in zip(details, samples):
            interp.resize_tensor_input(d["index"], (n,) + sample, strict=False)
        interp.allocate_tensors()
        for d, sample in zip(details, samples):
            interp.set_tensor(d["index"], np.zeros((n,) + sample, d["dtype"]))
        with np.errstate(all="ignore"):
            interp.invoke()
        shapes.append({t: tuple(interp.get_tensor(t).shape) for t in tensors})
    one, two = shapes
    return {t for t in tensors if one[t][:1] == (1,) and two[t] == (2,) + one[t][1:]}
