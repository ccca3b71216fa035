"""What TF Lite's converter can write: said before any work, not as the converter's error
after it (a raw MLIR dump), with the way around it."""

from __future__ import annotations

import keras

__all__ = ["check_convertible", "check_tflite_backend", "unconvertible_layers"]


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
    the converter refuses), every recurrent layer on the other backends (their export holds
    uint32 tensors the converter refuses, unrolled or not), 3-D pooling (no builtin op), and
    layers that compute in float16 or bfloat16 (a mixed-precision policy: one entry for
    them all). Measured in tests/test_unconvertible.py on the converter this package pins."""
    from cle._core.keras_internals import sublayers

    tensorflow = keras.backend.backend() == "tensorflow"
    found = []
    for layer in [model, *sublayers(model)]:
        kind = type(layer).__name__
        if isinstance(layer, keras.layers.RNN) and (not tensorflow or not layer.unroll):
            why = ("a recurrent layer that is not unrolled becomes a TensorList loop, which "
                   "TF Lite's builtin INT8 ops cannot hold; build it with unroll=True (a fixed "
                   "sequence length) and set its weights" if tensorflow else
                   f"the {keras.backend.backend()} backend's export of a recurrent layer holds "
                   "uint32 tensors TF Lite's converter refuses; convert on the TensorFlow "
                   "backend (KERAS_BACKEND=tensorflow) with unroll=True")
        elif isinstance(layer, (keras.layers.MaxPooling3D, keras.layers.AveragePooling3D)):
            why = "TF Lite has no builtin 3-D pooling op"
        else:
            continue
        found.append(f"'{layer.name}' ({kind}): {why}")
    low = [layer for layer in sublayers(model)
           if not isinstance(layer, keras.layers.InputLayer)
           and getattr(getattr(layer, "dtype_policy", None), "compute_dtype", "float32")
           in ("float16", "bfloat16")]
    if low:
        names = ", ".join(f"'{layer.name}'" for layer in low[:3]) + (", ..." if len(low) > 3
                                                                      else "")
        policy = low[0].dtype_policy.name
        found.append(f"{names} ({len(low)} layer{'s' if len(low) > 1 else ''}): compute in "
                     f"{low[0].dtype_policy.compute_dtype} (dtype policy '{policy}'), which TF "
                     "Lite's converter cannot write; build the model again under the float32 "
                     "policy (keras.config.set_dtype_policy('float32')), set its weights, and "
                     "quantize that")
    return found


def check_convertible(model, what):
    """:func:`check_tflite_backend`, then a ``ValueError`` naming every layer of
    :func:`unconvertible_layers`: said before any work, not as the converter's error after
    it."""
    check_tflite_backend(what)
    found = unconvertible_layers(model)
    if found:
        raise ValueError(
            f"{what} needs TF Lite's converter, which cannot write model '{model.name}' in "
            "builtin INT8 ops: " + "; ".join(found)
            + f". Received: {len(found)} such layer{'s' if len(found) > 1 else ''} on the "
            f"{keras.backend.backend()} backend")
