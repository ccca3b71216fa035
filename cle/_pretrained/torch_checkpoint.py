"""Torch checkpoints read with numpy alone: the legacy (non-zip) ``torch.save`` pickle
(:func:`load_torch_legacy_checkpoint`, re-exported by :mod:`cle.pretrained`) and a state dict
written into a Keras model's weighted layers (:func:`load_state_dict`)."""

from __future__ import annotations

import collections
import os
import pickle
import struct
from typing import Any, BinaryIO

import keras
import numpy as np

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


def load_state_dict(model: keras.Model, state: dict[str, np.ndarray],
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
