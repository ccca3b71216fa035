"""Batch-norm folding: stage one of the data-free quantization pipeline.

Before / after (backward fold, BN after the layer)::

    x ─► Conv(W, b) ─► BN(γ, β, μ, σ²) ─► y        x ─► Conv(W·s, s·b + t) ─► y

Before / after (forward fold, BN before the layer)::

    x ─► BN ─► Conv(W, b, padding="valid") ─► y     x ─► Conv(W·s_in, b + Σ W·t) ─► y

with ``s = γ / sqrt(σ² + ε)`` and ``t = β − μ·s`` (see :mod:`cle._fold_math`).

Conditions, checked before anything is rewritten (each failed check is a skip with a reason):

* the BN is called exactly once, in inference mode, normalizes the layer's channel axis and
  has finite statistics with ``σ² + ε > 0``;
* backward: the BN's input comes from a Conv/Depthwise/Separable/Transpose/Dense layer of
  exactly that class, called once, with a linear activation, whose output feeds only the BN
  (or from a BN already folded backward into such a layer, which feeds only this BN);
* forward (tried when backward is not possible): the BN's output feeds only a Conv,
  DepthwiseConv, SeparableConv or Dense layer (or a Flatten feeding only a Dense), called once,
  with ``padding="valid"`` and ``groups=1`` — with padding, the zeros the layer adds would
  not have been normalized, so the fold would not be exact.

Skip reasons are returned (``folded_pairs.skipped``, :func:`find_foldable_batch_norms`) and
logged at INFO level on the logger ``"cle.batch_norm_fold"``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, NamedTuple

import keras
import numpy as np

from cle import _fold_math
from cle._graph import Call, GraphView, graph_view
from cle._layouts import (
    bias_on_wrong_axis, channel_axis, layout_of, read_weight, untouchable_reason)
from cle._rebuild import LayerEdit, rebuild

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


class SkippedBatchNorm(NamedTuple):
    """A BatchNormalization that was not folded, and why."""

    bn: Any
    reason: str

    def __str__(self):
        return f"{self.bn.name}: {self.reason}"


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


@dataclasses.dataclass
class _Match:
    bn_call: Call
    target: Call  # the layer call that absorbs the BN
    bn_after: bool
    flatten: Call | None = None  # BN -> Flatten -> Dense


# ---------------------------------------------------------------------------- checks


def _q(call_or_layer) -> str:
    name = call_or_layer.name
    return f"'{name}'"


def _numpy(variable):
    return read_weight(variable)


def _bn_arrays(bn):
    gamma = _numpy(bn.gamma) if bn.scale else None
    beta = _numpy(bn.beta) if bn.center else None
    return gamma, beta, _numpy(bn.moving_mean), _numpy(bn.moving_variance)


def _check_bn(view: GraphView, bn_call: Call) -> str | None:
    bn = bn_call.layer
    n = len(view.layer_calls(bn))
    if n > 1:
        return f"it is a shared layer, called {n} times; folding it would change every call"
    if bn_call.kwargs.get("training") is True and bn.trainable:
        return "it is called with training=True, so it always normalizes with batch statistics"
    gamma, beta, mean, var = _bn_arrays(bn)
    for label, arr in (("gamma", gamma), ("beta", beta), ("moving_mean", mean),
                       ("moving_variance", var)):
        if arr is not None and not np.all(np.isfinite(arr)):
            return f"its {label} is not finite"
    if np.any(var.astype(np.float64) + float(bn.epsilon) <= 0):
        return "moving_variance + epsilon <= 0 on some channel"
    return None


def _check_layer(view: GraphView, call: Call) -> str | None:
    """Conditions on the absorbing layer that do not depend on the direction."""
    return untouchable_reason(call.layer, view.n_calls(call.layer))


def _bn_axis(bn, rank: int) -> int:
    return bn.axis % rank


def _check_backward(
    view: GraphView, bn_call: Call, absorbed: dict | None = None
) -> tuple[_Match | None, str]:
    """``absorbed`` maps id(BN call) -> target call for BNs already matched backward: a BN
    right after one of them folds into the same layer (conv -> BN_a -> BN_b)."""
    x = bn_call.inputs[0]
    producer = x.producer
    if producer is not None and absorbed and id(producer) in absorbed:
        if x.is_model_output:
            return None, f"the output of {_q(producer)} is an output of model '{x.output_of[0]}'"
        if len(x.consumers) != 1:
            return None, f"the output of {_q(producer)} also feeds another layer"
        target = absorbed[id(producer)]
        rank = len(x.shape)
        if _bn_axis(bn_call.layer, rank) != _bn_axis(producer.layer, rank):
            return None, f"it normalizes another axis than {_q(producer)}"
        return _Match(bn_call, target, True), ""
    if producer is None:
        return None, "its input is a model input"
    layer = producer.layer
    layout = layout_of(layer)
    if layout is None:
        return None, (
            f"its input comes from {_q(producer)} ({type(layer).__name__}), "
            "which cannot absorb it"
        )
    reason = _check_layer(view, producer)
    if reason:
        return None, reason
    others = [c for c in x.consumers if c is not bn_call]
    if others:
        return None, f"the output of {_q(producer)} also feeds {_q(others[0])}"
    if x.is_model_output:
        return None, (
            f"the output of {_q(producer)} is also an output of model '{x.output_of[0]}'"
        )
    activation = keras.activations.serialize(layer.activation)
    if activation not in (None, "linear"):
        return None, (
            f"{_q(producer)} applies activation '{activation}' before the batch norm"
        )
    rank = len(x.shape)
    want = channel_axis(layer, rank)
    if _bn_axis(bn_call.layer, rank) != want:
        return None, (
            f"it normalizes axis {_bn_axis(bn_call.layer, rank)} but {_q(producer)} "
            f"writes its channels on axis {want}"
        )
    reason = bias_on_wrong_axis(layer, x.shape)
    if reason:
        return None, reason
    return _Match(bn_call, producer, True), ""


def _check_forward(view: GraphView, bn_call: Call) -> tuple[_Match | None, str]:
    y = bn_call.outputs[0]
    if y.is_model_output:
        return None, f"its output is an output of model '{y.output_of[0]}'"
    if len(y.consumers) != 1:
        names = ", ".join(_q(c) for c in y.consumers) or "nothing"
        return None, f"its output feeds {len(y.consumers)} layers ({names})"
    target = y.consumers[0]
    flatten = None
    if type(target.layer) is keras.layers.Flatten:
        flatten = target
        z = flatten.outputs[0]
        if len(view.layer_calls(flatten.layer)) > 1:
            return None, f"{_q(flatten)} is a shared layer"
        if z.is_model_output or len(z.consumers) != 1:
            return None, f"the output of {_q(flatten)} does not feed exactly one layer"
        target = z.consumers[0]
        if type(target.layer) is not keras.layers.Dense:
            return None, (
                f"{_q(flatten)} feeds {_q(target)} ({type(target.layer).__name__}), "
                "not a Dense layer"
            )
        if any(d is None for d in y.shape[1:]):
            return None, f"the input of {_q(flatten)} has an unknown dimension {y.shape}"
    layer = target.layer
    layout = layout_of(layer)
    if layout is None:
        return None, (
            f"its output goes to {_q(target)} ({type(layer).__name__}), "
            "which cannot absorb it"
        )
    if layout.kind == "transpose":
        return None, (
            f"{_q(target)} is a transposed convolution; folding into its input is not exact"
        )
    reason = _check_layer(view, target)
    if reason:
        return None, reason
    if layout.kind != "dense":
        padding = layer.padding
        if padding != "valid":
            return None, (
                f"{_q(target)} pads its input (padding='{padding}'); the padded zeros "
                "would not be normalized, so folding into it is not exact"
            )
        groups = getattr(layer, "groups", 1)
        if groups != 1:
            return None, f"{_q(target)} has groups={groups}; folding into it is not exact"
    reason = bias_on_wrong_axis(layer, target.outputs[0].shape)
    if reason:
        return None, reason
    if flatten is None:
        rank = len(y.shape)
        want = channel_axis(layer, rank)
        if _bn_axis(bn_call.layer, rank) != want:
            return None, (
                f"it normalizes axis {_bn_axis(bn_call.layer, rank)} but {_q(target)} "
                f"reads its channels on axis {want}"
            )
    return _Match(bn_call, target, False, flatten), ""


def _match_bn(view: GraphView, bn_call: Call, absorbed: dict) -> tuple[_Match | None, str]:
    reason = _check_bn(view, bn_call)
    if reason:
        return None, reason
    match, back_reason = _check_backward(view, bn_call, absorbed)
    if match:
        return match, ""
    match, fwd_reason = _check_forward(view, bn_call)
    if match:
        return match, ""
    return None, f"not after a foldable layer ({back_reason}); not before one ({fwd_reason})"


def _bn_calls(view: GraphView) -> list[Call]:
    return [c for c in view.calls if type(c.layer) is _BN or isinstance(c.layer, _BN)]


def _find(view: GraphView) -> tuple[list[_Match], list[SkippedBatchNorm]]:
    matches, skipped, seen, absorbed = [], [], set(), {}
    for bn_call in _bn_calls(view):
        if id(bn_call.layer) in seen:
            continue
        seen.add(id(bn_call.layer))
        match, reason = _match_bn(view, bn_call, absorbed)
        if match:
            matches.append(match)
            if match.bn_after:
                absorbed[id(bn_call)] = match.target
        else:
            skipped.append(SkippedBatchNorm(bn_call.layer, reason))
    for call, bn in view.hidden_batch_norms:
        skipped.append(SkippedBatchNorm(bn, (
            f"it is inside {_q(call)} ({type(call.layer).__name__}), whose graph keras-cle "
            "cannot read; rebuild that part with the Functional API to fold it"
        )))
    return matches, skipped


# ---------------------------------------------------------------------------- rewrite


def _flatten_channels(flatten_call: Call, bn_axis: int) -> np.ndarray:
    """Channel index of every position of the Flatten's output, by running the layer itself
    on an array that holds the channel index at each position (handles data_format)."""
    shape = flatten_call.inputs[0].shape[1:]
    axis = bn_axis - 1
    index = np.arange(shape[axis], dtype=np.float32).reshape(
        [-1 if i == axis else 1 for i in range(len(shape))]
    )
    index = np.broadcast_to(index, shape)[None]
    flat = keras.ops.convert_to_numpy(flatten_call.layer(index))[0]
    return np.rint(flat).astype(np.int64)


def _fold_values(layer, group: tuple[_Match, ...], dtype=None) -> dict[str, np.ndarray]:
    """The values ``layer`` takes when the BNs of ``group`` (its matches, forward folds
    first) are folded into it: computed in float64, returned in float64 or, with ``dtype``,
    rounded once to it (a lone backward fold then never holds a float64 kernel)."""
    layout = layout_of(layer)
    w = {a: _numpy(getattr(layer, a)) for a in layout.kernel_attrs}
    bias = _numpy(layer.bias) if layer.use_bias else None
    for m in group:
        bn = m.bn_call.layer
        s, t = _fold_math.bn_affine(*_bn_arrays(bn), bn.epsilon)
        if m.bn_after:
            w[layout.out_kernel], bias = _fold_math.fold_bn_after(
                w[layout.out_kernel], bias, s, t, layout.out_axis,
                depthwise=layout.kind == "depthwise",
                dtype=dtype if len(group) == 1 else None,
            )
            continue
        if m.flatten is not None:
            rank = len(m.bn_call.inputs[0].shape)
            channels = _flatten_channels(m.flatten, _bn_axis(bn, rank))
            s, t = s[channels], t[channels]
        if layout.kind == "separable":
            w["depthwise_kernel"], w["pointwise_kernel"], bias = (
                _fold_math.fold_bn_before_separable(
                    w["depthwise_kernel"], w["pointwise_kernel"], bias, s, t
                )
            )
        else:
            w["kernel"], bias = _fold_math.fold_bn_before(
                w["kernel"], bias, s, t, depthwise=layout.kind == "depthwise"
            )
    values = {**w, "bias": bias}
    if dtype is not None:
        values = {a: np.asarray(v).astype(dtype, copy=False) for a, v in values.items()}
    return values


def _edits(matches: list[_Match]) -> dict[int, LayerEdit]:
    # Forward folds first, then backward folds: BN_b(L(BN_a(x))) composes in that order.
    # The new values are computed when the rebuild assigns them (or a planner reads them),
    # one layer at a time: float64 copies of every folded kernel at once would be twice the
    # model's weights.
    by_layer: dict[int, list[_Match]] = {}
    for m in matches:
        by_layer.setdefault(id(m.target.layer), []).append(m)
    edits = {}
    for group in by_layer.values():
        group.sort(key=lambda m: m.bn_after)
        layer = group[0].target.layer
        edits[id(layer)] = LayerEdit(
            config={} if layer.use_bias else {"use_bias": True},
            compute=functools.partial(_fold_values, layer, tuple(group)),
        )
    return edits


def _identity_like(layer):
    return keras.layers.Identity(name=layer.name, dtype=layer.dtype_policy.name)


def fold_plan(matches: list[_Match]) -> tuple[dict[int, LayerEdit], set[int]]:
    """Edits and removed layers for :func:`cle._rebuild.rebuild` that carry out ``matches``."""
    edits, bypass = _edits(matches), set()
    for m in matches:
        bn_call = m.bn_call
        if bn_call.outputs[0].is_model_output:
            # Keras 3 names outputs after the producing layer: an Identity with the BN's name
            # and dtype policy keeps the model's output names.
            edits[id(bn_call.layer)] = LayerEdit(replace=_identity_like)
        else:
            bypass.add(id(bn_call.layer))
    return edits, bypass


def _apply(model, matches: list[_Match]):
    edits, bypass = fold_plan(matches)
    return rebuild(model, edits=edits, bypass=bypass)


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
    matches, skipped = _find(view)
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
    matches, skipped = _find(view)
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
                f"({verb} {', '.join(_q(c) for c in neighbours)})"
            )
        else:
            reason = _check_bn(view, bn_call)
            if not reason:
                check = _check_backward if bn_after else _check_forward
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
