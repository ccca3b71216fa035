"""Finding cross-layer scaling sets: check, then scale, with a reason for every chain end.

A *link* joins two scalable layers (Conv1D/2D/3D, DepthwiseConv1D/2D, SeparableConv1D/2D,
Conv*Transpose, Dense) through a single-consumer path of layers that commute with a positive
per-channel scale ``s``: ``f(s·x) = s·f(x)``::

    layer1 ─► [ReLU | LeakyReLU | PReLU | ZeroPadding | Max/AveragePooling | GlobalPooling
               | Dropout | Identity | linear/relu Activation | capped ReLU*] ─► layer2

(*) A capped ReLU ``min(max(x, 0), M)`` (ReLU6, ``ReLU(max_value=M)``, :class:`ClippedReLU`)
commutes only if its cap becomes per-channel ``M / s``. A :class:`ClippedReLU` is always
scalable (its caps are a weight). A plain ReLU6 depends on the mode of the search:

* "bound" — planning for ``equalize_model(relu6="bound")``: it will become a ClippedReLU;
* "replace" — planning for ``relu6="replace"``: it will become a ReLU;
* "keep" — ``relu6="keep"``: it stays and ends the chain;
* "inplace" — in-place scaling of an existing model: it cannot take per-channel caps in place
  and ends the chain (the reason says how to convert it).

Links chain into sets: ``conv → depthwise (multiplier 1) → conv`` is a triplet, any other link is
a pair. Everything here reads a :class:`cle._core.graph.GraphView`; nothing is modified.
"""

from __future__ import annotations

import dataclasses

import keras

from cle._core.graph import Call, GraphView
from cle._core.layouts import (
    Layout,
    bias_on_wrong_axis,
    channel_axis,
    layout_of,
    untouchable_reason,
)
from cle._core.semantics import activation_name, relu6_kind
from cle.layers import ClippedReLU

L = keras.layers

_PASS_THROUGH = (
    L.ZeroPadding1D, L.ZeroPadding2D, L.ZeroPadding3D,
    L.MaxPooling1D, L.MaxPooling2D, L.MaxPooling3D,
    L.AveragePooling1D, L.AveragePooling2D, L.AveragePooling3D,
    L.GlobalAveragePooling1D, L.GlobalAveragePooling2D, L.GlobalAveragePooling3D,
    L.GlobalMaxPooling1D, L.GlobalMaxPooling2D, L.GlobalMaxPooling3D,
    L.Dropout, L.SpatialDropout1D, L.SpatialDropout2D, L.SpatialDropout3D, L.Identity,
)
_RELU_LIKE = (L.LeakyReLU, L.PReLU)
_PADDING = (L.ZeroPadding1D, L.ZeroPadding2D, L.ZeroPadding3D)


def _capped_reason(layer, cap, relu6):
    if relu6 == "keep":
        return f"'{layer.name}' is a ReLU capped at {cap} (relu6='keep')"
    return (
        f"'{layer.name}' is a ReLU capped at {cap}, which cannot take per-channel caps in "
        "place; convert it first with cle.replace_relu6_with_clipped_relu (exact) or "
        "cle.replace_relu6_with_relu"
    )


def _classify(layer, relu6: str):
    """How a path layer behaves under channel scaling: ("pass"|"relu"|"cap", reason)."""
    if isinstance(layer, ClippedReLU):
        return "cap", ""
    if isinstance(layer, _PASS_THROUGH) and type(layer) in _PASS_THROUGH:
        return "pass", ""
    if type(layer) in _RELU_LIKE:
        return "relu", ""
    if type(layer) is L.ReLU:
        if float(layer.threshold) != 0.0:
            return None, f"'{layer.name}' is a ReLU with threshold {layer.threshold}"
        if layer.max_value is None:
            return "relu", ""
        if relu6_kind(layer) == "standalone" and relu6 in ("bound", "replace"):
            return ("cap" if relu6 == "bound" else "relu"), ""
        return None, _capped_reason(layer, layer.max_value, relu6)
    if type(layer) is L.Activation:
        name = activation_name(layer.activation)
        if name == "linear":
            return "pass", ""
        if name == "relu":
            return "relu", ""
        if name == "relu6":
            if relu6 in ("bound", "replace"):
                return ("cap" if relu6 == "bound" else "relu"), ""
            return None, _capped_reason(layer, 6, relu6)
        return None, f"'{layer.name}' applies '{name}', which does not commute with scaling"
    if isinstance(layer, L.BatchNormalization):
        return None, f"'{layer.name}' is a BatchNormalization that was not folded"
    return None, f"'{layer.name}' ({type(layer).__name__}) does not commute with scaling"


@dataclasses.dataclass(eq=False)
class Link:
    """layer1 ─► path ─► layer2, scalable as a pair."""

    first: Call
    second: Call
    path: list[Call]
    relu: bool  # a ReLU-like activation (fused in layer1 or on the path) lies between
    caps: list[Call]  # capped ReLUs on the path (their caps must follow the scale)
    fused_cap: bool  # layer1 itself has activation="relu6" (bound mode, before rebuild)
    zero_padding: bool  # a ZeroPadding layer on the path

    @property
    def layers(self):
        return self.first.layer, self.second.layer


def _in_spec(layer, layout: Layout):
    """(kernel attr, axis, kind, groups) of the channels a layer reads."""
    groups = getattr(layer, "groups", 1) or 1
    if layout.kind == "conv" and groups > 1:
        return layout.in_kernel, layout.in_axis, "grouped_in", groups
    return layout.in_kernel, layout.in_axis, "standard", 1


def _out_spec(layer, layout: Layout):
    """(kernel attr, axis, kind) of the channels a layer writes."""
    kind = "depthwise_out" if layout.kind == "depthwise" else "standard"
    return layout.out_kernel, layout.out_axis, kind


def _check_scalable(view: GraphView, call: Call, role: str) -> str | None:
    layer = call.layer
    reason = untouchable_reason(layer, view.n_calls(layer))
    if reason:
        return reason
    if role == "first" and len(call.outputs) != 1:
        return f"'{layer.name}' has several outputs"
    return None


def _n_channels(layer, layout: Layout, side: str) -> int:
    if side == "out":
        attr, axis, kind = _out_spec(layer, layout)
        k = getattr(layer, attr)
        return k.shape[-2] * k.shape[-1] if kind == "depthwise_out" else k.shape[axis]
    attr, axis, kind, groups = _in_spec(layer, layout)
    k = getattr(layer, attr)
    return k.shape[axis] * groups


def walk(view: GraphView, call: Call, relu6: str, transparent=frozenset()):
    """Follow ``call``'s output to the next scalable layer.

    Args:
        view: the graph view.
        call: a call of a scalable layer (layer1).
        relu6: "bound", "replace", "keep" or "inplace" (see the module docstring).
        transparent: ids of layers to look through (BNs that a pending fold removes).

    Returns:
        ``(Link, "")`` or ``(None, reason)``.
    """
    layer = call.layer
    layout = layout_of(layer)
    reason = _check_scalable(view, call, "first")
    if reason:
        return None, reason
    act = activation_name(layer.activation)
    relu, fused_cap = False, False
    if act == "relu":
        relu = True
    elif act == "relu6" and relu6 in ("bound", "replace"):
        relu, fused_cap = True, relu6 == "bound"
    elif act == "relu6":
        return None, _capped_reason(layer, 6, relu6).replace(
            "is a ReLU capped at 6", "has a fused activation 'relu6'")
    elif act != "linear":
        return None, f"'{layer.name}' applies activation '{act}', which does not commute with scaling"
    t = call.outputs[0]
    if layer.use_bias:
        reason = bias_on_wrong_axis(layer, t.shape)
        if reason:
            return None, reason
    axis = channel_axis(layer, len(t.shape))
    path, caps, padded, last = [], [], False, call
    while True:
        if t.is_model_output:
            return None, f"the output of '{last.layer.name}' is an output of model '{t.output_of[0]}'"
        if len(t.consumers) != 1:
            names = ", ".join(f"'{c.layer.name}'" for c in t.consumers)
            return None, (
                f"the output of '{last.layer.name}' feeds {len(t.consumers)} layers ({names})"
                if t.consumers else f"the output of '{last.layer.name}' is not used"
            )
        nxt = t.consumers[0]
        nlayer = nxt.layer
        if id(nlayer) in transparent:
            t, last = nxt.outputs[0], nxt
            continue
        nlayout = layout_of(nlayer)
        if nlayout is not None:
            reason = _check_scalable(view, nxt, "second")
            if reason:
                return None, reason
            if len(nxt.inputs) != 1:
                return None, f"'{nlayer.name}' has several inputs"
            want = channel_axis(nlayer, len(t.shape))
            if want != axis:
                return None, (
                    f"'{nlayer.name}' reads channels on axis {want}, but they are on axis {axis}"
                )
            n1, n2 = _n_channels(layer, layout, "out"), _n_channels(nlayer, nlayout, "in")
            if n1 != n2:
                return None, f"'{layer.name}' writes {n1} channels but '{nlayer.name}' reads {n2}"
            return Link(call, nxt, path, relu, caps, fused_cap, padded), ""
        kind, reason = _classify(nlayer, relu6)
        if kind is None:
            return None, reason
        rank = len(t.shape)
        fmt = getattr(nlayer, "data_format", None)
        if fmt is not None and (1 if fmt == "channels_first" else rank - 1) != axis:
            return None, f"'{nlayer.name}' uses {fmt}, but the channels are on axis {axis}"
        if kind == "cap":
            if view.n_calls(nlayer) > 1:
                return None, f"'{nlayer.name}' is a shared capped ReLU"
            cap_axis = getattr(nlayer, "axis", -1) % rank if isinstance(nlayer, ClippedReLU) else rank - 1
            if cap_axis != axis:
                return None, f"'{nlayer.name}' caps axis {cap_axis}, but the channels are on axis {axis}"
            caps.append(nxt)
            relu = True
        elif kind == "relu":
            relu = True
        if isinstance(nlayer, _PADDING):
            padded = True
        path.append(nxt)
        t, last = nxt.outputs[0], nxt
        new_rank = len(t.shape)
        if new_rank != rank:  # global pooling: (B, ..., C) -> (B, C)
            if getattr(nlayer, "keepdims", False) or new_rank != 2:
                return None, f"'{nlayer.name}' changes the rank in a way keras-cle does not follow"
            axis = 1


def _is_depthwise_mult1(layer) -> bool:
    layout = layout_of(layer)
    return layout is not None and layout.kind == "depthwise" and layer.depth_multiplier == 1


@dataclasses.dataclass
class SetSearch:
    """Scaling sets (lists of one link for a pair, two for a triplet) and the chain ends."""

    sets: list[list[Link]]
    ends: list[tuple[Call, str]]  # (layer1 call, why no set starts there)


def find_sets(view: GraphView, relu6: str = "inplace", transparent=frozenset()) -> SetSearch:
    links: dict[int, Link] = {}
    ends = []
    for call in view.calls:
        if layout_of(call.layer) is None:
            continue
        link, reason = walk(view, call, relu6, transparent)
        if link is None:
            ends.append((call, reason))
        else:
            links[id(call)] = link
    has_incoming = {id(link.second) for link in links.values()}
    sets = []
    for call in view.calls:
        if id(call) not in links or id(call) in has_incoming:
            continue
        chain, c = [], call
        while id(c) in links:
            chain.append(links[id(c)])
            c = links[id(c)].second
        i = 0
        while i < len(chain):
            a = chain[i]
            if (
                i + 1 < len(chain)
                and _is_depthwise_mult1(a.second.layer)
                and not _is_depthwise_mult1(a.first.layer)
                and layout_of(a.first.layer).kind != "depthwise"
                and layout_of(chain[i + 1].second.layer).kind != "depthwise"
            ):
                sets.append([a, chain[i + 1]])
                i += 2
            else:
                sets.append([a])
                i += 1
    return SetSearch(sets, ends)


def in_spec(layer):
    return _in_spec(layer, layout_of(layer))


def out_spec(layer):
    return _out_spec(layer, layout_of(layer))
