"""Model inputs given to a public function, checked once at its door: a wrong shape, channel
count, dtype, a missing batch dimension, a missing input or a non-finite value is one
``ValueError`` that names what the model expects and what it got. What comes out is a
:class:`ModelInputs` (one float32 array per model input), which every later stage takes as it
is: checking a :class:`ModelInputs` again costs nothing and copies nothing, so the data is
read once (a one-shot generator is not used up by the first check) and copied once.

Accepted forms, for a model with one input: a numpy (or backend) array ``(N, *input_shape)``;
an iterable of such batches (or of ``(x, y)`` / ``(x,)`` tuples, as Keras' ``fit`` takes
them); a ``tf.data.Dataset``, batched or not. For a model with several inputs, each batch is a
dict ``{input name: array}`` or a tuple/list with one array per input (in the order of
``model.inputs``), alone or as the ``x`` of an ``(x, y)`` pair."""

from __future__ import annotations

import dataclasses
import os

import numpy as np

__all__ = ["ModelInputs", "check_calibration_data", "format_shape", "input_dtypes",
           "input_names", "input_signature", "input_signatures", "integer_inputs"]


@dataclasses.dataclass(frozen=True, eq=False)
class ModelInputs:
    """Checked model inputs: one float32 array ``(N, *shape)`` per model input (an input that
    takes integers, e.g. token ids, keeps its integer dtype), in the order of
    ``model.inputs``, all with the same ``N``.

    Attributes:
        arrays: the arrays.
        names: the model's input names.
        shapes: the sample shapes they were checked against (None: any size).
    """

    arrays: tuple
    names: tuple
    shapes: tuple

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __getitem__(self, index) -> "ModelInputs":
        """The samples ``index`` (a slice or an index array) of every input."""
        return ModelInputs(tuple(a[index] for a in self.arrays), self.names, self.shapes)

    def feed(self, model=None):
        """What a Keras model (``model``, when given) is called with: the array for one
        input, a dict by name for a model built on a dict of inputs, else a list
        (:func:`cle._core.keras_internals.fed`)."""
        from cle._core.keras_internals import fed

        return fed(model, self.arrays)

    def as_dict(self) -> dict:
        return dict(zip(self.names, self.arrays))

    def fits(self, model) -> bool:
        """Whether these were checked against ``model``'s inputs."""
        names, shapes = zip(*input_signatures(model))
        return tuple(names) == self.names and tuple(shapes) == self.shapes


def _free(d):
    return d is None or (isinstance(d, int) and d < 0)


def input_names(model) -> list[str]:
    """The names of ``model``'s inputs: their ``InputLayer``'s names, which Keras keys a dict
    of inputs by (``model.predict({name: x})``) and a rebuilt model keeps (the symbolic
    tensors' own names need not survive a rebuild)."""
    from cle._core import keras_internals as internals

    names = []
    for k, tensor in enumerate(model.inputs):
        layer = internals.producer_of(tensor)
        names.append(str(getattr(layer, "name", None) or getattr(tensor, "name", f"input_{k}")))
    return names


def input_signatures(model) -> list[tuple[str, tuple]]:
    """``(name, sample shape with None for free sizes)`` of every input of ``model``."""
    return [(name, tuple(None if _free(d) else int(d) for d in tensor.shape[1:]))
            for name, tensor in zip(input_names(model), model.inputs)]


def input_dtypes(model) -> list[str]:
    """The dtype name of every input of ``model`` (``"float32"``, or ``"int32"`` for token
    ids)."""
    return [str(getattr(t, "dtype", None) or "float32") for t in model.inputs]


def integer_inputs(model) -> list[str]:
    """The names of ``model``'s inputs that take integers (token ids, indices)."""
    return [name for name, dtype in zip(input_names(model), input_dtypes(model))
            if _integer(dtype)]


def _integer(dtype) -> bool:
    try:
        return np.dtype(dtype).kind in "iu"
    except TypeError:
        return False


def input_signature(model) -> tuple[tuple, str]:
    """``(sample shape with None for free sizes, dtype name)`` of a one-input model."""
    if len(model.inputs) != 1:
        raise ValueError(
            "This needs a model with one input. Received: model "
            f"'{model.name}' with {len(model.inputs)} inputs"
        )
    tensor = model.inputs[0]
    return input_signatures(model)[0][1], str(getattr(tensor, "dtype", "float32"))


def format_shape(shape, batch="N"):
    dims = [batch] + ["?" if d is None else str(d) for d in shape]
    return "(" + ", ".join(dims) + ")"


def _is_dataset(obj) -> bool:
    return type(obj).__module__.startswith("tensorflow") and hasattr(obj, "element_spec")


def _is_array(obj) -> bool:
    return isinstance(obj, np.ndarray) or (
        hasattr(obj, "shape") and hasattr(obj, "dtype") and not _is_dataset(obj))


def _numpy(item):
    try:
        import keras

        return np.asarray(keras.ops.convert_to_numpy(item))
    except Exception:  # noqa: BLE001 - anything numpy can read
        return np.asarray(item)


class _Reader:
    """Turns the accepted forms into batches: each a list with one array per model input."""

    def __init__(self, signatures, name):
        self.names = [n for n, _ in signatures]
        self.shapes = [s for _, s in signatures]
        self.name = name

    @property
    def several(self):
        return len(self.names) > 1

    def _from_dict(self, item):
        missing = [n for n in self.names if n not in item]
        if missing or len(item) != len(self.names):
            raise ValueError(
                f"`{self.name}` as a dict needs one array per model input, keyed by the input "
                f"names {self.names}. Received: a dict with keys {sorted(map(str, item))}")
        return [_numpy(item[n]) for n in self.names]

    def _is_input_tuple(self, item):
        """A tuple/list with one array per input (rank and fixed sizes as the inputs')."""
        if not isinstance(item, (tuple, list)) or len(item) != len(self.names):
            return False
        return all(_is_array(a) and np.ndim(a) in (len(s), len(s) + 1)
                   for a, s in zip(item, self.shapes))

    def element(self, item):
        """One batch (or one sample of an unbatched dataset) as a list of arrays."""
        if isinstance(item, dict):
            return self._from_dict(item)
        if self.several:
            if self._is_input_tuple(item):
                return [_numpy(a) for a in item]
            if isinstance(item, (tuple, list)) and item and (
                    isinstance(item[0], dict) or self._is_input_tuple(item[0])):
                return self.element(item[0])  # (x, y) as Keras' fit takes it
            raise ValueError(
                f"`{self.name}` must hold, for a model with {len(self.names)} inputs, a dict "
                f"{{input name: array}} or a tuple of {len(self.names)} arrays (inputs "
                f"{self.names}) per batch. Received: {type(item).__name__}")
        if isinstance(item, (tuple, list)) and item and not np.isscalar(item[0]):
            item = item[0]  # (x, y) or (x,) as Keras' fit takes them
            if isinstance(item, dict):
                return self._from_dict(item)
        return [_numpy(item)]

    def batches(self, data):
        if isinstance(data, (str, bytes, os.PathLike)):
            raise ValueError(
                f"`{self.name}` must be an array, an iterable of batches or a tf.data.Dataset; "
                f"to read a file use cle.load_calibration(path, model). Received: "
                f"{self.name}={data!r}")
        if _is_array(data) or isinstance(data, dict) or self._is_input_tuple(data):
            return [self.element(data)]
        if _is_dataset(data):
            return [self.element(item) for item in data.as_numpy_iterator()]
        try:
            iterator = iter(data)
        except TypeError:
            raise ValueError(
                f"`{self.name}` must be an array, an iterable of batches or a tf.data.Dataset. "
                f"Received: {self.name} of type {type(data).__name__}") from None
        return [self.element(item) for item in iterator]


def _fits(got, want) -> bool:
    return len(got) == len(want) and all(w is None or g == w for g, w in zip(got, want))


def _check_part(part, shape, label, where, unbatched, dtype="float32", listed=False):
    """One array of one input (the model's input ``dtype``), checked; with a batch dimension
    added for a dataset's sample. ``listed``: the array is one of a list of them (a list of
    single samples wants stacking, not a batch dimension each)."""
    expected = format_shape(shape)
    if part.dtype.kind not in "fiu" or part.dtype == np.bool_:
        raise ValueError(f"{label} must be numeric model inputs of shape {expected}. Received: "
                         f"dtype {part.dtype}{where}")
    if _integer(dtype):  # token ids, indices: the model takes them as they are
        if part.dtype.kind == "f" and not np.array_equal(part, np.round(part)):
            raise ValueError(
                f"{label} must be whole numbers: the model's input is {dtype} (e.g. token "
                f"ids). Received: dtype {part.dtype} with fractional values{where}")
    elif _integer(part.dtype):
        raise ValueError(
            f"{label} must be float model inputs, already preprocessed as the model expects "
            f"(shape {expected}); integers look like raw images: if the model takes pixels "
            "as they are (its own Rescaling or preprocessing layers), pass them as floats "
            "(x.astype('float32')), else preprocess them as it expects (for a folder of "
            f"images, name a preprocessing). Received: dtype {part.dtype}{where}")
    if part.ndim == len(shape) and _fits(part.shape, shape):
        if not unbatched:
            raise ValueError(
                f"{label} needs a batch dimension: the model expects {expected}. Received: one "
                f"sample of shape {part.shape}{where}; "
                + ("stack a list of samples into one array (np.stack(samples))" if listed
                   else "add one with x[None]"))
        part = part[None]
    if part.ndim != len(shape) + 1:
        raise ValueError(f"{label} must be a batch of model inputs of shape {expected}. "
                         f"Received: shape {part.shape}{where}")
    if not _fits(part.shape[1:], shape):
        what = "channel count" if (
            shape[-1] is not None and part.shape[-1] != shape[-1]
            and _fits(part.shape[1:-1], shape[:-1])) else "shape"
        raise ValueError(f"{label} has the wrong {what}: the model expects {expected}. "
                         f"Received: shape {part.shape}{where}")
    return part


def check_calibration_data(model, data, name: str = "calibration_data",
                           min_samples: int = 1) -> ModelInputs:
    """``data`` as :class:`ModelInputs`, checked against ``model``'s inputs.

    Args:
        model: a ``keras.Model``.
        data: the forms of the module docstring, or :class:`ModelInputs` already checked
            against this model (returned as it is).
        name: the argument's name in messages.
        min_samples: the fewest samples accepted.

    Returns:
        :class:`ModelInputs` holding every sample (float32, or an integer input's own dtype;
        the one copy of the data).

    Raises:
        ValueError: one line naming what the model expects and what was received: no
            samples, fewer than ``min_samples``, a missing batch dimension, a wrong rank, size
            or channel count, a missing input, inputs of different lengths, a non-numeric or
            integer dtype for a float input (inputs must be preprocessed floats), fractional
            values for an integer input, or non-finite values.

    Example:
        >>> x = check_calibration_data(model, np.zeros((8, 224, 224, 3), np.float32))
    """
    signatures = input_signatures(model)
    dtypes = input_dtypes(model)
    if isinstance(data, ModelInputs) and data.fits(model):
        if len(data) < max(1, min_samples):
            raise ValueError(f"`{name}` must hold at least {max(1, min_samples)} samples. "
                             f"Received: {len(data)}")
        return data
    reader = _Reader(signatures, name if " " not in name else "calibration_data")
    parts = reader.batches(data)
    label = name if " " in name else f"`{name}`"
    per_input = [[] for _ in signatures]
    for k, batch in enumerate(parts):
        where = "" if len(parts) == 1 else f" (batch {k})"
        for i, ((input_name, shape), part) in enumerate(zip(signatures, batch)):
            what = label if len(signatures) == 1 else f"{label} input '{input_name}'"
            per_input[i].append(_check_part(part, shape, what, where, _is_dataset(data),
                                            dtypes[i], isinstance(data, (list, tuple))
                                            and len(signatures) == 1))
    return _joined(per_input, signatures, label, min_samples, dtypes)


def _joined(per_input, signatures, label, min_samples, dtypes):
    """The checked batches of each input joined into :class:`ModelInputs` (float32, or the
    input's own integer dtype), with the checks of the whole: the count of samples, equal
    lengths and finite values."""
    expected = " and ".join(format_shape(s) for _, s in signatures)
    arrays = [np.concatenate(parts, axis=0).astype(
        dtype if _integer(dtype) else np.float32, copy=False) if parts else None
        for parts, dtype in zip(per_input, dtypes)]
    if arrays[0] is None or len(arrays[0]) == 0:
        raise ValueError(f"{label} must hold at least {max(1, min_samples)} sample(s) of shape "
                         f"{expected}. Received: none")
    lengths = [len(a) for a in arrays]
    if len(set(lengths)) > 1:
        raise ValueError(f"{label} must hold as many samples of every input. Received: "
                         + ", ".join(f"{n} for '{name}'"
                                     for n, (name, _) in zip(lengths, signatures)))
    if lengths[0] < min_samples:
        raise ValueError(f"{label} must hold at least {min_samples} samples of shape {expected}. "
                         f"Received: {lengths[0]}")
    for a, (input_name, _) in zip(arrays, signatures):
        bad = ~np.isfinite(a)
        if bad.any():
            where = "" if len(arrays) == 1 else f" of input '{input_name}'"
            raise ValueError(
                f"{label} must be finite. Received: {int(bad.sum())} NaN or infinite values in "
                f"{int(bad.reshape(len(a), -1).any(axis=1).sum())} of {len(a)} samples{where}")
    names, shapes = zip(*signatures)
    return ModelInputs(tuple(arrays), tuple(names), tuple(shapes))
