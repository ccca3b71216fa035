"""Measurement helpers for the documentation generators (``scripts/gen_*.py``): what they
need of the planner and the noise model beyond the public API, in one documented place, so that
the generators import nothing else of the package's internals.

* :func:`noise_settings`: the noise model's module constants (and functions) set for a while:
  the do-no-harm margin sweep and the range-model fit of docs/quantization_aware_scaling.md.
* :func:`junction_study`: every junction of a scaling set whose folded BN the data-free model
  reads, measured on inputs against what the model predicts from the BN (the ``int8-range-fit``
  block of docs/results.md).
* :func:`noise_constant`: a constant of the noise model, for the record a generator saves.
"""

from __future__ import annotations

import contextlib

import keras
import numpy as np
from scipy.stats import norm

from cle._core.graph import graph_view
from cle._core.layouts import channel_axis
from cle._core.weights import gamma_beta
from cle._math import noise
from cle._transforms import scale_choice
from cle._transforms.bn_match import find_matches, fold_plan
from cle._transforms.options import EqualizeOptions
from cle._transforms.plan import decide_sets, pre_activation
from cle._transforms.scaling import PlannedWeights
from cle._transforms.sets import find_sets

__all__ = ["junction_study", "noise_constant", "noise_settings"]

_CAPPED = ("relu6", "clipped")


@contextlib.contextmanager
def noise_settings(settings, **functions):
    """:mod:`cle._math.noise`'s module constants (and functions) set to ``settings`` (and
    ``functions``) for the block, then put back."""
    settings = {**settings, **functions}
    saved = {k: getattr(noise, k) for k in settings}
    try:
        for k, v in settings.items():
            setattr(noise, k, v)
        yield
    finally:
        for k, v in saved.items():
            setattr(noise, k, v)


def noise_constant(name):
    """A module constant of :mod:`cle._math.noise` (e.g. ``"ASSUMED_CALIBRATION_SAMPLES"``)."""
    return getattr(noise, name)


def _decisions(plan, matches, edits, model, scales, fit_models):
    """The planner's per-set decisions for the scales named ``scales``: ``"nagel"`` (weight
    equalization of every set), or each set's choice under the range model of that name in
    ``fit_models`` with no margin."""
    if scales == "nagel":
        def choose(w, junctions, target, extra=(), min_gain_db=0.0):  # Nagel's: the one extra
            return noise.Choice([np.where(np.isfinite(e) & (e > 0), e, 1.0) for e in extra[0]],
                                1.0, 0.0, None, 1.0)
        settings = noise_settings({}, choose_scales=choose)
    else:
        settings = noise_settings({**dict(fit_models)[scales], "MIN_GAIN_DB": 0.0})
    with settings:
        return decide_sets(model, plan, matches, PlannedWeights(edits), EqualizeOptions(),
                           None, None)[0]


def _moments(model, links, x):
    """Per channel of each link's pre-activation on ``x``: max, min, sum, sum of squares,
    count."""
    probe = keras.Model(model.inputs, [pre.output for *_, pre in links])
    acc = [None] * len(links)
    for b in range(0, len(x), 8):
        for n, ((_, _, link, _), out) in enumerate(zip(links, probe(x[b: b + 8], training=False))):
            out = keras.ops.convert_to_numpy(out).astype(np.float64)
            axis = channel_axis(link.first.layer, out.ndim)
            v = np.moveaxis(out, axis, -1).reshape(-1, out.shape[axis])
            got = [v.max(axis=0), v.min(axis=0), v.sum(axis=0), np.square(v).sum(axis=0), len(v)]
            if acc[n] is None:
                acc[n] = got
            else:
                acc[n] = [np.maximum(acc[n][0], got[0]), np.minimum(acc[n][1], got[1])] + [
                    a + g for a, g in zip(acc[n][2:], got[2:])]
    return acc


def junction_study(model, x, scale_names, fit_models):
    """One row per junction of a scaling set whose folded BN the data-free model reads: the
    BN's prediction against the pre-activation measured on ``x``, and for the capped junctions
    the per-tensor range of each range model of ``fit_models`` (``[(label, noise settings)]``)
    against the measured one, before and after each scaling of ``scale_names`` (labels of
    ``fit_models``, or ``"nagel"``)."""
    view = graph_view(model)
    matches, _ = find_matches(view)
    edits, _ = fold_plan(matches)
    folded = {id(m.bn_call.layer) for m in matches}
    plan = find_sets(view, "bound", transparent=folded)
    bns = {id(m.target.layer): gamma_beta(m.bn_call.layer) for m in matches if m.bn_after}
    value = PlannedWeights(edits).exact
    links = [(i, k, link, pre_activation(link, folded))
             for i, links in enumerate(plan.sets) for k, link in enumerate(links)
             if id(link.first.layer) in bns]
    links = [row for row in links if row[3] is not None]
    acc = _moments(model, links, x)
    decisions = {name: _decisions(plan, matches, edits, model, name, fit_models)
                 for name in scale_names}
    return [_junction_row(i, k, link, stats, bns, value, decisions, fit_models)
            for (i, k, link, _), stats in zip(links, acc)]


def _junction_row(i, k, link, stats, bns, value, decisions, fit_models):
    hi, lo, s1, s2, count = stats
    gamma, beta = bns[id(link.first.layer)]
    gamma = np.abs(gamma)
    kind, cap = scale_choice.junction_kind(link, value)
    positions = scale_choice.positions(link)
    # The model's maxima are of as many values as the library assumes it calibrates on.
    values = positions * noise.ASSUMED_CALIBRATION_SAMPLES
    z = noise.tail_z(values)
    mean = s1 / count
    std = np.sqrt(np.maximum(s2 / count - mean ** 2, 0.0))
    ok = gamma > 1e-6 * gamma.max()
    top = (hi - beta) / np.where(ok, gamma, 1.0)  # the measured top, in the BN's σ
    live = ok & (top > 0)
    logs = np.log(top[live] / z)
    bb = float(beta[ok] @ beta[ok])
    row = {
        "set": i, "junction": k, "layer": link.first.layer.name,
        "producer": ("depthwise" if isinstance(link.first.layer, keras.layers.DepthwiseConv2D)
                     else "conv"),
        "kind": kind, "positions": positions, "channels": int(len(beta)),
        "std_over_gamma": float(np.median(std[ok] / gamma[ok])),
        # Least-squares slope of the mean on β over the channels; None when β is about 0
        # against γ (a linear bottleneck's BN), where it says nothing.
        "mean_over_beta": (float(mean[ok] @ beta[ok]) / bb
                           if bb >= 0.01 * float(gamma[ok] @ gamma[ok]) else None),
        "max_measured": float(hi.max()),
        "max_laplace": float(np.max(beta + z * gamma)),
        "max_normal": float(np.max(beta + norm.isf(1.0 / values) * gamma)),
        "log_offset": float(logs.mean()), "log_scatter": float(logs.std()),
    }
    if kind in _CAPPED:
        scales = {"before": np.ones_like(beta)}
        scales.update({name: d[i].scales[k] for name, d in decisions.items() if d[i].scaled})
        # What the converter calibrates: only hi, lo and the cap enter the range.
        capv = np.broadcast_to(np.asarray(cap, dtype=np.float64), beta.shape).copy()
        measured = noise.Junction(hi, lo, kind, capv, *[np.zeros_like(beta)] * 3)
        ranges = {"measured": {n: noise.tensor_range(measured, s)[0] for n, s in scales.items()}}
        for label, settings in fit_models:
            with noise_settings(settings):
                j = noise.junction_from_bn(gamma, beta, kind, cap, positions)
            ranges[label] = {n: noise.tensor_range(j, s)[0] for n, s in scales.items()}
        row["ranges"] = ranges
    return row
