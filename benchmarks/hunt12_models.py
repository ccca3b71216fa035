"""hunt12: models built to hunt for cle's failures on kinds neither the zoo (zoo_models.py) nor
hunt7-11 tried, with zoo_models' interface, for ``bench_zoo.py --zoo hunt12_models``::

    nice -n 10 .venv/bin/python benchmarks/bench_zoo.py --zoo hunt12_models \
        --models frozen_mnv2 melspec_audio --json /tmp/h12/hunt12.jsonl

``build(name) -> (model, ZooData)``; a name "base@k" (k = 1, 2, ...) is the same model with
another draw of 64 calibration inputs (hunt9's :func:`hunt9_models.cal_seed`; the held-out
inputs, 1000 generated ones, are the same). The data helpers are hunt9's (photo crops, raw
synthetic sounds); trained models are cached beside the zoo's (:func:`zoo_models.cache_dir`,
``hunt12/``), keyed by the model's name only; the model with a Lambda keeps its weights only
(``.weights.h5``) and is rebuilt in code. Written fast: what a new user might train in a
minute, not tuned.

Kinds: transfer learning with a FROZEN keras.applications backbone (base.trainable = False;
MobileNetV2 alpha 0.35 and EfficientNetV2B0 at 32 px, weights=None, each trained on 8 photo
classes first so its weights are not random) and a new head on another task (the crop's
quadrant); raw audio through keras.layers.MelSpectrogram (power_to_db) and through
keras.layers.STFTSpectrogram(mode="log") then conv+BN; a DeepLab-like segmenter (atrous convs
+ BN, an ASPP with an image-pooling branch, Resizing back to input size, per-pixel softmax);
super-resolution 16 -> 32 px with a pixel shuffle by Reshape/Permute and one by a Lambda of
tf.nn.depth_to_space, linear image outputs; an instance-norm (GroupNormalization(groups=-1))
image-to-image net; Keras 3 image preprocessing layers left in the model (AutoContrast, active
at inference; Solarization, Equalization, RandAugment, identities at inference); a hand-built
MobileNet (Conv2D with a bias then BN and ReLU(max_value=6), Identity, SeparableConv2D + BN +
relu6, Reshape juggling, Dense on a 4-D tensor, Flatten); three outputs (softmax, one sigmoid,
linear box); one output that is a Concatenate of a softmax and raw box values in pixels.
"""
from __future__ import annotations

import numpy as np

import hunts  # what the hunts after hunt9 share
import zoo_models as ZM  # the repository's zoo: data helpers, ZooData
import hunt9_models as H9  # hunt9's data helpers and its draw of calibration inputs

ZooData = ZM.ZooData
Missing = ZM.Missing
_fit, _seed, _settle_bn = ZM._fit, ZM._seed, ZM._settle_bn
photo_sets, _conv_bn, _f32, L = H9.photo_sets, H9._conv_bn, H9._f32, H9.L
N_CAL, N_EVAL = H9.N_CAL, H9.N_EVAL
DRAW = 0  # set by build() (here and in hunt9_models, whose cal_seed() the data helpers read)
_cached, _cached_weights = hunts.caches("hunt12")


def _quadrant(box):
    """The crop's quadrant in its photo (0..3) from hunt9's boxes (centre y, centre x, ...)."""
    return (2 * (box[:, 0] > 0.5) + (box[:, 1] > 0.5)).astype(np.int64)


# ------------------------------------------------------------------------------- the models


def _frozen(name, seed, make_base, pre):
    """Transfer learning: ``make_base()`` (keras.applications, include_top=False, 32 px) is
    first trained with a head on the 8 photo classes (3 epochs), then frozen (base.trainable
    = False) and a new head (GAP, Dropout, Dense(4, softmax)) trained on the crop's quadrant."""
    import keras
    Ly = L()
    (xt, yt, bt), (xc, _, _), (xe, _, _) = photo_sets(32)

    def train():
        _seed(seed)
        base = make_base()
        inp = keras.Input((32, 32, 3), name="rgb255")
        h = pre(inp)
        f = base(h)
        out = Ly.Dense(8, activation="softmax")(Ly.GlobalAveragePooling2D()(f))
        _fit(keras.Model(inp, out), _f32(xt), yt, 3, "sparse_categorical_crossentropy")
        base.trainable = False
        h = Ly.Dropout(0.2)(Ly.GlobalAveragePooling2D()(base(pre(inp), training=False)))
        out = Ly.Dense(4, activation="softmax", name="quadrant")(h)
        return _fit(keras.Model(inp, out, name=name), _f32(xt), _quadrant(bt), 4,
                    "sparse_categorical_crossentropy", lr=3e-3)

    return _cached(name, train), ZooData(_f32(xc), _f32(xe), ("class",), "")


def frozen_mnv2():
    """keras.applications.MobileNetV2(alpha=0.35, weights=None, 32 px) behind
    Rescaling(1/127.5, -1), trained on 8 photo classes, then frozen; new head: the quadrant."""
    import keras
    Ly = L()
    model, d = _frozen(
        "frozen_mnv2", 1201,
        lambda: keras.applications.MobileNetV2((32, 32, 3), alpha=0.35, include_top=False,
                                               weights=None),
        lambda x: Ly.Rescaling(1 / 127.5, offset=-1.0)(x))
    d.source = ("photo crops 32 0..255; frozen MobileNetV2 a0.35 (pretrained here on 8 "
                "photos) + new head: quadrant, 4 classes")
    return model, d


def frozen_effv2():
    """keras.applications.EfficientNetV2B0(weights=None, 32 px, its Rescaling inside), trained
    on 8 photo classes, then frozen; new head: the quadrant."""
    import keras
    model, d = _frozen(
        "frozen_effv2", 1202,
        lambda: keras.applications.EfficientNetV2B0(include_top=False, weights=None,
                                                    input_shape=(32, 32, 3)),
        lambda x: x)
    d.source = ("photo crops 32 0..255; frozen EfficientNetV2B0 (pretrained here on 8 photos, "
                "preprocessing inside) + new head: quadrant, 4 classes")
    return model, d


# ---- audio: hunt9's synthetic sounds (8 kinds) as raw waveforms at 8 kHz

WAVE = H9.N_FFT + H9.HOP * (H9.FRAMES - 1)  # 4224 samples, 32 frames of 256 hopped by 128


def _waves(n, seed):
    """``n`` of hunt9's synthetic sounds (8 kinds) as raw waveforms of WAVE samples, each
    divided by its peak where that passes 1, and their kind."""
    rng = np.random.default_rng(seed)
    y = rng.integers(8, size=n)
    x = np.stack([H9._sound(rng, k, WAVE) for k in y])
    # as audio files hold it, in [-1, 1] (hunt9's brown noise reaches 60: its int8 input step
    # then hid the quiet sines, in the plain conversion and cle's alike)
    x /= np.maximum(1.0, np.abs(x).max(axis=1, keepdims=True))
    return x.astype(np.float32), y


def _wave_sets():
    return _waves(2048, H9.TRAIN_SEED), _waves(N_CAL, H9.cal_seed()), \
        _waves(N_EVAL, H9.EVAL_SEED)


def melspec_audio():
    """Raw audio (4224 samples at 8 kHz) -> keras.layers.MelSpectrogram(fft 256, stride 128,
    32 mel bins, power_to_db, top_db 80) -> Reshape to (mels, frames, 1), Rescaling(1/40,
    offset 1) -> conv+BN+relu x3 -> GAP -> 8 sound kinds."""
    import keras
    Ly = L()
    (xt, yt), (xc, _), (xe, _) = _wave_sets()

    def train():
        _seed(1203)
        inp = keras.Input((WAVE,), name="audio")
        m = Ly.MelSpectrogram(fft_length=256, sequence_stride=128, sampling_rate=8000,
                              num_mel_bins=32, min_freq=0.0, max_freq=4000.0)(inp)
        h = Ly.Rescaling(1 / 40.0, offset=1.0)(Ly.Reshape((32, -1, 1))(m))
        for w in (16, 32, 48):
            h = _conv_bn(h, w, 2)
        out = Ly.Dense(8, activation="softmax", name="sound")(Ly.GlobalAveragePooling2D()(h))
        return _fit(keras.Model(inp, out, name="melspec_audio"), xt, yt, 6,
                    "sparse_categorical_crossentropy")

    return _cached("melspec_audio", train), ZooData(
        xc, xe, ("class",), "raw synthetic sounds 4224 @ 8 kHz; MelSpectrogram layer (dB) "
        "inside, conv+BN; 8 kinds")


def stft_audio():
    """Raw audio (4224, 1) -> keras.layers.STFTSpectrogram(mode="log", frame 256, stride 128,
    hann) -> (33 frames, 129 bins) -> Conv1D+BN+relu x3 -> GAP1D -> 8 sound kinds."""
    import keras
    Ly = L()
    (xt, yt), (xc, _), (xe, _) = _wave_sets()

    def train():
        _seed(1204)
        inp = keras.Input((WAVE, 1), name="audio")
        h = Ly.STFTSpectrogram(mode="log", frame_length=256, frame_step=128,
                               window="hann", trainable=False)(inp)
        for w in (32, 48, 64):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv1D(w, 3, 2, "same",
                                                            use_bias=False)(h)))
        out = Ly.Dense(8, activation="softmax", name="sound")(Ly.GlobalAveragePooling1D()(h))
        return _fit(keras.Model(inp, out, name="stft_audio"), xt[..., None], yt, 6,
                    "sparse_categorical_crossentropy")

    return _cached("stft_audio", train), ZooData(
        xc[..., None], xe[..., None], ("class",), "raw synthetic sounds 4224 @ 8 kHz; "
        "STFTSpectrogram(mode=log) inside, Conv1D+BN; 8 kinds")


# ---- segmentation: per-pixel classes of photo crops

def _pixel_classes(x):
    """Per pixel of 0..255 RGB crops: 0 dark (luminance < 70), 1 bright (> 170), 2 green
    dominant, 3 otherwise."""
    x = np.asarray(x, np.float32)
    lum = x @ np.array([0.299, 0.587, 0.114], np.float32)
    lab = np.full(lum.shape, 3, np.int64)
    lab[(x[..., 1] > x[..., 0] + 10) & (x[..., 1] > x[..., 2] + 10)] = 2
    lab[lum > 170] = 1
    lab[lum < 70] = 0
    return lab


def deeplab_aspp():
    """A DeepLab-like segmenter on photo crops 32 0..255: Rescaling, conv+BN stride 2 x2 (8 x
    8), an ASPP (1x1, 3x3 dilation 2 and 4, each +BN+relu, and an image-pooling branch GAP ->
    1x1 conv+BN+relu -> UpSampling2D(8, bilinear)), Concatenate, 1x1 conv+BN+relu, Conv2D(4, 1),
    Resizing(32, 32, bilinear) back to the input's size, per-pixel softmax (4 classes)."""
    import keras
    Ly = L()
    (xt, _, _), (xc, _, _), (xe, _, _) = photo_sets(32)

    def train():
        _seed(1205)
        inp = keras.Input((32, 32, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        h = _conv_bn(_conv_bn(h, 24, 2), 48, 2)
        branches = [_conv_bn(h, 32, k=1)]
        for d in (2, 4):
            branches.append(Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(
                32, 3, padding="same", dilation_rate=d, use_bias=False)(h))))
        p = Ly.GlobalAveragePooling2D(keepdims=True)(h)
        p = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(32, 1, use_bias=False)(p)))
        branches.append(Ly.UpSampling2D(8, interpolation="bilinear")(p))
        h = _conv_bn(Ly.Concatenate()(branches), 48, k=1)
        h = Ly.Resizing(32, 32, interpolation="bilinear")(Ly.Conv2D(4, 1)(h))
        out = Ly.Softmax(name="pixel_class")(h)
        return _fit(keras.Model(inp, out, name="deeplab_aspp"), _f32(xt), _pixel_classes(xt),
                    8, "sparse_categorical_crossentropy")

    return _cached("deeplab_aspp", train), ZooData(
        _f32(xc), _f32(xe), ("class",), "photo crops 32 0..255; atrous ASPP + BN, image "
        "pooling, Resizing to 32, per-pixel softmax 4 classes (dark, bright, green, other)")


# ---- super-resolution: 16 px crops (2x2 means) -> the 32 px crops, [0, 1]

def _sr_sets():
    out = []
    for x, _, _ in photo_sets(32):
        hi = _f32(x) / 255.0
        lo = hi.reshape(len(hi), 16, 2, 16, 2, 3).mean(axis=(2, 4))
        out.append((lo, hi))
    return out


def _sr_body(inp):
    Ly = L()
    h = Ly.Conv2D(32, 5, padding="same", activation="relu")(inp)
    h = Ly.Conv2D(32, 3, padding="same", activation="relu")(h)
    h = Ly.Conv2D(12, 3, padding="same")(h)  # 2 x 2 x 3 per low-res pixel
    return h


def superres_shuffle():
    """ESPCN-like super-resolution 16 -> 32 px, no BN: Conv2D(relu) x2, Conv2D(12), a pixel
    shuffle by Reshape((16, 16, 2, 2, 3)), Permute((1, 3, 2, 4, 5)), Reshape((32, 32, 3)),
    plus bilinear UpSampling2D of the input (residual Add): a linear image in [0, 1]."""
    import keras
    Ly = L()
    (lt, ht), (lc, _), (le, _) = _sr_sets()

    def train():
        _seed(1206)
        inp = keras.Input((16, 16, 3), name="low")
        h = Ly.Reshape((16, 16, 2, 2, 3))(_sr_body(inp))
        h = Ly.Reshape((32, 32, 3))(Ly.Permute((1, 3, 2, 4, 5))(h))
        out = Ly.Add(name="high")([h, Ly.UpSampling2D(2, interpolation="bilinear")(inp)])
        return _fit(keras.Model(inp, out, name="superres_shuffle"), lt, ht, 10, "mse")

    return _cached("superres_shuffle", train), ZooData(
        lc, le, ("value",), "photo crops 16 [0, 1] -> 32; pixel shuffle by Reshape/Permute, "
        "bilinear residual; linear image")


def superres_d2s():
    """The same super-resolution with the pixel shuffle a Lambda of tf.nn.depth_to_space(2)
    (weights cached, rebuilt in code) and no residual: Conv2D(12) -> depth_to_space ->
    Conv2D(3, 3) linear."""
    import keras
    Ly = L()
    (lt, ht), (lc, _), (le, _) = _sr_sets()

    def make():
        import tensorflow as tf
        _seed(1207)
        inp = keras.Input((16, 16, 3), name="low")
        h = Ly.Lambda(lambda t: tf.nn.depth_to_space(t, 2), name="d2s")(_sr_body(inp))
        out = Ly.Conv2D(3, 3, padding="same", name="high")(h)
        return keras.Model(inp, out, name="superres_d2s")

    def train(model):
        _fit(model, lt, ht, 12, "mse")

    return _cached_weights("superres_d2s", make, train), ZooData(
        lc, le, ("value",), "photo crops 16 [0, 1] -> 32; Lambda(tf.nn.depth_to_space); "
        "linear image")


def _stylize(x):
    """A fixed 'style' of 0..255 RGB crops, in [0, 1]: a sepia colour matrix, then 1.5 x the
    image minus 0.5 x its 3x3 box blur (sharpened), clipped."""
    from scipy.ndimage import uniform_filter
    x = _f32(x) / 255.0
    sepia = np.array([[0.393, 0.349, 0.272], [0.769, 0.686, 0.534], [0.189, 0.168, 0.131]],
                     np.float32)
    s = x @ sepia
    s = 1.5 * s - 0.5 * uniform_filter(s, (0, 3, 3, 0))
    return np.clip(s, 0, 1).astype(np.float32)


def instnorm_style():
    """A style-transfer-like image-to-image net on photo crops 32 0..255: Rescaling, Conv2D 5x5
    + GroupNormalization(groups=-1) (instance norm) + relu, Conv2D stride 2 + IN + relu, two
    residual blocks (conv + IN + relu, conv + IN, Add), UpSampling2D + Conv2D + IN + relu,
    Conv2D(3, 5) linear: the sepia-sharpened crop in [0, 1]."""
    import keras
    Ly = L()
    (xt, _, _), (xc, _, _), (xe, _, _) = photo_sets(32)

    def cin(h, w, k=3, s=1, act=True):
        h = Ly.GroupNormalization(groups=-1)(Ly.Conv2D(w, k, s, "same", use_bias=False)(h))
        return Ly.ReLU()(h) if act else h

    def train():
        _seed(1208)
        inp = keras.Input((32, 32, 3), name="rgb255")
        h = cin(Ly.Rescaling(1 / 255.0)(inp), 16, 5)
        h = cin(h, 32, 3, 2)
        for _ in range(2):
            h = Ly.Add()([h, cin(cin(h, 32), 32, act=False)])
        h = cin(Ly.UpSampling2D(2)(h), 16)
        out = Ly.Conv2D(3, 5, padding="same", name="styled")(h)
        return _fit(keras.Model(inp, out, name="instnorm_style"), _f32(xt), _stylize(xt), 8,
                    "mse")

    return _cached("instnorm_style", train), ZooData(
        _f32(xc), _f32(xe), ("value",), "photo crops 32 0..255; instance norm "
        "(GroupNormalization groups=-1), residual; linear sepia-sharpened image")


def prep_layers():
    """Keras 3 image preprocessing left in a photo classifier: Equalization, AutoContrast((0,
    255)) (active at inference: each image stretched to its own min..max), Solarization(0.3),
    RandAugment (all but AutoContrast identities at inference), Rescaling, conv+BN x3, 8 classes."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(32)

    def train():
        _seed(1209)
        inp = keras.Input((32, 32, 3), name="rgb255")
        # Equalization first: after AutoContrast, Keras 3.15 builds a graph "with a cycle"
        h = Ly.Equalization(value_range=(0, 255))(inp)
        h = Ly.AutoContrast(value_range=(0, 255))(h)
        h = Ly.Solarization(addition_factor=0.3, value_range=(0, 255))(h)
        h = Ly.RandAugment(value_range=(0, 255), num_ops=1)(h)
        h = Ly.Rescaling(1 / 255.0)(h)
        for w in (16, 32, 48):
            h = _conv_bn(h, w, 2)
        out = Ly.Dense(8, activation="softmax", name="photo")(Ly.GlobalAveragePooling2D()(h))
        return _fit(keras.Model(inp, out, name="prep_layers"), _f32(xt), yt, 8,
                    "sparse_categorical_crossentropy")

    return _cached("prep_layers", train), ZooData(
        _f32(xc), _f32(xe), ("class",), "photo crops 32 0..255; AutoContrast (acts), "
        "Solarization, Equalization, RandAugment inside; conv+BN; 8 classes")


def mobilenet_hand():
    """A MobileNet built by hand: Rescaling(1/127.5, -1); Conv2D(16, 3, 2) WITH a bias + BN +
    ReLU(max_value=6); Identity; DepthwiseConv2D (bias) + BN + relu6; Conv2D 1x1 (bias) + BN +
    relu6; SeparableConv2D(32, 3, 2) + BN + relu6 (as Activation("relu6")); Reshape((64, 32)),
    Reshape((8, 8, 32)); Dense(24) on the 4-D tensor + BN + relu6; Flatten; Dense(8, softmax)."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(32)

    def train():
        _seed(1210)
        inp = keras.Input((32, 32, 3), name="rgb255")
        h = Ly.Rescaling(1 / 127.5, offset=-1.0)(inp)
        h = Ly.ReLU(max_value=6.0)(Ly.BatchNormalization()(Ly.Conv2D(16, 3, 2, "same")(h)))
        h = Ly.Identity()(h)
        h = Ly.DepthwiseConv2D(3, padding="same")(h)
        h = Ly.ReLU(max_value=6.0)(Ly.BatchNormalization()(h))
        h = Ly.ReLU(max_value=6.0)(Ly.BatchNormalization()(Ly.Conv2D(24, 1)(h)))
        h = Ly.SeparableConv2D(32, 3, 2, "same")(h)
        h = Ly.Activation("relu6")(Ly.BatchNormalization()(h))
        h = Ly.Reshape((8, 8, 32))(Ly.Reshape((64, 32))(h))
        h = Ly.Activation("relu6")(Ly.BatchNormalization()(Ly.Dense(24)(h)))
        out = Ly.Dense(8, activation="softmax", name="photo")(Ly.Flatten()(Ly.Identity()(h)))
        return _fit(keras.Model(inp, out, name="mobilenet_hand"), _f32(xt), yt, 8,
                    "sparse_categorical_crossentropy")

    return _cached("mobilenet_hand", train), ZooData(
        _f32(xc), _f32(xe), ("class",), "photo crops 32 0..255; hand-built MobileNet: biased "
        "conv + BN + relu6, SeparableConv2D, Identity, Reshape, Dense on 4-D, Flatten")


def _backbone(inp):
    Ly = L()
    h = Ly.Rescaling(1 / 255.0)(inp)
    for w in (16, 32, 48):
        h = _conv_bn(h, w, 2)
    return Ly.GlobalAveragePooling2D()(h)


def three_heads():
    """One conv+BN backbone, three outputs: Dense(8, softmax) photo; Dense(1, sigmoid) is the
    crop bright (mean luminance > 110); Dense(4) linear box (fractions of the photo)."""
    import keras
    Ly = L()
    (xt, yt, bt), (xc, _, _), (xe, _, _) = photo_sets(32)
    bright = (H9._lum(_f32(xt)).reshape(len(xt), -1).mean(1) > 110).astype(np.float32)

    def train():
        _seed(1211)
        inp = keras.Input((32, 32, 3), name="rgb255")
        f = Ly.Dense(32, activation="relu")(_backbone(inp))
        outs = [Ly.Dense(8, activation="softmax", name="photo")(f),
                Ly.Dense(1, activation="sigmoid", name="bright")(f),
                Ly.Dense(4, name="box")(f)]
        model = keras.Model(inp, outs, name="three_heads")
        model.compile(optimizer=keras.optimizers.Adam(2e-3),
                      loss=["sparse_categorical_crossentropy", "binary_crossentropy", "mse"])
        model.fit(_f32(xt), [yt, bright, bt], epochs=10, batch_size=32, verbose=0)
        return _settle_bn(model, _f32(xt))

    return _cached("three_heads", train), ZooData(
        _f32(xc), _f32(xe), ("class", "value", "value"), "photo crops 32 0..255; conv+BN; "
        "outputs softmax 8, one sigmoid, linear box 4")


def concat_out():
    """One conv+BN backbone, Dense(8, softmax) photo and Dense(4) box in pixels of a 256-px
    photo (0..256) trained as two outputs, shipped as ONE output: Concatenate([probs, box])
    (12 values)."""
    import keras
    Ly = L()
    (xt, yt, bt), (xc, _, _), (xe, _, _) = photo_sets(32)

    def train():
        _seed(1212)
        inp = keras.Input((32, 32, 3), name="rgb255")
        f = Ly.Dense(32, activation="relu")(_backbone(inp))
        probs = Ly.Dense(8, activation="softmax", name="photo")(f)
        box = Ly.Dense(4, name="box")(f)
        model = keras.Model(inp, [probs, box])
        model.compile(optimizer=keras.optimizers.Adam(2e-3),
                      loss=["sparse_categorical_crossentropy", "mse"], loss_weights=[1, 1e-3])
        model.fit(_f32(xt), [yt, 256 * bt], epochs=10, batch_size=32, verbose=0)
        _settle_bn(model, _f32(xt))
        return keras.Model(inp, Ly.Concatenate(name="probs_box")([probs, box]),
                           name="concat_out")

    return _cached("concat_out", train), ZooData(
        _f32(xc), _f32(xe), ("value",), "photo crops 32 0..255; conv+BN; one output: "
        "Concatenate(softmax 8, box 4 in pixels 0..256)")


MODELS = {f.__name__: f for f in [
    frozen_mnv2, frozen_effv2, melspec_audio, stft_audio, deeplab_aspp, superres_shuffle,
    superres_d2s, instnorm_style, prep_layers, mobilenet_hand, three_heads, concat_out]}


build = hunts.builder(MODELS, __name__)
