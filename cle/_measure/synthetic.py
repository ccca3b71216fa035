"""Synthetic calibration inputs from the model itself (ZeroQ-style distillation).

Without data, the converter still needs activation ranges. The model's batch norms remember
what real inputs did to it: each BN's moving mean μ and variance σ² are the statistics of its
input over the training data. :func:`distill` starts from Gaussian noise and runs Adam on the
inputs themselves so that, at every BN, the batch's per-channel mean and standard deviation
match μ and σ (Cai et al. 2020, "ZeroQ"). The loss, per BN, is the mean over channels of
``((m − μ)/σ)² + ((s − σ)/σ)²`` with ``s = sqrt(v + 1e-5)``; without that epsilon the
gradient of a channel whose batch variance reaches 0 is infinite and the loss turns NaN.

Backends: TensorFlow (``tf.GradientTape``) and JAX (``jax.value_and_grad`` over the model's
``stateless_call``). Only batch norms of the model's own graph are matched (a BN inside a
nested sub-model is seen through its sub-model's output only).
"""

from __future__ import annotations

import time
from typing import Callable

import keras
import numpy as np

from cle._core import keras_internals as internals

EPS = 1e-5
#: Weight of the cross-entropy term for classifiers, against the BN-statistics loss.
CE_WEIGHT = 0.05
STEPS, BATCH, LEARNING_RATE = 25, 20, 0.25
#: Input ranges wider than this scale Adam's step by ``width / WIDE_RANGE``.
WIDE_RANGE = 8.0


def batch_norms(model) -> list:
    """The BatchNormalization layers of ``model``'s own graph, called once, in graph order,
    whose input the model's inputs reach."""
    out = []
    for layer in model.layers:
        if (isinstance(layer, keras.layers.BatchNormalization)
                and len(internals.inbound_nodes(layer)) == 1):
            out.append(layer)
    return out


def _classifier(model):
    """"logits" or "probabilities" for a model whose one output is a vector of class scores
    (rank 2, more than one class), else None."""
    out = model.outputs[0]
    if len(model.outputs) != 1 or len(out.shape) != 2 or not (out.shape[-1] or 0) > 1:
        return None
    producer = internals.producer_of(out)
    activation = getattr(producer, "activation", None)
    name = getattr(activation, "__name__", "")
    if name == "softmax" or isinstance(producer, keras.layers.Softmax) or (
            isinstance(producer, keras.layers.Activation) and name == "softmax"):
        return "probabilities"
    return "logits"


def _feature_model(model, bns, classes):
    outputs = [bn.input for bn in bns] + ([model.outputs[0]] if classes else [])
    return keras.Model(model.inputs, outputs)


def _stats(bns):
    mus, sds, axes = [], [], []
    for bn in bns:
        mu = np.asarray(keras.ops.convert_to_numpy(bn.moving_mean), np.float32)
        var = np.asarray(keras.ops.convert_to_numpy(bn.moving_variance), np.float32)
        mus.append(mu)
        sds.append(np.sqrt(var + EPS).astype(np.float32))
        axes.append(bn.axis if isinstance(bn.axis, int) else bn.axis[0])
    return mus, sds, axes


def _objective(outs, mus, sds, axes, n_bn, targets, classes):
    """BN-statistics loss, plus (for a classifier) cross-entropy towards ``targets``."""
    ops = keras.ops
    total = 0.0
    for f, mu, sd, axis in zip(outs[:n_bn], mus, sds, axes):
        axis = axis % len(f.shape)
        reduce = tuple(i for i in range(len(f.shape)) if i != axis)
        mean = ops.mean(f, axis=reduce)
        std = ops.sqrt(ops.var(f, axis=reduce) + EPS)
        total = total + ops.mean(ops.square((mean - mu) / sd) + ops.square((std - sd) / sd))
    total = total / n_bn
    if classes:
        logits = outs[n_bn]
        log_p = ops.log(ops.clip(logits, 1e-12, 1.0)) if classes == "probabilities" else \
            ops.log_softmax(logits, axis=-1)
        ce = -ops.mean(ops.sum(ops.one_hot(targets, ops.shape(logits)[-1]) * log_p, axis=-1))
        total = total + CE_WEIGHT * ce
    return total


def distill(model, n: int, steps: int = STEPS, batch_size: int = BATCH,
            learning_rate: float = LEARNING_RATE, input_range=None, seed: int = 0,
            progress: Callable[[str], None] | None = None) -> tuple[np.ndarray, list]:
    """``n`` synthetic inputs whose statistics at every BN match its moving mean and variance.

    For a classifier (one output of class scores) each input is also pushed towards a class of
    its own (cross-entropy with weight :data:`CE_WEIGHT`, targets spread over the classes), so
    the synthetic outputs span the confident range that real inputs give (DeepInversion,
    Yin et al. 2020); BN statistics alone give logits far narrower than real ones.

    Args:
        model: a ``keras.Model`` with one input of fixed shape and batch norms in its graph.
        n: how many inputs.
        steps: Adam steps per batch.
        batch_size: inputs optimized together (the BN statistics are matched per batch).
        learning_rate: Adam's step size on the inputs (scaled up for an input range wider
            than :data:`WIDE_RANGE`).
        input_range: ``(lo, hi)`` the inputs are kept in (e.g. ``(-1, 1)`` for the ``tf``
            preprocessing), or None.
        seed: the starting noise and the target classes.
        progress: optional ``callable(str)``, told about every batch.

    Returns:
        ``(inputs, losses)``: a float32 array ``(n, *input_shape)`` and the final loss of
        each batch.

    Raises:
        ValueError: the model has no batch norm to match, or an input size is not fixed.
        RuntimeError: the backend is neither TensorFlow nor JAX.
    """
    bns = batch_norms(model)
    if not bns:
        raise ValueError(
            f"model '{model.name}' has no BatchNormalization layer whose statistics could shape "
            "synthetic inputs; pass calibration data")
    shape = tuple(model.inputs[0].shape[1:])
    if any(d is None for d in shape):
        raise ValueError(
            f"synthetic inputs need a fixed input size. Received: model input (N, "
            f"{', '.join('?' if d is None else str(d) for d in shape)})")
    classes = _classifier(model)
    features = _feature_model(model, bns, classes)
    mus, sds, axes = _stats(bns)
    clip = None if input_range is None else (float(input_range[0]), float(input_range[1]))
    # Inputs normalized to a few units take the step as it is; a wider range (0..255, caffe's
    # ±125) scales it, or 25 steps could not leave the starting noise.
    lr = learning_rate * (1.0 if clip is None else max(1.0, (clip[1] - clip[0]) / WIDE_RANGE))
    run = _step_function(features, mus, sds, axes, lr, len(bns), clip, classes)
    rng = np.random.default_rng(seed)
    n_classes = int(model.outputs[0].shape[-1]) if classes else 1
    targets = rng.permutation(max(n, n_classes))[:n] % n_classes
    out, losses = [], []
    start = time.perf_counter()
    for first in range(0, n, batch_size):
        b = min(batch_size, n - first)
        x = rng.standard_normal((b,) + shape).astype(np.float32)
        if clip is not None:
            x = np.clip(x * (clip[1] - clip[0]) / 4 + (clip[0] + clip[1]) / 2, *clip)
        x, value = run(x, steps, targets[first: first + b].astype(np.int32))
        out.append(x)
        losses.append(value)
        if progress is not None:
            progress(f"synthesized {first + b} of {n} inputs (loss {value:.3g}, "
                     f"{time.perf_counter() - start:.0f} s)")
    return np.concatenate(out, axis=0), losses


def _step_function(features, mus, sds, axes, lr, n_bn, clip, classes):
    """``run(x, steps, targets) -> (x, loss)``: Adam on the inputs, on the backend's own
    autodiff; ``clip`` = (lo, hi) projects the inputs into the input range after each step."""
    backend = keras.backend.backend()
    b1, b2, eps = 0.9, 0.999, 1e-8

    def objective(outs, targets):
        return _objective(list(outs), mus, sds, axes, n_bn, targets, classes)

    def adam(x, g, m, v, t):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        x = x - lr * (m / (1 - b1**t)) / (keras.ops.sqrt(v / (1 - b2**t)) + eps)
        if clip is not None:
            x = keras.ops.clip(x, clip[0], clip[1])
        return x, m, v

    if backend == "tensorflow":
        import tensorflow as tf

        @tf.function(reduce_retracing=True)
        def step(x, m, v, t, targets):
            with tf.GradientTape() as tape:
                tape.watch(x)
                value = objective(features(x, training=False), targets)
            x, m, v = adam(x, tape.gradient(value, x), m, v, t)
            return x, m, v, value

    elif backend == "jax":
        import jax

        weights = ([v.value for v in features.trainable_variables],
                   [v.value for v in features.non_trainable_variables])

        def loss_of(x, targets, weights):
            outs, _ = features.stateless_call(weights[0], weights[1], x, training=False)
            return objective(outs, targets)

        grad = jax.value_and_grad(loss_of)

        @jax.jit
        def jitted(x, m, v, t, targets, weights):  # weights as arguments, not constants
            value, g = grad(x, targets, weights)
            x, m, v = adam(x, g, m, v, t)
            return x, m, v, value

        def step(x, m, v, t, targets):
            return jitted(x, m, v, t, targets, weights)
    else:
        raise RuntimeError(
            "synthetic calibration inputs need the TensorFlow or JAX backend (gradients with "
            f"respect to the inputs). Received: KERAS_BACKEND={backend}; pass calibration data")

    def run(x, steps, targets):
        x = keras.ops.convert_to_tensor(x)
        m = keras.ops.zeros_like(x)
        v = keras.ops.zeros_like(x)
        targets = keras.ops.convert_to_tensor(targets)
        value = None
        for t in range(1, steps + 1):
            x, m, v, value = step(x, m, v, keras.ops.convert_to_tensor(float(t)), targets)
        return np.asarray(keras.ops.convert_to_numpy(x)), float(keras.ops.convert_to_numpy(value))
    return run
