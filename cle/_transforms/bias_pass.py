"""The empirical bias-correction pass: one forward pass of two activation streams (the float
model and the model with quantized kernels) over a graph view, measuring each corrected
layer's output mean error as the pass reaches it (:func:`empirical_pass`). Used by
:func:`cle.correct_bias` on the view of its input model and by :func:`cle.equalize_model` on
the view of the model its rebuild made (:func:`cle._core.graph.rebuilt_view`)."""

from __future__ import annotations

import keras
import numpy as np

from cle._core.graph import calls_leading_to, run_call
from cle._core.layouts import kernel_layers, kernel_specs, layout_of, read_weight
from cle._math.kernel_quant import round_kernel
from cle._transforms import bias_steps

__all__ = ["TAPSUM_LAYERS", "empirical_pass", "kernel_rounding", "quantized_kernel",
           "quantized_kernels", "weight_values"]

#: The layers whose kernels ``rounding="tapsum"`` puts on their grid (TF Lite's converter
#: quantizes them per output channel, or per tensor, on the grid
#: :func:`cle._math.kernel_quant.round_kernel` assumes); other kernels are rounded to nearest.
TAPSUM_LAYERS = (keras.layers.Conv2D, keras.layers.DepthwiseConv2D)


def kernel_rounding(layer, rounding: str) -> str:
    """The rounding ``layer``'s kernels get when the model's is ``rounding``."""
    return rounding if type(layer) in TAPSUM_LAYERS else "nearest"


def empirical_pass(view, plan, data, bits, per_channel, say, min_uses=None,
                   rounding="nearest"):
    """Measure the corrections of the layers of ``plan`` in one forward pass over the
    calibration ``data`` (:class:`cle._core.inputs.ModelInputs`, one array per model input);
    yield ``(call, delta)`` for each as it is measured (its bias is
    to be corrected by ``−delta``): in the order of ``plan``, except that a compiled run of
    blocks on one branch of a graph is measured ahead of the calls of a parallel branch.

    Two streams of activations go through the graph of ``view`` (the input model) call by
    call in topological order, on all the calibration data at once: ``f``, the float model,
    and ``q``, the model with every kernel quantized as :func:`cle.fake_quantize_weights`
    does (rounded by ``rounding``: :func:`cle._math.kernel_quant.round_kernel`) and with the
    corrections measured so far. On reaching a layer of ``plan``,
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
    calls = calls_leading_to(view, plan)
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
            out = step([(weight_values(h.layer),
                         weight_values(h.layer, bits, per_channel, rounding))
                        for h in heads], xf[0], xq[0])
        announce(call)
        if out is None and k is not None:
            unit = heads = [call]
            out = steps.target(call, xf[0])(
                [(weight_values(layer), weight_values(layer, bits, per_channel, rounding))],
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
                with keras.StatelessScope(state_mapping=quantized_kernels(
                        layer, bits, per_channel, rounding)):
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


def quantized_kernels(layer, bits, per_channel, rounding="nearest"):
    """``[(kernel variable, its quantized value)]`` for every kernel of ``layer`` (its
    sub-layers included)."""
    if not getattr(layer, "weights", None):
        return []
    return [(getattr(qlayer, attr), quantized_kernel(getattr(qlayer, attr), bits,
                                                      per_channel, axis, depthwise,
                                                      kernel_rounding(qlayer, rounding)))
            for qlayer in ([layer] if layout_of(layer) is not None else [])
            + kernel_layers(layer)
            for attr, axis, depthwise in kernel_specs(qlayer)]


def weight_values(layer, bits=None, per_channel=False, rounding="nearest"):
    """The values of ``layer.weights``, in order; with ``bits``, its kernels quantized as
    :func:`cle.fake_quantize_weights` quantizes them."""
    values = {id(w): w.value for w in layer.weights}
    if bits is not None:
        values.update((id(var), q) for var, q in quantized_kernels(layer, bits, per_channel,
                                                                   rounding))
    return [values[id(w)] for w in layer.weights]


def quantized_kernel(var, bits, per_channel, axis, depthwise, rounding="nearest"):
    """The kernel variable ``var`` quantized, as a tensor of its dtype."""
    return keras.ops.convert_to_tensor(
        round_kernel(read_weight(var), bits, axis if per_channel else None, depthwise,
                     rounding),
        dtype=var.dtype)
