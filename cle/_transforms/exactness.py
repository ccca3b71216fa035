"""The exactness guard: the prepared float model must compute what the input model computes.

Batch-norm folding, cross-layer scaling with ReLU6 bounded (``relu6="bound"``) and the rebuild
itself are exact: up to float32 round-off, the new model's outputs are the input model's. A
model that came out different (a layer whose state the rebuild lost, a transform applied where
it does not hold) would be quantized and checked against itself, and every figure would look
fine while the file computes something else. So :func:`guard` runs both models on the inputs at
hand and compares each output: an output whose SQNR against the input model's is below
:data:`GUARD_DB` stops the run with :class:`NotExactError`, naming the first layer whose output
diverges (:func:`first_divergence`).

A layer's output in the new model may legitimately differ from the old one's by a positive
scale per channel (the layers of a scaled set and what lies between them) or by a per-channel
affine map (a layer a batch norm was folded into gives what the batch norm gave). So the walk
calls a layer the first to diverge when its output is neither equal to the old one nor a
per-channel affine map of it, or when it is not equal although the layer was not edited and all
its inputs were equal (an adapted ``Normalization`` rebuilt with mean 0 and variance 1 is an
affine map of the right output, but nothing was meant to change it).
"""

from __future__ import annotations

import math

import keras
import numpy as np

from cle._core import keras_internals as internals
from cle._core.graph import rebuilt_view, run_call

__all__ = ["GUARD_DB", "GUARD_INPUTS", "NotExactError", "first_divergence", "guard",
           "output_sqnrs"]

#: The least SQNR (dB) of each output of the prepared float model against the input model's.
#: Float32 round-off of an exact rebuild stays far above it on trained networks, and 8-bit
#: quantization noise far below it, so a difference the guard lets through is smaller than
#: anything the quantized model's figures could show.
GUARD_DB = 40.0
#: How many of the inputs at hand the guard runs both models on: the first 8, or all of them
#: where they are at most twice as many (one batch shape with the passes over all of them
#: before it, whose operations JAX then compiles once).
GUARD_INPUTS = 8
#: How many inputs the walk that names the diverging layer runs (it holds every tensor).
WALK_INPUTS = 2
#: A layer output is equal to the old one below this relative RMS difference, and a
#: per-channel affine map of it below this relative residual: float32 round-off of folded and
#: scaled kernels stays below it.
LAYER_RTOL = 1e-3


class NotExactError(RuntimeError):
    """The model a transform meant to be exact built does not compute what the input model
    computes (a bug of this library: please report it with the model)."""


def _flat(y) -> list[np.ndarray]:
    return [np.asarray(keras.ops.convert_to_numpy(v), dtype=np.float64)
            for v in keras.tree.flatten(y)]


def _sqnr(ref, y) -> float:
    noise = float(np.sum((ref - y) ** 2))
    signal = float(np.sum(ref ** 2))
    if noise <= 1e-24 * max(signal, 1.0):
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def output_sqnrs(model, prepared, x) -> list[float]:
    """Each output's SQNR (dB) of ``prepared`` against ``model`` on
    :class:`cle._core.inputs.ModelInputs` ``x`` (outputs in the model's order)."""
    # Called, not predicted: on a few inputs a call costs less than tracing a predict step.
    ref = _flat(model(x.feed(model), training=False))
    new = _flat(prepared(x.feed(prepared), training=False))
    return [_sqnr(a, b) for a, b in zip(ref, new)]


def guard(view, prepared, clones, bypass, edited, x, what: str):
    """Stop with :class:`NotExactError` unless ``prepared`` (built from ``view.model`` by
    the rebuild that gave ``clones``) computes every output of ``view.model`` within
    :data:`GUARD_DB` on the first :data:`GUARD_INPUTS` of ``x`` (all of them where they are at
    most twice as many).

    Args:
        view: the input model's graph view.
        prepared: the new model.
        clones, bypass: the rebuild's clone map and the ids of the layers it removed.
        edited: ids of the input model's layers the plan changed (their outputs may differ).
        x: :class:`cle._core.inputs.ModelInputs` of the input model.
        what: what was applied, for the message (e.g. "batch-norm folding and cross-layer
            scaling").
    """
    model = view.model
    probe = x if len(x) <= 2 * GUARD_INPUTS else x[:GUARD_INPUTS]
    sqnrs = output_sqnrs(model, prepared, probe)
    low = [(k, s) for k, s in enumerate(sqnrs) if s < GUARD_DB]
    if not low:
        return
    k, worst = min(low, key=lambda item: item[1])
    producer = internals.producer_of(model.outputs[k])
    name = getattr(producer, "name", None) or f"output {k}"
    where = first_divergence(view, prepared, clones, bypass, edited, probe[:WALK_INPUTS])
    apart = (f"at {worst:.1f} dB from the input model's" if math.isfinite(worst) else
             "zero in the input model and not in the prepared one")
    raise NotExactError(
        f"the prepared float model does not compute what model '{model.name}' computes "
        f"after {what}: output '{name}' is {apart} (the guard asks for at least "
        f"{GUARD_DB:g} dB); {where}. This is a bug of keras-cle: please report it with the "
        "model")


def _relative(a, b) -> float:
    scale = float(np.sqrt(np.mean(a ** 2)))
    diff = float(np.sqrt(np.mean((a - b) ** 2)))
    return diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)


def _affine_residual(old, new, axis=-1) -> float:
    """The relative residual of the best per-channel map ``new ≈ a·old + b`` (channels on
    ``axis``)."""
    o = np.moveaxis(old, axis, -1).reshape(-1, old.shape[axis])
    n = np.moveaxis(new, axis, -1).reshape(-1, new.shape[axis])
    o_c, n_c = o - o.mean(axis=0), n - n.mean(axis=0)
    denom = np.sum(o_c ** 2, axis=0)
    a = np.divide(np.sum(o_c * n_c, axis=0), denom, out=np.zeros_like(denom), where=denom > 0)
    return _relative(n, n.mean(axis=0) + a * o_c) if n.size else 0.0


def _run(view, values):
    """Every tensor's value, the graph run call by call from ``values`` (its inputs'), each
    as the layer made it (its own dtype)."""
    for call in view.calls:
        outs = run_call(call, [values[id(t)] for t in call.inputs])
        for t, v in zip(call.outputs, outs):
            values[id(t)] = keras.ops.convert_to_numpy(v)
    return values


def first_divergence(view, prepared, clones, bypass, edited, x) -> str:
    """Where the new model first departs from the input model, in words (see the module
    docstring for the rule), walking both graphs on ``x``."""
    new_view, new_call = rebuilt_view(view, prepared, clones, bypass)
    arrays = [np.asarray(a) for a in x.arrays]
    old = _run(view, {id(t): a for t, a in zip(view.inputs, arrays)})
    new = _run(new_view, {id(t): a for t, a in zip(new_view.inputs, arrays)})
    equal = {id(t): True for t in view.inputs}
    for call in view.calls:
        target = new_call.get(id(call))
        if target is None:  # removed (a folded batch norm): its output is its input's
            for t in call.outputs:
                equal[id(t)] = False
            continue
        after = clones.inserted.get(id(target.layer))
        if after is not None:  # an activation split out of the layer: the layer's output
            target = next(c for c in target.outputs[0].consumers if c.layer is after)
        inputs_equal = all(equal.get(id(t), False) for t in call.inputs)
        for t_old, t_new in zip(call.outputs, target.outputs):
            a = np.asarray(old[id(t_old)], np.float64)
            b = np.asarray(new[id(t_new)], np.float64)
            if a.shape != b.shape:
                equal[id(t_old)] = False
                continue
            rel = _relative(a, b)
            equal[id(t_old)] = rel <= LAYER_RTOL
            if equal[id(t_old)]:
                continue
            if inputs_equal and id(call.layer) not in edited:
                return (f"layer '{call.layer.name}' ({type(call.layer).__name__}) was not "
                        f"changed and its inputs are the same, yet its output differs by "
                        f"{rel:.3g} (relative RMS)")
            if a.ndim >= 2 and _affine_residual(a, b) > LAYER_RTOL:
                return (f"layer '{call.layer.name}' ({type(call.layer).__name__}) is the "
                        f"first whose output differs by more than a per-channel scale and "
                        f"offset ({rel:.3g} relative RMS)")
    return "no single layer could be named (every layer's output is within the layer test)"
