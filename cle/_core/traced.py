"""A subclassed model's graph, traced: its ``call()`` run once on a symbolic input.

A subclassed ``keras.Model`` keeps its graph in Python code, which
:func:`cle._core.graph.graph_view` cannot read; TF Lite's converter traces it and writes it.
So that ``cle.quantize`` is never worse than that converter on such a model, it traces it too,
with Keras' public API: ``model.call`` on a ``keras.Input`` calls each of the model's layers
on symbolic tensors, and ``keras.Model(input, output)`` makes of those calls a Functional
model of the same layers (the same weights: nothing copied). Code that reads the values of
its tensors (a Python ``if`` on them) cannot be traced; the refusal then says what failed.
The traced model is held to the subclassed one's outputs on the calibration inputs before it
stands in for it (:func:`functional_for`).
"""

from __future__ import annotations

import inspect
import weakref

import keras
import numpy as np

from cle._core import keras_internals as internals
from cle._core.graph import inner_function, is_sequential, unreadable_error

__all__ = ["TRACE_TOLERANCE", "functional_for", "traced_functional"]

#: The largest difference between the traced model's outputs and the subclassed model's, as a
#: share of the largest output, accepted (the same layers run on the same inputs: float
#: rounding of another order of operations at most).
TRACE_TOLERANCE = 1e-5


def traced_functional(model, shape, dtype="float32"):
    """A Functional model of ``model``'s own layers: its ``call()`` run on a ``keras.Input`` of
    ``shape`` (one sample's), with ``training=False`` where ``call`` takes it. Raises
    ``ValueError`` naming what failed."""
    kwargs = {"training": False} if "training" in inspect.signature(model.call).parameters else {}
    try:
        inp = keras.Input(tuple(shape), dtype=dtype, name="input")
        traced = keras.Model(inp, model.call(inp, **kwargs), name=model.name)
    except Exception as exc:  # noqa: BLE001 - whatever the user's call() raises
        raise ValueError(
            f"{unreadable_error(model)}. Tracing its call() on a symbolic input failed too: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
    return traced


#: The traced model of each subclassed model, by its trace's input shape and dtype, while the
#: model lives: a trace adds a node to each of the model's layers, so a model quantized again
#: is not traced again.
_TRACED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _refused(model) -> ValueError:
    if is_sequential(model):
        return unreadable_error(model)
    return ValueError(
        f"{unreadable_error(model)}. (With calibration data of its one input, an array, or "
        "built for one float input of a fixed shape, cle.quantize traces its call() into a "
        "Functional model of its layers.)")


def functional_for(model, calibration_data):
    """``(model, note)``: ``model`` itself and None when its graph can be read; for a
    subclassed model with ``calibration_data`` of one input (an array ``(N, *shape)``, whose
    dtype the trace's input takes: token ids stay integers), or without data one built for
    one input of a fixed shape (float32; a model that embeds token ids is refused), the traced
    Functional model of its layers (:func:`traced_functional`), held to ``model``'s outputs on
    up to eight of those inputs (without data, eight uniform in [0, 1]) within
    :data:`TRACE_TOLERANCE` of each output's largest value, and a sentence for the report.
    Raises the ``ValueError`` of a model whose graph cannot be read otherwise (data of several
    inputs, or a model built for several: what a trace would need is not at hand)."""
    if inner_function(model) is not None:
        return model, None
    if is_sequential(model):
        raise _refused(model)
    said = None
    if calibration_data is None:
        shape = internals.built_input_shape(model)
        if shape is None or len(shape) < 2 or None in shape[1:]:
            raise _refused(model)
        calibration_data = np.random.default_rng(0).uniform(
            0.0, 1.0, (8, *shape[1:])).astype(np.float32)
        said = "8 random inputs"
    if not isinstance(calibration_data, np.ndarray) or calibration_data.ndim < 2 or \
            not len(calibration_data):
        raise _refused(model)
    dtype = (str(calibration_data.dtype) if calibration_data.dtype.kind in "iub"
             else "float32")
    x = np.asarray(calibration_data[:8], dtype)
    key = (tuple(calibration_data.shape[1:]), dtype)
    traced = _TRACED.get(model, {}).get(key)
    if traced is None:
        traced = traced_functional(model, calibration_data.shape[1:], dtype)
        if said and any(isinstance(layer, keras.layers.Embedding) for layer in traced.layers):
            raise ValueError(
                f"{unreadable_error(model)}. It embeds token ids: without data cle cannot tell "
                "its input's type to trace its call(); pass calibration data of its input")
        _TRACED.setdefault(model, {})[key] = traced
    said = said or f"{len(x)} calibration inputs"
    mine = [np.asarray(a) for a in keras.tree.flatten(model(x, training=False))]
    theirs = [np.asarray(a) for a in keras.tree.flatten(traced(x, training=False))]
    if len(mine) != len(theirs) or any(
            a.shape != b.shape or not np.all(np.isclose(
                a, b, rtol=0.0, atol=TRACE_TOLERANCE * max(
                    float(np.nanmax(np.abs(a), initial=0.0)), 1.0), equal_nan=True))
            for a, b in zip(mine, theirs)):
        raise ValueError(
            f"{unreadable_error(model)}. Its call() traced on a symbolic input computes "
            f"something else than the model on {said} (its code depends on "
            "more than its layers), so cle cannot stand it in")
    if getattr(model, "compiled", False) and isinstance(getattr(model, "loss", None), str):
        traced.compile(loss=model.loss)  # its loss tells the outputs' kinds (check.losses)
    return traced, (
        f"model '{model.name}' (class {type(model).__name__}) is a subclassed model: cle traced "
        "its call() into a Functional model of its own layers (the same weights) and "
        f"quantized that; the two computed the same on {said}")
