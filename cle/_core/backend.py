"""What the running Keras backend can compute on this machine, found by trying.

TensorFlow runs channels_first (NCHW) convolutions on the CPU only where oneDNN is on, and it
turns oneDNN on by default only on some CPUs. Without it, ``Conv1D``, ``Conv2D`` and the
transposed convolutions fail at run time with "Conv2D op currently only supports the NHWC tensor
format on the CPU". The library never runs a model to fold or equalize it (those are weight
edits), but empirical bias correction, measured activation ranges and quantization evaluation
do. :func:`check_runnable` refuses such a model up front, with one clear message, instead of
letting TensorFlow fail deep inside.

The capability is probed once per process (a tiny NCHW convolution) and cached; it is never
guessed from the CPU's name.
"""

from __future__ import annotations

import functools
import hashlib

__all__ = ["channels_first_conv_supported", "channels_first_problem", "check_runnable",
           "compiled", "NCHW_UNSUPPORTED"]

# What is missing, in words: the tests' skip reason and the library's error both start from it.
NCHW_UNSUPPORTED = (
    "TensorFlow cannot run channels_first (NCHW) convolutions on this CPU (its CPU kernels "
    "accept only NHWC where oneDNN is off, which TensorFlow decides by CPU)"
)

# Layer classes whose channels_first call fails without NCHW CPU kernels (found by trying each
# on such a CPU: Conv3D, the depthwise and separable convolutions and pooling layers run).
_NCHW_CONV_CLASSES = ("Conv1D", "Conv2D", "Conv1DTranspose", "Conv2DTranspose",
                      "Conv3DTranspose")


@functools.lru_cache(maxsize=None)
def _probe(backend: str) -> tuple[bool, str]:
    if backend != "tensorflow":
        return True, ""
    import numpy as np
    from keras import ops

    try:
        ops.conv(np.ones((1, 1, 3, 3), "float32"), np.ones((1, 1, 1, 1), "float32"),
                 data_format="channels_first")
    except Exception as exc:  # UnimplementedError on CPUs without NCHW kernels
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return False, first
    return True, ""


def channels_first_conv_supported() -> bool:
    """Whether the current backend can run a channels_first convolution here (tried once)."""
    import keras

    return _probe(keras.backend.backend())[0]


def _nchw_conv_layers(model) -> list[str]:
    names = []
    from cle._core import keras_internals

    for layer in keras_internals.sublayers(model):
        if getattr(layer, "data_format", None) != "channels_first":
            continue
        for klass in type(layer).__mro__:
            if klass.__name__ in _NCHW_CONV_CLASSES and klass.__module__.startswith("keras"):
                names.append(layer.name)
                break
    return names


def channels_first_problem(model) -> str | None:
    """Why ``model`` cannot be run here (one sentence), or None if it can."""
    # The layers first: the probe (and the one-line log TensorFlow writes when it fails) is
    # needed only for a model with channels_first convolutions.
    names = _nchw_conv_layers(model)
    if not names or channels_first_conv_supported():
        return None
    shown = ", ".join(f"'{n}'" for n in names[:5]) + (
        f" and {len(names) - 5} more" if len(names) > 5 else "")
    return (
        f"model '{model.name}' cannot be run here: {NCHW_UNSUPPORTED}, and its layers "
        f"{shown} use data_format='channels_first'. Run it with KERAS_BACKEND=jax, on a GPU, "
        "or rebuild it channels_last"
    )


def check_runnable(model, purpose: str):
    """Raise a RuntimeError naming the layers when ``model`` cannot be run on this machine.

    Args:
        model: the Keras model that ``purpose`` is about to run.
        purpose: what needs to run it, e.g. ``"empirical bias correction"``.

    Raises:
        RuntimeError: the backend cannot run a channels_first convolution of the model here.
    """
    problem = channels_first_problem(model)
    if problem is not None:
        raise RuntimeError(f"{purpose} runs the model, but {problem}. Received: model "
                           f"'{model.name}' on backend tensorflow")


def compiled(fn):
    """``fn`` as a ``tf.function`` on TensorFlow (traced again at most once for a new batch
    size), else ``fn`` itself. For a pass of a whole model over many batches: eager execution
    pays a Python dispatch per operation, which on a network of many small layers costs more
    than the arithmetic. Not ``jax.jit``: a model called inside it bakes its weights into the
    program as constants (a large network's compile grows with them); a JAX pass that is
    compiled hands the weights in as arguments (``_transforms/bias_steps``,
    ``_measure/synthetic``)."""
    import keras

    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, reduce_retracing=True, autograph=False)
    return fn


def weights_digest(model) -> str:
    """A SHA-1 of every weight of ``model`` (the batch norms' moving statistics among them):
    a key that changes when the model is changed in place."""
    import keras
    import numpy as np

    digest = hashlib.sha1()
    for v in model.weights:
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(v)).tobytes())
    return digest.hexdigest()
