"""``cle demo``: INT8 quantization of the real ImageNet MobileNetV2, before and after
cross-layer equalization, on real photos.

Steps (:func:`run_demo`):

1. build torchvision's ImageNet MobileNetV2 in Keras (:mod:`cle.pretrained`);
2. take ``images`` deterministic crops of real photos and compute the original model's float
   logits: the reference every other row is compared with;
3. fold the batch norms (for the weight-range figure) and run ``cle.equalize_model`` with
   ``objective="weights"`` (weight-range equalization, which the range figure shows);
4. quantize the original and the equalized model with :func:`cle.quantization.evaluate` (float,
   weight-only INT8 per-tensor / per-channel, TFLite full-INT8 per-tensor / per-channel) and
   print the before/after table of top-1 agreement with the original float model and logit
   SQNR;
5. print how far apart the per-channel weight ranges are (largest / median channel range)
   after BN folding and after equalization;
6. plot the per-output-channel weights of the first depthwise convolution
   (``expanded_conv_depthwise``) after BN folding and after equalization, like figure 2 of
   Nagel et al. 2019, into ``cle_demo_ranges.png``.

Keras and TensorFlow are imported inside :func:`run_demo`, matplotlib only to draw the figure.
"""

from cle._cli.demo import (  # noqa: F401
    DEFAULT_CALIBRATION,
    DEFAULT_IMAGES,
    DEFAULT_OUT_DIR,
    FIRST_DEPTHWISE,
    PNG_NAME,
    ROW_NAMES,
    run_demo,
    plot_channel_ranges,
)

__all__ = [
    "DEFAULT_CALIBRATION",
    "DEFAULT_IMAGES",
    "DEFAULT_OUT_DIR",
    "FIRST_DEPTHWISE",
    "PNG_NAME",
    "ROW_NAMES",
    "run_demo",
    "plot_channel_ranges",
]
