"""Bias correction (Nagel et al. 2019, §4.2): keep each layer's float output mean after its
weights are quantized.

Quantizing a kernel ``W`` to ``Q(W) = W + ε`` shifts the layer's expected output by
``ε · E[x]``. Subtracting that from the bias removes the shift::

    b' = b − Σ_{k,c} ε[k, c, o] · E[x_c]        (Conv / Dense, interior positions)
    b'[c·mult + m] = b[·] − Σ_k ε[k, c, m] · E[x_c]   (DepthwiseConv)

with ``Q`` the weight quantizer the model will be deployed with,
:func:`cle.quantization.quantize_kernel` (symmetric, per tensor by default).

``E[x]`` per input channel comes either

* **analytically** (``bn_stats``): from the γ, β of a batch norm folded backward into the layer
  that produces ``x`` (the pre-activation is taken as ``N(β, γ²)`` per channel), carried
  through the layers in between: a linear / pass-through layer keeps the mean (ZeroPadding and
  MaxPooling approximately), a ReLU gives ``E = γ·φ(β/γ) + β·Φ(β/γ)``, a capped ReLU
  (ReLU6, :class:`cle.ClippedReLU`) the clipped-normal mean
  :func:`expected_clipped_normal`. A BatchNormalization left in the model also gives
  statistics for its own output. Anything else is a skip with a reason
  (:mod:`cle._transforms.bias_stats`); or
* **empirically** (``calibration_data``): in one forward pass over the calibration data, the
  float model and the model with quantized kernels and the corrections made so far run side
  by side through the graph, and each layer is corrected when it is reached by
  ``E[W_q ∗ x_q] − E[W ∗ x_f]`` (measured on the layer outputs themselves, so exact at every
  output position, padded borders included), so each measurement sees the already-corrected
  layers upstream. See :func:`_empirical_pass`.

The input model is never modified; the result is a new model with the same layer names.
"""

from cle._transforms.bias_correction import (  # noqa: F401
    BiasCorrectionRecord,
    bn_stats_from_folded_pairs,
    bn_stats_from_report,
    correct_bias,
    expected_clipped_normal,
    expected_relu_normal,
)

__all__ = [
    "BiasCorrectionRecord",
    "bn_stats_from_folded_pairs",
    "bn_stats_from_report",
    "correct_bias",
    "expected_clipped_normal",
    "expected_relu_normal",
]
