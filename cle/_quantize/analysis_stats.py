"""What ``cle.analyze`` measures about a layer's tensors and weights besides their SQNR, and the
reason in words it gives for a layer's error."""

from __future__ import annotations

import math

import numpy as np

from cle._math.json_numbers import sqnr_words
from cle._quantize.pool_spread import POOL_SPREAD
from cle._quantize.ranges import POOLED
from cle._tflite import converter as tflite
from cle._tflite.flatgraph import FlatGraph

__all__ = ["Accumulator", "range_of", "reason", "weights_of"]

#: Values kept per tensor for its quantiles.
SAMPLE = 1 << 18
# Axis of the output channel of each operator's weights in TF Lite's layout.
_OUT_AXIS = {"CONV_2D": 0, "DEPTHWISE_CONV_2D": -1, "FULLY_CONNECTED": 0,
             "TRANSPOSE_CONV": 0, "CONV_3D": -1, "CONV_3D_TRANSPOSE": -2}
# How a range was chosen, in words (cle._tflite.converter.TensorRange.how).
_HOW = {"percentile": "1e-4 tails", "min/max": "min/max",
        "input range": "the input range (stated, or found from the model)",
        "usual range": "the usual range its calibration values nearly span",
        "min/max (sparse)": "min/max (the 1e-4 tails would be too narrow: a sparse tensor)",
        "min/max (output)": "min/max (the output)",
        "min/max (decides an output)": "min/max (an output only reshapes it or passes it "
                                       "through a softmax)",
        "widened (decides an output)": "min/max widened (the logits before a softmax)",
        "min/max (integer input)": "min/max (an int8 input)",
        "bounds (a sum of class scores)": "the bounds of a sum of class scores (an ensemble's "
                                          "mean of softmaxes)",
        "min/max (max-pooled)": "min/max (a global max pooling keeps its largest values)",
        POOLED: "min/max widened (a global average pooling's output: one value per channel "
                "and input)",
        POOL_SPREAD: "min/max, widened as far as the map a global average pooling averages "
                     "spreads (no data)",
        "min/max (before a map of sparse peaks)": "min/max (a map output of sparse peaks is "
                                                  "computed from it: its tails make the peaks)"}


class Accumulator:
    """Per-channel extremes, clipping and a sample of one tensor's float values, given the INT8
    model's quantization of it."""

    def __init__(self):
        self.lo = self.hi = None
        self.count = self.clipped = 0
        self.clip_energy = 0.0
        self.step = None
        self.sample: list = []
        self.rng = np.random.default_rng(0)

    def add(self, v: np.ndarray, params):
        v = np.asarray(v, np.float32)
        flat = v.reshape(-1, v.shape[-1]) if v.ndim > 1 else v.reshape(-1, 1)
        lo, hi = flat.min(axis=0), flat.max(axis=0)
        self.lo = lo if self.lo is None else np.minimum(self.lo, lo)
        self.hi = hi if self.hi is None else np.maximum(self.hi, hi)
        self.count += v.size
        if params is not None:
            scale, zero = float(params[0][0]), int(params[1][0])
            low, high = scale * (-128 - zero), scale * (127 - zero)
            outside = np.clip(v, low, high) - v
            self.clipped += int(np.count_nonzero(outside))
            self.clip_energy += float(np.sum(outside.astype(np.float64) ** 2))
            self.step = scale
        take = min(v.size, SAMPLE // 4)
        self.sample.append(v.ravel()[self.rng.integers(0, v.size, take)])

    def summary(self) -> dict:
        """``channel_spread`` (largest channel's range over the median channel's),
        ``clipped`` (share of values outside the range), ``clip_share`` (clipping's share of
        the quantization error, against rounding's step²/12 per value), ``steps_used`` (how
        many steps the middle 99.8 % of values span)."""
        if self.lo is None:
            return {}
        width = np.maximum(self.hi, 0) - np.minimum(self.lo, 0)
        live = width[width > 0]
        spread = float(live.max() / np.median(live)) if live.size > 1 else 1.0
        out = {"channel_spread": spread, "channels": int(width.size),
               "clipped": self.clipped / max(self.count, 1)}
        if self.step:
            rounding = self.count * self.step ** 2 / 12.0
            out["clip_share"] = self.clip_energy / (self.clip_energy + rounding)
            lo, hi = np.quantile(np.concatenate(self.sample), [1e-3, 1 - 1e-3])
            out["steps_used"] = float((hi - lo) / self.step)
            out["step"] = float(self.step)
        return out


def range_of(r, acc: Accumulator, protected: set) -> dict:
    """The range of an entry's output tensor: what was used, how it was chosen, and the
    calibrated min/max."""
    if r is None:
        return {"low": None, "high": None, "how": "none (not quantized)", "calibrated": None}
    base = r.how.removesuffix(", widened")
    how = _HOW.get(base, base) + (", widened" if base != r.how else "")
    if r.how == "min/max" and r.index in protected:
        how = "min/max (the output, or the logits before a softmax)"
    return {"low": float(min(r.lo, 0.0)), "high": float(max(r.hi, 0.0)), "how": how,
            "calibrated": [float(r.calibrated[0]), float(r.calibrated[1])]}


def protected_tensors(calibrated: bytes) -> set:
    return tflite.protected_indices(calibrated)[0]


def weights_of(graph: FlatGraph, ops) -> dict | None:
    """Of an entry's first operator with weights: ``channel_spread`` (largest output channel's
    max|W| over the median channel's) and ``outlier`` (max|W| over the 99.9th percentile of
    |W|)."""
    for k in ops:
        op = graph.ops[k]
        axis = _OUT_AXIS.get(op.kind)
        if axis is None or len(op.inputs) < 2:
            continue
        w = graph.constant(op.inputs[1])
        if w is None:
            continue
        w = np.abs(np.asarray(w, np.float64))
        per = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1).max(axis=1)
        live = per[per > 0]
        return {"op": op.kind,
                "channel_spread": float(live.max() / np.median(live)) if live.size else 1.0,
                "outlier": float(w.max() / max(np.quantile(w, 0.999), 1e-30))}
    return None


def _activation_words(layer) -> str:
    s, r = layer.stats, layer.range
    parts = []
    if r.get("low") is not None:
        parts.append(f"range {r['low']:.3g}..{r['high']:.3g} ({r['how']})")
    if s.get("clipped", 0) > 0 and s.get("clip_share", 0) >= 0.25:
        parts.append(f"clips {s['clipped']:.2%} of its values, {s['clip_share']:.0%} of its "
                     "quantization error")
    if s.get("channel_spread", 1) >= 8:
        parts.append(f"one channel spans {s['channel_spread']:.0f}× the median channel: "
                     "the one per-tensor step is coarse for the others")
    if s.get("steps_used") is not None and s["steps_used"] < 32:
        parts.append(f"99.8% of its values fall in {s['steps_used']:.0f} of 255 steps")
    return "; ".join(parts)


def _weight_words(layer, per_channel) -> str:
    w = layer.weights or {}
    parts = []
    if not per_channel and w.get("channel_spread", 1) >= 4:
        parts.append(f"per-tensor weights whose channel ranges differ {w['channel_spread']:.0f}×")
    if w.get("outlier", 1) >= 4:
        parts.append(f"largest weight {w['outlier']:.0f}× the 99.9th percentile of |W|")
    return "; ".join(parts) or "rounding of its weights"


def reason(layer, per_channel: bool) -> str:
    """Why ``layer`` (a :class:`cle._quantize.analysis_report.LayerReport`) adds what it adds
    to the output's error, in words, from what was measured."""
    w, a = layer.weight_share, layer.activation_share
    if w + a <= 0:
        return "adds nothing measurable"
    main = "activations" if a >= w else "weights"
    text = (f"{max(w, a) / (w + a):.0%} from its {main}" if math.isfinite(w + a) else
            f"from its {main}")  # an output made non-finite: no share to give
    detail = _activation_words(layer) if main == "activations" else _weight_words(
        layer, per_channel)
    if detail:
        text += ": " + detail
    own = layer.activation_sqnr_db if main == "activations" else layer.weight_sqnr_db
    if own is not None and np.isfinite(own) and own - layer.output_sqnr_db >= 10:
        text += (f"; the layers after it amplify it (its own output is at {own:.1f} dB, the "
                 f"model's output with it alone quantized at "
                 f"{sqnr_words(layer.output_sqnr_db)})")
    return text
