"""Tier 0, math: pure numpy functions over arrays (folding, equalization, the quantization
noise model, kernel quantization, value checks). Nothing here imports Keras, TensorFlow or any
other part of cle."""
