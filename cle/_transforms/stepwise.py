"""The AIMET-style stepwise API, in place on the layers it is given (as AIMET's is):
:class:`ClsSetInfo`, :class:`CrossLayerScaling`, :class:`HighBiasFold`.

The weight math is :mod:`cle._transforms.scaling`'s, the same the planner of :func:`cle.equalize_model`
uses; here it reads and assigns live variables.
"""

from __future__ import annotations

import logging

import keras
import numpy as np

from cle._transforms import scale_choice
from cle._transforms import scaling as _scaling
from cle._transforms.sets import Link, SetSearch, find_sets, walk
from cle._core.graph import GraphView, graph_view, local_view
from cle._core.layouts import layout_of, read_weight
from cle._transforms.options import OBJECTIVES, check_choice, quant_target
from cle._transforms.scaling import BiasAbsorption
from cle._core.weights import gamma_beta

__all__ = ["BiasAbsorption", "ClsSetInfo", "CrossLayerScaling", "HighBiasFold", "scale_search",
           "set_info", "set_key"]

logger = logging.getLogger("cle.cross_layer_equalization")


def read(layer, attr):
    """The live value of a layer's weight (None for the bias of a layer without one)."""
    if attr == "bias" and not getattr(layer, "use_bias", False):
        return None
    return read_weight(getattr(layer, attr))


def _assign(layer, attr, value):
    var = getattr(layer, attr)
    var.assign(np.asarray(value, dtype=var.dtype))


def _has_bias(layer):
    return bool(getattr(layer, "use_bias", False))


def scale_in_place(layers, links, scales=None):
    """Scale a set in place by ``scales`` (default: Nagel's weight equalization); returns the
    scales, one array per junction."""
    if scales is None:
        scales = _scaling.nagel_scales(layers, read)
    for f in _scaling.set_factors(layers, scales, links, _has_bias):
        _assign(f.layer, f.attr, _scaling.apply(read(f.layer, f.attr), f))
    return list(scales)


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
            scales = scale_in_place(layers, links)
            out.append(scales[0] if len(layers) == 2 else tuple(scales))
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
                least the margin ``cle._math.noise.MIN_GAIN_DB`` are left as they are (logged at
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
        check_choice("objective", objective, OBJECTIVES)
        target = quant_target(weight_bits, per_channel_weights, activation_bits)
        if objective == "quantized" and folded_pairs is None:
            raise ValueError(
                "objective='quantized' needs folded_pairs (from cle.fold_all_batch_norms) for "
                "the activation statistics. Received: folded_pairs=None")
        search = find_sets(graph_view(model), "inplace")
        for call, reason in search.ends:
            logger.info("no scaling set starts at '%s': %s", call.layer.name, reason)
        if objective == "weights":
            return scale_search(search)
        bn_stats = {id(p.layer): gamma_beta(p.bn) for p in folded_pairs if p.bn_after}
        infos = []
        for links in search.sets:  # in place, set by set: each sees the previous ones' result
            d = scale_choice.decide_set(links, read, bn_stats, target)
            if d.scaled:
                infos += scale_search(SetSearch([links], []), {d.layers: d.scales})
            else:
                logger.info("scaling set %s left as it is: %s", d.layers, d.reason)
        return infos


def set_key(links):
    return tuple(link.first.layer.name for link in links) + (links[-1].second.layer.name,)


def set_info(links, scales, layers=None):
    """The :class:`ClsSetInfo` of a set scaled by ``scales`` (``layers``: the layers to name,
    default the links' own)."""
    layers = layers or [la for link in links for la in link.layers[:1]] + [links[-1].second.layer]
    return ClsSetInfo(*[
        ClsSetInfo.ClsSetLayerPairInfo(layers[i], layers[i + 1], s, link.relu)
        for i, (link, s) in enumerate(zip(links, scales))
    ])


def scale_search(search, chosen=None):
    """Scale the sets of a search in place; one ClsSetInfo per scaled set.

    ``chosen``: ``{set key: [scales per junction]}``; when given, only those sets are scaled,
    with those scales (else every set, with Nagel's weight equalization).
    """
    infos = []
    for links in search.sets:
        scales = None
        if chosen is not None:
            scales = chosen.get(set_key(links))
            if scales is None:
                continue
        layers = tuple(link.first.layer for link in links) + (links[-1].second.layer,)
        info = set_info(links, scale_in_place(layers, links, scales))
        for pair_info, link in zip(info.cls_pair_info_list, links):
            pair_info._link = link
        infos.append(info)
    return infos


# ---------------------------------------------------------------------------- high-bias fold


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


def _absorb(info, bn, margin, absorb_padded):
    layer1, layer2 = info.layer1, info.layer2
    link = info._link
    if link is None:
        link, reason = _local_link(layer1, layer2)
        if link is None:
            return BiasAbsorption(layer1.name, layer2.name, False,
                                  reason=f"the path between cannot take a shift: {reason}"), []
    return _scaling.absorb(layer1, layer2, info.scale_factor, info.relu_activation_between_layers,
                           link, (bn.name, *gamma_beta(bn)), margin, absorb_padded, read)


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
                rec, updates = _absorb(pair, bn, margin, absorb_into_padded)
                for layer, attr, value in updates:
                    _assign(layer, attr, value)
                if not rec.absorbed:
                    logger.info("no bias absorbed from '%s' into '%s': %s",
                                rec.layer1, rec.layer2, rec.reason)
                records.append(rec)
        return records
