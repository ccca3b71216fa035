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
           "dft_stft_on_jax", "pixel_matmul_on_jax", "pixel_resize_on_jax",
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
    return _swapped_on_jax("keras.src.backend.jax.math", "stft", _dft_stft)


def _dft_stft(keras_stft):
    """``keras_stft`` (Keras' JAX ``stft``) computed as a real convolution (dft_stft_on_jax)."""
    def stft(x, sequence_length, sequence_stride, fft_length, window="hann", center=True):
        import jax
        import numpy as np
        import scipy.signal

        x = jax.numpy.asarray(x)
        try:
            win = (np.ones(fft_length) if window is None else np.pad(np.asarray(
                scipy.signal.get_window(window, sequence_length) if isinstance(window, str)
                else window, np.float64), _centred(fft_length, sequence_length)))
        except Exception:  # noqa: BLE001 - a window that is a tracer: Keras' own form
            win = None
        if win is None or win.shape != (fft_length,) or str(x.dtype) not in (
                "float32", "float64") or (isinstance(window, str)
                                          and window not in ("hann", "hamming")):
            return keras_stft(x, sequence_length, sequence_stride, fft_length, window, center)
        if center:
            pad = [(0, 0)] * (x.ndim - 1) + [(fft_length // 2, fft_length // 2)]
            x = jax.numpy.pad(x, pad, mode="reflect")
        bins = fft_length // 2 + 1
        angle = 2 * np.pi * np.outer(np.arange(fft_length), np.arange(bins)) / fft_length
        kernel = np.concatenate([win[:, None] * np.cos(angle), -win[:, None] * np.sin(angle)],
                                axis=1)[:, None, :]  # (width, 1 channel in, 2 * bins out)
        out = jax.lax.conv_general_dilated(
            x.reshape(-1, x.shape[-1], 1), jax.numpy.asarray(kernel, x.dtype),
            (sequence_stride,), "VALID", dimension_numbers=("NWC", "WIO", "NWC"),
            precision=jax.lax.Precision.HIGHEST)
        out = out.reshape(x.shape[:-1] + out.shape[1:])
        return out[..., :bins], out[..., bins:]

    return stft


def _centred(fft_length, sequence_length):
    """The zeros either side of a window of ``sequence_length`` in a frame of ``fft_length``
    (as Keras pads it)."""
    left = (fft_length - sequence_length) // 2
    return (left, fft_length - sequence_length - left)


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
    return _swapped_on_jax("keras.src.backend.jax.image", "resize", _broadcast_pixel)


def _broadcast_pixel(keras_resize):
    """``keras_resize`` (Keras' JAX ``image.resize``), a 1 x 1 image broadcast
    (pixel_resize_on_jax)."""
    def resize(images, size, interpolation="bilinear", antialias=False,
               crop_to_aspect_ratio=False, pad_to_aspect_ratio=False, fill_mode="constant",
               fill_value=0.0, data_format=None):
        import jax
        from keras.src.backend import standardize_data_format

        images = jax.numpy.asarray(images)
        last = standardize_data_format(data_format) == "channels_last"
        spatial = images.shape[-3:-1] if last else images.shape[-2:]
        if images.ndim in (3, 4) and tuple(spatial) == (1, 1) and len(size) == 2 \
                and not pad_to_aspect_ratio and interpolation in _RESIZES:
            shape = (images.shape[:-3] + tuple(size) + images.shape[-1:] if last
                     else images.shape[:-2] + tuple(size))
            return jax.numpy.broadcast_to(images, shape)
        return keras_resize(images, size, interpolation, antialias, crop_to_aspect_ratio,
                            pad_to_aspect_ratio, fill_mode, fill_value, data_format)

    return resize


#: The interpolations Keras' JAX resize has (each gives a one-pixel image's value everywhere).
_RESIZES = ("nearest", "bilinear", "bicubic", "lanczos3", "lanczos5")


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
    with _swapped_on_jax(module, "matmul", _pixel_convolution), \
            _swapped_on_jax(module, "einsum", _pixel_einsum):
        yield


def _one_row_by_matrix(a, b) -> bool:
    """Whether ``a @ b`` is of one row of rank 4 or more by a float matrix (pixel_matmul_on_jax)."""
    import math

    import jax

    return a.ndim >= 4 and b.ndim == 2 and math.prod(a.shape[:-1]) == 1 and all(
        jax.numpy.issubdtype(t.dtype, jax.numpy.floating) for t in (a, b))


def _as_convolution(a, b):
    """``a @ b`` (:func:`_one_row_by_matrix`) as a 1 x 1 convolution."""
    import jax

    out = jax.lax.conv_general_dilated(
        a.reshape(1, 1, 1, a.shape[-1]), b.reshape(1, 1, *b.shape), (1, 1), "VALID",
        dimension_numbers=("NHWC", "HWIO", "NHWC"), precision=jax.lax.Precision.HIGHEST)
    return out.reshape(a.shape[:-1] + b.shape[-1:])


def _pixel_convolution(keras_matmul):
    """``keras_matmul`` (Keras' JAX ``numpy.matmul``), one row of rank 4 or more by a matrix a
    1 x 1 convolution (pixel_matmul_on_jax)."""
    def matmul(x1, x2):
        import jax

        a, b = jax.numpy.asarray(x1), jax.numpy.asarray(x2)
        return _as_convolution(a, b) if _one_row_by_matrix(a, b) else keras_matmul(x1, x2)

    return matmul


def _pixel_einsum(keras_einsum):
    """``keras_einsum`` (Keras' JAX ``numpy.einsum``), ``"abcd,de->abce"`` of one row of rank 4
    or more by a matrix a 1 x 1 convolution (pixel_matmul_on_jax)."""
    def einsum(subscripts, *operands, **kwargs):
        import jax

        spec = subscripts.replace(" ", "")
        if len(operands) == 2 and not kwargs and "->" in spec and "." not in spec:
            (left, right), out = spec.split("->")[0].split(","), spec.split("->")[1]
            a, b = (jax.numpy.asarray(t) for t in operands)
            letters = left + right[1:]
            if len(set(letters)) == len(letters) and len(right) == 2 and right[0] == left[-1] \
                    and out == left[:-1] + right[1] and _one_row_by_matrix(a, b):
                return _as_convolution(a, b)
        return keras_einsum(subscripts, *operands, **kwargs)

    return einsum
