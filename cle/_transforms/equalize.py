"""The implementation behind :mod:`cle.cross_layer_equalization` (its public face, where the API is documented)."""

from __future__ import annotations

import contextlib

import keras
import numpy as np

from cle._core.backend import check_runnable, exact_kernels, warn_fused_leaky_relu
from cle._core.graph import graph_view
from cle._core.inputs import check_calibration_data
from cle._core.rebuild import rebuild
from cle._transforms import exactness
from cle._transforms.exactness import NotExactError
from cle._transforms.bn_fold import FoldedPair
from cle._transforms.options import EqualizeOptions
from cle._transforms.plan import plan_equalization
from cle._transforms.relu6 import relu6_rebuild
from cle._transforms.report import EqualizationReport
from cle._transforms.stepwise import (
    BiasAbsorption, ClsSetInfo, CrossLayerScaling, HighBiasFold, set_info,
)

__all__ = [
    "BiasAbsorption",
    "ClsSetInfo",
    "CrossLayerScaling",
    "EqualizationReport",
    "HighBiasFold",
    "NotExactError",
    "equalize_checked",
    "equalize_model",
    "replace_relu6_with_clipped_relu",
    "replace_relu6_with_relu",
]


def replace_relu6_with_relu(model):
    """Replace every ReLU capped at 6 by an uncapped ReLU (the Nagel / AIMET-Keras step).

    Handles ``ReLU(max_value=6)``, ``Activation("relu6")`` and ``activation="relu6"`` fused into a
    Conv/Depthwise/Separable/Transpose/Dense layer. **This changes what the network computes**
    (on the real ImageNet MobileNetV2 it changes the top-1 class of some photos: the generated
    int8-modes table of docs/cross_layer_equalization.md);
    :func:`equalize_model` defaults to ``relu6="bound"``, which does not.

    Args:
        model: a Functional or Sequential ``keras.Model``.

    Returns:
        ``(new_model, replaced)``: a new model (``model`` is untouched) and the names of what
        was changed (fused activations as ``"name (fused activation)"``).
    """
    return relu6_rebuild(model, "replace")


def replace_relu6_with_clipped_relu(model):
    """Replace every ReLU capped at 6 by a :class:`cle.layers.ClippedReLU` with caps 6.

    The function computed does not change; the per-channel caps then let cross-layer scaling
    cross the activation exactly (``CrossLayerScaling.scale_model`` divides the caps by the
    scale factors). A fused ``activation="relu6"`` becomes a linear layer followed by a new
    ``ClippedReLU`` named ``"<layer>_relu6"``.

    Args:
        model: a Functional or Sequential ``keras.Model``.

    Returns:
        ``(new_model, replaced)`` as for :func:`replace_relu6_with_relu`.
    """
    return relu6_rebuild(model, "bound")


def equalize_model(model, relu6="bound", high_bias_fold="none", margin=3.0,
                   return_report=False, bias_correction="none", calibration_data=None,
                   weight_bits=8, per_channel_weights=True, objective="quantized",
                   activation_bits=8, activation_ranges="bn", progress=None):
    """Run the data-free equalization pipeline and return a new model.

    Batch-norm folding, ReLU6 handling, cross-layer scaling and high-bias folding, with the new
    model built once. ``model`` is not modified.

    Args:
        model: a Functional or Sequential ``keras.Model``.
        relu6: "bound" (default): scale across ReLU6 exactly, turning each ReLU6 inside a set
            into a :class:`ClippedReLU` with per-channel caps ``6/s`` — the float output does not
            change. "replace": ReLU6 → ReLU first (Nagel / AIMET-Keras; changes the output).
            "keep": ReLU6 stays and ends a set.
        high_bias_fold: "none" (default): no high-bias folding. Measured on the real ImageNet
            MobileNetV2 (the generated int8-modes table of docs/cross_layer_equalization.md),
            it costs float accuracy without improving per-tensor INT8, so it is off unless
            asked for.
            "unpadded": absorb only into layers that see no zero padding (padding borders
            would see 0 instead of −c); "all": the textbook behaviour, into every layer.
        margin: the 3σ margin of high-bias folding.
        return_report: also return an :class:`EqualizationReport`.
        bias_correction: "none" (default), "analytic" (data-free: expected inputs from the
            folded BNs' γ, β divided by the scale factors) or "empirical" (needs
            ``calibration_data``): finish with :func:`cle.correct_bias` for the weight
            quantizer given by ``weight_bits`` / ``per_channel_weights``. The float model then
            changes slightly on purpose (it is corrected for its quantized weights).
        calibration_data: inputs (array, iterable of batches or ``tf.data.Dataset``) for
            ``bias_correction="empirical"`` and ``activation_ranges="calibration"``.
        weight_bits: bits of the weight quantizer that will run. With
            ``per_channel_weights`` and ``activation_bits`` it is the INT8 target (default:
            TFLite's default full-INT8 flow, 8-bit per-channel weights and 8-bit per-tensor
            activations). Scaling (``objective="quantized"``) and bias correction are chosen
            for it.
        per_channel_weights: per-channel (True, default) or per-tensor weight quantizer.
        activation_bits: bits of the activation quantizer (per-tensor).
        objective: "quantized" (default): choose each set's scales to lower the modelled
            quantization noise of the weights on both sides of every junction *and* of the
            activation tensors between them, for the target above; activation ranges come from
            the folded BNs' γ, β (data-free). A set whose modelled noise would not drop by at
            least the margin ``cle._math.noise.MIN_GAIN_DB`` (what the model can resolve:
            docs/quantization_aware_scaling.md) is left as it is (its ReLU6 stays fused), with
            the reason in the report.
            "weights": Nagel's / AIMET's weight-range equalization of every set.
        activation_ranges: where ``objective="quantized"`` takes each junction's activation
            statistics: "bn" (default, data-free: the folded BNs' γ, β with a heavy-tailed
            range model) or "calibration" (measured on ``calibration_data`` in one pass: the
            per-channel max, as TFLite's calibration takes it, and the moments).
        progress: optional ``callable(str)``: measuring activation ranges on calibration data
            reports each batch through it, and :func:`cle.correct_bias` (empirical) each layer.

    Returns:
        The new model, or ``(new_model, report)`` with ``return_report=True``.

    Raises:
        TypeError: ``model`` is not a ``keras.Model``.
        ValueError: an unknown option, or the graph of ``model`` cannot be read.

    Example:
        >>> equalized, report = cle.equalize_model(model, return_report=True)
        >>> print(report)
    """
    opts = EqualizeOptions.from_call(
        calibration_data, relu6=relu6, high_bias_fold=high_bias_fold, margin=margin,
        bias_correction=bias_correction, weight_bits=weight_bits,
        per_channel_weights=per_channel_weights, objective=objective,
        activation_bits=activation_bits, activation_ranges=activation_ranges)
    view = graph_view(model)
    x = None
    if opts.wants_data:  # refuse before any work what this backend cannot run, or bad data
        check_runnable(model, opts.data_use)
        x = check_calibration_data(model, calibration_data)  # the one check, the one copy
    new_model, report = equalize_checked(model, view, opts, x, progress, guard_inputs=x)
    warn_fused_leaky_relu(model, new_model)
    return (new_model, report) if return_report else new_model


@exact_kernels
def equalize_checked(model, view, opts: EqualizeOptions, x, progress=None, guard_inputs=None):
    """:func:`equalize_model` on what its door checked: ``view`` the model's graph view,
    ``opts`` its options, ``x`` the :class:`cle._core.inputs.ModelInputs` they need (or None).
    With ``guard_inputs`` (model inputs) and options that are exact (``relu6`` not
    "replace", no high-bias folding), the new model before its bias correction must compute
    what ``model`` does on them (:func:`cle._transforms.exactness.guard`, which raises
    :class:`cle._transforms.exactness.NotExactError`). Returns ``(new_model, report)``."""
    plan = plan_equalization(model, view, opts, x, progress)
    corrections = empirical = None
    applied: dict = {}
    if opts.bias_correction != "none":
        # Imported here: a call without bias correction does not pay for loading it.
        from cle._transforms import bias_correction as correction

        if opts.bias_correction == "analytic":  # into the plan's edits, before the rebuild
            corrections = correction.correct_in_plan(view, plan, opts, applied)
        else:  # a bias for every target in the rebuild; the pass corrects them in place
            empirical = correction.EmpiricalCorrection.prepare(view, plan)
    new_model, clones = rebuild(model, edits=plan.edits, bypass=plan.bypass)
    if guard_inputs is not None and opts.relu6 != "replace" and opts.high_bias_fold == "none":
        with _uncorrected(clones, applied):
            exactness.guard(view, new_model, clones, set(plan.bypass), set(plan.edits),
                            guard_inputs, "batch-norm folding and cross-layer scaling")
    if empirical is not None:
        corrections = empirical.run(view, plan, new_model, clones, x, opts, progress)
    report = EqualizationReport(
        folded=[FoldedPair(clones[id(m.target.layer)], m.bn_call.layer, m.bn_after)
                for m in plan.matches],
        fold_skipped=plan.fold_skipped,
        relu6=opts.relu6,
        relu6_changed=plan.relu6_changed,
        sets=[set_info(links, scales, [clones[id(la)] for la in _layers(links)])
              for links, scales in plan.scaled],
        set_ends=[(c.layer.name, r) for c, r in plan.search.ends],
        bias_absorptions=plan.absorptions,
        scaling=plan.decisions,
        objective=opts.objective,
        stable_changed=list(plan.stable_changed),
        layer_names=frozenset(n for c in view.calls for n in c.scope + (c.layer.name,)),
    )
    if corrections is not None:
        report.bias_corrections = corrections
    return new_model, report


@contextlib.contextmanager
def _uncorrected(clones, applied):
    """The new layers' biases without the analytic corrections ``applied`` (``{id(old
    layer): delta}``) for the block, then exactly as they were."""
    saved = []
    for key, delta in applied.items():
        bias = clones[key].bias
        value = keras.ops.convert_to_numpy(bias)
        saved.append((bias, value))
        bias.assign((value.astype(np.float64) + delta).astype(value.dtype))
    try:
        yield
    finally:
        for bias, value in saved:
            bias.assign(value)


def _layers(links):
    return [link.first.layer for link in links] + [links[-1].second.layer]
