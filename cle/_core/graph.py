"""Read-only graph view of a Keras 3 Functional or Sequential model.

It reads a model's graph through :mod:`cle._core.keras_internals` (Keras has no public API for
it) and the Keras ``Node`` objects those give. Everything else works on the flat view built
here:

* every *call* of a layer is a :class:`Call` (a layer called twice gives two calls);
* every tensor is a :class:`Tensor` with one producer call (``None`` for a model input) and
  the list of calls that consume it;
* a plain Keras operation called on KerasTensors (``x + y``, ``keras.ops.multiply``, an
  ops-built hard-swish) is a call like any layer's; it has no weights, and
  :attr:`Call.kind` tells the matchers which layer class it behaves as (an elementwise add of
  two same-shape tensors is a ``keras.layers.Add``, a product a ``keras.layers.Multiply``);
* nested Functional/Sequential sub-models are seen through: their inner calls appear in the
  flat view, wired to the outer tensors that feed the sub-model, so a pattern such as
  ``conv`` (inside a sub-model) → ``BatchNormalization`` (outside) is visible.

The view never mutates the model.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import keras

from cle._core import keras_internals as internals

__all__ = ["Call", "GraphView", "Tensor", "call_inputs", "calls_leading_to", "check_readable",
           "concatenated", "graph_view",
           "inner_function", "is_plain_call", "is_sequential", "local_view", "rebuilt_view",
           "run_call", "takes_training", "unreadable_error", "weighed_on_every_path"]


@dataclasses.dataclass(eq=False)
class Tensor:
    """One symbolic tensor of the flattened graph."""

    producer: "Call | None"
    shape: tuple
    consumers: list["Call"] = dataclasses.field(default_factory=list)
    # Names of the (sub-)models that return this tensor as one of their outputs.
    output_of: list[str] = dataclasses.field(default_factory=list)

    @property
    def is_model_output(self) -> bool:
        return bool(self.output_of)


@dataclasses.dataclass(eq=False)
class Call:
    """One call of a layer (one Keras ``Node``) in the flattened graph."""

    layer: Any
    inputs: list[Tensor]
    outputs: list[Tensor]
    kwargs: dict
    index: int  # topological position in the flat view
    scope: tuple[str, ...]  # names of the enclosing sub-models, outermost first
    node: Any = dataclasses.field(default=None, repr=False)  # the Keras Node (see run_call)

    @property
    def name(self) -> str:
        return "/".join(self.scope + (self.layer.name,))

    @property
    def is_layer(self) -> bool:
        """False for a plain Keras operation (``x + y`` on KerasTensors), which has no
        weights and no config to edit."""
        return isinstance(self.layer, keras.layers.Layer)

    @property
    def kind(self) -> type:
        """The layer class this call behaves as: ``type(layer)`` for a layer; for a plain
        operation, the equivalent merge layer when there is one (an elementwise add of two
        or more same-shape tensors is ``keras.layers.Add``, a product ``keras.layers.Multiply``),
        else the operation's own class."""
        if self.is_layer:
            return type(self.layer)
        merge = _OP_MERGES.get(type(self.layer))
        if (merge is not None and len(self.inputs) >= 2 and len(self.outputs) == 1
                and all(t.shape == self.outputs[0].shape for t in self.inputs)):
            return merge
        return type(self.layer)


# Plain operations that are a merge layer when every argument is a same-shape tensor. The
# shape check also rules out ``x + 1.0`` (one tensor input) and broadcasting.
_OP_MERGES = {
    internals.ADD_OP: keras.layers.Add,
    internals.MULTIPLY_OP: keras.layers.Multiply,
}


@dataclasses.dataclass(eq=False)
class GraphView:
    """Flat, read-only view of a model's graph.

    Attributes:
        model: the model that was viewed.
        calls: every layer call in topological order (nested sub-models expanded).
        calls_of: ``id(layer) -> list[Call]`` for every layer seen in the graph.
        hidden_batch_norms: ``(call, bn)`` for every BatchNormalization held inside a layer
            whose graph cannot be read (a custom layer or a subclassed model used as a
            layer); such BNs are invisible to the matchers.
    """

    model: Any
    calls: list[Call]
    calls_of: dict[int, list[Call]]
    hidden_batch_norms: list[tuple[Call, Any]]
    # The model's input tensors, in the order of model.inputs (empty for a local view).
    inputs: list[Tensor] = dataclasses.field(default_factory=list)
    # Its output tensors, in the order of its function's outputs (empty for a local view).
    outputs: list[Tensor] = dataclasses.field(default_factory=list)

    # For a local view (see local_view): number of calls of each layer known from Keras.
    counts: dict[int, int] = dataclasses.field(default_factory=dict)

    def layer_calls(self, layer) -> list[Call]:
        return self.calls_of.get(id(layer), [])

    def n_calls(self, layer) -> int:
        """How many times ``layer`` is called in the viewed graph."""
        return self.counts.get(id(layer), len(self.layer_calls(layer)))

    def first_calls(self) -> list[Call]:
        """The first call of each distinct layer, in topological order (one per layer for the
        planners that edit a layer once, whatever its calls)."""
        seen, out = set(), []
        for call in self.calls:
            if id(call.layer) not in seen:
                seen.add(id(call.layer))
                out.append(call)
        return out

    def find_layer(self, name: str) -> list[Any]:
        """All distinct layer objects of the view whose name is ``name``."""
        seen = {}
        for call in self.calls:
            if call.layer.name == name:
                seen[id(call.layer)] = call.layer
        return list(seen.values())


def is_sequential(obj) -> bool:
    return isinstance(obj, keras.Sequential)


def _is_functional(obj) -> bool:
    # Keras has no public class for Functional models; Sequential is handled separately.
    return internals.is_functional(obj) and not is_sequential(obj)


def inner_function(model):
    """Return the Functional graph that defines ``model``, or None if it has none."""
    if is_sequential(model):
        return internals.sequential_graph(model)
    if _is_functional(model):
        return model
    return None


def check_readable(model) -> None:
    """Raise the ``ValueError`` :func:`graph_view` raises for a model whose graph cannot be
    read (a subclassed model, an empty or unbuilt Sequential one), before any work."""
    if inner_function(model) is None:
        raise unreadable_error(model)


def unreadable_error(model) -> ValueError:
    """The error for a model whose graph cannot be read: an empty or unbuilt Sequential model,
    or a subclassed model."""
    if is_sequential(model) and not model.layers:
        return ValueError(
            f"The Sequential model '{model.name}' has no layers (a keras.Input alone is "
            "not a layer), so there is nothing to fold or equalize. Add its layers, e.g. "
            "keras.Sequential([keras.Input(shape), keras.layers.Conv2D(...), ...]). "
            f"Received: model={model.name} with 0 layers"
        )
    if is_sequential(model):
        return ValueError(
            f"The Sequential model '{model.name}' has no known input shape, so its graph "
            "cannot be read. Build it first, e.g. start it with keras.Input(shape=...) or "
            "call model.build(input_shape). "
            f"Received: model={model.name}"
        )
    return ValueError(
        f"The graph of model '{model.name}' (class {type(model).__name__}) cannot be read: "
        "it is a subclassed model whose call() is Python code. Rebuild it with the "
        "Functional API (keras.Model(inputs, outputs)) or as a keras.Sequential model, "
        "and copy its weights over with set_weights(). "
        f"Received: model of type {type(model).__name__}"
    )


def graph_view(model) -> GraphView:
    """Build the flat view of ``model``.

    Args:
        model: a ``keras.Model`` built with the Functional or Sequential API.

    Returns:
        A :class:`GraphView`.

    Raises:
        TypeError: if ``model`` is not a ``keras.Model``.
        ValueError: if the model's graph cannot be read (a subclassed model, or a
            Sequential model that has not been built with a known input shape).
    """
    if not isinstance(model, keras.Model):
        raise TypeError(
            "Expected a keras.Model (Functional or Sequential). "
            f"Received: model of type {type(model).__name__}"
        )
    function = inner_function(model)
    if function is None:
        raise unreadable_error(model)

    calls: list[Call] = []
    calls_of: dict[int, list[Call]] = {}
    hidden: list[tuple[Call, Any]] = []

    top_inputs: list[Tensor] = []

    def visit(function, entry: list[Tensor] | None, scope: tuple[str, ...], name: str):
        # Map id(KerasTensor) of this (sub-)graph to flat Tensors.
        local: dict[int, Tensor] = {}
        for i, kt in enumerate(function.inputs):
            local[id(kt)] = (
                entry[i] if entry is not None else Tensor(None, tuple(kt.shape))
            )
            if entry is None:
                top_inputs.append(local[id(kt)])
        by_depth = internals.nodes_by_depth(function)
        depths = sorted(by_depth, reverse=True)
        for depth in depths:
            for node in by_depth[depth]:
                op = node.operation
                if op is None or node.is_input:
                    continue
                ins = [local[id(kt)] for kt in node.input_tensors]
                inner = inner_function(op) if isinstance(op, keras.Model) else None
                if inner is not None:
                    outs = visit(inner, ins, scope + (op.name,), op.name)
                    for kt, t in zip(node.outputs, outs):
                        local[id(kt)] = t
                    continue
                call = Call(
                    layer=op,
                    inputs=ins,
                    outputs=[],
                    kwargs=dict(node.arguments.kwargs),
                    index=len(calls),
                    scope=scope,
                    node=node,
                )
                for t in ins:
                    t.consumers.append(call)
                for kt in node.outputs:
                    t = Tensor(call, tuple(kt.shape))
                    call.outputs.append(t)
                    local[id(kt)] = t
                calls.append(call)
                calls_of.setdefault(id(op), []).append(call)
                if isinstance(op, keras.layers.Layer):
                    for sub in internals.sublayers(op):
                        if isinstance(sub, keras.layers.BatchNormalization):
                            hidden.append((call, sub))
        outs = [local[id(kt)] for kt in function.outputs]
        for t in outs:
            t.output_of.append(name)
        return outs

    outputs = visit(function, None, (), model.name)
    return GraphView(model=model, calls=calls, calls_of=calls_of, hidden_batch_norms=hidden,
                     inputs=top_inputs, outputs=outputs)


def takes_training(layer) -> bool:
    """Whether ``layer.call`` takes a ``training`` argument (which ``Functional.call`` sets)."""
    return internals.takes_training(layer)


def is_plain_call(call: Call) -> bool:
    """Whether ``call`` is ``layer(x)``: a layer called on one tensor, giving one tensor, with
    no other argument than ``training`` (which :func:`run_call` sets) and keywords left None
    (``mask=None``, which Keras records for layers that support masking)."""
    if not call.is_layer or len(call.inputs) != 1 or len(call.outputs) != 1:
        return False
    if call.node is None:  # a call a rebuild made (see rebuilt_view): layer(x)
        return True
    arguments = call.node.arguments
    return (len(arguments.args) == 1 and arguments.args[0] is call.node.input_tensors[0]
            and all(v is None or k == "training" for k, v in arguments.kwargs.items()))


def run_call(call: Call, values: list, layer=None, training: bool = False) -> list:
    """Run one call of a :func:`graph_view` on concrete tensors.

    ``values`` hold the values of ``call.inputs`` (same order); ``layer`` (default
    ``call.layer``, else e.g. its clone) is called with the argument structure of the call in
    the model (e.g. ``Add()([a, b])``) and, when it takes ``training``, with ``training`` set
    as ``Functional.call`` does. Returns the values of ``call.outputs``.
    """
    layer = call.layer if layer is None else layer
    node = call.node
    if node is None:  # a call a rebuild made (see rebuilt_view): layer(x)
        args, kwargs = [values[0]], {}
    else:
        tensors = {id(kt): v for kt, v in zip(node.input_tensors, values)}
        args, kwargs = node.arguments.fill_in(tensors)
    if takes_training(layer):
        kwargs["training"] = training
    return keras.tree.flatten(layer(*args, **kwargs))


def rebuilt_view(view: GraphView, model, clones, bypass=()) -> tuple[GraphView, dict]:
    """``(view of model, {id(call of view): its call in that view})``: the view of ``model``,
    the model a rebuild made from ``view.model``, derived from
    ``view`` and the rebuild's clone map (nothing of ``model``'s graph is read): every call of
    ``view`` with its layer's clone, calls of bypassed layers (``bypass``: ids of old layers)
    left out with their output read as their first input, and a call of each layer inserted
    after a clone (``clones.inserted``). A call of an inserted layer, or of one that replaced
    an old layer (``clones.replaced``), is ``layer(x)`` on its first input (``node`` None).
    """
    tensors: dict[int, Tensor] = {}

    def tensor(old: Tensor) -> Tensor:
        if id(old) not in tensors:
            tensors[id(old)] = Tensor(None, old.shape, output_of=list(old.output_of))
        return tensors[id(old)]

    def add_call(layer, inputs, shapes, scope, kwargs, node):
        call = Call(layer=layer, inputs=inputs, outputs=[Tensor(None, s) for s in shapes],
                    kwargs=kwargs, index=len(calls), scope=scope, node=node)
        for t in inputs:
            t.consumers.append(call)
        for t in call.outputs:
            t.producer = call
        calls.append(call)
        calls_of.setdefault(id(layer), []).append(call)
        return call

    calls: list[Call] = []
    calls_of: dict[int, list[Call]] = {}
    new_call: dict[int, Call] = {}
    inputs = [tensor(t) for t in view.inputs]
    for old in view.calls:
        if id(old.layer) in bypass:
            new_in = tensor(old.inputs[0])
            new_in.output_of += old.outputs[0].output_of
            tensors[id(old.outputs[0])] = new_in
            continue
        layer = clones.get(id(old.layer), old.layer)
        node = None if id(layer) in clones.replaced else old.node
        call = new_call[id(old)] = add_call(
            layer, [tensor(t) for t in old.inputs], [t.shape for t in old.outputs], old.scope,
            old.kwargs if node is not None else {}, node)
        after = clones.inserted.get(id(layer))
        if after is not None:
            call = add_call(after, list(call.outputs), [old.outputs[0].shape], old.scope, {},
                            None)
        for t_old, t_new in zip(old.outputs, call.outputs):
            t_new.output_of = list(t_old.output_of)
            tensors[id(t_old)] = t_new
    return GraphView(model=model, calls=calls, calls_of=calls_of, hidden_batch_norms=[],
                     inputs=inputs), new_call


def local_view(layers, depth: int = 64) -> GraphView:
    """A partial view around ``layers``, built from their own Keras nodes, for callers that
    have layers but not the model (AIMET-style ``scale_cls_sets(cls_sets)``).

    It follows every call of each layer forward for at most ``depth`` steps. It cannot know
    which tensors are model outputs, and a layer that also belongs to another model counts that
    model's calls as well; pass the model to get a complete view.
    """
    calls: list[Call] = []
    calls_of: dict[int, list[Call]] = {}
    counts: dict[int, int] = {}
    tensors: dict[int, Tensor] = {}
    done: set[int] = set()

    def tensor(kt) -> Tensor:
        t = tensors.get(id(kt))
        if t is None:
            t = tensors[id(kt)] = Tensor(None, tuple(kt.shape))
        return t

    frontier = [node for layer in layers for node in internals.inbound_nodes(layer)]
    for _ in range(depth):
        nxt = []
        for node in frontier:
            op = node.operation
            if id(node) in done or op is None or node.is_input:
                continue
            done.add(id(node))
            call = Call(
                layer=op,
                inputs=[tensor(kt) for kt in node.input_tensors],
                outputs=[],
                kwargs=dict(node.arguments.kwargs),
                index=len(calls),
                scope=(),
            )
            for t in call.inputs:
                t.consumers.append(call)
            for kt in node.outputs:
                t = tensor(kt)
                t.producer = call
                call.outputs.append(t)
            calls.append(call)
            calls_of.setdefault(id(op), []).append(call)
            counts[id(op)] = len(internals.inbound_nodes(op))
            out_ids = {id(kt) for kt in node.outputs}
            for out_node in internals.outbound_nodes(op):
                if any(id(kt) in out_ids for kt in out_node.input_tensors):
                    nxt.append(out_node)
        frontier = nxt
        if not frontier:
            break
    return GraphView(model=None, calls=calls, calls_of=calls_of, hidden_batch_norms=[],
                     counts=counts)


def calls_leading_to(view: GraphView, targets) -> list:
    """The calls of ``view`` whose outputs reach one of the calls ``targets`` (the targets
    included), in the view's order."""
    needed, stack = set(), list(targets)
    while stack:
        call = stack.pop()
        if id(call) not in needed:
            needed.add(id(call))
            stack.extend(t.producer for t in call.inputs if t.producer is not None)
    return [c for c in view.calls if id(c) in needed]


def weighed_on_every_path(tensor) -> bool:
    """Whether every path back from ``tensor`` (of :func:`graph_view`) passes
    a layer with weights before it reaches a batch norm or an input."""
    seen, stack = set(), [tensor]
    while stack:
        call = stack.pop().producer
        if call is None or isinstance(call.layer, keras.layers.BatchNormalization):
            return False
        if id(call) in seen or (call.is_layer and call.layer.weights):
            continue
        seen.add(id(call))
        stack.extend(call.inputs)
    return True


def concatenated(tensor) -> list:
    """The symbolic tensors a ``Concatenate`` layer joined into ``tensor`` (none when another
    operation made it)."""
    if not isinstance(internals.producer_of(tensor), keras.layers.Concatenate):
        return []
    return call_inputs(tensor)


def call_inputs(tensor) -> list:
    """The symbolic tensors the layer call that made ``tensor`` took (none for an input)."""
    layer = internals.producer_of(tensor)
    if layer is None:
        return []
    return next((list(n.input_tensors) for n in internals.inbound_nodes(layer)
                 if any(t is tensor for t in n.output_tensors)), [])
