"""The Keras architectures the pretrained checkpoints load into (:mod:`cle.pretrained`):
Keras' MobileNetV2 with torchvision's padding and batch-norm epsilon, and EfficientNet-Lite1
built layer by layer with the checkpoint's module names mapped to Keras layer names."""

from __future__ import annotations

import keras

_TORCH_BN_EPSILON = 1e-5
_EXPECTED_BN_LAYERS = 52


def torch_compatible_mobilenet_v2() -> keras.Model:
    """Keras MobileNetV2 with torchvision padding and BN epsilon."""
    base = keras.applications.MobileNetV2(
        weights=None, classifier_activation=None, input_shape=(224, 224, 3))

    def clone_function(layer):
        config = layer.get_config()
        if isinstance(layer, keras.layers.BatchNormalization):
            config["epsilon"] = _TORCH_BN_EPSILON
        elif isinstance(layer, keras.layers.ZeroPadding2D):
            config["padding"] = ((1, 1), (1, 1))
        elif layer.name == "Conv1":
            config["padding"] = "valid"
        return layer.__class__.from_config(config)

    def call_function(layer, *args, **kwargs):
        if layer.name == "Conv1":
            (x, *rest) = args
            x = keras.layers.ZeroPadding2D(((1, 1), (1, 1)),
                                           name="Conv1_pad")(x)
            return layer(x, *rest, **kwargs)
        return layer(*args, **kwargs)

    inputs = keras.Input(shape=(224, 224, 3), name="input_layer")
    model = keras.models.clone_model(
        base, input_tensors=inputs, clone_function=clone_function,
        call_function=call_function)
    _check_torch_compatible_structure(model)
    return model


def _check_torch_compatible_structure(model: keras.Model) -> None:
    conv1 = model.get_layer("Conv1")
    pad = model.get_layer("Conv1_pad")
    pads = [l for l in model.layers
            if isinstance(l, keras.layers.ZeroPadding2D)]
    bns = [l for l in model.layers
           if isinstance(l, keras.layers.BatchNormalization)]
    problems = []
    if conv1.padding != "valid" or tuple(conv1.strides) != (2, 2):
        problems.append("Conv1 is not a stride-2 'valid' convolution")
    if conv1.input is not pad.output:
        problems.append("Conv1 is not fed by Conv1_pad")
    if len(pads) != 5 or any(
            tuple(map(tuple, l.padding)) != ((1, 1), (1, 1)) for l in pads):
        problems.append(f"expected 5 symmetric ZeroPadding2D, got "
                        f"{[(l.name, l.padding) for l in pads]}")
    if len(bns) != _EXPECTED_BN_LAYERS or any(
            l.epsilon != _TORCH_BN_EPSILON for l in bns):
        problems.append("BatchNormalization count or epsilon is wrong")
    if tuple(model.output.shape) != (None, 1000):
        problems.append(f"unexpected output shape {model.output.shape}")
    if problems:
        raise RuntimeError(
            "building the torch-compatible MobileNetV2 failed (Keras "
            "applications changed?): " + "; ".join(problems))


# --------------------------------------------------------------------------
# EfficientNet-Lite1
# --------------------------------------------------------------------------

#: EfficientNet-Lite1's stages: (repeats, depthwise kernel, stride of the first
#: block, expand ratio, output channels). Lite keeps B0's stages with depth
#: ×1.1 (so 3, 3, 4, 4, 5 repeats in the middle stages), fixes the stem (32
#: channels) and the head (1280) and uses no squeeze-excitation.
_LITE1_STAGES = (
    (1, 3, 1, 1, 16),
    (3, 3, 2, 6, 24),
    (3, 5, 2, 6, 40),
    (4, 3, 2, 6, 80),
    (4, 5, 1, 6, 112),
    (5, 5, 2, 6, 192),
    (1, 3, 1, 6, 320),
)
_LITE1_STEM_CHANNELS = 32
_LITE1_HEAD_CHANNELS = 1280
_TF_BN_EPSILON = 1e-3
_LITE1_BN_LAYERS = 64


#: EfficientNet-Lite2's stages: Lite1's repeats (depth ×1.2 rounds up to the same; Lite
#: scales neither the first nor the last stage) at width ×1.1, rounded to multiples of 8 as
#: EfficientNet rounds them (stem and head fixed, as in every Lite).
LITE2_STAGES = tuple((r, k, s, e, c) for (r, k, s, e, _), c in zip(
    _LITE1_STAGES, (16, 24, 48, 88, 120, 208, 352)))


def efficientnet_lite1_architecture(
        input_size: int, stages=_LITE1_STAGES,
        name: str = "efficientnet_lite1") -> tuple[keras.Model, dict[str, str]]:
    """EfficientNet-Lite1 as a Keras Functional model, untrained, for square inputs of
    ``input_size`` pixels (another Lite's with its ``stages``, e.g. :data:`LITE2_STAGES`,
    and ``name``).

    Returns the model and the map from torch module names (the
    ``EfficientNet-PyTorch`` names of the checkpoint) to Keras layer names.
    Layers are named like ``keras.applications.EfficientNetB0``'s:
    ``stem_conv``, ``block2a_expand_conv``, ``block2a_dwconv``,
    ``block2a_project_bn``, ``block2b_add``, ``top_conv``, ``predictions``.
    """
    layers = keras.layers
    names: dict[str, str] = {}

    def conv_bn_act(x, torch_conv, torch_bn, prefix, conv, act=True):
        names[torch_conv] = conv.name
        names[torch_bn] = f"{prefix}bn"
        x = conv(x)
        x = layers.BatchNormalization(
            epsilon=_TF_BN_EPSILON, name=f"{prefix}bn")(x)
        if act:
            x = layers.ReLU(6.0, name=f"{prefix}activation")(x)
        return x

    inputs = keras.Input(shape=(input_size, input_size, 3),
                         name="input_layer")
    x = conv_bn_act(
        inputs, "_conv_stem", "_bn0", "stem_",
        layers.Conv2D(_LITE1_STEM_CHANNELS, 3, strides=2, padding="same",
                      use_bias=False, name="stem_conv"))
    channels = _LITE1_STEM_CHANNELS
    index = 0
    for stage, (repeats, kernel, stride, expand, out) in enumerate(stages, start=1):
        for r in range(repeats):
            block_input = x
            t = f"_blocks.{index}."
            p = f"block{stage}{chr(ord('a') + r)}_"
            strides = stride if r == 0 else 1
            if expand != 1:
                x = conv_bn_act(
                    x, t + "_expand_conv", t + "_bn0", p + "expand_",
                    layers.Conv2D(channels * expand, 1, padding="same",
                                  use_bias=False, name=p + "expand_conv"))
            x = conv_bn_act(
                x, t + "_depthwise_conv", t + "_bn1", p,
                layers.DepthwiseConv2D(kernel, strides=strides,
                                       padding="same", use_bias=False,
                                       name=p + "dwconv"))
            x = conv_bn_act(
                x, t + "_project_conv", t + "_bn2", p + "project_",
                layers.Conv2D(out, 1, padding="same", use_bias=False,
                              name=p + "project_conv"), act=False)
            if strides == 1 and channels == out:
                x = layers.Add(name=p + "add")([x, block_input])
            channels = out
            index += 1
    x = conv_bn_act(
        x, "_conv_head", "_bn1", "top_",
        layers.Conv2D(_LITE1_HEAD_CHANNELS, 1, padding="same",
                      use_bias=False, name="top_conv"))
    x = layers.GlobalAveragePooling2D(name="avg_pool")(x)
    names["_fc"] = "predictions"
    outputs = layers.Dense(1000, name="predictions")(x)
    model = keras.Model(inputs, outputs, name=name)
    return model, names
