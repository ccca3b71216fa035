"""hunt17: models built to hunt for cle's failures on kinds neither the zoo (zoo_models.py) nor
hunt7-16 tried, with zoo_models' interface, for ``bench_zoo.py --zoo hunt17_models``::

    nice -n 5 .venv/bin/python benchmarks/bench_zoo.py --zoo hunt17_models \
        --models pointnet_cls --modes data nodata --json /tmp/h17/pointnet_cls.json

``build(name) -> (model, ZooData)``; a name "base@k" (k = 1, 2, ...) is the same model with
another draw of 64 calibration inputs (hunt9's :func:`hunt9_models.cal_seed`; the held-out
inputs, 1000 generated ones, are the same). The data are generated here (point sets of 3-D
shapes, graphs, a 1-D inverse problem) or hunt9's and hunt8's (gray crops, photo crops) and the
zoo's noisy sines; trained models are cached beside the zoo's (:func:`zoo_models.cache_dir`,
``hunt17/``), keyed by the model's name only; models with a custom layer keep their weights
only (``.weights.h5``) and are rebuilt in code. Written fast: what a new user might train in a
minute, not tuned.

Kinds: a PointNet-style point cloud classifier (Conv1D kernel 1 shared MLP + BN + ReLU,
GlobalMaxPooling1D, Dense softmax); a stereo-like cost volume (two gray images, one shared conv
tower, the right features shifted by 0..4 px (a custom layer), Multiply and a mean over
channels (a custom layer) per shift, Concatenate, conv head regressing the disparity); a
mixture density network (Dense -> pi softmax, mu linear, sigma exp: three outputs) on a 1-D
inverse problem; a graph convolution network (node features and a normalized adjacency matrix,
two inputs; keras.layers.Dot as the matmul) classifying graphs; a PixelCNN of masked convs (a
Conv2D subclass multiplying its kernel by a fixed causal mask in call) predicting each pixel's
gray level; keras.layers.AdditiveAttention (Bahdanau) in a sequence classifier; an MLP-Mixer
(keras.layers.EinsumDense mixing the tokens, LayerNorm, gelu).
"""
from __future__ import annotations

import numpy as np

import hunts  # what the hunts after hunt9 share
import zoo_models as ZM  # the repository's zoo: data helpers, ZooData
import hunt9_models as H9  # hunt9's data helpers and its draw of calibration inputs
import hunt14_models as H14  # its photo data helper

ZooData = ZM.ZooData
Missing = ZM.Missing
_fit, _seed, _settle_bn = ZM._fit, ZM._seed, ZM._settle_bn
_f32, L = H9._f32, H9.L
N_CAL, N_EVAL = H9.N_CAL, H9.N_EVAL
_photo_data = H14._photo_data
DRAW = 0  # set by build() (here and in hunt9_models / hunt8_models, whose cal_seed() is read)
_cached, _cached_weights = hunts.caches("hunt17")


# ----------------------------------------------------------------------- custom layers


def _custom_layers():
    """The custom layers (registered when first asked: importing keras is not free)."""
    import keras

    if _CUSTOM:
        return _CUSTOM

    @keras.saving.register_keras_serializable(package="hunt17")
    class ShiftRight(keras.layers.Layer):
        """Shifts a feature map ``shift`` pixels right along the width (zeros come in)."""

        def __init__(self, shift, **kw):
            super().__init__(**kw)
            self.shift = int(shift)

        def call(self, x):
            if self.shift == 0:
                return x
            w = x.shape[2]
            return keras.ops.pad(x[:, :, :w - self.shift, :],
                                 [[0, 0], [0, 0], [self.shift, 0], [0, 0]])

        def get_config(self):
            return dict(super().get_config(), shift=self.shift)

    @keras.saving.register_keras_serializable(package="hunt17")
    class ChannelMean(keras.layers.Layer):
        """The mean over the last axis, kept as an axis of 1."""

        def call(self, x):
            return keras.ops.mean(x, axis=-1, keepdims=True)

    @keras.saving.register_keras_serializable(package="hunt17")
    class MaskedConv2D(keras.layers.Conv2D):
        """PixelCNN's masked convolution: the kernel times a fixed causal mask in ``call``
        (type "A" hides the centre pixel too, "B" keeps it); the stored kernel is not masked."""

        def __init__(self, mask_type, *args, **kw):
            super().__init__(*args, **kw)
            self.mask_type = mask_type

        def build(self, input_shape):
            super().build(input_shape)
            kh, kw = self.kernel_size
            mask = np.ones(self.kernel.shape, np.float32)
            mask[kh // 2, kw // 2 + (self.mask_type == "B"):] = 0.0
            mask[kh // 2 + 1:] = 0.0
            self.mask = mask

        def call(self, x):
            y = self.convolution_op(x, self.kernel * self.mask)
            if self.use_bias:
                y = keras.ops.add(y, self.bias)
            return self.activation(y) if self.activation is not None else y

        def get_config(self):
            return dict(super().get_config(), mask_type=self.mask_type)

    _CUSTOM.update(ShiftRight=ShiftRight, ChannelMean=ChannelMean, MaskedConv2D=MaskedConv2D)
    return _CUSTOM


_CUSTOM: dict = {}


# ------------------------------------------------------------------------------- the models

# ---- a) PointNet-style classifier on point sets of 5 shapes

POINTS, SHAPES = 128, 5


def _points(n, seed):
    """``n`` sets of 128 points on a sphere, a cube's surface, a cylinder, a cone or a torus,
    randomly scaled (0.7..1.3 per axis), rotated about z and jittered (0.02)."""
    rng = np.random.default_rng(seed + 17)
    y = rng.integers(SHAPES, size=n)
    x = np.empty((n, POINTS, 3), np.float32)
    for i in range(n):
        u, v = rng.uniform(0, 1, POINTS), rng.uniform(0, 2 * np.pi, POINTS)
        if y[i] == 0:  # sphere
            p = rng.normal(size=(POINTS, 3))
            p /= np.linalg.norm(p, axis=1, keepdims=True)
        elif y[i] == 1:  # cube surface
            p = rng.uniform(-1, 1, (POINTS, 3))
            face = rng.integers(3, size=POINTS)
            p[np.arange(POINTS), face] = np.sign(rng.uniform(-1, 1, POINTS))
        elif y[i] == 2:  # cylinder
            p = np.stack([np.cos(v), np.sin(v), 2 * u - 1], 1)
        elif y[i] == 3:  # cone
            p = np.stack([u * np.cos(v), u * np.sin(v), 1 - 2 * u], 1)
        else:  # torus
            w = rng.uniform(0, 2 * np.pi, POINTS)
            r = 0.7 + 0.3 * np.cos(w)
            p = np.stack([r * np.cos(v), r * np.sin(v), 0.3 * np.sin(w)], 1)
        a = rng.uniform(0, 2 * np.pi)
        rot = np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])
        x[i] = (p @ rot.T) * rng.uniform(0.7, 1.3, 3) + rng.normal(0, 0.02, (POINTS, 3))
    return x, y


def pointnet_cls():
    """128 points (x, y, z) of one of 5 shapes -> Conv1D(kernel 1) 32, 64, 128 each + BN +
    ReLU (the shared MLP) -> GlobalMaxPooling1D -> Dense(64) relu -> Dense(5) softmax; 6
    epochs."""
    import keras
    Ly = L()
    xt, yt = _points(2048, H9.TRAIN_SEED)

    def train():
        _seed(1701)
        inp = keras.Input((POINTS, 3), name="points")
        h = inp
        for w in (32, 64, 128):
            h = Ly.ReLU()(Ly.BatchNormalization()(Ly.Conv1D(w, 1, use_bias=False)(h)))
        h = Ly.Dense(64, activation="relu")(Ly.GlobalMaxPooling1D()(h))
        out = Ly.Dense(SHAPES, activation="softmax", name="shape")(h)
        return _fit(keras.Model(inp, out, name="pointnet_cls"), xt, yt, 6,
                    "sparse_categorical_crossentropy")

    return _cached("pointnet_cls", train), ZooData(
        _points(N_CAL, H9.cal_seed())[0], _points(N_EVAL, H9.EVAL_SEED)[0], ("class",),
        "generated point sets (128 x 3) of 5 shapes, scaled, rotated, jittered; PointNet "
        "Conv1D(1) + BN + ReLU, GlobalMaxPooling1D")


# ---- b) a stereo-like cost volume: two gray images, disparity 0..4 px

MAX_DISP = 5


def _stereo(n, seed):
    """Gray crops 40 -> left = the centre 32 x 32, right = the same rows shifted so that
    right[x - d] = left[x] (d = 0..4 px, uniform), each with noise 0.02; target d."""
    rng = np.random.default_rng(seed + 17)
    crops = ZM.gray_crops(n, 40, seed)
    d = rng.integers(MAX_DISP, size=n)
    left = crops[:, 4:36, 4:36]
    right = np.stack([crops[i, 4:36, 4 + d[i]:36 + d[i]] for i in range(n)])
    noise = rng.normal(0, 0.02, (2,) + left.shape)
    return {"left": _f32(left + noise[0]), "right": _f32(right + noise[1])}, \
        d.astype(np.float32)[:, None]


def _stereo_model():
    import keras
    Ly = L()
    C = _custom_layers()
    _seed(1702)
    tin = keras.Input((32, 32, 1))
    h = Ly.Conv2D(16, 3, padding="same", activation="relu")(tin)
    h = Ly.Conv2D(16, 3, padding="same")(h)
    tower = keras.Model(tin, h, name="tower")
    a, b = keras.Input((32, 32, 1), name="left"), keras.Input((32, 32, 1), name="right")
    fl, fr = tower(a), tower(b)
    costs = [C["ChannelMean"]()(Ly.Multiply()([fl, C["ShiftRight"](s)(fr)]))
             for s in range(MAX_DISP)]
    h = Ly.BatchNormalization()(Ly.Concatenate()(costs))
    h = Ly.Conv2D(16, 3, padding="same", activation="relu")(h)
    h = Ly.Conv2D(16, 3, 2, padding="same", activation="relu")(h)
    out = Ly.Dense(1, name="disparity")(Ly.GlobalAveragePooling2D()(h))
    return keras.Model([a, b], out, name="stereo_cost")


def stereo_cost():
    """Two gray images 32 (left, right = left shifted 0..4 px) -> one shared conv tower (two
    3x3 convs 16) -> per shift s = 0..4: Multiply(left, ShiftRight(s)(right)) (custom) and
    ChannelMean (custom) -> Concatenate (5 costs) -> BN -> conv 16, conv 16 stride 2 -> GAP
    -> Dense(1) disparity (MSE); 15 epochs (6 at lr 2e-3 without the BN learnt nothing:
    a constant). Weights cached, rebuilt in code."""
    xt, yt = _stereo(2048, H9.TRAIN_SEED)

    def train(model):
        _fit(model, xt, yt, 15, "mse", lr=3e-3)

    return _cached_weights("stereo_cost", _stereo_model, train), ZooData(
        _stereo(N_CAL, H9.cal_seed())[0], _stereo(N_EVAL, H9.EVAL_SEED)[0], ("value",),
        "gray crops 32 [0,1] as stereo pairs (disparity 0..4 px); shared tower, shifts and "
        "channel means (custom layers), Multiply, Concatenate, BN; disparity regression")


# ---- c) a mixture density network on a 1-D inverse problem

MIXTURES = 5


def _inverse(n, seed):
    """Bishop's inverse problem: t uniform in [0, 1], x = t + 0.3 sin(2 pi t) + noise 0.05;
    the model is given x and predicts the (multimodal) t."""
    rng = np.random.default_rng(seed + 17)
    t = rng.uniform(0, 1, n)
    x = t + 0.3 * np.sin(2 * np.pi * t) + rng.normal(0, 0.05, n)
    return _f32(x[:, None]), _f32(t[:, None])


def mdn_1d():
    """x (one feature, about -0.1..1.1) -> Dense(32) tanh x2 -> three heads of 5 mixtures:
    pi (Dense softmax), mu (Dense linear), sigma (Dense, exponential); trained on the mixture's
    negative log-likelihood, 40 epochs."""
    import keras
    Ly = L()
    ops = keras.ops
    xt, tt = _inverse(4096, H9.TRAIN_SEED)

    def nll(t, y):
        pi, mu, sigma = y[:, :MIXTURES], y[:, MIXTURES:2 * MIXTURES], y[:, 2 * MIXTURES:]
        z = (t - mu) / sigma
        log_p = -0.5 * z * z - ops.log(sigma) - 0.5 * np.log(2 * np.pi)
        return -ops.logsumexp(ops.log(pi + 1e-8) + log_p, axis=-1)

    def train():
        _seed(1703)
        inp = keras.Input((1,), name="x")
        h = Ly.Dense(32, activation="tanh")(Ly.Dense(32, activation="tanh")(inp))
        pi = Ly.Dense(MIXTURES, activation="softmax", name="pi")(h)
        mu = Ly.Dense(MIXTURES, name="mu")(h)
        sigma = Ly.Dense(MIXTURES, activation="exponential", name="sigma")(h)
        model = keras.Model(inp, [pi, mu, sigma], name="mdn_1d")
        trainer = keras.Model(inp, Ly.Concatenate()([pi, mu, sigma]))
        trainer.compile(optimizer=keras.optimizers.Adam(3e-3), loss=nll)
        trainer.fit(xt, tt, epochs=40, batch_size=64, verbose=0)
        return model

    return _cached("mdn_1d", train), ZooData(
        _inverse(N_CAL, H9.cal_seed())[0], _inverse(N_EVAL, H9.EVAL_SEED)[0],
        ("class", "value", "value"), "generated 1-D inverse problem (x = t + 0.3 sin 2 pi t); "
        "MDN heads pi softmax, mu linear, sigma exponential")


# ---- d) a graph convolution network: node features + normalized adjacency, 4 graph kinds

NODES, GRAPHS = 16, 4


def _graphs(n, seed):
    """Graphs of 16 nodes: a ring with chords, a star with a few extra edges, a 4 x 4 grid,
    or a random graph (p 0.25), nodes permuted. Node features: 1, the degree / 8 and two
    normal noises; adjacency D^-1/2 (A + I) D^-1/2."""
    rng = np.random.default_rng(seed + 17)
    y = rng.integers(GRAPHS, size=n)
    feats = np.empty((n, NODES, 4), np.float32)
    adj = np.empty((n, NODES, NODES), np.float32)
    for i in range(n):
        a = np.zeros((NODES, NODES))
        if y[i] == 0:
            for k in range(NODES):
                a[k, (k + 1) % NODES] = 1
            for _ in range(3):
                j, k = rng.integers(NODES, size=2)
                a[j, k] = 1
        elif y[i] == 1:
            a[0, 1:] = 1
            for _ in range(4):
                j, k = rng.integers(1, NODES, size=2)
                a[j, k] = 1
        elif y[i] == 2:
            for k in range(NODES):
                if k % 4 < 3:
                    a[k, k + 1] = 1
                if k < 12:
                    a[k, k + 4] = 1
        else:
            a = (rng.random((NODES, NODES)) < 0.25).astype(float)
        a = np.maximum(a, a.T)
        np.fill_diagonal(a, 0)
        perm = rng.permutation(NODES)
        a = a[perm][:, perm]
        deg = a.sum(1)
        feats[i] = np.stack([np.ones(NODES), deg / 8, rng.normal(size=NODES),
                             rng.normal(size=NODES)], 1)
        a_hat = a + np.eye(NODES)
        s = 1 / np.sqrt(a_hat.sum(1))
        adj[i] = a_hat * s[:, None] * s[None, :]
    return {"nodes": feats, "adj": adj}, y


def gcn_graph():
    """Node features (16 x 4) and the normalized adjacency (16 x 16): two GCN layers, each
    Dot(axes=(2, 1))(adjacency, h) then Dense(32) relu; GlobalAveragePooling1D and
    GlobalMaxPooling1D concatenated, Dense(4) softmax; 10 epochs."""
    import keras
    Ly = L()
    xt, yt = _graphs(2048, H9.TRAIN_SEED)

    def train():
        _seed(1704)
        nodes = keras.Input((NODES, 4), name="nodes")
        adj = keras.Input((NODES, NODES), name="adj")
        h = nodes
        for w in (32, 32):
            h = Ly.Dense(w, activation="relu")(Ly.Dot(axes=(2, 1))([adj, h]))
        h = Ly.Concatenate()([Ly.GlobalAveragePooling1D()(h), Ly.GlobalMaxPooling1D()(h)])
        out = Ly.Dense(GRAPHS, activation="softmax", name="graph_kind")(h)
        return _fit(keras.Model([nodes, adj], out, name="gcn_graph"), xt, yt, 10,
                    "sparse_categorical_crossentropy")

    return _cached("gcn_graph", train), ZooData(
        _graphs(N_CAL, H9.cal_seed())[0], _graphs(N_EVAL, H9.EVAL_SEED)[0], ("class",),
        "generated graphs of 16 nodes (ring, star, grid, random); node features + normalized "
        "adjacency, Dot matmul GCN; 4 kinds")


# ---- e) a PixelCNN of masked convolutions predicting 4 gray levels per pixel

LEVELS = 4


def _levels(x):
    """Gray crops quantized to 4 levels: the input (level / 3) and the target (level)."""
    q = np.clip(np.floor(x * LEVELS), 0, LEVELS - 1)
    return _f32(q / (LEVELS - 1)), q[..., 0].astype(np.int64)


def _pixelcnn_model(bn=False):
    import keras
    Ly = L()
    Masked = _custom_layers()["MaskedConv2D"]
    _seed(1709 if bn else 1705)
    inp = keras.Input((16, 16, 1), name="pixels")

    def masked(h, kind, k):
        if not bn:
            return Masked(kind, 32, k, padding="same", activation="relu")(h)
        h = Masked(kind, 32, k, padding="same", use_bias=False)(h)
        return Ly.ReLU()(Ly.BatchNormalization()(h))

    h = masked(inp, "A", 5)
    for _ in range(2):
        h = masked(h, "B", 3)
    h = Ly.Conv2D(32, 1, activation="relu")(h)
    out = Ly.Conv2D(LEVELS, 1, activation="softmax", name="level")(h)
    return keras.Model(inp, out, name="pixelcnn_bn" if bn else "pixelcnn_masked")


def pixelcnn_masked():
    """Gray crops 16 quantized to 4 levels (input level / 3) -> MaskedConv2D "A" 5x5 32
    relu (a custom Conv2D subclass: kernel times a causal mask in call) -> two "B" 3x3 32
    relu -> 1x1 conv 32 relu -> 1x1 conv 4 softmax per pixel (each pixel's level from the
    ones before it); 5 epochs. Weights cached, rebuilt in code."""
    xt, xc, xe = H9.gray_sets(16)
    xt, yt = _levels(xt)

    def train(model):
        _fit(model, xt, yt, 5, "sparse_categorical_crossentropy")

    return _cached_weights("pixelcnn_masked", _pixelcnn_model, train), ZooData(
        _levels(xc)[0], _levels(xe)[0], ("class",),
        "gray crops 16 quantized to 4 levels; PixelCNN masked convs (Conv2D subclass, mask "
        "in call; the stored kernel unmasked); per-pixel softmax of 4 levels")


def pixelcnn_bn():
    """pixelcnn_masked with each MaskedConv2D without bias and followed by BatchNormalization
    + ReLU (a BN after a Conv2D subclass whose call masks the kernel); 5 epochs. Weights
    cached, rebuilt in code."""
    xt, xc, xe = H9.gray_sets(16)
    xt, yt = _levels(xt)

    def train(model):
        _fit(model, xt, yt, 5, "sparse_categorical_crossentropy")

    return _cached_weights("pixelcnn_bn", lambda: _pixelcnn_model(True), train), ZooData(
        _levels(xc)[0], _levels(xe)[0], ("class",),
        "gray crops 16 quantized to 4 levels; PixelCNN masked convs (Conv2D subclass, mask "
        "in call) + BN + ReLU; per-pixel softmax of 4 levels")


# ---- f) AdditiveAttention (Bahdanau) in a sequence classifier on noisy sines

STEPS = 64


def _sines(n, seed):
    x, y = ZM._signals(n, seed)
    return x[:, ::4][:, :STEPS], y


def additive_attention():
    """The zoo's noisy sines decimated to 64 steps (5 frequency bands) -> Conv1D(32, 5) relu
    -> query Dense(32) -> AdditiveAttention()([query, features]) -> GlobalAveragePooling1D ->
    Dense(5) softmax; 8 epochs."""
    import keras
    Ly = L()
    xt, yt = _sines(4096, H9.TRAIN_SEED)

    def train():
        _seed(1706)
        inp = keras.Input((STEPS, 1), name="signal")
        h = Ly.Conv1D(32, 5, padding="same", activation="relu")(inp)
        q = Ly.Dense(32)(h)
        a = Ly.AdditiveAttention()([q, h])
        out = Ly.Dense(5, activation="softmax", name="band")(Ly.GlobalAveragePooling1D()(a))
        return _fit(keras.Model(inp, out, name="additive_attention"), xt, yt, 8,
                    "sparse_categorical_crossentropy")

    return _cached("additive_attention", train), ZooData(
        _sines(N_CAL, H9.cal_seed())[0], _sines(N_EVAL, H9.EVAL_SEED)[0], ("class",),
        "synthetic noisy sines 64 steps; Conv1D, AdditiveAttention (Bahdanau); 5 bands")


# ---- g) an MLP-Mixer: EinsumDense token mixing + LayerNorm

TOKENS, DIM = 64, 32


def _mixer_block(h, token_bias):
    Ly = L()
    t = Ly.LayerNormalization(epsilon=1e-6)(h)
    t = Ly.EinsumDense("btc,ts->bsc", output_shape=(64, DIM), bias_axes="s" if token_bias
                       else None, activation="gelu")(t)
    t = Ly.EinsumDense("bsc,st->btc", output_shape=(TOKENS, DIM),
                       bias_axes="t" if token_bias else None)(t)
    h = Ly.Add()([h, t])
    c = Ly.LayerNormalization(epsilon=1e-6)(h)
    c = Ly.Dense(DIM)(Ly.Dense(64, activation="gelu")(c))
    return Ly.Add()([h, c])


def _mixer(name, token_bias, seed):
    import keras
    Ly = L()
    xt, yt, xc, xe = _photo_data()

    def train():
        _seed(seed)
        inp = keras.Input((32, 32, 3), name="rgb255")
        h = Ly.Conv2D(DIM, 4, 4)(Ly.Rescaling(1 / 255.0)(inp))
        h = Ly.Reshape((TOKENS, DIM))(h)
        for _ in range(2):
            h = _mixer_block(h, token_bias)
        h = Ly.GlobalAveragePooling1D()(Ly.LayerNormalization(epsilon=1e-6)(h))
        out = Ly.Dense(8, activation="softmax", name="photo")(h)
        return _fit(keras.Model(inp, out, name=name), xt, yt, 8,
                    "sparse_categorical_crossentropy")

    return _cached(name, train), ZooData(
        xc, xe, ("class",), "photo crops 32 0..255; MLP-Mixer (EinsumDense token mixing"
        + ("" if token_bias else " without bias") + ", LayerNorm, gelu); 8 classes")


def mlp_mixer():
    """Photo crops 32 0..255 -> Rescaling(1/255) -> patches 4x4 (Conv2D 32 stride 4) ->
    Reshape(64 tokens, 32) -> two Mixer blocks (LayerNorm, token mixing by EinsumDense
    "btc,ts->bsc" gelu and back, Add; LayerNorm, channel MLP 64 gelu, Add) -> LayerNorm ->
    GlobalAveragePooling1D -> Dense(8) softmax; 8 epochs."""
    return _mixer("mlp_mixer", True, 1707)


def mlp_mixer_nobias():
    """mlp_mixer with its token-mixing EinsumDense layers without bias (bias_axes=None): TF
    Lite's converter (float too) fails on an EinsumDense "btc,ts->bsc" whose bias is on the
    token axis s ('tf.Transpose' op x should be of the same rank with y); trained anew."""
    return _mixer("mlp_mixer_nobias", False, 1708)


MODELS = {f.__name__: f for f in [
    pointnet_cls, stereo_cost, mdn_1d, gcn_graph, pixelcnn_masked, additive_attention,
    mlp_mixer, mlp_mixer_nobias, pixelcnn_bn]}


build = hunts.builder(MODELS, __name__)
