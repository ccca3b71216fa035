"""hunt7: 32 models helper-32 built to hunt for cle's failures on kinds the zoo lacked (stop 66;
the three it found cle failing on most are also in zoo_models: blob_grid, autoencoder_flat,
multilabel_maxpool), with zoo_models' interface, for ``bench_zoo.py --zoo hunt7_models``::

    nice -n 10 .venv/bin/python benchmarks/bench_zoo.py --zoo hunt7_models \
        --models grid_50cls_r grid_50cls_r@2 ae_flat@1 --json /tmp/hunt7.jsonl

``build(name) -> (model, ZooData)``. A name "base@k" (k = 1, 2, ...) is the same model with
another draw of 64 calibration inputs from the same source (the held-out inputs, 1000, are the
same). Trained models are cached beside the zoo's (:func:`zoo_models.cache_dir`, ``hunt7/``).
Written fast, for a hunt: the models are what a new user might train in a minute, not tuned.
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
TRAIN_SEED, EVAL_SEED = 2000, 3007
DRAW = 0  # set by build()
_seed = ZM._seed


def cal_seed():
    return 11 + 101 * DRAW


def _cached(name, train):
    """The zoo's cache, in its folder ``hunt7``."""
    return ZM._cached(os.path.join("hunt7", name), train)


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


# ------------------------------------------------------------------------------- the models


def bn_input_raw255():
    """BatchNormalization straight on raw 0..255 RGB, then convs WITHOUT batch norm."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(40)

    def train():
        _seed(101)
        inp = keras.Input((40, 40, 3), name="rgb255")
        h = Ly.BatchNormalization(name="bn_in")(inp)
        for w in (16, 32, 48):
            h = Ly.Conv2D(w, 3, strides=2, padding="same", activation="relu")(h)
        h = Ly.GlobalAveragePooling2D()(h)
        out = Ly.Dense(8, activation="softmax", name="photo")(h)
        return _fit(keras.Model(inp, out, name="bn_input_raw255"), xt.astype(np.float32), yt,
                    10, "sparse_categorical_crossentropy")

    return _cached("bn_input_raw255", train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("class",),
        "photo crops 40, 0..255; BN on the raw input, 3 convs+relu without BN; 8-class softmax")


def resnet_fewepochs():
    """ResNet-like (BN, Add), trained 2 epochs only and NOT settled (moving stats partial)."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(48)

    def train():
        _seed(102)
        inp = keras.Input((48, 48, 3), name="img")
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(16, 3, padding="same", use_bias=False)(inp)))
        for w in (16, 32, 64):
            s = 1 if w == 16 else 2
            a = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(w, 3, s, "same", use_bias=False)(h)))
            b = Ly.BatchNormalization()(Ly.Conv2D(w, 3, 1, "same", use_bias=False)(a))
            sc = h if s == 1 and h.shape[-1] == w else Ly.BatchNormalization()(
                Ly.Conv2D(w, 1, s, use_bias=False)(h))
            h = Ly.ReLU()(Ly.Add()([sc, b]))
        h = Ly.GlobalAveragePooling2D()(h)
        out = Ly.Dense(8, activation="softmax", name="photo")(h)
        model = keras.Model(inp, out, name="resnet_fewepochs")
        model.compile(optimizer=keras.optimizers.Adam(2e-3), loss="sparse_categorical_crossentropy")
        model.fit(xt / 255.0, yt, epochs=2, batch_size=32, verbose=0)
        return model  # no settling: as a user would leave it

    return _cached("resnet_fewepochs", train), ZooData(
        xc / 255.0, xe / 255.0, ("class",),
        "photo crops 48, [0,1]; ResNet-like, 2 epochs, BN moving stats unsettled; 8 classes")


def norm_bn_long_head():
    """Normalization(axis=None) adapted, convs+BN, then GAP and THREE Dense layers; 3 classes."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(40)
    groups = np.array([0, 0, 1, 1, 2, 2, 0, 1])  # photo -> one of 3 groups

    def train():
        _seed(103)
        norm = Ly.Normalization(axis=None, name="norm")
        norm.adapt(xt.astype(np.float32))
        inp = keras.Input((40, 40, 3), name="rgb255")
        h = norm(inp)
        for w in (16, 32, 48):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(w, 3, 2, "same", use_bias=False)(h)))
        h = Ly.GlobalAveragePooling2D()(h)
        h = Ly.Dense(64, activation="relu")(h)
        h = Ly.Dense(32, activation="relu")(h)
        h = Ly.Dense(16, activation="relu")(h)
        out = Ly.Dense(3, activation="softmax", name="group")(h)
        return _fit(keras.Model(inp, out, name="norm_bn_long_head"), xt.astype(np.float32),
                    groups[yt], 10, "sparse_categorical_crossentropy")

    return _cached("norm_bn_long_head", train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("class",),
        "photo crops 40, 0..255; Normalization(axis=None) + conv/BN + 3 Dense after GAP; 3 classes")


TEXTURES = {"brick", "grass", "gravel"}


def _texture_label(n, seed, size):
    """gray_crops with a label: 1 when the crop comes from a texture image."""
    images = ZM._gray_images()
    names = ZM.GRAY_IMAGES
    rng = np.random.default_rng(seed)
    x = np.empty((n, size, size, 1), np.float32)
    y = np.empty(n, np.int64)
    for i in range(n):
        k = rng.integers(len(images))
        im = images[k]
        top, left = rng.integers(im.shape[0] - size), rng.integers(im.shape[1] - size)
        x[i, ..., 0] = im[top:top + size, left:left + size]
        y[i] = names[k] in TEXTURES
    return x, y


def act_mix_2cls():
    """GELU, swish and a hard-sigmoid squeeze-excitation gate, BN; 2-class softmax."""
    import keras
    Ly = L()
    xt, yt = _texture_label(2048, TRAIN_SEED, 32)
    xc, _ = _texture_label(N_CAL, cal_seed(), 32)
    xe, _ = _texture_label(N_EVAL, EVAL_SEED, 32)

    def train():
        _seed(104)
        inp = keras.Input((32, 32, 1), name="gray")
        h = Ly.Activation("gelu")(Ly.BatchNormalization()(Ly.Conv2D(16, 3, padding="same", use_bias=False)(inp)))
        h = Ly.Activation("swish")(Ly.BatchNormalization()(Ly.Conv2D(32, 3, 2, "same", use_bias=False)(h)))
        se = Ly.GlobalAveragePooling2D(keepdims=True)(h)
        se = Ly.Conv2D(8, 1, activation="relu")(se)
        se = Ly.Conv2D(32, 1, activation="hard_sigmoid")(se)
        h = Ly.Multiply()([h, se])
        h = Ly.Activation("gelu")(Ly.BatchNormalization()(Ly.Conv2D(48, 3, 2, "same", use_bias=False)(h)))
        h = Ly.GlobalAveragePooling2D()(h)
        out = Ly.Dense(2, activation="softmax", name="texture")(h)
        return _fit(keras.Model(inp, out, name="act_mix_2cls"), xt, yt, 8,
                    "sparse_categorical_crossentropy")

    return _cached("act_mix_2cls", train), ZooData(
        xc, xe, ("class",), "gray crops 32 [0,1]; gelu/swish/hard_sigmoid SE, BN; texture or not (2)")


def layernorm_cnn():
    """Conv2D + LayerNormalization (channels) + gelu, no BN; 8 logits."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(32)

    def train():
        _seed(105)
        inp = keras.Input((32, 32, 3), name="img")
        h = inp
        for w in (16, 32, 64):
            h = Ly.Conv2D(w, 3, strides=2, padding="same")(h)
            h = Ly.Activation("gelu")(Ly.LayerNormalization(axis=-1)(h))
        h = Ly.GlobalAveragePooling2D()(h)
        out = Ly.Dense(8, name="logits")(h)
        return _fit(keras.Model(inp, out, name="layernorm_cnn"), xt / 255.0, yt, 10,
                    keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    return _cached("layernorm_cnn", train), ZooData(
        xc / 255.0, xe / 255.0, ("class",), "photo crops 32 [0,1]; conv + LayerNorm + gelu; 8 logits")


def _bands(n, seed, classes=50, length=256):
    rng = np.random.default_rng(seed)
    y = rng.integers(classes, size=n)
    t = np.arange(length) / length
    freq = 2.0 + 1.0 * y + rng.uniform(-0.3, 0.3, n)
    amp = rng.uniform(0.5, 2.0, n)
    x = amp[:, None] * np.sin(2 * np.pi * freq[:, None] * t + rng.uniform(0, 2 * np.pi, n)[:, None])
    x += rng.normal(0, 0.2, (n, length))
    return x[..., None].astype(np.float32), y


def dilated_50cls():
    """Dilated Conv1D (TCN-like, causal) + BN; 50-class softmax."""
    import keras
    Ly = L()
    xt, yt = _bands(6000, TRAIN_SEED)

    def train():
        _seed(106)
        inp = keras.Input((256, 1), name="signal")
        h = Ly.Conv1D(32, 3, padding="causal", use_bias=False)(inp)
        h = Ly.ReLU()(Ly.BatchNormalization()(h))
        for d in (2, 4, 8, 16):
            h = Ly.Conv1D(32, 3, padding="causal", dilation_rate=d, use_bias=False)(h)
            h = Ly.ReLU()(Ly.BatchNormalization()(h))
        h = Ly.Conv1D(64, 1, activation="relu")(h)
        h = Ly.GlobalAveragePooling1D()(h)
        out = Ly.Dense(50, activation="softmax", name="band")(h)
        return _fit(keras.Model(inp, out, name="dilated_50cls"), xt, yt, 8,
                    "sparse_categorical_crossentropy", batch_size=64)

    return _cached("dilated_50cls", train), ZooData(
        _bands(N_CAL, cal_seed())[0], _bands(N_EVAL, EVAL_SEED)[0], ("class",),
        "synthetic sines 256, 50 frequency bands; dilated causal Conv1D + BN")


def _grid(n, seed, size=32, cells=10):
    rng = np.random.default_rng(seed)
    y = rng.integers(cells * cells, size=n)
    bg = gray_crops(n, size, seed + 5) * 0.4
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    step = size / cells
    cy = (y // cells + 0.5 + rng.uniform(-0.25, 0.25, n)) * step
    cx = (y % cells + 0.5 + rng.uniform(-0.25, 0.25, n)) * step
    amp = rng.uniform(0.5, 1.0, n)
    blob = amp[:, None, None] * np.exp(-((yy - cy[:, None, None]) ** 2 + (xx - cx[:, None, None]) ** 2) / 2.0)
    return (bg[..., 0] + blob)[..., None].astype(np.float32), y, np.stack([cy, cx, amp], 1)


def grid_100cls():
    """Strided convs, no pooling, Flatten; 100-class softmax (blob position on a 10x10 grid)."""
    import keras
    Ly = L()
    xt, yt, _ = _grid(8000, TRAIN_SEED)

    def train():
        _seed(107)
        inp = keras.Input((32, 32, 1), name="img")
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(16, 3, 1, "same", use_bias=False)(inp)))
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(32, 3, 2, "same", use_bias=False)(h)))
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(32, 3, 2, "same", use_bias=False)(h)))
        h = Ly.Flatten()(h)
        out = Ly.Dense(100, activation="softmax", name="cell")(h)
        return _fit(keras.Model(inp, out, name="grid_100cls"), xt, yt, 6,
                    "sparse_categorical_crossentropy", batch_size=64)

    return _cached("grid_100cls", train), ZooData(
        _grid(N_CAL, cal_seed())[0], _grid(N_EVAL, EVAL_SEED)[0], ("class",),
        "gray bg + gaussian blob on a 10x10 grid, 32x32; strided convs + BN, Flatten; 100 classes")


def _attrs(images, photo):
    lum = _lum(images)
    f = images.astype(np.float64)
    return np.stack([np.isin(photo, [0, 1, 2, 3]), np.isin(photo, [0, 2, 4, 6]),
                     lum.mean((1, 2)) > 110, f[..., 0].mean((1, 2)) > f[..., 2].mean((1, 2)),
                     lum.std((1, 2)) > 50, np.isin(photo, [1, 5])], 1).astype(np.float32)


def multilabel_gmp():
    """Rescaling(1/255), conv+BN+swish, GlobalMaxPooling; 6 sigmoid labels (multi-label)."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(40)

    def train():
        _seed(108)
        inp = keras.Input((40, 40, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        for w in (16, 32, 64):
            h = Ly.Activation("swish")(Ly.BatchNormalization()(Ly.Conv2D(w, 3, 2, "same", use_bias=False)(h)))
        h = Ly.GlobalMaxPooling2D()(h)
        out = Ly.Dense(6, activation="sigmoid", name="attrs")(h)
        return _fit(keras.Model(inp, out, name="multilabel_gmp"), xt.astype(np.float32),
                    _attrs(xt, yt), 12, "binary_crossentropy")

    return _cached("multilabel_gmp", train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("value",),
        "photo crops 40 0..255; GlobalMaxPooling; 6 sigmoid attributes (multi-label, values)")


def reg_multiscale():
    """Strided convs + BN; one output of 4 columns of scales ~100, ~50, ~0.5, ~0.3, one of ~0.01."""
    import keras
    Ly = L()
    (xt, _, bt), (xc, _, _), (xe, _, _) = photo_sets(40)

    def targets(images, box):
        lum = _lum(images)
        stats = np.stack([lum.mean((1, 2)), lum.std((1, 2)), box[:, 0], box[:, 2]], 1)
        tiny = 0.01 * (box[:, 1:2] - 0.5)
        return stats.astype(np.float32), tiny.astype(np.float32)

    def train():
        _seed(109)
        inp = keras.Input((40, 40, 3), name="img")
        h = inp
        for w in (16, 32, 48):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(w, 3, 2, "same", use_bias=False)(h)))
        h = Ly.GlobalAveragePooling2D()(h)
        h = Ly.Dense(32, activation="relu")(h)
        model = keras.Model(inp, [Ly.Dense(4, name="stats")(h), Ly.Dense(1, name="tiny")(h)],
                            name="reg_multiscale")
        s, t = targets(xt, bt)
        sd = s.std(0)
        model.compile(optimizer=keras.optimizers.Adam(2e-3), loss=["mse", "mse"],
                      loss_weights=[1.0, 1e4])
        model.get_layer("stats").bias.assign(s.mean(0))
        # a user would scale the loss; here per column by weighting via standardized targets
        model.fit(xt / 255.0, [s, t], epochs=12, batch_size=32, verbose=0)
        del sd
        return _settle_bn(model, xt / 255.0)

    return _cached("reg_multiscale", train), ZooData(
        xc / 255.0, xe / 255.0, ("value", "value"),
        "photo crops 40 [0,1]; out0 = [lum mean ~100, lum std ~50, box cy ~0.5, box h ~0.5]; out1 ~0.01")


def _video(n, seed, frames=8, size=16):
    rng = np.random.default_rng(seed)
    y = rng.integers(4, size=n)
    d = np.array([[0, 1], [0, -1], [1, 0], [-1, 0]], np.float32)[y]
    start = rng.uniform(4, 12, (n, 2))
    speed = rng.uniform(0.7, 1.2, n)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    out = rng.normal(0, 0.1, (n, frames, size, size)).astype(np.float32)
    for f in range(frames):
        c = start + d * speed[:, None] * (f - frames / 2)
        out[:, f] += np.exp(-((yy - c[:, 0, None, None]) ** 2 + (xx - c[:, 1, None, None]) ** 2) / 3.0)
    return out[..., None], y


def video_conv3d():
    """Conv3D + BN on 8-frame 16x16 clips; direction of motion (4 classes)."""
    import keras
    Ly = L()
    xt, yt = _video(3000, TRAIN_SEED)

    def train():
        _seed(110)
        inp = keras.Input((8, 16, 16, 1), name="clip")
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv3D(8, 3, padding="same", use_bias=False)(inp)))
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv3D(16, 3, strides=2, padding="same", use_bias=False)(h)))
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv3D(32, 3, strides=2, padding="same", use_bias=False)(h)))
        h = Ly.GlobalAveragePooling3D()(h)
        out = Ly.Dense(4, activation="softmax", name="direction")(h)
        return _fit(keras.Model(inp, out, name="video_conv3d"), xt, yt, 6,
                    "sparse_categorical_crossentropy")

    return _cached("video_conv3d", train), ZooData(
        _video(N_CAL, cal_seed())[0], _video(N_EVAL, EVAL_SEED)[0], ("class",),
        "synthetic clips 8x16x16 (moving blob + noise); Conv3D + BN; 4 directions")


def pm1_regression():
    """Input in [-1, 1]; conv (no bias) + BN + relu6, depthwise + BN; one value (local contrast)."""
    import keras
    Ly = L()
    xt, xc, xe = gray_sets(32)

    def target(x):
        return (10.0 * x.std((1, 2, 3)) + 2.0 * x.mean((1, 2, 3)))[:, None].astype(np.float32)

    def train():
        _seed(111)
        inp = keras.Input((32, 32, 1), name="gray_pm1")
        h = Ly.ReLU(6.0)(Ly.BatchNormalization()(Ly.Conv2D(16, 3, 2, "same", use_bias=False)(inp)))
        h = Ly.ReLU(6.0)(Ly.BatchNormalization()(Ly.DepthwiseConv2D(3, padding="same", use_bias=False)(h)))
        h = Ly.ReLU(6.0)(Ly.BatchNormalization()(Ly.Conv2D(32, 1, use_bias=False)(h)))
        h = Ly.ReLU(6.0)(Ly.BatchNormalization()(Ly.Conv2D(48, 3, 2, "same", use_bias=False)(h)))
        h = Ly.GlobalAveragePooling2D()(h)
        out = Ly.Dense(1, name="contrast")(h)
        model = keras.Model(inp, out, name="pm1_regression")
        model.get_layer("contrast").bias.assign([float(target(xt).mean())])
        return _fit(model, xt * 2 - 1, target(xt), 10, "mse")

    return _cached("pm1_regression", train), ZooData(
        xc * 2 - 1, xe * 2 - 1, ("value",), "gray crops 32 in [-1,1]; conv/dw + BN + relu6; 1 value")


def outlier_photo_cls():
    """A standard BN classifier on 0..255 with Rescaling; held-out: 1 % overexposed images."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(40)
    xe = xe.astype(np.float32).copy()
    rng = np.random.default_rng(77)
    idx = rng.choice(len(xe), len(xe) // 100, replace=False)
    xe[idx] = np.clip(xe[idx] * 1.8 + 60, 0, 255)

    def train():
        _seed(112)
        inp = keras.Input((40, 40, 3), name="rgb255")
        h = Ly.Rescaling(1 / 127.5, offset=-1)(inp)
        for w in (16, 32, 48):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(w, 3, 2, "same", use_bias=False)(h)))
        h = Ly.GlobalAveragePooling2D()(h)
        out = Ly.Dense(8, activation="softmax", name="photo")(h)
        return _fit(keras.Model(inp, out, name="outlier_photo_cls"), xt.astype(np.float32), yt,
                    10, "sparse_categorical_crossentropy")

    return _cached("outlier_photo_cls", train), ZooData(
        xc.astype(np.float32), xe, ("class",),
        "photo crops 40 0..255 (Rescaling to [-1,1]); held-out has 1% overexposed crops")


def outlier_signal_reg():
    """Conv1D + BN regression of the amplitude; held-out: 1 % signals 4x larger (spikes)."""
    import keras
    Ly = L()

    def data(n, seed, outliers=0.0):
        x, _ = _signals(n, seed)
        rng = np.random.default_rng(seed + 3)
        amp = np.sqrt(2) * x.std(1)
        if outliers:
            idx = rng.choice(n, int(n * outliers), replace=False)
            x[idx] *= 4.0
            amp[idx] *= 4.0
        return x, amp.astype(np.float32)

    xt, at = data(3000, TRAIN_SEED)

    def train():
        _seed(113)
        inp = keras.Input((256, 1), name="signal")
        h = inp
        for w in (16, 32, 32):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv1D(w, 7, 2, "same", use_bias=False)(h)))
        h = Ly.GlobalAveragePooling1D()(h)
        h = Ly.Dense(16, activation="relu")(h)
        out = Ly.Dense(1, name="amplitude")(h)
        return _fit(keras.Model(inp, out, name="outlier_signal_reg"), xt, at, 10, "mse")

    return _cached("outlier_signal_reg", train), ZooData(
        data(N_CAL, cal_seed())[0], data(N_EVAL, EVAL_SEED, 0.01)[0], ("value",),
        "noisy sines 256; regression of RMS amplitude; held-out has 1% signals x4")


def _ae_model():
    import keras
    Ly = L()
    inp = keras.Input((32, 32, 1), name="gray")
    h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(16, 3, 2, "same", use_bias=False)(inp)))
    h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(32, 3, 2, "same", use_bias=False)(h)))
    z = Ly.Dense(32, name="code")(Ly.Flatten()(h))
    enc = keras.Model(inp, z, name="encoder")
    zi = keras.Input((32,), name="code_in")
    g = Ly.Dense(8 * 8 * 32, activation="relu")(zi)
    g = Ly.Reshape((8, 8, 32))(g)
    g = Ly.Conv2DTranspose(16, 3, 2, "same", activation="relu")(g)
    g = Ly.Conv2DTranspose(1, 3, 2, "same", activation="sigmoid", name="recon")(g)
    dec = keras.Model(zi, g, name="decoder")
    return enc, dec, keras.Model(inp, dec(enc(inp)), name="autoencoder")


@functools.lru_cache(maxsize=1)
def _autoencoder():
    import keras

    def train():
        _seed(114)
        xt, _, _ = gray_sets(32, 4096)
        enc, dec, ae = _ae_model()
        ae.compile(optimizer=keras.optimizers.Adam(2e-3), loss="mse")
        ae.fit(xt, xt, epochs=10, batch_size=32, verbose=0)
        _settle_bn(ae, xt)
        # a flat functional model (encoder BNs, decoder transposed convs)
        inp = keras.Input((32, 32, 1), name="gray")
        flat = keras.Model(inp, dec(enc(inp)))
        return flat

    return _cached("autoencoder_full", train)


def autoencoder_transpose():
    """Conv+BN encoder, Dense bottleneck, Dense + Conv2DTranspose decoder (no BN), sigmoid."""
    xt, xc, xe = gray_sets(32)
    return _autoencoder(), ZooData(xc, xe, ("value",),
                                   "gray crops 32 [0,1]; autoencoder (nested encoder/decoder), "
                                   "BN in encoder only, Conv2DTranspose decoder; reconstruction")


def decoder_latent():
    """The decoder alone: input = 32-d code (encoder of crops), Dense + Conv2DTranspose, no BN."""
    ae = _autoencoder()
    enc = [la for la in ae.layers if la.name == "encoder"][0]
    dec = [la for la in ae.layers if la.name == "decoder"][0]
    _, xc, xe = gray_sets(32)
    import keras

    zi = keras.Input((32,), name="code")
    model = keras.Model(zi, dec(zi), name="decoder_latent")
    return model, ZooData(enc.predict(xc, verbose=0), enc.predict(xe, verbose=0), ("value",),
                          "decoder only: 32-d latent codes of gray crops -> 32x32 sigmoid image")


def unet_add_upsample():
    """Residual denoiser: conv+BN, MaxPool, UpSampling2D (nearest), Add skip, Concatenate input,
    output = input + correction (linear)."""
    import keras
    Ly = L()

    def noisy(x, seed):
        return (x + np.random.default_rng(seed).normal(0, 0.1, x.shape)).astype(np.float32)

    xt, xc, xe = gray_sets(32)

    def train():
        _seed(115)
        inp = keras.Input((32, 32, 1), name="noisy")
        c1 = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(16, 3, padding="same", use_bias=False)(inp)))
        c2 = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(32, 3, padding="same", use_bias=False)(Ly.MaxPooling2D()(c1))))
        c3 = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(32, 3, padding="same", use_bias=False)(Ly.MaxPooling2D()(c2))))
        u2 = Ly.Add()([Ly.UpSampling2D()(c3), c2])
        u2 = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(16, 3, padding="same", use_bias=False)(u2)))
        u1 = Ly.Add()([Ly.UpSampling2D()(u2), c1])
        u1 = Ly.Concatenate()([u1, inp])
        u1 = Ly.Conv2D(16, 3, padding="same", activation="relu")(u1)
        corr = Ly.Conv2D(1, 3, padding="same", name="correction")(u1)
        out = Ly.Add(name="clean")([inp, corr])
        return _fit(keras.Model(inp, out, name="unet_add_upsample"), noisy(xt, 1), xt, 6, "mse")

    return _cached("unet_add_upsample", train), ZooData(
        noisy(xc, 2 + DRAW), noisy(xe, 3), ("value",),
        "gray crops 32 + N(0, 0.1); residual denoiser, Add skips, UpSampling2D, Concatenate")


def _tab(n, seed):
    from sklearn.datasets import make_classification

    # a fixed generating law (random_state fixed), sampled with another seed
    x, y = make_classification(n_samples=30000, n_features=12, n_informative=8, n_classes=4,
                               n_clusters_per_class=2, random_state=5)
    scales = np.array([1, 10, 100, 1000, 0.1, 5, 50, 0.5, 2, 20, 200, 0.05], np.float32)
    offs = np.array([0, 100, 0, 3000, 1, 0, 500, 0, 10, 0, 0, 0.2], np.float32)
    x = (x * scales + offs).astype(np.float32)
    rng = np.random.default_rng(seed)
    idx = {TRAIN_SEED: np.arange(0, 20000), EVAL_SEED: np.arange(20000, 21000)}.get(seed)
    if idx is None:
        idx = 21000 + rng.choice(9000, n, replace=False)
    return x[idx][:n], y[idx][:n]


def tabular_bn_first():
    """BatchNormalization as the FIRST layer on raw tabular features (scales 0.05-1000), Dense +
    BN + ReLU; 4-class softmax."""
    import keras
    Ly = L()
    xt, yt = _tab(20000, TRAIN_SEED)

    def train():
        _seed(116)
        inp = keras.Input((12,), name="features")
        h = Ly.BatchNormalization(name="bn_in")(inp)
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Dense(64, use_bias=False)(h)))
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Dense(32, use_bias=False)(h)))
        out = Ly.Dense(4, activation="softmax", name="cls")(h)
        return _fit(keras.Model(inp, out, name="tabular_bn_first"), xt, yt, 8,
                    "sparse_categorical_crossentropy", batch_size=64)

    return _cached("tabular_bn_first", train), ZooData(
        _tab(N_CAL, cal_seed())[0], _tab(N_EVAL, EVAL_SEED)[0], ("class",),
        "make_classification 12 features rescaled 0.05-1000 + offsets; BN first; 4 classes")


def sig_binary_sigmoid1():
    """Conv1D + BN + ELU; a single sigmoid unit (binary: low vs high band)."""
    import keras
    Ly = L()
    xt, yt = _signals(3000, TRAIN_SEED)

    def train():
        _seed(117)
        inp = keras.Input((256, 1), name="signal")
        h = inp
        for w in (16, 32, 32):
            h = Ly.ELU()(Ly.BatchNormalization()(Ly.Conv1D(w, 5, 2, "same", use_bias=False)(h)))
        h = Ly.GlobalMaxPooling1D()(h)
        out = Ly.Dense(1, activation="sigmoid", name="high")(h)
        return _fit(keras.Model(inp, out, name="sig_binary_sigmoid1"), xt, (yt >= 3).astype(np.float32),
                    8, "binary_crossentropy")

    return _cached("sig_binary_sigmoid1", train), ZooData(
        _signals(N_CAL, cal_seed())[0], _signals(N_EVAL, EVAL_SEED)[0], ("value",),
        "noisy sines 256; Conv1D+BN+ELU, GlobalMaxPool; one sigmoid")


def inception_concat():
    """Inception-like: parallel 1x1 / 3x3 / 5x5 / pool branches (BN each), Concatenate; 8 classes."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(32)

    def cbr(h, w, k, s=1):
        return Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(w, k, s, "same", use_bias=False)(h)))

    def train():
        _seed(118)
        inp = keras.Input((32, 32, 3), name="img")
        h = cbr(inp, 16, 3, 2)
        for w in (8, 16):
            b1 = cbr(h, w, 1)
            b2 = cbr(cbr(h, w, 1), w, 3)
            b3 = cbr(cbr(h, w // 2, 1), w, 5)
            b4 = cbr(Ly.MaxPooling2D(3, 1, "same")(h), w, 1)
            h = Ly.Concatenate()([b1, b2, b3, b4])
            h = Ly.MaxPooling2D()(h)
        h = Ly.GlobalAveragePooling2D()(h)
        out = Ly.Dense(8, activation="softmax", name="photo")(h)
        return _fit(keras.Model(inp, out, name="inception_concat"), xt / 127.5 - 1, yt, 8,
                    "sparse_categorical_crossentropy")

    return _cached("inception_concat", train), ZooData(
        xc / 127.5 - 1, xe / 127.5 - 1, ("class",), "photo crops 32 [-1,1]; inception blocks; 8 classes")


def long_head_3dense():
    """CNN + BN, then GAP and Dense(128, swish) -> Dense(64, gelu) -> Dense(32, relu) -> 2 softmax."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(40)

    def train():
        _seed(119)
        inp = keras.Input((40, 40, 3), name="img")
        h = inp
        for w in (16, 32, 48):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(w, 3, 2, "same", use_bias=False)(h)))
        h = Ly.GlobalAveragePooling2D()(h)
        h = Ly.Dense(128, activation="swish")(h)
        h = Ly.Dense(64, activation="gelu")(h)
        h = Ly.Dense(32, activation="relu")(h)
        out = Ly.Dense(2, activation="softmax", name="indoor")(h)
        return _fit(keras.Model(inp, out, name="long_head_3dense"), xt / 255.0,
                    (yt % 2).astype(np.int64), 10, "sparse_categorical_crossentropy")

    return _cached("long_head_3dense", train), ZooData(
        xc / 255.0, xe / 255.0, ("class",), "photo crops 40 [0,1]; BN convs, then 3 Dense (swish, "
        "gelu, relu) after GAP; 2-class softmax")


MODELS = {f.__name__: f for f in [
    bn_input_raw255, resnet_fewepochs, norm_bn_long_head, act_mix_2cls, layernorm_cnn,
    dilated_50cls, grid_100cls, multilabel_gmp, reg_multiscale, video_conv3d, pm1_regression,
    outlier_photo_cls, outlier_signal_reg, autoencoder_transpose, decoder_latent,
    unet_add_upsample, tabular_bn_first, sig_binary_sigmoid1, inception_concat, long_head_3dense,
]}


# ----------------------------------------------------------------- extra: no-data-able models


def resnet_fewepochs_r255():
    """resnet_fewepochs with Rescaling(1/255) inside (0..255 input), 2 epochs, unsettled BN."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(48)

    def train():
        _seed(202)
        inp = keras.Input((48, 48, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(16, 3, padding="same", use_bias=False)(h)))
        for w in (16, 32, 64):
            s = 1 if w == 16 else 2
            a = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(w, 3, s, "same", use_bias=False)(h)))
            b = Ly.BatchNormalization()(Ly.Conv2D(w, 3, 1, "same", use_bias=False)(a))
            sc = h if s == 1 else Ly.BatchNormalization()(Ly.Conv2D(w, 1, s, use_bias=False)(h))
            h = Ly.ReLU()(Ly.Add()([sc, b]))
        h = Ly.GlobalAveragePooling2D()(h)
        out = Ly.Dense(8, activation="softmax", name="photo")(h)
        model = keras.Model(inp, out, name="resnet_fewepochs_r255")
        model.compile(optimizer=keras.optimizers.Adam(2e-3), loss="sparse_categorical_crossentropy")
        model.fit(xt.astype(np.float32), yt, epochs=2, batch_size=32, verbose=0)
        return model

    return _cached("resnet_fewepochs_r255", train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("class",),
        "photo crops 48 0..255, Rescaling inside; ResNet-like 2 epochs, BN unsettled; 8 classes")


def act_mix_r255():
    """Rescaling(1/255); gelu, swish, hard-sigmoid SE gate, BN; 2-class softmax (photo parity)."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(40)

    def train():
        _seed(204)
        inp = keras.Input((40, 40, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        h = Ly.Activation("gelu")(Ly.BatchNormalization()(Ly.Conv2D(16, 3, 2, "same", use_bias=False)(h)))
        h = Ly.Activation("swish")(Ly.BatchNormalization()(Ly.Conv2D(32, 3, 2, "same", use_bias=False)(h)))
        se = Ly.GlobalAveragePooling2D(keepdims=True)(h)
        se = Ly.Conv2D(8, 1, activation="relu")(se)
        se = Ly.Conv2D(32, 1, activation="hard_sigmoid")(se)
        h = Ly.Multiply()([h, se])
        h = Ly.Activation("gelu")(Ly.BatchNormalization()(Ly.Conv2D(48, 3, 2, "same", use_bias=False)(h)))
        h = Ly.GlobalAveragePooling2D()(h)
        out = Ly.Dense(2, activation="softmax", name="parity")(h)
        return _fit(keras.Model(inp, out, name="act_mix_r255"), xt.astype(np.float32), yt % 2, 10,
                    "sparse_categorical_crossentropy")

    return _cached("act_mix_r255", train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("class",),
        "photo crops 40 0..255 Rescaling inside; gelu/swish/hard_sigmoid SE + BN; 2 classes")


def grid_50cls_r():
    """Blobs on a 5x10 grid, 0..255 input, Rescaling inside; strided convs + BN + GELU, no pool,
    Flatten; 50-class softmax."""
    import keras
    Ly = L()

    def data(n, seed):
        x, y, _ = _grid(n, seed)
        # map the 10x10 cell to a 5x10 label: rows pairwise merged
        y = (y // 10) // 2 * 10 + y % 10
        return np.clip(x * 200, 0, 255).astype(np.float32), y

    xt, yt = data(8000, TRAIN_SEED)

    def train():
        _seed(207)
        inp = keras.Input((32, 32, 1), name="gray255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        h = Ly.Activation("gelu")(Ly.BatchNormalization()(Ly.Conv2D(16, 3, 1, "same", use_bias=False)(h)))
        h = Ly.Activation("gelu")(Ly.BatchNormalization()(Ly.Conv2D(32, 3, 2, "same", use_bias=False)(h)))
        h = Ly.Activation("gelu")(Ly.BatchNormalization()(Ly.Conv2D(32, 3, 2, "same", use_bias=False)(h)))
        h = Ly.Flatten()(h)
        out = Ly.Dense(50, activation="softmax", name="cell")(h)
        return _fit(keras.Model(inp, out, name="grid_50cls_r"), xt, yt, 6,
                    "sparse_categorical_crossentropy", batch_size=64)

    return _cached("grid_50cls_r", train), ZooData(
        data(N_CAL, cal_seed())[0], data(N_EVAL, EVAL_SEED)[0], ("class",),
        "blobs 5x10 grid 32x32 0..255 Rescaling inside; strided conv+BN+gelu, Flatten; 50 classes")


def ae_flat():
    """Flat (not nested) autoencoder: conv+BN encoder, Dense code, Dense + Conv2DTranspose
    decoder without BN, sigmoid."""
    import keras
    Ly = L()
    xt, xc, xe = gray_sets(32, 4096)

    def train():
        _seed(214)
        inp = keras.Input((32, 32, 1), name="gray")
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(16, 3, 2, "same", use_bias=False)(inp)))
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(32, 3, 2, "same", use_bias=False)(h)))
        z = Ly.Dense(32, name="code")(Ly.Flatten()(h))
        g = Ly.Reshape((8, 8, 32))(Ly.Dense(8 * 8 * 32, activation="relu")(z))
        g = Ly.Conv2DTranspose(16, 3, 2, "same", activation="relu")(g)
        out = Ly.Conv2DTranspose(1, 3, 2, "same", activation="sigmoid", name="recon")(g)
        return _fit(keras.Model(inp, out, name="ae_flat"), xt, xt, 10, "mse")

    return _cached("ae_flat", train), ZooData(xc, xe, ("value",),
        "gray crops 32 [0,1]; flat autoencoder, BN in encoder only; Conv2DTranspose decoder")


def ae_bn_decoder():
    """Autoencoder with BN in the decoder too (Conv2DTranspose + BN + ReLU), sigmoid output."""
    import keras
    Ly = L()
    xt, xc, xe = gray_sets(32, 4096)

    def train():
        _seed(215)
        inp = keras.Input((32, 32, 1), name="gray")
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(16, 3, 2, "same", use_bias=False)(inp)))
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(32, 3, 2, "same", use_bias=False)(h)))
        z = Ly.Dense(32, name="code")(Ly.Flatten()(h))
        g = Ly.Reshape((8, 8, 32))(Ly.Dense(8 * 8 * 32, activation="relu")(z))
        g = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2DTranspose(16, 3, 2, "same", use_bias=False)(g)))
        out = Ly.Conv2DTranspose(1, 3, 2, "same", activation="sigmoid", name="recon")(g)
        return _fit(keras.Model(inp, out, name="ae_bn_decoder"), xt, xt, 10, "mse")

    return _cached("ae_bn_decoder", train), ZooData(xc, xe, ("value",),
        "gray crops 32 [0,1]; autoencoder with BN in encoder and decoder")


def bn_once_then_convs():
    """Rescaling to [-1,1]; ONE conv+BN+ReLU, then three convs+ReLU without BN; 8 softmax."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(40)

    def train():
        _seed(216)
        inp = keras.Input((40, 40, 3), name="rgb255")
        h = Ly.Rescaling(1 / 127.5, offset=-1)(inp)
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(16, 3, 1, "same", use_bias=False)(h)))
        for w in (24, 32, 48):
            h = Ly.Conv2D(w, 3, 2, "same", activation="relu")(h)
        h = Ly.GlobalAveragePooling2D()(h)
        out = Ly.Dense(8, activation="softmax", name="photo")(h)
        return _fit(keras.Model(inp, out, name="bn_once_then_convs"), xt.astype(np.float32), yt,
                    10, "sparse_categorical_crossentropy")

    return _cached("bn_once_then_convs", train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("class",),
        "photo crops 40 0..255 Rescaling to [-1,1]; one conv+BN, then 3 convs w/o BN; 8 classes")


def long_head_sigmoid():
    """Rescaling(1/255); conv+BN x3; GAP; Dense(64) -> Dense(32) -> Dense(16) relu; 1 sigmoid."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(40)

    def train():
        _seed(217)
        inp = keras.Input((40, 40, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        for w in (16, 32, 48):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(w, 3, 2, "same", use_bias=False)(h)))
        h = Ly.GlobalAveragePooling2D()(h)
        for w in (64, 32, 16):
            h = Ly.Dense(w, activation="relu")(h)
        out = Ly.Dense(1, activation="sigmoid", name="is_first_half")(h)
        return _fit(keras.Model(inp, out, name="long_head_sigmoid"), xt.astype(np.float32),
                    (yt < 4).astype(np.float32), 10, "binary_crossentropy")

    return _cached("long_head_sigmoid", train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("value",),
        "photo crops 40 0..255 Rescaling inside; conv+BN, GAP, 3 Dense; 1 sigmoid")


def layernorm_bn_r255():
    """Rescaling; conv+BN+relu, conv+LayerNorm+gelu, conv+BN+relu; 8 softmax."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(32)

    def train():
        _seed(218)
        inp = keras.Input((32, 32, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(16, 3, 2, "same", use_bias=False)(h)))
        h = Ly.Activation("gelu")(Ly.LayerNormalization()(Ly.Conv2D(32, 3, 2, "same")(h)))
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(48, 3, 2, "same", use_bias=False)(h)))
        h = Ly.GlobalAveragePooling2D()(h)
        out = Ly.Dense(8, activation="softmax", name="photo")(h)
        return _fit(keras.Model(inp, out, name="layernorm_bn_r255"), xt.astype(np.float32), yt,
                    10, "sparse_categorical_crossentropy")

    return _cached("layernorm_bn_r255", train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("class",),
        "photo crops 32 0..255 Rescaling inside; BN + LayerNorm + BN convs; 8 classes")


def video_r255():
    """Conv3D + BN clips as 0..255 with Rescaling(1/255) inside; 4 directions."""
    import keras
    Ly = L()

    def data(n, seed):
        x, y = _video(n, seed)
        return np.clip(x * 160 + 40, 0, 255).astype(np.float32), y

    xt, yt = data(3000, TRAIN_SEED)

    def train():
        _seed(210)
        inp = keras.Input((8, 16, 16, 1), name="clip255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv3D(8, 3, padding="same", use_bias=False)(h)))
        h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv3D(16, 3, strides=2, padding="same", use_bias=False)(h)))
        h = Ly.GlobalAveragePooling3D()(h)
        out = Ly.Dense(4, activation="softmax", name="direction")(h)
        return _fit(keras.Model(inp, out, name="video_r255"), xt, yt, 6,
                    "sparse_categorical_crossentropy")

    return _cached("video_r255", train), ZooData(
        data(N_CAL, cal_seed())[0], data(N_EVAL, EVAL_SEED)[0], ("class",),
        "synthetic clips 8x16x16 0..255, Rescaling inside; Conv3D + BN; 4 directions")


MODELS.update({f.__name__: f for f in [
    resnet_fewepochs_r255, act_mix_r255, grid_50cls_r, ae_flat, ae_bn_decoder,
    bn_once_then_convs, long_head_sigmoid, layernorm_bn_r255, video_r255]})


# ------------------------------------------------- extra 2: probing grid_50cls_r's no-data logits


def _grid_r(n, seed, rows_merge):
    x, y, _ = _grid(n, seed)
    if rows_merge:
        y = (y // 10) // 2 * 10 + y % 10
    return np.clip(x * 200, 0, 255).astype(np.float32), y


def _grid_r_model(name, classes, act, seed):
    import keras
    Ly = L()
    xt, yt = _grid_r(8000, TRAIN_SEED, classes == 50)

    def train():
        _seed(seed)
        inp = keras.Input((32, 32, 1), name="gray255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        h = Ly.Activation(act)(Ly.BatchNormalization()(Ly.Conv2D(16, 3, 1, "same", use_bias=False)(h)))
        h = Ly.Activation(act)(Ly.BatchNormalization()(Ly.Conv2D(32, 3, 2, "same", use_bias=False)(h)))
        h = Ly.Activation(act)(Ly.BatchNormalization()(Ly.Conv2D(32, 3, 2, "same", use_bias=False)(h)))
        h = Ly.Flatten()(h)
        out = Ly.Dense(classes, activation="softmax", name="cell")(h)
        return _fit(keras.Model(inp, out, name=name), xt, yt, 6,
                    "sparse_categorical_crossentropy", batch_size=64)

    return _cached(name, train), ZooData(
        _grid_r(N_CAL, cal_seed(), classes == 50)[0], _grid_r(N_EVAL, EVAL_SEED, classes == 50)[0],
        ("class",), f"blobs grid 32x32 0..255 Rescaling inside; strided conv+BN+{act}, Flatten; "
        f"{classes} classes")


def grid_50cls_relu_r():
    return _grid_r_model("grid_50cls_relu_r", 50, "relu", 307)


def grid_100cls_r():
    return _grid_r_model("grid_100cls_r", 100, "relu", 308)


def flatten_head_r255():
    """Photo crops, Rescaling(1/255), conv+BN+relu x3 strided, Flatten -> 8 softmax (no GAP)."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(32)

    def train():
        _seed(309)
        inp = keras.Input((32, 32, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        for w in (16, 32, 32):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(w, 3, 2, "same", use_bias=False)(h)))
        h = Ly.Flatten()(h)
        out = Ly.Dense(8, activation="softmax", name="photo")(h)
        return _fit(keras.Model(inp, out, name="flatten_head_r255"), xt.astype(np.float32), yt,
                    10, "sparse_categorical_crossentropy")

    return _cached("flatten_head_r255", train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("class",),
        "photo crops 32 0..255 Rescaling inside; conv+BN+relu x3, Flatten; 8 classes")


MODELS.update({f.__name__: f for f in [grid_50cls_relu_r, grid_100cls_r, flatten_head_r255]})


def build(name):
    global DRAW
    base, _, draw = name.partition("@")
    DRAW = int(draw or 0)
    return MODELS[base]()
