"""What TF Lite's converter can write: said before any work, not as the converter's error
after it (a raw MLIR dump), with the way around it."""

from __future__ import annotations

import re

import keras
import numpy as np

from cle._core.semantics import activation_name

__all__ = ["check_convertible", "check_tflite_backend", "converter_refusal", "exact_gelus",
           "tanh_gelu_note", "unconvertible_layers", "unconvertible_operations"]

_NO_BITWISE = ("on the TensorFlow backend Keras computes it on floats with a BitwiseAnd (so "
               "that -0 ranks below +0), which TF Lite's builtin ops do not have")
_XLA_CALL = ("the JAX export keeps it as an XLA call, which TF Lite's converter cannot read")
#: Keras operations (``keras.ops``, not layers) TF Lite's converter cannot write in builtin
#: INT8 ops, by backend and class, each with why; measured on the converter this package pins
#: (tests/test_unconvertible.py fails when a newer one writes any of them).
UNCONVERTIBLE_OPERATIONS = {
    "tensorflow": {"Argmax": _NO_BITWISE, "Argmin": _NO_BITWISE,
                   "Erf": "TF Lite has no builtin erf"},
    "jax": {"TopK": _XLA_CALL, "Sort": _XLA_CALL, "Erf": _XLA_CALL,
            "Norm": "the JAX export of it fails, and TF Lite's converter with it"},
}
_WAY_AROUND = {"Argmax": "end the model before it and take the argmax of the .tflite's output",
               "Argmin": "end the model before it and take the argmin of the .tflite's output",
               "Erf": "use keras.activations.gelu, which TF Lite has, or a tanh approximation"}


#: Preprocessing layers that look values up in a table (a hash table on every backend).
_LOOKUPS = (keras.layers.IntegerLookup, keras.layers.StringLookup, keras.layers.TextVectorization)


def check_tflite_backend(what):
    """TF Lite's converter reads a Keras model through Keras' SavedModel export, which the
    PyTorch backend does not provide (``ExportArchive.track`` is not implemented there, and the
    converter's fallback fails with an AttributeError about ``_get_save_spec``). Say so up front,
    with the way around it."""
    backend = keras.backend.backend()
    if backend == "torch":
        raise RuntimeError(
            f"{what} needs the TensorFlow or JAX Keras backend: TF Lite's converter cannot read "
            "a model of the PyTorch backend (it goes through Keras' ExportArchive.track, which "
            "the PyTorch backend does not implement). Save the "
            "model (model.save('m.keras')) and convert it in a process started with "
            "KERAS_BACKEND=tensorflow (cle.load_model('m.keras')). "
            f"Received: KERAS_BACKEND={backend}"
        )


def unconvertible_layers(model) -> list[str]:
    """The layers of ``model`` (nested ones included) that TF Lite's converter cannot turn into
    builtin INT8 ops on this backend, each as ``"'name' (Class): why"``: recurrent layers
    that are not unrolled (on the TensorFlow backend their loop becomes TensorList ops, which
    the converter refuses; on JAX, since the export holds the weights as constants, the
    calibration dies on it), 3-D pooling (no builtin op),
    lookup tables (``IntegerLookup``, ``StringLookup``, ``TextVectorization``), and
    layers that compute in float16 or bfloat16 (a mixed-precision policy) or in float64 (one
    entry for each such type), and the operations of :func:`unconvertible_operations`.
    Measured in tests/test_unconvertible.py on the converter this package pins."""
    from cle._core.keras_internals import sublayers

    tensorflow = keras.backend.backend() == "tensorflow"
    found = []
    for layer in [model, *sublayers(model)]:
        kind = type(layer).__name__
        if isinstance(layer, keras.layers.RNN) and not layer.unroll:
            why = ("a recurrent layer that is not unrolled becomes a loop TF Lite's builtin "
                   "INT8 ops cannot hold (on TensorFlow TensorList ops the converter refuses, "
                   "on JAX a loop its calibration dies on); build it with unroll=True (a fixed "
                   "sequence length) and set its weights")
        elif isinstance(layer, (keras.layers.MaxPooling3D, keras.layers.AveragePooling3D)):
            why = "TF Lite has no builtin 3-D pooling op"
        elif not tensorflow and _odd_same_transpose(layer):
            why = ("a transposed convolution of padding 'same' whose kernel is its stride + 1, "
                   "which TF Lite's converter writes wrong from the JAX export (its float file "
                   "is 2 larger, its INT8 kernel refuses it); convert on the TensorFlow backend "
                   "(KERAS_BACKEND=tensorflow), or make the kernel the stride or stride + 2")
        elif getattr(layer, "data_format", None) == "channels_first" and (
                isinstance(layer, _CONV_1D) if tensorflow else isinstance(layer, _POOL_1D)):
            why = ("a channels_first 1-D convolution, which TF Lite's converter cannot write "
                   "from the TensorFlow backend's graph (a transpose of a 3-D tensor given a "
                   "4-D permutation); build it channels_last (a Permute((2, 1)) before it)"
                   if tensorflow else
                   f"a channels_first 1-D pooling, which TF Lite's converter cannot write from "
                   f"the {keras.backend.backend()} backend's export; build it channels_last (a "
                   "Permute((2, 1)) before it), or convert on the TensorFlow backend")
        elif tensorflow and (why := _tensorflow_only(layer)):
            pass
        elif isinstance(layer, _LOOKUPS):
            why = ("a lookup table, which TF Lite's builtin INT8 ops do not have; map the "
                   "values to indices before the model and feed those")
        elif whys := _traced_refusals(layer):
            why = "; ".join(whys)
        else:
            continue
        found.append(f"'{layer.name}' ({kind}): {why}")
    computed = set()
    for dtype in ("float16", "bfloat16", "float64"):
        other = [layer for layer in sublayers(model)
                 if not isinstance(layer, keras.layers.InputLayer)
                 and getattr(getattr(layer, "dtype_policy", None), "compute_dtype", "float32")
                 == dtype]
        if not other:
            continue
        computed.add(dtype)
        policy = other[0].dtype_policy.name
        found.append(f"{_named(other)}: compute in {dtype} (dtype policy '{policy}'), which "
                     "TF Lite's converter cannot write in builtin INT8 ops; build the model "
                     "again under the float32 policy (keras.config.set_dtype_policy('float32')), "
                     "set its weights, and quantize that")
    found += _unfed_inputs(model, computed)
    quantized = [layer for layer in sublayers(model)
                 if getattr(layer, "quantization_mode", None)]
    if quantized:
        mode = quantized[0].quantization_mode
        found.append(f"{_named(quantized)}: quantized by Keras (model.quantize('{mode}'), "
                     f"dtype policy '{quantized[0].dtype_policy.name}'), whose {mode} kernels "
                     "TF Lite's converter cannot read; give cle the float model as it was "
                     "before model.quantize")
    return found + unconvertible_operations(model)


def _odd_same_transpose(layer) -> bool:
    """A ``Conv1DTranspose``/``Conv2DTranspose`` of padding "same" with an axis whose kernel
    is its stride + 1, stride 2 or more (measured on kernels 2 to 5, strides 1 to 3: (3, 2)
    and (4, 3) failed, every other pair converted; helper-43's JAX sweep)."""
    if not isinstance(layer, (keras.layers.Conv1DTranspose, keras.layers.Conv2DTranspose)) \
            or layer.padding != "same":
        return False
    return any(s > 1 and k == s + 1 for k, s in zip(np.atleast_1d(layer.kernel_size),
                                                     np.atleast_1d(layer.strides)))


def _named(layers) -> str:
    """``"'a', 'b', 'c', ... (n layers)"``: the first three of ``layers`` and how many."""
    return (", ".join(f"'{layer.name}'" for layer in layers[:3])
            + (", ..." if len(layers) > 3 else "")
            + f" ({len(layers)} layer{'s' if len(layers) > 1 else ''})")


def _tensorflow_only(layer) -> str | None:
    """Why TF Lite's converter cannot write ``layer`` from the TensorFlow backend's graph (it
    can from JAX's export), or None: the TensorFlow op it stopped on named only that op
    (helper-20's hunt)."""
    interpolation = getattr(layer, "interpolation", None)
    if isinstance(layer, (keras.layers.Resizing, keras.layers.UpSampling2D)) and \
            interpolation not in (None, "nearest", "bilinear"):
        return (f"a resize with interpolation='{interpolation}', which TF Lite has no "
                "builtin for (it has 'nearest' and 'bilinear'); resize with one of those")
    if isinstance(layer, (keras.layers.Conv1DTranspose, keras.layers.Conv2DTranspose,
                          keras.layers.Conv3DTranspose)) and any(
            d != 1 for d in np.atleast_1d(layer.dilation_rate)):
        return ("a dilated transposed convolution (Conv2DBackpropInput), which TF Lite has no "
                "builtin for; use dilation_rate=1, or an UpSampling and a dilated convolution")
    if isinstance(layer, keras.layers.CategoryEncoding) and \
            layer.output_mode in ("multi_hot", "count"):  # one_hot is a ONE_HOT builtin
        return ("a bincount of category indices (DenseBincount), which TF Lite has no builtin "
                "for; encode the categories before the model and feed the encoding")
    return None


#: 1-D layers TF Lite's converter cannot write channels_first (measured: on TensorFlow the
#: convolutions, "'tf.Transpose' op x should be of the same rank with y, got x of rank 3, and
#: y of rank 4"; on JAX the poolings, an empty RuntimeError; helper-20's hunt).
_CONV_1D = (keras.layers.Conv1D, keras.layers.Conv1DTranspose, keras.layers.SeparableConv1D,
            keras.layers.DepthwiseConv1D)
_POOL_1D = (keras.layers.MaxPooling1D, keras.layers.AveragePooling1D)


def _unfed_inputs(model, computed=frozenset()) -> list[str]:
    """The inputs of ``model`` the converter's calibration cannot feed, each as an entry of
    :func:`unconvertible_layers`: a float input that is not float32 (float16, bfloat16,
    float64) or a bool one. The calibration and the check feed float32 (or the integers of an
    integer input), and TF Lite's calibrator refused them with "Cannot set tensor: Got value
    of type FLOAT32 but expected type FLOAT16" (helper-20's hunt; the plain converter too).
    A dtype in ``computed`` (layers computing in it were named already) is not said again."""
    from cle._core.inputs import input_names

    found = []
    for name, t in zip(input_names(model), model.inputs):
        dtype = keras.backend.standardize_dtype(t.dtype)
        if dtype == "bool":
            found.append(f"input '{name}' (bool): the calibration feeds numbers; take a mask as "
                         "float32 0/1 (or int32) and compare it inside the model")
        elif "float" in dtype and dtype != "float32" and dtype not in computed:
            found.append(f"input '{name}' ({dtype}): the calibration feeds float32; build the "
                         "Input as float32 (a cast inside the model converts as a cast)")
    return found


def _functions(model) -> list:
    """``model`` and every Functional model or Sequential model it holds."""
    from cle._core.keras_internals import is_functional, sublayers

    return [f for f in [model, *sublayers(model)] if is_functional(f)]


def _traced_refusals(layer) -> list[str]:
    """What :data:`UNCONVERTIBLE_OPERATIONS` says of the operations inside a ``Lambda``'s
    function or a Python-function activation, which no graph shows (:func:`_traced`)."""
    table = UNCONVERTIBLE_OPERATIONS.get(keras.backend.backend(), {})
    if not table:
        return []
    return [f"its function computes keras.ops.{_snake(kind)}: {table[kind]}; "
            + _WAY_AROUND.get(kind, "compute it outside the model")
            for kind in dict.fromkeys(type(op).__name__ for op in _traced(layer)
                                      if _refused(op, table))]


def _traced(layer) -> list:
    """The operations of a ``Lambda``'s function or a Python-function activation: the
    function traced on symbolic inputs of the shapes the layer is called on (nothing when it
    cannot be traced, or for any other layer)."""
    from cle._core.keras_internals import inbound_nodes

    if isinstance(layer, keras.layers.Lambda):
        fn, kwargs = layer.function, dict(layer.arguments or {})
    elif isinstance(layer, keras.layers.Activation) and getattr(
            keras.activations, activation_name(layer.activation), None) is not layer.activation:
        fn, kwargs = layer.activation, {}
    else:
        return []
    nodes = inbound_nodes(layer)
    if not nodes or len(nodes[0].input_tensors) != 1:
        return []
    spec = nodes[0].input_tensors[0]
    try:
        inp = keras.Input(batch_shape=tuple(spec.shape), dtype=spec.dtype)
        return keras.Model(inp, fn(inp, **kwargs)).operations
    except Exception:  # noqa: BLE001 - a function that cannot be traced: the converter says
        return []


def _refused(op, table) -> bool:
    """Whether ``table`` (:data:`UNCONVERTIBLE_OPERATIONS` of this backend) refuses the plain
    operation ``op`` (not a layer): its class is listed."""
    return not isinstance(op, keras.layers.Layer) and type(op).__name__ in table


def _exact_gelu(op) -> bool:
    return type(op).__name__ == "Gelu" and not getattr(op, "approximate", True)


def exact_gelus(model) -> list[str]:
    """The names of ``model``'s layers and plain operations (nested ones included) that
    compute an exact GELU (Keras' default: ``Activation("gelu")``, ``activation="gelu"``,
    ``keras.activations.gelu``, ``keras.ops.gelu(x, approximate=False)``, also inside a
    ``Lambda`` or a Python-function activation)."""
    from cle._core.keras_internals import sublayers

    found = [layer.name for layer in sublayers(model)
             if activation_name(getattr(layer, "activation", None)) == "gelu"
             or any(_exact_gelu(op) for op in _traced(layer))]
    return found + [op.name for function in _functions(model) for op in function.operations
                    if _exact_gelu(op)]


def tanh_gelu_note(model) -> str | None:
    """What the report says on JAX of a model with exact GELUs (:func:`exact_gelus`): the
    file holds their tanh form (:data:`cle._tflite.export.TANH_GELU`); else None."""
    if keras.backend.backend() != "jax" or not (names := exact_gelus(model)):
        return None
    return (f"exact GELU ({', '.join(names[:5])}{', ...' if len(names) > 5 else ''}) is written "
            "in its tanh form, gelu(approximate=True), which differs from it by under 5e-4: "
            "JAX's export of the exact form (its erf as a polynomial of selects) made TF Lite's "
            "runtime abort on the INT8 file; the check compares the file with the exact model")


def unconvertible_operations(model) -> list[str]:
    """The plain operations of ``model`` (``keras.ops`` calls on its tensors, nested models
    included) that TF Lite's converter cannot write on this backend
    (:data:`UNCONVERTIBLE_OPERATIONS`), each as ``"'name' (keras.ops.kind): why; what to do"``.
    An argmax or argmin of integers is written as it is, and is not listed."""
    from cle._core.keras_internals import inbound_nodes

    table = UNCONVERTIBLE_OPERATIONS.get(keras.backend.backend(), {})
    found = []
    for function in _functions(model):
        for op in function.operations:
            kind = type(op).__name__
            if not _refused(op, table):
                continue
            if kind in ("Argmax", "Argmin") and keras.backend.backend() == "tensorflow":
                dtypes = [str(t.dtype) for node in inbound_nodes(op)
                          for t in node.input_tensors[:1]]
                if dtypes and not any("float" in d for d in dtypes):
                    continue
            way = _WAY_AROUND.get(kind, "compute it outside the model")
            found.append(f"'{op.name}' (keras.ops.{_snake(kind)}): {table[kind]}; {way}")
    return found


def _snake(kind: str) -> str:
    return {"TopK": "top_k"}.get(kind, kind.lower())


def converter_refusal(error: Exception, model, int16=False) -> ValueError | None:
    """The ``ValueError`` to raise for TF Lite converter's ``error`` on ``model`` when the
    cause is an operation outside what it writes (a TensorFlow op it has no builtin for, or
    a StableHLO op of a JAX export it does not read): those named. Any other error whose
    text holds the converter's own diagnostics (MLIR's ``file:line:col: error: ...`` lines,
    each followed by a trace of Python frames and a caret that were the last line a user
    saw): those errors, in one line (hunt17's MLP-Mixer: an ``EinsumDense`` whose bias is
    on the token axis, which the TensorFlow backend's converter cannot transpose); None when
    there are none. For what :func:`unconvertible_layers` does not know yet: said in one line,
    the converter's own output already written to stderr. ``int16``: the error is of TF Lite's
    16x8 mode, and the message says so and names ``activation_bits=8``, whose INT8 conversion
    writes some models that mode cannot."""
    text = str(error)
    tf_ops = set(re.findall(r"'tf\.(\w+)' op is neither a custom op nor a flex op", text))
    hlo_ops = set(re.findall(r"'vhlo\.(\w+?)(?:_v\d+)?' op is not part of the vhlo", text))
    if not tf_ops and not hlo_ops:
        said = list(dict.fromkeys(m.strip() for m in re.findall(r":\d+: error: (.+)", text)))
        if not said:
            return None
        mode = " in its 16x8 mode" if int16 else ""
        other = (" (or activation_bits=8: the INT8 conversion writes some models the 16x8 "
                 "mode cannot)") if int16 else ""
        return ValueError(
            f"TF Lite's converter failed{mode} on model '{model.name}' and said: "
            + "; ".join(said[:3]) + (f" (and {len(said) - 3} more)" if len(said) > 3 else "")
            + ". Most often that is the converter's own limit on a layer of the model as "
            "written (its error, chained to this one, holds its whole trace; the command line "
            "shows it with CLE_DEBUG=1): another form of that layer's computation may "
            f"convert{other}. Received: "
            f"model '{model.name}' on the {keras.backend.backend()} backend")
    parts = []
    if tf_ops - {"XlaCallModule"}:
        parts.append("TensorFlow ops " + ", ".join(sorted(tf_ops - {"XlaCallModule"})))
    if hlo_ops:
        parts.append("StableHLO ops of the JAX export " + ", ".join(sorted(hlo_ops)))
    elif "XlaCallModule" in tf_ops:
        parts.append("an XLA call the JAX export kept (an operation it could not write as "
                     "TensorFlow ops)")
    return ValueError(
        f"TF Lite's converter cannot write model '{model.name}' in builtin INT8 ops: it needs "
        f"{' and '.join(parts)}, which it has no builtin for (its output above says where). "
        "Compute the operation that makes them outside the model, or replace it with one TF "
        f"Lite has. Received: model '{model.name}' on the {keras.backend.backend()} backend")


def check_convertible(model, what):
    """:func:`check_tflite_backend`, then a ``ValueError`` naming every layer and operation of
    :func:`unconvertible_layers`: said before any work, not as the converter's error after
    it."""
    check_tflite_backend(what)
    found = unconvertible_layers(model)
    if found:
        raise ValueError(
            f"{what} needs TF Lite's converter, which cannot write model '{model.name}' in "
            "builtin INT8 ops: " + "; ".join(found)
            + f". Received: model '{model.name}' on the {keras.backend.backend()} backend")
