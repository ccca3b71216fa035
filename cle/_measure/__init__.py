"""Tier 3, measurement that does not depend on the target: Keras inference, metrics, calibration
data, synthetic calibration inputs, input ranges and the check (the ``.tflite`` side lives in
:mod:`cle._tflite`)."""
