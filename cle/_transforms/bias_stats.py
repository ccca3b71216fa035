"""The expected inputs of analytic bias correction (:func:`cle.correct_bias` with
``bn_stats``): per input channel, ``E[x]`` from the γ, β of a batch norm folded backward into
the layer that produces ``x`` (the pre-activation taken as ``N(β, γ²)``), carried through the
layers in between; and the clipped-normal mean it needs.

Public names are re-exported by :mod:`cle.bias_correction`.
"""

from __future__ import annotations

import dataclasses
import logging

import keras
import numpy as np
from scipy.stats import norm

from cle._core.layouts import layout_of
from cle._core.semantics import activation_clip, activation_name, clip_of
from cle._core.weights import gamma_beta

__all__ = [
    "Semantics",
    "analytic_mean",
    "bn_stats_from_folded_pairs",
    "bn_stats_from_report",
    "expected_clipped_normal",
    "expected_relu_normal",
    "normalize_stats",
]

logger = logging.getLogger("cle.bias_correction")

L = keras.layers
# Layers that keep each channel's mean exactly.
_EXACT_PASS = (
    L.AveragePooling1D, L.AveragePooling2D, L.AveragePooling3D,
    L.GlobalAveragePooling1D, L.GlobalAveragePooling2D, L.GlobalAveragePooling3D,
    L.Dropout, L.SpatialDropout1D, L.SpatialDropout2D, L.SpatialDropout3D, L.Identity,
)
# Layers taken as keeping the mean although they do not quite (the brief's approximation).
_APPROX_PASS = (
    L.ZeroPadding1D, L.ZeroPadding2D, L.ZeroPadding3D,
    L.MaxPooling1D, L.MaxPooling2D, L.MaxPooling3D,
    L.GlobalMaxPooling1D, L.GlobalMaxPooling2D, L.GlobalMaxPooling3D,
)


def expected_clipped_normal(mean, std, lo=0.0, hi=np.inf) -> np.ndarray:
    """``E[min(max(X, lo), hi)]`` for ``X ~ N(mean, std²)``, elementwise (float64).

    With ``a = (lo − μ)/σ``, ``b = (hi − μ)/σ``:
    ``E = lo·Φ(a) + μ·(Φ(b) − Φ(a)) + σ·(φ(a) − φ(b)) + hi·(1 − Φ(b))``
    (terms of an infinite bound vanish). ``σ`` is taken as ``|std|``; ``σ = 0`` gives
    ``clip(μ, lo, hi)``. Requires ``lo <= hi``.
    """
    mu, sd, lo, hi = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64)
                                           for v in (mean, std, lo, hi)))
    sd = np.abs(sd)
    det = sd == 0
    s = np.where(det, 1.0, sd)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        a = (lo - mu) / s
        b = (hi - mu) / s
        cdf_a, pdf_a = norm.cdf(a), norm.pdf(a)
        sf_b, pdf_b = norm.sf(b), norm.pdf(b)
        mid = norm.cdf(b) - cdf_a
        lo_term = np.where(np.isfinite(lo), lo * cdf_a, 0.0)
        hi_term = np.where(np.isfinite(hi), hi * sf_b, 0.0)
        out = lo_term + mu * mid + s * (pdf_a - pdf_b) + hi_term
    return np.where(det, np.clip(mu, lo, hi), out)


def expected_relu_normal(beta, gamma) -> np.ndarray:
    """``E[ReLU(X)]`` for ``X ~ N(β, γ²)``: ``|γ|·φ(β/|γ|) + β·Φ(β/|γ|)`` (``γ = 0``: ``max(β, 0)``)."""
    return expected_clipped_normal(beta, gamma, 0.0, np.inf)


def bn_stats_from_folded_pairs(pairs) -> dict:
    """``{layer: (γ, β)}`` for the backward folds of :func:`cle.fold_all_batch_norms`.

    Forward folds are left out (their BN describes the layer's input, not its output). When
    several BNs were folded backward into one layer (conv → BN → BN), the last one describes
    the output.
    """
    stats = {}
    for pair in pairs:
        if not getattr(pair, "bn_after", True):
            continue
        layer, bn = pair[0], pair[1]
        stats[layer] = gamma_beta(bn)
    return stats


def bn_stats_from_report(report) -> dict:
    """``{layer: (γ/s, β/s)}`` from an :class:`cle.EqualizationReport`.

    γ, β come from the BNs folded backward (``report.folded``); ``s`` is the cross-layer scale
    factor of the set where the layer is ``layer1`` (its output channels were divided by it).
    Layers that gave bias to the next layer by high-bias folding are left out (the per-channel
    shift is not recorded in the report), so their consumers are skipped with a reason.
    """
    scale = {}
    for info in report.sets:
        for pair in info.cls_pair_info_list:
            scale[id(pair.layer1)] = np.asarray(pair.scale_factor, dtype=np.float64)
    absorbed = {r.layer1 for r in getattr(report, "bias_absorptions", ()) if r.absorbed}
    stats = {}
    for layer, (gamma, beta) in bn_stats_from_folded_pairs(report.folded).items():
        if layer.name in absorbed:
            logger.info("no statistics for '%s': high-bias folding moved part of its bias",
                        layer.name)
            continue
        s = scale.get(id(layer), 1.0)
        stats[layer] = (gamma / s, beta / s)
    return stats


def normalize_stats(bn_stats):
    if not isinstance(bn_stats, dict):
        raise TypeError(
            "`bn_stats` must be a dict {layer or layer name: (gamma, beta)}. "
            f"Received: bn_stats of type {type(bn_stats).__name__}"
        )
    out = {}
    for key, value in bn_stats.items():
        name = key if isinstance(key, str) else getattr(key, "name", None)
        if name is None:
            raise ValueError(f"`bn_stats` keys must be layers or names. Received: {key!r}")
        try:
            gamma, beta = value
            gamma = np.asarray(gamma, dtype=np.float64).reshape(-1)
            beta = np.asarray(beta, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"`bn_stats['{name}']` must be a pair (gamma, beta) of per-channel arrays."
            ) from exc
        if gamma.shape != beta.shape or not (np.isfinite(gamma).all() and np.isfinite(beta).all()):
            raise ValueError(
                f"`bn_stats['{name}']`: gamma and beta must be finite and of the same length. "
                f"Received: shapes {gamma.shape} and {beta.shape}"
            )
        out[name] = (gamma, beta)
    return out


class _Skip(Exception):
    pass


@dataclasses.dataclass
class Semantics:
    """What the walk back from a layer's input takes each call of the view to compute.

    By default the layers as they are. :func:`cle.equalize_model` corrects biases on the view of
    the input model with what its plan will make of it: folded BNs pass their input through
    (``bypassed``), and each ReLU6 the plan bounds or replaces has the clip it will have
    (``clips``: per-channel caps of its ClippedReLU, or a plain ReLU's ``(0, inf)``).

    Attributes:
        stats: ``{layer name: (γ, β)}`` of the pre-activation output of a layer.
        bypassed: ids of layers whose calls pass their first input through.
        clips: ``{id(layer): (lo, hi)}``: the clip of a standalone activation layer, or of a
            layer's fused activation, in place of what the layer says.
    """

    stats: dict
    bypassed: frozenset = frozenset()
    clips: dict = dataclasses.field(default_factory=dict)

    def fused_clip(self, layer):
        """The clip of ``layer``'s fused activation, or None if it is not a clip."""
        if id(layer) in self.clips:
            return self.clips[id(layer)]
        return activation_clip(layer.activation)

    def clip(self, layer):
        """The clip ``layer`` applies (a capped ReLU), or None."""
        if id(layer) in self.clips:
            return self.clips[id(layer)]
        return clip_of(layer)


_MERGE = (L.Add, L.Average, L.Concatenate)


def analytic_mean(call, stats):
    """((E[x] per input channel of ``call``, note), "") or (None, reason); ``stats``: a
    :class:`Semantics`, or ``{layer name: (γ, β)}`` for the layers as they are."""
    sem = stats if isinstance(stats, Semantics) else Semantics(stats)
    notes = []
    try:
        mean = _tensor_mean(call.inputs[0], sem, notes,
                            allow_flatten=layout_of(call.layer).kind == "dense")
    except _Skip as skip:
        return None, str(skip)
    return (mean, "; ".join(dict.fromkeys(notes))), ""


def _tensor_mean(x, sem, notes, allow_flatten=False, depth=0):
    """Per-channel mean of tensor ``x`` of the view, or raise :class:`_Skip`.

    Walks back through pass-through layers and (capped) ReLUs to a layer with statistics
    (its pre-activation is N(β, γ²)) or an unfolded BatchNormalization. An Add / Average /
    channel Concatenate with no ReLU after it is followed into each of its inputs (means add /
    average / concatenate exactly; a ReLU after it would need the sum's distribution).
    """
    if depth > 200:
        raise _Skip("the path back to statistics is too long")
    ops = []  # walking backward: ("clip", lo, hi) | ("flatten", layer, in_shape)
    mean = gamma = beta = None
    while True:
        p = x.producer
        if p is None:
            raise _Skip("its input is a model input, whose statistics are unknown"
                        if depth == 0 and not ops else
                        "a model input lies on its input path; its statistics are unknown")
        layer = p.layer
        if id(layer) in sem.bypassed:
            x = p.inputs[0]
            continue
        if layer.name in sem.stats:
            gamma, beta = sem.stats[layer.name]
            if layout_of(layer) is not None:
                clip = sem.fused_clip(layer)
                if clip is None:
                    raise _Skip(f"'{layer.name}' applies activation "
                                f"'{activation_name(layer.activation)}'")
                ops.append(("clip",) + clip)
            break
        if isinstance(layer, L.BatchNormalization):
            if p.kwargs.get("training") is True:
                raise _Skip(f"'{layer.name}' is called with training=True")
            gamma, beta = gamma_beta(layer)
            break
        if layout_of(layer) is not None:
            raise _Skip(f"no statistics for the output of '{layer.name}' (no batch norm "
                        "folded backward into it)")
        if p.kind in _MERGE:  # a layer, or an op such as ``x + y`` (see _graph.Call.kind)
            mean = _merge_mean(p, x, ops, sem, notes, depth)
            break
        if len(p.inputs) != 1:
            raise _Skip(f"its input comes from '{layer.name}' ({type(layer).__name__}) "
                        "with several inputs")
        clip = sem.clip(layer)
        if clip is not None:
            ops.append(("clip",) + clip)
        elif type(layer) in _EXACT_PASS:
            pass
        elif type(layer) in _APPROX_PASS:
            notes.append(f"'{layer.name}' taken as keeping the mean")
        elif type(layer) is L.Flatten:
            if ops or not allow_flatten:
                raise _Skip(f"'{layer.name}' (Flatten) is not right before a Dense layer")
            ops.append(("flatten", layer, p.inputs[0].shape))
        else:
            raise _Skip(f"its input comes through '{layer.name}' ({type(layer).__name__}), "
                        "whose effect on the mean is not modelled")
        x = p.inputs[0]
    return _along_path(ops, mean, gamma, beta)


def _merge_mean(p, x, ops, sem, notes, depth):
    """The mean of the output of a merge call ``p`` (Add, Average, channel Concatenate):
    the sum, average or concatenation of its inputs' means."""
    layer = p.layer
    if any(op[0] == "clip" for op in ops):
        raise _Skip(f"a ReLU follows '{layer.name}' ({type(layer).__name__}); the "
                    "distribution of its output is not modelled")
    if type(layer) is L.Concatenate and layer.axis not in (-1, len(x.shape) - 1):
        raise _Skip(f"'{layer.name}' concatenates along axis {layer.axis}, not channels")
    parts = [_tensor_mean(t, sem, notes, depth=depth + 1) for t in p.inputs]
    if type(layer) is L.Concatenate:
        mean = np.concatenate(parts)
    else:
        if len({m.shape for m in parts}) != 1:
            raise _Skip(f"the inputs of '{layer.name}' broadcast channels")
        mean = np.sum(parts, axis=0)
        if type(layer) is L.Average:
            mean = mean / len(parts)
    return mean


def _along_path(ops, mean, gamma, beta):
    """The mean at the end of a walk: the clipped-normal mean of N(β, γ²) through the clips
    in ``ops`` (or the merge's ``mean``), mapped through a Flatten if there is one."""
    lo, hi = -np.inf, np.inf
    flatten = None
    if mean is None:
        # Per-channel caps (ClippedReLU) must have one entry per channel of the statistics.
        n = np.shape(beta)
        if any(np.ndim(v) and np.shape(v) != n for op in ops if op[0] == "clip"
               for v in op[1:]):
            raise _Skip("the caps on the path do not match the statistics' channel count")
    for op in reversed(ops):
        if op[0] == "flatten":
            flatten = op
            continue
        lo, hi = np.clip(lo, op[1], op[2]), np.clip(hi, op[1], op[2])
    if mean is None:
        mean = expected_clipped_normal(beta, gamma, lo, hi)
    if flatten is not None:
        _, layer, shape = flatten
        mean = _through_flatten(layer, shape, mean)
        if mean is None:
            raise _Skip(f"cannot map channels through '{layer.name}'")
    return mean


def _through_flatten(layer, shape, mean):
    shape = tuple(shape[1:])
    if any(d is None for d in shape):
        return None
    axis = -1 if getattr(layer, "data_format", "channels_last") == "channels_last" else 0
    c = shape[axis]
    if c != mean.shape[0]:
        return None
    idx = np.zeros(shape, dtype=np.float32)
    idx += np.arange(c, dtype=np.float32).reshape([c if i == axis % len(shape) else 1
                                                   for i in range(len(shape))])
    flat = keras.ops.convert_to_numpy(layer(idx[None]))[0].astype(np.int64)
    return mean[flat]
