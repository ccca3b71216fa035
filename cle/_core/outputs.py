"""The names of a model's outputs: what ``model.predict`` returns each under, or the layer
that makes it."""

from __future__ import annotations

import keras

from cle._core import keras_internals as internals

__all__ = ["output_names"]


def output_names(model) -> list[str]:
    """Each output's name, in the order of ``model.outputs``: for outputs given as a dict,
    its key (the name ``model.predict`` returns it under; keys of nested dicts joined with
    '/'), else the layer that makes it."""
    keys = _output_keys(model)
    names = []
    for k, out in enumerate(model.outputs):
        producer = internals.producer_of(out)
        names.append(keys[k] if keys else getattr(producer, "name", None) or f"output {k}")
    return names


def _output_keys(model) -> list[str] | None:
    """The dict keys of each output, in the order of ``model.outputs``, or None when the
    outputs are not given by key (one tensor, a list or a tuple; a Sequential model, whose
    ``output`` Keras gives only once it has been called)."""
    if not isinstance(model, keras.Model) or isinstance(model, keras.Sequential):
        return None
    try:
        struct = model.output
    except (AttributeError, ValueError):
        return None
    paths = [path for path, _ in keras.tree.flatten_with_path(struct)]
    if len(paths) != len(model.outputs) or not any(
            isinstance(p, str) for path in paths for p in path):
        return None
    return ["/".join(str(p) for p in path) for path in paths]
