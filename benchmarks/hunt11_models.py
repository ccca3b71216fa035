"""hunt11: models built to hunt for cle's failures on kinds neither the zoo (zoo_models.py) nor
hunt7-10 tried, with zoo_models' interface, for ``bench_zoo.py --zoo hunt11_models``::

    nice -n 10 .venv/bin/python benchmarks/bench_zoo.py --zoo hunt11_models \
        --models aug_cnn birnn_signal --json /tmp/h11/hunt11.jsonl

``build(name) -> (model, ZooData)``; a name "base@k" (k = 1, 2, ...) is the same model with
another draw of 64 calibration inputs (hunt9's :func:`hunt9_models.cal_seed`; the held-out
inputs, 1000 generated ones, are the same). The data helpers are hunt9's and hunt8's (photo
crops, photo pairs, synthetic topic documents) and the zoo's synthetic signals; trained models
are cached beside the zoo's (:func:`zoo_models.cache_dir`, ``hunt11/``), keyed by the model's
name only. Written fast: what a new user might train in a minute, not tuned.

Kinds: data augmentation inside the model (a Sequential of RandomFlip, RandomRotation,
RandomZoom as the first block, as Keras' tutorials do) before Rescaling and a conv+BN net; a
Conv1D+BN stem then Bidirectional(LSTM(unroll=True)) and GRU(unroll=True) on signals; a
WaveNet-like gated TCN (causal dilated Conv1D, tanh x sigmoid Multiply, residual and skip
Adds, no BN); a siamese model whose SAME Conv/BN layers (not a nested model) are called on two
inputs, |a - b| (Subtract, keras.ops.abs) and a * b concatenated, one sigmoid; an RMSNorm
(LayerNormalization(rms_scaling=True)) block with keras.layers.Attention and
AdditiveAttention (and keras.layers.RMSNormalization); a signal denoiser with UpSampling1D
and a linear per-sample output; a one-sigmoid binary photo classifier without BN;
Embedding(mask_zero=True) + GRU(unroll=True) on integer tokens; per-timestep Dense on 3-D
inputs then BatchNormalization(axis=-1) and GlobalAveragePooling1D; a model with an extra
integer output (keras.ops.argmax of its softmax); Masking(0.0) + LSTM(unroll=True) on
zero-padded variable-length signals; grayscale crops through CenterCrop and a Sequential of
RandomTranslation and RandomContrast; a residual TCN (causal dilated Conv1D + BN, Add).
(A mixed-precision model, refused in both modes, is hunt9's mixed_f16.)
"""
from __future__ import annotations

import numpy as np

import hunts  # what the hunts after hunt9 share
import zoo_models as ZM  # the repository's zoo: data helpers, ZooData
import hunt8_models as H8  # hunt8's photo pairs
import hunt9_models as H9  # hunt9's data helpers and its draw of calibration inputs

ZooData = ZM.ZooData
Missing = ZM.Missing
_fit, _seed, _settle_bn = ZM._fit, ZM._seed, ZM._settle_bn
photo_sets, _conv_bn, _f32, L = H9.photo_sets, H9._conv_bn, H9._f32, H9.L
N_CAL, N_EVAL = H9.N_CAL, H9.N_EVAL
DRAW = 0  # set by build() (here and in hunt9_models, whose cal_seed() the data helpers read)
_cached = hunts.caches("hunt11")[0]


def _signal_sets(n_train=2048):
    """The zoo's noisy sines (256 x 1, 5 frequency bands): training, calibration, held out."""
    return (ZM._signals(n_train, H9.TRAIN_SEED), ZM._signals(N_CAL, H9.cal_seed()),
            ZM._signals(N_EVAL, H9.EVAL_SEED))


def _photo_cls(name, seed, body, epochs=8, lr=2e-3):
    """A photo classifier (crops 32 0..255, 8 classes): ``body(inp) -> features``, GAP if
    4-D, Dense(8, softmax)."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(32)

    def train():
        _seed(seed)
        inp = keras.Input((32, 32, 3), name="rgb255")
        h = body(inp)
        if len(h.shape) == 4:
            h = Ly.GlobalAveragePooling2D()(h)
        out = Ly.Dense(8, activation="softmax", name="photo")(h)
        return _fit(keras.Model(inp, out, name=name), _f32(xt), yt, epochs,
                    "sparse_categorical_crossentropy", lr=lr)

    return _cached(name, train), _f32(xc), _f32(xe)


# ------------------------------------------------------------------------------- the models


def aug_cnn():
    """Keras' tutorial form: keras.Sequential([RandomFlip("horizontal"), RandomRotation(0.1),
    RandomZoom(0.1)]) as the first block (identity at inference), Rescaling(1/255), conv+BN+relu
    x3 (stride 2), GAP, 8 photo classes."""
    import keras
    Ly = L()

    def body(inp):
        aug = keras.Sequential([Ly.RandomFlip("horizontal"), Ly.RandomRotation(0.1),
                                Ly.RandomZoom(0.1)], name="augment")
        h = Ly.Rescaling(1 / 255.0)(aug(inp))
        for w in (16, 32, 48):
            h = _conv_bn(h, w, 2)
        return h

    model, xc, xe = _photo_cls("aug_cnn", 1101, body, epochs=8)
    return model, ZooData(xc, xe, ("class",), "photo crops 32 0..255; Sequential(RandomFlip, "
                          "RandomRotation, RandomZoom) inside, Rescaling, conv+BN; 8 classes")


def birnn_signal():
    """Signals 256 x 1: Conv1D(16, 8, stride 8)+BN+relu (32 steps), Bidirectional(LSTM(16,
    unroll=True, return_sequences=True)), GRU(16, unroll=True), Dense(5, softmax)."""
    import keras
    Ly = L()
    (xt, yt), (xc, _), (xe, _) = _signal_sets()

    def train():
        _seed(1102)
        inp = keras.Input((256, 1), name="signal")
        h = Ly.Conv1D(16, 8, strides=8, use_bias=False)(inp)
        h = Ly.ReLU()(Ly.BatchNormalization()(h))
        h = Ly.Bidirectional(Ly.LSTM(16, unroll=True, return_sequences=True))(h)
        h = Ly.GRU(16, unroll=True)(h)
        out = Ly.Dense(5, activation="softmax", name="band")(h)
        return _fit(keras.Model(inp, out, name="birnn_signal"), xt, yt, 8,
                    "sparse_categorical_crossentropy")

    return _cached("birnn_signal", train), ZooData(
        xc, xe, ("class",), "synthetic sines 256, 5 bands; Conv1D+BN stem, "
        "Bidirectional(LSTM unroll), GRU unroll")


def wavenet_gated():
    """A WaveNet-like classifier, no BN: Conv1D(16, 1), five blocks of causal dilated Conv1D
    (dilation 1..16) tanh x sigmoid (Multiply), a 1x1 residual Add and a 1x1 skip, the skips
    summed, relu, Conv1D(16, 1, relu), GAP1D, 5 bands."""
    import keras
    Ly = L()
    (xt, yt), (xc, _), (xe, _) = _signal_sets()

    def train():
        _seed(1103)
        inp = keras.Input((256, 1), name="signal")
        h = Ly.Conv1D(16, 1)(inp)
        skips = []
        for d in (1, 2, 4, 8, 16):
            t = Ly.Conv1D(16, 2, padding="causal", dilation_rate=d, activation="tanh")(h)
            s = Ly.Conv1D(16, 2, padding="causal", dilation_rate=d, activation="sigmoid")(h)
            z = Ly.Multiply()([t, s])
            h = Ly.Add()([h, Ly.Conv1D(16, 1)(z)])
            skips.append(Ly.Conv1D(16, 1)(z))
        h = Ly.Conv1D(16, 1, activation="relu")(Ly.ReLU()(Ly.Add()(skips)))
        out = Ly.Dense(5, activation="softmax", name="band")(Ly.GlobalAveragePooling1D()(h))
        return _fit(keras.Model(inp, out, name="wavenet_gated"), xt, yt, 8,
                    "sparse_categorical_crossentropy")

    return _cached("wavenet_gated", train), ZooData(
        xc, xe, ("class",), "synthetic sines 256, 5 bands; gated causal dilated Conv1D "
        "(tanh x sigmoid), residual + skip Adds, no BN")


def siamese_absdiff():
    """Two photo crops 32 0..255 (hunt8's pairs: same photo or not); the SAME layers
    (Rescaling, Conv2D+BN+relu x3, GAP: one set of layer objects, no nested model) called on
    each; Concatenate(|a - b| (Subtract, keras.ops.abs), a * b), Dense(16, relu), Dense(1,
    sigmoid)."""
    import keras
    Ly = L()
    xt, yt = H8._pairs(2048, H9.TRAIN_SEED)

    def train():
        _seed(1104)
        layers = [Ly.Rescaling(1 / 255.0)]
        for w in (16, 32, 48):
            layers += [Ly.Conv2D(w, 3, 2, "same", use_bias=False), Ly.BatchNormalization(),
                       Ly.ReLU()]
        layers.append(Ly.GlobalAveragePooling2D())

        def tower(x):
            for la in layers:
                x = la(x)
            return x

        a, b = keras.Input((32, 32, 3), name="left"), keras.Input((32, 32, 3), name="right")
        fa, fb = tower(a), tower(b)
        d = keras.ops.abs(Ly.Subtract()([fa, fb]))
        h = Ly.Concatenate()([d, Ly.Multiply()([fa, fb])])
        out = Ly.Dense(1, activation="sigmoid", name="same")(Ly.Dense(16, activation="relu")(h))
        return _fit(keras.Model([a, b], out, name="siamese_absdiff"), xt, yt, 10,
                    "binary_crossentropy")

    return _cached("siamese_absdiff", train), ZooData(
        H8._pairs(N_CAL, H9.cal_seed())[0], H8._pairs(N_EVAL, H9.EVAL_SEED)[0], ("value",),
        "two photo crops 32 0..255 through the same Conv/BN layers; |a-b| (ops.abs) and a*b; "
        "one sigmoid (same photo)")


def rms_attention():
    """Signals 256 x 1 in 32 patches of 8 (Conv1D(32, 8, stride 8)); RMSNorm
    (LayerNormalization(rms_scaling=True), deprecated in Keras 3.10 but in users' code), q, k, v
    Dense, keras.layers.Attention(use_scale), Dense, residual Add; keras.layers.RMSNormalization,
    Dense(64, relu), Dense(32), Add; AdditiveAttention (self),
    GAP1D, 5 bands."""
    import keras
    Ly = L()
    (xt, yt), (xc, _), (xe, _) = _signal_sets()

    def train():
        _seed(1105)
        inp = keras.Input((256, 1), name="signal")
        h = Ly.Conv1D(32, 8, strides=8)(inp)
        n = Ly.LayerNormalization(rms_scaling=True)(h)
        q, k, v = Ly.Dense(32)(n), Ly.Dense(32)(n), Ly.Dense(32)(n)
        a = Ly.Attention(use_scale=True)([q, v, k])
        h = Ly.Add()([h, Ly.Dense(32)(a)])
        n = Ly.RMSNormalization()(h)
        h = Ly.Add()([h, Ly.Dense(32)(Ly.Dense(64, activation="relu")(n))])
        h = Ly.AdditiveAttention()([h, h])
        out = Ly.Dense(5, activation="softmax", name="band")(Ly.GlobalAveragePooling1D()(h))
        return _fit(keras.Model(inp, out, name="rms_attention"), xt, yt, 10,
                    "sparse_categorical_crossentropy", lr=1e-3)

    return _cached("rms_attention", train), ZooData(
        xc, xe, ("class",), "synthetic sines 256, 5 bands; Conv1D patches, RMSNorm, "
        "layers.Attention, AdditiveAttention; no BN")


def _noisy_clean(n, seed, length=256):
    """Sums of two sines (random frequencies 2-12 cycles, amplitudes 0.3-1.5) and the same
    with white noise (sigma 0.1-0.5): ``(noisy (n, 256, 1), clean (n, 256, 1))``."""
    rng = np.random.default_rng(seed)
    t = np.arange(length) / length
    clean = np.zeros((n, length))
    for _ in range(2):
        clean += rng.uniform(0.3, 1.5, (n, 1)) * np.sin(
            2 * np.pi * rng.uniform(2, 12, (n, 1)) * t + rng.uniform(0, 2 * np.pi, (n, 1)))
    noisy = clean + rng.normal(0, 1, (n, length)) * rng.uniform(0.1, 0.5, (n, 1))
    return noisy[..., None].astype(np.float32), clean[..., None].astype(np.float32)


def upsample1d_denoise():
    """Noisy sums of sines 256 x 1 -> Conv1D stride 2 + BN + relu x2, UpSampling1D(2) +
    Conv1D + BN + relu x2, Concatenate with the input, Conv1D(1, 5) linear: the clean signal."""
    import keras
    Ly = L()
    xt, yt = _noisy_clean(2048, H9.TRAIN_SEED)

    def train():
        _seed(1106)
        inp = keras.Input((256, 1), name="noisy")
        h = inp
        for w in (16, 32):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv1D(w, 5, 2, "same", use_bias=False)(h)))
        for w in (32, 16):
            h = Ly.UpSampling1D(2)(h)
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv1D(w, 5, padding="same",
                                                            use_bias=False)(h)))
        out = Ly.Conv1D(1, 5, padding="same", name="clean")(Ly.Concatenate()([h, inp]))
        return _fit(keras.Model(inp, out, name="upsample1d_denoise"), xt, yt, 10, "mse")

    return _cached("upsample1d_denoise", train), ZooData(
        _noisy_clean(N_CAL, H9.cal_seed())[0], _noisy_clean(N_EVAL, H9.EVAL_SEED)[0],
        ("value",), "noisy sums of two sines 256; Conv1D stride 2 + BN, UpSampling1D, "
        "Concatenate input; linear clean signal")


def sigmoid_nobn():
    """A binary photo classifier without BN: Rescaling, Conv2D(relu) x3 stride 2, GAP,
    Dense(16, relu), Dense(1, sigmoid): is the crop from photos 0-3 (vs 4-7)."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(32)

    def train():
        _seed(1107)
        inp = keras.Input((32, 32, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        for w in (16, 32, 48):
            h = Ly.Conv2D(w, 3, 2, "same", activation="relu")(h)
        h = Ly.Dense(16, activation="relu")(Ly.GlobalAveragePooling2D()(h))
        out = Ly.Dense(1, activation="sigmoid", name="first_half")(h)
        return _fit(keras.Model(inp, out, name="sigmoid_nobn"), _f32(xt),
                    (yt < 4).astype(np.float32), 10, "binary_crossentropy")

    return _cached("sigmoid_nobn", train), ZooData(
        _f32(xc), _f32(xe), ("value",), "photo crops 32 0..255 Rescaling; Conv2D(relu) x3, no "
        "BN; Dense(1, sigmoid) photos 0-3 vs 4-7")


def masked_gru_text():
    """Integer tokens (int32, 0 = padding, vocabulary 1000, length 48) -> Embedding(32,
    mask_zero=True) -> GRU(32, unroll=True) (the mask skips the padding) -> Dense(6,
    softmax)."""
    import keras
    Ly = L()
    xt, yt = H9._documents(4000, H9.TRAIN_SEED)

    def train():
        _seed(1108)
        inp = keras.Input((H9.SEQ,), dtype="int32", name="tokens")
        h = Ly.Embedding(H9.VOCAB, 32, mask_zero=True)(inp)
        h = Ly.GRU(32, unroll=True)(h)
        out = Ly.Dense(H9.TOPICS, activation="softmax", name="topic")(h)
        return _fit(keras.Model(inp, out, name="masked_gru_text"), xt, yt, 5,
                    "sparse_categorical_crossentropy")

    return _cached("masked_gru_text", train), ZooData(
        H9._documents(N_CAL, H9.cal_seed())[0], H9._documents(N_EVAL, H9.EVAL_SEED)[0],
        ("class",), "synthetic topic documents, int32 tokens; Embedding(mask_zero), "
        "GRU(unroll); 6 topics")


def dense3d_bn():
    """Signals 256 x 1 as 32 frames of 8 (Reshape); per-frame Dense(32, no bias) + BN(axis=-1)
    + relu, Dense(32) + BN + relu (Dense on 3-D inputs), GAP1D, 5 bands."""
    import keras
    Ly = L()
    (xt, yt), (xc, _), (xe, _) = _signal_sets()

    def train():
        _seed(1109)
        inp = keras.Input((256, 1), name="signal")
        h = Ly.Reshape((32, 8))(inp)
        h = Ly.ReLU()(Ly.BatchNormalization(axis=-1)(Ly.Dense(32, use_bias=False)(h)))
        h = Ly.ReLU()(Ly.BatchNormalization(axis=-1)(Ly.Dense(32)(h)))
        out = Ly.Dense(5, activation="softmax", name="band")(Ly.GlobalAveragePooling1D()(h))
        return _fit(keras.Model(inp, out, name="dense3d_bn"), xt, yt, 10,
                    "sparse_categorical_crossentropy")

    return _cached("dense3d_bn", train), ZooData(
        xc, xe, ("class",), "synthetic sines 256 as 32 x 8 frames; per-frame Dense + "
        "BN(axis=-1), GAP1D; 5 bands")


def argmax_extra():
    """A photo classifier (Rescaling, conv+BN+relu x3, GAP, Dense(8, softmax)) kept with a
    second output: keras.ops.argmax of its softmax (int), the label a user ships."""
    import keras
    Ly = L()
    (xt, yt, _), (xc, _, _), (xe, _, _) = photo_sets(32)

    def train():
        _seed(1110)
        inp = keras.Input((32, 32, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        for w in (16, 32, 48):
            h = _conv_bn(h, w, 2)
        probs = Ly.Dense(8, activation="softmax", name="photo")(Ly.GlobalAveragePooling2D()(h))
        _fit(keras.Model(inp, probs), _f32(xt), yt, 8, "sparse_categorical_crossentropy")
        label = keras.ops.argmax(probs, axis=-1)
        return keras.Model(inp, [probs, label], name="argmax_extra")

    return _cached("argmax_extra", train), ZooData(
        _f32(xc), _f32(xe), ("class", "value"), "photo crops 32 0..255; conv+BN; softmax "
        "and its argmax (int) as a second output")


def _padded_signals(n, seed):
    """The zoo's noisy sines cut to a random length of 96..256 samples and padded with
    zeros at the end (a batch of variable-length recordings): ``(x (n, 256, 1), band)``."""
    x, y = ZM._signals(n, seed)
    rng = np.random.default_rng(seed + 17)
    lengths = rng.integers(96, 257, size=n)
    x = x.copy()
    for i, k in enumerate(lengths):
        x[i, k:] = 0.0
    return x, y


def masking_lstm():
    """Variable-length signals padded with zeros at the end: Masking(0.0), Conv-free
    LSTM(24, unroll=True) over 64 steps of 4 samples (Reshape first, the mask then on
    every 4-sample frame), Dense(5, softmax)."""
    import keras
    Ly = L()
    xt, yt = _padded_signals(2048, H9.TRAIN_SEED)

    def train():
        _seed(1112)
        inp = keras.Input((256, 1), name="signal")
        h = Ly.Masking(0.0)(Ly.Reshape((64, 4))(inp))
        h = Ly.LSTM(24, unroll=True)(h)
        out = Ly.Dense(5, activation="softmax", name="band")(h)
        return _fit(keras.Model(inp, out, name="masking_lstm"), xt, yt, 10,
                    "sparse_categorical_crossentropy", lr=3e-3)

    return _cached("masking_lstm", train), ZooData(
        _padded_signals(N_CAL, H9.cal_seed())[0], _padded_signals(N_EVAL, H9.EVAL_SEED)[0],
        ("class",), "synthetic sines cut to 96..256 samples, zero-padded; Masking(0.0), "
        "LSTM(unroll) over 64 frames of 4; 5 bands")


def _gray255(n, seed):
    """hunt8's labelled grayscale crops (40 x 40, 10 scikit-image pictures) as 0..255 (hunt8's
    are 0..1)."""
    x, y = H8._gray_labelled(n, seed, 40)
    return x * np.float32(255.0), y


def gray_centercrop_aug():
    """Grayscale crops 40 x 40 0..255 (hunt8's, 10 scikit-image pictures): CenterCrop(32, 32),
    then a Sequential of RandomTranslation(0.1, 0.1) and RandomContrast(0.2) (identity at
    inference), Rescaling(1/255), conv+BN+relu x3 (stride 2), GAP, 10 classes."""
    import keras
    Ly = L()
    xt, yt = _gray255(2048, H9.TRAIN_SEED)

    def train():
        _seed(1113)
        inp = keras.Input((40, 40, 1), name="gray255")
        h = Ly.CenterCrop(32, 32)(inp)
        h = keras.Sequential([Ly.RandomTranslation(0.1, 0.1), Ly.RandomContrast(0.2)],
                             name="augment")(h)
        h = Ly.Rescaling(1 / 255.0)(h)
        for w in (16, 32, 48):
            h = _conv_bn(h, w, 2)
        out = Ly.Dense(10, activation="softmax", name="picture")(Ly.GlobalAveragePooling2D()(h))
        return _fit(keras.Model(inp, out, name="gray_centercrop_aug"), xt, yt, 8,
                    "sparse_categorical_crossentropy")

    return _cached("gray_centercrop_aug", train), ZooData(
        _gray255(N_CAL, H9.cal_seed())[0], _gray255(N_EVAL, H9.EVAL_SEED)[0], ("class",),
        "gray crops 40 0..255; CenterCrop 32, Sequential(RandomTranslation, RandomContrast), "
        "Rescaling, conv+BN; 10 pictures")


def tcn_residual():
    """A TCN: Conv1D(24, 1) then four residual blocks of two causal dilated Conv1D(24, 3)
    (dilations 1, 2, 4, 8) with BN + relu, Add with the block's input; GAP1D, 5 bands."""
    import keras
    Ly = L()
    (xt, yt), (xc, _), (xe, _) = _signal_sets()

    def train():
        _seed(1114)
        inp = keras.Input((256, 1), name="signal")
        h = Ly.Conv1D(24, 1)(inp)
        for d in (1, 2, 4, 8):
            r = h
            for _ in range(2):
                r = Ly.Conv1D(24, 3, padding="causal", dilation_rate=d, use_bias=False)(r)
                r = Ly.ReLU()(Ly.BatchNormalization()(r))
            h = Ly.Add()([h, r])
        out = Ly.Dense(5, activation="softmax", name="band")(Ly.GlobalAveragePooling1D()(h))
        return _fit(keras.Model(inp, out, name="tcn_residual"), xt, yt, 6,
                    "sparse_categorical_crossentropy")

    return _cached("tcn_residual", train), ZooData(
        xc, xe, ("class",), "synthetic sines 256, 5 bands; causal dilated Conv1D + BN + relu "
        "in residual blocks (Add)")


MODELS = {f.__name__: f for f in [
    aug_cnn, birnn_signal, wavenet_gated, siamese_absdiff, rms_attention, upsample1d_denoise,
    sigmoid_nobn, masked_gru_text, dense3d_bn, argmax_extra, masking_lstm,
    gray_centercrop_aug, tcn_residual]}


build = hunts.builder(MODELS, __name__)
