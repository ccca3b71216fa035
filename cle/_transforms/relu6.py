"""ReLU6 handling: the edits that replace a ReLU capped at 6 by a ReLU, or bound it as a
:class:`cle.layers.ClippedReLU` (whose caps may follow scale factors)."""

from __future__ import annotations

import keras

from cle._core.graph import GraphView, graph_view
from cle._core.rebuild import LayerEdit, rebuild
from cle._core.semantics import relu6_kind
from cle.layers import ClippedReLU

__all__ = ["all_relu6", "changed_name", "merge", "relu6_edit", "relu6_rebuild"]


def relu6_edit(layer, kind, mode, axis=-1, caps=None):
    """The edit of one ReLU6 (``caps``: the new ClippedReLU's per-channel caps, if not 6)."""
    made = {} if caps is None else {"caps": caps}
    if mode == "replace":
        if kind == "standalone":
            return LayerEdit(
                replace=lambda old: keras.layers.ReLU(name=old.name, dtype=old.dtype_policy.name)
            )
        return LayerEdit(config={"activation": "relu"})
    if kind == "standalone":
        return LayerEdit(replace=lambda old: ClippedReLU(
            6.0, axis=axis, name=old.name, dtype=old.dtype_policy.name), made_variables=made)
    return LayerEdit(
        config={"activation": "linear"},
        insert_after=lambda old: ClippedReLU(
            6.0, axis=axis, name=f"{old.name}_relu6", dtype=old.dtype_policy.name),
        made_variables=made,
    )


def all_relu6(view: GraphView):
    """(layer, kind, channel axis for a ClippedReLU) for every distinct ReLU6 in the view."""
    out = []
    for call in view.first_calls():
        kind = relu6_kind(call.layer)
        if kind is None:
            continue
        t = call.outputs[0] if kind == "fused" else call.inputs[0]
        fmt = getattr(call.layer, "data_format", None)
        if kind == "standalone":  # follow the producer's data format when it has one
            producer = call.inputs[0].producer
            fmt = getattr(producer.layer, "data_format", None) if producer else None
        axis = 1 if fmt == "channels_first" and len(t.shape) > 2 else -1
        out.append((call.layer, kind, axis))
    return out


def merge(edits: dict, key: int, edit: LayerEdit):
    old = edits.get(key)
    if old is None:
        edits[key] = edit
        return
    old.config.update(edit.config)
    old.variables.update(edit.variables)
    old.compute = old.compute or edit.compute
    old.replace = old.replace or edit.replace
    old.insert_after = old.insert_after or edit.insert_after
    old.made_variables.update(edit.made_variables)


def relu6_rebuild(model, mode):
    view = graph_view(model)
    edits, replaced = {}, []
    for layer, kind, axis in all_relu6(view):
        edits[id(layer)] = relu6_edit(layer, kind, mode, axis)
        replaced.append(changed_name(layer, kind))
    new_model, _ = rebuild(model, edits=edits)
    return new_model, replaced


def changed_name(layer, kind):
    return layer.name if kind == "standalone" else f"{layer.name} (fused activation)"
