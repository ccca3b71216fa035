"""Choosing the scales of each set for the quantizer that will run (``objective="quantized"``).

Reads a planned set (its links, found on the input model before anything is rebuilt), the
folded weights its layers *will* have (the fold plan's new values, else the layer's own), and
the activation statistics of its junctions (data-free from the folded BNs' γ, β, or measured),
and asks :mod:`cle._math.noise` for the scales with the least modelled noise. Deciding before the
rebuild is what lets a set that stays unscaled keep its fused ReLU6 (one fused op, where a
:class:`ClippedReLU` lowers to a fused RELU and a MINIMUM against a constant vector).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from cle._math import equalization as _cls_math
from cle._math import noise as _qnoise
from cle._transforms.sets import Link, in_spec, out_spec
from cle._core.layouts import layout_of
from cle.layers import ClippedReLU

__all__ = ["ScalingDecision", "decide_set", "junction_kind"]


@dataclasses.dataclass
class ScalingDecision:
    """How one scaling set was treated by :func:`cle.equalize_model`.

    Attributes:
        layers: names of the set's layers (2 for a pair, 3 for a triplet).
        scaled: the set was scaled.
        objective: "quantized" (modelled INT8 noise) or "weights" (weight ranges only).
        noise_before, noise_after: modelled quantization noise power at the output of the
            set's last layer, before and after (None for objective "weights").
        activation_range_before, activation_range_after: per junction, the per-tensor range
            of the activation the quantizer sees (the widest INT8 tensor there).
        alpha, lam: the chosen candidate (activation weight, fraction of the way), or None.
        reason: why the set was left as it is (empty when scaled).
    """

    layers: tuple
    scaled: bool
    objective: str
    noise_before: float | None = None
    noise_after: float | None = None
    activation_range_before: list = dataclasses.field(default_factory=list)
    activation_range_after: list = dataclasses.field(default_factory=list)
    alpha: float | None = None
    lam: float | None = None
    reason: str = ""
    scales: list = dataclasses.field(default_factory=list, repr=False)

    @property
    def noise_change_db(self) -> float | None:
        if self.noise_before is None or not self.noise_before > 0:
            return None
        return float(10 * np.log10(max(self.noise_after, 1e-300) / self.noise_before))

    def to_dict(self):
        d = dataclasses.asdict(self)
        d.pop("scales")
        d["layers"] = list(self.layers)
        d["noise_change_db"] = self.noise_change_db
        return d

    def __str__(self):
        names = " -> ".join(self.layers)
        if not self.scaled:
            return f"{names}: left as it is, {self.reason}"
        if self.noise_before is None:
            return f"{names}: scaled (weight ranges)"
        rb = ", ".join(f"{r:.3g}" for r in self.activation_range_before)
        ra = ", ".join(f"{r:.3g}" for r in self.activation_range_after)
        how = ("weight equalization" if self.alpha is None
               else f"alpha {self.alpha:g}, {self.lam:g} of the way")
        return (f"{names}: modelled noise {self.noise_change_db:+.1f} dB, activation range "
                f"[{rb}] -> [{ra}] ({how})")


def _as64(x):
    return np.asarray(x, dtype=np.float64)


def _tap_maxima(flat):
    """For a kernel viewed as ``(taps, a, b)``: ``(per, sq, row_max, col_max)`` with ``per`` the
    float32 max over taps of |W| (a, b), ``sq`` the float32 sum over taps of W² (None for one
    tap), and the exact (float64) maxima of |W| per row a and per column b. Computed a block of
    rows at a time: no whole-kernel temporary besides the two float32 results."""
    taps, a, b = flat.shape
    f32 = np.float32
    per = np.empty((a, b), f32)
    sq = None if taps == 1 else np.empty((a, b), f32)
    row_max, col_max = np.empty(a), np.zeros(b)
    for rows in _qnoise.row_blocks((a, taps * b)):
        m = np.abs(flat[:, rows, :]).max(axis=0)  # exact in the kernel's dtype
        row_max[rows] = m.max(axis=1, initial=0.0)
        np.maximum(col_max, m.max(axis=0, initial=0.0), out=col_max)
        per[rows] = m
        if sq is not None:
            sq[rows] = np.square(flat[:, rows, :].astype(f32)).sum(axis=0)
    return per, sq, row_max, col_max


def _in_out_ranges(kernel, layer):
    """``(R, SQ, taps, r_in)``: ``R[i, o]`` = max over taps of |W| from input channel i to
    output o, ``SQ[i, o]`` the sum of their squares (None for one tap, where it is R²),
    taps = kernel taps, ``r_in[i]`` = max over o of ``R[i, o]``. R and SQ are float32, the
    precision :func:`cle._math.noise.chain_noise` computes its O(C·O) term in; ``r_in`` is exact
    (float64 of the kernel's own maxima), as the candidate scales are computed from it."""
    layout = layout_of(layer)
    f32 = np.float32
    k = np.asarray(kernel)
    if not np.issubdtype(k.dtype, np.floating):
        k = _as64(k)
    if layout.kind == "dense":
        per, _, r_in, _ = _tap_maxima(k[None])
        return per, None, 1, r_in
    taps = int(np.prod(k.shape[:-2]))
    flat = k.reshape((taps,) + k.shape[-2:])
    groups = getattr(layer, "groups", 1) or 1
    if layout.kind == "transpose":  # (*k, out, in)
        per, sq, _, r_in = _tap_maxima(flat)
        return (np.ascontiguousarray(per.T), None if sq is None else np.ascontiguousarray(sq.T),
                taps, r_in)
    if layout.kind in ("depthwise", "separable"):  # (*k, in, mult): out = c*mult + m
        per, sq, r_in, _ = _tap_maxima(flat)
        c, mult = per.shape
        r = np.zeros((c, c * mult), f32)
        q = None if sq is None else np.zeros((c, c * mult), f32)
        rows = np.arange(c)
        for m in range(mult):
            r[rows, rows * mult + m] = per[:, m]
            if q is not None:
                q[rows, rows * mult + m] = sq[:, m]
        return r, q, taps, r_in
    if groups == 1:
        per, sq, r_in, _ = _tap_maxima(flat)
        return per, sq, taps, r_in
    # Grouped: input channel g·ipg + i reads row i of the kernel, group g's columns only.
    exact = np.abs(flat).max(axis=0)  # (ipg, out), exact
    sq = None if taps == 1 else np.square(flat.astype(f32, copy=False)).sum(axis=0)
    ipg, out = exact.shape
    opg = out // groups
    r = np.zeros((ipg * groups, out), f32)
    q = None if sq is None else np.zeros((ipg * groups, out), f32)
    r_in = np.zeros(ipg * groups)
    for g in range(groups):
        rows, cols = slice(g * ipg, (g + 1) * ipg), slice(g * opg, (g + 1) * opg)
        r[rows, cols] = exact[:, cols]
        if q is not None:
            q[rows, cols] = sq[:, cols]
        r_in[rows] = exact[:, cols].max(axis=1)
    return r, q, taps, r_in


def _out_sumsq(kernel, layer):
    """Per output channel: sum of squares of the kernel and fan-in (elements per channel)."""
    attr, axis, kind = out_spec(layer)
    k = _as64(kernel)
    if kind == "depthwise_out":
        flat = k.reshape((-1, k.shape[-2] * k.shape[-1]))
    else:
        flat = np.moveaxis(k, axis, -1).reshape((-1, k.shape[axis]))
    return (flat ** 2).sum(axis=0), flat.shape[0]


def positions(link: Link) -> int:
    shape = link.first.outputs[0].shape
    axis = 1 if getattr(link.first.layer, "data_format", None) == "channels_first" else -1
    dims = [d for i, d in enumerate(shape[1:], start=1) if i != axis % len(shape)]
    return int(np.prod([d or 1 for d in dims])) if dims else 1


def junction_kind(link: Link, value):
    """("linear" | "relu" | "relu6" | "clipped", cap) of the activation on a link."""
    caps = []
    kind = "relu6" if link.fused_cap else None
    for call in link.caps:
        if isinstance(call.layer, ClippedReLU):
            kind = "clipped"
            caps.append(_as64(value(call.layer, "caps")))
        else:
            kind = kind or "relu6"
            caps.append(np.asarray(6.0))
    if link.fused_cap:
        caps.append(np.asarray(6.0))
    if kind is not None:
        cap = caps[0]
        for c in caps[1:]:
            cap = np.minimum(cap, c)
        return kind, cap
    return ("relu" if link.relu else "linear"), None


def _chain_weights(layers, value, bn_first):
    first, last = layers[0], layers[-1]
    a1, ax1, k1 = out_spec(first)
    w_first = value(first, a1)
    r_first = _cls_math.channel_ranges(w_first, ax1, k1)
    gamma, beta = bn_first
    sumsq, fan_in = _out_sumsq(w_first, first)
    bias = value(first, "bias")
    bias = np.zeros_like(r_first) if bias is None else _as64(bias)
    ok = sumsq > 0
    power = (gamma ** 2 + (beta - bias) ** 2)[ok] / sumsq[ok]
    e = float(np.median(power)) if power.size else 0.0
    a3, _, _, _ = in_spec(last)
    r_last, sq_last, taps_last, r_in = _in_out_ranges(value(last, a3), last)
    w = _qnoise.ChainWeights(r_first, e * fan_in, r_last, sq_last, taps_last,
                             p_first=gamma ** 2 + (beta - bias) ** 2, r_last_in=r_in)
    if len(layers) == 3:
        dw = _as64(value(layers[1], "kernel"))
        flat = dw.reshape((-1, dw.shape[-2] * dw.shape[-1]))
        w.r_mid, w.d_mid, w.taps_mid = np.abs(flat).max(axis=0), (flat ** 2).sum(axis=0), flat.shape[0]
    return w


def _act_range(j, s):
    return _qnoise.tensor_range(j, s)[0]


def decide_set(links, value, bn_stats, target, activation_stats=None):
    """Choose the scales of one planned set.

    Args:
        links: the set's links (1 or 2), on the input model.
        value: ``value(layer, attr)`` → the folded weight the layer will have.
        bn_stats: ``{id(layer): (gamma, beta)}`` of the BNs folded backward into layers.
        target: :class:`cle._math.noise.QuantTarget`.
        activation_stats: optional ``{id(link.first): Junction}`` measured on calibration
            data; a junction found there replaces the data-free model, unless it gives one
            value per channel per input (a vector: each channel's maximum over a few dozen
            inputs is no range to equalize on; hunt7's flat autoencoder, its code's channels
            equalized on them, read several dB below the converter on new inputs): then the
            data-free model where a folded BN gives it, else the set is left as it is.

    Returns:
        :class:`ScalingDecision` (with ``scales`` set when scaled).
    """
    layers = tuple(la for link in links for la in link.layers[:1]) + (links[-1].second.layer,)
    names = tuple(la.name for la in layers)
    junctions = []
    for link in links:
        kind, cap = junction_kind(link, value)
        layer = link.first.layer
        measured = None if activation_stats is None else activation_stats.get(id(link.first))
        few = measured is not None and measured.per_input == 1
        if measured is not None and not few:
            junctions.append(measured)
            continue
        stats = bn_stats.get(id(layer))
        if stats is None and few:
            return ScalingDecision(names, False, "quantized", reason=(
                f"the output of '{layer.name}' gives one value per channel per input: each "
                "channel's range measured on the calibration inputs is the largest of its "
                "values there, one per input, which new inputs often pass, and equalized "
                "ranges would clip them (the per-tensor range keeps headroom for them; a folded "
                "BatchNormalization after it would give the data-free model)"))
        if stats is None:
            return ScalingDecision(names, False, "quantized", reason=(
                f"no activation statistics for the output of '{layer.name}' (no folded "
                "BatchNormalization after it; pass calibration data to measure them)"))
        junctions.append(_qnoise.junction_from_bn(stats[0], stats[1], kind, cap, positions(link)))
    first_stats = bn_stats.get(id(layers[0]))
    if first_stats is None:
        first_stats = (np.sqrt(junctions[0].mean_sq), np.zeros_like(junctions[0].mean_sq))
    w = _chain_weights(layers, value, first_stats)
    # Nagel's scales, from the same per-channel maxima the noise model read from the kernels.
    if len(layers) == 2:
        nagel = [_cls_math.pair_scale(w.r_first, w.r_last_in)]
    else:
        nagel = list(_cls_math.triplet_scale(w.r_first, w.r_mid, w.r_last_in))
    margin = _qnoise.MIN_GAIN_DB
    choice = _qnoise.choose_scales(w, junctions, target, extra=[nagel], min_gain_db=margin)
    before = [_act_range(j, np.ones_like(s)) for j, s in zip(junctions, choice.scales)]
    if choice.noise_after < choice.noise_before:
        return ScalingDecision(
            names, True, "quantized", choice.noise_before, choice.noise_after, before,
            [_act_range(j, s) for j, s in zip(junctions, choice.scales)],
            choice.alpha, choice.lam, scales=choice.scales)
    reason = "no candidate scaling lowers its modelled INT8 noise"
    if margin > 0:
        reason += f" by the {margin:g} dB the model can tell apart from no gain"
    return ScalingDecision(names, False, "quantized", choice.noise_before, choice.noise_before,
                           before, list(before), reason=reason)
