"""The Keras side of every comparison: the model's outputs in float64 (:func:`predict`,
:func:`predict_all`, in the order of ``model.outputs``), and :func:`outputs_once`, which runs a
Keras model or a ``.tflite`` (LiteRT, :mod:`cle._tflite.runtime`) once per set of inputs."""

from __future__ import annotations

import logging

import keras
import numpy as np

from cle._core.backend import compiled, exact_kernels
from cle._tflite.runtime import TFLITE_BATCH, run_all

KERAS_BATCH = 32


@exact_kernels
def predict(model, x):
    """``model.predict(x)`` in batches of :data:`KERAS_BATCH`, as float64 (a model whose one
    output is in a list or a dict: that output's array)."""
    ys = flat_outputs(_predicted(model, x))
    return np.asarray(ys[0] if len(ys) == 1 else ys, dtype=np.float64)


def _predicted(model, feed):
    """``model.predict(feed)`` in batches of :data:`KERAS_BATCH`; for a model whose class
    gives ``predict`` a meaning of its own (keras_hub's object detectors decode and select
    boxes in their ``predict_step``: four outputs of another shape than the model's two),
    the outputs of its graph as called, batch by batch, which is what TF Lite's converter
    writes. Every variant is a new model, so TensorFlow warns about tf.function retracing
    after a few of them; that warning is about cle's loop, not the user's code: quiet."""
    tf_logger = logging.getLogger("tensorflow")
    level = tf_logger.level
    tf_logger.setLevel(logging.ERROR)
    try:
        if not own_predict(model):
            return model.predict(feed, batch_size=KERAS_BATCH, verbose=0)
        step = compiled(lambda batch: model(batch, training=False))
        n = len(keras.tree.flatten(feed)[0])
        parts = [keras.tree.map_structure(
            lambda a: np.asarray(keras.ops.convert_to_numpy(a)),
            step(keras.tree.map_structure(lambda a: a[i:i + KERAS_BATCH], feed)))
            for i in range(0, n, KERAS_BATCH)]
        return keras.tree.map_structure(lambda *a: np.concatenate(a), *parts)
    finally:
        tf_logger.setLevel(level)


def own_predict(model) -> bool:
    """Whether ``model``'s class (or one it derives from outside Keras) defines ``predict``
    or ``predict_step``: then ``model.predict`` need not give the outputs of its graph."""
    for name in ("predict", "predict_step"):
        owner = next((k for k in type(model).__mro__ if name in vars(k)), None)
        if owner is not None and not owner.__module__.startswith("keras."):
            return True
    return False


def flat_outputs(y) -> list:
    """The outputs ``model.predict`` returned (an array, a list or tuple, a dict, or a nest of
    them: the structure of the model's outputs) as a list in the order of ``model.outputs``.
    Keras orders ``model.outputs`` by ``keras.tree.flatten`` of that structure (a dict's
    values by sorted key, whatever order the dict was built in), and TF Lite's converter
    writes the flatbuffer's outputs in the same order (:func:`output_details_in_order`)."""
    return keras.tree.flatten(y)


@exact_kernels
def predict_all(model, x) -> list[np.ndarray]:
    """Every output of ``model`` on :class:`cle._core.inputs.ModelInputs` ``x``, as a list of
    float64 arrays in the order of ``model.outputs`` (:func:`flat_outputs`)."""
    ys = flat_outputs(_predicted(model, x.feed(model)))
    if len(ys) != len(model.outputs):
        raise ValueError(f"Model '{model.name}' returned {len(ys)} outputs but has "
                         f"{len(model.outputs)} (model.outputs). Received: outputs of types "
                         f"{[type(a).__name__ for a in ys]}")
    return [np.asarray(a, dtype=np.float64) for a in ys]


def outputs_once(runs: dict, what, x) -> list[np.ndarray]:
    """Every output of ``what`` (a Keras model: :func:`predict_all`; a ``.tflite``'s bytes:
    :func:`run_all`) on :class:`cle._core.inputs.ModelInputs` ``x``, computed once per
    ``runs`` (a dict the caller keeps for one set of models and inputs): a second call for
    the same ``what`` and ``x`` returns the arrays of the first."""
    key = (what if isinstance(what, bytes) else id(what), id(x))
    if key not in runs:
        runs[key] = (run_all(what, x, batch_size=TFLITE_BATCH) if isinstance(what, bytes)
                     else predict_all(what, x))
    return runs[key]


