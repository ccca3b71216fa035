"""hunt18: keras_hub's image models, the model library of Keras 3, with zoo_models' interface,
for ``bench_zoo.py --zoo hunt18_models``::

    nice -n 5 .venv/bin/python benchmarks/bench_zoo.py --zoo hunt18_models \\
        --models hub_resnet_v2 --modes data nodata --json /tmp/h18/hub_resnet_v2.jsonl

keras_hub is not a dependency: the models need ``pip install keras-hub==0.32.0`` (its image
models import without tensorflow-text; with ``--no-deps`` add ``regex kagglehub
kagglesdk==0.1.28 tokenizers sentencepiece``), else each is printed as skipped with that
command. Its presets download from Kaggle, which this machine cannot reach, so each model is
a keras_hub ``ImageClassifier`` task (the class a user of keras_hub holds, with its own
layers and its own ``predict``) of a small configuration, trained here a few epochs on
hunt9's photo crops, 64 px, scaled to [-1, 1] outside the model, 8 classes, logits out
(keras_hub's default: no softmax). ``build(name) -> (model, ZooData)``; "base@k" is the same
model with another draw of 64 calibration inputs (hunt9's :func:`hunt9_models.cal_seed`);
the 1000 held-out inputs stay the same. Trained models are cached beside the zoo's
(:func:`zoo_models.cache_dir`, ``hunt18/``), keyed by the model's name only.

Kinds, each for what keras_hub builds that no hunt had:

* ``hub_resnet_v2``: ResNetV2 (bottleneck, pre-activation): its stem pads by ``-inf`` before
  its max pooling (TF Lite's file of it was 0 everywhere: CHANGELOG);
* ``hub_cspnet``: CSPNet, bottleneck blocks, LeakyReLU(0.01) and a ``-inf``-padded max-pooled
  stem (folded, TensorFlow's fused oneDNN kernel drops the slope: CHANGELOG);
* ``hub_vit``: a ViT of 2 layers, its patching layer's config not one its class takes back;
* ``hub_xception``: Xception, separable convolutions and residual poolings;
* ``hub_hgnetv2``: HGNetV2, its batch norms inside keras_hub's own layers (no fold reaches
  them);
* ``hub_densenet``: DenseNet, a batch norm after each concatenation;
* ``hub_mobilenet_v3``: keras_hub's MobileNetV3-Small 0.5, configured by its own timm
  converter.
"""

from __future__ import annotations

import hunts  # what the hunts after hunt9 share
import zoo_models as ZM  # the repository's zoo: data helpers, ZooData
import hunt9_models as H9  # hunt9's photo crops and its draw of calibration inputs

ZooData = ZM.ZooData
Missing = ZM.Missing
_fit, _seed = ZM._fit, ZM._seed
_f32 = H9._f32
DRAW = 0  # set by build() (here and in hunt9_models / hunt8_models, whose cal_seed() is read)
SIZE = 64
INSTALL = ("pip install keras-hub==0.32.0 (or, with --no-deps, also regex kagglehub "
           "kagglesdk==0.1.28 tokenizers sentencepiece)")

_cached, _ = hunts.caches("hunt18")


def _hub():
    """keras_hub's models (imported when first asked: it registers its classes, which loading
    a cached model needs), or :class:`zoo_models.Missing` with the install command."""
    try:
        import keras_hub
    except ImportError as exc:
        raise Missing(f"needs the package 'keras-hub': {INSTALL}") from exc
    return keras_hub.models


def _scaled(x):
    return _f32(x) / 127.5 - 1.0


def _classifier(name, seed, make, epochs=8, lr=1e-3):
    """``make(models) -> task`` trained ``epochs`` on the photo crops (8 classes, logits,
    sparse categorical cross-entropy from logits); its data."""
    import keras

    models = _hub()
    (xt, yt, _), (xc, _, _), (xe, _, _) = H9.photo_sets(SIZE)

    def train():
        _seed(seed)
        return _fit(make(models), _scaled(xt), yt, epochs,
                    keras.losses.SparseCategoricalCrossentropy(from_logits=True), lr=lr)

    return _cached(name, train), ZooData(
        _scaled(xc), _scaled(xe), ("class",),
        f"keras_hub 0.32 {name[4:]} trained: photo crops {SIZE}, [-1, 1]; which photo (8), "
        "logits")


# ------------------------------------------------------------------------------- the models


def hub_resnet_v2():
    """ResNetImageClassifier on a ResNetBackbone (bottleneck blocks, pre-activation, filters
    64/32/64, one block each, strides 1/2/2)."""
    return _classifier("hub_resnet_v2", 1801, lambda M: M.ResNetImageClassifier(
        backbone=M.ResNetBackbone(
            input_conv_filters=[64], input_conv_kernel_sizes=[7],
            stackwise_num_filters=[64, 32, 64], stackwise_num_blocks=[1, 1, 1],
            stackwise_num_strides=[1, 2, 2], block_type="bottleneck_block",
            use_pre_activation=True, image_shape=(SIZE, SIZE, 3)),
        num_classes=8))


def hub_cspnet():
    """CSPNetImageClassifier on a CSPNetBackbone (stem 7x7 stride 2 and a max pooling, CSP
    stages of bottleneck blocks, LeakyReLU(0.01), filters 32/64)."""
    return _classifier("hub_cspnet", 1802, lambda M: M.CSPNetImageClassifier(
        backbone=M.CSPNetBackbone(
            stem_filters=16, stem_kernel_size=7, stem_strides=4, stackwise_depth=[1, 1],
            stackwise_strides=[1, 2], stackwise_num_filters=[32, 64],
            block_type="bottleneck_block", stage_type="csp", stem_pooling="max",
            bottle_ratio=[0.5], block_ratio=[1.0], expand_ratio=[2.0],
            image_shape=(SIZE, SIZE, 3)),
        num_classes=8))


def hub_vit():
    """ViTImageClassifier on a ViTBackbone (patches 8, 2 layers, 4 heads, width 64, MLP 128,
    a class token)."""
    return _classifier("hub_vit", 1803, lambda M: M.ViTImageClassifier(
        backbone=M.ViTBackbone(image_shape=(SIZE, SIZE, 3), patch_size=8, num_layers=2,
                               num_heads=4, hidden_dim=64, mlp_dim=128),
        num_classes=8, preprocessor=None), epochs=12)


def hub_xception():
    """XceptionImageClassifier on an XceptionBackbone (blocks of 16/32, 32/64, 128/128
    filters, the first two pooled)."""
    return _classifier("hub_xception", 1804, lambda M: M.XceptionImageClassifier(
        backbone=M.XceptionBackbone(
            stackwise_conv_filters=[[16, 32], [32, 64], [128, 128]],
            stackwise_pooling=[True, True, False], image_shape=(SIZE, SIZE, 3)),
        num_classes=8))


def hub_hgnetv2():
    """HGNetV2ImageClassifier on an HGNetV2Backbone (three stages, the last of light conv
    blocks; ReLU, no learnable affine blocks)."""
    return _classifier("hub_hgnetv2", 1805, lambda M: M.HGNetV2ImageClassifier(
        backbone=M.HGNetV2Backbone(
            depths=[1, 1, 1], embedding_size=16, hidden_sizes=[32, 64, 128],
            stem_channels=[3, 16, 16], hidden_act="relu", use_learnable_affine_block=False,
            stackwise_stage_filters=[(16, 8, 32, 1, 1, 3), (32, 16, 64, 1, 1, 3),
                                     (64, 32, 128, 1, 1, 3)],
            apply_downsample=[False, True, True],
            use_lightweight_conv_block=[False, False, True], image_shape=(SIZE, SIZE, 3)),
        num_classes=8, preprocessor=None))


def hub_densenet():
    """DenseNetImageClassifier on a DenseNetBackbone (1/2/1 dense blocks, growth 8)."""
    return _classifier("hub_densenet", 1806, lambda M: M.DenseNetImageClassifier(
        backbone=M.DenseNetBackbone(stackwise_num_repeats=[1, 2, 1], growth_rate=8,
                                    image_shape=(SIZE, SIZE, 3)),
        num_classes=8))


def hub_mobilenet_v3():
    """MobileNetImageClassifier on keras_hub's MobileNetV3-Small 0.5 (its configuration as
    keras_hub's own timm converter writes it for ``mobilenetv3_small_050``: squeeze-and-excite,
    hard-swish, a batch norm at the input)."""
    import importlib

    def make(M):
        timm = importlib.import_module("keras_hub.src.utils.timm.convert_mobilenet")
        config = timm.convert_backbone_config({"architecture": "mobilenetv3_small_050"})
        return M.MobileNetImageClassifier(
            backbone=M.MobileNetBackbone(**config, image_shape=(SIZE, SIZE, 3)),
            num_classes=8, preprocessor=None)

    return _classifier("hub_mobilenet_v3", 1807, make, epochs=10)


MODELS = {f.__name__: f for f in [
    hub_resnet_v2, hub_cspnet, hub_vit, hub_xception, hub_hgnetv2, hub_densenet,
    hub_mobilenet_v3]}

build = hunts.builder(MODELS, __name__)
