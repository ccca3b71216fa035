"""Weights stored as the rounding chose them: INT4 (or INT8) weight tensors written into the
converter's full-INT8 flatbuffer.

TF Lite's converter writes 8-bit weights only: for a kernel already on a grid ``w = k·s``
(``k`` integers, one step ``s`` per output channel or per tensor) it writes ``q8 = round(w /
s8)`` with its own step ``s8 = max|w| / 127``, which holds the grid only approximately.
:func:`store_weights` puts the grid back exactly: it finds, by value, the Keras layer each
weight tensor of a CONV_2D, DEPTHWISE_CONV_2D or FULLY_CONNECTED operator holds (the
converter's ``q8·s8`` is within half a step of the layer's kernel; where several layers are,
operators and layers are paired for the least distance, their biases too, each rounded layer
written once), writes ``k`` with the step ``s`` and requantizes the operator's int32 bias from
the layer's float bias to its new scale ``input scale · s``.

Storage (measured with ``ai_edge_litert`` 2.3; docs/quantize_w4.md): CONV_2D (grouped too),
DEPTHWISE_CONV_2D and FULLY_CONNECTED run ``TensorType.INT4`` weights, bit for bit as an INT8
tensor holding the same integers; TRANSPOSE_CONV refuses them when the model is loaded. INT4
is packed two values per byte, the first element in the low nibble, in row-major order, into
exactly ``ceil(n/2)`` bytes (the runtime does not check a longer buffer: one value per byte
loads and runs with wrong outputs); zero points are 0; the quantized dimension is the
converter's (0 for CONV_2D and FULLY_CONNECTED, 3 for DEPTHWISE_CONV_2D). The converter shares
buffers of equal constants (two all-zero biases), so a tensor is never changed in a buffer
another tensor reads: it gets its own.

Every flatbuffer access goes through :mod:`cle._tflite.internals`.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np

from cle._core.keras_internals import sublayers
from cle._core.layouts import kernel_layers, layout_of
from cle._math.rounding import grid_max, grid_min
from cle._tflite import internals
from cle._tflite.targets import DEFAULT_TARGET, TARGETS, Target

__all__ = ["INT4_OPS", "INT8_BYTES_PER_CHANNEL", "INT8_BYTES_PER_LAYER", "LayerWeights",
           "StoredWeight", "int8_file_bytes", "int8_twin", "pack_int4", "store_weights",
           "unpack_int4", "weight_storage"]

#: Builtin operator -> (activation input, weight, bias) input slots.
WEIGHT_SLOTS = {"CONV_2D": (0, 1, 2), "DEPTHWISE_CONV_2D": (0, 1, 2),
                "FULLY_CONNECTED": (0, 1, 2), "TRANSPOSE_CONV": (2, 1, 3)}
#: The runtime whose INT4 rules apply when the caller names none.
LITERT = TARGETS[DEFAULT_TARGET]
#: Operators whose INT4 weights LiteRT runs (the default target's table).
INT4_OPS = tuple(LITERT.int4)
#: Why an operator kind keeps 8-bit weights on LiteRT.
NO_INT4 = dict(LITERT.no_int4)
#: The largest magnitude a requantized int32 bias is given (a margin below 2^31 - 1).
BIAS_LIMIT = 2.0 ** 31 * 0.99
#: A kernel matches a weight tensor when every value is within this many of the converter's
#: steps of it (half a step is its rounding; the margin covers float32 round-off).
MATCH_STEPS = 0.5 + 1e-3
#: The pairing's extra cost for a kernel found in another layout than its own (a 1-D
#: kernel as a column): where a 2-D kernel of that shape holds the same values, each keeps
#: its own operator.
OTHER_LAYOUT = 1e-3
#: The pairing's extra cost for a kernel found only scaled (:func:`_scaled_error`): a tensor
#: that holds a kernel as it is takes it first.
SCALED = 1e-2


@dataclasses.dataclass
class LayerWeights:
    """One Keras layer with a kernel, as the writer sees it.

    Attributes:
        layer: the layer's name.
        kind: "conv", "depthwise", "dense" or "transpose".
        kernel: the kernel (Keras layout) as the model holds it.
        bias: the float bias, or None.
        bits: the grid's bits when the rounding put the kernel on one (4 or 8), else None.
        scales: the grid's steps, one per output channel (the layer's order) or one.
        reason: why the layer was not rounded (None if it was).
        wide_reason: why a kernel rounded for a narrower target is on an 8-bit grid, or on a
            per-tensor grid where per-channel ones were asked for (None otherwise).
    """

    layer: str
    kind: str
    kernel: np.ndarray
    bias: np.ndarray | None = None
    bits: int | None = None
    scales: np.ndarray | None = None
    reason: str | None = None
    wide_reason: str | None = None

    def tflite_kernel(self) -> np.ndarray | None:
        """The kernel in the flatbuffer's layout (None for a kind it does not know)."""
        k = np.asarray(self.kernel)
        if self.kind == "conv" and k.ndim == 4:
            return k.transpose(3, 0, 1, 2)  # (O, kh, kw, C/g)
        if self.kind == "conv" and k.ndim == 3:  # Conv1D, a CONV_2D over one row
            return k.transpose(2, 0, 1)[:, None]  # (O, 1, k, C/g)
        if self.kind == "depthwise" and k.ndim == 4:
            return k.reshape((1,) + k.shape[:2] + (-1,))  # (1, kh, kw, C·m)
        if self.kind == "depthwise" and k.ndim == 3:  # 1-D, over one row
            return k.reshape((1, 1, k.shape[0], -1))  # (1, 1, k, C·m)
        if self.kind == "dense" and k.ndim == 2:
            return k.T
        if self.kind == "transpose" and k.ndim == 4:
            return k.transpose(2, 0, 1, 3)  # (O, kh, kw, I)
        return None

    def tflite_layouts(self) -> list[np.ndarray]:
        """:meth:`tflite_kernel` and the other layouts a converter writes it in: a 1-D
        convolution's sequence as the kernel's row (from TensorFlow) or its column (from
        JAX)."""
        k = self.tflite_kernel()
        if k is None:
            return []
        if self.kind in ("conv", "depthwise") and np.ndim(self.kernel) == 3 and k.shape[2] > 1:
            return [k, k.reshape(k.shape[0], k.shape[2], 1, k.shape[3])]
        return [k]


@dataclasses.dataclass
class StoredWeight:
    """How one weight tensor of the ``.tflite`` is stored, and why.

    Attributes:
        op: the operator reading it (``"CONV_2D"``, ...), or "" when no operator holds the
            layer.
        layer: the Keras layer whose kernel it holds ("" when none matched).
        storage: the tensor type (``"INT4"``, ``"INT8"``, ``"FLOAT32"``).
        per_channel: one scale per output channel (else one per tensor).
        shape: the tensor's shape.
        nbytes: bytes of its data.
        reason: why it is stored so.
        rounded: it holds the grid the rounding chose, exactly.
    """

    op: str
    layer: str
    storage: str
    per_channel: bool
    shape: tuple
    nbytes: int
    reason: str
    rounded: bool = False

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"shape": list(self.shape)}


def pack_int4(k) -> np.ndarray:
    """Integers in [−8, 7] (any shape, row-major) as bytes, two per byte: element ``2i`` in
    the low nibble, ``2i+1`` in the high one; an odd count ends with a zero high nibble."""
    flat = np.asarray(k).astype(np.int64).ravel()
    if flat.size and (flat.min() < -8 or flat.max() > 7):
        raise ValueError(f"INT4 values must lie in [-8, 7]. Received: values from "
                         f"{flat.min()} to {flat.max()}")
    nib = (flat & 0xF).astype(np.uint8)
    if nib.size % 2:
        nib = np.concatenate([nib, np.zeros(1, np.uint8)])
    return nib[0::2] | (nib[1::2] << 4)


def unpack_int4(data, count: int) -> np.ndarray:
    """The first ``count`` signed values of :func:`pack_int4`'s bytes, as int8."""
    b = np.frombuffer(bytes(bytearray(data)), np.uint8)
    nib = np.empty(b.size * 2, np.int16)
    nib[0::2], nib[1::2] = b & 0xF, b >> 4
    nib = nib[:count]
    return np.where(nib > 7, nib - 16, nib).astype(np.int8)


def _u8(data) -> np.ndarray:
    if data is None:
        return np.zeros(0, np.uint8)
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).view(np.uint8).ravel()
    return np.frombuffer(bytes(bytearray(data)), np.uint8)


class _Flat:
    """The flatbuffer's main subgraph with the bookkeeping an edit needs."""

    def __init__(self, content):
        self.model = internals.read_model(content)
        self.graph = self.model.subgraphs[0]
        self.types = internals.tensor_type_codes()
        self.type_names = {v: k for k, v in self.types.items()}
        names = internals.builtin_operator_names()
        self.kinds = []
        for op in self.graph.operators:
            code = self.model.operatorCodes[op.opcodeIndex]
            self.kinds.append(names.get(max(int(code.builtinCode),
                                            int(code.deprecatedBuiltinCode)), "?"))

    def tensor(self, i):
        return self.graph.tensors[int(i)]

    def data(self, i) -> np.ndarray:
        return _u8(self.model.buffers[self.tensor(i).buffer].data)

    def readers(self, i) -> int:
        return sum(int(t) == int(i) for op in self.graph.operators for t in op.inputs)

    def own_tensor(self, op, slot):
        """The tensor at ``op.inputs[slot]``, cloned first if another operator reads it."""
        i = int(op.inputs[slot])
        if self.readers(i) > 1:
            clone = copy.deepcopy(self.tensor(i))
            self.graph.tensors.append(clone)
            op.inputs[slot] = i = len(self.graph.tensors) - 1
        return i

    def set_data(self, i, data):
        """Tensor ``i`` holds ``data`` (uint8) in a buffer no other tensor reads."""
        t = self.tensor(i)
        refs = sum(int(x.buffer) == int(t.buffer) for sg in self.model.subgraphs
                   for x in sg.tensors)
        if t.buffer != 0 and refs == 1:
            self.model.buffers[t.buffer].data = data
        else:
            self.model.buffers.append(internals.new_buffer(data))
            t.buffer = len(self.model.buffers) - 1

    def weights(self):
        """``(op index, op, kind, weight tensor index)`` of every operator with weights."""
        for oi, (op, kind) in enumerate(zip(self.graph.operators, self.kinds)):
            if kind in WEIGHT_SLOTS and len(op.inputs) > WEIGHT_SLOTS[kind][1]:
                yield oi, op, kind, int(op.inputs[WEIGHT_SLOTS[kind][1]])


def _dequantized(flat, wi):
    """``(values, steps broadcast to them, quantized dimension)`` of an INT8 weight tensor."""
    t = flat.tensor(wi)
    shape = tuple(int(d) for d in t.shape)
    q8 = flat.data(wi).view(np.int8).reshape(shape).astype(np.float64)
    s8 = np.asarray(t.quantization.scale, np.float64)
    qdim = int(t.quantization.quantizedDimension or 0)
    steps = s8.reshape([-1 if a == qdim else 1 for a in range(len(shape))]) \
        if s8.size > 1 else s8.reshape((1,) * len(shape))
    return q8 * steps, np.broadcast_to(steps, shape), qdim


def _converter_bias(flat, op, kind, s8, what=None):
    """``(converter's float bias, its steps, input scale)`` of the operator with the
    converter's weight steps ``s8``, or None without an INT32 bias input. A bias of another
    type raises, naming the layer ``what`` (None: no bias to compare, no error)."""
    a_slot, _, b_slot = WEIGHT_SLOTS[kind]
    if b_slot >= len(op.inputs) or op.inputs[b_slot] < 0:
        return None
    t = flat.tensor(op.inputs[b_slot])
    if t.type != flat.types["INT32"]:
        if what is None:
            return None
        raise ValueError(f"layer '{what}': the {kind} bias is "
                         f"{flat.type_names.get(t.type)}, not INT32")
    b32 = flat.data(op.inputs[b_slot]).view(np.int32).astype(np.float64)
    s8 = np.asarray(s8, np.float64).ravel()
    s_in = float(flat.tensor(op.inputs[a_slot]).quantization.scale[0])
    old = np.broadcast_to(s8, b32.shape) * s_in
    return b32 * old, old, s_in


def _holds_bias(converted, entry):
    """Whether the converter's bias ``(value, steps)`` holds ``entry``'s float bias: within
    half a step of it (and float32 round-off) in every channel. True when either has none to
    compare."""
    if converted is None or entry.bias is None:
        return True
    value, old = converted[:2]
    bias = np.asarray(entry.bias, np.float64).ravel()
    return bias.size != value.size or bool(
        np.all(np.abs(bias - value) <= old * 1.001 + 1e-6 * np.abs(bias)))


def _assign(flat, ops, by_shape):
    """``{operator index: entry}``: the layer whose kernel each INT8 weight tensor of ``ops``
    (``(op index, op, kind, tensor index, shape)``) holds. A tensor holds a kernel when it is
    within :data:`MATCH_STEPS` of it, and several kernels can be (equal kernels, as untrained
    twin layers or kernels whose inputs the calibration never reached have). So operators and
    layers are paired for the least total distance, over all operators at once
    (``scipy.optimize.linear_sum_assignment``; a layer whose bias the operator's bias does
    not hold costs one step more, a layer in another layout than its own, as a 1-D kernel
    written as a column, :data:`OTHER_LAYOUT` more; a rounded kernel the tensor holds only
    times a factor, :func:`_scaled_error`, :data:`SCALED` more): a rounded layer is written
    into one operator at most, and none is left out when each can be held. A layer that is
    not rounded (a shared layer, one the rounding left to the converter) is never written,
    only named: each operator may take the closest such layer instead, at its own distance.
    ``by_shape``: ``{shape: [(entry, kernel in that shape, its own layout)]}``. Returns
    ``{operator index: (entry, factor)}``, ``factor`` the scaling the operator's kernel has
    (1: none)."""
    from scipy.optimize import linear_sum_assignment

    rounded = list({id(e): e for group in by_shape.values() for e, _, _ in group
                    if e.bits is not None}.values())
    column = {id(e): c for c, e in enumerate(rounded)}
    n = len(ops)
    if not n:
        return {}
    # columns: the rounded layers, then one per operator for its closest other layer
    cost = np.full((n, len(rounded) + n), np.inf)
    factors = np.ones((n, len(rounded)))  # of the rounded layers' columns
    other = [None] * n
    for i, (_, op, kind, wi, shape) in enumerate(ops):
        candidates = by_shape.get(shape, [])
        if not candidates:
            continue
        values, steps, _ = _dequantized(flat, wi)
        inv = 1.0 / np.where(steps > 0, steps, 1.0)
        converted = (_converter_bias(flat, op, kind, flat.tensor(wi).quantization.scale)
                     if any(e.bits is not None for e, _, _ in candidates) else None)
        for entry, kernel, own in candidates:
            err, factor = float(np.max(np.abs(values - kernel) * inv, initial=0.0)), 1.0
            if err > MATCH_STEPS:
                if entry.bits is None:
                    continue
                err, factor = _scaled_error(values, kernel, inv)
                if err > MATCH_STEPS:
                    continue
                err += SCALED
            err += 0.0 if own else OTHER_LAYOUT
            if entry.bits is None:
                if err < cost[i, len(rounded) + i]:
                    cost[i, len(rounded) + i], other[i] = err, (entry, 1.0)
            else:
                c = column[id(entry)]
                err += not _holds_bias(converted, entry)
                if err < cost[i, c]:
                    cost[i, c], factors[i, c] = err, factor
    allowed = np.isfinite(cost)
    rows, cols = linear_sum_assignment(np.where(allowed, cost, 1e9))
    out = {}
    for i, c in zip(rows, cols):
        if allowed[i, c]:
            out[ops[i][0]] = (rounded[c], factors[i, c]) if c < len(rounded) else other[i]
    return out


def _scaled_error(values, kernel, inv):
    """``(error in steps, c)``: how far ``values`` are from ``c · kernel``, in the converter's
    steps, for ``c`` the ratio of their largest magnitudes (the converter's grid ends at
    the kernel's largest weight, so that weight is held exactly). TF Lite's converter folds
    a multiplication of a convolution's input by one constant (a ``Rescaling`` layer without
    offset, before or after a zero padding) into its kernel; the kernel's grid, its steps
    times ``c``, still holds it exactly."""
    top = float(np.max(np.abs(kernel), initial=0.0))
    c = float(np.max(np.abs(values), initial=0.0)) / top if top > 0 else 0.0
    if not c > 0:
        return np.inf, 1.0
    return float(np.max(np.abs(values - c * kernel) * inv, initial=0.0)), c


def _bias_value(flat, op, kind, entry, s8):
    """``(float bias, input scale)`` of the operator (None without an INT32 bias input): the
    layer's float bias when the converter's bias holds it, else the converter's integers."""
    converted = _converter_bias(flat, op, kind, s8, entry.layer)
    if converted is None:
        return None
    value, _, s_in = converted
    if (entry.bias is not None and np.size(entry.bias) == value.size
            and _holds_bias(converted, entry)):
        value = np.asarray(entry.bias, np.float64).ravel()
    return value, s_in


def _grid_integers(entry, kernel, qdim, s8, factor=1.0):
    """``(k, steps)``: the integers of ``entry``'s grid, its steps times ``factor``, in the
    flatbuffer's layout (a channel of step 0, all zeros, keeps the converter's step ``s8``);
    raises if the kernel is not on the grid."""
    s = np.asarray(entry.scales, np.float64).ravel() * factor
    if np.any(s <= 0):
        fallback = np.broadcast_to(np.where(s8 > 0, s8, 1.0), s.shape)
        s = np.where(s > 0, s, fallback)
    shape = [-1 if a == qdim else 1 for a in range(kernel.ndim)]
    steps = s.reshape(shape) if s.size > 1 else s.reshape((1,) * kernel.ndim)
    k = np.round(kernel / np.where(steps > 0, steps, 1.0))
    off = np.abs(kernel - k * steps) / np.where(steps > 0, steps, 1.0)
    if (k.max(initial=0) > grid_max(entry.bits) or k.min(initial=0) < grid_min(entry.bits)
            or off.max(initial=0.0) > 1e-3):
        raise ValueError(f"layer '{entry.layer}': its kernel is not on its {entry.bits}-bit "
                         f"grid (off by up to {off.max(initial=0.0):.2g} steps)")
    return k.astype(np.int8), s


def _write_weight(flat, op, kind, entry, k, s, target=LITERT):
    """Store ``k`` with steps ``s`` as the operator's weight (INT4 where ``target`` runs it);
    returns the storage name."""
    slot = WEIGHT_SLOTS[kind][1]
    wi = flat.own_tensor(op, slot)
    t = flat.tensor(wi)
    int4 = entry.bits <= 4 and target.int4_refusal(kind, np.size(s) > 1) is None
    flat.set_data(wi, pack_int4(k) if int4 else k.ravel().view(np.uint8))
    t.type = flat.types["INT4" if int4 else "INT8"]
    t.quantization.scale = np.asarray(s, np.float32)
    t.quantization.zeroPoint = np.zeros(s.size, np.int64)
    t.quantization.min = t.quantization.max = None
    return "INT4" if int4 else "INT8"


def _fit_bias(flat, op, kind, entry, kernel, qdim, s8, k, s):
    """``(k, s)`` with the step of every channel whose bias would overflow int32 on the scale
    ``input scale · s`` widened until it fits (its kernel rounded again to nearest on the
    wider grid), as TF Lite's converter widens weight scales for the same reason; such a
    channel's weights are negligible next to its bias."""
    found = _bias_value(flat, op, kind, entry, s8)
    if found is None:
        return k, s
    value, s_in = found
    need = np.abs(value) / (s_in * BIAS_LIMIT)
    need = np.full(s.shape, need.max(initial=0.0)) if s.size == 1 else need.reshape(s.shape)
    wide = need > s
    if not wide.any():
        return k, s
    s = np.where(wide, need, s)
    shape = [-1 if a == qdim else 1 for a in range(kernel.ndim)]
    steps = s.reshape(shape) if s.size > 1 else s.reshape((1,) * kernel.ndim)
    again = np.clip(np.round(kernel / steps), grid_min(entry.bits),
                    grid_max(entry.bits)).astype(np.int8)
    mask = np.broadcast_to(wide.reshape(shape) if s.size > 1 else wide.reshape(
        (1,) * kernel.ndim), kernel.shape)
    return np.where(mask, again, k), s


def _write_bias(flat, op, kind, entry, s8, s):
    """Requantize the operator's int32 bias to the scale ``input scale · s``."""
    found = _bias_value(flat, op, kind, entry, s8)
    if found is None:
        return
    value, s_in = found
    bi = flat.own_tensor(op, WEIGHT_SLOTS[kind][2])
    t = flat.tensor(bi)
    new = np.broadcast_to(np.asarray(s, np.float64).ravel(), value.shape) * s_in
    b_new = np.round(value / np.where(new > 0, new, 1.0))
    if np.abs(b_new).max(initial=0) >= 2 ** 31:
        raise ValueError(f"layer '{entry.layer}': its requantized bias overflows int32")
    flat.set_data(bi, b_new.astype(np.int32).view(np.uint8))
    # one scale for a per-tensor weight (the runtime reads the bias's first scale against
    # the weight's one), else as many as the converter wrote
    n_scales = 1 if np.size(s) == 1 else len(t.quantization.scale)
    t.quantization.scale = np.asarray(new[:n_scales] if n_scales == value.size
                                      else new[:1], np.float32)
    t.quantization.zeroPoint = np.zeros(n_scales, np.int64)


def store_weights(content: bytes, layers: list[LayerWeights], target: Target | None = None
                  ) -> tuple[bytes, list]:
    """The flatbuffer ``content`` with the kernel of every layer of ``layers`` that has a grid
    stored exactly on it (INT4 for 4-bit grids where ``target``'s runtime runs the operator
    with INT4 weights at that granularity, :meth:`cle._tflite.targets.Target.int4_refusal`;
    INT8 otherwise; None: LiteRT's rules), and the :class:`StoredWeight` of every weight
    tensor (and of every rounded layer no operator holds).

    Raises:
        ValueError: a rounded kernel is not on its grid, or a bias is not INT32.
    """
    target = LITERT if target is None else target
    flat = _Flat(content)
    by_shape: dict[tuple, list] = {}
    for entry in layers:
        for j, kernel in enumerate(entry.tflite_layouts()):
            by_shape.setdefault(kernel.shape, []).append((entry, kernel, j == 0))
    stored, held = [], set()
    ops = [(oi, op, kind, wi, _describe(flat, kind, wi)) for oi, op, kind, wi in flat.weights()]
    assigned = _assign(flat, [(oi, op, kind, wi, row.shape) for oi, op, kind, wi, row in ops
                              if row.storage == "INT8"], by_shape)
    for oi, op, kind, wi, row in ops:
        entry, factor = assigned.get(oi, (None, 1.0))
        if entry is not None:
            row.layer = entry.layer
            row.reason = entry.reason or row.reason
        if entry is None or entry.bits is None:
            stored.append(row)
            continue
        held.add(id(entry))
        q = flat.tensor(wi).quantization
        s8 = np.asarray(q.scale, np.float64)
        qdim = int(q.quantizedDimension or 0)
        # the operator's layout (and the converter's scaling, when it folded one into it)
        kernel = entry.tflite_kernel().reshape(row.shape) * factor
        k, s = _grid_integers(entry, kernel, qdim, s8, factor)
        k, s = _fit_bias(flat, op, kind, entry, kernel, qdim, s8, k, s)
        row.storage = _write_weight(flat, op, kind, entry, k, s, target)
        row.rounded, row.per_channel = True, bool(np.size(s) > 1)
        _write_bias(flat, op, kind, entry, s8, s)
        row.nbytes = int(flat.data(op.inputs[WEIGHT_SLOTS[kind][1]]).size)
        row.reason = (f"on its {entry.bits}-bit grid" if row.storage == "INT4" or entry.bits > 4
                      else f"on its {entry.bits}-bit grid, kept in INT8: "
                           f"{target.int4_refusal(kind, np.size(s) > 1)}")
        if entry.wide_reason:
            row.reason += f": {entry.wide_reason}"
        if factor != 1.0:
            row.reason += (f" (TF Lite's converter folded a scaling of its input by {factor:.6g} "
                           "into the kernel; its steps are scaled with it)")
        stored.append(row)
    for entry in layers:
        if entry.bits is not None and id(entry) not in held:
            stored.append(StoredWeight("", entry.layer, "", np.size(entry.scales) > 1, (), 0,
                                       "rounded, but no weight tensor of the .tflite holds it "
                                       "(kept as TF Lite's converter wrote it)"))
    return internals.write_model(flat.model), stored


def _describe(flat, kind, wi) -> StoredWeight:
    """The :class:`StoredWeight` of weight tensor ``wi`` as the flatbuffer holds it."""
    t = flat.tensor(wi)
    type_name = flat.type_names.get(t.type, str(t.type))
    q = t.quantization
    per_channel = q is not None and q.scale is not None and len(q.scale) > 1
    reason = ("not rounded by cle: 8 bits, rounded to nearest by TF Lite's converter"
              if type_name == "INT8" else "as TF Lite's converter wrote it")
    return StoredWeight(kind, "", type_name, per_channel, tuple(int(d) for d in t.shape),
                        int(flat.data(wi).size), reason)


def weight_storage(content: bytes) -> list[StoredWeight]:
    """How every weight tensor of a flatbuffer is stored, in operator order (read from the
    flatbuffer's tensor types: LiteRT's interpreter reports an INT4 tensor as int8)."""
    flat = _Flat(content)
    return [_describe(flat, kind, wi) for _, _, kind, wi in flat.weights()]


def int8_twin(content: bytes) -> bytes:
    """``content`` with every INT4 weight tensor stored as INT8 holding the same integers
    (the same scales and biases): what the INT4 model computes. Bit for bit in LiteRT's
    builtin kernels and in TF Lite Micro; LiteRT's default delegate (XNNPACK) may differ by
    one output step between the two."""
    flat = _Flat(content)
    for _, op, kind, wi in list(flat.weights()):
        t = flat.tensor(wi)
        if t.type != flat.types["INT4"]:
            continue
        count = int(np.prod([int(d) for d in t.shape]))
        k = unpack_int4(flat.data(wi), count)
        flat.set_data(wi, k.view(np.uint8))
        t.type = flat.types["INT8"]
    return internals.write_model(flat.model)


#: Bytes an 8-bit ``.tflite`` spends per output channel of a kernel besides the kernel itself:
#: the INT32 bias, and the weight's and the bias's quantization (a float32 scale and an int64
#: zero point each), 28; the flatbuffer's own structure measured 26-27 per channel all told on
#: MobileNetV2 and EfficientNetB0 (``keras.applications``).
INT8_BYTES_PER_CHANNEL = 28
#: Bytes an 8-bit ``.tflite`` spends per Keras layer on its operators and tensors (names,
#: shapes, activation ranges): MobileNetV2 and EfficientNet-Lite1 measured about 530 with
#: BN folded; taken from above.
INT8_BYTES_PER_LAYER = 640


def int8_file_bytes(model) -> int:
    """An estimate, from above, of the bytes of ``model``'s 8-bit ``.tflite``: the kernel of
    each layer keras-cle knows (Conv2D, DepthwiseConv2D, Conv2DTranspose, Dense, both of a
    SeparableConv's, ...) one byte per weight and :data:`INT8_BYTES_PER_CHANNEL` per output
    channel (its bias included); every other weight four bytes; and
    :data:`INT8_BYTES_PER_LAYER` per layer (twice for a separable one: two operators). From
    above on the networks measured (MobileNetV2 and EfficientNet-Lite1, from TensorFlow and
    from JAX); on a small network converted from JAX, whose biases are tensors and operators
    of their own under long names, it read a few percent low."""
    rest = {id(v): int(np.prod(v.shape)) for v in model.weights}
    total = INT8_BYTES_PER_LAYER * len(sublayers(model))
    for layer in kernel_layers(model):
        layout = layout_of(layer)
        kernel = getattr(layer, layout.out_kernel, None)
        if kernel is None or id(kernel) not in rest:
            continue
        if layout.out_kernel == layout.in_kernel:
            kernels = [(kernel, layout.kind == "depthwise", layout.out_axis)]
        elif layout.kind == "separable":  # a DEPTHWISE_CONV_2D and a 1x1 CONV_2D
            kernels = [(getattr(layer, layout.in_kernel), True, -1), (kernel, False, -1)]
            total += INT8_BYTES_PER_LAYER  # its second operator
        else:
            continue
        for var, depthwise, axis in kernels:
            shape = tuple(var.shape)
            channels = shape[-2] * shape[-1] if depthwise else shape[axis]
            total += rest.pop(id(var), 0) + INT8_BYTES_PER_CHANNEL * int(channels)
        bias = getattr(layer, "bias", None)
        if bias is not None:
            rest.pop(id(bias), None)
    return total + 4 * sum(rest.values())
