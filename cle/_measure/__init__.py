"""Tier 3, measurement: TF Lite conversion and LiteRT runs, Keras inference, metrics, calibration
data and synthetic calibration inputs."""
