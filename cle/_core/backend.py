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

import contextlib
import functools
import hashlib

__all__ = ["channels_first_conv_supported", "channels_first_problem", "check_runnable",
           "compiled", "exact_graph_kernels", "exact_kernels", "fused_leaky_relu_wrong",
           "warn_fused_leaky_relu", "NCHW_UNSUPPORTED"]

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


#: The slope TensorFlow's fused convolution kernels take for a LeakyReLU whatever it was.
FUSED_SLOPE = 0.2


@functools.lru_cache(maxsize=None)
def _fused_leaky_relu_probe(backend: str) -> bool:
    if backend != "tensorflow":
        return False
    import keras
    import numpy as np

    L = keras.layers
    try:  # named layers (no name counter moved), channels_last whatever the default
        x = np.random.default_rng(0).normal(size=(1, 4, 4, 2)).astype("float32")
        inp = keras.Input((4, 4, 2), name="cle_probe_in")
        conv = L.Conv2D(2, 1, kernel_initializer="ones", bias_initializer="ones",
                        data_format="channels_last", name="cle_probe_conv")
        y = L.LeakyReLU(0.01, name="cle_probe_leaky")(L.Add(name="cle_probe_add")(
            [conv(inp), inp]))
        probe = keras.Model(inp, y, name="cle_probe")
        called = np.asarray(probe(x))
        predicted = probe.predict(x, verbose=0)
    except Exception:  # noqa: BLE001 - not known: taken as wrong (the remapper off is exact)
        return True
    return not np.allclose(called, predicted, rtol=1e-5, atol=1e-6)


def fused_leaky_relu_wrong() -> bool:
    """Whether TensorFlow's graph mode (``model.predict``, a ``tf.function``) here computes a
    ``Conv2D`` with a bias, an ``Add`` and a ``LeakyReLU`` of another slope than
    :data:`FUSED_SLOPE` with that slope: its oneDNN remapper fuses the three into one kernel
    and drops the slope (TensorFlow 2.21 on the AMD EPYC and Intel Xeon machines of this kind;
    not with ``TF_ENABLE_ONEDNN_OPTS=0``, nor on JAX). A model called eagerly computes it
    right. Tried once per process (a 4 x 4 map), never guessed from the CPU."""
    import keras

    return _fused_leaky_relu_probe(keras.backend.backend())


def _other_slope(op) -> bool:
    """Whether ``op`` may compute a LeakyReLU whose slope is not :data:`FUSED_SLOPE`: a
    LeakyReLU layer or a ``keras.ops.leaky_relu`` operation of another slope, an activation
    given as ``functools.partial(leaky_relu, negative_slope=...)`` of another, or a ``Lambda``
    (its function cannot be read)."""
    if type(op).__name__ in ("LeakyReLU", "LeakyRelu"):
        return float(getattr(op, "negative_slope", FUSED_SLOPE)) != FUSED_SLOPE
    if type(op).__name__ == "Lambda":
        return True
    fn = getattr(op, "activation", None)
    if isinstance(fn, functools.partial) and "leaky_relu" in getattr(fn.func, "__name__", ""):
        return float(fn.keywords.get("negative_slope", FUSED_SLOPE)) != FUSED_SLOPE
    return False


def _leaky_slopes(model) -> bool:
    """Whether ``model`` (nested models and layers included) holds a layer or an operation of
    its functional graph that may compute a LeakyReLU of another slope than
    :data:`FUSED_SLOPE` (:func:`_other_slope`)."""
    import keras

    from cle._core import keras_internals

    if not isinstance(model, keras.layers.Layer):
        return False
    found = [model] + keras_internals.sublayers(model)
    for layer in list(found):
        found.extend(getattr(layer, "operations", ()))
    return any(_other_slope(op) for op in found)


def _fused_pattern(model) -> list[str]:
    """The names of the LeakyReLU calls of ``model``'s graph (slope not :data:`FUSED_SLOPE`)
    whose input is an ``Add`` of the output of a ``Conv2D`` with a bias: the pattern
    :func:`fused_leaky_relu_wrong` is about."""
    import keras

    from cle._core.graph import graph_view

    names = []
    for call in graph_view(model).calls:  # a Lambda may hold one: not named as one
        if type(call.layer).__name__ == "Lambda" or not _other_slope(call.layer) \
                or not call.inputs:
            continue
        add = call.inputs[0].producer
        if add is None or add.kind is not keras.layers.Add:
            continue
        if any(t.producer is not None and type(t.producer.layer) is keras.layers.Conv2D
               and t.producer.layer.use_bias for t in add.inputs):
            names.append(call.name)
    return names


def warn_fused_leaky_relu(model, new_model) -> None:
    """Warn when ``new_model`` (a fold or an equalization of ``model``) holds the pattern
    :func:`fused_leaky_relu_wrong` finds TensorFlow computing wrong here at LeakyReLUs where
    ``model`` did not (a batch norm between the convolution and the ``Add`` was folded): the
    new model is exact as called, but its ``predict`` is not. Nothing where the probe finds
    the kernels right, or the model holds no such LeakyReLU."""
    if not (_leaky_slopes(new_model) and fused_leaky_relu_wrong()):
        return
    import warnings

    before = set(_fused_pattern(model))
    added = [n for n in _fused_pattern(new_model) if n not in before]
    if added:
        shown = ", ".join(f"'{n}'" for n in added[:3]) + (
            f" and {len(added) - 3} more" if len(added) > 3 else "")
        warnings.warn(
            f"model '{new_model.name}' computes what model '{model.name}' computes when "
            f"called, but TensorFlow's graph mode on this CPU (model.predict, tf.function) "
            f"computes its LeakyReLU {shown} with slope {FUSED_SLOPE:g}: with the batch norm "
            "folded, a Conv2D with a bias, an Add and a LeakyReLU make the pattern its oneDNN "
            "kernels fuse and drop the slope of (a TensorFlow bug). Predict with "
            "tf.config.optimizer.set_experimental_options({'remapping': False}), or "
            "TF_ENABLE_ONEDNN_OPTS=0 set before TensorFlow is imported", stacklevel=3)


@contextlib.contextmanager
def exact_graph_kernels(model):
    """Within the block, TensorFlow's graph mode computes ``model`` as its layers say: where
    :func:`fused_leaky_relu_wrong` and ``model`` holds a LeakyReLU of another slope
    (:func:`_leaky_slopes`), grappler's remapper (which makes the fused kernels) is off, and
    set back as it was after. Batch-norm folding turns a convolution, a batch norm, a residual
    ``Add`` and a LeakyReLU (keras_hub's CSPNet, a Darknet) into the very pattern that kernel
    gets wrong: the folded model's ``predict`` was off its call (CHANGELOG), and a model
    without batch norms that holds it (a YOLO-like head) had every figure measured against
    wrong references.
    Process-wide while it lasts (TensorFlow has no per-function switch); elsewhere nothing
    changes."""
    if not (_leaky_slopes(model) and fused_leaky_relu_wrong()):
        yield
        return
    import tensorflow as tf

    before = tf.config.optimizer.get_experimental_options().get("remapping", True)
    tf.config.optimizer.set_experimental_options({"remapping": False})
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options({"remapping": before})


def exact_kernels(fn):
    """``fn(model, ...)`` run within :func:`exact_graph_kernels` of its first argument (the
    doors of the stages that run a model: quantize, analyze, equalize, predict)."""
    @functools.wraps(fn)
    def run(model, *args, **kwargs):
        with exact_graph_kernels(model):
            return fn(model, *args, **kwargs)

    return run
