"""Cross-layer equalization (Nagel et al. 2019): ReLU6 handling, cross-layer scaling,
high-bias folding, and :func:`equalize_model`, which runs the whole pipeline.

Pipeline of :func:`equalize_model`, building the new model once::

    model ─► fold BNs + ReLU6 handling (one rebuild) ─► scale sets (in place on the new model)
          ─► high-bias folding (in place) ─► new model, report

The stepwise API follows Qualcomm AIMET's Keras API (``CrossLayerScaling``, ``ClsSetInfo``,
``HighBiasFold``); its functions work **in place** on the layers they are given, as AIMET's do.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any

import keras
import numpy as np

from cle import _cls_math, _qnoise, _scale_choice, batch_norm_fold as _bnf
from cle._backend_caps import check_runnable
from cle._cls_sets import Link, SetSearch, find_sets, in_spec, out_spec, relu6_kind, walk
from cle._graph import GraphView, graph_view, local_view
from cle._layouts import bias_on_wrong_axis, channel_axis, layout_of, read_weight
from cle._rebuild import LayerEdit, rebuild
from cle.layers import ClippedReLU

__all__ = [
    "BiasAbsorption",
    "ClsSetInfo",
    "CrossLayerScaling",
    "EqualizationReport",
    "HighBiasFold",
    "equalize_model",
    "replace_relu6_with_clipped_relu",
    "replace_relu6_with_relu",
]

logger = logging.getLogger("cle.cross_layer_equalization")

_RELU6_MODES = ("bound", "replace", "keep")
_HBF_MODES = ("unpadded", "all", "none")
_OBJECTIVES = ("quantized", "weights")


# ---------------------------------------------------------------------------- weights


def _get(layer, attr):
    """The variable as a numpy array in its own dtype (the math promotes to float64 layer by
    layer; a float64 copy of every kernel here would only add memory)."""
    return read_weight(getattr(layer, attr))


def _set(layer, attr, value):
    var = getattr(layer, attr)
    var.assign(np.asarray(value, dtype=var.dtype))


# ---------------------------------------------------------------------------- ReLU6


def _relu6_edit(layer, kind, mode, axis=-1):
    if mode == "replace":
        if kind == "standalone":
            return LayerEdit(
                replace=lambda old: keras.layers.ReLU(name=old.name, dtype=old.dtype_policy.name)
            )
        return LayerEdit(config={"activation": "relu"})
    if kind == "standalone":
        return LayerEdit(replace=lambda old: ClippedReLU(
            6.0, axis=axis, name=old.name, dtype=old.dtype_policy.name))
    return LayerEdit(
        config={"activation": "linear"},
        insert_after=lambda old: ClippedReLU(
            6.0, axis=axis, name=f"{old.name}_relu6", dtype=old.dtype_policy.name),
    )


def _all_relu6(view: GraphView):
    """(layer, kind, channel axis for a ClippedReLU) for every distinct ReLU6 in the view."""
    seen, out = set(), []
    for call in view.calls:
        kind = relu6_kind(call.layer)
        if kind is None or id(call.layer) in seen:
            continue
        seen.add(id(call.layer))
        t = call.outputs[0] if kind == "fused" else call.inputs[0]
        fmt = getattr(call.layer, "data_format", None)
        if kind == "standalone":  # follow the producer's data format when it has one
            producer = call.inputs[0].producer
            fmt = getattr(producer.layer, "data_format", None) if producer else None
        axis = 1 if fmt == "channels_first" and len(t.shape) > 2 else -1
        out.append((call.layer, kind, axis))
    return out


def _merge(edits: dict, key: int, edit: LayerEdit):
    old = edits.get(key)
    if old is None:
        edits[key] = edit
        return
    old.config.update(edit.config)
    old.variables.update(edit.variables)
    old.compute = old.compute or edit.compute
    old.replace = old.replace or edit.replace
    old.insert_after = old.insert_after or edit.insert_after


def _relu6_rebuild(model, mode):
    view = graph_view(model)
    edits, replaced = {}, []
    for layer, kind, axis in _all_relu6(view):
        edits[id(layer)] = _relu6_edit(layer, kind, mode, axis)
        replaced.append(layer.name if kind == "standalone" else f"{layer.name} (fused activation)")
    new_model, _ = rebuild(model, edits=edits)
    return new_model, replaced


def replace_relu6_with_relu(model):
    """Replace every ReLU capped at 6 by an uncapped ReLU (the Nagel / AIMET-Keras step).

    Handles ``ReLU(max_value=6)``, ``Activation("relu6")`` and ``activation="relu6"`` fused into a
    Conv/Depthwise/Separable/Transpose/Dense layer. **This changes what the network computes**
    (on the real ImageNet MobileNetV2 it changes the top-1 class of some photos: the generated
    int8-modes table of docs/cross_layer_equalization.md);
    :func:`equalize_model` defaults to ``relu6="bound"``, which does not.

    Args:
        model: a Functional or Sequential ``keras.Model``.

    Returns:
        ``(new_model, replaced)``: a new model (``model`` is untouched) and the names of what
        was changed (fused activations as ``"name (fused activation)"``).
    """
    return _relu6_rebuild(model, "replace")


def replace_relu6_with_clipped_relu(model):
    """Replace every ReLU capped at 6 by a :class:`cle.layers.ClippedReLU` with caps 6.

    The function computed does not change; the per-channel caps then let cross-layer scaling
    cross the activation exactly (``CrossLayerScaling.scale_model`` divides the caps by the
    scale factors). A fused ``activation="relu6"`` becomes a linear layer followed by a new
    ``ClippedReLU`` named ``"<layer>_relu6"``.

    Args:
        model: a Functional or Sequential ``keras.Model``.

    Returns:
        ``(new_model, replaced)`` as for :func:`replace_relu6_with_relu`.
    """
    return _relu6_rebuild(model, "bound")


# ---------------------------------------------------------------------------- AIMET-style API


class ClsSetInfo:
    """One scaled set: a pair has one :class:`ClsSetLayerPairInfo`, a triplet two.

    Attributes:
        cls_pair_info_list: the pair infos, in graph order.
    """

    class ClsSetLayerPairInfo:
        """Two consecutive layers of a scaled set and the factors applied between them.

        Attributes:
            layer1: the layer whose output channels were divided by ``scale_factor``.
            layer2: the layer whose input channels were multiplied by ``scale_factor``.
            scale_factor: numpy array, one factor per channel.
            relu_activation_between_layers: a ReLU-like activation lies between the layers
                (selects the 3σ rule in high-bias folding).
        """

        def __init__(self, layer1, layer2, scale_factor, relu_activation_between_layers):
            self.layer1 = layer1
            self.layer2 = layer2
            self.scale_factor = np.asarray(scale_factor)
            self.relu_activation_between_layers = bool(relu_activation_between_layers)
            self._link: Link | None = None  # set when the path between is known

        def __repr__(self):
            s = self.scale_factor
            return (
                f"ClsSetLayerPairInfo({self.layer1.name!r} -> {self.layer2.name!r}, "
                f"scale {s.min():.3g}..{s.max():.3g}, relu={self.relu_activation_between_layers})"
            )

    def __init__(self, cls_pair_1, cls_pair_2=None):
        self.cls_pair_info_list = [cls_pair_1] + ([cls_pair_2] if cls_pair_2 is not None else [])

    def __repr__(self):
        return f"ClsSetInfo({self.cls_pair_info_list!r})"


def _set_names(layers):
    return "(" + ", ".join(repr(getattr(la, "name", la)) for la in layers) + ")"


def _link_for(view: GraphView, layer1, layer2, where):
    calls = view.layer_calls(layer1)
    if len(calls) != 1:
        raise ValueError(
            f"Cannot scale {where}: '{layer1.name}' is "
            + ("not part of the model" if not calls else f"called {len(calls)} times")
        )
    link, reason = walk(view, calls[0], "inplace")
    if link is None:
        raise ValueError(f"Cannot scale {where}: {reason}. Pass check=False to scale anyway.")
    if link.second.layer is not layer2:
        raise ValueError(
            f"Cannot scale {where}: '{layer1.name}' does not feed '{layer2.name}' through "
            f"scale-commuting layers only (the next scalable layer is '{link.second.layer.name}')."
        )
    return link


def _scale_pair(layer1, layer2, link: Link | None, s=None):
    """Scale a pair in place by ``s`` (default: Nagel's weight equalization); returns ``s``."""
    a1, ax1, k1 = out_spec(layer1)
    a2, ax2, k2, g2 = in_spec(layer2)
    w1, w2 = _get(layer1, a1), _get(layer2, a2)
    if s is None:
        s = _cls_math.pair_scale(
            _cls_math.channel_ranges(w1, ax1, k1), _cls_math.channel_ranges(w2, ax2, k2, g2)
        )
    _set(layer1, a1, _cls_math.scale_channels(w1, 1.0 / s, ax1, k1))
    if layer1.use_bias:
        _set(layer1, "bias", _get(layer1, "bias") / s)
    _set(layer2, a2, _cls_math.scale_channels(w2, s, ax2, k2, g2))
    _scale_caps(link, s)
    return s


def _scale_caps(link, s):
    for cap_call in (link.caps if link is not None else []):
        _set(cap_call.layer, "caps", _get(cap_call.layer, "caps") / s)


def _scale_triplet(layer1, dw, layer3, link1, link2, scales=None):
    """Scale a triplet in place by ``(s12, s23)`` (default: Nagel's); returns them."""
    a1, ax1, k1 = out_spec(layer1)
    a3, ax3, k3, g3 = in_spec(layer3)
    w1, wd, w3 = _get(layer1, a1), _get(dw, "kernel"), _get(layer3, a3)
    if scales is None:
        scales = _cls_math.triplet_scale(
            _cls_math.channel_ranges(w1, ax1, k1),
            _cls_math.channel_ranges(wd, -1, "depthwise_out"),
            _cls_math.channel_ranges(w3, ax3, k3, g3),
        )
    s12, s23 = scales
    _set(layer1, a1, _cls_math.scale_channels(w1, 1.0 / s12, ax1, k1))
    if layer1.use_bias:
        _set(layer1, "bias", _get(layer1, "bias") / s12)
    _set(dw, "kernel", _cls_math.scale_channels(wd, s12 / s23, -1, "depthwise_out"))
    if dw.use_bias:
        _set(dw, "bias", _get(dw, "bias") / s23)
    _set(layer3, a3, _cls_math.scale_channels(w3, s23, ax3, k3, g3))
    _scale_caps(link1, s12)
    _scale_caps(link2, s23)
    return s12, s23


def _is_triplet_middle(layer):
    layout = layout_of(layer)
    return layout is not None and layout.kind == "depthwise" and layer.depth_multiplier == 1


class CrossLayerScaling:
    """Cross-layer scaling, in place on the layers (AIMET's API)."""

    @staticmethod
    def scale_cls_sets(cls_sets, model=None, check=True):
        """Scale the given sets in place.

        Args:
            cls_sets: list of ``(layer1, layer2)`` pairs and ``(layer1, depthwise, layer2)``
                triplets (the depthwise layer with depth_multiplier 1).
            model: the model the layers belong to. Optional: without it the check follows the
                layers' own Keras nodes, which cannot see whether an output is also a model
                output, so a set whose layer1 output is a model output is scaled (and that
                output changes by 1/s). Pass the model for the complete check.
            check: refuse (``ValueError``) a set whose scaling would change what the model
                computes: layer1's output also feeds another layer, a non-homogeneous
                activation between the layers, a shared layer. ``check=False`` scales anyway
                (and cannot adjust :class:`ClippedReLU` caps on the path, which it does not know).

        Returns:
            One entry per set: an array of scale factors for a pair, a tuple of two arrays for a
            triplet.

        Raises:
            ValueError: a set is malformed or (with ``check``) unsafe; nothing is scaled then.
        """
        view = None
        if check:
            if model is not None:
                view = graph_view(model)
            else:
                # Follow every layer that starts a link (all but the last of each set).
                view = local_view([
                    la for s in cls_sets for la in tuple(s)[:-1]
                    if isinstance(la, keras.layers.Layer)
                ])
        plans = []
        for i, cls_set in enumerate(cls_sets):
            layers = tuple(cls_set)
            where = f"cls_sets[{i}]={_set_names(layers)}"
            if len(layers) not in (2, 3) or any(layout_of(la) is None for la in layers):
                raise ValueError(
                    "Each set must be (layer1, layer2) or (layer1, depthwise, layer2) of "
                    f"Conv/Depthwise/Separable/Transpose/Dense layers. Received: {where}"
                )
            if len(layers) == 3 and not _is_triplet_middle(layers[1]):
                raise ValueError(
                    f"The middle layer of a triplet must be a DepthwiseConv with "
                    f"depth_multiplier=1. Received: {where}"
                )
            links = [None] * (len(layers) - 1)
            if check:
                links = [
                    _link_for(view, layers[j], layers[j + 1], where)
                    for j in range(len(layers) - 1)
                ]
            plans.append((layers, links))
        out = []
        for layers, links in plans:
            if len(layers) == 2:
                out.append(_scale_pair(layers[0], layers[1], links[0]))
            else:
                out.append(_scale_triplet(*layers, links[0], links[1]))
        return out

    @staticmethod
    def create_cls_set_info_list(cls_sets, scale_factors, is_relu_activation_in_cls_sets):
        """Package sets, their factors and ReLU flags as :class:`ClsSetInfo` objects.

        Args:
            cls_sets: as given to :meth:`scale_cls_sets`.
            scale_factors: as returned by :meth:`scale_cls_sets`.
            is_relu_activation_in_cls_sets: per set, a bool for a pair or a pair of bools for a
                triplet: whether a ReLU-like activation lies between consecutive layers.

        Returns:
            list of :class:`ClsSetInfo`.
        """
        infos = []
        for layers, factors, relus in zip(cls_sets, scale_factors, is_relu_activation_in_cls_sets):
            layers = tuple(layers)
            if len(layers) == 2:
                infos.append(ClsSetInfo(ClsSetInfo.ClsSetLayerPairInfo(
                    layers[0], layers[1], factors, relus)))
            else:
                infos.append(ClsSetInfo(
                    ClsSetInfo.ClsSetLayerPairInfo(layers[0], layers[1], factors[0], relus[0]),
                    ClsSetInfo.ClsSetLayerPairInfo(layers[1], layers[2], factors[1], relus[1]),
                ))
        return infos

    @staticmethod
    def scale_model(model, objective="weights", folded_pairs=None, per_channel_weights=True,
                    weight_bits=8, activation_bits=8):
        """Find every scaling set of ``model`` (BNs already folded) and scale it in place.

        A :class:`ClippedReLU` is crossed (its caps follow the scale factors); a plain ReLU6
        ends a set, since it cannot take per-channel caps in place: run
        :func:`replace_relu6_with_clipped_relu` (exact) or :func:`replace_relu6_with_relu`
        first to scale across it. Why each chain ended is logged at INFO on
        ``"cle.cross_layer_equalization"``.

        Args:
            model: a Functional or Sequential ``keras.Model``.
            objective: "weights" (default, AIMET's behaviour): equalize weight ranges.
                "quantized": choose scales for the INT8 target given by
                ``per_channel_weights`` / ``weight_bits`` / ``activation_bits``, as
                :func:`equalize_model` does, with activation ranges from the BNs of
                ``folded_pairs`` (needed); sets whose modelled noise would not drop by at
                least the margin ``cle._qnoise.MIN_GAIN_DB`` are left as they are (logged at
                INFO).
            folded_pairs: the ``folded_pairs`` of :func:`cle.fold_all_batch_norms` that made
                ``model`` (objective "quantized").
            per_channel_weights: the INT8 target: per-channel (True) or per-tensor weights.
            weight_bits: the INT8 target: bits of the weight quantizer.
            activation_bits: the INT8 target: bits of the activation quantizer.

        Returns:
            list of :class:`ClsSetInfo` of the scaled sets, in graph order.

        Raises:
            ValueError: an unknown objective, or "quantized" without ``folded_pairs``.
        """
        if objective not in _OBJECTIVES:
            raise ValueError(
                f"objective must be one of {_OBJECTIVES}. Received: objective={objective!r}")
        target = _target(weight_bits, per_channel_weights, activation_bits)
        if objective == "quantized" and folded_pairs is None:
            raise ValueError(
                "objective='quantized' needs folded_pairs (from cle.fold_all_batch_norms) for "
                "the activation statistics. Received: folded_pairs=None")
        search = find_sets(graph_view(model), "inplace")
        for call, reason in search.ends:
            logger.info("no scaling set starts at '%s': %s", call.layer.name, reason)
        if objective == "weights":
            return _scale_search(search)
        bn_stats = {id(p.layer): _gamma_beta(p.bn) for p in folded_pairs if p.bn_after}
        value = _WeightReader()
        infos = []
        for links in search.sets:  # in place, set by set: each sees the previous ones' result
            d = _scale_choice.decide_set(links, value, bn_stats, target)
            if d.scaled:
                infos += _scale_search(SetSearch([links], []), {d.layers: d.scales})
            else:
                logger.info("scaling set %s left as it is: %s", d.layers, d.reason)
        return infos


def _set_key(links):
    return tuple(link.first.layer.name for link in links) + (links[-1].second.layer.name,)


def _scale_search(search, chosen=None):
    """Scale the sets of a search in place; one ClsSetInfo per scaled set.

    ``chosen``: ``{set key: [scales per junction]}``; when given, only those sets are scaled,
    with those scales (else every set, with Nagel's weight equalization).
    """
    infos = []
    for links in search.sets:
        scales = None
        if chosen is not None:
            scales = chosen.get(_set_key(links))
            if scales is None:
                continue
        if len(links) == 1:
            (link,) = links
            s = _scale_pair(link.first.layer, link.second.layer, link,
                            None if scales is None else scales[0])
            info = ClsSetInfo(ClsSetInfo.ClsSetLayerPairInfo(*link.layers, s, link.relu))
        else:
            l1, l2 = links
            s12, s23 = _scale_triplet(l1.first.layer, l1.second.layer, l2.second.layer, l1, l2,
                                      scales)
            info = ClsSetInfo(
                ClsSetInfo.ClsSetLayerPairInfo(*l1.layers, s12, l1.relu),
                ClsSetInfo.ClsSetLayerPairInfo(*l2.layers, s23, l2.relu),
            )
        for pair_info, link in zip(info.cls_pair_info_list, links):
            pair_info._link = link
        infos.append(info)
    return infos


# ---------------------------------------------------------------------------- high-bias fold


@dataclasses.dataclass
class BiasAbsorption:
    """One pair considered by high-bias folding.

    Attributes:
        layer1, layer2: layer names.
        absorbed: True if a shift moved from layer1's bias into layer2's.
        channels: number of channels with a non-zero shift.
        max_shift: largest per-channel shift ``c``.
        reason: why nothing was absorbed (empty when ``absorbed``).
    """

    layer1: str
    layer2: str
    absorbed: bool
    channels: int = 0
    max_shift: float = 0.0
    reason: str = ""


def _bn_lookup(bn_layers):
    if isinstance(bn_layers, dict):
        items = bn_layers.items()
    else:  # e.g. the FoldedPairs list of fold_all_batch_norms: keep backward folds only
        items = [tuple(p) for p in bn_layers if getattr(p, "bn_after", True)]
    by_id, by_name = {}, {}
    for key, bn in items:
        if isinstance(key, str):
            by_name[key] = bn
        else:
            by_id[id(key)] = bn
    return lambda layer: by_id.get(id(layer), by_name.get(layer.name))


def _local_link(layer1, layer2):
    """``(link, reason)``: the path between two layers found from their own Keras nodes (for
    pair infos built by hand)."""
    view = local_view([layer1])
    calls = view.layer_calls(layer1)
    if len(calls) != 1:
        return None, f"'{layer1.name}' is called {len(calls)} times"
    link, reason = walk(view, calls[0], "inplace")
    if link is not None and link.second.layer is not layer2:
        return None, f"'{layer1.name}' does not feed '{layer2.name}' directly"
    return link, reason


def _padding_reason(layer2, link):
    if link is not None and link.zero_padding:
        return f"a ZeroPadding between the layers pads the shifted activation of '{layer2.name}'"
    layout = layout_of(layer2)
    if layout.kind == "dense":
        return None
    kernel = getattr(layer2, "kernel_size", (1,))
    if getattr(layer2, "padding", "valid") != "valid" and any(k > 1 for k in kernel):
        return (
            f"'{layer2.name}' zero-pads its input (padding='{layer2.padding}', "
            f"kernel {tuple(kernel)}): the border would see 0 instead of -c"
        )
    return None


def _absorb(info, bn, margin, absorb_padded):
    layer1, layer2 = info.layer1, info.layer2
    record = BiasAbsorption(layer1.name, layer2.name, False)
    layout2 = layout_of(layer2)
    link = info._link
    if link is None:
        link, reason = _local_link(layer1, layer2)
        if link is None:
            record.reason = f"the path between cannot take a shift: {reason}"
            return record
    if layout2.kind == "transpose":
        record.reason = f"'{layer2.name}' is a transposed convolution: a shift is not exact there"
        return record
    if link.second is not None:
        wrong = bias_on_wrong_axis(layer2, link.second.outputs[0].shape)
        if wrong:
            record.reason = wrong
            return record
    if not (layer1.use_bias and layer2.use_bias):
        record.reason = f"'{(layer2 if layer1.use_bias else layer1).name}' has no bias"
        return record
    if not absorb_padded:
        reason = _padding_reason(layer2, link)
        if reason:
            record.reason = reason
            return record
    s = np.asarray(info.scale_factor, dtype=np.float64)
    gamma, beta, _, _ = _bnf._bn_arrays(bn)
    n = s.shape[0]
    gamma = np.ones(n) if gamma is None else gamma.astype(np.float64)
    beta = np.zeros(n) if beta is None else beta.astype(np.float64)
    if gamma.shape[0] != n:
        record.reason = f"BN '{bn.name}' has {gamma.shape[0]} channels, the set {n}"
        return record
    c = _cls_math.relu_shift(beta / s, gamma / s, margin, info.relu_activation_between_layers)
    caps = link.caps if link is not None else []
    for cap_call in caps:
        c = np.minimum(c, np.maximum(_get(cap_call.layer, "caps"), 0.0))
    if not np.any(c != 0):
        record.reason = (
            f"no channel has beta - {margin:g}*|gamma| > 0"
            if info.relu_activation_between_layers else "beta is 0 on every channel"
        )
        return record
    for cap_call in caps:
        _set(cap_call.layer, "caps", _get(cap_call.layer, "caps") - c)
    _set(layer1, "bias", _get(layer1, "bias") - c)
    if layout2.kind == "separable":
        dw_shift = _cls_math.constant_input_response(
            _get(layer2, "depthwise_kernel"), c, "depthwise")
        shift = _cls_math.constant_input_response(_get(layer2, "pointwise_kernel"), dw_shift)
    else:
        attr, _, kind, groups = in_spec(layer2)
        kind = {"grouped_in": "grouped"}.get(kind, kind)
        if layout2.kind == "depthwise":
            kind = "depthwise"
        shift = _cls_math.constant_input_response(_get(layer2, attr), c, kind, groups)
    _set(layer2, "bias", _get(layer2, "bias") + shift)
    record.absorbed = True
    record.channels = int(np.count_nonzero(c))
    record.max_shift = float(np.max(np.abs(c))) if c.size else 0.0
    return record


class HighBiasFold:
    """High-bias folding, in place (AIMET's API)."""

    @staticmethod
    def bias_fold(cls_set_info_list, bn_layers, margin=3.0, absorb_into_padded=False):
        """Move large biases from each set's layer1 into layer2 (Nagel et al. 2019, §4.1).

        For each pair whose ``layer1`` absorbed a BN **backward** (``bn_layers[layer1]``), with
        that BN's γ, β divided by the pair's scale factor: ``c = max(0, β̂ − margin·|γ̂|)`` if a
        ReLU-like activation lies between, else ``c = β̂``; ``b1 −= c``, ``b2 += Σ W2·c``. A
        :class:`ClippedReLU` cap on the path drops by ``c``. BNs folded forward must never be
        passed: their statistics do not describe layer1's output.

        Args:
            cls_set_info_list: from ``CrossLayerScaling.scale_model`` or
                ``create_cls_set_info_list``.
            bn_layers: ``{layer1: bn}`` (layer objects or names as keys), or the
                ``folded_pairs`` list of :func:`cle.fold_all_batch_norms` as it is (its forward
                folds are left out).
            margin: the 3σ margin (pre-activations below ``c`` make the shift inexact).
            absorb_into_padded: also absorb into a layer that zero-pads its input (the
                textbook behaviour: inexact at the borders). Default False: such pairs are
                skipped with the reason.

        Returns:
            list of :class:`BiasAbsorption`, one per pair considered.
        """
        lookup = _bn_lookup(bn_layers)
        records = []
        for info in cls_set_info_list:
            for pair in info.cls_pair_info_list:
                bn = lookup(pair.layer1)
                if bn is None:
                    continue
                rec = _absorb(pair, bn, margin, absorb_into_padded)
                if not rec.absorbed:
                    logger.info("no bias absorbed from '%s' into '%s': %s",
                                rec.layer1, rec.layer2, rec.reason)
                records.append(rec)
        return records


# ---------------------------------------------------------------------------- equalize_model


def _group_reasons(items, layer_names=()) -> list[tuple[str, str, int, str]]:
    """``(what, name, reason)`` items grouped by reason, names of layers masked as ``'…'``.

    Returns:
        ``(what, reason, count, example)`` sorted by what and falling count; ``example`` is the
        first name with that reason.
    """
    names = set(layer_names) | {name for _, name, _ in items}

    def mask(reason):
        return re.sub(r"'([^']*)'",
                      lambda m: "'…'" if m.group(1) in names else m.group(0), reason)

    groups: dict[tuple[str, str], list[str]] = {}
    for what, name, reason in items:
        groups.setdefault((what, mask(reason)), []).append(name)
    rows = [(what, reason, len(who), who[0]) for (what, reason), who in groups.items()]
    return sorted(rows, key=lambda r: (r[0], -r[2], r[1]))


@dataclasses.dataclass
class EqualizationReport:
    """What :func:`equalize_model` did.

    Attributes:
        folded: :class:`cle.FoldedPair` list (layers of the new model, BNs of the input).
        fold_skipped: BNs left in place, with reasons.
        relu6: the ReLU6 mode.
        relu6_changed: names of the ReLU6 activations replaced or bounded.
        sets: :class:`ClsSetInfo` of every scaled set (layers of the new model).
        set_ends: ``(layer name, reason)`` for every scalable layer where no set starts.
        bias_absorptions: :class:`BiasAbsorption` records of high-bias folding.
        bias_corrections: per-layer records of bias correction.
        scaling: one ``ScalingDecision`` per set found: scaled or left as it is (with the
            reason), and for ``objective="quantized"`` the modelled INT8 noise and the
            activation range before and after.
        objective: how the scales were chosen ("quantized" or "weights").
    """

    folded: list
    fold_skipped: list
    relu6: str
    relu6_changed: list[str]
    sets: list[ClsSetInfo]
    set_ends: list[tuple[str, str]]
    bias_absorptions: list[BiasAbsorption]
    bias_corrections: list = dataclasses.field(default_factory=list)
    scaling: list = dataclasses.field(default_factory=list)
    objective: str = "weights"
    # Names of the input model's layers, operations and sub-models, to group reasons in
    # summary().
    layer_names: frozenset = dataclasses.field(default_factory=frozenset, repr=False)

    def reasons(self) -> list[tuple[str, str, int, str]]:
        """Set ends and fold skips grouped by reason, layer names masked as ``'…'``.

        Returns:
            ``(what, reason, count, example)`` sorted by what ("bn skip" / "set end" /
            "set kept": a set found but left unscaled by ``objective="quantized"``) and
            falling count; ``example`` is the first layer (or BN) with that reason.
        """
        items = [("set end", name, reason) for name, reason in self.set_ends]
        items += [("bn skip", s.bn.name, s.reason) for s in self.fold_skipped]
        items += [("set kept", d.layers[0], d.reason) for d in self.scaling if not d.scaled]
        return _group_reasons(items, self.layer_names)

    def summary(self) -> str:
        """Counts, and one line per distinct reason (not per layer) for what was left out."""
        n_pairs = sum(len(s.cls_pair_info_list) == 1 for s in self.sets)
        lines = [
            f"batch norms folded: {len(self.folded)}, skipped: {len(self.fold_skipped)}",
            f"scaled sets: {len(self.sets)} ({n_pairs} pairs, {len(self.sets) - n_pairs} "
            "triplets)",
        ]
        for what, reason, count, example in self.reasons():
            lines.append(f"  {what} ×{count}: {reason} (e.g. '{example}')")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        def rng(a):
            a = np.asarray(a)
            return [float(a.min()), float(a.max())] if a.size else [1.0, 1.0]

        return {
            "folded": [
                {"layer": p.layer.name, "bn": p.bn.name, "bn_after": p.bn_after}
                for p in self.folded
            ],
            "fold_skipped": [{"bn": s.bn.name, "reason": s.reason} for s in self.fold_skipped],
            "relu6": self.relu6,
            "relu6_changed": list(self.relu6_changed),
            "sets": [
                [
                    {"layer1": p.layer1.name, "layer2": p.layer2.name,
                     "scale_range": rng(p.scale_factor),
                     "relu_between": p.relu_activation_between_layers}
                    for p in info.cls_pair_info_list
                ]
                for info in self.sets
            ],
            "set_ends": [{"layer": n, "reason": r} for n, r in self.set_ends],
            "bias_absorptions": [dataclasses.asdict(r) for r in self.bias_absorptions],
            "bias_corrections": [dataclasses.asdict(r) for r in self.bias_corrections],
            "objective": self.objective,
            "scaling": [d.to_dict() for d in self.scaling],
        }

    def __str__(self):
        n_pairs = sum(len(s.cls_pair_info_list) == 1 for s in self.sets)
        n_trip = len(self.sets) - n_pairs
        absorbed = [r for r in self.bias_absorptions if r.absorbed]
        lines = [
            f"batch norms folded: {len(self.folded)}, skipped: {len(self.fold_skipped)}",
            f"ReLU6 ({self.relu6}): {len(self.relu6_changed)} changed",
            f"scaled sets: {len(self.sets)} ({n_pairs} pairs, {n_trip} triplets; "
            f"objective {self.objective!r}"
            + (f", {sum(not d.scaled for d in self.scaling)} left as they are)"
               if any(not d.scaled for d in self.scaling) else ")"),
            f"high-bias folding: {len(absorbed)} absorbed, "
            f"{len(self.bias_absorptions) - len(absorbed)} skipped",
        ]
        if self.bias_corrections:
            done = [r for r in self.bias_corrections if r.corrected]
            lines.append(f"bias correction: {len(done)} layers corrected, "
                         f"{len(self.bias_corrections) - len(done)} skipped")
        for info in self.sets:
            parts = [
                f"{p.layer1.name} -> {p.layer2.name} "
                f"[{np.min(p.scale_factor):.3g}, {np.max(p.scale_factor):.3g}]"
                for p in info.cls_pair_info_list
            ]
            lines.append("  set  " + " ; ".join(parts))
        for d in self.scaling:
            if d.scaled and d.noise_before is not None:
                lines.append(f"  cls  {d}")
            elif not d.scaled:
                lines.append(f"  keep {d}")
        for name, reason in self.set_ends:
            lines.append(f"  end  {name}: {reason}")
        for s in self.fold_skipped:
            lines.append(f"  bn   {s.bn.name}: {s.reason}")
        for r in self.bias_corrections:
            lines.append(f"  bc   {r}")
        for r in self.bias_absorptions:
            if r.absorbed:
                lines.append(f"  hbf  {r.layer1} -> {r.layer2}: {r.channels} channels, "
                             f"max shift {r.max_shift:.3g}")
            else:
                lines.append(f"  hbf  {r.layer1} -> {r.layer2}: skipped, {r.reason}")
        return "\n".join(lines)


def _target(weight_bits, per_channel_weights, activation_bits):
    for name, bits in (("weight_bits", weight_bits), ("activation_bits", activation_bits)):
        if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 2 <= bits <= 16:
            raise ValueError(f"{name} must be an integer in [2, 16]. Received: {name}={bits!r}")
    if not isinstance(per_channel_weights, (bool, np.bool_)):
        raise ValueError(
            f"per_channel_weights must be a bool. Received: per_channel_weights={per_channel_weights!r}")
    return _qnoise.QuantTarget(bool(per_channel_weights), int(weight_bits), int(activation_bits))


def _gamma_beta(bn):
    """``(γ, β)`` of a BN as float64 arrays (1 and 0 where the BN has none)."""
    gamma, beta, mean, _ = _bnf._bn_arrays(bn)
    n = mean.shape[0]
    return (np.ones(n) if gamma is None else gamma.astype(np.float64),
            np.zeros(n) if beta is None else beta.astype(np.float64))


class _WeightReader:
    """``reader(layer, attr)``: the weight a layer has, or will have after ``edits``.

    An edit's values are computed on demand (float64, one layer at a time) and cached only for
    the layers passed to :meth:`keep`, so planning never holds every folded kernel at once.
    """

    def __init__(self, edits=None):
        self.edits = edits or {}
        self.cache: dict[int, dict] = {}

    def keep(self, layer_ids):
        self.cache = {k: v for k, v in self.cache.items() if k in layer_ids}

    def __call__(self, layer, attr):
        edit = self.edits.get(id(layer))
        if edit is not None and edit.sets_weights:
            values = self.cache.get(id(layer))
            if values is None:
                values = self.cache[id(layer)] = edit.new_values()
            if attr in values:
                return values[attr]
        if attr == "bias" and not getattr(layer, "use_bias", False):
            return None
        return read_weight(getattr(layer, attr))


def _pre_activation(link, folded_bns):
    """The top-level layer whose output is the pre-activation of a link's junction (the last
    BN that will be folded into layer1, else layer1 itself), or None if it is nested."""
    t = link.first.outputs[0]
    while len(t.consumers) == 1 and id(t.consumers[0].layer) in folded_bns:
        t = t.consumers[0].outputs[0]
    call = t.producer
    return call.layer if not call.scope and len(call.outputs) == 1 else None


def _measure_junctions(model, plan, matches, data, value, progress):
    """``{id(link.first): Junction}`` measured on ``data`` for every link of the plan whose
    pre-activation is a top-level tensor; one streaming pass over the data."""
    from cle._calibration import check_calibration_data

    folded = {id(m.bn_call.layer) for m in matches}
    links = [link for links in plan.sets for link in links]
    targets = [(link, _pre_activation(link, folded)) for link in links]
    targets = [(link, layer) for link, layer in targets if layer is not None]
    if not targets:
        return {}
    probe = keras.Model(model.inputs, [layer.output for _, layer in targets])
    stats = [_qnoise.SampleStats(*_scale_choice.junction_kind(link, value)) for link, _ in targets]
    # Small batches: the probe returns every junction's whole activation at once.
    x = check_calibration_data(model, data)
    batches = [x[i: i + 8] for i in range(0, len(x), 8)]
    for b, batch in enumerate(batches):
        if progress is not None:
            progress(f"activation ranges: batch {b + 1}/{len(batches)}")
        outs = probe([batch] if len(model.inputs) == 1 else batch, training=False)
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        for (link, _), st, out in zip(targets, stats, outs):
            out = keras.ops.convert_to_numpy(out)
            axis = channel_axis(link.first.layer, out.ndim)
            st.update(np.moveaxis(out, axis, -1).reshape(-1, out.shape[axis]))
    return {id(link.first): st.junction() for (link, _), st in zip(targets, stats)}


def _decide_sets(plan, matches, edits, target, model=None, data=None, progress=None):
    """One :class:`ScalingDecision` per planned set, from the weights the fold will give and
    activation statistics from the BNs (or measured on ``data``)."""
    bn_stats = {id(m.target.layer): _gamma_beta(m.bn_call.layer) for m in matches if m.bn_after}
    folded = _WeightReader(edits)
    measured = None
    if data is not None:
        measured = _measure_junctions(model, plan, matches, data, folded, progress)
    # Sets are decided in graph order on the weights as the earlier sets leave them (a layer
    # can end one set and start the next), as in-place scaling will then apply them.
    scaled = {}

    def value(layer, attr):
        got = scaled.get((id(layer), attr))
        return folded(layer, attr) if got is None else got

    layers_of = [tuple(link.first.layer for link in links) + (links[-1].second.layer,)
                 for links in plan.sets]
    last_set = {id(la): i for i, layers in enumerate(layers_of) for la in layers}
    decisions = []
    for i, links in enumerate(plan.sets):
        # Only this set's layers keep their computed values; a scaled weight is kept until
        # the last set that reads it (per-layer temporaries, never the whole model).
        folded.keep({id(la) for la in layers_of[i]})
        d = _scale_choice.decide_set(links, value, bn_stats, target, measured)
        if d.scaled:
            scaled.update(_scale_choice.scaled_weights(layers_of[i], d.scales, value))
        for key in [key for key in scaled if last_set[key[0]] <= i]:
            del scaled[key]
        decisions.append(d)
    return decisions


def equalize_model(model, relu6="bound", high_bias_fold="none", margin=3.0,
                   return_report=False, bias_correction="none", calibration_data=None,
                   weight_bits=8, per_channel_weights=True, objective="quantized",
                   activation_bits=8, activation_ranges="bn", progress=None):
    """Run the data-free equalization pipeline and return a new model.

    Batch-norm folding, ReLU6 handling, cross-layer scaling and high-bias folding, with the new
    model built once. ``model`` is not modified.

    Args:
        model: a Functional or Sequential ``keras.Model``.
        relu6: "bound" (default): scale across ReLU6 exactly, turning each ReLU6 inside a set
            into a :class:`ClippedReLU` with per-channel caps ``6/s`` — the float output does not
            change. "replace": ReLU6 → ReLU first (Nagel / AIMET-Keras; changes the output).
            "keep": ReLU6 stays and ends a set.
        high_bias_fold: "none" (default): no high-bias folding. Measured on the real ImageNet
            MobileNetV2 (the generated int8-modes table of docs/cross_layer_equalization.md),
            it costs float accuracy without improving per-tensor INT8, so it is off unless
            asked for.
            "unpadded": absorb only into layers that see no zero padding (padding borders
            would see 0 instead of −c); "all": the textbook behaviour, into every layer.
        margin: the 3σ margin of high-bias folding.
        return_report: also return an :class:`EqualizationReport`.
        bias_correction: "none" (default), "analytic" (data-free: expected inputs from the
            folded BNs' γ, β divided by the scale factors) or "empirical" (needs
            ``calibration_data``): finish with :func:`cle.correct_bias` for the weight
            quantizer given by ``weight_bits`` / ``per_channel_weights``. The float model then
            changes slightly on purpose (it is corrected for its quantized weights).
        calibration_data: inputs (array, iterable of batches or ``tf.data.Dataset``) for
            ``bias_correction="empirical"`` and ``activation_ranges="calibration"``.
        weight_bits: bits of the weight quantizer that will run. With
            ``per_channel_weights`` and ``activation_bits`` it is the INT8 target (default:
            TFLite's default full-INT8 flow, 8-bit per-channel weights and 8-bit per-tensor
            activations). Scaling (``objective="quantized"``) and bias correction are chosen
            for it.
        per_channel_weights: per-channel (True, default) or per-tensor weight quantizer.
        activation_bits: bits of the activation quantizer (per-tensor).
        objective: "quantized" (default): choose each set's scales to lower the modelled
            quantization noise of the weights on both sides of every junction *and* of the
            activation tensors between them, for the target above; activation ranges come from
            the folded BNs' γ, β (data-free). A set whose modelled noise would not drop by at
            least the margin ``cle._qnoise.MIN_GAIN_DB`` (what the model can resolve:
            docs/quantization_aware_scaling.md) is left as it is (its ReLU6 stays fused), with
            the reason in the report.
            "weights": Nagel's / AIMET's weight-range equalization of every set.
        activation_ranges: where ``objective="quantized"`` takes each junction's activation
            statistics: "bn" (default, data-free: the folded BNs' γ, β with a heavy-tailed
            range model) or "calibration" (measured on ``calibration_data`` in one pass: the
            per-channel max, as TFLite's calibration takes it, and the moments).
        progress: optional ``callable(str)``: measuring activation ranges on calibration data
            reports each batch through it, and :func:`cle.correct_bias` (empirical) each layer.

    Returns:
        The new model, or ``(new_model, report)`` with ``return_report=True``.

    Raises:
        TypeError: ``model`` is not a ``keras.Model``.
        ValueError: an unknown option, or the graph of ``model`` cannot be read.

    Example:
        >>> equalized, report = cle.equalize_model(model, return_report=True)
        >>> print(report)
    """
    if relu6 not in _RELU6_MODES:
        raise ValueError(f"relu6 must be one of {_RELU6_MODES}. Received: relu6={relu6!r}")
    if high_bias_fold not in _HBF_MODES:
        raise ValueError(
            f"high_bias_fold must be one of {_HBF_MODES}. Received: high_bias_fold={high_bias_fold!r}"
        )
    if bias_correction not in ("none", "analytic", "empirical"):
        raise ValueError(
            "bias_correction must be one of ('none', 'analytic', 'empirical'). "
            f"Received: bias_correction={bias_correction!r}"
        )
    if activation_ranges not in ("bn", "calibration"):
        raise ValueError("activation_ranges must be one of ('bn', 'calibration'). "
                         f"Received: activation_ranges={activation_ranges!r}")
    wants_data = bias_correction == "empirical" or activation_ranges == "calibration"
    if wants_data != (calibration_data is not None):
        raise ValueError(
            "calibration_data is needed for, and only for, bias_correction='empirical' or "
            f"activation_ranges='calibration'. Received: bias_correction={bias_correction!r}, "
            f"activation_ranges={activation_ranges!r}, calibration_data="
            f"{'None' if calibration_data is None else type(calibration_data).__name__}"
        )
    if not float(margin) >= 0:
        raise ValueError(f"margin must be >= 0. Received: margin={margin!r}")
    if objective not in _OBJECTIVES:
        raise ValueError(f"objective must be one of {_OBJECTIVES}. Received: objective={objective!r}")
    target = _target(weight_bits, per_channel_weights, activation_bits)
    view = graph_view(model)
    if wants_data:  # refuse before any work a model this backend cannot run here
        check_runnable(model, "bias_correction='empirical'" if bias_correction == "empirical"
                       else "activation_ranges='calibration'")
    matches, fold_skipped = _bnf._find(view)
    edits, bypass = _bnf.fold_plan(matches)
    changed = []
    # Plan the sets on the input model as they will be after folding and ReLU6 handling.
    plan = find_sets(view, relu6, transparent={id(m.bn_call.layer) for m in matches})
    decisions, to_scale = None, plan.sets
    if objective == "quantized":
        # Choose every set's scales now, from the weights the fold will give: a set left
        # unscaled then keeps its (fused) ReLU6 rather than a ClippedReLU.
        decisions = _decide_sets(
            plan, matches, edits, target, model,
            calibration_data if activation_ranges == "calibration" else None, progress)
        to_scale = [links for links, d in zip(plan.sets, decisions) if d.scaled]
    if relu6 == "replace":
        targets = _all_relu6(view)
    elif relu6 == "bound":
        on_links = set()
        for links in to_scale:
            for link in links:
                on_links.update(id(c.layer) for c in link.caps)
                if link.fused_cap:
                    on_links.add(id(link.first.layer))
        targets = [t for t in _all_relu6(view) if id(t[0]) in on_links]
    else:
        targets = []
    for layer, kind, axis in targets:
        _merge(edits, id(layer), _relu6_edit(layer, kind, relu6, axis))
        changed.append(layer.name if kind == "standalone" else f"{layer.name} (fused activation)")
    new_model, clones = rebuild(model, edits=edits, bypass=bypass)
    search = find_sets(graph_view(new_model), "inplace")
    for call, reason in plan.ends:
        logger.info("no scaling set starts at '%s': %s", call.layer.name, reason)
    chosen = None
    if objective == "weights":
        if [len(s) for s in search.sets] != [len(s) for s in plan.sets]:
            raise RuntimeError(  # the plan and the rebuilt model must agree
                f"internal error: planned {len(plan.sets)} scaling sets, found {len(search.sets)}"
            )
    else:
        chosen = {d.layers: d.scales for d in decisions if d.scaled}
        missing = set(chosen) - {_set_key(links) for links in search.sets}
        if missing:  # the plan and the rebuilt model must agree
            raise RuntimeError(f"internal error: planned sets not found after rebuild: {missing}")
        for d in decisions:
            if not d.scaled:
                logger.info("scaling set %s left as it is: %s", d.layers, d.reason)
    infos = _scale_search(search, chosen)
    if decisions is None:
        decisions = [
            _scale_choice.ScalingDecision(
                tuple(p.layer1.name for p in info.cls_pair_info_list)
                + (info.cls_pair_info_list[-1].layer2.name,), True, "weights")
            for info in infos
        ]
    absorptions = []
    if high_bias_fold != "none":
        bn_layers = {
            clones[id(m.target.layer)]: m.bn_call.layer for m in matches if m.bn_after
        }
        absorptions = HighBiasFold.bias_fold(
            infos, bn_layers, margin=margin, absorb_into_padded=high_bias_fold == "all"
        )
    folded = [
        _bnf.FoldedPair(clones[id(m.target.layer)], m.bn_call.layer, m.bn_after) for m in matches
    ]
    corrections, by_name = [], None
    if bias_correction != "none":
        from cle import bias_correction as _bc

        stats = None
        if bias_correction == "analytic":
            stats = _bc.bn_stats_from_report(
                EqualizationReport(folded, [], relu6, [], infos, [], absorptions))
        # new_model is private here: corrected in place unless a layer needs a bias added.
        corrected, corrections = _bc._correct_bias(
            new_model, bn_stats=stats, calibration_data=calibration_data, bits=weight_bits,
            per_channel=per_channel_weights, progress=progress, return_report=True,
            in_place=True)
        if corrected is not new_model:
            new_model = corrected
            # Point the report at the layers of the model that is returned.
            by_name = {la.name: la for la in new_model._flatten_layers()}
    if by_name is not None:
        folded = [_bnf.FoldedPair(by_name[p.layer.name], p.bn, p.bn_after) for p in folded]
        for info in infos:
            for pair in info.cls_pair_info_list:
                pair.layer1, pair.layer2 = by_name[pair.layer1.name], by_name[pair.layer2.name]
                pair._link = None
    if not return_report:
        return new_model
    report = EqualizationReport(
        folded=folded,
        fold_skipped=fold_skipped,
        relu6=relu6,
        relu6_changed=changed,
        sets=infos,
        set_ends=[(c.layer.name, r) for c, r in plan.ends],
        bias_absorptions=absorptions,
        bias_corrections=corrections,
        scaling=decisions,
        objective=objective,
        layer_names=frozenset(n for c in view.calls for n in c.scope + (c.layer.name,)),
    )
    return new_model, report
