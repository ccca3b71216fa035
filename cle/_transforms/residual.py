"""Residual groups: scaling the channels of a residual stream, every layer that writes it and
every layer that reads it at once.

A scaling set ends at a tensor that feeds an ``Add`` (MobileNetV2's and EfficientNet's project
convolutions, the block input that skips to the ``Add``). The tensors joined by ``Add``s form
one *stream* with one channel space, linear throughout::

    project_a ─► [BN] ─► t0 ──────────────┬─► add_b ─► t1 ──┬─► add_c ─► t2 ─► expand_next
                          ├─► expand_b ...│                 ├─► expand_c ...     (reads t2)
                          project_b ─► [BN]┘    project_c ─► [BN]┘

Dividing channel ``i`` of every producer's output (kernel and bias) by ``s_i`` divides every
tensor of the stream by ``s_i`` (``a/s + b/s = (a + b)/s``); multiplying channel ``i`` of every
consumer's input by ``s_i`` undoes it. The float model computes what it computed. ``s`` is
Nagel's pair scale between the largest producer range and the largest consumer range of each
channel: ``s_i = sqrt(max_p r_p,i / max_q r_q,i)``.

Per-channel weight quantization of a producer is invariant to ``s``, so the groups are scaled
for per-tensor weights only, and only when asked for
(``EqualizeOptions(residual_groups=True)``, :func:`cle._transforms.plan.scale_groups`): with
``cle.quantize(per_channel=False)`` on the real networks (64 crops, 256 others), EfficientNet-Lite1
went from 90.6% / 18.54 dB to 92.6% / 19.62 with kernels rounded to nearest, but with their
tap sums kept (the per-tensor default) 94.1% / 20.07 against 96.1% / 20.14; MobileNetV2 from
91.8% / 18.73 to 88.7% / 18.66 (nearest), 89.8% / 19.40 against 90.6% / 19.28 (tap sums).

A group is kept only if every tensor of the stream is produced by an ``Add`` of the stream or
by a scalable layer with a linear activation (folded batch norms between are looked through),
and read only by ``Add``s of the stream and by scalable layers with that one input; the reason
names the first thing that breaks it.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np

from cle._core.graph import Call, GraphView
from cle._core.layouts import bias_on_wrong_axis, channel_axis, layout_of, untouchable_reason
from cle._core.semantics import activation_name
from cle._math import equalization as _cls_math
from cle._transforms.scaling import Factor
from cle._transforms.sets import in_spec, out_spec

__all__ = ["GroupInfo", "ResidualGroup", "find_groups", "group_factors", "group_scale"]


@dataclasses.dataclass(eq=False)
class ResidualGroup:
    """One residual stream: the layers that write it and the layers that read it.

    Attributes:
        producers: calls whose output channels (kernel, bias) are divided by ``s``.
        consumers: calls whose input channels are multiplied by ``s``.
        adds: the ``Add`` calls that join the stream.
    """

    producers: list[Call]
    consumers: list[Call]
    adds: list[Call]

    @property
    def names(self) -> tuple[list[str], list[str]]:
        return ([c.layer.name for c in self.producers], [c.layer.name for c in self.consumers])


@dataclasses.dataclass
class GroupInfo:
    """A scaled residual group in :class:`cle.EqualizationReport` (``groups``).

    Attributes:
        producers, consumers: layer names (see :class:`ResidualGroup`).
        scale_range: ``(min, max)`` of its scale factors.
    """

    producers: list[str]
    consumers: list[str]
    scale_range: tuple[float, float]

    @classmethod
    def of(cls, group: ResidualGroup, s) -> GroupInfo:
        producers, consumers = group.names
        return cls(producers, consumers, (float(np.min(s)), float(np.max(s))))

    def __str__(self):
        lo, hi = self.scale_range
        return f"{', '.join(self.producers)} -> {', '.join(self.consumers)} [{lo:.3g}, {hi:.3g}]"


def _is_add(call: Call) -> bool:
    return call.kind is keras.layers.Add and all(
        t.shape == call.outputs[0].shape for t in call.inputs)


def _streams(view: GraphView):
    """``[(adds, tensors)]``: the tensors joined by ``Add`` calls, one list per stream."""
    parent: dict[int, int] = {}

    def root(k):
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    tensors, adds_of = {}, {}
    for call in view.calls:
        if not _is_add(call):
            continue
        ts = list(call.inputs) + list(call.outputs)
        for t in ts:
            parent.setdefault(id(t), id(t))
            tensors[id(t)] = t
        first = root(id(ts[0]))
        for t in ts[1:]:
            parent[root(id(t))] = first
        adds_of.setdefault(id(call.outputs[0]), call)
    streams: dict[int, tuple[list, list]] = {}
    for k, t in tensors.items():
        streams.setdefault(root(k), ([], []))[1].append(t)
    for k, call in adds_of.items():
        streams[root(k)][0].append(call)
    return list(streams.values())


def _producer(view, t, transparent):
    """``(call, "")``: the scalable layer that writes stream tensor ``t`` (folded BNs looked
    through), or ``(None, reason)``."""
    call = t.producer
    while call is not None and id(call.layer) in transparent:
        src = call.inputs[0]
        if len(src.consumers) != 1:
            return None, f"the input of '{call.layer.name}' feeds {len(src.consumers)} layers"
        call = src.producer
    if call is None:
        return None, "a model input is part of it"
    layer = call.layer
    if layout_of(layer) is None:
        return None, f"'{layer.name}' ({type(layer).__name__}) writes it"
    reason = untouchable_reason(layer, view.n_calls(layer))
    if reason:
        return None, reason
    act = activation_name(layer.activation)
    if act != "linear":
        return None, f"'{layer.name}' writes it through activation '{act}'"
    if len(call.outputs) != 1 or (layer.use_bias and bias_on_wrong_axis(layer, t.shape)):
        return None, f"'{layer.name}' cannot be scaled on its output channels"
    return call, ""


def _consumer_reason(view, call, t):
    layer = call.layer
    if layout_of(layer) is None:
        return f"'{layer.name}' ({type(layer).__name__}) reads it"
    reason = untouchable_reason(layer, view.n_calls(layer))
    if reason:
        return reason
    if len(call.inputs) != 1:
        return f"'{layer.name}' has several inputs"
    return None


def _group(view, adds, tensors, transparent):
    """A :class:`ResidualGroup` of one stream, or the reason it is not one."""
    add_ids = {id(c) for c in adds}
    producers, consumers = [], []
    axis = len(tensors[0].shape) - 1
    for t in tensors:
        if t.is_model_output:
            return f"it is an output of model '{t.output_of[0]}'"
        if t.producer is None or id(t.producer) not in add_ids:
            call, reason = _producer(view, t, transparent)
            if call is None:
                return reason
            producers.append(call)
        for c in t.consumers:
            if id(c) in add_ids:
                continue
            reason = _consumer_reason(view, c, t)
            if reason:
                return reason
            consumers.append(c)
    for call in producers + consumers:
        if channel_axis(call.layer, len(tensors[0].shape)) != axis:
            return f"'{call.layer.name}' keeps its channels on another axis"
    if not producers or not consumers:
        return "no layer reads it" if producers else "no layer writes it"
    return ResidualGroup(producers, consumers, adds)


def find_groups(view: GraphView, transparent=frozenset()):
    """Every residual stream of ``view`` that can be scaled.

    Args:
        view: the graph view.
        transparent: ids of BNs a pending fold removes (looked through, as by
            :func:`cle._transforms.sets.find_sets`).

    Returns:
        ``(groups, ends)``: :class:`ResidualGroup` list in graph order, and ``(add name,
        reason)`` for every stream that is not one.
    """
    groups, ends = [], []
    for adds, tensors in _streams(view):
        g = _group(view, adds, tensors, transparent)
        if isinstance(g, str):
            ends.append((adds[0].layer.name, f"the residual stream is not scaled: {g}"))
        else:
            groups.append(g)
    groups.sort(key=lambda g: min(c.index for c in g.producers))
    return groups, ends


def group_scale(group: ResidualGroup, reader) -> np.ndarray:
    """Nagel's pair scale between each channel's largest producer range and its largest
    consumer range (``reader(layer, attr)``: the weights the layers will have)."""
    r_out = np.max([_cls_math.channel_ranges(reader(c.layer, out_spec(c.layer)[0]),
                                             *out_spec(c.layer)[1:])
                    for c in group.producers], axis=0)
    r_in = np.max([_cls_math.channel_ranges(reader(c.layer, in_spec(c.layer)[0]),
                                            *in_spec(c.layer)[1:])
                   for c in group.consumers], axis=0)
    return _cls_math.pair_scale(r_out, r_in)


def group_factors(group: ResidualGroup, s, has_bias) -> list[Factor]:
    """What scaling a group by ``s`` does to each weight: every producer's output channel
    (kernel and bias) divided by ``s``, every consumer's input channel multiplied by it."""
    out = []
    for call in group.producers:
        attr, axis, kind = out_spec(call.layer)
        out.append(Factor(call.layer, attr, 1.0 / s, axis, kind))
        if has_bias(call.layer):
            out.append(Factor(call.layer, "bias", s))
    for call in group.consumers:
        attr, axis, kind, groups = in_spec(call.layer)
        out.append(Factor(call.layer, attr, s, axis, kind, groups))
    return out
