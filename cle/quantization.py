"""From a Keras model to its full-INT8 TF Lite model, with data or without, checked.

:func:`quantize` takes a Keras model to a checked full-INT8 TF Lite model. It runs the whole route in one call:

1. **check** the options and the calibration data against the model (nothing is transformed
   before every input is known to be usable);
2. **equalize** (:func:`cle.equalize_model`): BN folding, cross-layer scaling chosen for the
   stated INT8 target, and bias correction — empirical on the calibration data, or analytic
   from the folded BNs without data;
3. **calibration inputs**: the given data, less a held-out part for the check; without data,
   synthetic inputs distilled from the model's own BN statistics (:mod:`cle._measure.synthetic`);
4. **activation ranges**: TF Lite's converter records each activation tensor's min/max on the
   calibration inputs; ``ranges="auto"`` (default) and ``"percentile"`` then replace each by the range that
   holds all but a ``1e-4`` share of the tensor's values on each side (the model's output keeps
   its min/max: clipping the largest logits would change the top-1 class). One rare extreme
   value otherwise sets the step of every value of the tensor;
5. **convert** with TF Lite's converter (``cle._tflite.converter``: its calibrate and quantize steps,
   with the ranges written in between). With ``weight_bits=4`` or a ``rounding`` other than to
   nearest, the kernels are first rounded layer by layer for their outputs after equalizing
   (:mod:`cle._quantize.rounding`, on the calibration inputs) and stored exactly in the
   ``.tflite`` after converting (INT4 where LiteRT runs it, :mod:`cle._tflite.weight_store`);
6. **check** the ``.tflite`` with LiteRT against the float model on inputs it was not
   calibrated on: top-1 agreement and logit SQNR.

Example:
    >>> tflite_bytes, report = cle.quantize(model, calibration_data=x)
    >>> print(report.summary())
    >>> open("model_int8.tflite", "wb").write(tflite_bytes)

Measurement: measure what INT8 quantization does to a Keras model, before and after equalization.

Two ways of quantizing are offered, both compared against float reference outputs:

* **Weight-only simulation** (:func:`fake_quantize_weights`, :func:`quantize_kernel`): every
  kernel is replaced by its symmetric uniform ``bits``-bit approximation, per tensor or per
  output channel; activations stay float. This isolates the effect Nagel et al. (2019) target
  with cross-layer equalization: one scale per tensor wastes the grid on channels whose range is
  far below the tensor's largest.
* **Real TF Lite INT8** (:func:`convert_to_tflite_int8`, :func:`run_tflite`): full integer
  quantization by TF Lite's converter (weights *and* activations in INT8, calibrated on
  representative inputs), run by LiteRT's interpreter (``ai_edge_litert``). ``per_channel=False`` forces one
  weight scale per tensor, the setting in which equalization matters.

:func:`evaluate` runs both on a model and returns table rows;
:func:`weight_range_spread` summarizes how uneven each kernel's channel ranges are.

Example:
    >>> from cle import quantization as Q
    >>> y_ref = model.predict(x, verbose=0)
    >>> for row in Q.evaluate(cle.equalize_model(model), x, y_ref):
    ...     print(row["name"], row["top1_agreement"], row["sqnr_db"])

TensorFlow is imported only inside the TF Lite functions, so importing this module is cheap.
"""

from cle._measure.evaluation import (  # noqa: F401
    convert_to_tflite_int8,
    evaluate,
    fake_quantize_weights,
    quantize_kernel,
    run_tflite,
    sqnr_db,
    top1_agreement,
    weight_range_spread,
)
from cle._quantize.pipeline import (  # noqa: F401
    QuantizeReport, input_range_of, load_calibration, quantize,
)

__all__ = [
    "QuantizeReport",
    "convert_to_tflite_int8",
    "evaluate",
    "fake_quantize_weights",
    "input_range_of",
    "load_calibration",
    "quantize",
    "quantize_kernel",
    "run_tflite",
    "sqnr_db",
    "top1_agreement",
    "weight_range_spread",
]
