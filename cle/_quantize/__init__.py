"""Tier 4, the end-to-end route: :func:`cle.quantization.quantize` and its report."""
