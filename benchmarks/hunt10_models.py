"""hunt10: held-out checks of cle.quantize's stable softplus / mish / log-sigmoid / SELU
(:class:`cle.layers.StableActivation`) on models trained for them, with zoo_models' interface,
for ``bench_zoo.py --zoo hunt10_models``::

    nice -n 10 .venv/bin/python benchmarks/bench_zoo.py --zoo hunt10_models \
        --json /tmp/h10/hunt10.jsonl

``build(name) -> (model, ZooData)``; a name "base@k" (k = 1, 2, ...) is the same model with
another draw of 64 calibration inputs (hunt9's :func:`hunt9_models.cal_seed`; the held-out
inputs, 1000 photo crops or 192 / 150 of a fixed sklearn set, are the same). The data helpers
are hunt9's (photo_sets, _squares, _tab_split, _conv_bn); trained models are cached beside the
zoo's (:func:`zoo_models.cache_dir`, ``hunt10/``), keyed by the model's name only, so checkouts
of cle before and after a change measure the same weights. Written fast: what a new user might
train in a minute, not tuned.

Kinds: a positive rate regression ending in ``Dense(1, activation="softplus")`` on photo crops
(5 + 40 x mean luminance, Poisson loss); a self-normalizing tabular MLP (Normalization adapted
on the training rows, Dense + SELU with lecun_normal, AlphaDropout) on sklearn digits, 10
classes (and with one scalar Normalization: selu_mlp_scalar); a YOLO-like grid detector
with a mish backbone (BN then Activation("mish"), and a Conv2D(activation="mish") followed
by BN) and two outputs, per-cell sigmoid objectness and
linear box (offsets in the cell, sizes in cells); a mean and a standard deviation
(``Dense(1, activation="softplus")``, about 50) trained with a Gaussian negative log likelihood
on sklearn diabetes; a SELU conv net without batch norm (conv activation="selu", lecun_normal,
one Activation("selu") layer), 8 photo classes. Every model above is refused without data
(a regression output, or no batch norm); mish_softplus_cls (mish backbone with BN, a hidden
Dense(softplus), 8 photo classes) is one cle takes without data.
"""
from __future__ import annotations

import numpy as np

import hunts  # what the hunts after hunt9 share
import zoo_models as ZM  # the repository's zoo: data helpers, ZooData
import hunt9_models as H9  # hunt9's data helpers and its draw of calibration inputs

ZooData = ZM.ZooData
Missing = ZM.Missing
_fit, _seed = ZM._fit, ZM._seed
photo_sets, _squares, _tab_split, _conv_bn, _f32, _lum, L = (
    H9.photo_sets, H9._squares, H9._tab_split, H9._conv_bn, H9._f32, H9._lum, H9.L)
N_CAL, N_EVAL = H9.N_CAL, H9.N_EVAL
DRAW = 0  # set by build() (here and in hunt9_models, whose cal_seed() the data helpers read)
_cached = hunts.caches("hunt10")[0]


# ------------------------------------------------------------------------------- the models


def _rate(images):
    """A positive count-like rate per crop: 5 + 40 x its mean luminance in [0, 1] (5..45)."""
    return (5.0 + 40.0 * _lum(images).mean((1, 2)) / 255.0)[:, None].astype(np.float32)


def softplus_rate():
    """Photo crops 32 0..255, Rescaling, conv+BN+relu x3 (stride 2), GAP, Dense(32, relu),
    Dense(1, softplus): a positive rate 5..45 (Poisson loss); the softplus's pre-activation
    is the rate itself (exp of up to ~45 in the converter's form)."""
    import keras
    Ly = L()
    (xt, _, _), (xc, _, _), (xe, _, _) = photo_sets(32)

    def train():
        _seed(1001)
        inp = keras.Input((32, 32, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        for w in (16, 32, 48):
            h = _conv_bn(h, w, 2)
        h = Ly.Dense(32, activation="relu")(Ly.GlobalAveragePooling2D()(h))
        dense = Ly.Dense(1, activation="softplus", name="rate")
        model = keras.Model(inp, dense(h), name="softplus_rate")
        yt = _rate(xt)
        dense.bias.assign([float(yt.mean())])
        return _fit(model, _f32(xt), yt, 12, "poisson", lr=2e-3)

    return _cached("softplus_rate", train), ZooData(
        _f32(xc), _f32(xe), ("value",),
        "photo crops 32 0..255 Rescaling; conv+BN+relu, GAP; Dense(1, softplus) rate "
        "5 + 40 x mean luminance (Poisson loss)")


def _selu_mlp(name, seed, axis, says):
    """A self-normalizing MLP on sklearn digits (64 raw features 0..16): Normalization(axis)
    adapted on the training rows, Dense(128) + SELU (lecun_normal), AlphaDropout(0.05),
    Dense(64) + SELU, Dense(10, softmax); no BN, no conv."""
    import keras
    from sklearn.datasets import load_digits
    Ly = L()
    x, y = load_digits(return_X_y=True)
    (xt, xc, xe), ((yt, _, _),) = _tab_split(x.astype(np.float32), y.astype(np.int64))

    def train():
        _seed(seed)
        inp = keras.Input((64,), name="pixels")
        norm = Ly.Normalization(axis=axis)
        norm.adapt(xt)
        h = norm(inp)
        h = Ly.Dense(128, activation="selu", kernel_initializer="lecun_normal")(h)
        h = Ly.AlphaDropout(0.05)(h)
        h = Ly.Dense(64, activation="selu", kernel_initializer="lecun_normal")(h)
        out = Ly.Dense(10, activation="softmax", name="digit")(h)
        return _fit(keras.Model(inp, out, name=name), xt, yt, 40,
                    "sparse_categorical_crossentropy", lr=1e-3)

    return _cached(name, train), ZooData(
        xc, xe, ("class",), f"sklearn digits 64 raw features (192 held out); {says} adapted, "
        "Dense + SELU (lecun_normal), AlphaDropout; 10 classes")


def selu_mlp():
    """:func:`_selu_mlp` with a per-feature Normalization: its three constant-zero columns get
    a scale of 1/epsilon = 1e7, which TF Lite's converter holds on one int8 scale with the
    others (39,216 per step), every other feature's scale then 0."""
    return _selu_mlp("selu_mlp", 1002, -1, "Normalization")


def selu_mlp_scalar():
    """:func:`_selu_mlp` with one mean and variance over every pixel (Normalization(axis=None)):
    it isolates the SELUs from selu_mlp's scales."""
    return _selu_mlp("selu_mlp_scalar", 1006, None, "Normalization(axis=None)")


def _grid_targets(t):
    """hunt9's raw 4x4x8 square targets as (objectness 0/1, box: offsets y, x in the cell 0..1,
    height and width in cells 0.5..2)."""
    obj = (t[..., :1] > 0).astype(np.float32)
    box = np.concatenate([t[..., 1:3], t[..., 3:5] / 8.0], -1) * obj
    return obj, box.astype(np.float32)


def _mish_stem(Ly, inp):
    """Rescaling, conv+BN+mish (BN then Activation("mish")) stride 2, a
    Conv2D(activation="mish") then BN, conv+BN+mish stride 2: mish_grid's and
    mish_softplus_cls's backbone."""
    h = Ly.Rescaling(1 / 255.0)(inp)
    h = _conv_bn(h, 16, 2, "mish")
    h = Ly.BatchNormalization()(Ly.Conv2D(32, 3, 2, "same", activation="mish")(h))
    return _conv_bn(h, 48, 2, "mish")


def mish_grid():
    """A YOLO-like detector on photo crops 32 0..255 with one coloured square (hunt9's
    _squares): Rescaling, conv+BN+mish (BN then Activation("mish")) stride 2, a
    Conv2D(activation="mish") then BN, conv+BN+mish x2; two heads on the 4x4 grid, objectness
    Conv2D(1, sigmoid) and box Conv2D(4) linear (offsets in the cell, sizes in cells)."""
    import keras
    Ly = L()
    xt, tt = _squares(2048, H9.TRAIN_SEED)
    obj, box = _grid_targets(tt)

    def train():
        _seed(1003)
        inp = keras.Input((32, 32, 3), name="rgb255")
        h = _mish_stem(Ly, inp)
        h = _conv_bn(h, 48, 1, "mish")
        o = Ly.Conv2D(1, 1, activation="sigmoid", name="objectness")(h)
        b = Ly.Conv2D(4, 1, name="box")(h)
        model = keras.Model(inp, [o, b], name="mish_grid")
        model.compile(optimizer=keras.optimizers.Adam(2e-3),
                      loss=["binary_crossentropy", "mse"], loss_weights=[1.0, 4.0])
        model.fit(xt, [obj, box], epochs=15, batch_size=32, verbose=0, shuffle=True)
        return ZM._settle_bn(model, xt)

    return _cached("mish_grid", train), ZooData(
        _squares(N_CAL, H9.cal_seed())[0], _squares(N_EVAL, H9.EVAL_SEED)[0],
        ("value", "value"),
        "photo crops 32 0..255 + a coloured square; conv+BN+mish; 4x4 grid: sigmoid "
        "objectness, linear box (offsets, sizes in cells)")


def softplus_var():
    """Diabetes (sklearn, raw features ~0.05, target 25-346): Dense(64, relu), Dense(32,
    relu), a mean Dense(1) linear and a standard deviation Dense(1, softplus) (~50: its
    pre-activation is the deviation itself), trained with the Gaussian negative log
    likelihood on the pair (a training model concatenating them; the one kept has two
    outputs)."""
    import keras
    from sklearn.datasets import load_diabetes
    Ly = L()
    x, y = load_diabetes(return_X_y=True)
    (xt, xc, xe), ((yt, _, _),) = _tab_split(x.astype(np.float32),
                                             y.astype(np.float32)[:, None], n_eval=150)

    def train():
        _seed(1004)
        inp = keras.Input((10,), name="features")
        h = Ly.Dense(32, activation="relu")(Ly.Dense(64, activation="relu")(inp))
        mean_d = Ly.Dense(1, name="mean")
        std_d = Ly.Dense(1, activation="softplus", name="std")
        mean, std = mean_d(h), std_d(h)
        mean_d.bias.assign([float(yt.mean())])
        std_d.bias.assign([float(yt.std())])  # softplus(77) ~ 77
        model = keras.Model(inp, [mean, std], name="softplus_var")
        trainer = keras.Model(inp, Ly.Concatenate()([mean, std]))

        def nll(y_true, y_pred):
            ops = keras.ops
            mu, sd = y_pred[:, :1], ops.maximum(y_pred[:, 1:], 1e-3)
            return ops.mean(ops.log(sd) + 0.5 * ops.square((y_true - mu) / sd))

        trainer.compile(optimizer=keras.optimizers.Adam(5e-3), loss=nll)
        trainer.fit(xt, yt, epochs=200, batch_size=16, verbose=0, shuffle=True)
        return model

    return _cached("softplus_var", train), ZooData(
        xc, xe, ("value", "value"), "sklearn diabetes raw features (150 held out); "
        "Dense+relu; mean (linear) and std Dense(1, softplus) ~50, Gaussian NLL")


def selu_conv_nobn():
    """A SELU conv net without batch norm: Rescaling to [-1, 1], Conv2D(activation="selu",
    lecun_normal) x3 (stride 2), Conv2D then Activation("selu"), GAP, 8 photo classes."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(32)

    def train():
        _seed(1005)
        inp = keras.Input((32, 32, 3), name="rgb255")
        h = Ly.Rescaling(1 / 127.5, offset=-1.0)(inp)
        for w in (16, 32, 48):
            h = Ly.Conv2D(w, 3, 2, "same", activation="selu",
                          kernel_initializer="lecun_normal")(h)
        h = Ly.Activation("selu")(Ly.Conv2D(64, 3, 1, "same",
                                            kernel_initializer="lecun_normal")(h))
        out = Ly.Dense(8, activation="softmax", name="photo")(Ly.GlobalAveragePooling2D()(h))
        return _fit(keras.Model(inp, out, name="selu_conv_nobn"), _f32(xt), yt, 10,
                    "sparse_categorical_crossentropy", lr=1e-3)

    return _cached("selu_conv_nobn", train), ZooData(
        _f32(xc), _f32(xe), ("class",),
        "photo crops 32 0..255 Rescaling [-1,1]; Conv2D + SELU (lecun_normal), no BN; "
        "8 classes")


def mish_softplus_cls():
    """A photo classifier that cle takes without data too (batch norms, one class output):
    conv+BN+mish (BN then Activation("mish")) stride 2, Conv2D(activation="mish") then BN,
    conv+BN+mish, GAP, a hidden Dense(32, activation="softplus"), 8 classes; photo crops 32
    0..255, Rescaling inside."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(32)

    def train():
        _seed(1007)
        inp = keras.Input((32, 32, 3), name="rgb255")
        h = _mish_stem(Ly, inp)
        h = Ly.Dense(32, activation="softplus")(Ly.GlobalAveragePooling2D()(h))
        out = Ly.Dense(8, activation="softmax", name="photo")(h)
        return _fit(keras.Model(inp, out, name="mish_softplus_cls"), _f32(xt), yt, 8,
                    "sparse_categorical_crossentropy")

    return _cached("mish_softplus_cls", train), ZooData(
        _f32(xc), _f32(xe), ("class",),
        "photo crops 32 0..255 Rescaling; conv+BN+mish, Conv2D(mish)+BN; GAP, Dense(32, "
        "softplus); 8 classes")


MODELS = {f.__name__: f for f in [
    softplus_rate, selu_mlp, selu_mlp_scalar, mish_grid, softplus_var, selu_conv_nobn,
    mish_softplus_cls]}


build = hunts.builder(MODELS, __name__)
