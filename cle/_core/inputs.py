"""Model inputs given to a public function, checked against the model before any work is
done: a wrong shape, channel count, dtype, a missing batch dimension or a non-finite value
is one ``ValueError`` that names what the model expects and what it got.

Accepted forms: a numpy (or backend) array ``(N, *input_shape)``; an iterable of such batches
(or of ``(x, y)`` / ``(x,)`` tuples, as Keras' ``fit`` takes them); a ``tf.data.Dataset``,
batched or not."""

from __future__ import annotations

import os

import numpy as np


def input_signature(model) -> tuple[tuple, str]:
    """``(sample shape with None for free sizes, dtype name)`` of a one-input model."""
    if len(model.inputs) != 1:
        raise ValueError(
            "Calibration data is supported for models with one input. Received: model "
            f"'{model.name}' with {len(model.inputs)} inputs"
        )
    tensor = model.inputs[0]
    shape = tuple(None if d is None or (isinstance(d, int) and d < 0) else int(d)
                  for d in tensor.shape[1:])
    return shape, str(getattr(tensor, "dtype", "float32"))


def format_shape(shape, batch="N"):
    dims = [batch] + ["?" if d is None else str(d) for d in shape]
    return "(" + ", ".join(dims) + ")"


def _is_dataset(obj) -> bool:
    return type(obj).__module__.startswith("tensorflow") and hasattr(obj, "element_spec")


def _as_numpy(item, name):
    if isinstance(item, (tuple, list)) and item and not np.isscalar(item[0]):
        item = item[0]  # (x, y) or (x,) as Keras' fit takes them
    if isinstance(item, dict):
        raise ValueError(
            f"`{name}` must hold arrays of model inputs, not dicts. Received: a dict with keys "
            f"{sorted(item)}"
        )
    try:
        import keras

        return np.asarray(keras.ops.convert_to_numpy(item))
    except Exception:  # noqa: BLE001 - anything numpy can read
        return np.asarray(item)


def _batches(data, name):
    """The data as a list of numpy arrays (batches, or samples for an unbatched dataset)."""
    if isinstance(data, (str, bytes, os.PathLike)):
        raise ValueError(
            f"`{name}` must be an array, an iterable of batches or a tf.data.Dataset; to read a "
            f"file use cle.load_calibration(path, model). Received: {name}={data!r}"
        )
    if isinstance(data, np.ndarray) or (
        hasattr(data, "shape") and hasattr(data, "dtype") and not _is_dataset(data)
    ):
        return [_as_numpy(data, name)]
    if _is_dataset(data):
        return [_as_numpy(item, name) for item in data.as_numpy_iterator()]
    try:
        iterator = iter(data)
    except TypeError:
        raise ValueError(
            f"`{name}` must be an array, an iterable of batches or a tf.data.Dataset. "
            f"Received: {name} of type {type(data).__name__}"
        ) from None
    return [_as_numpy(item, name) for item in iterator]


def check_calibration_data(model, data, name: str = "calibration_data",
                           min_samples: int = 1) -> np.ndarray:
    """``data`` as one float32 array ``(N, *input_shape)``, checked against ``model``'s input.

    Args:
        model: a ``keras.Model`` with one input.
        data: an array ``(N, *input_shape)``, an iterable of such batches (or of ``(x, y)``
            tuples), or a ``tf.data.Dataset`` (batched, or of single samples).
        name: the argument's name in messages.
        min_samples: the fewest samples accepted.

    Returns:
        A float32 numpy array holding every sample.

    Raises:
        ValueError: one line naming what the model expects and what was received: no
            samples, fewer than ``min_samples``, a missing batch dimension, a wrong rank, size
            or channel count, a non-numeric or integer dtype (inputs must be preprocessed
            floats), or non-finite values.

    Example:
        >>> x = check_calibration_data(model, np.zeros((8, 224, 224, 3), np.float32))
    """
    shape, _ = input_signature(model)
    expected = format_shape(shape)
    parts = _batches(data, name)
    name = name if " " in name else f"`{name}`"
    checked = []
    for k, part in enumerate(parts):
        where = "" if len(parts) == 1 else f" (batch {k})"
        if part.dtype.kind not in "fiu" or part.dtype == np.bool_:
            raise ValueError(
                f"{name} must be numeric model inputs of shape {expected}. Received: "
                f"dtype {part.dtype}{where}"
            )
        if part.dtype.kind in "iu":
            raise ValueError(
                f"{name} must be float model inputs, already preprocessed as the model expects "
                f"(shape {expected}); integers look like raw images (for a folder of images, "
                f"name a preprocessing). Received: dtype {part.dtype}{where}"
            )
        if part.ndim == len(shape) and _fits(part.shape, shape):
            if _is_dataset(data):  # an unbatched dataset yields single samples
                part = part[None]
            else:
                raise ValueError(
                    f"{name} needs a batch dimension: the model expects {expected}. Received: "
                    f"one sample of shape {part.shape}{where}; add one with x[None]"
                )
        if part.ndim != len(shape) + 1:
            raise ValueError(
                f"{name} must be a batch of model inputs of shape {expected}. Received: "
                f"shape {part.shape}{where}"
            )
        if not _fits(part.shape[1:], shape):
            what = "channel count" if (
                shape[-1] is not None and part.shape[-1] != shape[-1]
                and _fits(part.shape[1:-1], shape[:-1])
            ) else "shape"
            raise ValueError(
                f"{name} has the wrong {what}: the model expects {expected}. Received: shape "
                f"{part.shape}{where}"
            )
        checked.append(part)
    x = np.concatenate(checked, axis=0).astype(np.float32, copy=False) if checked else None
    if x is None or len(x) == 0:
        raise ValueError(f"{name} must hold at least {max(1, min_samples)} sample(s) of shape "
                         f"{expected}. Received: none")
    if len(x) < min_samples:
        raise ValueError(f"{name} must hold at least {min_samples} samples of shape {expected}. "
                         f"Received: {len(x)}")
    bad = ~np.isfinite(x)
    if bad.any():
        raise ValueError(
            f"{name} must be finite. Received: {int(bad.sum())} NaN or infinite values in "
            f"{int(bad.reshape(len(x), -1).any(axis=1).sum())} of {len(x)} samples"
        )
    return x


def _fits(got, want) -> bool:
    return len(got) == len(want) and all(w is None or g == w for g, w in zip(got, want))
