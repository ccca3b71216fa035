"""Calibration data from files, the one reader every command uses: ``.npy`` (one array),
``.npz`` (one array per model input, named by the input; for one input also its one array or
one named ``x`` / ``inputs``), or a folder of images with a named preprocessing
(:data:`PREPROCESSING`), each checked against the model's inputs
(:func:`cle._core.inputs.check_calibration_data`) before any work is done; and the held-out
split of the check."""

from __future__ import annotations

import importlib
import os
from typing import Any, Callable

import numpy as np

from cle._core.inputs import (
    ModelInputs, check_calibration_data, format_shape, input_signature, input_signatures,
)

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


def input_range_of(preprocessing: str):
    """The input range a named preprocessing gives to 0..255 images, or None."""
    if preprocessing not in PREPROCESSING:
        return None
    fn = PREPROCESSING[preprocessing]
    corners = fn(np.array([[[[0.0, 0.0, 0.0]], [[255.0, 255.0, 255.0]]]], np.float32))
    return float(corners.min()), float(corners.max())


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
                     limit: int | None = None) -> ModelInputs:
    """Read calibration inputs for ``model`` from a file or a folder, checked.

    Args:
        path: a ``.npy`` file (one array, for a one-input model), a ``.npz`` file (one array
            per model input, named by the input; for one input also its one array, or the one
            named ``x`` or ``inputs``), or a folder of images (``IMAGE_SUFFIXES``, read in
            name order; one-input image models).
        model: the ``keras.Model`` the inputs are for (its input shapes are checked; images
            are resized and center-cropped to it).
        preprocessing: for a folder of images, one of ``tf``, ``torch``, ``caffe``, ``raw`` or
            ``module:function``; must be None for arrays (they are already preprocessed).
        limit: read at most this many images from a folder.

    Returns:
        :class:`cle._core.inputs.ModelInputs` (:func:`check_calibration_data`).

    Raises:
        ValueError: a missing or unreadable file, an unsupported kind of file, a folder without
            images or without ``preprocessing``, ``preprocessing`` given for an array file,
            arrays missing for some inputs, or data that does not match the model's inputs.
    """
    path = os.fspath(path)
    name = "the calibration data"
    if os.path.isdir(path):
        return _read_folder(path, model, preprocessing, limit, name)
    if not os.path.exists(path):
        raise ValueError(f"calibration data not found. Received: {path}")
    if preprocessing is not None:
        raise ValueError(
            "preprocessing applies to a folder of images; a .npy/.npz holds inputs already "
            f"preprocessed. Received: preprocessing={preprocessing!r} with {path}"
        )
    if not path.lower().endswith((".npy", ".npz")):
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
    names = [n for n, _ in input_signatures(model)]
    if isinstance(loaded, np.ndarray):
        if len(names) > 1:
            raise ValueError(
                f"{path} holds one array, but the model has {len(names)} inputs: save an .npz "
                f"with one array per input, np.savez(path, {', '.join(f'{n}=...' for n in names)})")
        return check_calibration_data(model, loaded, name)
    with loaded as archive:
        return check_calibration_data(model, _archive_inputs(archive, names, path), name)


def _archive_inputs(archive, names, path):
    """The arrays of an open ``.npz`` for the model inputs ``names`` (an array, or a dict)."""
    keys = list(archive.keys())
    if len(names) == 1:
        key = keys[0] if len(keys) == 1 else next(
            (k for k in (names[0], "x", "inputs") if k in keys), None)
        if key is None:
            raise ValueError(f"{path} holds {len(keys)} arrays; name the inputs '{names[0]}', "
                             f"'x' or 'inputs'. Received: arrays {keys}")
        return archive[key]
    missing = [n for n in names if n not in keys]
    if missing:
        raise ValueError(f"{path} must hold one array per model input, named {names}. "
                         f"Received: arrays {keys} (missing {missing})")
    return {n: archive[n] for n in names}


def _read_folder(path, model, preprocessing, limit, name):
    if preprocessing is None:
        raise ValueError(
            f"a folder of images needs a preprocessing (tf, torch, caffe, raw or "
            f"module:function). Received: folder {path} without one"
        )
    fn = preprocessing_function(preprocessing)
    if len(model.inputs) != 1:
        raise ValueError(f"a folder of images can calibrate a model with one input; save an "
                         f".npz with one array per input. Received: a model with "
                         f"{len(model.inputs)} inputs")
    shape, _ = input_signature(model)
    if len(shape) != 3 or shape[-1] != 3 or None in shape[:2]:
        raise ValueError(
            "a folder of images can calibrate a model whose input is (N, height, width, 3) "
            f"with a fixed size. Received: model input {format_shape(shape)}"
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


def split_holdout(x, fraction: float) -> tuple[Any, Any]:
    """``(calibration, held_out)``: the last ``fraction`` of ``x`` (an array or
    :class:`ModelInputs`) held out for checking (none when fewer than 8 samples would be left
    to calibrate on, or ``fraction`` is 0)."""
    n_hold = int(round(len(x) * float(fraction)))
    if n_hold < 1 or len(x) - n_hold < 8:
        return x, None
    return x[: len(x) - n_hold], x[len(x) - n_hold:]
