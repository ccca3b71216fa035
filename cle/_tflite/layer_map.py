"""Which operators and tensors of a TF Lite model compute which Keras layer, found by value.

The converter names a tensor after the operations TensorFlow traced (on the TensorFlow backend
``model_1/conv_1/BiasAdd;...``, with ``_1`` suffixes and several layers fused into one name; on
JAX after jax2tf's primitives, or ``max1`` with no layer at all), so names cannot be trusted to
say which layer a tensor belongs to. Values can: :func:`map_layers` runs the Keras model call by
call on a few inputs and the float flatbuffer with every tensor kept, and pairs each Keras
layer's output with the flatbuffer tensor that holds the same values (within
:data:`RTOL` of the tensor's largest value, a float32 round-off margin far below what any
operator changes). Layers whose output the converter fused away (a convolution before its
ReLU) join the entry of the layer that consumes them; layers that compute nothing new
(dropout, identity) join the entry of the tensor they pass on. Each entry then owns the
operators that compute its tensor from the tensors of the entries before it.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np

from cle._core.graph import graph_view, run_call
from cle._tflite.flatgraph import FLOAT32, FlatGraph
from cle._tflite.runtime import fixed_batch, input_details_by_name, interpreter

__all__ = ["Entry", "LayerMap", "map_layers"]

#: Largest difference, relative to a tensor's largest magnitude, between a Keras layer's output
#: and the flatbuffer tensor paired with it.
RTOL = 1e-3


@dataclasses.dataclass
class Entry:
    """One Keras layer (with the layers fused into it) and its part of the flatbuffer.

    Attributes:
        name: the layer the entry is named after: the first with weights, else the first.
        layers: every Keras layer of the entry, in order.
        kind: the class name of the named layer.
        tensor: the flatbuffer tensor holding the entry's output.
        ops: the flatbuffer operators that compute it (indices, in order).
    """

    name: str
    layers: list[str]
    kind: str
    tensor: int
    ops: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class LayerMap:
    """The entries of a model in the order of the flatbuffer, ``owner`` (operator ->
    entry index; -1 for the model input's own quantization) and ``unmatched``: the Keras
    layers with weights that no entry holds, each with the reason."""

    entries: list[Entry]
    owner: dict[int, int]
    unmatched: list[tuple[str, str]]


def _keras_values(model, arrays) -> tuple[list, dict]:
    """Every call of the model's view in order, and each tensor's value on ``arrays`` (one
    per model input)."""
    view = graph_view(model)
    values = {id(t): keras.ops.convert_to_numpy(v)
              for t, v in zip(view.inputs, arrays)}
    for call in view.calls:
        outs = run_call(call, [values[id(t)] for t in call.inputs])
        for t, v in zip(call.outputs, outs):
            values[id(t)] = keras.ops.convert_to_numpy(v)
    return view, values


def _flat_values(content, graph: FlatGraph, arrays, names) -> tuple[list, dict]:
    """The flatbuffer's input tensors in the order of the model's inputs (``names``), and
    every float tensor it computes (and its inputs) on ``arrays``."""
    interp = interpreter(content, preserve_all_tensors=True)
    ins = input_details_by_name(interp, names)
    wanted = [t for t in list(graph.inputs) + [t for op in graph.ops for t in op.outputs]
              if graph.type(t) == FLOAT32]
    step = 1 if fixed_batch(interp, ins) else len(arrays[0])
    parts = {t: [] for t in wanted}
    for start in range(0, len(arrays[0]), step):
        chunk = [a[start: start + step] for a in arrays]
        if start == 0:
            for d, a in zip(ins, chunk):
                interp.resize_tensor_input(d["index"], a.shape, strict=False)
            interp.allocate_tensors()
        for d, a in zip(ins, chunk):
            interp.set_tensor(d["index"], a)
        interp.invoke()
        for t in wanted:
            parts[t].append(interp.get_tensor(t))
    return [int(d["index"]) for d in ins], {
        t: np.concatenate(v) if len(v) > 1 and v[0].ndim else v[0] for t, v in parts.items()}


def _matches(value, flat, order, after) -> list[int]:
    """Flatbuffer tensors holding ``value``, produced at or after operator ``after``."""
    scale = float(np.max(np.abs(value))) if value.size else 0.0
    tol = RTOL * scale + 1e-6
    return [t for t, v in flat.items()
            if order[t] >= after and v.shape == value.shape
            and float(np.max(np.abs(v - value))) <= tol]


def _scaled_matches(value, flat, order, after) -> list[int]:
    """Flatbuffer tensors holding ``value`` times a positive constant, produced at or after
    operator ``after``: JAX's export of a pooling to a batch of one sums, and folds the
    1/(h·w) into the next kernel. Only when no tensor holds ``value`` itself."""
    energy = float(np.sum(np.square(value, dtype=np.float64)))
    found = []
    for t, v in flat.items():
        if order[t] < after or v.shape != value.shape or energy == 0.0:
            continue
        c = float(np.sum(v.astype(np.float64) * value)) / energy
        if c > 0 and float(np.max(np.abs(v - c * value))) <= c * RTOL * float(
                np.max(np.abs(value))) + 1e-6:
            found.append(t)
    return found


def _pair(view, values, flat, graph, inputs) -> dict[int, int]:
    """Keras call index -> flatbuffer tensor holding its (first) output; ``inputs``: the
    flatbuffer's input tensors in the order of the model's."""
    order = {t: graph.producer.get(t, -1) for t in flat}
    where = {id(t): f for t, f in zip(view.inputs, inputs)}
    paired = {}
    for call in view.calls:
        if not call.outputs:
            continue
        value = values[id(call.outputs[0])]
        after = max([order.get(where.get(id(t)), -1) for t in call.inputs] + [-1])
        value = np.asarray(value, np.float32)
        found = (_matches(value, flat, order, after)
                 or _scaled_matches(value, flat, order, after))
        if found:
            f = max(found, key=lambda t: order[t])
            paired[call.index] = f
            where[id(call.outputs[0])] = f
    return paired


def _groups(view, paired) -> dict[int, list]:
    """Flatbuffer tensor -> the Keras calls whose entry it is, in order: a paired call joins
    its tensor's group; an unpaired one the group of the first consumer chain that is paired."""
    groups: dict[int, list] = {}
    for call in view.calls:
        if call.index in paired:
            groups.setdefault(paired[call.index], []).append(call)
    for call in reversed(view.calls):
        if call.index in paired or not call.outputs:
            continue
        chain, current = [call], call
        while current.index not in paired:
            consumers = current.outputs[0].consumers if current.outputs else []
            if not consumers:
                break
            current = consumers[0]
            chain.append(current)
        if current.index in paired:
            group = groups[paired[current.index]]
            for c in reversed(chain[:-1]):
                if c not in group:
                    group.insert(0, c)
    return groups


def _has_weights(layer) -> bool:
    return bool(getattr(layer, "weights", None)) and not isinstance(layer, keras.Model)


def _entries(groups, graph: FlatGraph) -> list[Entry]:
    out = []
    for t in sorted(groups, key=lambda t: graph.producer.get(t, -1)):
        calls = sorted(groups[t], key=lambda c: c.index)
        named = next((c for c in calls if _has_weights(c.layer)), calls[0])
        out.append(Entry(named.layer.name, [c.layer.name for c in calls],
                         type(named.layer).__name__, t))
    return out


def _own(entries, graph: FlatGraph) -> dict[int, int]:
    """Operator -> entry: each entry owns the operators reached walking back from its tensor
    that no entry before it owns, up to other entries' tensors; an operator no walk reaches
    belongs to the entry of its first input."""
    owner: dict[int, int] = {}
    stops = {e.tensor for e in entries} | set(graph.inputs)
    for k, entry in enumerate(entries):
        todo = [entry.tensor]
        while todo:
            op = graph.producer.get(todo.pop())
            if op is None or op in owner:
                continue
            owner[op] = k
            todo += [t for t in graph.ops[op].inputs if t >= 0 and t not in stops]
    for op in graph.ops:
        if op.index not in owner:
            ups = [owner.get(graph.producer.get(t)) for t in op.inputs if t >= 0]
            ups = [u for u in ups if u is not None]
            owner[op.index] = ups[0] if ups else (len(entries) - 1 if entries else -1)
    for k, entry in enumerate(entries):
        entry.ops = sorted(op for op, e in owner.items() if e == k)
    return owner


def map_layers(model, content: bytes, x) -> LayerMap:
    """The entries of ``model`` in its float flatbuffer ``content`` (converted from it), found
    by running both on ``x`` (a few inputs: an array for a one-input model, or
    :class:`cle._core.inputs.ModelInputs`; see the module docstring)."""
    arrays, names = (x.arrays, x.names) if hasattr(x, "arrays") else ((x,), ("",))
    graph = FlatGraph(content)
    view, values = _keras_values(model, arrays)
    inputs, flat = _flat_values(content, graph, arrays, names)
    paired = _pair(view, values, flat, graph, inputs)
    entries = _entries(_groups(view, paired), graph)
    owner = _own(entries, graph)
    held = {name for e in entries for name in e.layers}
    unmatched = []
    for call in view.calls:
        if _has_weights(call.layer) and call.layer.name not in held:
            unmatched.append((call.layer.name, "no tensor of the .tflite holds its output "
                              f"within {RTOL:g} of its largest value"))
    return LayerMap(entries, owner, unmatched)
