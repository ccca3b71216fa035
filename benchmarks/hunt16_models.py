"""hunt16: models built to hunt for cle's failures on kinds neither the zoo (zoo_models.py) nor
hunt7-15 tried, with zoo_models' interface, for ``bench_zoo.py --zoo hunt16_models``::

    nice -n 5 .venv/bin/python benchmarks/bench_zoo.py --zoo hunt16_models \
        --models convlstm_clips --modes data nodata --json /tmp/h16/convlstm_clips.json

``build(name) -> (model, ZooData)``; a name "base@k" (k = 1, 2, ...) is the same model with
another draw of 64 calibration inputs (hunt9's :func:`hunt9_models.cal_seed`; the held-out
inputs, 1000 generated ones, are the same). The data helpers are hunt9's and hunt8's (clips of
a window moving over a gray picture, labelled gray crops, photo crops, topic documents) and the
zoo's noisy sines; trained models are cached beside the zoo's (:func:`zoo_models.cache_dir`,
``hunt16/``), keyed by the model's name only; models with a custom layer keep their weights
only (``.weights.h5``) and are rebuilt in code. Written fast: what a new user might train in a
minute, not tuned.

Kinds: a ConvLSTM2D video classifier (unroll=True) with a BatchNormalization after it, and the
same weights in a ConvLSTM2D left rolled (its default); a RegNetX-002 built by hand after
Keras 2's keras.applications.RegNetX002 (Keras 3.15 has no RegNet): X blocks of 1x1 conv + BN,
3x3 GROUPED conv (group width 8, up to 46 groups) + BN, 1x1 conv + BN, projection shortcuts;
a GAN-style discriminator of keras.layers.SpectralNormalization-wrapped Conv2D / Dense with
LeakyReLU, no BN, sigmoid; a seq2seq LSTM autoencoder (LSTM encoder -> RepeatVector -> LSTM
decoder -> TimeDistributed(Dense(1))); TimeDistributed(Conv2D) + TimeDistributed(BN) +
TimeDistributed(ReLU) over a burst of frames, pooled over time by GlobalAveragePooling1D; a
keras.io-style text transformer (a custom TokenAndPositionEmbedding layer: an Embedding of
tokens plus an Embedding of keras.ops.arange positions; MultiHeadAttention, LayerNorm, gelu
FFN).
"""
from __future__ import annotations

import numpy as np

import hunts  # what the hunts after hunt9 share
import zoo_models as ZM  # the repository's zoo: data helpers, ZooData
import hunt9_models as H9  # hunt9's data helpers and its draw of calibration inputs
import hunt8_models as H8  # hunt8's labelled gray crops
import hunt14_models as H14  # its photo data helper

ZooData = ZM.ZooData
Missing = ZM.Missing
_fit, _seed, _settle_bn = ZM._fit, ZM._seed, ZM._settle_bn
_f32, L = H9._f32, H9.L
N_CAL, N_EVAL = H9.N_CAL, H9.N_EVAL
_photo_data = H14._photo_data
DRAW = 0  # set by build() (here and in hunt9_models / hunt8_models, whose cal_seed() is read)
_cached, _cached_weights = hunts.caches("hunt16")


# ------------------------------------------------------------------------------- the models

# ---- a) ConvLSTM2D on clips: 5 frames 16 x 16 of a window moving over a gray picture

CLIP = dict(size=16, frames=5, step=2)


def _clip_sets():
    return (H9._clips(2048, H9.TRAIN_SEED, **CLIP), H9._clips(N_CAL, H9.cal_seed(), **CLIP)[0],
            H9._clips(N_EVAL, H9.EVAL_SEED, **CLIP)[0])


def _convlstm(unroll):
    import keras
    Ly = L()
    _seed(1601)
    inp = keras.Input((CLIP["frames"], 16, 16, 1), name="clip")
    h = Ly.ConvLSTM2D(16, 3, padding="same", unroll=unroll)(inp)
    h = Ly.ReLU()(Ly.BatchNormalization()(h))
    h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv2D(32, 3, 2, "same", use_bias=False)(h)))
    out = Ly.Dense(5, activation="softmax", name="motion")(Ly.GlobalAveragePooling2D()(h))
    return keras.Model(inp, out, name="convlstm_clips")


def convlstm_clips():
    """hunt9's clips (5 frames 16x16 gray [0, 1], a window moving 2 px a frame: still, right,
    left, down, up) -> ConvLSTM2D(16, 3, unroll=True) -> BN + relu -> conv stride 2 + BN +
    relu -> GAP -> Dense(5) softmax; 8 epochs. Weights cached, rebuilt in code."""
    (xt, yt), xc, xe = _clip_sets()

    def train(model):
        _fit(model, xt, yt, 8, "sparse_categorical_crossentropy")

    return _cached_weights("convlstm_clips", lambda: _convlstm(True), train), ZooData(
        xc, xe, ("class",), "5-frame gray clips 16 [0,1] (2 px steps); ConvLSTM2D(unroll=True) "
        "+ BN; 5 motions")


def convlstm_rolled():
    """convlstm_clips' weights in the same model with ConvLSTM2D left rolled (unroll=False,
    the layer's default; its constructor does not even list ``unroll``)."""
    convlstm_clips()  # trains and caches the weights if missing
    model = _convlstm(False)
    model.load_weights(H9._path("convlstm_clips", ".weights.h5", "hunt16"))
    _, xc, xe = _clip_sets()
    return model, ZooData(xc, xe, ("class",), "5-frame gray clips 16 [0,1]; ConvLSTM2D "
                          "(default, not unrolled) + BN; 5 motions")


# ---- b) RegNetX-002 by hand (Keras 3.15's keras.applications has no RegNet)

def _x_block(h, w_in, w_out, stride, group_width=8):
    Ly = L()
    if stride != 1 or w_in != w_out:
        skip = Ly.BatchNormalization(momentum=0.9, epsilon=1e-5)(
            Ly.Conv2D(w_out, 1, stride, use_bias=False)(h))
    else:
        skip = h
    x = Ly.ReLU()(Ly.BatchNormalization(momentum=0.9, epsilon=1e-5)(
        Ly.Conv2D(w_out, 1, use_bias=False)(h)))
    x = Ly.ReLU()(Ly.BatchNormalization(momentum=0.9, epsilon=1e-5)(
        Ly.Conv2D(w_out, 3, stride, "same", groups=w_out // group_width, use_bias=False)(x)))
    x = Ly.BatchNormalization(momentum=0.9, epsilon=1e-5)(Ly.Conv2D(w_out, 1, use_bias=False)(x))
    return Ly.ReLU()(Ly.Add()([x, skip]))


def regnetx002():
    """RegNetX-002 as Keras 2's keras.applications built it (Rescaling(1/255) + ImageNet
    Normalization inside, stem conv 32 stride 2 + BN, stages of depths 1, 1, 4, 7 and widths
    24, 56, 152, 368, X blocks with 3x3 grouped convs of group width 8), at 32 px, GAP +
    Dense(8) softmax; 3 epochs on the photo crops."""
    import keras
    Ly = L()
    xt, yt, xc, xe = _photo_data()

    def train():
        _seed(1602)
        inp = keras.Input((32, 32, 3), name="rgb255")
        h = Ly.Rescaling(1 / 255.0)(inp)
        h = Ly.Normalization(mean=[0.485, 0.456, 0.406],
                             variance=[0.229 ** 2, 0.224 ** 2, 0.225 ** 2])(h)
        h = Ly.ReLU()(Ly.BatchNormalization(momentum=0.9, epsilon=1e-5)(
            Ly.Conv2D(32, 3, 2, "same", use_bias=False)(h)))
        w_in = 32
        for depth, w in zip((1, 1, 4, 7), (24, 56, 152, 368)):
            for k in range(depth):
                h = _x_block(h, w_in, w, 2 if k == 0 else 1)
                w_in = w
        out = Ly.Dense(8, activation="softmax", name="photo")(Ly.GlobalAveragePooling2D()(h))
        return _fit(keras.Model(inp, out, name="regnetx002"), xt, yt, 3,
                    "sparse_categorical_crossentropy")

    return _cached("regnetx002", train), ZooData(
        xc, xe, ("class",), "photo crops 32 0..255; RegNetX-002 by hand (grouped 3x3 convs + "
        "BN, Normalization inside); 8 classes")


# ---- c) a GAN-style discriminator with SpectralNormalization

def _real_or_shuffled(x, seed):
    """Half of the gray crops with their pixels shuffled (label 0), the others kept (1);
    scaled to [-1, 1] as a GAN feeds its discriminator."""
    rng = np.random.default_rng(seed + 16)
    x = x.copy()
    y = (rng.random(len(x)) < 0.5).astype(np.float32)
    for i in np.flatnonzero(y == 0):
        flat = x[i].reshape(-1)
        x[i] = rng.permutation(flat).reshape(x[i].shape)
    return _f32(x * 2.0 - 1.0), y[:, None]


def sn_discriminator():
    """Gray crops 32 in [-1, 1], real or pixel-shuffled: SpectralNormalization(Conv2D(32, 4,
    2)) + LeakyReLU(0.2), the same with 64 and 128 filters, Flatten, SpectralNormalization(
    Dense(1)) sigmoid (no BN); 4 epochs."""
    import keras
    Ly = L()
    xt, xc, xe = H9.gray_sets(32)
    xt, yt = _real_or_shuffled(xt, H9.TRAIN_SEED)
    xc, _ = _real_or_shuffled(xc, H9.cal_seed())
    xe, _ = _real_or_shuffled(xe, H9.EVAL_SEED)

    def train():
        _seed(1603)
        inp = keras.Input((32, 32, 1), name="image")
        h = inp
        for w in (32, 64, 128):
            h = Ly.LeakyReLU(0.2)(Ly.SpectralNormalization(Ly.Conv2D(w, 4, 2, "same"))(h))
        out = Ly.Activation("sigmoid", name="real")(
            Ly.SpectralNormalization(Ly.Dense(1))(Ly.Flatten()(h)))
        return _fit(keras.Model(inp, out, name="sn_discriminator"), xt, yt, 4,
                    "binary_crossentropy", lr=1e-3)

    return _cached("sn_discriminator", train), ZooData(
        xc, xe, ("value",), "gray crops 32 in [-1,1], half pixel-shuffled; SpectralNormalization"
        "(Conv2D) + LeakyReLU, no BN; sigmoid")


# ---- d) a seq2seq LSTM autoencoder on noisy sines

STEPS = 48


def _sines(n, seed):
    x, _ = ZM._signals(n, seed)
    return x[:, ::4][:, :STEPS]


def seq2seq_lstm_ae():
    """The zoo's noisy sines decimated to 48 steps: LSTM(32, unroll=True) encoder ->
    RepeatVector(48) -> LSTM(32, return_sequences, unroll=True) decoder ->
    TimeDistributed(Dense(1)), trained to reconstruct its input (MSE); a (48, 1) regression
    output."""
    import keras
    Ly = L()
    xt = _sines(4096, H9.TRAIN_SEED)

    def train():
        _seed(1604)
        inp = keras.Input((STEPS, 1), name="signal")
        h = Ly.LSTM(32, unroll=True)(inp)
        h = Ly.LSTM(32, return_sequences=True, unroll=True)(Ly.RepeatVector(STEPS)(h))
        out = Ly.TimeDistributed(Ly.Dense(1), name="recon")(h)
        return _fit(keras.Model(inp, out, name="seq2seq_lstm_ae"), xt, xt, 12, "mse")

    return _cached("seq2seq_lstm_ae", train), ZooData(
        _sines(N_CAL, H9.cal_seed()), _sines(N_EVAL, H9.EVAL_SEED), ("value",),
        "synthetic noisy sines 48 steps; LSTM encoder, RepeatVector, LSTM decoder, "
        "TimeDistributed(Dense(1)); reconstruction")


# ---- e) TimeDistributed conv + BN + ReLU over a burst of frames, mean over time

FRAMES = 4


def _bursts(x, seed):
    """Each labelled gray crop 24 as a burst of 4 noisy exposures (noise 0.1, +-1 px shifts)."""
    rng = np.random.default_rng(seed + 16)
    out = np.empty((len(x), FRAMES) + x.shape[1:], np.float32)
    for f in range(FRAMES):
        dy, dx = rng.integers(-1, 2, 2)
        out[:, f] = np.roll(x, (dy, dx), axis=(1, 2)) + rng.normal(0, 0.1, x.shape)
    return out


def td_burst():
    """A burst of 4 noisy frames of one of hunt8's labelled gray crops (24 px, 10 pictures):
    TimeDistributed(Conv2D) + TimeDistributed(BN) + TimeDistributed(ReLU) x3 (strides 2),
    TimeDistributed(GAP2D), GlobalAveragePooling1D over the frames, Dense(10) softmax; 6
    epochs."""
    import keras
    Ly = L()
    TD = Ly.TimeDistributed
    (xt, yt), (xc, _), (xe, _) = H8.gray_labelled_sets(24)
    xt, xc, xe = (_bursts(x, s) for x, s in ((xt, H9.TRAIN_SEED), (xc, H9.cal_seed()),
                                             (xe, H9.EVAL_SEED)))

    def train():
        _seed(1605)
        inp = keras.Input((FRAMES, 24, 24, 1), name="burst")
        h = inp
        for w in (16, 32, 48):
            h = TD(Ly.Conv2D(w, 3, 2, "same", use_bias=False))(h)
            h = TD(Ly.ReLU())(TD(Ly.BatchNormalization())(h))
        h = Ly.GlobalAveragePooling1D()(TD(Ly.GlobalAveragePooling2D())(h))
        out = Ly.Dense(10, activation="softmax", name="picture")(h)
        return _fit(keras.Model(inp, out, name="td_burst"), xt, yt, 6,
                    "sparse_categorical_crossentropy")

    return _cached("td_burst", train), ZooData(
        xc, xe, ("class",), "bursts of 4 noisy gray crops 24 [0,1]; TimeDistributed(Conv2D, "
        "BN, ReLU), mean over time; 10 pictures")


# ---- f) a keras.io-style text transformer: token + position Embedding (custom layer)

CLASSES = 4


def _docs4(n, seed):
    """hunt9's topic documents of the first 4 topics only (topic words 1..120)."""
    x, y = H9._documents(3 * n, seed)
    keep = np.flatnonzero(y < CLASSES)[:n]
    return x[keep], y[keep]


def _token_pos_layer():
    import keras

    class TokenAndPositionEmbedding(keras.layers.Layer):
        """keras.io's: an Embedding of the tokens plus an Embedding of their positions."""

        def __init__(self, maxlen, vocab, dim, **kw):
            super().__init__(**kw)
            self.token_emb = keras.layers.Embedding(vocab, dim)
            self.pos_emb = keras.layers.Embedding(maxlen, dim)

        def call(self, x):
            positions = keras.ops.arange(0, keras.ops.shape(x)[-1], 1)
            return self.token_emb(x) + self.pos_emb(positions)

    return TokenAndPositionEmbedding


def text_transformer():
    """int32 tokens (48, vocabulary 1000, 0 = padding) -> TokenAndPositionEmbedding(32) (custom)
    -> MultiHeadAttention(4, 8) + Dropout + Add + LayerNorm -> Dense(64, gelu) -> Dense(32) +
    Add + LayerNorm -> GlobalAveragePooling1D -> Dense(4) softmax; 4 epochs. Weights cached,
    rebuilt in code."""
    import keras
    Ly = L()
    xt, yt = _docs4(3000, H9.TRAIN_SEED)

    def make():
        _seed(1606)
        inp = keras.Input((H9.SEQ,), dtype="int32", name="tokens")
        h = _token_pos_layer()(H9.SEQ, H9.VOCAB, 32)(inp)
        a = Ly.Dropout(0.1)(Ly.MultiHeadAttention(4, 8)(h, h))
        h = Ly.LayerNormalization(epsilon=1e-6)(Ly.Add()([h, a]))
        f = Ly.Dense(32)(Ly.Dense(64, activation="gelu")(h))
        h = Ly.LayerNormalization(epsilon=1e-6)(Ly.Add()([h, Ly.Dropout(0.1)(f)]))
        out = Ly.Dense(CLASSES, activation="softmax", name="topic")(
            Ly.GlobalAveragePooling1D()(h))
        return keras.Model(inp, out, name="text_transformer")

    def train(model):
        _fit(model, xt, yt, 4, "sparse_categorical_crossentropy", lr=1e-3)

    return _cached_weights("text_transformer", make, train), ZooData(
        _docs4(N_CAL, H9.cal_seed())[0], _docs4(N_EVAL, H9.EVAL_SEED)[0], ("class",),
        "synthetic topic documents (4 topics), int32 tokens; token + position Embedding "
        "(custom layer), MultiHeadAttention, LayerNorm, gelu FFN")


MODELS = {f.__name__: f for f in [
    convlstm_clips, regnetx002, sn_discriminator, seq2seq_lstm_ae, td_burst, text_transformer,
    convlstm_rolled]}


build = hunts.builder(MODELS, __name__)
