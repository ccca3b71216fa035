"""The implementation behind :mod:`cle.batch_norm_fold` (its public face, where the API is documented)."""

from __future__ import annotations

import dataclasses
import logging

import keras

from cle._core.backend import warn_fused_leaky_relu
from cle._core.graph import Call, GraphView, graph_view
from cle._transforms.bn_match import (
    Match, SkippedBatchNorm, check_backward, check_bn, check_forward, find_matches, fold_plan)
from cle._core.rebuild import rebuild
from cle._core.weights import quote

__all__ = [
    "BatchNormFoldReport",
    "FoldedPair",
    "FoldedPairs",
    "SkippedBatchNorm",
    "find_foldable_batch_norms",
    "fold_all_batch_norms",
    "fold_given_batch_norms",
]

logger = logging.getLogger("cle.batch_norm_fold")

_BN = keras.layers.BatchNormalization


class FoldedPair(tuple):
    """A ``(layer, bn)`` pair that unpacks as a pair and records the fold direction.

    Attributes:
        layer: the layer that absorbed the BN.
        bn: the BatchNormalization layer (of the input model, parameters untouched).
        bn_after: True if the BN followed the layer (backward fold, usable by high-bias
            folding), False if it preceded it (forward fold).
    """

    def __new__(cls, layer, bn, bn_after=True):
        pair = super().__new__(cls, (layer, bn))
        pair.bn_after = bool(bn_after)
        return pair

    def __getnewargs__(self):
        return (self[0], self[1], self.bn_after)

    @property
    def layer(self):
        return self[0]

    @property
    def bn(self):
        return self[1]

    def __repr__(self):
        arrow = "->" if self.bn_after else "<-"
        return f"FoldedPair({self[0].name!r} {arrow} {self[1].name!r})"


class FoldedPairs(list):
    """List of :class:`FoldedPair` in graph order, with ``.skipped`` (list of
    :class:`SkippedBatchNorm`) for every BatchNormalization that was left in place."""

    def __init__(self, pairs=(), skipped=()):
        super().__init__(pairs)
        self.skipped = list(skipped)


@dataclasses.dataclass
class BatchNormFoldReport:
    """What :func:`find_foldable_batch_norms` found, without changing anything.

    Attributes:
        folds: :class:`FoldedPair` of layers of the inspected model, in graph order.
        skipped: :class:`SkippedBatchNorm` for every other BatchNormalization.
    """

    folds: list[FoldedPair]
    skipped: list[SkippedBatchNorm]

    def __str__(self):
        lines = [f"{len(self.folds)} batch norms can be folded, {len(self.skipped)} skipped"]
        lines += [f"  fold {p!r}" for p in self.folds]
        lines += [f"  skip {s}" for s in self.skipped]
        return "\n".join(lines)


def _apply(model, matches: list[Match]):
    edits, bypass = fold_plan(matches)
    new_model, clones = rebuild(model, edits=edits, bypass=bypass)
    warn_fused_leaky_relu(model, new_model)
    return new_model, clones


def _log(matches, skipped, model):
    for s in skipped:
        logger.info("BatchNormalization '%s' not folded: %s", s.bn.name, s.reason)
    logger.info(
        "model '%s': %d batch norms folded, %d skipped", model.name, len(matches), len(skipped)
    )


# ---------------------------------------------------------------------------- public API


def find_foldable_batch_norms(model) -> BatchNormFoldReport:
    """Report which BatchNormalization layers of ``model`` can be folded, and why not.

    Nothing is changed. The pairs name layers of ``model`` itself.

    Args:
        model: a Functional or Sequential ``keras.Model``.

    Returns:
        A :class:`BatchNormFoldReport`.

    Raises:
        TypeError: ``model`` is not a ``keras.Model``.
        ValueError: the graph of ``model`` cannot be read (subclassed model).

    Example:
        >>> report = cle.find_foldable_batch_norms(model)
        >>> for skip in report.skipped:
        ...     print(skip.bn.name, skip.reason)
    """
    view = graph_view(model)
    matches, skipped = find_matches(view)
    folds = [FoldedPair(m.target.layer, m.bn_call.layer, m.bn_after) for m in matches]
    return BatchNormFoldReport(folds, skipped)


def fold_all_batch_norms(model):
    """Fold every BatchNormalization of ``model`` that can be folded exactly.

    The input model is not modified. A BN is folded backward (into the layer before it)
    when possible, else forward (into the layer after it) when that is exact.

    Args:
        model: a Functional or Sequential ``keras.Model``; nested Functional/Sequential
            sub-models are seen through.

    Returns:
        ``(folded_pairs, folded_model)``. ``folded_pairs`` is a :class:`FoldedPairs` list of
        :class:`FoldedPair` ``(layer, bn)`` in graph order, where ``layer`` belongs to
        ``folded_model`` and ``bn`` is the BatchNormalization of ``model`` (untouched, so γ and
        β can still be read); ``folded_pairs.skipped`` lists every BN left in place with the
        reason. ``folded_model`` is a new, independent model without the folded BNs.

    Raises:
        TypeError: ``model`` is not a ``keras.Model``.
        ValueError: the graph of ``model`` cannot be read (subclassed model).

    Example:
        >>> pairs, folded = cle.fold_all_batch_norms(model)
        >>> [(layer.name, bn.name) for layer, bn in pairs]
        >>> for skip in pairs.skipped:
        ...     print(skip)
    """
    view = graph_view(model)
    matches, skipped = find_matches(view)
    new_model, clones = _apply(model, matches)
    _log(matches, skipped, model)
    pairs = [
        FoldedPair(clones[id(m.target.layer)], m.bn_call.layer, m.bn_after) for m in matches
    ]
    return FoldedPairs(pairs, skipped), new_model


def _resolve(view: GraphView, model, item, position: str):
    if isinstance(item, str):
        found = view.find_layer(item)
        if not found:
            raise ValueError(
                f"No layer named '{item}' in model '{model.name}'. Received: {position}={item!r}"
            )
        if len(found) > 1:
            raise ValueError(
                f"The name '{item}' is used by {len(found)} layers of model '{model.name}' "
                f"(in different sub-models); pass the layer object instead. "
                f"Received: {position}={item!r}"
            )
        return found[0]
    if not isinstance(item, keras.layers.Layer):
        raise ValueError(
            f"Expected a layer or a layer name. Received: {position}={item!r}"
        )
    if not view.layer_calls(item):
        raise ValueError(
            f"Layer '{item.name}' is not part of model '{model.name}'. "
            f"Received: {position}={item.name!r}"
        )
    return item


def _neighbours(bn_call: Call, bn_after: bool) -> list[Call]:
    """The calls right before (bn_after) or right after a BN call; a Flatten right after the
    BN is seen through, since BN -> Flatten -> Dense folds into the Dense."""
    if bn_after:
        producer = bn_call.inputs[0].producer
        return [producer] if producer is not None else []
    out = []
    for c in bn_call.outputs[0].consumers:
        out.append(c)
        if type(c.layer) is keras.layers.Flatten:
            out += c.outputs[0].consumers
    return out


def _parse_pair(view, model, pair, i):
    if not isinstance(pair, (tuple, list)) or len(pair) not in (2, 3):
        raise ValueError(
            "Each entry of layer_pairs must be (layer, bn), (layer, bn, True), (bn, layer) or "
            f"(bn, layer, False). Received: layer_pairs[{i}]={pair!r}"
        )
    a = _resolve(view, model, pair[0], f"layer_pairs[{i}][0]")
    b = _resolve(view, model, pair[1], f"layer_pairs[{i}][1]")
    if len(pair) == 3:
        if not isinstance(pair[2], bool):
            raise ValueError(
                f"The third entry of a pair must be True (BN after the layer) or False "
                f"(BN before it). Received: layer_pairs[{i}][2]={pair[2]!r}"
            )
        bn_after = pair[2]
    else:
        bn_after = isinstance(b, _BN)
    layer, bn = (a, b) if bn_after else (b, a)
    if not isinstance(bn, _BN):
        raise ValueError(
            f"In layer_pairs[{i}], '{bn.name}' ({type(bn).__name__}) is not a "
            f"BatchNormalization layer. Received: layer_pairs[{i}]=({a.name!r}, {b.name!r}"
            + (f", {pair[2]})" if len(pair) == 3 else ")")
        )
    return layer, bn, bn_after


def fold_given_batch_norms(model, layer_pairs):
    """Fold exactly the given (layer, BatchNormalization) pairs.

    Args:
        model: a Functional or Sequential ``keras.Model``.
        layer_pairs: iterable of pairs. ``(layer, bn)`` or ``(layer, bn, True)``: the BN
            follows the layer (backward fold). ``(bn, layer)`` or ``(bn, layer, False)``: the
            BN precedes the layer (forward fold). Layers are objects of ``model`` or names.

    Returns:
        A new model with those BNs folded; ``model`` is not modified.

    Raises:
        TypeError: ``model`` is not a ``keras.Model``.
        ValueError: a pair is malformed, names an unknown layer, or cannot be folded exactly
            (the message names both layers and the reason). Nothing is folded then.

    Example:
        >>> folded = cle.fold_given_batch_norms(model, [("conv1", "bn1"), ("bn0", "conv0")])
    """
    view = graph_view(model)
    matches, used = [], {}
    for i, pair in enumerate(layer_pairs):
        layer, bn, bn_after = _parse_pair(view, model, pair, i)
        if id(bn) in used:
            raise ValueError(
                f"BatchNormalization '{bn.name}' appears twice in layer_pairs "
                f"(entries {used[id(bn)]} and {i})."
            )
        used[id(bn)] = i
        bn_call = view.layer_calls(bn)[0]
        neighbours = _neighbours(bn_call, bn_after)
        match = None
        if neighbours and layer not in [c.layer for c in neighbours]:
            where, verb = ("after", "it follows") if bn_after else ("before", "its output goes to")
            reason = (
                f"'{bn.name}' is not directly {where} '{layer.name}' "
                f"({verb} {', '.join(quote(c) for c in neighbours)})"
            )
        else:
            reason = check_bn(view, bn_call)
            if not reason:
                check = check_backward if bn_after else check_forward
                match, reason = check(view, bn_call)
        if match is None:
            order = f"('{layer.name}', '{bn.name}')" if bn_after else f"('{bn.name}', '{layer.name}')"
            raise ValueError(
                f"Cannot fold BatchNormalization '{bn.name}' "
                f"{'into' if bn_after else 'forward into'} '{layer.name}': {reason}. "
                f"Received: layer_pairs[{i}]={order}"
            )
        matches.append(match)
    matches.sort(key=lambda m: m.bn_call.index)
    new_model, _ = _apply(model, matches)
    _log(matches, [], model)
    return new_model
