"""What a compiled model's loss says of its outputs: class scores or values.

A model trained with ``model.compile(loss=...)`` keeps its loss, in memory and in a saved
``.keras`` file: the loss its outputs were trained for tells what they hold. A cross-entropy
over classes taken from logits (``SparseCategoricalCrossentropy(from_logits=True)``,
``CategoricalCrossentropy(from_logits=True)``, their focal kind) says the output holds class
scores, so it gets its top-1 agreement and, without data, no regression refusal; a
regression loss (mean squared or absolute error, Huber, log-cosh, ...) says it holds values.
The check reads them as declared (:func:`cle._measure.check.declared_kinds`); what the caller
declares (``output_kinds``, ``--output-kind``) comes first. A loss this module does not know
(a custom one), a cross-entropy that expects probabilities, and class scores for an output
that ends in a softmax or a sigmoid (which says it already) say nothing; a regression loss on
a sigmoid's output (boxes, an image) says values.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable

import keras

__all__ = ["CLASS_LOSSES", "VALUE_LOSSES", "file_loss", "loss_kinds", "loss_name"]

#: Losses over classes that, taking logits (``from_logits=True``), say an output holds class
#: scores: Keras' function names.
CLASS_LOSSES = ("sparse_categorical_crossentropy", "categorical_crossentropy",
                "categorical_focal_crossentropy")
#: Losses that say an output holds values (Keras' function names).
VALUE_LOSSES = ("mean_squared_error", "mean_absolute_error", "mean_absolute_percentage_error",
                "mean_squared_logarithmic_error", "huber", "log_cosh", "poisson")


def loss_name(loss) -> tuple[str | None, bool]:
    """``(Keras' function name, from_logits)`` of one output's loss: a name Keras knows
    (``"mse"``), a loss function, or a ``keras.losses.Loss`` (its config); ``(None, False)``
    for anything else."""
    if isinstance(loss, str):
        try:
            loss = keras.losses.get(loss)
        except ValueError:
            return None, False
    if isinstance(loss, keras.losses.Loss):
        name = getattr(getattr(loss, "fn", None), "__name__", None) or getattr(loss, "name", None)
        if name not in CLASS_LOSSES:  # its config is read only for from_logits
            return name, False
        try:
            return name, bool(loss.get_config().get("from_logits", False))
        except Exception:  # noqa: BLE001 - a config that does not serialize says nothing
            return None, False
    return getattr(loss, "__name__", None), False


def _kind(loss) -> str | None:
    name, from_logits = loss_name(loss)
    if name in CLASS_LOSSES and from_logits:
        return "classes"
    return "values" if name in VALUE_LOSSES else None


def loss_kinds(model, index: Callable[[str], int | None], loss=None) -> dict[int, str]:
    """``{output index: "classes" | "values"}`` of the outputs of ``model`` whose loss says
    what they hold (:func:`_kind`): ``loss``, or else the model's compiled loss; one loss for
    every output, a list by output, or a dict by output name (``index`` maps a name to its
    output's index, None when it names none). Empty for a model not compiled."""
    loss = getattr(model, "loss", None) if loss is None else loss
    if loss is None:
        return {}
    n = len(model.outputs)
    if isinstance(loss, dict):
        pairs = [(index(name), value) for name, value in loss.items()]
    elif isinstance(loss, (list, tuple)):
        pairs = list(enumerate(loss)) if len(loss) == n else []
    else:
        pairs = [(k, loss) for k in range(n)]
    return {k: kind for k, value in pairs
            if k is not None and value is not None and (kind := _kind(value)) is not None}


def file_loss(path):
    """The loss a ``.keras`` file was compiled with, read from its config without compiling
    the model (``cle`` commands load models uncompiled: a training configuration may not read
    back): names as they are, ``keras.losses.Loss`` objects deserialized, in the structure
    given (one, a list, a dict by output name); a loss that does not deserialize (a custom
    one) is None. None for a file that is no ``.keras`` zip or holds no loss."""
    try:
        with zipfile.ZipFile(path) as archive:
            config = json.loads(archive.read("config.json"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None
    compiled = config.get("compile_config") if isinstance(config, dict) else None
    return _loss_of(compiled.get("loss")) if isinstance(compiled, dict) else None


def _loss_of(entry):
    if isinstance(entry, list):
        return [_loss_of(e) for e in entry]
    if isinstance(entry, dict) and "class_name" not in entry:
        return {name: _loss_of(e) for name, e in entry.items()}
    if isinstance(entry, dict):
        try:
            return keras.saving.deserialize_keras_object(entry)
        except Exception:  # noqa: BLE001  (a custom loss this process cannot build)
            return None
    return entry
