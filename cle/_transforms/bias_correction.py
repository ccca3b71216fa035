"""The implementation behind :mod:`cle.bias_correction` (its public face, where the API is documented)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from cle._transforms import bias_steps
from cle._core.backend import check_runnable
from cle._transforms.bias_stats import (
    analytic_mean, bn_stats_from_folded_pairs, bn_stats_from_report, expected_clipped_normal,
    expected_relu_normal, normalize_stats)
from cle._core.inputs import check_calibration_data
from cle._core.graph import graph_view, run_call
from cle._core.layouts import (
    bias_on_wrong_axis, layout_of, read_weight, untouchable_reason)
from cle._core.rebuild import LayerEdit, gc_paused, rebuild
from cle._core.layouts import kernel_layers, kernel_specs
from cle._math.kernel_quant import quantize_kernel

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


def _in_channels(layer, kind):
    k = keras.ops.convert_to_numpy(layer.kernel)
    if kind == "dense":
        return k.shape[0]
    if kind == "depthwise":
        return k.shape[-2]
    return k.shape[-2] * int(getattr(layer, "groups", 1) or 1)


def _target_reason(view, call):
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
    if not np.isfinite(keras.ops.convert_to_numpy(layer.kernel)).all():
        return "its kernel is not finite"
    return None


def _kernel_error(layer, kind, bits, per_channel):
    w = np.asarray(keras.ops.convert_to_numpy(layer.kernel), dtype=np.float64)
    axis = -1 if per_channel else None  # the output-channel axis of these three kinds
    return quantize_kernel(w, bits, axis, kind == "depthwise") - w


def _check_data(model, data):
    """``data`` checked against ``model``'s inputs (:func:`cle._core.inputs.check_calibration_data`:
    data checked at a public function's door passes as it is)."""
    return check_calibration_data(model, data)



# ------------------------------------------------------------------------------- main


def _corrected_model(model, plan, deltas, in_place=False):
    """``model`` with the bias ``b`` of the layer of every call of ``plan`` replaced by
    ``b − delta`` (``deltas``: ``id(call) -> delta``, float64; a layer without a bias gets
    one). A :func:`rebuild` of ``model``, whose bias values are written once, as the new model
    is made; with ``in_place``, if every such layer has a bias already, ``model`` itself,
    corrected. Returns ``(model, clones)`` as :func:`rebuild` does (``clones`` is None in
    place)."""
    def new_bias(layer, delta):  # in float64; cast once, to the variable's dtype, when set
        return (read_weight(layer.bias).astype(np.float64) if layer.use_bias else 0.0) - delta

    if in_place and all(call.layer.use_bias for call in plan):
        for call in plan:
            bias = call.layer.bias
            bias.assign(keras.ops.convert_to_tensor(new_bias(call.layer, deltas[id(call)]),
                                                    dtype=bias.dtype))
        return model, None
    edits = {}
    for call in plan:
        layer = call.layer
        edits[id(layer)] = LayerEdit(config={} if layer.use_bias else {"use_bias": True},
                                     variables={"bias": new_bias(layer, deltas[id(call)])},
                                     keep=tuple(layout_of(layer).kernel_attrs))
    return rebuild(model, edits=edits)


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
    new_model, records, _ = _correct(model, bn_stats, calibration_data, bits, per_channel,
                                     progress, in_place=False)
    return (new_model, records) if return_report else new_model


def correct_bias_in_place(model, report, bn_stats, calibration_data, bits, per_channel,
                          progress):
    """Bias correction of a model the caller owns (one :func:`cle.equalize_model` has just
    built): corrected in place, or, if a corrected layer needs a bias added, rebuilt once with
    ``report``'s layers pointed at the new model's (through the rebuild's clone map).

    Returns:
        ``(model, records)``.
    """
    new_model, records, clones = _correct(
        model, bn_stats, calibration_data, bits, per_channel, progress, in_place=True)
    if clones is not None:
        report.folded = [type(p)(clones[id(p.layer)], p.bn, p.bn_after) for p in report.folded]
        for info in report.sets:
            for pair in info.cls_pair_info_list:
                pair.layer1, pair.layer2 = clones[id(pair.layer1)], clones[id(pair.layer2)]
    return new_model, records


@gc_paused()
def _correct(model, bn_stats, calibration_data, bits, per_channel, progress, in_place):
    """:func:`correct_bias`: ``(new model, records, clones or None)``. Runs under
    :func:`gc_paused` (building and walking a deep model pays for full collections over the
    input model's objects)."""
    if not isinstance(model, keras.Model):
        raise TypeError(f"Expected a keras.Model. Received: model of type {type(model).__name__}")
    if (bn_stats is None) == (calibration_data is None):
        raise ValueError("Give exactly one of `bn_stats` (analytic) and `calibration_data` "
                         "(empirical).")
    if progress is not None and not callable(progress):
        raise ValueError(f"`progress` must be None or a callable. Received: {progress!r}")
    say = progress or (lambda message: None)
    quantize_kernel(np.zeros(1), bits)  # validates bits
    if not isinstance(per_channel, (bool, np.bool_)):
        raise TypeError(f"`per_channel` must be True or False. Received: {per_channel!r}")
    view = graph_view(model)
    calls = [c for c in view.calls if layout_of(c.layer) is not None]
    records: dict[int, BiasCorrectionRecord] = {}
    plan = []  # (call, kind) of layers to correct
    for call in calls:
        reason = _target_reason(view, call)
        if reason:
            records[id(call)] = BiasCorrectionRecord(call.layer.name, "skipped", reason=reason)
        else:
            plan.append(call)

    analytic = {}
    if bn_stats is not None:
        stats = normalize_stats(bn_stats)
        keep = []
        for call in plan:
            kind = layout_of(call.layer).kind
            result, reason = analytic_mean(call, stats)
            if result is not None and result[0].shape[0] != _in_channels(call.layer, kind):
                result, reason = None, (f"the statistics have {result[0].shape[0]} channels, "
                                        f"the layer reads {_in_channels(call.layer, kind)}")
            if result is None:
                records[id(call)] = BiasCorrectionRecord(call.layer.name, "skipped",
                                                         reason=reason)
                continue
            analytic[id(call)] = result
            keep.append(call)
        plan = keep
        calibration = None
    else:
        check_runnable(model, "empirical bias correction")
        calibration = _check_data(model, calibration_data)

    deltas = {}
    for call, delta, mode, note in _measure(view, plan, analytic, calibration, bits,
                                            per_channel, say):
        deltas[id(call)] = delta
        records[id(call)] = _record(call.layer, mode, delta, note, not call.layer.use_bias)
    new_model, clones = _corrected_model(model, plan, deltas, in_place)
    ordered = [records[id(c)] for c in calls]
    for rec in ordered:
        if not rec.corrected:
            logger.info("bias of '%s' not corrected: %s", rec.layer, rec.reason)
    return new_model, ordered, clones


def _measure(view, plan, analytic, calibration, bits, per_channel, say):
    """Yield ``(call, delta, mode, note)`` for every call of ``plan``, in order: its bias is
    to be corrected by ``−delta``, measured analytically (``analytic``:
    ``id(call) -> (E[x], note)``) or with the ``calibration`` data."""
    if calibration is None:
        for call in plan:
            layer = call.layer
            kind = layout_of(layer).kind
            mean_x, note = analytic[id(call)]
            eps = _kernel_error(layer, kind, bits, per_channel)
            delta = _bias_delta(kind, eps, mean_x, int(getattr(layer, "groups", 1) or 1))
            yield call, delta, "analytic", note
    else:
        for call, delta in _empirical_pass(view, plan, calibration, bits, per_channel, say):
            yield call, delta, "empirical", ""


def _probe(layer, kernel, in_shape):
    """A copy of ``layer`` (same strides, padding, groups...) computing ``kernel ∗ x`` only
    (no bias, no activation)."""
    config = layer.get_config()
    config.update(use_bias=False, activation="linear", name=f"{layer.name}_bias_probe",
                  trainable=False)
    for key in ("kernel_regularizer", "activity_regularizer", "kernel_constraint"):
        config.pop(key, None)
    probe = type(layer).from_config(config)
    probe.build(in_shape)
    probe.kernel.assign(keras.ops.convert_to_tensor(kernel, dtype=probe.kernel.dtype))
    return probe


def _record(layer, mode, delta, note, added_bias):
    return BiasCorrectionRecord(layer.name, mode,
                                float(np.max(np.abs(delta))) if delta.size else 0.0,
                                note=note, added_bias=added_bias)


def _empirical_pass(view, plan, data, bits, per_channel, say, min_uses=None):
    """Measure the corrections of the layers of ``plan`` in one forward pass over the
    calibration ``data`` (:class:`cle._core.inputs.ModelInputs`); yield ``(call, delta)`` for each as it is measured (its bias is
    to be corrected by ``−delta``): in the order of ``plan``, except that a compiled run of
    blocks on one branch of a graph is measured ahead of the calls of a parallel branch.

    Two streams of activations go through the graph of ``view`` (the input model) call by
    call in topological order, on all the calibration data at once: ``f``, the float model,
    and ``q``, the model with every kernel quantized as :func:`cle.fake_quantize_weights`
    does and with the corrections measured so far. On reaching a layer of ``plan``,
    ``delta = E[W_q ∗ x_q + b] − E[W ∗ x_f + b]`` per output channel (mean over samples and
    positions, padded borders included; the same as the difference of the kernel-only
    outputs) is subtracted from the layer's ``q`` output before its activation, which is what
    the corrected bias ``b − delta`` computes. Activations are not quantized.

    The model is never modified: quantized kernels are values handed to the layers in a
    ``keras.StatelessScope``, and a layer's pre-activation output comes from a private copy
    of it (:mod:`cle._transforms.bias_steps`). Calls add no node to any model; a tensor is freed once its
    last consumer ran, and calls that lead to no layer of ``plan`` are not run. Once the
    streams have parted (at the first layer with weights), calls of a kind that occurs at
    least ``min_uses`` times (a convolution and its ReLU, or a run of such blocks) run
    compiled, both streams and the measurements in one function (:class:`cle._transforms.bias_steps.Steps`;
    ``min_uses`` defaults to :data:`cle._transforms.bias_steps.MIN_USES`); the other calls run eagerly.
    """
    needed, stack = set(), list(plan)
    while stack:
        call = stack.pop()
        if id(call) not in needed:
            needed.add(id(call))
            stack.extend(t.producer for t in call.inputs if t.producer is not None)
    calls = [c for c in view.calls if id(c) in needed]
    uses: dict[int, int] = {}
    for call in calls:
        for t in call.inputs:
            uses[id(t)] = uses.get(id(t), 0) + 1
    targets = {id(call): k for k, call in enumerate(plan, start=1)}
    steps = bias_steps.Steps(calls, targets, uses,
                         bias_steps.MIN_USES if min_uses is None else min_uses)

    announced = set()

    def announce(call):
        if id(call) in targets and id(call) not in announced:
            announced.add(id(call))
            say(f"[{targets[id(call)]}/{len(plan)}] {call.layer.name}: measuring its output "
                "mean error")

    live = {}  # id(Tensor) -> (float, quantized) values
    for t, a in zip(view.inputs, data.arrays):
        x = keras.ops.convert_to_tensor(a)
        live[id(t)] = (x, x)
    done = set()  # ids of calls run by the compiled step of an earlier call
    for call in calls:
        if id(call) in done:
            continue
        xf, xq = (list(v) for v in zip(*(live[id(t)] for t in call.inputs)))
        layer = call.layer
        k = targets.get(id(call))
        parted = not all(a is b for a, b in zip(xf, xq))
        out, unit, heads = None, [call], [call]
        compiled = steps.get(call, xf[0]) if parted or k is not None else None
        if compiled is not None:
            step, unit, heads = compiled
            for head in heads:
                announce(head)
            # Each layer's weights and, for the quantized stream, its kernels quantized (its
            # bias is not corrected yet: the pass corrects it after its call).
            out = step([(_weight_values(h.layer), _weight_values(h.layer, bits, per_channel))
                        for h in heads], xf[0], xq[0])
        announce(call)
        if out is None and k is not None:
            unit = heads = [call]
            out = steps.target(call, xf[0])(
                [(_weight_values(layer), _weight_values(layer, bits, per_channel))],
                xf[0], xq[0])
        if out is not None:
            done.update(id(c) for c in unit[1:])
            outs = [tuple(out[:2])]
            deltas = [np.asarray(keras.ops.convert_to_numpy(d), dtype=np.float64)
                      for d in out[2]]
        else:
            out_f = run_call(call, xf)
            if not parted and not getattr(layer, "weights", None):
                out_q = out_f  # same inputs, no weights: the streams have not parted yet
            else:
                with keras.StatelessScope(state_mapping=_quantized_kernels(layer, bits,
                                                                           per_channel)):
                    out_q = run_call(call, xq)
            outs = list(zip(out_f, out_q))
        for t in call.inputs:
            uses[id(t)] -= 1
            if uses[id(t)] == 0:
                live.pop(id(t), None)
        for t, pair in zip(unit[-1].outputs, outs):
            if uses.get(id(t), 0):
                live[id(t)] = pair
        if out is not None:
            yield from zip((h for h in heads if id(h) in targets), deltas)


def _quantized_kernels(layer, bits, per_channel):
    """``[(kernel variable, its quantized value)]`` for every kernel of ``layer`` (its
    sub-layers included)."""
    if not getattr(layer, "weights", None):
        return []
    return [(getattr(qlayer, attr), _quantized_kernel(getattr(qlayer, attr), bits,
                                                      per_channel, axis, depthwise))
            for qlayer in ([layer] if layout_of(layer) is not None else [])
            + kernel_layers(layer)
            for attr, axis, depthwise in kernel_specs(qlayer)]


def _weight_values(layer, bits=None, per_channel=False):
    """The values of ``layer.weights``, in order; with ``bits``, its kernels quantized as
    :func:`cle.fake_quantize_weights` quantizes them."""
    values = {id(w): w.value for w in layer.weights}
    if bits is not None:
        values.update((id(var), q) for var, q in _quantized_kernels(layer, bits, per_channel))
    return [values[id(w)] for w in layer.weights]


def _quantized_kernel(var, bits, per_channel, axis, depthwise):
    """The kernel variable ``var`` quantized, as a tensor of its dtype."""
    return keras.ops.convert_to_tensor(
        quantize_kernel(read_weight(var), bits, axis if per_channel else None, depthwise),
        dtype=var.dtype)


def _quantize_kernels(layers, bits, per_channel):
    """Quantize every kernel of ``layers`` in place."""
    for qlayer in layers:
        for attr, axis, depthwise in kernel_specs(qlayer):
            var = getattr(qlayer, attr)
            var.assign(_quantized_kernel(var, bits, per_channel, axis, depthwise))


def _quantized_copy(model, bits, per_channel):
    """``rebuild(model)`` with every kernel quantized as :func:`fake_quantize_weights` does."""
    qmodel, qclones = rebuild(model)
    _quantize_kernels(kernel_layers(qmodel), bits, per_channel)
    return qmodel, qclones
