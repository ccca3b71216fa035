"""The one routine that builds new models: :func:`rebuild`.

It rebuilds a Functional model with ``keras.models.clone_model`` (``clone_function`` makes
each new layer from its config, possibly edited; ``call_function`` bypasses removed layers by
returning their input) and a Sequential model as a new ``keras.Sequential`` of cloned layers.
Nested Functional/Sequential sub-models are rebuilt the same way, recursively. Every new layer
gets its weights from the input model (or the edit's new values) once the new graph exists.

It never mutates the input model and never calls ``keras.backend.clear_session()``. The new
model has its own layer objects with the same names, the same input and output names, and a
layer object shared by several calls stays shared.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import tempfile
from typing import Any, Callable

import keras
import numpy as np

from cle._core import keras_internals as internals
from cle._core.graph import graph_view, inner_function, run_call
from cle._core.layouts import layout_of

__all__ = ["CloneMap", "LayerEdit", "gc_paused", "layer_config", "layer_from_config", "own_configs",
           "rebuild"]


@dataclasses.dataclass
class LayerEdit:
    """How one layer changes.

    Attributes:
        config: entries of the layer's config to override (e.g. ``{"use_bias": True}``).
        variables: new values by variable attribute (``{"kernel": ..., "bias": ...}``); with
            ``compute`` and ``keep``, they must cover every weight of the new layer.
        compute: ``fn(dtype=None) -> {attr: value}``: new values computed when they are
            needed (at assignment, or by a planner that reads them) rather than held for the
            whole rebuild; ``variables`` overrides its entries. Each call must return the same
            values; with a ``dtype`` (what the rebuild assigns them as), rounded to it.
        replace: ``fn(old_layer) -> new_layer``: a different layer takes the old one's place;
            it is called on the old call's first argument only and keeps its own initial
            weights.
        insert_after: ``fn(old_layer) -> new_layer``: a new layer applied to the (new) layer's
            output, e.g. an activation split out of a layer.
        keep: variable attributes copied unchanged from the old layer (e.g. ``("kernel",)``
            when only the bias is new); with ``variables`` and ``compute``, they must cover
            every weight of the new layer.
        made_variables: values by attribute for the weights of the layer that ``replace`` or
            ``insert_after`` makes (e.g. a ClippedReLU's scaled ``caps``), assigned once the new
            model is built.
    """

    config: dict = dataclasses.field(default_factory=dict)
    variables: dict[str, Any] = dataclasses.field(default_factory=dict)
    compute: Callable[..., dict[str, Any]] | None = None
    replace: Callable[[Any], Any] | None = None
    insert_after: Callable[[Any], Any] | None = None
    keep: tuple[str, ...] = ()
    made_variables: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def sets_weights(self) -> bool:
        return bool(self.variables) or self.compute is not None

    def new_values(self, dtype=None) -> dict[str, Any]:
        """The layer's new values by attribute (computed now if the edit has ``compute``;
        in ``dtype`` if given, else as computed)."""
        values = {} if self.compute is None else dict(self.compute(dtype=dtype))
        values.update(self.variables)
        return values


def _new_input(tensor):
    layer = internals.producer_of(tensor)
    return keras.Input(
        batch_shape=tensor.shape,
        dtype=tensor.dtype,
        sparse=tensor.sparse,
        name=layer.name if layer is not None else None,
    )


class CloneMap(dict):
    """``id(old layer) -> new layer`` for every layer a rebuild cloned (a bypassed layer maps to
    itself: it is not in the new model), and what else the rebuild did to the graph:

    Attributes:
        inserted: ``id(new layer) -> layer`` applied to its output (``LayerEdit.insert_after``).
        replaced: ids of new layers that took an old one's place (``LayerEdit.replace``) and
            are called on the old call's first argument only.
    """

    def __init__(self):
        super().__init__()
        self.inserted: dict[int, Any] = {}
        self.replaced: set[int] = set()


_ZEROS = keras.initializers.Zeros()


def _defer_initializers(layer) -> dict:
    """Swap ``layer``'s weight initializers for Zeros until the rebuild is done.

    Every weight of a cloned layer is overwritten by :meth:`_Rebuilder.copy_weights`, so drawing
    random initial values (what ``clone_model`` spends a third to half of its time on, e.g.
    Glorot-uniform kernels) is wasted work. The original initializers are put back before the
    new model is returned, so configs and saved models are unchanged.
    """
    saved = {
        attr: value for attr, value in vars(layer).items()
        if attr.endswith("_initializer") and isinstance(value, keras.initializers.Initializer)
    }
    for attr in saved:
        setattr(layer, attr, _ZEROS)
    return saved


class _Rebuilder:
    def __init__(self, edits, bypass):
        self.edits = edits
        self.bypass = bypass
        self.clones = CloneMap()
        # ids of new layers called on the first argument only; id(new layer) -> the layer
        # applied to its output
        self.replaced, self.inserted = self.clones.replaced, self.clones.inserted
        self.pairs: list[tuple[Any, Any]] = []  # (old layer, new layer) needing weights
        self.deferred: list[tuple[Any, dict]] = []  # (new layer, its real initializers)
        self.made: list[tuple[Any, dict]] = []  # (layer a replace/insert_after made, values)

    def clone_layer(self, layer):
        key = id(layer)
        if key in self.clones:
            return self.clones[key]
        edit = self.edits.get(key)
        if key in self.bypass:
            new = layer  # never called: call_layer returns its input instead
        elif edit is not None and edit.replace is not None:
            new = edit.replace(layer)
            self.replaced.add(id(new))
            if edit.made_variables:
                self.made.append((new, edit.made_variables))
        elif isinstance(layer, keras.Sequential):
            new = self.rebuild_sequential(layer)
        elif isinstance(layer, keras.Model) and inner_function(layer) is layer:
            new = self.rebuild_functional(layer)
        elif type(layer) is keras.layers.Lambda and edit is None:
            new = internals.lambda_copy(layer)  # its function keeps the globals it reads
        else:
            config = layer_config(layer)
            if edit is not None:
                config.update(edit.config)
            new = layer_from_config(layer, config)
            if isinstance(layer, keras.layers.Layer):
                # A plain operation (``x + y``, ``keras.ops.multiply`` on KerasTensors) has no
                # weights: it is rebuilt from its config and needs nothing copied.
                self.pairs.append((layer, new))
                self.deferred.append((new, _defer_initializers(new)))
        if edit is not None and edit.insert_after is not None:
            self.inserted[id(new)] = edit.insert_after(layer)
            if edit.made_variables:
                self.made.append((self.inserted[id(new)], edit.made_variables))
        self.clones[key] = new
        return new

    def call_layer(self, layer, *args, **kwargs):
        if id(layer) in self.bypass:
            return args[0]
        if id(layer) in self.replaced:
            out = layer(args[0])  # the old layer's other arguments (mask=...) do not apply
        else:
            out = layer(*args, **kwargs)
        after = self.inserted.get(id(layer))
        return out if after is None else after(out)

    def rebuild_functional(self, model):
        # clone_model names new inputs after the KerasTensors ("keras_tensor_12"); name them
        # after the input layers instead, so input names survive.
        inputs = keras.tree.map_structure(_new_input, model.input)
        with internals.not_compiled(model) as compiled:
            new = keras.models.clone_model(
                model,
                input_tensors=inputs,
                clone_function=self.clone_layer,
                call_function=self.call_layer,
            )
        if compiled:
            _compile_like(new, model)
        return new

    def rebuild_sequential(self, model):
        layers = []
        for layer in model.layers:
            if id(layer) in self.bypass:
                continue
            new = self.clone_layer(layer)
            layers.append(new)
            if id(new) in self.inserted:
                layers.append(self.inserted[id(new)])
        new = keras.Sequential(
            [_new_input(model.inputs[0])] + layers,
            name=model.name,
            trainable=model.trainable,
        )
        if model.compiled:
            _compile_like(new, model)
        return new

    def restore_initializers(self):
        for new, saved in self.deferred:
            for attr, value in saved.items():
                setattr(new, attr, value)

    def copy_weights(self):
        """Give every new layer its weights, one layer (and one variable) at a time, so that
        the only memory held beyond the new model is one layer's temporaries."""
        for new, values in self.made:
            for attr, value in values.items():
                var = getattr(new, attr)
                var.assign(keras.ops.convert_to_tensor(np.asarray(value), dtype=var.dtype))
        for old, new in self.pairs:
            edit = self.edits.get(id(old))
            if edit is None or not edit.sets_weights:
                _copy_variables(old, new)
                _carry_state(old, new)
                continue
            dtypes = {np.dtype(w.dtype) for w in new.weights}
            values = edit.new_values(dtypes.pop() if len(dtypes) == 1 else None)
            if len(values) + len(edit.keep) != len(new.weights):
                raise RuntimeError(
                    f"internal error: edit of layer '{old.name}' sets "
                    f"{sorted(values)} and keeps {list(edit.keep)} but the new layer has "
                    f"{[w.path for w in new.weights]}"
                )
            for attr in edit.keep:
                getattr(new, attr).assign(keras.ops.copy(getattr(old, attr)))
            for attr in list(values):
                var = getattr(new, attr)
                # Each value is dropped as soon as it is assigned.
                value = np.asarray(values.pop(attr))
                var.assign(keras.ops.convert_to_tensor(value, dtype=var.dtype))
                del value


def _compile_like(new, model):
    """Compile ``new`` as ``model`` was, from its compile config; where that config cannot be
    read back (a loss or metric function Keras cannot find by name unless registered),
    ``new`` is left uncompiled: it computes what it should, and training it needs a
    ``compile`` call (before, the whole rebuild, and so ``cle.quantize``, stopped on Keras'
    TypeError)."""
    with contextlib.suppress(TypeError, ValueError):
        new.compile_from_config(model.get_compile_config())


def _copy_variables(old, new):
    """``new.set_weights(old.get_weights())`` without a numpy copy of the whole layer.

    ``keras.ops.copy`` gives the new variable its own buffer (on JAX, assigning one variable's
    value to another would make both hold the same array, which training one model donates and
    deletes under the other); on TensorFlow it reads the old variable without a copy and the
    assignment copies into the new variable's buffer.
    """
    if len(old.weights) != len(new.weights):
        raise RuntimeError(
            f"internal error: layer '{old.name}' has {len(old.weights)} weights but its clone "
            f"has {len(new.weights)}")
    for src, dst in zip(old.weights, new.weights):
        if tuple(src.shape) != tuple(dst.shape):
            raise RuntimeError(
                f"internal error: weight '{src.path}' of layer '{old.name}' has shape "
                f"{tuple(src.shape)} but its clone's has {tuple(dst.shape)}")
        dst.assign(keras.ops.copy(src))


_BASE = keras.layers.Layer


def _keeps_more_state(layer) -> bool:
    """Whether ``layer``'s class loads more than its variables from a saved file: it overrides
    ``load_own_variables`` or ``load_assets`` (Keras' saving protocol), e.g. ``Normalization``
    derives its ``mean`` and ``variance`` from its adapt variables there, and the lookup layers
    read their vocabulary from their assets. The kernel layers of :mod:`cle._core.layouts`
    override it for their quantized modes only: their variables say everything."""
    return layout_of(layer) is None and (
        type(layer).load_own_variables is not _BASE.load_own_variables
        or hasattr(layer, "load_assets"))


def _carry_state(old, new):
    """Give ``new`` (and each layer it holds) the state loading a saved ``old`` would give it
    beyond the variables :func:`_copy_variables` copied, through Keras' own saving protocol in
    memory: ``save_own_variables``/``load_own_variables`` and ``save_assets``/``load_assets``.

    Without it a rebuilt adapted ``Normalization`` layer computed with mean 0 and variance 1
    (its ``finalize_state`` never ran), and a rebuilt adapted ``IntegerLookup`` had no vocabulary.
    """
    for o, n in zip([old] + internals.sublayers(old), [new] + internals.sublayers(new)):
        if not _keeps_more_state(n):
            continue
        store: dict = {}
        o.save_own_variables(store)
        n.load_own_variables({k: keras.ops.copy(v) if isinstance(v, keras.Variable) else v
                              for k, v in store.items()})
        if hasattr(n, "load_assets"):  # Keras' saving calls it where a layer has it
            with tempfile.TemporaryDirectory() as folder:
                o.save_assets(folder)
                n.load_assets(folder)


@contextlib.contextmanager
def gc_paused():
    """Python's automatic cyclic garbage collection off for the duration of the block, then
    back to the state it was in (``gc.disable`` / ``gc.enable``).

    Building a model allocates many objects, and each full collection the allocations trigger
    walks every object in the process, the input model's included: on a 3200-layer model that
    was a large share of a rebuild's time. The cycles made meanwhile are collected at the next
    collection after the block. Nothing else about the collector changes (objects frozen with
    ``gc.freeze`` stay frozen), and a process that had turned collection off keeps it off.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def layer_config(layer) -> dict:
    """``layer.get_config()``. Keras cannot write the config of a layer whose activation is a
    callable it cannot serialize at all (``functools.partial(leaky_relu, ...)``, an object
    without ``get_config``): then the config of the same layer with a linear activation, that
    function object in its place, which :func:`layer_from_config` gives the new layer. A
    ``get_config()`` that fails otherwise raises a ValueError naming the layer (its error
    chained)."""
    try:
        return layer.get_config()
    except Exception as error:  # noqa: BLE001 - said as the layer's, whatever it is
        fn = getattr(layer, "activation", None)
        if not isinstance(error, TypeError) or not callable(fn):
            raise ValueError(
                f"layer '{layer.name}' ({type(layer).__name__}) cannot give its config: its "
                f"get_config() raised {type(error).__name__}: "
                f"{(str(error).strip().splitlines() or [''])[-1][:200]}. cle makes the new "
                "model's layers from their configs; fix the class's get_config(). Received: "
                f"layer '{layer.name}'") from error
    layer.activation = keras.activations.linear  # read, then put back at once
    try:
        config = layer.get_config()
    finally:
        layer.activation = fn
    config["activation"] = fn
    return config


def layer_from_config(layer, config):
    """``type(layer).from_config(config)``, where ``config`` is ``layer``'s own (perhaps
    edited). A layer whose activation is a Python function Keras cannot deserialize (a lambda,
    or a function nobody registered: ``Activation(lambda x: ...)``, ``Dense(activation=my_fn)``)
    is made with a linear activation and then given that same function object, as it was
    never written to a file. An activation the config sets by name (an edit's "linear") is
    kept."""
    try:
        return type(layer).from_config(config)
    except (TypeError, ValueError) as error:
        fn = getattr(layer, "activation", None)
        if not callable(fn) or isinstance(config.get("activation", ""), str):
            return _from_taken_keys(layer, config, error)
    new = type(layer).from_config(dict(config, activation="linear"))
    new.activation = fn
    return new


#: Keys of a layer's config that ``keras.layers.Layer.__init__`` itself takes.
_LAYER_KEYS = frozenset({"name", "trainable", "dtype", "autocast"})


def _from_taken_keys(layer, config, error):
    """A layer whose class does not take back the config it gives (keras_hub's ViT patching
    layer writes ``num_patches``, derived in its constructor, which refuses it; its MiT
    encoder writes a sublayer's config and a misspelt rate): made from the keys its
    constructor takes, kept only where the new layer's config is then ``config`` again
    (nothing of the layer lost: a key its constructor refused came back the same), and, built
    as ``layer`` was, holds weights of the same shapes (keras_hub's MiT encoder leaves its
    spatial-reduction ratio out of its config: made again without it, it lost a convolution).
    Else a ValueError naming the layer, the class's own error chained."""
    import inspect

    params = inspect.signature(type(layer).__init__).parameters.values()
    taken = {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    kept = {k: v for k, v in config.items() if k in taken or k in _LAYER_KEYS}
    new = None
    if len(kept) < len(config):
        try:
            new = type(layer).from_config(kept)
        except (TypeError, ValueError):
            new = None
    if new is not None and not (_same(_unbuilt(layer_config(new)), _unbuilt(config))
                                and _same_weights(layer, new)):
        new = None
    if new is None:
        refused = sorted(set(config) - set(kept))
        said = (f"its constructor refuses {', '.join(repr(k) for k in refused)}, and made "
                "without them it is another layer" if refused else
                f"its from_config() fails: "
                f"{(str(error).strip().splitlines() or [type(error).__name__])[-1][:200]}")
        raise ValueError(
            f"layer '{layer.name}' ({type(layer).__name__}) cannot be rebuilt from the config "
            f"its get_config() gives: {said}. Make its get_config() return what its "
            "constructor takes (or give it a from_config() that does); the error of its "
            f"class is chained to this one. Received: layer '{layer.name}'") from error
    return new


def _same_weights(layer, new) -> bool:
    """Whether ``new``, built as ``layer`` was (its build config), holds weights of the
    shapes ``layer``'s have."""
    if not isinstance(layer, keras.layers.Layer) or not layer.built:
        return True
    try:
        new.build_from_config(layer.get_build_config())
    except Exception:  # noqa: BLE001 - a layer that cannot be built so is not the same
        return False
    return [tuple(w.shape) for w in layer.weights] == [tuple(w.shape) for w in new.weights]


def _unbuilt(config):
    """``config`` without the ``build_config`` entries a built layer adds (nested ones too)."""
    if isinstance(config, dict):
        return {k: _unbuilt(v) for k, v in config.items() if k != "build_config"}
    if isinstance(config, (list, tuple)):
        return [_unbuilt(v) for v in config]
    return config


def _same(a, b) -> bool:
    """Whether two configs hold the same values (numbers by value, arrays elementwise)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return repr(a) == repr(b)


def own_configs():
    """Deserialize, for the duration, the layer configs the rebuild has just taken from live
    layers, including those Keras deserializes only unsafely (a ``Lambda`` whose function is
    Python bytecode): they come from the model object in memory, not from a file, so nothing
    runs that the process does not already hold. Keras' safe mode is restored afterwards
    (thread-local, as Keras keeps it); files are still loaded safely unless the caller opts out.
    """
    return internals.unsafe_deserialization()


def rebuild(model, edits=None, bypass=()):
    """Build a new model from ``model`` with some layers edited or removed.

    Args:
        model: a Functional or Sequential ``keras.Model`` (already checked by the caller).
        edits: ``id(layer) -> LayerEdit`` for layers whose config or weights change.
        bypass: ids of single-input layers to remove; their output is replaced by their input.

    Returns:
        ``(new_model, clones)``: the new model (the input model is not modified) and the
        :class:`CloneMap` ``id(old layer) -> new layer`` of every layer that was cloned.
    """
    builder = _Rebuilder(edits or {}, set(bypass))
    with gc_paused(), own_configs():
        if isinstance(model, keras.Sequential):
            new = builder.rebuild_sequential(model)
        else:
            new = builder.rebuild_functional(model)
    builder.restore_initializers()
    builder.copy_weights()
    return new, builder.clones


def flattened(model):
    """A copy of ``model`` with every nested Functional or Sequential model inlined: one graph
    of clones of its layers (weights and state copied, a shared layer still shared), computing
    what ``model`` computes, its inputs named as ``model``'s. ``model`` is not touched: its
    layers are not called. For what reads a model's own graph only (the distillation reads the
    batch norms of a ``keras.applications`` backbone called as a layer this way)."""
    view = graph_view(model)
    builder = _Rebuilder({}, set())
    with gc_paused(), own_configs():
        inputs = [_new_input(kt) for kt in inner_function(model).inputs]
        values = {id(t): kt for t, kt in zip(view.inputs, inputs)}
        for call in view.calls:
            outs = run_call(call, [values[id(t)] for t in call.inputs],
                            layer=builder.clone_layer(call.layer))
            values.update((id(t), v) for t, v in zip(call.outputs, outs))
        new = keras.Model(inputs, [values[id(t)] for t in view.outputs], name=model.name)
    builder.restore_initializers()
    builder.copy_weights()
    return new
