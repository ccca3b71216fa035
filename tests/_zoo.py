"""A zoo of "user models", one per input convention, with batch-norm statistics as training
on their inputs leaves them (shared by tests/test_input_range.py and
benchmarks/bench_quantize_nodata.py).

Each model is built from its architecture with Keras' initializers, BN γ drawn from
U(0.6, 1.4) and β from N(0, 0.25); then every BN's moving mean and variance is set to the
statistics of its input on real photo crops (``cle.pretrained.sample_images``, seed
:data:`BUILD_SEED`) preprocessed with the model's convention, in graph order (one forward
pass in training mode with every BN's momentum at 0: Keras normalizes with the batch's
biased variance and stores that same variance, so each BN sees its input as it will at
inference). The last layer is then fitted on the same crops: class logits centred per class
with a spread of 2.5, a regression head by ridge regression to a target far from 0. Each model
is saved to ``<cache>/<name>-<size>.keras`` and :func:`build` returns the loaded copy, as a
user's saved model would be.

Conventions (:data:`CONVENTIONS`) say what the model's input tensor holds, as an affine map of
RGB pixels ``p`` in 0..255: ``x = p[..., perm] * scale + offset``.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Callable

import keras
import numpy as np

L = keras.layers
BUILD_SEED, BUILD_IMAGES = 1, 64
#: Seed of the real crops a model is judged on (never the build crops).
EVAL_SEED = 7
_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
_STD = np.array([0.229, 0.224, 0.225], np.float32)
_CAFFE = np.array([103.939, 116.779, 123.68], np.float32)


@dataclasses.dataclass(frozen=True)
class Convention:
    """``x[..., c] = p[..., perm[c]] * scale[c] + offset[c]`` for RGB pixels ``p`` in 0..255."""

    name: str
    scale: tuple
    offset: tuple
    perm: tuple = (0, 1, 2)

    def apply(self, images) -> np.ndarray:
        p = np.asarray(images, np.float32)[..., list(self.perm)]
        return p * np.asarray(self.scale, np.float32) + np.asarray(self.offset, np.float32)

    @property
    def range(self) -> tuple[float, float]:
        s, o = np.asarray(self.scale, np.float64), np.asarray(self.offset, np.float64)
        ends = np.stack([o, 255.0 * s + o])
        return float(ends.min()), float(ends.max())


CONVENTIONS = {
    "raw": Convention("raw", (1.0,) * 3, (0.0,) * 3),
    "unit": Convention("unit", (1 / 255,) * 3, (0.0,) * 3),
    "tf": Convention("tf", (1 / 127.5,) * 3, (-1.0,) * 3),
    "torch": Convention("torch", tuple(1 / (255 * _STD)), tuple(-_MEAN / _STD)),
    "caffe": Convention("caffe", (1.0,) * 3, tuple(-_CAFFE), perm=(2, 1, 0)),
    "lite": Convention("lite", (1 / 128,) * 3, (-127 / 128,) * 3),
}


def photos(n, size, seed):
    from cle.pretrained import sample_images

    return sample_images(n, size=size, seed=seed)


# ------------------------------------------------------------------------ building blocks


def _all_layers(model):
    out = []
    for layer in model.layers:
        out.append(layer)
        if isinstance(layer, keras.Model):
            out.extend(_all_layers(layer))
    return out


def calibrate_bn_statistics(model, x) -> None:
    """Every BN's moving mean/variance set to the statistics of its input on ``x``."""
    bns = [la for la in _all_layers(model) if isinstance(la, L.BatchNormalization)]
    drops = [la for la in _all_layers(model) if isinstance(la, L.Dropout)]
    saved = [(b, b.momentum) for b in bns], [(d, d.rate) for d in drops]
    try:
        for b in bns:
            b.momentum = 0.0
        for d in drops:
            d.rate = 0.0
        model(x, training=True)
    finally:
        for b, m in saved[0]:
            b.momentum = m
        for d, r in saved[1]:
            d.rate = r


def _randomize_bn_affine(model, rng) -> None:
    for layer in _all_layers(model):
        if isinstance(layer, L.BatchNormalization):
            c = layer.moving_mean.shape[0]
            if layer.scale:
                layer.gamma.assign(rng.uniform(0.6, 1.4, c).astype(np.float32))
            if layer.center:
                layer.beta.assign(rng.normal(0.0, 0.25, c).astype(np.float32))


def _features(model, head, x):
    f = keras.Model(model.inputs, head.input).predict(x, verbose=0, batch_size=32)
    return f.reshape(-1, f.shape[-1]).astype(np.float64)


def fit_classifier_head(model, head, x, rng, spread=2.5) -> None:
    """A random projection of the head's input, each class centred with std ``spread``."""
    f = _features(model, head, x)
    w = rng.standard_normal((f.shape[1], head.kernel.shape[-1]))
    w *= spread / ((f @ w).std(axis=0) + 1e-12)
    head.kernel.assign(w.reshape(head.kernel.shape).astype(np.float32))
    head.bias.assign((-(f @ w).mean(axis=0)).astype(np.float32))


def fit_regression_head(model, head, x, target, ridge=1e-2) -> None:
    """Ridge regression of the head on its input features to ``target`` ``(N, k)``."""
    f = _features(model, head, x)
    mu, sd = f.mean(axis=0), f.std(axis=0) + 1e-6
    z = (f - mu) / sd
    t = np.asarray(target, np.float64).reshape(len(z), -1)
    coef = np.linalg.solve(z.T @ z + ridge * len(z) * np.eye(z.shape[1]),
                           z.T @ (t - t.mean(axis=0)))
    w = coef / sd[:, None]
    head.kernel.assign(w.reshape(head.kernel.shape).astype(np.float32))
    head.bias.assign((t.mean(axis=0) - mu @ w).astype(np.float32))


def _conv_bn(x, filters, kernel=3, strides=1, name=None, use_bias=False, act="relu"):
    x = L.Conv2D(filters, kernel, strides=strides, padding="same", use_bias=use_bias,
                 name=None if name is None else name + "_conv")(x)
    x = L.BatchNormalization(name=None if name is None else name + "_bn")(x)
    return L.Activation(act)(x) if act else x


def _trunk(x, widths, stem_bias=False, residual=False, prefix=""):
    x = _conv_bn(x, widths[0], 3, 2, name=prefix + "stem", use_bias=stem_bias)
    for i, w in enumerate(widths[1:]):
        y = _conv_bn(x, w, 3, 2, name=f"{prefix}s{i}a")
        y2 = _conv_bn(y, w, 3, 1, name=f"{prefix}s{i}b", act=None)
        if residual:
            y2 = L.Add()([y, y2])
        x = L.Activation("relu")(y2)
    return L.GlobalAveragePooling2D()(x)


def _small_cnn(size, prep=(), classes=10, widths=(16, 32, 64, 96), stem_bias=False,
               residual=False, name="cnn"):
    inp = keras.Input((size, size, 3), name="image")
    x = inp
    for layer in prep:
        x = layer(x)
    x = _trunk(x, widths, stem_bias, residual)
    return keras.Model(inp, L.Dense(classes, name="logits")(x), name=name)


# ------------------------------------------------------------------------ architectures


def _normalization_255():
    return L.Normalization(mean=list(_MEAN * 255), variance=list((_STD * 255) ** 2),
                           name="imagenet_normalization")


def _efficientnet_b0(size):
    model = keras.applications.EfficientNetB0(input_shape=(size, size, 3), weights=None,
                                              classes=10, classifier_activation=None)
    norm = next(la for la in model.layers if isinstance(la, L.Normalization))
    norm.adapt_mean.assign(_MEAN)
    norm.adapt_variance.assign(_STD ** 2)
    norm.finalize_state()
    return model


def _caffe_vgg_bn(size):
    inp = keras.Input((size, size, 3), name="image")
    x = inp
    for i, w in enumerate((32, 64, 128)):
        x = _conv_bn(x, w, 3, 1, name=f"b{i}c1", use_bias=True)
        x = _conv_bn(x, w, 3, 1, name=f"b{i}c2", use_bias=True)
        x = L.MaxPooling2D(2)(x)
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inp, L.Dense(10, name="logits")(x), name="caffe_vgg_bn")


def _segmentation_unet(size):
    inp = keras.Input((size, size, 3), name="image")
    e1 = _conv_bn(inp, 16, 3, 1, name="e1")
    e2 = _conv_bn(e1, 32, 3, 2, name="e2")
    e3 = _conv_bn(e2, 64, 3, 2, name="e3")
    b = _conv_bn(e3, 64, 3, 1, name="mid")
    d2 = _conv_bn(L.Concatenate()([L.UpSampling2D(2)(b), e2]), 32, 3, 1, name="d2")
    d1 = L.Conv2DTranspose(16, 3, strides=2, padding="same", name="up1")(d2)
    d1 = _conv_bn(L.Concatenate()([d1, e1]), 16, 3, 1, name="d1")
    return keras.Model(inp, L.Conv2D(4, 1, name="pixel_logits")(d1), name="segmentation_unet")


def _sequential_tf(size):
    layers = [keras.Input((size, size, 3))]
    for w in (16, 32, 64):
        layers += [L.Conv2D(w, 3, strides=2, padding="same", use_bias=False),
                   L.BatchNormalization(), L.ReLU(6.0)]
    layers += [L.GlobalAveragePooling2D(), L.Dense(10)]
    return keras.Sequential(layers, name="sequential_tf")


def _late_bn_cnn(size):
    inp = keras.Input((size, size, 3), name="image")
    x = L.Conv2D(16, 3, strides=2, padding="same", activation="relu")(inp)
    x = L.BatchNormalization()(L.Conv2D(32, 3, strides=2, padding="same")(x))
    x = _conv_bn(L.ReLU()(x), 64, 3, 2)
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inp, L.Dense(10, name="logits")(x), name="late_bn_cnn")


def _two_output(size):
    """A detection-like head: class scores and 4 box values from one trunk."""
    inp = keras.Input((size, size, 3), name="image")
    x = _trunk(L.Rescaling(1 / 127.5, offset=-1, name="rescale")(inp), (16, 32, 64),
               residual=True)
    return keras.Model(inp, [L.Dense(10, name="scores")(x), L.Dense(4, name="boxes")(x)],
                       name="two_output")


def _two_input(size):
    """Two images (a view at full size, 0..255 with a Rescaling layer; a half-size view in
    [-1, 1]), a trunk each, joined before the logits."""
    a = keras.Input((size, size, 3), name="view")
    b = keras.Input((size // 2, size // 2, 3), name="thumb")
    fa = _trunk(L.Rescaling(1 / 255, name="rescale")(a), (16, 32, 64), prefix="a_")
    fb = _trunk(b, (16, 32), prefix="b_")
    x = L.Concatenate()([fa, fb])
    return keras.Model([a, b], L.Dense(10, name="logits")(x), name="two_input")


def _app(ctor, **kw):
    return lambda size: ctor(input_shape=(size, size, 3), weights=None, classes=10,
                             classifier_activation=None, **kw)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One zoo model: builder, input size, convention, kind of output (per output)."""

    name: str
    build: Callable
    size: int
    convention: str
    kinds: tuple = ("classifier",)  # per output: classifier, regression, segmentation
    has_bn: bool = True
    small: bool = True  # builds in seconds (the tests use these)


ZOO = {e.name: e for e in [
    Entry("rescale255_cnn", lambda s: _small_cnn(s, [L.Rescaling(1 / 255, name="rescale")],
                                                  name="rescale255_cnn"), 96, "raw"),
    Entry("rescale_tf_cnn", lambda s: _small_cnn(
        s, [L.Rescaling(1 / 127.5, offset=-1, name="rescale")], residual=True,
        name="rescale_tf_cnn"), 96, "raw"),
    Entry("normalization_cnn", lambda s: _small_cnn(s, [_normalization_255()],
                                                     name="normalization_cnn"), 96, "raw"),
    Entry("unit_cnn", lambda s: _small_cnn(s, residual=True, name="unit_cnn"), 96, "unit"),
    Entry("torch_cnn", lambda s: _small_cnn(s, widths=(24, 48, 96, 128), residual=True,
                                            name="torch_cnn"), 96, "torch"),
    Entry("raw_cnn", lambda s: _small_cnn(s, stem_bias=True, name="raw_cnn"), 96, "raw"),
    Entry("tf_cnn", lambda s: _small_cnn(s, name="tf_cnn"), 96, "tf"),
    Entry("caffe_vgg_bn", _caffe_vgg_bn, 64, "caffe"),
    Entry("regression_cnn", lambda s: _small_cnn(s, classes=1, widths=(16, 32, 48, 64),
                                                 name="regression_cnn"), 96, "unit",
          kinds=("regression",)),
    Entry("segmentation_unet", _segmentation_unet, 64, "torch", kinds=("segmentation",)),
    Entry("sequential_tf", _sequential_tf, 64, "tf"),
    Entry("late_bn_cnn", _late_bn_cnn, 64, "unit"),
    Entry("two_output", _two_output, 96, "raw", kinds=("classifier", "regression")),
    Entry("two_input", _two_input, 96, "raw"),
    Entry("mobilenet_v3_small", _app(keras.applications.MobileNetV3Small,
                                     include_preprocessing=True), 128, "raw", small=False),
    Entry("efficientnet_b0", _efficientnet_b0, 128, "raw", small=False),
    Entry("convnext_tiny", _app(keras.applications.ConvNeXtTiny, include_preprocessing=True),
          96, "raw", has_bn=False, small=False),
    Entry("mobilenet_v2_tf", _app(keras.applications.MobileNetV2, alpha=0.5), 128, "tf",
          small=False),
    Entry("resnet50_caffe", _app(keras.applications.ResNet50), 96, "caffe", small=False),
]}
#: The convention of each input of the two-input model (the others have one input).
INPUT_CONVENTIONS = {"two_input": ("raw", "tf")}
#: The input names of the models with several inputs.
INPUT_NAMES = {"two_input": ("view", "thumb")}


def conventions(name):
    return INPUT_CONVENTIONS.get(name, (ZOO[name].convention,))


def input_sizes(name, size=None):
    size = size or ZOO[name].size
    return (size, size // 2) if name == "two_input" else (size,)


def true_input_ranges(name):
    return [CONVENTIONS[c].range for c in conventions(name)]


def inputs(name, n=32, seed=EVAL_SEED, size=None, transform=None):
    """``n`` real crops preprocessed for model ``name``: an array, or a list per input;
    ``transform`` (of uint8 pixels, to float pixels 0..255) is applied before the
    preprocessing (e.g. lower contrast: training data unlike ImageNet's)."""
    transform = transform or (lambda p: p)
    xs = [CONVENTIONS[c].apply(transform(photos(n, s, seed + k)))
          for k, (c, s) in enumerate(zip(conventions(name), input_sizes(name, size)))]
    return xs[0] if len(xs) == 1 else xs


def _target(images):
    lum = (np.asarray(images, np.float64) @ np.array([0.299, 0.587, 0.114]))
    return np.stack([100.0 + 1.5 * lum.mean(axis=(1, 2)), lum.std(axis=(1, 2)),
                     lum[:, : lum.shape[1] // 2].mean(axis=(1, 2)) / 255,
                     lum[:, :, : lum.shape[2] // 2].mean(axis=(1, 2)) / 255], axis=1)


def make(name, size=None, seed=0, transform=None):
    """Build zoo model ``name`` from scratch (``transform``: see :func:`inputs`)."""
    e = ZOO[name]
    size = size or e.size
    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    model = e.build(size)
    x = inputs(name, BUILD_IMAGES, BUILD_SEED, size, transform)
    raw = photos(BUILD_IMAGES, size, BUILD_SEED)
    if e.has_bn:
        _randomize_bn_affine(model, rng)
        calibrate_bn_statistics(model, x)
    for head, kind in zip([_producer(model, t) for t in model.outputs], e.kinds):
        if kind == "regression":
            target = _target(raw)[:, : head.kernel.shape[-1]]
            fit_regression_head(model, head, x, target)
        else:
            fit_classifier_head(model, head, x, rng)
    return model


def _producer(model, tensor):
    for layer in reversed(model.layers):
        if isinstance(layer, (L.Dense, L.Conv2D)) and any(
                o is tensor for o in keras.tree.flatten(layer.output)):
            return layer
    for layer in reversed(model.layers):  # keras.applications: the last Dense
        if isinstance(layer, (L.Dense, L.Conv2D)):
            return layer
    raise ValueError(f"no Dense/Conv2D head for {tensor}")


CACHE = os.path.join(tempfile.gettempdir(), "cle-zoo")


def build(name, size=None, cache=None, rebuild=False):
    """Zoo model ``name`` as loaded from ``<cache>/<name>-<size>.keras`` (built first if
    missing)."""
    import cle

    size = size or ZOO[name].size
    cache = cache or CACHE
    path = os.path.join(cache, f"{name}-{size}.keras")
    if rebuild or not os.path.exists(path):
        os.makedirs(cache, exist_ok=True)
        tmp = path + f".{os.getpid()}.keras"
        make(name, size).save(tmp)
        os.replace(tmp, path)
    return cle.load_model(path)
