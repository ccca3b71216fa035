"""Where the INT8 error of a Keras model comes from, layer by layer, by the model's own layer
names.

:func:`analyze` builds the ``.tflite`` that :func:`cle.quantize` writes with the same options
and data, and measures, for every layer of the model (a convolution with the batch norm folded
into it and the activation fused with it counts as one layer, under the convolution's name):

* **its output in the INT8 model** against the float model (``sqnr_db``): everything before the
  layer quantized too, as in the ``.tflite`` itself (run by LiteRT with every tensor kept);
* **its weights alone and its activations alone** (``weight_sqnr_db``, ``activation_sqnr_db``):
  the layer's output with only its weights quantized, or only its output's range and rounding,
  on float inputs, the rest of the network in float. Measured, not modelled: a float copy of
  the ``.tflite`` in which every quantization of the INT8 model (its scales, zero points and
  int8 weights) can be switched on per layer (:mod:`cle._tflite.quant_sim`) is run once per
  layer and part;
* **the range** of its output: the values used, how they were chosen (``1e-4 tails``,
  ``min/max``, ...) and the calibrated min/max;
* **its share of the output's error**: the error of the model's output with that layer alone
  quantized, over the sum for every layer (the report says how close that sum comes to the INT8
  model's own error).

The summary names the few layers that add the most, each with the reason in words (weights or
activations, clipping, one channel far wider than the others, an error the layers after it
amplify); :meth:`AnalysisReport.to_dict` is the JSON of ``cle analyze --report`` and
:meth:`AnalysisReport.plot` draws the per-layer picture.

The options are :func:`cle.quantize`'s, checked by the same door (``output_kinds`` says which
outputs are class scores: only those get a top-1 agreement); any number of inputs and
outputs (each input's own quantization is an entry of its own; with several outputs the report
gives each output's figures, and each layer its output SQNR per output, the lowest as its
``output_sqnr_db``, and its share of the outputs' errors, each over its output's signal,
summed). Without data the inputs are
:func:`cle.quantize`'s synthetic ones (distilled from the model's batch-norm statistics, and
natural-image-like inputs across the input range), the output's figures the lower of its two
check sets the calibration never saw (the per-layer runs use that set), and the summary says
so: figures on synthetic inputs are a guess of what real inputs do.

Example:
    >>> report = cle.analyze(model, x_calibration)
    >>> print(report.summary())
    >>> report.plot("analysis.png")
"""

from cle._quantize.analysis import analyze  # noqa: F401
from cle._quantize.analysis_plot import plot  # noqa: F401
from cle._quantize.analysis_report import AnalysisReport, LayerReport  # noqa: F401

__all__ = ["AnalysisReport", "LayerReport", "analyze", "plot"]
