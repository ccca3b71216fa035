"""The former home of :func:`cle.quantization.quantize`, kept so that ``from cle.int8 import
quantize`` still works: the same objects as :mod:`cle.quantization`."""

from cle._quantize.pipeline import QuantizeReport, load_calibration, quantize  # noqa: F401

__all__ = ["QuantizeReport", "load_calibration", "quantize"]
