"""hunt8: models built to hunt for cle's failures on kinds neither the zoo (zoo_models.py) nor
hunt7 (hunt7_models.py) tried, with zoo_models' interface, for ``bench_zoo.py --zoo
hunt8_models``::

    nice -n 10 .venv/bin/python benchmarks/bench_zoo.py --zoo hunt8_models \
        --models tanh_reg noop_layers --json /tmp/h8/hunt8.jsonl

``build(name) -> (model, ZooData)``. A name "base@k" (k = 1, 2, ...) is the same model with
another draw of 64 calibration inputs from the same source (the held-out inputs, 1000, are the
same). Trained models are cached beside the zoo's (:func:`zoo_models.cache_dir`, ``hunt8/``);
the two models a ``.keras`` file cannot reload under ``safe_mode`` (a ``Lambda``) keep their
weights only (``.weights.h5``) and are rebuilt in code, as the user who trained them has them.
Written fast, for a hunt: the models are what a new user might train in a minute, not tuned.

Kinds: a custom conv+BN backbone Model and a Sequential head nested in an outer model, fine-
tuned with the backbone frozen; ``Input((None, None, 1))`` (fully convolutional); tanh outputs
in [-1, 1]; a regression of targets ~1e4 trained unnormalized; per-pixel sigmoid with dilated
convs; SeparableConv1D + Conv1DTranspose (signal denoiser); SeparableConv1D / DepthwiseConv1D
with depth_multiplier 2 and Conv1D groups 4; inference no-ops (GaussianNoise, SpatialDropout2D,
ActivityRegularization, GaussianDropout, Dropout); a UnitNormalization embedding;
a tiny ViT (patch conv, class token and position embedding as custom layers, MHA, GELU MLP);
ZeroPadding2D / Cropping2D / bilinear UpSampling2D / Concatenate with the input; a Lambda and a
custom layer with its own weight; channels_first; a 256-class softmax trained 2 epochs; a
Sequential without an Input, reloaded with ``keras.models.load_model``; MobileNetV3Small (alpha
1.0, no preprocessing, [-1, 1]) on 10 classes; gray image + raw tabular with Normalization.
Extras after the first pass: the embedding with Rescaling inside (UnitNormalization, and a
Lambda(keras.ops.normalize)), a per-pixel tanh image-to-image model, a cosine-softmax
classifier, a one-sigmoid bounded regression, hidden tanh activations, softmax attention
pooling, Resizing inside, a siamese model (one nested backbone called on two inputs), one Conv2D
+ BN called twice (tied), and a regression ending in Normalization(invert=True).

Found (helper hunt8, draw 0 unless named): without data, the pre-activation range of a bounded
output (tanh_reg, sigmoid_reg_r255) and the Rsqrt of an L2 normalization (unitnorm_r255,
l2_lambda_r255) come from synthetic inputs and clip real ones (8.8-13 dB below the plain
conversion, claims 7-11.5 dB above the real figure on three of them); with data,
attn_pool_r255 (tail ranges; draws 0 and 2), siamese_shared@1, sigmoid_reg_r255 (draws 0 and
1) and reg_1e4 (draw 0) read 0.6-2.5 dB below the plain conversion.
"""
from __future__ import annotations

import functools
import os

import numpy as np

import zoo_models as ZM  # the repository's zoo: data helpers, ZooData

ZooData = ZM.ZooData
Missing = ZM.Missing
photo_crops, gray_crops, _signals, _fit, _settle_bn = (
    ZM.photo_crops, ZM.gray_crops, ZM._signals, ZM._fit, ZM._settle_bn)

N_CAL, N_EVAL = 64, 1000
TRAIN_SEED, EVAL_SEED = 3000, 4007
DRAW = 0  # set by build()
_seed = ZM._seed


def cal_seed():
    return 21 + 101 * DRAW


def _cached(name, train):
    """The zoo's cache, in its folder ``hunt8``."""
    return ZM._cached(os.path.join("hunt8", name), train)


def _path(name, ext):
    path = os.path.join(ZM.cache_dir(), "hunt8", name + ext)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


def _cached_weights(name, make, train):
    """``make()`` (the architecture in code) with the weights ``train(model)`` gave it, cached
    as ``.weights.h5`` (for models whose ``.keras`` needs ``safe_mode=False``)."""
    path = _path(name, ".weights.h5")
    model = make()
    if os.path.exists(path):
        model.load_weights(path)
    else:
        train(model)
        tmp = path[:-len(".weights.h5")] + f".{os.getpid()}.weights.h5"
        model.save_weights(tmp)
        os.replace(tmp, path)
    return model


def L():
    import keras

    return keras.layers


# ----------------------------------------------------------------------------- data sources

@functools.lru_cache(maxsize=None)
def _photos(n, size, seed):
    return photo_crops(n, size, seed)


def photo_sets(size, n_train=1536):
    return _photos(n_train, size, TRAIN_SEED), _photos(N_CAL, size, cal_seed()), \
        _photos(N_EVAL, size, EVAL_SEED)


def gray_sets(size, n_train=2048):
    return gray_crops(n_train, size, TRAIN_SEED), gray_crops(N_CAL, size, cal_seed()), \
        gray_crops(N_EVAL, size, EVAL_SEED)


def _lum(images):
    return ZM._gray(images)[..., 0].astype(np.float64)


def _gray_labelled(n, seed, size):
    """gray crops with the index of the scikit-image picture each comes from (10 classes)."""
    images = ZM._gray_images()
    rng = np.random.default_rng(seed)
    x = np.empty((n, size, size, 1), np.float32)
    y = np.empty(n, np.int64)
    for i in range(n):
        k = rng.integers(len(images))
        im = images[k]
        top, left = rng.integers(im.shape[0] - size), rng.integers(im.shape[1] - size)
        crop = im[top:top + size, left:left + size]
        x[i, ..., 0] = crop[:, ::-1] if rng.random() < 0.5 else crop
        y[i] = k
    return x, y


def gray_labelled_sets(size, n_train=2048):
    return _gray_labelled(n_train, TRAIN_SEED, size), _gray_labelled(N_CAL, cal_seed(), size), \
        _gray_labelled(N_EVAL, EVAL_SEED, size)


# ----------------------------------------------------------------------- custom layers


def _custom_layers():
    """The custom layers (registered when first asked: importing keras is not free)."""
    import keras

    if "ChannelScale" in _CUSTOM:
        return _CUSTOM

    @keras.saving.register_keras_serializable(package="hunt8")
    class ChannelScale(keras.layers.Layer):
        """A learnable per-channel scale and shift (LayerScale-like), its own weights."""

        def build(self, input_shape):
            c = input_shape[-1]
            self.gamma = self.add_weight(shape=(c,), initializer="ones", name="gamma")
            self.beta = self.add_weight(shape=(c,), initializer="zeros", name="beta")

        def call(self, x):
            return x * self.gamma + self.beta

    @keras.saving.register_keras_serializable(package="hunt8")
    class ClassToken(keras.layers.Layer):
        """Prepends a learned token to a sequence (ViT's class token)."""

        def build(self, input_shape):
            self.token = self.add_weight(shape=(1, 1, input_shape[-1]), initializer="zeros",
                                         name="token")

        def call(self, x):
            t = keras.ops.broadcast_to(self.token, (keras.ops.shape(x)[0], 1, x.shape[-1]))
            return keras.ops.concatenate([t, x], axis=1)

    @keras.saving.register_keras_serializable(package="hunt8")
    class PositionEmbedding(keras.layers.Layer):
        """Adds a learned embedding per position."""

        def build(self, input_shape):
            self.pos = self.add_weight(shape=(1,) + tuple(input_shape[1:]),
                                       initializer=keras.initializers.RandomNormal(stddev=0.02),
                                       name="pos")

        def call(self, x):
            return x + self.pos

    _CUSTOM.update(ChannelScale=ChannelScale, ClassToken=ClassToken,
                   PositionEmbedding=PositionEmbedding)
    return _CUSTOM


_CUSTOM: dict = {}


# ------------------------------------------------------------------------------- the models


def nested_backbone():
    """A custom conv+BN functional backbone Model and a Sequential head (Dropout, Dense, softmax)
    called as layers of an outer model; trained, then the head fine-tuned with the backbone
    frozen (transfer learning); photo crops 40 0..255, Rescaling in the backbone; 8 classes."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(40)

    def train():
        _seed(801)
        b_in = keras.Input((40, 40, 3), name="bb_in")
        h = Ly.Rescaling(1 / 255.0)(b_in)
        for w in (16, 32, 48):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(w, 3, 2, "same", use_bias=False)(h)))
        backbone = keras.Model(b_in, Ly.GlobalAveragePooling2D()(h), name="backbone")
        head = keras.Sequential([Ly.Dropout(0.2), Ly.Dense(32, activation="relu"),
                                 Ly.Dense(8, activation="softmax")], name="head")
        inp = keras.Input((40, 40, 3), name="rgb255")
        model = keras.Model(inp, head(backbone(inp)), name="nested_backbone")
        x = xt.astype(np.float32)
        _fit(model, x, yt, 6, "sparse_categorical_crossentropy")
        backbone.trainable = False
        return _fit(model, x, yt, 2, "sparse_categorical_crossentropy", lr=5e-4)

    return _cached("nested_backbone", train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("class",),
        "photo crops 40 0..255; nested functional conv+BN backbone (frozen for fine-tuning) "
        "+ nested Sequential head; 8 classes")


def fcn_none():
    """Input((None, None, 1)): fully convolutional conv+BN+relu, GAP, 10-class softmax (which
    gray picture); trained and measured on 32x32 crops."""
    import keras
    Ly = L()
    (xt, yt), (xc, _), (xe, _) = gray_labelled_sets(32)

    def train():
        _seed(802)
        inp = keras.Input((None, None, 1), name="gray_any")
        h = inp
        for w, s in ((16, 1), (32, 2), (48, 2)):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(w, 3, s, "same", use_bias=False)(h)))
        out = Ly.Dense(10, activation="softmax", name="picture")(Ly.GlobalAveragePooling2D()(h))
        return _fit(keras.Model(inp, out, name="fcn_none"), xt, yt, 6,
                    "sparse_categorical_crossentropy")

    return _cached("fcn_none", train), ZooData(
        xc, xe, ("class",), "gray crops 32 [0,1] into Input((None, None, 1)); conv+BN, GAP; "
        "which picture (10)")


def _tanh_targets(images):
    lum = _lum(images)
    h = lum.shape[1] // 2
    lr = lum[:, :, :h].mean((1, 2)) - lum[:, :, h:].mean((1, 2))
    tb = lum[:, :h].mean((1, 2)) - lum[:, h:].mean((1, 2))
    return np.stack([np.tanh(lr / 15.0), np.tanh(tb / 15.0)], 1).astype(np.float32)


def tanh_reg():
    """Conv+BN+relu, GAP, Dense(2, tanh): left-right and top-bottom brightness balance in
    [-1, 1] (many near saturation); photo crops 40 0..255 with Rescaling."""
    import keras
    Ly = L()
    (xt, _, _), (xc, _, _), (xe, _, _) = photo_sets(40)

    def train():
        _seed(803)
        inp = keras.Input((40, 40, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        for w in (16, 32, 48):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(w, 3, 2, "same", use_bias=False)(h)))
        out = Ly.Dense(2, activation="tanh", name="balance")(Ly.GlobalAveragePooling2D()(h))
        return _fit(keras.Model(inp, out, name="tanh_reg"), xt.astype(np.float32),
                    _tanh_targets(xt), 10, "mse")

    return _cached("tanh_reg", train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("value",),
        "photo crops 40 0..255 Rescaling; conv+BN; Dense(2, tanh) brightness balance in [-1,1]")


def _price(images):
    lum = _lum(images)
    return (10000.0 + 40.0 * lum.mean((1, 2)) + 60.0 * lum.std((1, 2)))[:, None].astype(np.float32)


def reg_1e4():
    """A regression trained on raw targets ~1e4 (about 1.0e4-2.5e4, no target scaling; bias
    started at the mean), Rescaling, conv+BN, GAP, Dense(32, relu), Dense(1)."""
    import keras
    Ly = L()
    (xt, _, _), (xc, _, _), (xe, _, _) = photo_sets(40)

    def train():
        _seed(804)
        inp = keras.Input((40, 40, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        for w in (16, 32, 48):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(w, 3, 2, "same", use_bias=False)(h)))
        h = Ly.Dense(32, activation="relu")(Ly.GlobalAveragePooling2D()(h))
        model = keras.Model(inp, Ly.Dense(1, name="price")(h), name="reg_1e4")
        t = _price(xt)
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
        model.get_layer("price").bias.assign([float(t.mean())])
        model.fit(xt.astype(np.float32), t, epochs=12, batch_size=32, verbose=0)
        return _settle_bn(model, xt.astype(np.float32))

    return _cached("reg_1e4", train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("value",),
        "photo crops 40 0..255 Rescaling; conv+BN; one output ~1e4 (10000 + 40 mean + 60 std "
        "of luminance), trained unnormalized")


def seg_dilated():
    """Per-pixel sigmoid mask from dilated convs (rates 2, 4) + BN, no downsampling; gray 48."""
    import keras
    Ly = L()
    xt, xc, xe = gray_sets(48, 1024)

    def train():
        _seed(805)
        inp = keras.Input((48, 48, 1), name="gray")
        h = inp
        for w, d in ((16, 1), (16, 2), (24, 4), (16, 1)):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(w, 3, padding="same", dilation_rate=d,
                                                            use_bias=False)(h)))
        out = Ly.Conv2D(1, 1, activation="sigmoid", name="mask")(h)
        return _fit(keras.Model(inp, out, name="seg_dilated"), xt, ZM._ink(xt), 5,
                    "binary_crossentropy")

    return _cached("seg_dilated", train), ZooData(
        xc, xe, ("value",), "gray crops 48 [0,1]; dilated conv+BN (rates 1,2,4,1); per-pixel "
        "sigmoid ink mask")


def _denoise_pair(n, seed):
    """Noisy sines and their moving average over 9 samples (the target)."""
    from scipy.ndimage import uniform_filter1d

    x, _ = _signals(n, seed)
    return x, uniform_filter1d(x, 9, axis=1).astype(np.float32)


def sep1d_convt1d():
    """Signal denoiser: SeparableConv1D stride 2 + BN + relu twice, Conv1DTranspose twice back
    to 256 samples, linear output (a moving average of the noisy sine)."""
    import keras
    Ly = L()
    xt, tt = _denoise_pair(2048, TRAIN_SEED)

    def train():
        _seed(806)
        inp = keras.Input((256, 1), name="signal")
        h = inp
        for w, k in ((16, 7), (32, 5)):
            h = Ly.SeparableConv1D(w, k, 2, "same", use_bias=False)(h)
            h = Ly.ReLU()(Ly.BatchNormalization()(h))
        h = Ly.Conv1DTranspose(16, 4, 2, "same", activation="relu")(h)
        out = Ly.Conv1DTranspose(1, 4, 2, "same", name="clean")(h)
        model = keras.Model(inp, out, name="sep1d_convt1d")
        model.compile(optimizer=keras.optimizers.Adam(2e-3), loss="mse")
        model.fit(xt, tt, epochs=8, batch_size=32, verbose=0)
        return _settle_bn(model, xt)

    return _cached("sep1d_convt1d", train), ZooData(
        _denoise_pair(N_CAL, cal_seed())[0], _denoise_pair(N_EVAL, EVAL_SEED)[0], ("value",),
        "noisy sines 256; SeparableConv1D+BN, Conv1DTranspose; smoothed signal out")


def conv1d_dw_groups():
    """SeparableConv1D (depth_multiplier 2), DepthwiseConv1D (depth_multiplier 2), Conv1D
    groups=4, each + BN + relu; GAP; 5 frequency bands."""
    import keras
    Ly = L()
    xt, yt = _signals(2048, TRAIN_SEED)

    def train():
        _seed(807)
        inp = keras.Input((256, 1), name="signal")
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv1D(16, 7, 2, "same", use_bias=False)(inp)))
        h = Ly.ReLU()(Ly.BatchNormalization()(
            Ly.SeparableConv1D(32, 5, 2, "same", depth_multiplier=2, use_bias=False)(h)))
        h = Ly.ReLU()(Ly.BatchNormalization()(
            Ly.DepthwiseConv1D(5, 2, "same", depth_multiplier=2, use_bias=False)(h)))
        h = Ly.Conv1D(32, 3, 2, "same", groups=4, use_bias=False)(h)
        h = Ly.ReLU()(Ly.BatchNormalization()(h))
        out = Ly.Dense(5, activation="softmax", name="band")(Ly.GlobalAveragePooling1D()(h))
        return _fit(keras.Model(inp, out, name="conv1d_dw_groups"), xt, yt, 8,
                    "sparse_categorical_crossentropy")

    return _cached("conv1d_dw_groups", train), ZooData(
        _signals(N_CAL, cal_seed())[0], _signals(N_EVAL, EVAL_SEED)[0], ("class",),
        "noisy sines 256; SeparableConv1D/DepthwiseConv1D dm 2, Conv1D groups 4, BN; 5 bands")


def noop_layers():
    """Inference no-ops in the graph: GaussianNoise after Rescaling, SpatialDropout2D,
    ActivityRegularization, GaussianDropout, Dropout; Rescaling, conv+BN; 8 classes."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(40)

    def train():
        _seed(808)
        inp = keras.Input((40, 40, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        h = Ly.GaussianNoise(0.02)(h)
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(16, 3, 2, "same", use_bias=False)(h)))
        h = Ly.SpatialDropout2D(0.1)(h)
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(32, 3, 2, "same", use_bias=False)(h)))
        h = Ly.ActivityRegularization(l1=1e-5)(h)
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(48, 3, 2, "same", use_bias=False)(h)))
        h = Ly.GaussianDropout(0.1)(h)
        h = Ly.Dropout(0.3)(Ly.GlobalAveragePooling2D()(h))
        out = Ly.Dense(8, activation="softmax", name="photo")(h)
        return _fit(keras.Model(inp, out, name="noop_layers"), xt.astype(np.float32), yt, 10,
                    "sparse_categorical_crossentropy")

    return _cached("noop_layers", train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("class",),
        "photo crops 40 0..255; GaussianNoise, SpatialDropout2D, ActivityRegularization, "
        "GaussianDropout, Dropout around conv+BN; 8 classes")


def unitnorm_embed():
    """Metric-learning style: conv+BN, GAP, Dense(16), UnitNormalization -> the 16-d embedding
    (trained through a cosine softmax head on which gray picture, the head then dropped)."""
    import keras
    Ly = L()
    (xt, yt), (xc, _), (xe, _) = gray_labelled_sets(32)

    def train():
        _seed(809)
        inp = keras.Input((32, 32, 1), name="gray")
        h = inp
        for w, s in ((16, 1), (32, 2), (48, 2)):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(w, 3, s, "same", use_bias=False)(h)))
        e = Ly.UnitNormalization(name="embedding")(Ly.Dense(16)(Ly.GlobalAveragePooling2D()(h)))
        logits = Ly.Dense(10, use_bias=False)(e)
        full = keras.Model(inp, Ly.Activation("softmax")(Ly.Rescaling(10.0)(logits)))
        _fit(full, xt, yt, 8, "sparse_categorical_crossentropy")
        return keras.Model(inp, e, name="unitnorm_embed")

    return _cached("unitnorm_embed", train), ZooData(
        xc, xe, ("value",), "gray crops 32 [0,1]; conv+BN, GAP, Dense(16), UnitNormalization: "
        "a unit-norm embedding")


def tiny_vit():
    """Patch Conv2D(4x4), custom ClassToken and PositionEmbedding layers (own weights), two
    blocks of LayerNormalization + MultiHeadAttention + GELU MLP with Add, class token taken by
    Cropping1D; 8-class softmax; photo crops 32 0..255 with Rescaling."""
    import keras
    Ly = L()
    C = _custom_layers()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(32)

    def train():
        _seed(810)
        inp = keras.Input((32, 32, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        h = Ly.Conv2D(32, 4, strides=4, name="patches")(h)
        t = Ly.Reshape((64, 32))(h)
        t = C["PositionEmbedding"](name="pos")(C["ClassToken"](name="cls")(t))
        for k in range(2):
            a = Ly.LayerNormalization(name=f"ln_a{k}")(t)
            t = Ly.Add()([t, Ly.MultiHeadAttention(4, 8, name=f"mha{k}")(a, a)])
            m = Ly.LayerNormalization(name=f"ln_m{k}")(t)
            t = Ly.Add()([t, Ly.Dense(32)(Ly.Dense(64, activation="gelu")(m))])
        t = Ly.LayerNormalization(name="ln_out")(t)
        tok = Ly.Flatten()(Ly.Cropping1D((0, 64))(t))
        out = Ly.Dense(8, activation="softmax", name="photo")(tok)
        return _fit(keras.Model(inp, out, name="tiny_vit"), xt.astype(np.float32), yt, 12,
                    "sparse_categorical_crossentropy", lr=1e-3)

    return _cached("tiny_vit", train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("class",),
        "photo crops 32 0..255; tiny ViT: patch conv, class token + position embedding "
        "(custom layers), 2 x (LN, MHA 4 heads, GELU MLP); 8 classes")


def pad_crop_up():
    """ZeroPadding2D, valid convs + BN, bilinear UpSampling2D, Cropping2D, Concatenate with the
    input itself, 1x1 sigmoid per pixel (ink mask); gray 32."""
    import keras
    Ly = L()
    xt, xc, xe = gray_sets(32, 1024)

    def train():
        _seed(811)
        inp = keras.Input((32, 32, 1), name="gray")
        h = Ly.ZeroPadding2D(4)(inp)                                                # 40
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(16, 3, use_bias=False)(h)))  # 38
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(24, 3, 2, use_bias=False)(h)))  # 18
        h = Ly.UpSampling2D(interpolation="bilinear")(h)                            # 36
        h = Ly.Cropping2D(2)(h)                                                     # 32
        h = Ly.Concatenate()([h, inp])
        h = Ly.Conv2D(16, 3, padding="same", activation="relu")(h)
        out = Ly.Conv2D(1, 1, activation="sigmoid", name="mask")(h)
        return _fit(keras.Model(inp, out, name="pad_crop_up"), xt, ZM._ink(xt), 6,
                    "binary_crossentropy")

    return _cached("pad_crop_up", train), ZooData(
        xc, xe, ("value",), "gray crops 32 [0,1]; ZeroPadding2D, valid conv+BN, bilinear "
        "UpSampling2D, Cropping2D, Concatenate with the input; sigmoid mask")


def lambda_custom():
    """A Lambda (x / 127.5 - 1) on the 0..255 input and a custom ChannelScale layer (own
    gamma/beta) after each conv (no BN); GAP; 8 classes. Kept as weights (a Lambda needs
    safe_mode=False to reload), the model rebuilt in code as its user has it in memory."""
    import keras
    Ly = L()
    C = _custom_layers()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(40)

    def make():
        inp = keras.Input((40, 40, 3), name="rgb255")
        h = Ly.Lambda(lambda x: x / 127.5 - 1.0, name="prep")(inp)
        for w in (16, 32, 48):
            h = Ly.Conv2D(w, 3, 2, "same")(h)
            h = Ly.ReLU()(C["ChannelScale"]()(h))
        out = Ly.Dense(8, activation="softmax", name="photo")(Ly.GlobalAveragePooling2D()(h))
        return keras.Model(inp, out, name="lambda_custom")

    def train(model):
        _seed(812)
        _fit(model, xt.astype(np.float32), yt, 10, "sparse_categorical_crossentropy")

    _seed(812)
    return _cached_weights("lambda_custom", make, train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("class",),
        "photo crops 40 0..255; Lambda(x/127.5-1), conv + custom ChannelScale (no BN); 8 classes")


def channels_first():
    """data_format="channels_first" throughout: Conv2D + BN(axis=1) + relu, MaxPooling2D,
    DepthwiseConv2D, GAP; input (3, 40, 40) in [0, 1]; 8 classes."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(40)

    def cf(x):
        return np.transpose(x.astype(np.float32) / 255.0, (0, 3, 1, 2)).copy()

    def train():
        _seed(813)
        keras.config.set_image_data_format("channels_first")
        try:
            inp = keras.Input((3, 40, 40), name="chw")
            h = Ly.ReLU()(Ly.BatchNormalization(axis=1)(Ly.Conv2D(16, 3, padding="same",
                                                                  use_bias=False)(inp)))
            h = Ly.MaxPooling2D()(h)
            h = Ly.ReLU()(Ly.BatchNormalization(axis=1)(Ly.DepthwiseConv2D(3, padding="same",
                                                                           use_bias=False)(h)))
            h = Ly.ReLU()(Ly.BatchNormalization(axis=1)(Ly.Conv2D(32, 3, 2, "same",
                                                                  use_bias=False)(h)))
            h = Ly.ReLU()(Ly.BatchNormalization(axis=1)(Ly.Conv2D(48, 3, 2, "same",
                                                                  use_bias=False)(h)))
            out = Ly.Dense(8, activation="softmax", name="photo")(Ly.GlobalAveragePooling2D()(h))
            model = keras.Model(inp, out, name="channels_first")
        finally:
            keras.config.set_image_data_format("channels_last")
        return _fit(model, cf(xt), yt, 10, "sparse_categorical_crossentropy")

    return _cached("channels_first", train), ZooData(
        cf(xc), cf(xe), ("class",), "photo crops 40 [0,1] as (3, 40, 40); channels_first "
        "Conv2D/DepthwiseConv2D/MaxPool/GAP + BN(axis=1); 8 classes")


def softmax_256():
    """A blob on a 16x16 grid of 48x48 images (0..255, Rescaling): 256 classes; strided
    conv+BN+relu, Flatten, Dense(256, softmax), trained 2 epochs only (unsure outputs)."""
    import keras
    Ly = L()

    def data(n, seed):
        return ZM._blob_grid(n, seed, rows=16, cols=16, size=48)

    xt, yt = data(8000, TRAIN_SEED)

    def train():
        _seed(814)
        inp = keras.Input((48, 48, 1), name="gray255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        for w, s in ((16, 1), (32, 2), (32, 2)):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(w, 3, s, "same", use_bias=False)(h)))
        out = Ly.Dense(256, activation="softmax", name="cell")(Ly.Flatten()(h))
        return _fit(keras.Model(inp, out, name="softmax_256"), xt, yt, 2,
                    "sparse_categorical_crossentropy", batch_size=64)

    return _cached("softmax_256", train), ZooData(
        data(N_CAL, cal_seed())[0], data(N_EVAL, EVAL_SEED)[0], ("class",),
        "blob on a 16x16 grid, 48x48 0..255, Rescaling; conv+BN, Flatten; 256 classes, "
        "2 epochs")


def seq_reloaded():
    """A Sequential WITHOUT an Input layer (built by its first fit), Rescaling, conv+BN+relu6,
    Dropout, saved to .keras and reloaded with keras.models.load_model (compile=True, as a
    user reloads it); 8 classes."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(40)
    path = _path("seq_reloaded", ".keras")
    if not os.path.exists(path):
        _seed(815)
        model = keras.Sequential([
            Ly.Rescaling(1 / 255.0),
            Ly.Conv2D(16, 3, 2, "same", use_bias=False), Ly.BatchNormalization(), Ly.ReLU(6.0),
            Ly.Conv2D(32, 3, 2, "same", use_bias=False), Ly.BatchNormalization(), Ly.ReLU(6.0),
            Ly.Conv2D(48, 3, 2, "same", use_bias=False), Ly.BatchNormalization(), Ly.ReLU(6.0),
            Ly.GlobalAveragePooling2D(), Ly.Dropout(0.2), Ly.Dense(8, activation="softmax")],
            name="seq_reloaded")
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
        model.fit(xt.astype(np.float32), yt, epochs=10, batch_size=32, verbose=0)
        _settle_bn(model, xt.astype(np.float32))
        tmp = path[:-len(".keras")] + f".{os.getpid()}.keras"
        model.save(tmp)
        os.replace(tmp, path)
    return keras.models.load_model(path), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("class",),
        "photo crops 40 0..255; Sequential without Input (Rescaling, conv+BN+relu6, Dropout), "
        "reloaded by keras.models.load_model; 8 classes")


def mnv3_10cls():
    """keras.applications.MobileNetV3Small (alpha 1.0, hard-swish, squeeze-excite, BN), no
    preprocessing layer, input in [-1, 1]: gray crops 64 as 3 channels; which picture (10);
    4 epochs."""
    import keras
    (xt, yt), (xc, _), (xe, _) = gray_labelled_sets(64, 1536)

    def prep(x):
        return np.repeat(x * 2.0 - 1.0, 3, axis=-1).astype(np.float32)

    def train():
        _seed(816)
        model = keras.applications.MobileNetV3Small(
            input_shape=(64, 64, 3), alpha=1.0, weights=None, classes=10,
            include_preprocessing=False, classifier_activation="softmax", dropout_rate=0.2)
        return _fit(model, prep(xt), yt, 4, "sparse_categorical_crossentropy")

    return _cached("mnv3_10cls", train), ZooData(
        prep(xc), prep(xe), ("class",), "keras.applications MobileNetV3Small alpha 1.0, no "
        "preprocessing, [-1,1] gray-as-RGB 64; which picture (10), 4 epochs")


def _tab_feats(x):
    """Four raw features of a gray crop on scales ~1e3, ~1, ~1e-2, ~50."""
    m = x.mean((1, 2, 3))
    s = x.std((1, 2, 3))
    g = np.abs(np.diff(x, axis=2)).mean((1, 2, 3))
    return np.stack([1000.0 * m + 500.0, s, 0.01 * g, 50.0 * (x > 0.5).mean((1, 2, 3))],
                    1).astype(np.float32)


def image_tab_norm():
    """Two inputs of different ranks: a gray crop 32 (conv+BN) and 4 raw tabular features
    (scales 1e-2..1e3) through an adapted Normalization then Dense+BN; Concatenate; 10 classes."""
    import keras
    Ly = L()
    (xt, yt), (xc, _), (xe, _) = gray_labelled_sets(32)

    def feed(x):
        return {"gray": x, "stats": _tab_feats(x)}

    def train():
        _seed(817)
        a = keras.Input((32, 32, 1), name="gray")
        b = keras.Input((4,), name="stats")
        h = a
        for w, s in ((16, 2), (32, 2)):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(w, 3, s, "same", use_bias=False)(h)))
        h = Ly.GlobalAveragePooling2D()(h)
        norm = Ly.Normalization(name="stats_norm")
        norm.adapt(_tab_feats(xt))
        g = Ly.ReLU()(Ly.BatchNormalization()(Ly.Dense(16, use_bias=False)(norm(b))))
        out = Ly.Dense(10, activation="softmax", name="picture")(Ly.Concatenate()([h, g]))
        return _fit(keras.Model([a, b], out, name="image_tab_norm"), feed(xt), yt, 8,
                    "sparse_categorical_crossentropy")

    return _cached("image_tab_norm", train), ZooData(
        feed(xc), feed(xe), ("class",), "gray crop 32 [0,1] + 4 raw stats (scales 1e-2..1e3, "
        "adapted Normalization inside); which picture (10)")


MODELS = {f.__name__: f for f in [
    nested_backbone, fcn_none, tanh_reg, reg_1e4, seg_dilated, sep1d_convt1d, conv1d_dw_groups,
    noop_layers, unitnorm_embed, tiny_vit, pad_crop_up, lambda_custom, channels_first,
    softmax_256, seq_reloaded, image_tab_norm, mnv3_10cls]}


# ------------------------------- extra: follow-ups of draw 0 (no-data ranges of bounded outputs)


def _embed_model(name, seed, normalize):
    import keras
    Ly = L()
    (xt, yt), (xc, _), (xe, _) = gray_labelled_sets(32)

    def make():
        inp = keras.Input((32, 32, 1), name="gray255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        for w, s in ((16, 1), (32, 2), (48, 2)):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(w, 3, s, "same", use_bias=False)(h)))
        e = normalize(Ly.Dense(16)(Ly.GlobalAveragePooling2D()(h)))
        return inp, e

    def train(model=None):
        _seed(seed)
        inp, e = make()
        logits = Ly.Dense(10, use_bias=False)(e)
        full = keras.Model(inp, Ly.Activation("softmax")(Ly.Rescaling(10.0)(logits)))
        _fit(full, xt * 255.0, yt, 8, "sparse_categorical_crossentropy")
        out = keras.Model(inp, e, name=name)
        if model is not None:
            model.set_weights(out.get_weights())
        return out

    return make, train, ZooData(
        xc * 255.0, xe * 255.0, ("value",), "gray crops 32 0..255, Rescaling inside; conv+BN, "
        "GAP, Dense(16), L2-normalised 16-d embedding")


def unitnorm_r255():
    """unitnorm_embed with Rescaling(1/255) inside (0..255 input: the range is known without
    data): UnitNormalization embedding output."""
    Ly = L()
    make, train, data = _embed_model("unitnorm_r255", 818,
                                     lambda t: Ly.UnitNormalization(name="embedding")(t))
    return _cached("unitnorm_r255", train), data


def l2_lambda_r255():
    """The same embedding normalised by a Lambda(keras.ops.normalize) instead (kept as weights:
    a Lambda needs safe_mode=False to reload)."""
    import keras
    Ly = L()
    make, train, data = _embed_model(
        "l2_lambda_r255", 819, lambda t: Ly.Lambda(lambda v: keras.ops.normalize(v, axis=-1),
                                                    name="embedding")(t))

    def build_model():
        inp, e = make()
        return keras.Model(inp, e, name="l2_lambda_r255")

    return _cached_weights("l2_lambda_r255", build_model, train), data


def tanh_img2img():
    """Image-to-image in [-1, 1] (generator-like): Rescaling(1/127.5, offset -1) inside,
    conv+BN+relu encoder, UpSampling2D + conv+BN decoder, per-pixel tanh; target: the gray
    crop blurred (sigma 2) in [-1, 1]."""
    import keras
    from scipy.ndimage import gaussian_filter
    Ly = L()
    xt, xc, xe = gray_sets(32, 1024)

    def target(x):
        return (gaussian_filter(x, sigma=(0, 2, 2, 0)) * 2.0 - 1.0).astype(np.float32)

    def train():
        _seed(820)
        inp = keras.Input((32, 32, 1), name="gray255")
        h = Ly.Rescaling(1 / 127.5, offset=-1.0)(inp)
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(16, 3, 1, "same", use_bias=False)(h)))
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(32, 3, 2, "same", use_bias=False)(h)))
        h = Ly.UpSampling2D()(h)
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(16, 3, 1, "same", use_bias=False)(h)))
        out = Ly.Conv2D(1, 3, padding="same", activation="tanh", name="image")(h)
        return _fit(keras.Model(inp, out, name="tanh_img2img"), xt * 255.0, target(xt), 6, "mse")

    return _cached("tanh_img2img", train), ZooData(
        xc * 255.0, xe * 255.0, ("value",), "gray crops 32 0..255, Rescaling to [-1,1] inside; "
        "conv+BN, UpSampling2D; per-pixel tanh (blurred image in [-1,1])")


MODELS.update({f.__name__: f for f in [unitnorm_r255, l2_lambda_r255, tanh_img2img]})


# ------------------------------------------ extra 2: more bounded ops in the middle or at the end


def cosine_softmax_r255():
    """The classifier unitnorm_r255's embedding was trained with, kept whole: UnitNormalization,
    Dense without bias (cosine logits), Rescaling(10), softmax; which gray picture (10)."""
    import keras
    Ly = L()
    (xt, yt), (xc, _), (xe, _) = gray_labelled_sets(32)

    def train():
        _seed(821)
        inp = keras.Input((32, 32, 1), name="gray255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        for w, s in ((16, 1), (32, 2), (48, 2)):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(w, 3, s, "same", use_bias=False)(h)))
        e = Ly.UnitNormalization()(Ly.Dense(16)(Ly.GlobalAveragePooling2D()(h)))
        logits = Ly.Rescaling(10.0)(Ly.Dense(10, use_bias=False)(e))
        out = Ly.Activation("softmax", name="picture")(logits)
        return _fit(keras.Model(inp, out, name="cosine_softmax_r255"), xt * 255.0, yt, 8,
                    "sparse_categorical_crossentropy")

    return _cached("cosine_softmax_r255", train), ZooData(
        xc * 255.0, xe * 255.0, ("class",), "gray crops 32 0..255 Rescaling; conv+BN, GAP, "
        "Dense(16), UnitNormalization, cosine Dense x10, softmax; which picture (10)")


def sigmoid_reg_r255():
    """A bounded regression by one sigmoid unit: the share of bright pixels (lum > 128) of a
    photo crop 40 0..255 (Rescaling inside), conv+BN, GAP; value in [0, 1]."""
    import keras
    Ly = L()
    (xt, _, _), (xc, _, _), (xe, _, _) = photo_sets(40)

    def target(x):
        return (_lum(x) > 128).mean((1, 2))[:, None].astype(np.float32)

    def train():
        _seed(822)
        inp = keras.Input((40, 40, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        for w in (16, 32, 48):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(w, 3, 2, "same", use_bias=False)(h)))
        out = Ly.Dense(1, activation="sigmoid", name="bright_share")(Ly.GlobalAveragePooling2D()(h))
        return _fit(keras.Model(inp, out, name="sigmoid_reg_r255"), xt.astype(np.float32),
                    target(xt), 10, "mse")

    return _cached("sigmoid_reg_r255", train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("value",),
        "photo crops 40 0..255 Rescaling; conv+BN, GAP; Dense(1, sigmoid) regression of the "
        "bright-pixel share")


def tanh_hidden_r255():
    """Hidden tanh activations after BN (conv+BN+tanh x3), GAP, 8-class softmax; photo crops
    40 0..255 with Rescaling."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(40)

    def train():
        _seed(823)
        inp = keras.Input((40, 40, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        for w in (16, 32, 48):
            h = Ly.Activation("tanh")(Ly.BatchNormalization()(Ly.Conv2D(w, 3, 2, "same",
                                                                        use_bias=False)(h)))
        out = Ly.Dense(8, activation="softmax", name="photo")(Ly.GlobalAveragePooling2D()(h))
        return _fit(keras.Model(inp, out, name="tanh_hidden_r255"), xt.astype(np.float32), yt,
                    10, "sparse_categorical_crossentropy")

    return _cached("tanh_hidden_r255", train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("class",),
        "photo crops 40 0..255 Rescaling; conv+BN+tanh x3, GAP; 8 classes")


def attn_pool_r255():
    """Attention pooling: conv+BN+relu features, a 1x1 conv score per position, softmax over
    the 100 positions, weighted sum (Dot); 8-class softmax; photo crops 40 0..255."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(40)

    def train():
        _seed(824)
        inp = keras.Input((40, 40, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        for w in (16, 32, 48):
            s = 1 if w == 48 else 2
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(w, 3, s, "same", use_bias=False)(h)))
        feats = Ly.Reshape((100, 48))(h)
        score = Ly.Reshape((100,))(Ly.Conv2D(1, 1)(h))
        weights = Ly.Softmax(name="where")(score)
        pooled = Ly.Dot(axes=(1, 1))([weights, feats])
        out = Ly.Dense(8, activation="softmax", name="photo")(pooled)
        return _fit(keras.Model(inp, out, name="attn_pool_r255"), xt.astype(np.float32), yt,
                    10, "sparse_categorical_crossentropy")

    return _cached("attn_pool_r255", train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("class",),
        "photo crops 40 0..255 Rescaling; conv+BN; softmax attention pooling over 10x10 "
        "positions (Dot); 8 classes")


MODELS.update({f.__name__: f for f in [
    cosine_softmax_r255, sigmoid_reg_r255, tanh_hidden_r255, attn_pool_r255]})


# --------------------------- extra 3: preprocessing inside, shared layers, inverted Normalization


def resizing_r255():
    """Preprocessing inside: Resizing(32, 32) (bilinear) of a 64x64 0..255 input, then
    Rescaling(1/255), conv+BN+relu, GAP; 8 classes."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(64)

    def train():
        _seed(825)
        inp = keras.Input((64, 64, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(Ly.Resizing(32, 32)(inp))
        for w in (16, 32, 48):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(w, 3, 2, "same", use_bias=False)(h)))
        out = Ly.Dense(8, activation="softmax", name="photo")(Ly.GlobalAveragePooling2D()(h))
        return _fit(keras.Model(inp, out, name="resizing_r255"), xt.astype(np.float32), yt, 10,
                    "sparse_categorical_crossentropy")

    return _cached("resizing_r255", train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("class",),
        "photo crops 64 0..255; Resizing(32,32) + Rescaling inside; conv+BN; 8 classes")


def _pairs(n, seed, size=32):
    """Two photo crops and whether they come from the same photo (half the pairs do)."""
    rng = np.random.default_rng(seed)
    a, pa, _ = photo_crops(n, size, seed)
    b, pb, _ = photo_crops(4 * n, size, seed + 1)
    same = rng.random(n) < 0.5
    pick = np.empty(n, np.int64)
    for i in range(n):
        pool = np.flatnonzero((pb == pa[i]) == same[i])
        pick[i] = rng.choice(pool)
    return {"left": a.astype(np.float32), "right": b[pick].astype(np.float32)}, \
        (pb[pick] == pa).astype(np.float32)


def siamese_shared():
    """One nested backbone (Rescaling, conv+BN+relu, GAP) called on two inputs (shared
    weights), squared difference (Subtract, Multiply), Dense, one sigmoid: same photo or not."""
    import keras
    Ly = L()
    xt, yt = _pairs(2048, TRAIN_SEED)

    def train():
        _seed(826)
        b_in = keras.Input((32, 32, 3))
        h = Ly.Rescaling(1 / 255.0)(b_in)
        for w in (16, 32, 48):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(w, 3, 2, "same", use_bias=False)(h)))
        backbone = keras.Model(b_in, Ly.GlobalAveragePooling2D()(h), name="shared_backbone")
        a, b = keras.Input((32, 32, 3), name="left"), keras.Input((32, 32, 3), name="right")
        diff = Ly.Subtract()([backbone(a), backbone(b)])
        h = Ly.Dense(16, activation="relu")(Ly.Multiply()([diff, diff]))
        out = Ly.Dense(1, activation="sigmoid", name="same")(h)
        return _fit(keras.Model([a, b], out, name="siamese_shared"), xt, yt, 10,
                    "binary_crossentropy")

    return _cached("siamese_shared", train), ZooData(
        _pairs(N_CAL, cal_seed())[0], _pairs(N_EVAL, EVAL_SEED)[0], ("value",),
        "two photo crops 32 0..255 into ONE shared nested conv+BN backbone; squared difference, "
        "Dense; one sigmoid (same photo)")


def tied_conv_twice():
    """Weight tying in one graph: the same Conv2D layer (and the same BatchNormalization) called
    twice in a row, a residual Add around each call; GAP; 8 classes; photo crops 32 0..255."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(32)

    def train():
        _seed(827)
        inp = keras.Input((32, 32, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(24, 3, 2, "same", use_bias=False)(h)))
        conv = Ly.Conv2D(24, 3, padding="same", use_bias=False, name="tied_conv")
        bn = Ly.BatchNormalization(name="tied_bn")
        for _ in range(2):
            h = Ly.ReLU()(Ly.Add()([h, bn(conv(h))]))
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(48, 3, 2, "same", use_bias=False)(h)))
        out = Ly.Dense(8, activation="softmax", name="photo")(Ly.GlobalAveragePooling2D()(h))
        return _fit(keras.Model(inp, out, name="tied_conv_twice"), xt.astype(np.float32), yt, 10,
                    "sparse_categorical_crossentropy")

    return _cached("tied_conv_twice", train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("class",),
        "photo crops 32 0..255 Rescaling; one Conv2D + one BN called twice (tied), residual; "
        "8 classes")


def norm_invert_reg():
    """A regression head ending in Normalization(invert=True) adapted on the raw targets (the
    model outputs ~1e4 while trained on standardized targets); Rescaling, conv+BN, GAP, Dense."""
    import keras
    Ly = L()
    (xt, _, _), (xc, _, _), (xe, _, _) = photo_sets(40)

    def train():
        _seed(828)
        t = _price(xt)
        denorm = Ly.Normalization(invert=True, name="denorm")
        denorm.adapt(t)
        inp = keras.Input((40, 40, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        for w in (16, 32, 48):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(w, 3, 2, "same", use_bias=False)(h)))
        z = Ly.Dense(1, name="z")(Ly.Dense(32, activation="relu")(Ly.GlobalAveragePooling2D()(h)))
        trainer = keras.Model(inp, z)
        _fit(trainer, xt.astype(np.float32), (t - t.mean()) / t.std(), 12, "mse")
        return keras.Model(inp, denorm(z), name="norm_invert_reg")

    return _cached("norm_invert_reg", train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("value",),
        "photo crops 40 0..255 Rescaling; conv+BN; Dense(1) then Normalization(invert=True) "
        "adapted on targets ~1e4")


MODELS.update({f.__name__: f for f in [resizing_r255, siamese_shared, tied_conv_twice,
                                       norm_invert_reg]})


def build(name):
    global DRAW
    base, _, draw = name.partition("@")
    DRAW = int(draw or 0)
    return MODELS[base]()
