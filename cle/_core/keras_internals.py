"""Every use of Keras' private API in keras-cle, each behind one small function.

Keras 3 has no public API for reading a model's graph: which layer produced a tensor, the nodes
of a Functional model in order, a Sequential model's graph, the layers a layer holds. The
functions here are the only place in the package that reaches into Keras' internals
(``tests/test_layout.py`` fails on any other use), so a Keras upgrade that moves one of them
breaks here and nowhere else. Each docstring ends with the public API that would replace it.

The Keras ``Node`` objects these functions return are read through their unprefixed attributes
(``operation``, ``arguments``, ``input_tensors``, ``outputs``, ``is_input``), which
:mod:`cle._core.graph` uses.
"""

from __future__ import annotations

import contextlib

from keras.src.models.functional import Functional as _Functional
from keras.src.ops import numpy as _ops_numpy

from cle._core import jax_forms


def is_functional(obj) -> bool:
    """Whether ``obj`` is a Functional model (a Sequential model is one too).

    Public replacement: none; Keras exports no Functional class (``keras.Model(inputs,
    outputs)`` returns an instance of the private ``keras.src.models.functional.Functional``).
    """
    return isinstance(obj, _Functional)


def sequential_graph(model):
    """The Functional graph a built Sequential model keeps, or None before it is built.

    Public replacement: none (``Sequential._functional``).
    """
    return getattr(model, "_functional", None)


def nodes_by_depth(function) -> dict:
    """``{depth: [Node]}`` of a Functional graph (the deepest nodes are the model's inputs).

    Public replacement: none (``Functional._nodes_by_depth``).
    """
    return function._nodes_by_depth


def inbound_nodes(layer) -> list:
    """Every call of ``layer`` in every graph it was called in (one ``Node`` per call).

    Public replacement: none (``Layer._inbound_nodes``).
    """
    return layer._inbound_nodes


def outbound_nodes(layer) -> list:
    """Every call that consumes an output of ``layer`` (one ``Node`` per call).

    Public replacement: none (``Layer._outbound_nodes``).
    """
    return layer._outbound_nodes


def producer_of(tensor):
    """The operation (layer, or plain op) whose call made the symbolic ``tensor``, or None.

    Public replacement: none (``KerasTensor._keras_history``).
    """
    history = getattr(tensor, "_keras_history", None)
    return None if history is None else history.operation


def output_position(tensor) -> int:
    """Which of its operation's outputs the symbolic ``tensor`` is (0 for the first).

    Public replacement: none (``KerasTensor._keras_history``).
    """
    history = getattr(tensor, "_keras_history", None)
    return 0 if history is None else int(history.tensor_index)


def fed(model, arrays):
    """What ``model`` is called with on ``arrays`` (one per input, in the order of
    ``model.inputs``): the array of a single input, a dict by input name for a model built on
    a dict of inputs (``keras.Model(inputs={"image": ..., "meta": ...})``, which refuses a
    list), else a list.

    Public replacement: ``model.input`` for a Functional model, but a Sequential model that
    has never been called raises there (``Functional._inputs_struct``).
    """
    arrays = list(arrays)
    struct = getattr(model, "_inputs_struct", None)
    if isinstance(struct, dict):
        import keras

        return keras.tree.pack_sequence_as(struct, arrays)
    return arrays[0] if len(arrays) == 1 else arrays


def sublayers(layer, recursive: bool = True) -> list:
    """The layers ``layer`` holds (itself excluded), depth first; ``recursive``: also the
    layers those hold.

    Public replacement: ``Model.layers`` covers a model's own layers only, not those inside a
    custom layer (``Layer._flatten_layers``).
    """
    return list(layer._flatten_layers(include_self=False, recursive=recursive))


def takes_training(layer) -> bool:
    """Whether ``layer.call`` takes a ``training`` argument (which ``Functional.call`` sets).

    Public replacement: ``inspect.signature(layer.call)`` tells the same for most layers, but
    not the arguments Keras itself injects (``Layer._call_context_args``).
    """
    return "training" in getattr(layer, "_call_context_args", ())


#: Plain operations (``x + y``, ``keras.ops.multiply``) on KerasTensors, by class.
#: Public replacement: none (the op classes live in ``keras.src.ops.numpy``).
ADD_OP, MULTIPLY_OP = _ops_numpy.Add, _ops_numpy.Multiply


def lambda_copy(layer):
    """A new ``keras.layers.Lambda`` computing what ``layer`` (one) computes, holding the same
    Python callables (its function, output shape and mask): one rebuilt from its config holds
    the function's bytecode without the globals it reads, and a lambda that reads
    ``keras.ops`` or a module of the caller's raises ``NameError`` when the copy is called.

    Public replacement: none (``Lambda._output_shape``; the function, mask and arguments are
    public attributes).
    """
    return type(layer)(layer.function, output_shape=layer._output_shape, mask=layer.mask,
                       arguments=dict(layer.arguments), name=layer.name,
                       dtype=layer.dtype_policy, trainable=layer.trainable)


@contextlib.contextmanager
def not_compiled(model):
    """For the block, ``model.compiled`` reads False, so that ``keras.models.clone_model``
    does not compile its copy from ``model``'s compile config (which names a loss or metric
    function by a name Keras cannot find again unless it was registered: a ``TypeError``).
    Yields whether ``model`` was compiled; restores it afterwards.

    Public replacement: none (``clone_model`` compiles a compiled model's copy unasked;
    ``Trainer.compiled`` is a plain attribute).
    """
    was = bool(getattr(model, "compiled", False))
    if was:
        model.compiled = False
    try:
        yield was
    finally:
        if was:
            model.compiled = True


def built_input_shape(model):
    """The one input shape a built subclassed model was built with (batch axis included), or
    None (not built, several inputs, or a Keras that keeps it elsewhere).

    Public replacement: none; a subclassed model has no ``inputs`` or ``input_shape``, and
    Keras keeps what ``build()`` was called with in ``_build_shapes_dict``.
    """
    shapes = getattr(model, "_build_shapes_dict", None)
    if not isinstance(shapes, dict) or len(shapes) != 1:
        return None
    shape = next(iter(shapes.values()))
    return tuple(shape) if isinstance(shape, (tuple, list)) and all(
        d is None or isinstance(d, int) for d in shape) else None


@contextlib.contextmanager
def unsafe_deserialization():
    """Keras' safe mode off for the block (thread-local, restored afterwards), so that a layer
    config taken from a live layer (a ``Lambda`` holding Python bytecode) deserializes.

    Public replacement: ``keras.config.enable_unsafe_deserialization()`` turns safe mode off for
    the whole process and cannot be undone (``keras.src.saving.serialization_lib
    .SafeModeScope``).
    """
    try:
        from keras.src.saving.serialization_lib import SafeModeScope
    except ImportError:  # pragma: no cover - a Keras without the scope: leave safe mode alone
        yield
        return
    with SafeModeScope(False):
        yield


__all__ = ["ADD_OP", "MULTIPLY_OP", "built_input_shape", "inbound_nodes", "is_functional",
           "lambda_copy",
           "nodes_by_depth", "not_compiled", "outbound_nodes", "output_position", "producer_of",
           "nn_operation", "sequential_graph", "sublayers", "takes_training",
           "dft_stft_on_jax", "last_axis_softmax_on_jax", "pixel_matmul_on_jax",
           "pixel_resize_on_jax",
           "tanh_gelu_on_jax",
           "unsafe_deserialization"]


def nn_operation(op) -> str | None:
    """The class name of ``op`` when it is an operation of ``keras.ops``' ``nn`` module (a node
    ``keras.ops.softplus(x)`` or ``keras.activations.selu(x)`` leaves in a Functional graph:
    ``"Softplus"``, ``"Selu"``, ...), else None.

    Public replacement: none; the operation classes of ``keras.src.ops.nn`` are not exported
    (the op's ``name`` is a unique name, ``"softplus_1"``, not its kind).
    """
    cls = type(op)
    return cls.__name__ if cls.__module__ == "keras.src.ops.nn" else None


@contextlib.contextmanager
def _swapped_on_jax(module: str, name: str, make):
    """On the JAX backend, ``module.name`` is ``make(original)`` within the block (process-wide;
    restored afterwards). Elsewhere, nothing."""
    import importlib

    import keras

    if keras.backend.backend() != "jax":
        yield
        return
    owner = importlib.import_module(module)
    original = getattr(owner, name)
    setattr(owner, name, make(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def tanh_gelu_on_jax():
    """On the JAX backend, every GELU Keras computes within the block is its tanh form
    (``approximate=True``), whatever the caller asked: ``keras.activations.gelu``,
    ``Activation("gelu")``, ``keras.ops.gelu`` all end in the JAX backend's ``nn.gelu``,
    which is swapped for the block (process-wide; restored afterwards). Elsewhere, nothing.

    Public replacement: none; Keras has no switch for the form of a GELU it computes
    (``keras.src.backend.jax.nn.gelu``).
    """
    def make(exact):
        def tanh_form(x, approximate=True):
            return exact(x, True)
        return tanh_form

    return _swapped_on_jax("keras.src.backend.jax.nn", "gelu", make)


def dft_stft_on_jax():
    """On the JAX backend, every short-time Fourier transform Keras computes within the block
    (``keras.layers.MelSpectrogram``, ``keras.ops.stft``: the JAX backend's ``math.stft``) is
    computed in real numbers, as a strided convolution of the (centred, reflect-padded) signal
    with the windowed cosines and sines of the DFT: the same values (float32 round-off), with
    no complex tensor. ``jax.scipy.signal.stft`` computes a complex FFT, whose transpose TF
    Lite's converter cannot write ("failed to legalize operation 'tfl.transpose'"). A window
    that is not a constant is left to Keras. Elsewhere, nothing.

    Public replacement: none; Keras has no switch for how its JAX backend computes an STFT
    (``keras.src.backend.jax.math.stft``).
    """
    return _swapped_on_jax("keras.src.backend.jax.math", "stft", jax_forms.dft_stft)


def last_axis_softmax_on_jax():
    """On the JAX backend, every softmax Keras computes within the block (``Softmax``,
    ``Activation("softmax")``, ``keras.ops.softmax``: the JAX backend's ``nn.softmax``) over an
    axis other than the last is computed over the last axis, that axis moved there and back:
    the same values. JAX's export of a softmax over another axis (a spatial soft-argmax's over
    positions) is its parts, REDUCE_MAX, SUB, EXP, SUM and DIV, and its denominator became an
    INT8 tensor whose calibrated range new inputs' flatter maps pass (hunt13's soft-argmax
    keypoints, far below TensorFlow's file, whose export writes TRANSPOSE, SOFTMAX, TRANSPOSE:
    CHANGELOG); over the last axis it writes one SOFTMAX. Elsewhere, nothing.

    Public replacement: none; Keras has no switch for how its JAX backend computes a softmax
    (``keras.src.backend.jax.nn.softmax``).
    """
    return _swapped_on_jax("keras.src.backend.jax.nn", "softmax", jax_forms.last_axis_softmax)


def pixel_resize_on_jax():
    """On the JAX backend, every resize Keras computes within the block (``Resizing``,
    ``UpSampling2D``, ``keras.ops.image.resize``: the JAX backend's ``image.resize``) of an
    image of one pixel (1 x 1, as after a global pooling: DeepLab's image-pooling branch) is
    that pixel broadcast to the new size: what every interpolation gives (its weights are
    normalized). ``jax.image.resize`` contracts the axis of one pixel, and TF Lite's converter
    wrote, after a convolution, a TRANSPOSE LiteRT refused ("perm dims 4 != 2"). Any other
    resize is left to Keras; elsewhere, nothing.

    Public replacement: none; Keras has no switch for how its JAX backend resizes
    (``keras.src.backend.jax.image.resize``).
    """
    return _swapped_on_jax("keras.src.backend.jax.image", "resize", jax_forms.broadcast_pixel)


@contextlib.contextmanager
def pixel_matmul_on_jax():
    """On the JAX backend, every matmul Keras computes within the block (``Dense``,
    ``keras.ops.matmul``: the JAX backend's ``numpy.matmul``; and an einsum of that form,
    ``"abcd,de->abce"``: ``EinsumDense``, ``keras.ops.einsum``) of a float tensor of rank 4 or
    more that is one row (every dimension but the last 1: a ``Dense`` on a global pooling's
    ``keepdims`` map, read at a batch of one) by a matrix is a 1 x 1 convolution, the same
    values. TF Lite's converter wrote JAX's form (a reshape around it too) as a BATCH_MATMUL
    of the wrong rank and stopped ("'tfl.batch_matmul' op found invalid output rank").
    Any other matmul or einsum is left to Keras; elsewhere, nothing.

    Public replacement: none; Keras has no switch for how its JAX backend multiplies
    (``keras.src.backend.jax.numpy.matmul``, ``einsum``).
    """
    module = "keras.src.backend.jax.numpy"
    with _swapped_on_jax(module, "matmul", jax_forms.pixel_convolution), \
            _swapped_on_jax(module, "einsum", jax_forms.pixel_einsum):
        yield
