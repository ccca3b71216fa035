"""The empirical bias correction as it was before the one-pass rewrite (issue 10, item 4),
kept for tests only: a sub-model per layer re-runs the model prefix on the calibration data
(cost grows with the square of the depth). ``tests/test_bias_correction.py`` checks that
:func:`cle.correct_bias` (one forward pass) gives the same per-layer corrections.

It reuses the library's target selection, probes and quantized copy, so that what is compared
is the measuring pass itself.
"""

import warnings

import keras
import numpy as np

from cle._core.graph import graph_view
from cle._core.layouts import channel_axis, kernel_layers, kernel_specs, layout_of, read_weight
from cle._core.rebuild import LayerEdit, rebuild
from cle._transforms import bias_correction as BCI
from cle._transforms.bias_pass import quantized_kernel


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




def _quantized_copy(model, bits, per_channel):
    """``rebuild(model)`` with every kernel quantized as :func:`fake_quantize_weights` does."""
    qmodel, qclones = rebuild(model)
    for qlayer in kernel_layers(qmodel):
        for attr, axis, depthwise in kernel_specs(qlayer):
            var = getattr(qlayer, attr)
            var.assign(quantized_kernel(var, bits, per_channel, axis, depthwise))
    return qmodel, qclones


def _with_zero_biases(model, calls):
    """``model`` rebuilt with a zero bias in the layer of each of ``calls`` that has none."""
    edits = {id(c.layer): LayerEdit(config={"use_bias": True},
                                    variables={"bias": np.zeros(_n_out(c))},
                                    keep=tuple(layout_of(c.layer).kernel_attrs))
             for c in calls if not c.layer.use_bias}
    return rebuild(model, edits=edits)


def _quiet_call(fn, x):
    with warnings.catch_warnings():  # "structure of `inputs` doesn't match": harmless
        warnings.simplefilter("ignore", UserWarning)
        return fn(x, training=False)


def _measure(model, layer, qmodel, qlayer, call, batches, eps):
    """``E[W_q ∗ x_q] − E[W ∗ x]`` per output channel over the calibration data, where ``x``
    is ``layer``'s input in the float ``model`` and ``x_q`` ``qlayer``'s input in ``qmodel``
    (quantized kernels, biases corrected so far)."""
    sub_f = keras.Model(model.inputs, layer.input)
    sub_q = keras.Model(qmodel.inputs, qlayer.input)
    w = np.asarray(keras.ops.convert_to_numpy(layer.kernel), dtype=np.float64)
    in_shape = call.inputs[0].shape
    probe_f, probe_q = _probe(layer, w, in_shape), _probe(layer, w + eps, in_shape)
    axis = channel_axis(layer, len(call.outputs[0].shape))
    total, count, scale = None, 0, 0.0
    for x in batches:
        y = [np.asarray(keras.ops.convert_to_numpy(p(_quiet_call(sub, x))), dtype=np.float64)
             for p, sub in ((probe_f, sub_f), (probe_q, sub_q))]
        d = np.moveaxis(y[1] - y[0], axis, -1)
        d = d.reshape(-1, d.shape[-1])
        total = d.sum(axis=0) if total is None else total + d.sum(axis=0)
        count += d.shape[0]
        scale = max(scale, float(np.abs(y[0]).mean()))
    return total / count, scale


def _n_out(call):
    shape = call.outputs[0].shape
    return shape[channel_axis(call.layer, len(shape))]


def empirical_deltas(model, calibration_data, bits=8, per_channel=False):
    """``{layer name: (delta, scale)}`` for every layer that :func:`cle.correct_bias` would
    correct empirically, computed layer by layer: the bias is corrected by ``−delta``;
    ``scale`` is the mean ``|W ∗ x|`` of the layer's float kernel-only output (largest over
    the batches)."""
    view = graph_view(model)
    plan = [c for c in view.calls if layout_of(c.layer) is not None
            and not BCI._target_reason(view, c, lambda la: read_weight(la.kernel))]
    batches = BCI._check_data(model, calibration_data)
    new_model, clones = _with_zero_biases(model, plan)  # every layer with a bias
    qmodel, qclones = _quantized_copy(new_model, bits, per_channel)
    deltas = {}
    for call in plan:
        layer = call.layer
        qlayer = qclones[id(clones[id(layer)])]
        eps = BCI._kernel_error(read_weight(layer.kernel), layout_of(layer).kind, bits,
                                per_channel)
        delta, scale = _measure(model, layer, qmodel, qlayer, call, batches, eps)
        bias = qlayer.bias
        new_bias = np.asarray(keras.ops.convert_to_numpy(bias), np.float64) - delta
        bias.assign(keras.ops.convert_to_tensor(new_bias, dtype=bias.dtype))
        deltas[layer.name] = delta, scale
    return deltas
