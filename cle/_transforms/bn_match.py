"""Batch-norm fold matchers: which BN folds into which layer, checked first, with a reason
when it cannot (see docs/design.md, Matchers), and the ``LayerEdit``s that carry a fold out.

Used by :mod:`cle.batch_norm_fold` (the public API) and the plan of :func:`cle.equalize_model`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import keras
import numpy as np

from cle._math import fold as _fold_math
from cle._core.graph import Call, GraphView
from cle._core.layouts import bias_on_wrong_axis, channel_axis, layout_of, read_weight, untouchable_reason
from cle._core.rebuild import LayerEdit
from cle._core.semantics import activation_name
from cle._core.weights import bn_arrays, quote

__all__ = ["Match", "SkippedBatchNorm", "check_backward", "check_bn", "check_forward",
           "find_matches", "fold_plan", "identity_like"]

_BN = keras.layers.BatchNormalization


class SkippedBatchNorm(NamedTuple):
    """A BatchNormalization that was not folded, and why."""

    bn: Any
    reason: str

    def __str__(self):
        return f"{self.bn.name}: {self.reason}"


@dataclasses.dataclass
class Match:
    bn_call: Call
    target: Call  # the layer call that absorbs the BN
    bn_after: bool
    flatten: Call | None = None  # BN -> Flatten -> Dense


# ---------------------------------------------------------------------------- checks


def check_bn(view: GraphView, bn_call: Call) -> str | None:
    bn = bn_call.layer
    n = len(view.layer_calls(bn))
    if n > 1:
        return f"it is a shared layer, called {n} times; folding it would change every call"
    if bn_call.kwargs.get("training") is True and bn.trainable:
        return "it is called with training=True, so it always normalizes with batch statistics"
    gamma, beta, mean, var = bn_arrays(bn)
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


def _axis_reason(bn_call: Call, call: Call, rank: int, verb: str) -> str | None:
    want = channel_axis(call.layer, rank)
    have = _bn_axis(bn_call.layer, rank)
    if have != want:
        return f"it normalizes axis {have} but {quote(call)} {verb} its channels on axis {want}"
    return None


def check_backward(
    view: GraphView, bn_call: Call, absorbed: dict | None = None
) -> tuple[Match | None, str]:
    """``absorbed`` maps id(BN call) -> target call for BNs already matched backward: a BN
    right after one of them folds into the same layer (conv -> BN_a -> BN_b)."""
    x = bn_call.inputs[0]
    producer = x.producer
    if producer is not None and absorbed and id(producer) in absorbed:
        if x.is_model_output:
            return None, f"the output of {quote(producer)} is an output of model '{x.output_of[0]}'"
        if len(x.consumers) != 1:
            return None, f"the output of {quote(producer)} also feeds another layer"
        target = absorbed[id(producer)]
        rank = len(x.shape)
        if _bn_axis(bn_call.layer, rank) != _bn_axis(producer.layer, rank):
            return None, f"it normalizes another axis than {quote(producer)}"
        return Match(bn_call, target, True), ""
    if producer is None:
        return None, "its input is a model input"
    layer = producer.layer
    layout = layout_of(layer)
    if layout is None:
        return None, (
            f"its input comes from {quote(producer)} ({type(layer).__name__}), "
            "which cannot absorb it"
        )
    reason = _check_layer(view, producer)
    if reason:
        return None, reason
    others = [c for c in x.consumers if c is not bn_call]
    if others:
        return None, f"the output of {quote(producer)} also feeds {quote(others[0])}"
    if x.is_model_output:
        return None, (
            f"the output of {quote(producer)} is also an output of model '{x.output_of[0]}'"
        )
    activation = activation_name(layer.activation)
    if activation != "linear":
        return None, (
            f"{quote(producer)} applies activation '{activation}' before the batch norm"
        )
    reason = _axis_reason(bn_call, producer, len(x.shape), "writes")
    if reason:
        return None, reason
    reason = bias_on_wrong_axis(layer, x.shape)
    if reason:
        return None, reason
    return Match(bn_call, producer, True), ""


def check_forward(view: GraphView, bn_call: Call) -> tuple[Match | None, str]:
    y = bn_call.outputs[0]
    if y.is_model_output:
        return None, f"its output is an output of model '{y.output_of[0]}'"
    if len(y.consumers) != 1:
        names = ", ".join(quote(c) for c in y.consumers) or "nothing"
        return None, f"its output feeds {len(y.consumers)} layers ({names})"
    target = y.consumers[0]
    flatten = None
    if type(target.layer) is keras.layers.Flatten:
        flatten = target
        z = flatten.outputs[0]
        if len(view.layer_calls(flatten.layer)) > 1:
            return None, f"{quote(flatten)} is a shared layer"
        if z.is_model_output or len(z.consumers) != 1:
            return None, f"the output of {quote(flatten)} does not feed exactly one layer"
        target = z.consumers[0]
        if type(target.layer) is not keras.layers.Dense:
            return None, (
                f"{quote(flatten)} feeds {quote(target)} ({type(target.layer).__name__}), "
                "not a Dense layer"
            )
        if any(d is None for d in y.shape[1:]):
            return None, f"the input of {quote(flatten)} has an unknown dimension {y.shape}"
    layer = target.layer
    layout = layout_of(layer)
    if layout is None:
        return None, (
            f"its output goes to {quote(target)} ({type(layer).__name__}), "
            "which cannot absorb it"
        )
    if layout.kind == "transpose":
        return None, (
            f"{quote(target)} is a transposed convolution; folding into its input is not exact"
        )
    reason = _check_layer(view, target)
    if reason:
        return None, reason
    if layout.kind != "dense":
        padding = layer.padding
        if padding != "valid":
            return None, (
                f"{quote(target)} pads its input (padding='{padding}'); the padded zeros "
                "would not be normalized, so folding into it is not exact"
            )
        groups = getattr(layer, "groups", 1)
        if groups != 1:
            return None, f"{quote(target)} has groups={groups}; folding into it is not exact"
    reason = bias_on_wrong_axis(layer, target.outputs[0].shape)
    if reason:
        return None, reason
    if flatten is None:
        reason = _axis_reason(bn_call, target, len(y.shape), "reads")
        if reason:
            return None, reason
    return Match(bn_call, target, False, flatten), ""


def _match_bn(view: GraphView, bn_call: Call, absorbed: dict) -> tuple[Match | None, str]:
    reason = check_bn(view, bn_call)
    if reason:
        return None, reason
    match, back_reason = check_backward(view, bn_call, absorbed)
    if match:
        return match, ""
    match, fwd_reason = check_forward(view, bn_call)
    if match:
        return match, ""
    return None, f"not after a foldable layer ({back_reason}); not before one ({fwd_reason})"


def _bn_calls(view: GraphView) -> list[Call]:
    return [c for c in view.calls if type(c.layer) is _BN or isinstance(c.layer, _BN)]


def find_matches(view: GraphView) -> tuple[list[Match], list[SkippedBatchNorm]]:
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
            f"it is inside {quote(call)} ({type(call.layer).__name__}), whose graph keras-cle "
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


def _fold_values(layer, group: tuple[Match, ...], dtype=None) -> dict[str, np.ndarray]:
    """The values ``layer`` takes when the BNs of ``group`` (its matches, forward folds
    first) are folded into it: computed in float64, returned in float64 or, with ``dtype``,
    rounded once to it (a lone backward fold then never holds a float64 kernel)."""
    layout = layout_of(layer)
    w = {a: read_weight(getattr(layer, a)) for a in layout.kernel_attrs}
    bias = read_weight(layer.bias) if layer.use_bias else None
    for m in group:
        bn = m.bn_call.layer
        s, t = _fold_math.bn_affine(*bn_arrays(bn), bn.epsilon)
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


def _edits(matches: list[Match]) -> dict[int, LayerEdit]:
    # Forward folds first, then backward folds: BN_b(L(BN_a(x))) composes in that order.
    # The new values are computed when the rebuild assigns them (or a planner reads them),
    # one layer at a time: float64 copies of every folded kernel at once would be twice the
    # model's weights.
    by_layer: dict[int, list[Match]] = {}
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


def identity_like(layer):
    return keras.layers.Identity(name=layer.name, dtype=layer.dtype_policy.name)


def fold_plan(matches: list[Match]) -> tuple[dict[int, LayerEdit], set[int]]:
    """Edits and removed layers for :func:`cle._core.rebuild.rebuild` that carry out ``matches``."""
    edits, bypass = _edits(matches), set()
    for m in matches:
        bn_call = m.bn_call
        if bn_call.outputs[0].is_model_output:
            # Keras 3 names outputs after the producing layer: an Identity with the BN's name
            # and dtype policy keeps the model's output names.
            edits[id(bn_call.layer)] = LayerEdit(replace=identity_like)
        else:
            bypass.add(id(bn_call.layer))
    return edits, bypass
