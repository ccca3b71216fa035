"""Compiled steps for the empirical bias-correction pass.

The pass (:func:`cle.bias_correction._empirical_pass`) runs every layer call twice, on the
float and on the quantized activations. Run eagerly, each operation of each call pays a Python
dispatch, which on a deep network of small layers costs more than the arithmetic (what
compiling saves is measured in the generated cost block of docs/bias_correction.md).

A deep network repeats a few *kinds* of call: the same layer class with the same config (name
aside) on the same input shape. The pass is cut into *segments*: a call followed by the
weightless calls that each alone read the previous one's output (a convolution and its ReLU),
and chains of segments (each output read by the next segment alone) into *units* of up to
:data:`UNIT` consecutive segments of one kind. Each kind of unit that occurs at least
:data:`MIN_USES` times gets one private copy of its layers (*templates*, never layers of the
caller's model) and one compiled function that runs them on both streams with the weights it
is given (in a ``keras.StatelessScope``), so it is traced once and reused for every unit of
that kind; a corrected layer's part also measures its correction. A unit whose kind is rarer
is split into its segments, and a segment whose kind is rarer into its calls, each compiled if
its own kind is frequent enough. Everything else stays eager (tracing costs tens of
milliseconds), as does every call that is not a plain ``layer(x)`` of a Keras (or cle) layer.

Compilation uses ``tf.function`` on TensorFlow and ``jax.jit`` on JAX. Other backends have no
cheap compiler: there the pass stays eager.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from typing import Any, Callable

import keras

from cle._core.graph import Call, is_plain_call, takes_training
from cle._core.layouts import channel_axis, layout_of
from cle._core.rebuild import layer_config, layer_from_config
from cle._core.semantics import activation_name
from cle.layers import ClippedReLU

logger = logging.getLogger("cle.bias_correction")

# A kind of unit is compiled when it occurs at least this often in the pass: tracing one
# segment costs many times what running it compiled saves over running it eagerly, so only a
# kind used often pays for its trace (the pass's cost: docs/bias_correction.md, generated).
MIN_USES = 32
# At most this many consecutive segments of a chain run as one compiled call.
UNIT = 8


def compiler() -> Callable | None:
    """The backend's function compiler, or None."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        def compile_tf(fn):
            # One trace per kind, so its concrete function is called directly: that skips
            # tf.function's argument binding and trace-cache lookup (about half of a call's
            # overhead on small layers).
            function, concrete = tf.function(fn, autograph=False), []

            def call(*args):
                if not concrete:
                    concrete.append(function.get_concrete_function(*args))
                return concrete[0](*args)

            return call

        return compile_tf
    if backend == "jax":
        import jax

        return jax.jit
    return None


def _weights_are_read_when_called(layer) -> bool:
    """Whether a copy of ``layer`` from its config computes what ``layer`` computes when it is
    handed ``layer``'s weight values: true of weightless layers and of the layers whose call
    reads their weights (convolutions, Dense, BatchNormalization, cle's ClippedReLU), not of
    every layer (an adapted ``Normalization`` builds its constants once, when it is built),
    nor of LoRA or quantized Dense/Conv layers, whose kernel is not a plain variable."""
    if not layer.weights:
        return True
    if getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
        return False
    return layout_of(layer) is not None or type(layer) in (
        keras.layers.BatchNormalization, ClippedReLU)


def _kind(call: Call, target: bool):
    """A hashable description of what ``call`` computes, up to its weights and the shape of
    its input, or None if it cannot be compiled."""
    layer = call.layer
    if (not is_plain_call(call) or not type(layer).__module__.startswith(("keras.", "cle."))
            or not _weights_are_read_when_called(layer)):
        return None
    try:
        config = layer_config(layer)
        config.pop("name", None)
        text = json.dumps(config, sort_keys=True)
    except Exception:  # a config that is not plain JSON: stays eager
        return None
    return type(layer), text, target, tuple(call.inputs[0].shape[1:])


def _template(layer, x, linear=False):
    """A private copy of ``layer`` (from its config; with a linear activation if ``linear``),
    built by a symbolic call on ``x``; returns ``(template, its symbolic output, kwargs of
    its call)``."""
    config = layer_config(layer)
    config["name"] = f"{layer.name}_cle_step"
    if linear:
        config["activation"] = "linear"
    template = layer_from_config(layer, config)
    y = template(x)
    shapes = [tuple(w.shape) for w in template.weights]
    if shapes != [tuple(w.shape) for w in layer.weights]:
        raise ValueError(f"template of '{layer.name}' has weights {shapes}")
    return template, y, {"training": False} if takes_training(template) else {}


def _segment_fn(calls: list[Call], x, target: bool):
    """``(step, output spec)`` of one segment (uncompiled) called on the symbolic ``x``:
    ``step(f_values, q_values, xf, xq)`` returns the segment's outputs on both streams, and
    for a target also ``delta`` (see :meth:`Steps.get`)."""
    head = calls[0].layer
    activation = getattr(head, "activation", None) if target else None
    if activation is not None and activation_name(activation) == "linear":
        activation = None
    template, y, kwargs = _template(head, x, linear=target)
    weights = list(template.weights)
    followers = []
    for call in calls[1:]:
        follower, y, follower_kwargs = _template(call.layer, y)
        followers.append((follower, follower_kwargs))

    def run(values, x):
        # The template's own __call__ (input casting, training flag) reading the given
        # values instead of its variables.
        with keras.StatelessScope(state_mapping=list(zip(weights, values))):
            return template(x, **kwargs)

    def follow(y):
        for follower, follower_kwargs in followers:
            y = follower(y, **follower_kwargs)
        return y

    if not target:
        def step(f_values, q_values, xf, xq):
            return follow(run(f_values, xf)), follow(run(q_values, xq))

        return step, y

    rank = len(template.compute_output_shape(tuple(x.shape)))
    axis = channel_axis(head, rank) % rank
    axes = tuple(i for i in range(rank) if i != axis)
    shape = [1] * rank
    shape[axis] = -1

    def target_step(f_values, q_values, xf, xq):
        yf, yq = run(f_values, xf), run(q_values, xq)
        # the mean of the difference, as the eager pass computes it
        delta = keras.ops.mean(yq - yf, axis=axes)
        yq = yq - keras.ops.reshape(keras.ops.cast(delta, yq.dtype), shape)
        if activation is not None:
            yf, yq = activation(yf), activation(yq)
        return follow(yf), follow(yq), delta

    return target_step, y


def _unit_fn(segments: list[list[Call]], x, targets):
    """The step of a unit of consecutive ``segments`` (uncompiled), first called on the
    activation ``x``; see :meth:`Steps.get`."""
    y = keras.KerasTensor(tuple(x.shape), dtype=keras.backend.standardize_dtype(x.dtype))
    fns = []
    for segment in segments:
        target = id(segment[0]) in targets
        fn, y = _segment_fn(segment, y, target)
        fns.append((fn, target))

    def step(values, xf, xq):
        deltas = []
        for (fn, target), (f_values, q_values) in zip(fns, values):
            out = fn(f_values, q_values, xf, xq)
            xf, xq = out[0], out[1]
            if target:
                deltas.append(out[2])
        return xf, xq, deltas

    return step


def _first_call_checked(step, steps, kind, call):
    """``step``, which on its first call (its tracing) falling over marks ``kind`` as eager
    in ``steps`` and returns None instead of raising."""
    state = {"first": True}

    def checked(*args):
        if not state["first"]:
            return step(*args)
        try:
            out = step(*args)
        except Exception as e:
            steps._fail(kind, call, e)
            return None
        state["first"] = False
        steps._steps[kind] = step
        return out

    return checked


class Steps:
    """The compiled steps of one pass over ``calls`` (topological order); ``targets`` holds
    the ids of the calls whose correction is measured, ``uses`` the number of calls of
    ``calls`` that read each tensor (by id). Steps are compiled on first use, from the first
    unit of their kind and the activation it is called on.

    A *unit* is what one compiled call runs: up to :data:`UNIT` consecutive segments of one
    kind in a chain (each segment's output read by the next segment alone), when that kind of
    unit occurs at least ``min_uses`` times; else a single segment, when that kind of segment
    is frequent enough; else a single call, likewise.
    """

    def __init__(self, calls: list[Call], targets, uses: dict[int, int],
                 min_uses: int = MIN_USES):
        self._compile = compiler()
        self._targets = targets
        # id(first call) -> (kind, segments)
        self._units: dict[int, tuple[Any, list[list[Call]]]] = {}
        self._steps: dict[Any, Callable | None] = {}
        self._eager: dict[Any, Callable] = {}
        if self._compile is None:
            return
        kinds = {id(c): _kind(c, id(c) in targets) for c in calls}

        def single_use_next(call):
            """The call that alone reads ``call``'s output, or None."""
            out = call.outputs[0]
            if uses.get(id(out), 0) != 1:
                return None
            return next(c for c in out.consumers if id(c) in kinds)

        segments, follower = [], set()
        for call in calls:
            if id(call) in follower or kinds[id(call)] is None:
                continue
            segment = [call]
            while (nxt := single_use_next(segment[-1])) is not None:
                if kinds[id(nxt)] is None or nxt.layer.weights or id(nxt) in targets:
                    break
                segment.append(nxt)
                follower.add(id(nxt))
            segments.append(segment)
        # chains of segments, each read by the next alone
        by_head = {id(s[0]): s for s in segments}
        continued = set()
        for segment in segments:
            nxt = single_use_next(segment[-1])
            if nxt is not None and id(nxt) in by_head:
                continued.add(id(nxt))

        def kind_of(unit):
            return tuple(tuple(kinds[id(c)] for c in segment) for segment in unit)

        units = []
        for segment in segments:
            if id(segment[0]) in continued:
                continue
            chain = [segment]
            while (nxt := single_use_next(chain[-1][-1])) is not None and id(nxt) in by_head:
                chain.append(by_head[id(nxt)])
            # runs of segments of one kind, cut into units of at most UNIT segments
            start = 0
            for end in range(1, len(chain) + 1):
                if end == len(chain) or kind_of([chain[end]]) != kind_of([chain[start]]):
                    units += [chain[i:min(i + UNIT, end)] for i in range(start, end, UNIT)]
                    start = end

        chosen = []
        for split in (lambda u: [[s] for s in u],  # units into segments
                      lambda u: [[[c]] for s in u for c in s]):  # segments into calls
            counts = Counter(kind_of(u) for u in units)
            chosen += [u for u in units if counts[kind_of(u)] >= min_uses]
            units = [part for u in units if counts[kind_of(u)] < min_uses for part in split(u)]
        counts = Counter(kind_of(u) for u in units)
        chosen += [u for u in units if counts[kind_of(u)] >= min_uses]
        self._units = {id(u[0][0]): (kind_of(u), u) for u in chosen}

    def get(self, call: Call, x):
        """``(step, calls, heads)`` if ``call`` starts a compiled unit, else None (it runs
        eagerly); ``x`` is the activation ``call`` is called on.

        ``calls`` lists the calls the step runs, ``call`` first, and ``heads`` the first call
        of each of its segments. The step is ``step(values, xf, xq)``, where ``values`` holds
        ``(f_values, q_values)`` per head: the head layer's weights for each stream, in
        ``layer.weights`` order. It returns ``(yf, yq, deltas)``: the unit's outputs on both
        streams and, for each target head in order, the mean difference per output channel of
        its pre-activation outputs on the two streams (``delta``), which the step subtracts
        from the quantized stream's before the activation.
        """
        entry = self._units.get(id(call))
        if entry is None:
            return None
        # The symbolic shapes of a kind may leave sizes open ((None, None, 16)): one step per
        # concrete input shape (a TensorFlow concrete function takes one shape).
        kind = (entry[0], tuple(x.shape), keras.backend.standardize_dtype(x.dtype))
        unit = entry[1]
        if kind not in self._steps:
            try:
                self._steps[kind] = _first_call_checked(
                    self._compile(_unit_fn(unit, x, self._targets)), self, kind, call)
            except Exception as e:  # a layer its config does not rebuild: stays eager
                self._fail(kind, call, e)
        step = self._steps[kind]
        if step is None:
            return None
        return step, [c for s in unit for c in s], [s[0] for s in unit]

    def _fail(self, kind, call, error):
        self._steps[kind] = None
        logger.warning("calls like '%s' run eagerly in the bias-correction pass (their "
                       "compiled step failed: %s: %s)", call.layer.name, type(error).__name__,
                       error)

    def target(self, call: Call, x) -> Callable:
        """The uncompiled step of the target ``call`` alone (a unit of one call; see
        :meth:`get`), for a target that runs eagerly; ``x`` is the activation it is called
        on. Its private copy of the layer is shared by the calls of one kind."""
        key = _kind(call, True) or id(call)
        step = self._eager.get(key)
        if step is None:
            step = self._eager[key] = _unit_fn([[call]], x, {id(call)})
        return step
