"""The implementation behind :mod:`cle.bias_correction` (its public face, where the API is documented)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from cle._core.backend import check_runnable
from cle._core.graph import graph_view, rebuilt_view
from cle._core.inputs import check_calibration_data
from cle._core.layouts import bias_on_wrong_axis, layout_of, read_weight, untouchable_reason
from cle._core.rebuild import LayerEdit, gc_paused, rebuild
from cle._core.weights import gamma_beta
from cle._math.kernel_quant import quantize_kernel, round_kernel
from cle._transforms.bias_pass import empirical_pass, kernel_rounding
from cle._transforms.bias_stats import (
    Semantics, analytic_mean, bn_stats_from_folded_pairs, bn_stats_from_report,
    expected_clipped_normal, expected_relu_normal, normalize_stats)

__all__ = [
    "BiasCorrectionRecord",
    "bn_stats_from_folded_pairs",
    "bn_stats_from_report",
    "correct_bias",
    "expected_clipped_normal",
    "expected_relu_normal",
]

logger = logging.getLogger("cle.bias_correction")

_KINDS = ("conv", "depthwise", "dense")


# ------------------------------------------------------------------------------- math


def _bias_delta(kind, eps, mean_x, groups=1) -> np.ndarray:
    """``Σ ε · E[x]`` per output channel, for a kernel error ``eps`` of layer kind ``kind``."""
    eps = np.asarray(eps, dtype=np.float64)
    mean_x = np.asarray(mean_x, dtype=np.float64)
    if kind == "dense":
        return mean_x @ eps
    summed = eps.reshape((-1,) + eps.shape[-2:]).sum(axis=0)  # (in[/groups], out|mult)
    if kind == "depthwise":
        return (summed * mean_x[:, None]).reshape(-1)  # output channel c*mult + m
    in_g, out = summed.shape
    per_group = mean_x.reshape(groups, in_g)[np.arange(out) // (out // groups)]  # (out, in_g)
    return (summed.T * per_group).sum(axis=1)


# --------------------------------------------------------------------------- records


@dataclasses.dataclass
class BiasCorrectionRecord:
    """What :func:`correct_bias` did to one layer.

    Attributes:
        layer: layer name.
        mode: "analytic", "empirical" or "skipped".
        max_abs_delta: largest ``|Δbias|`` applied (0 when skipped).
        reason: why the layer was skipped ("" otherwise).
        note: approximations made on the way (e.g. a MaxPooling taken as keeping the mean).
        added_bias: the layer had no bias and got one.
    """

    layer: str
    mode: str
    max_abs_delta: float = 0.0
    reason: str = ""
    note: str = ""
    added_bias: bool = False

    @property
    def corrected(self) -> bool:
        return self.mode != "skipped"

    def __str__(self):
        if not self.corrected:
            return f"{self.layer}: skipped, {self.reason}"
        extra = f" ({self.note})" if self.note else ""
        return f"{self.layer}: {self.mode}, max |Δbias| {self.max_abs_delta:.3g}{extra}"


# ----------------------------------------------------------------------------- checks


def _in_channels(kernel, kind, groups):
    if kind == "dense":
        return kernel.shape[0]
    if kind == "depthwise":
        return kernel.shape[-2]
    return kernel.shape[-2] * groups


def _groups(layer):
    return int(getattr(layer, "groups", 1) or 1)


def _target_reason(view, call, kernel_of):
    """Why the layer of ``call`` is not corrected, or None; ``kernel_of(layer)``: the kernel
    the layer will have."""
    layer = call.layer
    layout = layout_of(layer)
    reason = untouchable_reason(layer, view.n_calls(layer))
    if reason:
        return reason
    if layout.kind not in _KINDS:
        return (f"{type(layer).__name__} layers are not corrected yet (only Conv, "
                "DepthwiseConv and Dense)")
    reason = bias_on_wrong_axis(layer, call.outputs[0].shape)
    if reason:
        return reason
    if not np.isfinite(kernel_of(layer)).all():
        return "its kernel is not finite"
    return None


def _kernel_error(kernel, kind, bits, per_channel, rounding="nearest"):
    w = np.asarray(kernel, dtype=np.float64)
    axis = -1 if per_channel else None  # the output-channel axis of these three kinds
    return round_kernel(w, bits, axis, kind == "depthwise", rounding) - w


def _check_data(model, data):
    """``data`` checked against ``model``'s inputs (:func:`cle._core.inputs.check_calibration_data`:
    data checked at a public function's door passes as it is)."""
    return check_calibration_data(model, data)


def _check_arguments(model, bn_stats, calibration_data, bits, per_channel, progress):
    if not isinstance(model, keras.Model):
        raise TypeError(f"Expected a keras.Model. Received: model of type {type(model).__name__}")
    if (bn_stats is None) == (calibration_data is None):
        raise ValueError("Give exactly one of `bn_stats` (analytic) and `calibration_data` "
                         "(empirical).")
    if progress is not None and not callable(progress):
        raise ValueError(f"`progress` must be None or a callable. Received: {progress!r}")
    quantize_kernel(np.zeros(1), bits)  # validates bits
    if not isinstance(per_channel, (bool, np.bool_)):
        raise TypeError(f"`per_channel` must be True or False. Received: {per_channel!r}")


# ------------------------------------------------------------------------------- main


def _targets(view, kernel_of):
    """``(calls, records, targets)``: the calls of layers with a layout in graph order, a
    skip record for each that is not corrected, and the calls that are."""
    calls = [c for c in view.calls if layout_of(c.layer) is not None]
    records: dict[int, BiasCorrectionRecord] = {}
    targets = []
    for call in calls:
        reason = _target_reason(view, call, kernel_of)
        if reason:
            records[id(call)] = BiasCorrectionRecord(call.layer.name, "skipped", reason=reason)
        else:
            targets.append(call)
    return calls, records, targets


def _analytic_deltas(targets, sem, kernel_of, bits, per_channel, records, rounding="nearest"):
    """``{id(call): (delta, note)}`` for every target whose expected input ``sem`` gives; a
    skip record in ``records`` for the others."""
    deltas = {}
    for call in targets:
        layer = call.layer
        kind = layout_of(layer).kind
        kernel = kernel_of(layer)
        result, reason = analytic_mean(call, sem)
        if result is not None and result[0].shape[0] != _in_channels(kernel, kind,
                                                                     _groups(layer)):
            result, reason = None, (f"the statistics have {result[0].shape[0]} channels, the "
                                    f"layer reads {_in_channels(kernel, kind, _groups(layer))}")
        if result is None:
            records[id(call)] = BiasCorrectionRecord(layer.name, "skipped", reason=reason)
            continue
        mean_x, note = result
        eps = _kernel_error(kernel, kind, bits, per_channel,
                            kernel_rounding(layer, rounding))
        deltas[id(call)] = (_bias_delta(kind, eps, mean_x, _groups(layer)), note)
    return deltas


def _corrected_bias(bias, delta):
    """``bias − delta`` in float64 (``bias`` None: the layer had none); cast once, to the
    variable's dtype, when it is assigned."""
    return (0.0 if bias is None else np.asarray(bias, dtype=np.float64)) - delta


def _ordered(calls, records):
    ordered = [records[id(c)] for c in calls]
    for rec in ordered:
        if not rec.corrected:
            logger.info("bias of '%s' not corrected: %s", rec.layer, rec.reason)
    return ordered


def _record(layer, mode, delta, note, added_bias):
    return BiasCorrectionRecord(layer.name, mode,
                                float(np.max(np.abs(delta))) if delta.size else 0.0,
                                note=note, added_bias=added_bias)


def correct_bias(model, bn_stats=None, calibration_data=None, bits=8, per_channel=False,
                 progress: Callable[[str], Any] | None = None, return_report=False):
    """Correct each Conv/DepthwiseConv/Dense bias for the mean error of its quantized weights.

    For every such layer (topological order), ``ε = quantize_kernel(W, bits, per_channel) − W``
    and ``b −= Σ ε · E[x]`` (a zero bias is added first to a layer without one), so that the
    model with quantized weights keeps the float model's expected outputs.

    Args:
        model: a Functional or Sequential ``keras.Model``, usually with batch norms folded
            (:func:`cle.equalize_model` or :func:`cle.fold_all_batch_norms`); not modified.
        bn_stats: analytic mode: ``{producing layer or its name: (γ, β)}`` per output channel
            of that layer's pre-activation output (see :func:`bn_stats_from_report`,
            :func:`bn_stats_from_folded_pairs`). Unfolded BatchNormalization layers are used
            too.
        calibration_data: empirical mode: array ``(N, *input_shape)``, or an iterable /
            ``tf.data.Dataset`` of input batches (or ``(x, y)`` batches). Exactly one of
            ``bn_stats`` and ``calibration_data`` must be given.
        bits: weight bit width of the deployed quantizer.
        per_channel: the deployed quantizer uses one scale per output channel.
        progress: optional ``callable(str)`` called once per layer (empirical mode), as the
            pass reaches it.
        return_report: also return the list of :class:`BiasCorrectionRecord`.

    Returns:
        The new model, or ``(new_model, records)``.

    Raises:
        TypeError: ``model`` is not a ``keras.Model``.
        ValueError: bad arguments.
    """
    new_model, records = _correct(model, bn_stats, calibration_data, bits, per_channel,
                                  progress)
    return (new_model, records) if return_report else new_model


@gc_paused()
def _correct(model, bn_stats, calibration_data, bits, per_channel, progress):
    """:func:`correct_bias`: ``(new model, records)``, the new model built once. Runs under
    :func:`gc_paused` (building and walking a deep model pays for full collections over the
    input model's objects)."""
    _check_arguments(model, bn_stats, calibration_data, bits, per_channel, progress)
    say = progress or (lambda message: None)
    view = graph_view(model)

    def kernel_of(layer):
        return read_weight(layer.kernel)

    calls, records, targets = _targets(view, kernel_of)
    if bn_stats is not None:
        deltas = _analytic_deltas(targets, Semantics(normalize_stats(bn_stats)), kernel_of,
                                  bits, per_channel, records)
        mode = "analytic"
    else:
        check_runnable(model, "empirical bias correction")
        x = _check_data(model, calibration_data)
        deltas = {id(call): (delta, "") for call, delta in
                  empirical_pass(view, targets, x, bits, per_channel, say)}
        mode = "empirical"
    edits = {}
    for call in targets:
        if id(call) not in deltas:
            continue
        layer = call.layer
        delta, note = deltas[id(call)]
        records[id(call)] = _record(layer, mode, delta, note, not layer.use_bias)
        bias = read_weight(layer.bias) if layer.use_bias else None
        edits[id(layer)] = LayerEdit(config={} if layer.use_bias else {"use_bias": True},
                                     variables={"bias": _corrected_bias(bias, delta)},
                                     keep=tuple(layout_of(layer).kernel_attrs))
    new_model, _ = rebuild(model, edits=edits)
    return new_model, _ordered(calls, records)


# ----------------------------------------------------- inside equalize_model's one plan


def planned_semantics(plan) -> Semantics:
    """What the walk of analytic correction reads on the input model's view, as
    :func:`cle.equalize_model`'s plan leaves the model: the statistics of each layer a BN is
    folded backward into, divided by the scale factor of the set where it is the first layer
    (``γ/s, β/s``; not for a layer that gave bias away by high-bias folding, as
    :func:`bn_stats_from_report`), folded BNs passed through, ReLU6 clips as planned."""
    scale = {id(link.first.layer): np.asarray(s) for links, scales in plan.scaled
             for link, s in zip(links, scales)}
    absorbed = {r.layer1 for r in plan.absorptions if r.absorbed}
    folded = {}  # the last BN folded backward into a layer describes its output
    for m in plan.matches:
        if m.bn_after:
            folded[id(m.target.layer)] = (m.target.layer, m.bn_call.layer)
    stats = {}
    for key, (layer, bn) in folded.items():
        if layer.name in absorbed:
            logger.info("no statistics for '%s': high-bias folding moved part of its bias",
                        layer.name)
            continue
        gamma, beta = gamma_beta(bn)
        s = scale.get(key, 1.0)
        stats[layer.name] = (gamma / s, beta / s)
    return Semantics(stats, frozenset(plan.bypass), dict(plan.clips))


def _planned_kernel(plan, layer):
    """The kernel ``layer`` will have in the new model (the plan's values, in its dtype)."""
    edit = plan.edits.get(id(layer))
    if edit is None or not edit.sets_weights:
        return read_weight(layer.kernel)
    return edit.new_values(np.dtype(layer.kernel.dtype))["kernel"]


def _out_channels(kernel, kind):
    return kernel.shape[-2] * kernel.shape[-1] if kind == "depthwise" else kernel.shape[-1]


def _had_bias(plan, layer) -> bool:
    """Whether ``layer`` has a bias in the new model before correction (a fold may add one)."""
    edit = plan.edits.get(id(layer))
    if edit is not None and "use_bias" in edit.config:
        return bool(edit.config["use_bias"])
    return bool(getattr(layer, "use_bias", False))


def _with_bias(plan, layer, delta):
    """Write ``bias − delta`` into the plan's edit of ``layer`` (a zero bias first where the
    layer has none)."""
    edit = plan.edits.get(id(layer)) or LayerEdit()
    attrs = tuple(layout_of(layer).kernel_attrs) + (("bias",) if _had_bias(plan, layer) else ())
    planned = edit.new_values if edit.sets_weights else None

    def compute(dtype=None):
        values = dict(planned(dtype)) if planned is not None else {
            attr: read_weight(getattr(layer, attr)) for attr in attrs}
        values["bias"] = _corrected_bias(values.get("bias"), delta)
        return values

    plan.edits[id(layer)] = dataclasses.replace(
        edit, config={**edit.config, "use_bias": True}, variables={}, compute=compute, keep=())


def correct_in_plan(view, plan, opts, applied: dict | None = None):
    """Analytic bias correction of :func:`cle.equalize_model`, computed on the input model's
    ``view`` from the planned weights and written into ``plan.edits`` before the one
    rebuild. Returns the records; ``applied``, if given, receives ``{id(layer): delta}`` of
    every corrected layer (its new bias is the planned one less ``delta``)."""
    def kernel_of(layer):
        return _planned_kernel(plan, layer)

    calls, records, targets = _targets(view, kernel_of)
    deltas = _analytic_deltas(targets, planned_semantics(plan), kernel_of, opts.weight_bits,
                              opts.per_channel_weights, records, opts.weight_rounding)
    for call in targets:
        if id(call) in deltas:
            delta, note = deltas[id(call)]
            records[id(call)] = _record(call.layer, "analytic", delta, note,
                                        not _had_bias(plan, call.layer))
            _with_bias(plan, call.layer, delta)
            if applied is not None:
                applied[id(call.layer)] = delta
    return _ordered(calls, records)


@dataclasses.dataclass
class EmpiricalCorrection:
    """Empirical bias correction inside :func:`cle.equalize_model`: the targets are chosen on
    the input model's view and given a bias in the plan (zero where they have none:
    :meth:`prepare`), so that after the one rebuild the pass corrects the new model in place
    (:meth:`run`), walking the view of the new model derived from the input model's
    (:func:`cle._core.graph.rebuilt_view`)."""

    calls: list
    records: dict
    targets: list
    added: set  # ids of target layers that had no bias

    @classmethod
    def prepare(cls, view, plan):
        calls, records, targets = _targets(view, lambda layer: _planned_kernel(plan, layer))
        added = set()
        for call in targets:
            layer = call.layer
            if not _had_bias(plan, layer):
                added.add(id(layer))
                kernel = _planned_kernel(plan, layer)
                _with_bias(plan, layer, np.zeros(_out_channels(kernel, layout_of(layer).kind)))
        return cls(calls, records, targets, added)

    @gc_paused()
    def run(self, view, plan, new_model, clones, x, opts, progress):
        """Correct ``new_model``'s biases in place on the calibration inputs ``x`` (checked
        against the model); returns the records. Runs under :func:`gc_paused`, as
        :func:`correct_bias` does."""
        new_view, new_call = rebuilt_view(view, new_model, clones, plan.bypass)
        by_new = {id(new_call[id(c)]): c for c in self.targets}
        for call, delta in empirical_pass(new_view, [new_call[id(c)] for c in self.targets],
                                          x, opts.weight_bits, opts.per_channel_weights,
                                          progress or (lambda message: None),
                                          rounding=opts.weight_rounding):
            bias = call.layer.bias
            bias.assign(keras.ops.convert_to_tensor(
                _corrected_bias(read_weight(bias), delta), dtype=bias.dtype))
            old = by_new[id(call)]
            self.records[id(old)] = _record(old.layer, "empirical", delta, "",
                                            id(old.layer) in self.added)
        return _ordered(self.calls, self.records)
