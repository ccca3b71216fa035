"""hunt13: models built to hunt for cle's failures on kinds neither the zoo (zoo_models.py) nor
hunt7-12 tried, with zoo_models' interface, for ``bench_zoo.py --zoo hunt13_models``::

    nice -n 10 .venv/bin/python benchmarks/bench_zoo.py --zoo hunt13_models \
        --models shufflenet_like softargmax_kp --json /tmp/h13/h13.jsonl

``build(name) -> (model, ZooData)``; a name "base@k" (k = 1, 2, ...) is the same model with
another draw of 64 calibration inputs (hunt9's :func:`hunt9_models.cal_seed`; the held-out
inputs, 1000 generated ones, are the same). The data helpers are hunt9's and hunt12's (photo
crops, labelled gray crops, synthetic sounds, per-pixel classes) plus new synthetic IMU
recordings and segment-wise tone sequences; trained models are cached beside the zoo's
(:func:`zoo_models.cache_dir`, ``hunt13/``), keyed by the model's name only; the model with a
Lambda keeps its weights only (``.weights.h5``) and is rebuilt in code. Written fast: what a new
user might train in a minute, not tuned.

Kinds: a ShuffleNet-v1-like net (grouped 1x1 Conv2D(groups=4) + BN, channel shuffle by
Reshape/Permute/Reshape, depthwise stride-2 + BN, Concatenate with AveragePooling2D shortcut,
Add units); a ConvMixer (patchify Conv2D 4x4 stride 4, GELU THEN BN everywhere, depthwise 5x5
residual, pointwise); CBAM attention (channel attention: GAP and GMP through one shared Dense
MLP, Add, sigmoid, Multiply; spatial attention: Lambda of channel mean / max, Concatenate,
Conv2D 7x7 sigmoid, Multiply); keypoint coordinates by a spatial soft-argmax (Reshape to
(H*W, K), Softmax(axis=1), Permute, a frozen Dense of pixel coordinates: a linear output in
pixels 0..31); an FPN-like two-level head (lateral 1x1 convs, UpSampling2D + Add, per-level
heads Reshape'd to anchors and Concatenated, per-anchor softmax over 80 cells); a 6-axis IMU
activity classifier (accelerometer +-20 m/s^2 and gyroscope +-2 rad/s channels of one input,
Normalization adapted inside, Conv1D + BN); a log_softmax output (Activation("log_softmax"),
values in (-inf, 0]); bilinear (Gram) pooling with keras.layers.Dot on gray texture crops; a
per-timestep softmax sequence tagger (dilated Conv1D + BN, (128, 4) output); an ensemble of
three separately trained photo classifiers (conv+BN relu, SeparableConv2D+BN swish, no-BN
tanh) averaged by keras.layers.Average; factorized asymmetric kernels (1x7, 7x1) with strides
(2, 1) on log-mel spectrograms in dB.
"""
from __future__ import annotations

import numpy as np

import hunts  # what the hunts after hunt9 share
import zoo_models as ZM  # the repository's zoo: data helpers, ZooData
import hunt9_models as H9  # hunt9's data helpers and its draw of calibration inputs
import hunt8_models as H8  # hunt8's labelled gray crops
import hunt12_models as H12  # hunt12's per-pixel classes

ZooData = ZM.ZooData
Missing = ZM.Missing
_fit, _seed, _settle_bn = ZM._fit, ZM._seed, ZM._settle_bn
photo_sets, _conv_bn, _f32, L = H9.photo_sets, H9._conv_bn, H9._f32, H9.L
N_CAL, N_EVAL = H9.N_CAL, H9.N_EVAL
DRAW = 0  # set by build() (here and in hunt9_models / hunt8_models, whose cal_seed() is read)
_cached, _cached_weights = hunts.caches("hunt13")


def _photo_cls(name, seed, body, epochs=8, lr=2e-3, out_act="softmax", loss=None):
    """A photo classifier (crops 32 0..255, Rescaling(1/255) inside, 8 classes):
    ``body(h) -> features`` (GAP if 4-D), Dense(8, out_act)."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(32)

    def train():
        _seed(seed)
        inp = keras.Input((32, 32, 3), name="rgb255")
        h = body(Ly.Rescaling(1 / 255.0)(inp))
        if len(h.shape) == 4:
            h = Ly.GlobalAveragePooling2D()(h)
        out = Ly.Dense(8, activation=out_act, name="photo")(h)
        return _fit(keras.Model(inp, out, name=name), _f32(xt), yt, epochs,
                    loss or "sparse_categorical_crossentropy", lr=lr)

    return _cached(name, train), ZooData(_f32(xc), _f32(xe), ("class",), "")


# ------------------------------------------------------------------------------- the models


def shufflenet_like():
    """ShuffleNet v1-like: conv+BN stem stride 2; units of grouped 1x1 Conv2D(groups=4) + BN +
    relu, channel shuffle (Reshape (h, w, 4, c/4), Permute((1, 2, 4, 3)), Reshape), depthwise
    3x3 + BN (no activation), grouped 1x1 + BN; stride-2 units Concatenate an AveragePooling2D(3,
    2) shortcut, stride-1 units Add the input; relu; 8 photo classes."""
    Ly = L()

    def unit(h, out_w, s):
        c_in = h.shape[-1]
        mid = 32
        w = out_w - c_in if s == 2 else out_w
        a = Ly.Conv2D(mid, 1, groups=4, use_bias=False)(h)
        a = Ly.ReLU()(Ly.BatchNormalization()(a))
        hh, ww = a.shape[1], a.shape[2]
        a = Ly.Reshape((hh, ww, 4, mid // 4))(a)
        a = Ly.Reshape((hh, ww, mid))(Ly.Permute((1, 2, 4, 3))(a))
        a = Ly.BatchNormalization()(Ly.DepthwiseConv2D(3, s, "same", use_bias=False)(a))
        a = Ly.BatchNormalization()(Ly.Conv2D(w, 1, groups=4, use_bias=False)(a))
        if s == 2:
            return Ly.ReLU()(Ly.Concatenate()([Ly.AveragePooling2D(3, 2, "same")(h), a]))
        return Ly.ReLU()(Ly.Add()([h, a]))

    def body(h):
        h = _conv_bn(h, 24, 2)  # 16 x 16
        h = unit(h, 48, 2)  # 8 x 8
        h = unit(h, 48, 1)
        h = unit(h, 96, 2)  # 4 x 4
        return unit(h, 96, 1)

    model, d = _photo_cls("shufflenet_like", 1301, body)
    d.source = ("photo crops 32 0..255; ShuffleNet-like: groups=4 1x1 conv + BN, channel "
                "shuffle by Reshape/Permute, depthwise + BN, AvgPool Concatenate; 8 classes")
    return model, d


def convmixer():
    """ConvMixer: patchify Conv2D(64, 4, strides 4) -> GELU -> BN; 3 blocks of [depthwise 5x5
    -> GELU -> BN, Add residual] then Conv2D 1x1 -> GELU -> BN (BN AFTER each activation); GAP;
    8 photo classes."""
    Ly = L()

    def gb(h):
        return Ly.BatchNormalization()(Ly.Activation("gelu")(h))

    def body(h):
        h = gb(Ly.Conv2D(64, 4, 4)(h))  # 8 x 8
        for _ in range(3):
            h = Ly.Add()([h, gb(Ly.DepthwiseConv2D(5, padding="same")(h))])
            h = gb(Ly.Conv2D(64, 1)(h))
        return h

    model, d = _photo_cls("convmixer", 1302, body)
    d.source = ("photo crops 32 0..255; ConvMixer: patch conv, GELU then BN, depthwise "
                "residual; 8 classes")
    return model, d


def cbam_attn():
    """A conv+BN net with CBAM after each of its 3 stages: channel attention (GAP and GMP of
    the features through ONE shared Dense(c/4, relu) -> Dense(c) MLP, Add, sigmoid, Multiply)
    and spatial attention (Lambda of keras.ops.mean and keras.ops.max over channels,
    Concatenate, Conv2D(1, 7, sigmoid), Multiply); 8 photo classes. Weights cached, rebuilt
    in code (a Lambda)."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(32)

    def cbam(h):
        c = h.shape[-1]
        d1, d2 = Ly.Dense(c // 4, activation="relu"), Ly.Dense(c)
        a = Ly.Add()([d2(d1(Ly.GlobalAveragePooling2D()(h))),
                      d2(d1(Ly.GlobalMaxPooling2D()(h)))])
        a = Ly.Reshape((1, 1, c))(Ly.Activation("sigmoid")(a))
        h = Ly.Multiply()([h, a])
        mean = Ly.Lambda(lambda t: keras.ops.mean(t, axis=-1, keepdims=True))(h)
        mx = Ly.Lambda(lambda t: keras.ops.max(t, axis=-1, keepdims=True))(h)
        s = Ly.Conv2D(1, 7, padding="same", activation="sigmoid")(Ly.Concatenate()([mean, mx]))
        return Ly.Multiply()([h, s])

    def make():
        _seed(1303)
        inp = keras.Input((32, 32, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        for w in (16, 32, 48):
            h = cbam(_conv_bn(h, w, 2))
        out = Ly.Dense(8, activation="softmax", name="photo")(Ly.GlobalAveragePooling2D()(h))
        return keras.Model(inp, out, name="cbam_attn")

    def train(model):
        _fit(model, _f32(xt), yt, 8, "sparse_categorical_crossentropy")

    return _cached_weights("cbam_attn", make, train), ZooData(
        _f32(xc), _f32(xe), ("class",), "photo crops 32 0..255; CBAM: shared-MLP channel "
        "attention (GAP+GMP), Lambda channel mean/max spatial attention; 8 classes")


# ---- keypoints as coordinates: hunt9's photo crops with three coloured 3x3 marks

def _marks_xy(n, seed, size=32):
    """hunt9's marked crops (same draws as :func:`hunt9_models._marks`) and each mark's pixel
    coordinates (n, 3, 2) as (y, x)."""
    x, _, _ = H9.photo_crops(n, size, seed)
    x = x.astype(np.float32)
    rng = np.random.default_rng(seed + 1)
    xy = np.zeros((n, 3, 2), np.float32)
    colours = np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255]], np.float32)
    for i in range(n):
        for c in range(3):
            cy, cx = rng.integers(2, size - 2, size=2)
            x[i, cy - 1:cy + 2, cx - 1:cx + 2] = colours[c]
            xy[i, c] = cy, cx
    return x, xy


def softargmax_kp():
    """Keypoint coordinates by a spatial soft-argmax: Rescaling, conv+BN x4 (one stride 2: 16 x
    16), Conv2D(3, 1) heat logits, UpSampling2D(2) (32 x 32), Reshape((1024, 3)),
    Softmax(axis=1) over positions, Permute((2, 1)), a frozen Dense(2, no bias) whose kernel is
    each position's (y, x) in pixels: (3 marks, 2) linear output, 0..31."""
    import keras
    Ly = L()
    xt, tt = _marks_xy(2048, H9.TRAIN_SEED)
    xc, _ = _marks_xy(N_CAL, H9.cal_seed())
    xe, _ = _marks_xy(N_EVAL, H9.EVAL_SEED)

    def train():
        _seed(1304)
        inp = keras.Input((32, 32, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        h = _conv_bn(h, 16)
        h = _conv_bn(h, 32, 2)
        h = _conv_bn(h, 32)
        h = _conv_bn(h, 32)
        h = Ly.UpSampling2D(2, interpolation="bilinear")(Ly.Conv2D(3, 1)(h))
        h = Ly.Softmax(axis=1)(Ly.Reshape((1024, 3))(h))
        coords = Ly.Dense(2, use_bias=False, trainable=False, name="coords")
        out = coords(Ly.Permute((2, 1))(h))
        yy, xx = np.mgrid[0:32, 0:32]
        coords.set_weights([np.stack([yy.ravel(), xx.ravel()], 1).astype(np.float32)])
        return _fit(keras.Model(inp, out, name="softargmax_kp"), xt, tt, 10, "mse")

    return _cached("softargmax_kp", train), ZooData(
        xc, xe, ("value",), "photo crops 32 0..255 with 3 coloured marks; spatial soft-argmax "
        "(Softmax axis=1, frozen coordinate Dense); (3, 2) pixel coordinates")


# ---- FPN-like cell classifier: hunt12's per-pixel classes, the majority per cell

def _cell_classes(x, cell):
    lab = H12._pixel_classes(x)
    n, s = lab.shape[0], lab.shape[1] // cell
    onehot = np.eye(4, dtype=np.float32)[lab].reshape(n, s, cell, s, cell, 4).sum((2, 4))
    return onehot.argmax(-1).reshape(n, s * s)


def fpn_cells():
    """FPN-like: conv+BN backbone to 8x8 (c2) and 4x4 (c3); lateral 1x1 convs, p3 upsampled
    (nearest) and Added to c2's lateral; a 3x3 conv+BN+relu and Conv2D(4, 1) head per level,
    each Reshape'd to (cells, 4) and Concatenated to (80, 4), softmax per cell: the majority
    pixel class (dark, bright, green, other) of each 4x4 and 8x8 cell."""
    import keras
    Ly = L()
    (xt, _, _), (xc, _, _), (xe, _, _) = photo_sets(32)
    yt = np.concatenate([_cell_classes(xt, 4), _cell_classes(xt, 8)], 1)

    def train():
        _seed(1305)
        inp = keras.Input((32, 32, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        c1 = _conv_bn(h, 16, 2)  # 16
        c2 = _conv_bn(_conv_bn(c1, 32, 2), 32)  # 8
        c3 = _conv_bn(c2, 64, 2)  # 4
        p3 = Ly.Conv2D(32, 1)(c3)
        p2 = Ly.Add()([Ly.Conv2D(32, 1)(c2), Ly.UpSampling2D(2)(p3)])
        heads = []
        for p, n in ((p2, 64), (p3, 16)):
            q = Ly.Conv2D(4, 1)(_conv_bn(p, 32))
            heads.append(Ly.Reshape((n, 4))(q))
        out = Ly.Softmax(name="cells")(Ly.Concatenate(axis=1)(heads))
        return _fit(keras.Model(inp, out, name="fpn_cells"), _f32(xt), yt, 10,
                    "sparse_categorical_crossentropy")

    return _cached("fpn_cells", train), ZooData(
        _f32(xc), _f32(xe), ("class",), "photo crops 32 0..255; FPN-like lateral + "
        "UpSampling Add, two heads Reshape+Concatenate, (80, 4) per-cell softmax")


# ---- IMU: 6 axes (accelerometer m/s^2, gyroscope rad/s) at 50 Hz, 128 samples, 5 activities

def _imu(n, seed, length=128):
    """Synthetic 6-axis IMU windows: 0 still, 1 walking (2 Hz), 2 running (3 Hz, strong), 3
    turning in place (gyro z 0.4-1.5 rad/s), 4 device rolling (gravity moves between y and z,
    gyro x). Random tilt of gravity, sensor noise, gyro bias."""
    rng = np.random.default_rng(seed)
    t = np.arange(length) / 50.0
    y = rng.integers(5, size=n)
    x = np.zeros((n, length, 6), np.float32)
    for i in range(n):
        k = y[i]
        tilt = rng.normal(0, 0.2, 2)
        g = 9.81 * np.array([np.sin(tilt[0]), np.sin(tilt[1]), np.cos(tilt[0])])
        acc = np.tile(g, (length, 1))
        gyr = np.zeros((length, 3))
        ph = rng.uniform(0, 2 * np.pi)
        if k in (1, 2):
            f = rng.uniform(1.6, 2.2) if k == 1 else rng.uniform(2.6, 3.2)
            a = rng.uniform(2, 4) if k == 1 else rng.uniform(6, 10)
            acc[:, 2] += a * np.sin(2 * np.pi * f * t + ph)
            acc[:, 0] += 0.4 * a * np.sin(2 * np.pi * f / 2 * t + ph)
            gyr[:, 1] += (0.3 if k == 1 else 0.9) * np.sin(2 * np.pi * f / 2 * t + ph)
        elif k == 3:
            gyr[:, 2] += rng.choice([-1, 1]) * rng.uniform(0.4, 1.5)
            acc[:, 0] += rng.uniform(-0.5, 0.5)
        elif k == 4:
            w = rng.uniform(0.3, 1.0) * rng.choice([-1, 1])
            ang = w * t + ph
            acc[:, 1], acc[:, 2] = 9.81 * np.sin(ang), 9.81 * np.cos(ang)
            gyr[:, 0] += w
        acc += rng.normal(0, 0.3, acc.shape)
        gyr += rng.normal(0, 0.05, gyr.shape) + rng.normal(0, 0.02, 3)
        x[i] = np.concatenate([acc, gyr], 1)
    return x, y


def imu_har():
    """6-axis IMU activity classifier: raw (128, 6) input (accelerometer +-20 m/s^2 beside
    gyroscope +-2 rad/s), Normalization(axis=-1) adapted on the training windows inside,
    Conv1D + BN + relu x3 (one stride 2), GlobalAveragePooling1D, 5 activities."""
    import keras
    Ly = L()
    xt, yt = _imu(2048, H9.TRAIN_SEED)
    xc, _ = _imu(N_CAL, H9.cal_seed())
    xe, _ = _imu(N_EVAL, H9.EVAL_SEED)

    def train():
        _seed(1306)
        norm = Ly.Normalization(axis=-1)
        norm.adapt(xt)
        inp = keras.Input((128, 6), name="imu")
        h = norm(inp)
        for w, s in ((32, 1), (48, 2), (64, 1)):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv1D(w, 5, s, "same",
                                                            use_bias=False)(h)))
        out = Ly.Dense(5, activation="softmax", name="activity")(
            Ly.GlobalAveragePooling1D()(h))
        return _fit(keras.Model(inp, out, name="imu_har"), xt, yt, 8,
                    "sparse_categorical_crossentropy")

    return _cached("imu_har", train), ZooData(
        xc, xe, ("class",), "synthetic 6-axis IMU (accel +-20, gyro +-2) 128 x 6; "
        "Normalization adapted inside, Conv1D+BN; 5 activities")


def log_softmax_out():
    """A conv+BN photo classifier ending in Dense(8) -> Activation("log_softmax") (values in
    (-inf, 0], log-probabilities), trained with the from-logits loss."""
    import keras

    def body(h):
        for w in (16, 32, 48):
            h = _conv_bn(h, w, 2)
        return h

    model, d = _photo_cls(
        "log_softmax_out", 1307, body, out_act="log_softmax",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    d.source = "photo crops 32 0..255; conv+BN; Activation(log_softmax) output, 8 classes"
    return model, d


def bilinear_dot():
    """Bilinear (Gram) pooling on gray texture crops (0..255, 10 scikit-image pictures):
    Rescaling, conv+BN+relu x3 (two stride 2: 8x8x24), Reshape((64, 24)), keras.layers.Dot(axes
    =1)([f, f]) / 64 (Rescaling) -> (24, 24), Flatten, BN, Dense(10, softmax)."""
    import keras
    Ly = L()
    (xt, yt), (xc, _), (xe, _) = H8.gray_labelled_sets(32)
    xt, xc, xe = (255.0 * a for a in (xt, xc, xe))

    def train():
        _seed(1308)
        inp = keras.Input((32, 32, 1), name="gray255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        h = _conv_bn(_conv_bn(_conv_bn(h, 16), 24, 2), 24, 2)
        f = Ly.Reshape((64, 24))(h)
        g = Ly.Rescaling(1 / 64.0)(Ly.Dot(axes=1)([f, f]))
        h = Ly.BatchNormalization()(Ly.Flatten()(g))
        out = Ly.Dense(10, activation="softmax", name="picture")(h)
        return _fit(keras.Model(inp, out, name="bilinear_dot"), xt, yt, 8,
                    "sparse_categorical_crossentropy")

    return _cached("bilinear_dot", train), ZooData(
        xc, xe, ("class",), "gray texture crops 32 0..255; bilinear Gram pooling "
        "(Dot axes=1), Flatten, BN; 10 pictures")


# ---- sequence tagging: tones that change frequency segment-wise, a label per sample

def _tone_segments(n, seed, length=128, classes=4):
    rng = np.random.default_rng(seed)
    x = np.zeros((n, length, 1), np.float32)
    y = np.zeros((n, length), np.int64)
    freqs = np.array([0.03, 0.08, 0.15, 0.3])  # cycles per sample
    for i in range(n):
        cuts = np.sort(rng.choice(np.arange(16, length - 16), 3, replace=False))
        bounds = np.concatenate([[0], cuts, [length]])
        phase = rng.uniform(0, 2 * np.pi)
        amp = rng.uniform(0.3, 2.0)
        for a, b in zip(bounds[:-1], bounds[1:]):
            k = rng.integers(classes)
            t = np.arange(b - a)
            x[i, a:b, 0] = amp * np.sin(2 * np.pi * freqs[k] * t + phase)
            phase += 2 * np.pi * freqs[k] * (b - a)
            y[i, a:b] = k
        x[i, :, 0] += rng.normal(0, 0.15, length) + rng.normal(0, 0.3)
    return x, y


def frame_tagger():
    """Per-timestep softmax: signals of 128 samples made of 4 segments of one of 4 tones each;
    Conv1D + BN + relu with dilations 1, 2, 4, 8 ('same'), Conv1D(4, 1), Softmax: a (128, 4)
    output, the tone at each sample."""
    import keras
    Ly = L()
    xt, yt = _tone_segments(2048, H9.TRAIN_SEED)
    xc, _ = _tone_segments(N_CAL, H9.cal_seed())
    xe, _ = _tone_segments(N_EVAL, H9.EVAL_SEED)

    def train():
        _seed(1309)
        inp = keras.Input((128, 1), name="signal")
        h = inp
        for d in (1, 2, 4, 8):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv1D(32, 5, padding="same",
                                                            dilation_rate=d,
                                                            use_bias=False)(h)))
        out = Ly.Softmax(name="tone")(Ly.Conv1D(4, 1)(h))
        return _fit(keras.Model(inp, out, name="frame_tagger"), xt, yt, 10,
                    "sparse_categorical_crossentropy")

    return _cached("frame_tagger", train), ZooData(
        xc, xe, ("class",), "synthetic segment-wise tones 128 x 1; dilated Conv1D+BN; "
        "per-timestep softmax (128, 4)")


def ensemble_avg():
    """Three photo classifiers trained separately, then averaged: A conv+BN+relu x3; B
    SeparableConv2D + BN + swish x3; C Conv2D(activation="tanh") x3 without BN; each Dense(8,
    softmax); keras.layers.Average of the three probability vectors, one input (0..255,
    Rescaling inside each member)."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(32)

    def member(k, inp):
        h = Ly.Rescaling(1 / 255.0)(inp)
        for w in (16, 32, 48):
            if k == 0:
                h = _conv_bn(h, w, 2)
            elif k == 1:
                h = Ly.Activation("swish")(Ly.BatchNormalization()(
                    Ly.SeparableConv2D(w, 3, 2, "same", use_bias=False)(h)))
            else:
                h = Ly.Conv2D(w, 3, 2, "same", activation="tanh")(h)
        return Ly.Dense(8, activation="softmax")(Ly.GlobalAveragePooling2D()(h))

    def train():
        _seed(1310)
        inp = keras.Input((32, 32, 3), name="rgb255")
        outs = []
        for k in range(3):
            o = member(k, inp)
            _fit(keras.Model(inp, o), _f32(xt), yt, 6, "sparse_categorical_crossentropy")
            outs.append(o)
        return keras.Model(inp, Ly.Average(name="photo")(outs), name="ensemble_avg")

    return _cached("ensemble_avg", train), ZooData(
        _f32(xc), _f32(xe), ("class",), "photo crops 32 0..255; Average of 3 separately "
        "trained softmax members (conv+BN, sepconv+BN swish, tanh no BN); 8 classes")


def factorized_kernels():
    """hunt9's log-mel spectrograms in dB ([-80, 0], 32 mels x 32 frames), Rescaling(1/80,
    offset 1); Inception-v3-like factorized kernels: Conv2D (1, 7) then (7, 1), each + BN +
    relu, strides (2, 1) and (1, 2), a 1x1 branch Concatenated; GAP; 8 sound kinds."""
    import keras
    Ly = L()
    (xt, yt), (xc, _), (xe, _) = (H9._logmel(2048, H9.TRAIN_SEED), H9._logmel(N_CAL, H9.cal_seed()),
                                  H9._logmel(N_EVAL, H9.EVAL_SEED))

    def cb(h, w, k, s=1):
        return Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(w, k, s, "same", use_bias=False)(h)))

    def train():
        _seed(1311)
        inp = keras.Input((32, 32, 1), name="logmel_db")
        h = Ly.Rescaling(1 / 80.0, offset=1.0)(inp)
        h = cb(cb(h, 16, (1, 7), (2, 1)), 16, (7, 1), (1, 2))  # 16 x 16
        for w in (32, 48):
            a = cb(cb(h, w, (1, 7)), w, (7, 1), (2, 2))
            b = cb(h, w // 2, 1, (2, 2))
            h = Ly.Concatenate()([a, b])
        out = Ly.Dense(8, activation="softmax", name="sound")(Ly.GlobalAveragePooling2D()(h))
        return _fit(keras.Model(inp, out, name="factorized_kernels"), xt, yt, 8,
                    "sparse_categorical_crossentropy")

    return _cached("factorized_kernels", train), ZooData(
        xc, xe, ("class",), "log-mel dB [-80, 0] 32x32 (Rescaling inside); (1,7)/(7,1) "
        "kernels, strides (2,1)/(1,2), BN; 8 sound kinds")


MODELS = {f.__name__: f for f in [
    shufflenet_like, convmixer, cbam_attn, softargmax_kp, fpn_cells, imu_har, log_softmax_out,
    bilinear_dot, frame_tagger, ensemble_avg, factorized_kernels]}


build = hunts.builder(MODELS, __name__)
