"""Calibration data: read it, check it against the model's input, before any work is done.

Every entry point that takes model inputs (``cle.quantize``, ``equalize_model`` with
``bias_correction="empirical"`` or ``activation_ranges="calibration"``, ``cle quantize
--calibration``) goes through :func:`check_calibration_data`, so a wrong shape, channel count,
dtype, a missing batch dimension or a non-finite value is one ``ValueError`` that names what the
model expects and what it got, raised before the model is transformed.

Accepted forms: a numpy (or backend) array ``(N, *input_shape)``; an iterable of such batches
(or of ``(x, y)`` / ``(x,)`` tuples, as Keras' ``fit`` takes them); a ``tf.data.Dataset``,
batched or not. Files (:func:`load_calibration`): ``.npy``, ``.npz`` (one array, or one named
``x`` / ``inputs``), or a folder of images with a named preprocessing (:data:`PREPROCESSING`).
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Callable

import numpy as np

#: Image file endings :func:`load_calibration` reads from a folder.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")

_TORCH_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
_TORCH_STD = np.array([0.229, 0.224, 0.225], np.float32)
_CAFFE_MEAN_BGR = np.array([103.939, 116.779, 123.68], np.float32)


def _tf_mode(x):
    return x / np.float32(127.5) - np.float32(1.0)


def _torch_mode(x):
    return (x / np.float32(255.0) - _TORCH_MEAN) / _TORCH_STD


def _caffe_mode(x):
    return x[..., ::-1] - _CAFFE_MEAN_BGR


#: The keras.applications preprocessing conventions, on RGB images with values 0..255.
PREPROCESSING: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "tf": _tf_mode,  # [-1, 1] (MobileNet, MobileNetV2/V3 without the built-in rescaling, ...)
    "torch": _torch_mode,  # /255, minus ImageNet mean, divided by std (DenseNet, torchvision)
    "caffe": _caffe_mode,  # RGB -> BGR, minus the ImageNet BGR mean (ResNet50, VGG)
    "raw": lambda x: x,  # 0..255 floats (EfficientNet, ConvNeXt: they rescale inside)
}


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


def _fmt(shape, batch="N"):
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
    expected = _fmt(shape)
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


def preprocessing_function(name: str) -> Callable[[np.ndarray], np.ndarray]:
    """The function a preprocessing name stands for: one of :data:`PREPROCESSING` or
    ``"module:function"`` (imported; called on float32 RGB images ``(N, H, W, 3)``, 0..255).

    Raises:
        ValueError: an unknown name, or a ``module:function`` that cannot be imported.
    """
    if name in PREPROCESSING:
        return PREPROCESSING[name]
    if isinstance(name, str) and ":" in name:
        module, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(
                f"preprocessing '{name}' cannot be imported ({type(exc).__name__}: {exc}). "
                "Expected one of tf, torch, caffe, raw or module:function"
            ) from None
        if not callable(fn):
            raise ValueError(f"preprocessing '{name}' is not callable. Received: {fn!r}")
        return fn
    raise ValueError(
        "preprocessing must be one of tf ([-1, 1]), torch (ImageNet mean/std), caffe (BGR minus "
        f"mean), raw (0..255) or module:function. Received: {name!r}"
    )


def _read_image(path, size):
    """An RGB image resized so its shorter side is the larger of ``size``, then center-cropped
    to ``size`` (height, width), as float32 0..255."""
    from PIL import Image

    with Image.open(path) as img:
        img = img.convert("RGB")
        h, w = size
        scale = max(h / img.height, w / img.width)
        new = (max(w, round(img.width * scale)), max(h, round(img.height * scale)))
        img = img.resize(new, Image.Resampling.BILINEAR)
        left, top = (new[0] - w) // 2, (new[1] - h) // 2
        img = img.crop((left, top, left + w, top + h))
        return np.asarray(img, dtype=np.float32)


def load_calibration(path, model, preprocessing: str | None = None,
                     limit: int | None = None) -> np.ndarray:
    """Read calibration inputs for ``model`` from a file or a folder, checked.

    Args:
        path: a ``.npy`` file, a ``.npz`` file (its one array, or the one named ``x`` or
            ``inputs``), or a folder of images (``IMAGE_SUFFIXES``, read in name order).
        model: the ``keras.Model`` the inputs are for (its input shape is checked; images are
            resized and center-cropped to it).
        preprocessing: for a folder of images, one of ``tf``, ``torch``, ``caffe``, ``raw`` or
            ``module:function``; must be None for arrays (they are already preprocessed).
        limit: read at most this many images from a folder.

    Returns:
        A float32 array ``(N, *input_shape)`` (:func:`check_calibration_data`).

    Raises:
        ValueError: a missing or unreadable file, an unsupported kind of file, a folder without
            images or without ``preprocessing``, ``preprocessing`` given for an array file, or
            data that does not match the model's input.
    """
    path = os.fspath(path)
    name = "the calibration data"
    if os.path.isdir(path):
        if preprocessing is None:
            raise ValueError(
                f"a folder of images needs a preprocessing (tf, torch, caffe, raw or "
                f"module:function). Received: folder {path} without one"
            )
        fn = preprocessing_function(preprocessing)
        shape, _ = input_signature(model)
        if len(shape) != 3 or shape[-1] != 3 or None in shape[:2]:
            raise ValueError(
                "a folder of images can calibrate a model whose input is (N, height, width, 3) "
                f"with a fixed size. Received: model input {_fmt(shape)}"
            )
        files = sorted(f for f in os.listdir(path) if f.lower().endswith(IMAGE_SUFFIXES))
        if limit is not None:
            files = files[: int(limit)]
        if not files:
            raise ValueError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in folder {path}")
        images = []
        for f in files:
            try:
                images.append(_read_image(os.path.join(path, f), shape[:2]))
            except Exception as exc:  # noqa: BLE001 - PIL raises many kinds
                raise ValueError(f"cannot read image {os.path.join(path, f)}: "
                                 f"{type(exc).__name__}: {exc}") from None
        x = np.asarray(fn(np.stack(images)), dtype=np.float32)
        return check_calibration_data(model, x, name)
    if not os.path.exists(path):
        raise ValueError(f"calibration data not found. Received: {path}")
    if preprocessing is not None:
        raise ValueError(
            "preprocessing applies to a folder of images; a .npy/.npz holds inputs already "
            f"preprocessed. Received: preprocessing={preprocessing!r} with {path}"
        )
    lower = path.lower()
    if not lower.endswith((".npy", ".npz")):
        raise ValueError(
            f"calibration data must be a .npy or .npz file or a folder of images. Received: "
            f"{path}")
    try:
        loaded = load_arrays(path)
    except PickledObjects:
        raise ValueError(
            f"{path} holds Python objects (a pickled object array), which cle does not load "
            "since unpickling can run code; expected a plain numeric array: "
            "np.save(path, np.asarray(x, dtype='float32'))") from None
    except ValueError as exc:
        raise ValueError(f"cannot read {path}: expected a NumPy .npy/.npz file ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - corrupt files raise many kinds
        raise ValueError(f"cannot read {path}: {type(exc).__name__}: {exc}") from None
    if isinstance(loaded, np.ndarray):
        x = loaded
    else:  # an .npz archive
        with loaded as archive:
            keys = list(archive.keys())
            key = keys[0] if len(keys) == 1 else next(
                (k for k in ("x", "inputs") if k in keys), None)
            if key is None:
                raise ValueError(f"{path} holds {len(keys)} arrays; name the inputs 'x' or "
                                 f"'inputs'. Received: arrays {keys}")
            x = archive[key]
    return check_calibration_data(model, x, name)


class PickledObjects(ValueError):
    """A NumPy file holds pickled Python objects, which cle does not load: unpickling can run
    code."""


def load_arrays(path):
    """``np.load(path, allow_pickle=False)``: an array (``.npy``) or an open archive (``.npz``).

    Raises:
        PickledObjects: the file holds Python objects (an object array).
        ValueError: another file NumPy cannot read.
        OSError: the file cannot be opened.
    """
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as exc:
        if "allow_pickle" in str(exc) or "Object arrays" in str(exc):
            raise PickledObjects(str(exc)) from exc
        raise


def split_holdout(x: np.ndarray, fraction: float) -> tuple[np.ndarray, Any]:
    """``(calibration, held_out)``: the last ``fraction`` of ``x`` held out for checking (none
    when fewer than 8 samples would be left to calibrate on, or ``fraction`` is 0)."""
    n_hold = int(round(len(x) * float(fraction)))
    if n_hold < 1 or len(x) - n_hold < 8:
        return x, None
    return x[: len(x) - n_hold], x[len(x) - n_hold:]
