"""Reading a Keras model into TF Lite's converter through Keras' export, and keeping the
converter quiet.

On every backend but TensorFlow's (and for a model TensorFlow cannot trace), the converter reads
a Keras 3 model from a SavedModel that Keras' ``ExportArchive`` writes: :func:`shared_exports`
writes it once per model, batch and weights within ``cle.quantize``; :func:`static_batch` fixes
its batch (a device's file); :func:`with_batch` gives the model inputs of a fixed batch and,
where the backend's export cannot take a free size, the data's size
(:func:`export_shapes`).
:func:`quiet` silences the converter and the export.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import io
import logging
import os
import shutil
import sys
import tempfile
import warnings
import weakref

import keras

from cle._core import backend
from cle._core import keras_internals as internals_keras
from cle._core.inputs import input_names
from cle._tflite import internals

__all__ = ["SERVING", "export_batch", "export_shapes", "fixed_sizes", "quiet", "read_exported",
           "shared_exports", "static_batch", "traced_batch", "with_batch"]


#: The batch a model read through Keras' export is given (None: the backend's own, see
#: :func:`export_batch`), set by :func:`static_batch`.
_STATIC_BATCH: contextvars.ContextVar = contextvars.ContextVar("cle_static_batch", default=None)


@contextlib.contextmanager
def static_batch(n: int | None):
    """Within the block, a model the converter reads through Keras' export (every model on
    the JAX backend) is read with its batch fixed at ``n``: that export is polymorphic in the
    batch, and its shape arithmetic (SHAPE, BROADCAST_TO, UNSORTED_SEGMENT_PROD, ...) becomes
    operators a microcontroller's runtime has no kernel for and an NPU's compiler leaves to
    the CPU. A model traced on TensorFlow is traced with that batch too: a free batch leaves
    most of them out, but not all (an unrolled recurrent layer's zero state becomes SHAPE and
    FILL, which TF Lite Micro cannot prepare). ``None``: the backend's own
    (:func:`export_batch`).
    :func:`cle._tflite.runtime.run_all` runs a file of fixed batch one input at a time."""
    token = _STATIC_BATCH.set(n)
    try:
        yield
    finally:
        _STATIC_BATCH.reset(token)


def export_batch() -> int | None:
    """The batch a model read through Keras' export is given here (None: free): the one of
    :func:`static_batch`, else one on every backend but TensorFlow's. There the export's
    polymorphic batch (jax2tf) splits SOFTMAX into REDUCE_MAX, EXP, SUM and DIV behind
    BROADCAST_TO and shape arithmetic, which TF Lite's INT8 quantization takes apart
    (tests/test_quantize.py), and LiteRT ran the free-batch file several times slower."""
    batch = _STATIC_BATCH.get()
    if batch is None and keras.backend.backend() != "tensorflow":
        return 1
    return batch


def export_shapes(model, x) -> tuple | None:
    """Each input's shape but the batch, as Keras' export is to read ``model``: None (the
    model's own) but on a backend other than TensorFlow for a model with a free dimension
    beyond the batch (a fully convolutional net built on ``(None, None, 3)``), where the
    export's shape polymorphism fails (jax2tf could not trace a convolution's gradient over a
    free height and width: its padding became a symbolic expression): there the size of the
    data ``x`` (a :class:`cle._core.inputs.ModelInputs`), which the file then keeps."""
    if x is None or keras.backend.backend() == "tensorflow" or not any(
            _free(t) for t in model.inputs):
        return None
    arrays = x.arrays if hasattr(x, "arrays") else (x,)
    return tuple(tuple(a.shape[1:]) for a in arrays)


def _free(tensor) -> bool:
    """Whether the input ``tensor`` leaves a dimension beyond the batch free."""
    return None in tuple(tensor.shape[1:])


def with_batch(model, batch: int, shapes=None):
    """A Functional model that calls ``model`` on inputs whose batch is ``batch`` (and whose
    other dimensions are ``shapes``, one per input, when given: :func:`export_shapes`)."""
    shapes = shapes or [tuple(t.shape[1:]) for t in model.inputs]
    inputs = [keras.Input(batch_shape=(batch,) + tuple(shape), dtype=t.dtype, name=n)
              for t, n, shape in zip(model.inputs, input_names(model), shapes)]
    if any(any(o is t for t in model.inputs) for o in keras.tree.flatten(model.outputs)):
        # An output that is an input itself: the call below would return that new input
        # for it, and Keras then finds the other outputs "not connected to inputs". The
        # graph rebuilt on the new inputs (in the model's own structure: a list of one, a
        # dict), its layers shared and the copy not compiled, has none of that.
        packed = keras.tree.pack_sequence_as(model.input, inputs)
        with internals_keras.not_compiled(model):
            return keras.models.clone_model(model, input_tensors=packed,
                                            clone_function=lambda layer: layer)
    with warnings.catch_warnings():  # a model of a list of one called with its array
        warnings.simplefilter("ignore")
        outputs = model(internals_keras.fed(model, inputs))
    return keras.Model(inputs, outputs, name=model.name)


#: On JAX, an exact GELU is exported as its tanh form (``gelu(approximate=True)``,
#: :func:`cle._core.keras_internals.tanh_gelu_on_jax`): JAX's export writes exact GELU's erf
#: as a polynomial of selects, and TF Lite's runtime aborted the process on its INT8 file
#: (tests/test_unconvertible.py keeps that premise, with this False). The two forms differ by
#: under 5e-4 (:func:`cle._tflite.convertible.tanh_gelu_note`); TensorFlow's export writes
#: exact GELU as one builtin op and is left alone.
TANH_GELU = True
#: On JAX, an STFT (``MelSpectrogram``, ``keras.ops.stft``) is exported as a real convolution
#: with the DFT's windowed cosines and sines (:func:`cle._core.keras_internals.dft_stft_on_jax`):
#: JAX's complex FFT left a transpose TF Lite's converter refused. Same values.
DFT_STFT = True
#: On JAX, a resize of a 1 x 1 image (a global pooling's, upsampled) is exported as a broadcast
#: (:func:`cle._core.keras_internals.pixel_resize_on_jax`): after a convolution, JAX's form left a
#: TRANSPOSE LiteRT refused. Same values. (tests/test_unconvertible.py keeps both premises.)
PIXEL_RESIZE = True
#: On JAX, a matmul (or einsum) of one row of rank 4 or more by a matrix (a Dense or an
#: EinsumDense on a 1 x 1 map) is exported as a 1 x 1 convolution
#: (:func:`cle._core.keras_internals.pixel_matmul_on_jax`): JAX's form made TF Lite's converter
#: stop on a BATCH_MATMUL of the wrong rank. Same values.
PIXEL_MATMUL = True
#: On JAX, a softmax over an axis other than the last is exported over the last axis, that axis
#: moved there and back (:func:`cle._core.keras_internals.last_axis_softmax_on_jax`): JAX's form
#: left its denominator an INT8 tensor new inputs clip. Same values.
LAST_AXIS_SOFTMAX = True
#: The SavedModel signature the converter reads (the one ``from_keras_model`` reads).
SERVING = "serving_default"
#: ``{(id(model), batch, shapes, weights' digest): (model, SavedModel directory)}`` within
#: :func:`shared_exports`, else None.
_EXPORTS: contextvars.ContextVar = contextvars.ContextVar("cle_exports", default=None)


@contextlib.contextmanager
def shared_exports():
    """Within the block, a model the converter reads through Keras' export (every model on
    the JAX backend, see :func:`cle._tflite.converter._from_model`) is exported once for each
    batch and set of weights, and every conversion of it reads that SavedModel
    (``from_saved_model``) instead of exporting it again. ``cle.quantize`` converts the same model several times (the plain
    conversion on each part of the data), and the export (tracing the model and writing the
    SavedModel) takes most of a conversion's time on that route. The exports are deleted
    when the outermost block ends; a nested block uses the outer one's."""
    if _EXPORTS.get() is not None:
        yield
        return
    exports = {}
    token = _EXPORTS.set(exports)
    try:
        yield
    finally:
        _EXPORTS.reset(token)
        for _, path in exports.values():
            shutil.rmtree(path, ignore_errors=True)


def _exported(exports, model, batch, shapes=None) -> str:
    """The SavedModel directory of ``model`` (with its batch fixed at ``batch``, None: free;
    its other dimensions at ``shapes`` when given) as ``from_keras_model`` writes it for a
    Functional or Sequential model: one endpoint, the model called in inference mode on its
    inputs' specs; exported on first use."""
    import tensorflow as tf

    key = (id(model), batch, shapes, backend.weights_digest(model))
    if key not in exports:
        read = model if batch is None else with_batch(model, batch, shapes)
        spec = tf.nest.map_structure(
            lambda t: tf.TensorSpec(t.shape, dtype=t.dtype, name=t.name), read.inputs)
        if isinstance(spec, list) and len(spec) > 1:
            spec = [spec]
        path = tempfile.mkdtemp(prefix="cle_export_")
        # as the converter's own export is quiet (JAX's deprecation warnings); an export that
        # fails leaves no directory behind (a model the export refuses, an interrupt)
        with _removed_on_error(path), quiet(), _jax_forms():
            archive = keras.export.ExportArchive()
            archive.track(read)
            # Static on JAX: jax2tf traces the call with the weights as constants. Keras'
            # default there passes every non-trainable weight in as a variable and assigns
            # it back after each call, and the converter keeps a variable it sees assigned:
            # batch-norm statistics, cle.layers.ClippedReLU's caps, and every weight of a
            # layer set trainable=False (a frozen backbone) stayed VAR_HANDLE/READ_VARIABLE
            # in the file, a frozen convolution's kernel an activation LiteRT refused
            # (tests/test_quantize.py). Inference updates no state, so nothing is lost.
            static = {"is_static": True} if keras.backend.backend() == "jax" else {}
            archive.add_endpoint("serve", functools.partial(read.__call__, training=False),
                                 spec, **static)
            archive.write_out(path, verbose=False)
        exports[key] = (model, path)  # the model kept alive: its id stays its own
    return exports[key][1]


@contextlib.contextmanager
def _removed_on_error(path):
    """Within the block, the directory ``path`` is removed if the block raises."""
    try:
        yield
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise


@contextlib.contextmanager
def _jax_forms():
    """Within the block, the forms the JAX export writes instead of the ones TF Lite cannot
    read (:data:`TANH_GELU`, :data:`DFT_STFT`, :data:`PIXEL_RESIZE`, :data:`PIXEL_MATMUL`,
    :data:`LAST_AXIS_SOFTMAX`); elsewhere, nothing."""
    with contextlib.ExitStack() as stack:
        for on, form in ((TANH_GELU, internals_keras.tanh_gelu_on_jax),
                         (DFT_STFT, internals_keras.dft_stft_on_jax),
                         (PIXEL_RESIZE, internals_keras.pixel_resize_on_jax),
                         (PIXEL_MATMUL, internals_keras.pixel_matmul_on_jax),
                         (LAST_AXIS_SOFTMAX, internals_keras.last_axis_softmax_on_jax)):
            if on:
                stack.enter_context(form())
        yield


@contextlib.contextmanager
def quiet():
    """Silence the TF Lite converter: Python warnings and prints, TF's Python loggers, and the
    C++ logs it writes to file descriptors 1 and 2. If the block raises, what was captured is
    written to ``sys.stderr`` before the exception propagates, so diagnostics are not lost.

    File descriptors are process-wide: output of other threads during the block is captured
    too.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    loggers = [logging.getLogger(n) for n in ("tensorflow", "absl")]
    levels = [lg.level for lg in loggers]
    log = tempfile.TemporaryFile()
    saved = []
    try:
        for fd in (1, 2):
            with contextlib.suppress(OSError):
                saved.append((fd, os.dup(fd)))
                os.dup2(log.fileno(), fd)
    except Exception:  # pragma: no cover - restore whatever was redirected
        for fd, dup in saved:
            os.dup2(dup, fd)
            os.close(dup)
        log.close()
        raise
    py_out = io.StringIO()
    failed = False
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(py_out), \
                contextlib.redirect_stderr(py_out):
            warnings.simplefilter("ignore")
            for lg in loggers:
                lg.setLevel(logging.ERROR)
            yield
    except BaseException:
        failed = True
        raise
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        for fd, dup in saved:
            os.dup2(dup, fd)
            os.close(dup)
        if failed:
            log.seek(0)
            text = py_out.getvalue() + log.read().decode("utf-8", "replace")
            if text.strip():
                sys.stderr.write("--- TF Lite converter output ---\n" + text[-20000:] + "\n")
        log.close()


def read_exported(model, inner, shapes=None):
    """TF Lite's converter reading ``model`` through Keras' export: the SavedModel shared
    within :func:`shared_exports` (when the batch is fixed, or ``inner``: the model has a
    traced function of its own), on a backend other than TensorFlow one of its own outside
    that block (:func:`_exported`'s static export, deleted with the converter), else
    ``from_keras_model``; ``shapes``: :func:`export_shapes`."""
    import tensorflow as tf

    batch = export_batch()
    exports = _EXPORTS.get()
    own = exports is None and keras.backend.backend() != "tensorflow"
    if own:  # this backend's export is always ours (see _exported); the converter reads
        exports = {}  # the directory when it converts, so it goes with the converter
    if exports is not None and (batch is not None or inner):
        path = _exported(exports, model, batch, shapes)
        with quiet():
            converter = tf.lite.TFLiteConverter.from_saved_model(path, signature_keys=[SERVING])
        if own:
            weakref.finalize(converter, shutil.rmtree, path, True)
        internals.record_keras_source(converter)
        return converter
    return tf.lite.TFLiteConverter.from_keras_model(
        model if batch is None else with_batch(model, batch, shapes))


def traced_batch() -> int | None:
    """The batch a model traced on TensorFlow is given (:func:`static_batch`; None: free)."""
    return _STATIC_BATCH.get()


def fixed_sizes(model, x) -> str | None:
    """The sentence naming the inputs :func:`export_shapes` fixes at the data's size, each as
    ``'name' (h, w, c)`` (what ``cle.quantize``'s report and ``convert_to_tflite_int8``'s
    warning say); None when none is."""
    shapes = export_shapes(model, x)
    fixed = [] if shapes is None else [
        f"'{name}' {shape}" for name, t, shape in zip(input_names(model), model.inputs, shapes)
        if _free(t)]
    return (f"the file's inputs {', '.join(fixed)} have the size of the data: Keras' export "
            f"on the {keras.backend.backend()} backend cannot write a size left free beyond "
            "the batch") if fixed else None
