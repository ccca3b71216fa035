"""hunt9: models built to hunt for cle's failures on kinds neither the zoo (zoo_models.py), hunt7
(hunt7_models.py) nor hunt8 (hunt8_models.py) tried, with zoo_models' interface, for
``bench_zoo.py --zoo hunt9_models``::

    nice -n 10 .venv/bin/python benchmarks/bench_zoo.py --zoo hunt9_models \
        --models text_conv1d logmel_db --json /tmp/h9/hunt9.jsonl

``build(name) -> (model, ZooData)``. A name "base@k" (k = 1, 2, ...) is the same model with
another draw of 64 calibration inputs from the same source (the held-out inputs, 1000, or 192
of a fixed sklearn set, are the same). Trained models are cached beside the zoo's
(:func:`zoo_models.cache_dir`, ``hunt9/``); the subclassed model keeps its weights only
(``.weights.h5``) and is rebuilt in code, as the user who wrote it has it. Written fast, for a
hunt: the models are what a new user might train in a minute, not tuned.

Kinds: keras.applications EfficientNetB0 (weights=None, Rescaling + Normalization inside,
swish, squeeze-excite) and MobileNet v1 (alpha 0.25, ReLU6) trained briefly at 32 px with a new
head; a small pre-activation ResNet (BN-relu before each conv, ResNet50V2-style) and a small
DenseNet (BN-relu-conv, Concatenate growth, transitions); integer tokens -> Embedding -> Conv1D
-> GlobalMaxPooling1D; a log-mel spectrogram in dB ([-80, 0], no scaling) with conv+BN, 8
classes, and a CRNN-without-RNN on it (adapted Normalization, Permute, Reshape, Conv1D); a
per-pixel ReLU regression (unbounded positive, depth-like) and 3-channel keypoint heatmaps
(per-pixel sigmoid); dict outputs of three kinds (softmax, 4 sigmoids, linear box) from one
backbone; activations LeakyReLU / ELU / SELU / softplus and hard_sigmoid / hard_silu / mish /
gelu after BN; Multiply (sigmoid gate), Subtract, Average, Maximum, Minimum merges in residual
blocks; BN center=False / scale=False, Conv2D(use_bias=True) + BN, Conv2D(activation="relu")
then BN (a BN after the activation); Permute to channels-first + BN(axis=1); tabular MLPs with
no conv (BN right after the Input on raw breast-cancer features, 1 sigmoid; BN after each Dense,
diabetes regression); TimeDistributed(Conv2D) on 4-frame clips, and Conv3D on the same clips; a
ConvNeXt-like block (depthwise 7x7, LayerNormalization, Dense 4x + GELU, layer scale); a model
trained under the "mixed_float16" policy; a float64 model; a subclassed keras.Model. Extras: a
YOLO-like raw grid head (one linear 4x4x8 output mixing logits, 0..1 offsets and sizes in
pixels), a count regression ending in Activation("exponential") (Poisson loss), and a text
transformer block (int tokens, Embedding + position embedding, MultiHeadAttention, LayerNorm).

Found (helper hunt9, draw 0 unless named; /tmp/h9/*.jsonl): without data, grid_head_raw read
12 dB below the plain conversion with a claim 9.5 dB above the real figure (draws 0, 1: its
map output of 128 values escaped the regression-output refusal, and the size channels were
clipped at the synthetic inputs' 13.8 against real outputs up to 20.7; refused since, as a map
of values made past the last batch norm: CHANGELOG); keypoint_heatmaps
9.8 dB below plain (draws 0, 1; the 1e-4 tails of the synthetic inputs cut every hidden ReLU
range by ~40 %; ranges="minmax" without data gives 35.0 against plain 33.7); effnet_b0 (draws
1, 2: 8.4-9.1 dB) and acts_a (draws 1, 2: 8.7-12.2 dB) below plain (the pooled vector's range
from synthetic inputs 5.9x and 1.6x wider than the real one). With data every output is
within 0.5 dB of plain or above it; claims are inside their (wide) intervals but up to 15.8-
19.6 dB above the real figure (densenet_small draws 0, 1; convnext_small +5.9/+12.0, tab_bn_reg
+8.7/+9.9). A multi-label sigmoid output (multitask_dict's attrs) is checked as class scores:
"top-1 67 %" while 99.9 % of its thresholded attributes agree. Refused, in one clear line:
subclassed (ValueError, CLI exit 1; TF Lite's converter writes it; traced since, CHANGELOG: with
data 48.1 dB, the plain conversion written, without data 50.2, +2.1), mixed_f16 and float64_model (ValueError, CLI exit 2; TF Lite's converter itself fails
on both; bench_zoo counted these ValueErrors as crashes, now as refusals: bench_zoo.refusal),
and without data every non-image input, every model
without BN (text, ConvNeXt), TimeDistributed BNs, and regression outputs.
"""
from __future__ import annotations

import functools
import os

import numpy as np

import zoo_models as ZM  # the repository's zoo: data helpers, ZooData
import hunt8_models as H8  # hunt8's data helpers (photo_sets, gray_sets, _lum)

ZooData = ZM.ZooData
Missing = ZM.Missing
photo_crops, gray_crops, _fit, _settle_bn = (
    ZM.photo_crops, ZM.gray_crops, ZM._fit, ZM._settle_bn)

N_CAL, N_EVAL = 64, 1000
TRAIN_SEED, EVAL_SEED = 4000, 5007
DRAW = 0  # set by build()
_seed = ZM._seed


def cal_seed():
    return 31 + 101 * DRAW


def _cached(name, train):
    """The zoo's cache, in its folder ``hunt9``."""
    return ZM._cached(os.path.join("hunt9", name), train)


def _path(name, ext, folder="hunt9"):
    path = os.path.join(ZM.cache_dir(), folder, name + ext)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


def _cached_weights(name, make, train, folder="hunt9"):
    """``make()`` with the weights ``train(model)`` gave it, cached as ``.weights.h5`` (in the
    zoo cache's ``folder``)."""
    path = _path(name, ".weights.h5", folder)
    model = make()
    if os.path.exists(path):
        model.load_weights(path)
    else:
        train(model)
        tmp = path[:-len(".weights.h5")] + f".{os.getpid()}.weights.h5"
        model.save_weights(tmp)
        os.replace(tmp, path)
    return model


L = H8.L  # keras.layers, imported when a model is built


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


_lum = H8._lum


def _f32(x):
    return np.asarray(x, np.float32)


def _conv_bn(h, w, s=1, act="relu", k=3):
    Ly = L()
    h = Ly.BatchNormalization()(Ly.Conv2D(w, k, s, "same", use_bias=False)(h))
    return Ly.Activation(act)(h) if act else h


# ---- text: synthetic "topic" documents (a Zipf background vocabulary + topic words per class)

VOCAB, SEQ, TOPICS = 1000, 48, 6


def _documents(n, seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(TOPICS, size=n)
    zipf = 1.0 / np.arange(1, VOCAB - 200)
    zipf /= zipf.sum()
    x = np.zeros((n, SEQ), np.int32)
    for i in range(n):
        length = rng.integers(12, SEQ + 1)
        common = rng.choice(np.arange(200, VOCAB - 1), size=length, p=zipf)
        topic = 1 + 30 * y[i] + rng.integers(30, size=length)
        x[i, :length] = np.where(rng.random(length) < 0.25, topic, common)
    return x, y


# ---- audio: synthetic sounds as log-mel spectrograms in dB (ref = max, top_db 80)

SR, N_FFT, HOP, N_MELS, FRAMES = 8000, 256, 128, 32, 32


@functools.lru_cache(maxsize=1)
def _mel_bank():
    def mel(f):
        return 2595.0 * np.log10(1.0 + f / 700.0)

    def hz(m):
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)

    edges = hz(np.linspace(mel(0.0), mel(SR / 2), N_MELS + 2))
    freqs = np.linspace(0, SR / 2, N_FFT // 2 + 1)
    bank = np.zeros((N_MELS, freqs.size))
    for m in range(N_MELS):
        lo, c, hi = edges[m:m + 3]
        bank[m] = np.clip(np.minimum((freqs - lo) / (c - lo), (hi - freqs) / (hi - c)), 0, None)
    return bank


def _sound(rng, k, n):
    t = np.arange(n) / SR
    f0 = rng.uniform(200, 3000)
    if k == 0:
        x = np.sin(2 * np.pi * rng.uniform(150, 600) * t)
    elif k == 1:
        x = np.sin(2 * np.pi * rng.uniform(1500, 3500) * t)
    elif k == 2:
        x = np.sin(2 * np.pi * (300 * t + rng.uniform(1500, 4000) * t * t))
    elif k == 3:
        x = np.sin(2 * np.pi * (3500 * t - rng.uniform(1500, 3000) * t * t))
    elif k == 4:
        x = rng.normal(size=n)
    elif k == 5:
        x = np.cumsum(rng.normal(size=n))
        x -= np.convolve(x, np.ones(64) / 64, "same")
    elif k == 6:
        x = np.sin(2 * np.pi * f0 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(4, 12) * t))
    else:
        x = np.zeros(n)
        period = int(SR / rng.uniform(20, 60))
        x[rng.integers(period)::period] = 1.0
    x = x * rng.uniform(0.05, 1.0) + rng.normal(0, rng.uniform(1e-3, 3e-2), n)
    return x


def _logmel(n, seed):
    """``n`` log-mel spectrograms (N_MELS x FRAMES x 1) in dB, [-80, 0], and their class (8)."""
    rng = np.random.default_rng(seed)
    length = N_FFT + HOP * (FRAMES - 1)
    window = np.hanning(N_FFT)
    bank = _mel_bank()
    y = rng.integers(8, size=n)
    out = np.empty((n, N_MELS, FRAMES, 1), np.float32)
    idx = np.arange(N_FFT)[None, :] + HOP * np.arange(FRAMES)[:, None]
    for i in range(n):
        x = _sound(rng, y[i], length)
        spec = np.abs(np.fft.rfft(x[idx] * window, axis=1)) ** 2  # (frames, bins)
        mel = bank @ spec.T  # (mels, frames)
        db = 10 * np.log10(np.maximum(mel, 1e-10))
        out[i, ..., 0] = np.maximum(db - db.max(), -80.0)
    return out, y


# ---- clips: 4 frames of a 24x24 gray window moving over a scikit-image picture (5 motions)

def _clips(n, seed, size=24, frames=4, step=3):
    images = ZM._gray_images()
    rng = np.random.default_rng(seed)
    moves = np.array([(0, 0), (0, step), (0, -step), (step, 0), (-step, 0)])
    y = rng.integers(len(moves), size=n)
    out = np.empty((n, frames, size, size, 1), np.float32)
    for i in range(n):
        im = images[rng.integers(len(images))]
        dy, dx = moves[y[i]]
        top = rng.integers(4 * step, im.shape[0] - size - 4 * step)
        left = rng.integers(4 * step, im.shape[1] - size - 4 * step)
        for f in range(frames):
            t, l_ = top + dy * f, left + dx * f
            out[i, f, ..., 0] = im[t:t + size, l_:l_ + size]
    return out, y


# ---- keypoints: photo crops with three coloured 3x3 marks, a Gaussian heatmap per mark

def _marks(n, seed, size=32):
    x, _, _ = photo_crops(n, size, seed)
    x = x.astype(np.float32)
    rng = np.random.default_rng(seed + 1)
    heat = np.zeros((n, size // 2, size // 2, 3), np.float32)
    yy, xx = np.mgrid[0:size // 2, 0:size // 2]
    colours = np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255]], np.float32)
    for i in range(n):
        for c in range(3):
            cy, cx = rng.integers(2, size - 2, size=2)
            x[i, cy - 1:cy + 2, cx - 1:cx + 2] = colours[c]
            heat[i, ..., c] = np.exp(-((yy - cy / 2) ** 2 + (xx - cx / 2) ** 2) / 2.0)
    return x, heat


def _depth(gray):
    """A depth-like positive target per pixel: 20 x the local contrast (std in a 7x7 window)."""
    from scipy.ndimage import uniform_filter

    g = gray[..., 0].astype(np.float64)
    m = uniform_filter(g, (0, 7, 7))
    v = uniform_filter(g * g, (0, 7, 7)) - m * m
    return (20.0 * np.sqrt(np.maximum(v, 0)))[..., None].astype(np.float32)


# ---- tabular: sklearn's fixed sets split into train / 64 calibration / 192 held out

def _tab_split(x, *ys, n_eval=192):
    rng = np.random.default_rng(TRAIN_SEED)
    order = rng.permutation(len(x))
    ev, rest = order[:n_eval], order[n_eval:]
    rng2 = np.random.default_rng(cal_seed())
    cal = rng2.choice(rest, N_CAL, replace=False)
    # the training rows are the same for every draw (the model is cached)
    return (x[rest], x[cal], x[ev]), tuple((y[rest], y[cal], y[ev]) for y in ys)


# ------------------------------------------------------------------------------- the models


def _photo_classifier(name, backbone_fn, size=32, epochs=6, lr=2e-3, scale=None):
    """A photo-crop classifier (8 classes, 0..255 input) from ``backbone_fn(input) -> tensor``."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(size)

    def train():
        _seed(sum(map(ord, name)))
        inp = keras.Input((size, size, 3), name="rgb255")
        h = inp if scale is None else Ly.Rescaling(*scale)(inp)
        h = backbone_fn(h)
        out = Ly.Dense(8, activation="softmax", name="photo")(Ly.GlobalAveragePooling2D()(h))
        return _fit(keras.Model(inp, out, name=name), _f32(xt), yt, epochs,
                    "sparse_categorical_crossentropy", lr=lr)

    return _cached(name, train), ZooData(_f32(xc), _f32(xe), ("class",), "")


def effnet_b0():
    """keras.applications.EfficientNetB0(weights=None, include_top=False) at 32 px (its own
    Rescaling + Normalization inside on 0..255, swish, squeeze-excite, BN), GAP, 8 classes."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(32)

    def train():
        _seed(901)
        base = keras.applications.EfficientNetB0(include_top=False, weights=None,
                                                 input_shape=(32, 32, 3))
        inp = keras.Input((32, 32, 3), name="rgb255")
        h = Ly.GlobalAveragePooling2D()(base(inp))
        out = Ly.Dense(8, activation="softmax", name="photo")(Ly.Dropout(0.2)(h))
        return _fit(keras.Model(inp, out, name="effnet_b0"), _f32(xt), yt, 4,
                    "sparse_categorical_crossentropy")

    return _cached("effnet_b0", train), ZooData(
        _f32(xc), _f32(xe), ("class",),
        "photo crops 32 0..255; keras.applications EfficientNetB0 weights=None (Rescaling + "
        "Normalization inside), nested; 8 classes, trained 4 epochs")


def mobilenet_v1():
    """keras.applications.MobileNet(alpha=0.25, weights=None) at 32 px (ReLU6, depthwise, BN),
    nested; Rescaling(1/127.5, -1) in front; 8 classes."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(32)

    def train():
        _seed(902)
        base = keras.applications.MobileNet(input_shape=(32, 32, 3), alpha=0.25,
                                            include_top=False, weights=None)
        inp = keras.Input((32, 32, 3), name="rgb255")
        h = Ly.Rescaling(1 / 127.5, offset=-1.0)(inp)
        h = Ly.GlobalAveragePooling2D()(base(h))
        out = Ly.Dense(8, activation="softmax", name="photo")(h)
        return _fit(keras.Model(inp, out, name="mobilenet_v1"), _f32(xt), yt, 8,
                    "sparse_categorical_crossentropy")

    return _cached("mobilenet_v1", train), ZooData(
        _f32(xc), _f32(xe), ("class",),
        "photo crops 32 0..255, Rescaling to [-1,1]; keras.applications MobileNet alpha 0.25 "
        "weights=None, nested; 8 classes")


def preact_resnet():
    """A small ResNet50V2-style pre-activation net: stem conv, then blocks BN-relu-conv(1x1)-
    BN-relu-conv(3x3)-BN-relu-conv(1x1) + shortcut (a conv on the pre-activated input where the
    shape changes), post-BN-relu before GAP; Rescaling(1/255); 8 classes."""
    Ly = L()

    def block(h, w, s):
        pre = Ly.ReLU()(Ly.BatchNormalization()(h))
        short = Ly.Conv2D(4 * w, 1, s)(pre) if (s != 1 or h.shape[-1] != 4 * w) else h
        r = Ly.Conv2D(w, 1, use_bias=False)(pre)
        r = Ly.Conv2D(w, 3, s, "same", use_bias=False)(Ly.ReLU()(Ly.BatchNormalization()(r)))
        r = Ly.Conv2D(4 * w, 1)(Ly.ReLU()(Ly.BatchNormalization()(r)))
        return Ly.Add()([short, r])

    def backbone(h):
        h = Ly.Conv2D(16, 3, padding="same")(h)
        for w, s in ((8, 1), (8, 1), (16, 2), (16, 1), (24, 2), (24, 1)):
            h = block(h, w, s)
        return Ly.ReLU()(Ly.BatchNormalization()(h))

    model, data = _photo_classifier("preact_resnet", backbone, 32, 8, scale=(1 / 255.0,))
    data.source = "photo crops 32 0..255 Rescaling; pre-activation bottleneck ResNet (BN " \
                  "before conv), 6 blocks; 8 classes"
    return model, data


def densenet_small():
    """A small DenseNet: BN-relu-conv(1x1)-BN-relu-conv(3x3) layers concatenated (growth 8),
    transitions BN-relu-conv(1x1)-AveragePooling2D; Rescaling(1/255); 8 classes."""
    Ly = L()

    def backbone(h):
        h = Ly.Conv2D(16, 3, padding="same", use_bias=False)(h)
        for blk in range(3):
            for _ in range(3):
                n = Ly.Conv2D(32, 1, use_bias=False)(Ly.ReLU()(Ly.BatchNormalization()(h)))
                n = Ly.Conv2D(8, 3, padding="same", use_bias=False)(
                    Ly.ReLU()(Ly.BatchNormalization()(n)))
                h = Ly.Concatenate()([h, n])
            if blk < 2:
                h = Ly.Conv2D(h.shape[-1] // 2, 1, use_bias=False)(
                    Ly.ReLU()(Ly.BatchNormalization()(h)))
                h = Ly.AveragePooling2D(2)(h)
        return Ly.ReLU()(Ly.BatchNormalization()(h))

    model, data = _photo_classifier("densenet_small", backbone, 32, 8, scale=(1 / 255.0,))
    data.source = "photo crops 32 0..255 Rescaling; DenseNet concat blocks (BN-relu-conv), " \
                  "transitions with AveragePooling2D; 8 classes"
    return model, data


def text_conv1d():
    """Integer token ids (int32, 0 = padding, vocabulary 1000, length 48) -> Embedding(32) ->
    Conv1D(64, 5, relu) -> GlobalMaxPooling1D -> Dense -> 6-topic softmax."""
    import keras
    Ly = L()
    xt, yt = _documents(4000, TRAIN_SEED)

    def train():
        _seed(903)
        inp = keras.Input((SEQ,), dtype="int32", name="tokens")
        h = Ly.Embedding(VOCAB, 32)(inp)
        h = Ly.Conv1D(64, 5, activation="relu")(h)
        h = Ly.GlobalMaxPooling1D()(h)
        h = Ly.Dense(32, activation="relu")(Ly.Dropout(0.3)(h))
        out = Ly.Dense(TOPICS, activation="softmax", name="topic")(h)
        return _fit(keras.Model(inp, out, name="text_conv1d"), xt, yt, 4,
                    "sparse_categorical_crossentropy")

    return _cached("text_conv1d", train), ZooData(
        _documents(N_CAL, cal_seed())[0], _documents(N_EVAL, EVAL_SEED)[0], ("class",),
        "synthetic topic documents, int32 tokens (vocab 1000, len 48, 0 padding); Embedding, "
        "Conv1D, GlobalMaxPooling1D; 6 topics")


def logmel_db():
    """A log-mel spectrogram in dB (32 mels x 32 frames, values in [-80, 0], no scaling in the
    model) -> conv+BN+relu x3 (MaxPooling2D) -> GAP -> 8-class softmax (synthetic sounds)."""
    import keras
    Ly = L()
    xt, yt = _logmel(2048, TRAIN_SEED)

    def train():
        _seed(904)
        inp = keras.Input((N_MELS, FRAMES, 1), name="logmel_db")
        h = inp
        for w in (16, 32, 48):
            h = Ly.MaxPooling2D()(_conv_bn(h, w))
        out = Ly.Dense(8, activation="softmax", name="sound")(Ly.GlobalAveragePooling2D()(h))
        return _fit(keras.Model(inp, out, name="logmel_db"), xt, yt, 8,
                    "sparse_categorical_crossentropy")

    return _cached("logmel_db", train), ZooData(
        _logmel(N_CAL, cal_seed())[0], _logmel(N_EVAL, EVAL_SEED)[0], ("class",),
        "synthetic sounds as log-mel dB [-80, 0] 32x32, raw; conv+BN; 8 classes")


def crnn_norm():
    """CRNN without an RNN on the log-mel dB input: an adapted Normalization (one mean/var),
    conv+BN+relu, Permute to (frames, mels, ch), Reshape to (frames, mels*ch), Conv1D+BN+relu,
    GlobalAveragePooling1D, 8-class softmax."""
    import keras
    Ly = L()
    xt, yt = _logmel(2048, TRAIN_SEED)

    def train():
        _seed(905)
        norm = Ly.Normalization(axis=None)
        norm.adapt(xt)
        inp = keras.Input((N_MELS, FRAMES, 1), name="logmel_db")
        h = norm(inp)
        h = Ly.MaxPooling2D((2, 1))(_conv_bn(h, 16))
        h = Ly.MaxPooling2D((2, 1))(_conv_bn(h, 24))  # (8, 32, 24)
        h = Ly.Permute((2, 1, 3))(h)  # (frames 32, mels 8, 24)
        h = Ly.Reshape((FRAMES, 8 * 24))(h)
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv1D(64, 3, padding="same",
                                                         use_bias=False)(h)))
        out = Ly.Dense(8, activation="softmax", name="sound")(Ly.GlobalAveragePooling1D()(h))
        return _fit(keras.Model(inp, out, name="crnn_norm"), xt, yt, 8,
                    "sparse_categorical_crossentropy")

    return _cached("crnn_norm", train), ZooData(
        _logmel(N_CAL, cal_seed())[0], _logmel(N_EVAL, EVAL_SEED)[0], ("class",),
        "log-mel dB; adapted Normalization, conv+BN, Permute, Reshape, Conv1D+BN; 8 classes")


def depth_relu():
    """Per-pixel regression with a ReLU output (unbounded positive, depth-like: 20 x the local
    contrast, ~0-4): gray crops 32 in [0, 1], conv+BN encoder (stride 2), UpSampling2D,
    Conv2D(1, relu)."""
    import keras
    Ly = L()
    xt, xc, xe = gray_sets(32)

    def train():
        _seed(906)
        inp = keras.Input((32, 32, 1), name="gray")
        a = _conv_bn(inp, 16)
        h = _conv_bn(a, 32, 2)
        h = _conv_bn(h, 32)
        h = Ly.UpSampling2D()(h)
        h = _conv_bn(Ly.Concatenate()([h, a]), 16)
        out = Ly.Conv2D(1, 3, padding="same", activation="relu", name="depth")(h)
        return _fit(keras.Model(inp, out, name="depth_relu"), xt, _depth(xt), 10, "mse")

    return _cached("depth_relu", train), ZooData(
        xc, xe, ("value",), "gray crops 32 [0,1]; conv+BN, skip concat; per-pixel Conv2D(1, "
        "relu) regression of 20 x local contrast")


def keypoint_heatmaps():
    """Three keypoint heatmaps (16x16x3, per-pixel sigmoid, Gaussian targets, mostly ~0) of
    coloured marks pasted on photo crops 32 0..255 (Rescaling inside); conv+BN, stride 2."""
    import keras
    Ly = L()
    xt, ht = _marks(1536, TRAIN_SEED)

    def train():
        _seed(907)
        inp = keras.Input((32, 32, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        h = _conv_bn(h, 16)
        h = _conv_bn(h, 32, 2)
        h = _conv_bn(h, 32)
        h = _conv_bn(h, 32)
        out = Ly.Conv2D(3, 1, activation="sigmoid", name="heatmaps")(h)
        return _fit(keras.Model(inp, out, name="keypoint_heatmaps"), xt, ht, 12,
                    "binary_crossentropy")

    return _cached("keypoint_heatmaps", train), ZooData(
        _marks(N_CAL, cal_seed())[0], _marks(N_EVAL, EVAL_SEED)[0], ("value",),
        "photo crops 32 0..255 with 3 coloured marks; conv+BN; 16x16x3 sigmoid heatmaps")


def _attrs(x, box):
    lum = _lum(x)
    xf = x.astype(np.float64)
    return np.stack([lum.mean((1, 2)) > 110, xf[..., 0].mean((1, 2)) > xf[..., 2].mean((1, 2)),
                     lum.std((1, 2)) > 50, box[:, 3] > box[:, 2]], 1).astype(np.float32)


def multitask_dict():
    """Dict outputs of three kinds from one conv+BN backbone: {"photo": 8-class softmax,
    "attrs": 4 sigmoids (bright, red>blue, contrasty, wide crop), "box": 4 linear (where the
    crop lies)}; photo crops 40 0..255, Rescaling inside."""
    import keras
    Ly = L()
    (xt, yt, bt), (xc, _, _), (xe, _, _) = photo_sets(40)

    def train():
        _seed(908)
        inp = keras.Input((40, 40, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        for w in (16, 32, 48, 64):
            h = _conv_bn(h, w, 2)
        h = Ly.GlobalAveragePooling2D()(h)
        h = Ly.Dense(64, activation="relu")(h)
        outs = {"photo": Ly.Dense(8, activation="softmax", name="photo")(h),
                "attrs": Ly.Dense(4, activation="sigmoid", name="attrs")(h),
                "box": Ly.Dense(4, name="box")(h)}
        model = keras.Model(inp, outs, name="multitask_dict")
        model.compile(optimizer=keras.optimizers.Adam(2e-3), loss={
            "photo": "sparse_categorical_crossentropy", "attrs": "binary_crossentropy",
            "box": "mse"})
        model.fit(_f32(xt), {"photo": yt, "attrs": _attrs(xt, bt), "box": bt}, epochs=10,
                  batch_size=32, verbose=0)
        return _settle_bn(model, _f32(xt))

    kinds = tuple(keras.tree.flatten({"photo": "class", "attrs": "value", "box": "value"}))
    return _cached("multitask_dict", train), ZooData(
        _f32(xc), _f32(xe), kinds, "photo crops 40 0..255; dict outputs photo softmax 8, "
        "attrs 4 sigmoids, box 4 linear")


def acts_a():
    """conv+BN then LeakyReLU(0.1), ELU, SELU, softplus (one per stage), GAP, 8 classes; photo
    crops 32 0..255, Rescaling inside."""
    Ly = L()

    def backbone(h):
        h = Ly.LeakyReLU(negative_slope=0.1)(_conv_bn(h, 16, 2, None))
        h = Ly.ELU()(_conv_bn(h, 32, 1, None))
        h = _conv_bn(h, 32, 2, "selu")
        return _conv_bn(h, 48, 1, "softplus")

    model, data = _photo_classifier("acts_a", backbone, 32, 8, scale=(1 / 255.0,))
    data.source = "photo crops 32 0..255 Rescaling; conv+BN with LeakyReLU, ELU, SELU, " \
                  "softplus; 8 classes"
    return model, data


def acts_b():
    """conv+BN then hard_sigmoid (as a gate: x * hard_sigmoid(x) by Multiply), hard_silu, mish,
    gelu (one per stage), GAP, 8 classes; photo crops 32 0..255, Rescaling inside."""
    Ly = L()

    def backbone(h):
        h = _conv_bn(h, 16, 2, None)
        h = Ly.Multiply()([h, Ly.Activation("hard_sigmoid")(h)])
        h = _conv_bn(h, 32, 1, "hard_silu")
        h = _conv_bn(h, 32, 2, "mish")
        return _conv_bn(h, 48, 1, "gelu")

    model, data = _photo_classifier("acts_b", backbone, 32, 8, scale=(1 / 255.0,))
    data.source = "photo crops 32 0..255 Rescaling; conv+BN with hard_sigmoid gate, " \
                  "hard_silu, mish, gelu; 8 classes"
    return model, data


def merges_res():
    """Residual blocks joined by Multiply (a sigmoid gate branch), Subtract, Average, Maximum,
    Minimum (one each, conv+BN branches), GAP, 8 classes; photo crops 32 0..255."""
    Ly = L()

    def backbone(h):
        h = _conv_bn(h, 24, 2)
        gate = _conv_bn(h, 24, 1, "sigmoid")
        h = Ly.Multiply()([h, gate])
        h = Ly.ReLU()(Ly.Subtract()([h, _conv_bn(h, 24, 1, None)]))
        h = Ly.Average()([h, _conv_bn(h, 24)])
        h = _conv_bn(h, 32, 2)
        h = Ly.Maximum()([h, _conv_bn(h, 32, 1, None)])
        return Ly.Minimum()([h, _conv_bn(h, 32)])

    model, data = _photo_classifier("merges_res", backbone, 32, 8, scale=(1 / 255.0,))
    data.source = "photo crops 32 0..255 Rescaling; Multiply gate, Subtract, Average, " \
                  "Maximum, Minimum merges; 8 classes"
    return model, data


def bn_variants():
    """BN(center=False) after a conv, BN(scale=False) after a conv, Conv2D(use_bias=True) + BN,
    Conv2D(activation="relu") followed by BN (BN after the activation, cannot fold backward),
    GAP, 8 classes; photo crops 32 0..255."""
    Ly = L()

    def backbone(h):
        h = Ly.ReLU()(Ly.BatchNormalization(center=False)(
            Ly.Conv2D(16, 3, 2, "same", use_bias=False)(h)))
        h = Ly.ReLU()(Ly.BatchNormalization(scale=False)(Ly.Conv2D(24, 3, 1, "same")(h)))
        h = Ly.BatchNormalization()(Ly.Conv2D(32, 3, 2, "same", activation="relu")(h))
        h = Ly.Activation("relu")(Ly.BatchNormalization()(Ly.Conv2D(48, 3, 1, "same")(h)))
        return h

    model, data = _photo_classifier("bn_variants", backbone, 32, 8, scale=(1 / 255.0,))
    data.source = "photo crops 32 0..255 Rescaling; BN center=False, scale=False, conv bias " \
                  "+ BN, Conv2D(activation=relu) then BN; 8 classes"
    return model, data


def permute_bn_axis1():
    """channels-last convs, Permute((3, 1, 2)) to channels-first, BatchNormalization(axis=1),
    Permute back, ReLU; BN right after a Permute; 8 classes; photo crops 32 0..255."""
    Ly = L()

    def backbone(h):
        h = Ly.Conv2D(24, 3, 2, "same", use_bias=False)(h)
        h = Ly.Permute((3, 1, 2))(h)
        h = Ly.BatchNormalization(axis=1)(h)
        h = Ly.ReLU()(Ly.Permute((2, 3, 1))(h))
        h = _conv_bn(h, 32, 2)
        return _conv_bn(h, 48)

    model, data = _photo_classifier("permute_bn_axis1", backbone, 32, 8, scale=(1 / 255.0,))
    data.source = "photo crops 32 0..255 Rescaling; Conv, Permute to NCHW, BN(axis=1), Permute " \
                  "back; 8 classes"
    return model, data


def tab_bn_input():
    """BatchNormalization right after the Input on raw breast-cancer features (scales 1e-3 to
    4e3), Dense+BN+relu x2, Dense(1, sigmoid) (malignant or not); no conv."""
    import keras
    from sklearn.datasets import load_breast_cancer
    Ly = L()
    x, y = load_breast_cancer(return_X_y=True)
    (xt, xc, xe), ((yt, _, _),) = _tab_split(x.astype(np.float32), y.astype(np.float32))

    def train():
        _seed(909)
        inp = keras.Input((30,), name="features")
        h = Ly.BatchNormalization()(inp)
        for w in (32, 16):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Dense(w, use_bias=False)(h)))
        out = Ly.Dense(1, activation="sigmoid", name="malignant")(h)
        return _fit(keras.Model(inp, out, name="tab_bn_input"), xt, yt, 60,
                    "binary_crossentropy", batch_size=16)

    return _cached("tab_bn_input", train), ZooData(
        xc, xe, ("value",), "sklearn breast_cancer raw (192 held out); BN on the Input, "
        "Dense+BN; one sigmoid")


def tab_bn_reg():
    """Diabetes regression (sklearn, raw targets 25-346): Dense(64)+BN+relu, Dense(32)+BN+relu,
    Dense(1) linear; no conv, no input scaling (features are already ~0.05)."""
    import keras
    from sklearn.datasets import load_diabetes
    Ly = L()
    x, y = load_diabetes(return_X_y=True)
    (xt, xc, xe), ((yt, _, _),) = _tab_split(x.astype(np.float32), y.astype(np.float32),
                                             n_eval=150)

    def train():
        _seed(910)
        inp = keras.Input((10,), name="features")
        h = inp
        for w in (64, 32):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Dense(w)(h)))
        dense = Ly.Dense(1, name="progression")
        out = dense(h)
        model = keras.Model(inp, out, name="tab_bn_reg")
        dense.bias.assign([float(yt.mean())])
        return _fit(model, xt, yt, 150, "mse", batch_size=16, lr=5e-3)

    return _cached("tab_bn_reg", train), ZooData(
        xc, xe, ("value",), "sklearn diabetes raw features (~0.05), target 25-346 (150 held "
        "out); Dense+BN; linear output")


def td_conv_clips():
    """TimeDistributed(Conv2D) + TimeDistributed(BN) on 4-frame 24x24 gray clips,
    TimeDistributed(GAP), Conv1D over time, GlobalAveragePooling1D; 5 motion classes."""
    import keras
    Ly = L()
    xt, yt = _clips(2048, TRAIN_SEED, step=6)
    TD = Ly.TimeDistributed

    def train():
        _seed(911)
        inp = keras.Input((4, 24, 24, 1), name="clip")
        h = inp
        for w, s in ((16, 2), (24, 2), (32, 2)):
            h = TD(Ly.Conv2D(w, 3, s, "same", use_bias=False))(h)
            h = Ly.ReLU()(TD(Ly.BatchNormalization())(h))
        h = TD(Ly.Flatten())(h)  # the position matters for motion
        h = Ly.Conv1D(32, 2, activation="relu")(h)
        out = Ly.Dense(5, activation="softmax", name="motion")(Ly.GlobalAveragePooling1D()(h))
        return _fit(keras.Model(inp, out, name="td_conv_clips"), xt, yt, 15,
                    "sparse_categorical_crossentropy", lr=1e-3)

    return _cached("td_conv_clips", train), ZooData(
        _clips(N_CAL, cal_seed(), step=6)[0], _clips(N_EVAL, EVAL_SEED, step=6)[0], ("class",),
        "4-frame gray clips 24 [0,1] (6 px steps); TimeDistributed(Conv2D, BN, Flatten), Conv1D; "
        "5 motions")


def conv3d_clips():
    """Conv3D + BN on the same 4-frame clips (kernel 3x3x3 then 2x3x3), GlobalAveragePooling3D
    after a Flatten-free head; 5 motion classes."""
    import keras
    Ly = L()
    xt, yt = _clips(2048, TRAIN_SEED)

    def train():
        _seed(912)
        inp = keras.Input((4, 24, 24, 1), name="clip")
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv3D(16, 3, (1, 2, 2), "same",
                                                        use_bias=False)(inp)))
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv3D(24, 3, (1, 2, 2), "same",
                                                        use_bias=False)(h)))
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv3D(32, (4, 1, 1), use_bias=False)(h)))
        out = Ly.Dense(5, activation="softmax", name="motion")(Ly.GlobalAveragePooling3D()(h))
        return _fit(keras.Model(inp, out, name="conv3d_clips"), xt, yt, 10,
                    "sparse_categorical_crossentropy")

    return _cached("conv3d_clips", train), ZooData(
        _clips(N_CAL, cal_seed())[0], _clips(N_EVAL, EVAL_SEED)[0], ("class",),
        "4-frame gray clips 24 [0,1]; Conv3D + BN; 5 motions")


def convnext_small():
    """ConvNeXt-like: patchify stem Conv2D(4, stride 4) + LayerNorm, two blocks of
    DepthwiseConv2D 7x7, LayerNormalization, Dense(4x) + GELU, Dense (no layer scale), residual
    Add; LayerNorm, GAP, 8 classes; photo crops 32 0..255; no BN."""
    Ly = L()

    def backbone(h):
        h = Ly.LayerNormalization(epsilon=1e-6)(Ly.Conv2D(48, 4, 4)(h))
        for _ in range(2):
            r = Ly.DepthwiseConv2D(7, padding="same")(h)
            r = Ly.LayerNormalization(epsilon=1e-6)(r)
            r = Ly.Dense(48)(Ly.Activation("gelu")(Ly.Dense(192)(r)))
            h = Ly.Add()([h, r])
        return Ly.LayerNormalization(epsilon=1e-6)(h)

    model, data = _photo_classifier("convnext_small", backbone, 32, 8, lr=1e-3,
                                    scale=(1 / 255.0,))
    data.source = "photo crops 32 0..255 Rescaling; ConvNeXt-like (depthwise 7x7, LayerNorm, " \
                  "pointwise Dense + GELU), no BN; 8 classes"
    return model, data


def mixed_f16():
    """Trained under keras.mixed_precision policy "mixed_float16" (float16 compute, float32
    variables; the softmax in float32 as the guide says); conv+BN+relu x3, GAP, 8 classes;
    photo crops 32 0..255, Rescaling inside. The policy is set back to float32 after."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(32)

    def train():
        _seed(913)
        keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            inp = keras.Input((32, 32, 3), name="rgb255")
            h = Ly.Rescaling(1 / 255.0)(inp)
            for w in (16, 32, 48):
                h = _conv_bn(h, w, 2)
            h = Ly.Dense(8, name="logits")(Ly.GlobalAveragePooling2D()(h))
            out = Ly.Activation("softmax", dtype="float32", name="photo")(h)
            return _fit(keras.Model(inp, out, name="mixed_f16"), _f32(xt), yt, 8,
                        "sparse_categorical_crossentropy")
        finally:
            keras.mixed_precision.set_global_policy("float32")

    return _cached("mixed_f16", train), ZooData(
        _f32(xc), _f32(xe), ("class",), "photo crops 32 0..255; mixed_float16 policy "
        "(float16 compute); conv+BN; 8 classes")


def float64_model():
    """Every layer dtype "float64" (keras.config.set_floatx("float64") and
    set_dtype_policy("float64") while building and training; set_floatx alone gives a float64
    Input only), conv+BN+relu x3, GAP, 8 classes; photo crops 32 0..255, Rescaling inside; the
    calibration and held-out inputs are float64 arrays."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(32)

    def train():
        _seed(914)
        keras.config.set_floatx("float64")
        keras.config.set_dtype_policy("float64")
        try:
            inp = keras.Input((32, 32, 3), name="rgb255")
            h = Ly.Rescaling(1 / 255.0)(inp)
            for w in (16, 32, 48):
                h = _conv_bn(h, w, 2)
            out = Ly.Dense(8, activation="softmax", name="photo")(
                Ly.GlobalAveragePooling2D()(h))
            return _fit(keras.Model(inp, out, name="float64_model"), xt.astype(np.float64),
                        yt, 8, "sparse_categorical_crossentropy")
        finally:
            keras.config.set_floatx("float32")
            keras.config.set_dtype_policy("float32")

    return _cached("float64_model", train), ZooData(
        xc.astype(np.float64), xe.astype(np.float64), ("class",),
        "photo crops 32 0..255 float64; float64 layers; conv+BN; 8 classes")


def _subclassed_cls():
    import keras

    if "Net" in _SUB:
        return _SUB["Net"]
    Ly = L()

    class SubNet(keras.Model):
        """A subclassed model: layers in __init__, the graph in call()."""

        def __init__(self):
            super().__init__(name="subclassed")
            self.rescale = Ly.Rescaling(1 / 255.0)
            self.convs = [Ly.Conv2D(w, 3, 2, "same", use_bias=False) for w in (16, 32, 48)]
            self.bns = [Ly.BatchNormalization() for _ in range(3)]
            self.pool = Ly.GlobalAveragePooling2D()
            self.head = Ly.Dense(8, activation="softmax")

        def call(self, x, training=False):
            h = self.rescale(x)
            for c, b in zip(self.convs, self.bns):
                h = keras.ops.relu(b(c(h), training=training))
            return self.head(self.pool(h))

    _SUB["Net"] = SubNet
    return SubNet


_SUB: dict = {}


def subclassed():
    """A subclassed keras.Model (layers in __init__, graph in call, conv+BN+relu x3, GAP,
    8 classes), built by calling it; weights only (``.weights.h5``), rebuilt in code."""
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(32)

    def make():
        net = _subclassed_cls()()
        net(_f32(xc[:2]))
        return net

    def train(model):
        _seed(915)
        _fit(model, _f32(xt), yt, 8, "sparse_categorical_crossentropy")

    return _cached_weights("subclassed", make, train), ZooData(
        _f32(xc), _f32(xe), ("class",), "photo crops 32 0..255; subclassed keras.Model")


MODELS = {f.__name__: f for f in [
    effnet_b0, mobilenet_v1, preact_resnet, densenet_small, text_conv1d, logmel_db, crnn_norm,
    depth_relu, keypoint_heatmaps, multitask_dict, acts_a, acts_b, merges_res, bn_variants,
    permute_bn_axis1, tab_bn_input, tab_bn_reg, td_conv_clips, conv3d_clips, convnext_small,
    mixed_f16, float64_model, subclassed]}


# ----------------------------------------- extra: raw grid head, exponential output, text attention


def _squares(n, seed, size=32, grid=4):
    """Photo crops with one coloured square (side 4-16 px, one of 3 colours) pasted, and a
    YOLO-like raw target per grid cell: [objectness logit +-4, centre offsets in the cell
    (0..1) y and x, height and width in pixels (4..16), 3 class logits (4 for the colour)]."""
    x, _, _ = photo_crops(n, size, seed)
    x = x.astype(np.float32)
    rng = np.random.default_rng(seed + 2)
    cell = size // grid
    t = np.zeros((n, grid, grid, 8), np.float32)
    t[..., 0] = -4.0
    colours = np.array([[255, 0, 0], [0, 255, 0], [255, 255, 0]], np.float32)
    for i in range(n):
        h, w = rng.integers(4, 17, size=2)
        top, left = rng.integers(0, size - h + 1), rng.integers(0, size - w + 1)
        k = rng.integers(3)
        x[i, top:top + h, left:left + w] = colours[k]
        cy, cx = top + h / 2, left + w / 2
        gy, gx = min(int(cy // cell), grid - 1), min(int(cx // cell), grid - 1)
        t[i, gy, gx] = [4.0, cy / cell - gy, cx / cell - gx, h, w, 0, 0, 0]
        t[i, gy, gx, 5 + k] = 4.0
    return x, t


def grid_head_raw():
    """A YOLO-like raw detection head: one linear output (4x4 grid x 8 channels) mixing scales
    (objectness logit +-4, offsets 0..1, sizes 4..16 px, class logits); photo crops 32 0..255
    with a coloured square, Rescaling inside, conv+BN stride 2 x3."""
    import keras
    Ly = L()
    xt, tt = _squares(2048, TRAIN_SEED)

    def train():
        _seed(916)
        inp = keras.Input((32, 32, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        for w in (16, 32, 48):
            h = _conv_bn(h, w, 2)
        h = _conv_bn(h, 48)
        out = Ly.Conv2D(8, 1, name="grid")(h)
        return _fit(keras.Model(inp, out, name="grid_head_raw"), xt, tt, 15, "mse")

    return _cached("grid_head_raw", train), ZooData(
        _squares(N_CAL, cal_seed())[0], _squares(N_EVAL, EVAL_SEED)[0], ("value",),
        "photo crops 32 0..255 + a coloured square; conv+BN; raw 4x4x8 grid head (logits, "
        "offsets 0..1, sizes in px) in one linear output")


def _bright_count(gray):
    return (gray[..., 0] > 0.75).sum((1, 2))[:, None].astype(np.float32) / 4.0


def poisson_exp():
    """A count regression with Activation("exponential") on the output (trained with the
    Poisson loss): a quarter of the pixels brighter than 0.75 in a gray crop 32 [0, 1] (0 to
    ~256, many zeros, heavy tail); conv+BN, GAP, Dense(1, exponential)."""
    import keras
    Ly = L()
    xt, xc, xe = gray_sets(32)

    def train():
        _seed(917)
        inp = keras.Input((32, 32, 1), name="gray")
        h = inp
        for w in (16, 32, 48):
            h = _conv_bn(h, w, 2)
        h = Ly.Dense(32, activation="relu")(Ly.GlobalAveragePooling2D()(h))
        out = Ly.Dense(1, activation="exponential", name="count")(h)
        return _fit(keras.Model(inp, out, name="poisson_exp"), xt, _bright_count(xt), 15,
                    "poisson")

    return _cached("poisson_exp", train), ZooData(
        xc, xe, ("value",), "gray crops 32 [0,1]; conv+BN, GAP; Dense(1, exponential) count "
        "regression (Poisson loss), 0..~256")


def text_attention():
    """Integer tokens -> Embedding + a learned position embedding (hunt8's custom
    PositionEmbedding) -> MultiHeadAttention (2 heads) + LayerNorm + Dense FFN (relu) +
    LayerNorm -> GlobalAveragePooling1D -> 6-topic softmax; no BN."""
    import keras
    Ly = L()
    H8._custom_layers()
    xt, yt = _documents(4000, TRAIN_SEED)

    def train():
        _seed(918)
        inp = keras.Input((SEQ,), dtype="int32", name="tokens")
        h = H8._CUSTOM["PositionEmbedding"]()(Ly.Embedding(VOCAB, 32)(inp))
        a = Ly.MultiHeadAttention(2, 16)(h, h)
        h = Ly.LayerNormalization()(Ly.Add()([h, a]))
        f = Ly.Dense(32)(Ly.Dense(64, activation="relu")(h))
        h = Ly.LayerNormalization()(Ly.Add()([h, f]))
        out = Ly.Dense(TOPICS, activation="softmax", name="topic")(
            Ly.GlobalAveragePooling1D()(h))
        return _fit(keras.Model(inp, out, name="text_attention"), xt, yt, 4,
                    "sparse_categorical_crossentropy", lr=1e-3)

    return _cached("text_attention", train), ZooData(
        _documents(N_CAL, cal_seed())[0], _documents(N_EVAL, EVAL_SEED)[0], ("class",),
        "synthetic topic documents, int32 tokens; Embedding + position embedding (custom), "
        "MultiHeadAttention, LayerNorm; 6 topics")


MODELS.update({f.__name__: f for f in [grid_head_raw, poisson_exp, text_attention]})


def build(name):
    global DRAW
    base, _, draw = name.partition("@")
    DRAW = int(draw or 0)
    return MODELS[base]()
