"""Backend-specific behaviour (issue 12). `make test` runs the suite on TensorFlow and again with
KERAS_BACKEND=jax; these regression tests run on both, with each backend's expected outcome."""

import contextlib
import warnings

import keras
import numpy as np
import pytest
from conftest import (
    BACKEND,
    real_mobilenet_v2,
    RTOL,
    assert_folds,
    inputs_for,
    max_rel_error,
    outputs,
    randomize_batch_norms,
    randomize_biases,
    weights_snapshot,
)

import cle

L = keras.layers

not_on_tensorflow = pytest.mark.skipif(
    BACKEND == "tensorflow",
    reason="TensorFlow adds this bias on the wrong axis, so the layer is skipped there "
    "(tested in test_fold_layers / test_equalize)",
)


# ------------------------------------------------- channels_first bias guard: TensorFlow only


def _channels_first_conv_bn(factory, shape):
    inp = keras.Input(shape)
    x = L.BatchNormalization(axis=1, name="bn")(factory()(inp))
    return randomize_biases(randomize_batch_norms(keras.Model(inp, L.ReLU()(x))))


@not_on_tensorflow
@pytest.mark.parametrize("factory, shape", [
    (lambda: L.Conv2DTranspose(5, 2, data_format="channels_first", name="layer"), (2, 4, 4)),
    (lambda: L.Conv2D(4, 3, data_format="channels_first", name="layer"), (2, 6, 6)),
    (lambda: L.DepthwiseConv2D(3, data_format="channels_first", name="layer"), (4, 6, 6)),
], ids=["transpose", "conv", "depthwise"])
def test_channels_first_bias_lands_on_channels_and_folds(factory, shape):
    """The shapes TensorFlow gets wrong (last spatial size == channels): other backends add the
    bias per channel, so the fold happens and is exact."""
    model = _channels_first_conv_bn(factory, shape)
    y = keras.ops.add(np.zeros((1, 4, 4, 4), "float32"),
                      np.arange(4.0, dtype="float32").reshape(1, 4, 1, 1))
    assert np.asarray(y)[0, :, 0, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    pairs, _, err = assert_folds(model, 1, 0)
    assert [(p.layer.name, p.bn.name) for p in pairs] == [("layer", "bn")]
    assert err <= RTOL


@not_on_tensorflow
def test_channels_first_scaling_set_is_kept():
    inp = keras.Input((3, 8, 6))  # conv output (4, 6, 4): channels == last spatial size
    x = L.ReLU()(L.Conv2D(4, 3, data_format="channels_first", name="c1")(inp))
    model = keras.Model(inp, L.Conv2D(2, 1, data_format="channels_first", name="c2")(x))
    rng = np.random.default_rng(0)
    c1 = model.get_layer("c1")  # spread ranges, so that scaling really changes the weights
    c1.kernel.assign(np.asarray(c1.kernel) * rng.uniform(0.1, 10.0, 4).astype("float32"))
    randomize_biases(model)
    new, report = cle.equalize_model(model, objective="weights", return_report=True)
    assert [[(p.layer1.name, p.layer2.name) for p in s.cls_pair_info_list]
            for s in report.sets] == [[("c1", "c2")]]
    assert "c1" not in dict(report.set_ends)
    assert not np.allclose(np.asarray(new.get_layer("c1").kernel), np.asarray(c1.kernel))
    assert max_rel_error(model, new, inputs_for(model)) <= RTOL


# ------------------------------------------------- fuse_for_training: no shared buffers


def _conv_bn_model():
    inp = keras.Input((8, 8, 3))
    x = L.BatchNormalization(name="bn")(L.Conv2D(4, 3, name="conv")(inp))
    x = L.GlobalAveragePooling2D()(L.ReLU()(x))
    model = keras.Model(inp, L.Dense(2, name="dense")(x))
    return randomize_biases(randomize_batch_norms(model, deep=True))


def _fit(model, x, y):
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.fit(x, y, batch_size=4, epochs=2, verbose=0)


def _assert_weights_equal(model, snapshot):
    for a, b in zip(snapshot, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_fused_model_owns_its_weights():
    """Training the fused model leaves the input model intact, and training the input model
    leaves the fused one intact (on JAX a shared buffer is deleted by the other's fit)."""
    model = _conv_bn_model()
    x = inputs_for(model, batch=8)
    y = np.random.default_rng(5).normal(size=(8, 2)).astype("float32")
    fused = cle.fuse_for_training(model)
    assert isinstance(fused.get_layer("conv"), cle.FoldedConv2D)
    model_snap, model_y = weights_snapshot(model), outputs(model, x)[0]
    assert max_rel_error(model, fused, x) <= RTOL

    _fit(fused, x, y)
    _assert_weights_equal(model, model_snap)
    np.testing.assert_array_equal(outputs(model, x)[0], model_y)
    fused_snap, fused_y = weights_snapshot(fused), outputs(fused, x)[0]
    assert not np.array_equal(fused_y, model_y)  # the fit changed the fused model

    _fit(model, x, y)
    _assert_weights_equal(fused, fused_snap)
    np.testing.assert_array_equal(outputs(fused, x)[0], fused_y)
    assert not np.array_equal(outputs(model, x)[0], model_y)


# ------------------------------------------------- the step counter's dtype


def test_step_counter_dtype_without_truncation_warnings():
    """int64 on TensorFlow, int32 elsewhere (Keras' "int"): JAX without x64 would truncate an
    int64 weight with one warning per use."""
    model = _conv_bn_model()
    x = inputs_for(model, batch=8)
    y = np.zeros((8, 2), "float32")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fused = cle.fuse_for_training(model, ema_freeze_delay=3)
        _fit(fused, x, y)  # 2 epochs of 2 batches: 4 steps, frozen after 3
        plain = cle.export_folded(fused)
        _ = outputs(plain, x)
    dtype_warnings = [str(w.message) for w in caught
                      if "int64" in str(w.message) or "truncated" in str(w.message)]
    assert len(dtype_warnings) == 0, dtype_warnings
    step = fused.get_layer("conv").step
    assert step.dtype == ("int64" if BACKEND == "tensorflow" else "int32")
    assert int(keras.ops.convert_to_numpy(step)) == 4
    assert fused.get_layer("conv").is_frozen()


# ------------------------------------------------- float64 models


@contextlib.contextmanager
def _float64_enabled():
    """JAX computes float64 only with x64 enabled (otherwise it truncates to float32)."""
    if BACKEND == "jax":
        import jax

        with jax.enable_x64(True):
            yield
    else:
        yield


def test_float64_fold_is_exact_against_numpy():
    """The fold of a float64 model matches a float64 numpy evaluation of the original formula to
    rounding, on every backend. (Keras' own float64 BatchNormalization is only float32-accurate
    on JAX, measured ~5e-8, so the original model is not the reference there.)"""
    with _float64_enabled():
        inp = keras.Input((6, 6, 3), dtype="float64")
        conv = L.Conv2D(4, 3, dtype="float64", name="c")
        bn = L.BatchNormalization(dtype="float64", name="bn")
        model = randomize_biases(randomize_batch_norms(keras.Model(inp, bn(conv(inp)))))
        pairs, folded = cle.fold_all_batch_norms(model)
        assert [(p.layer.name, p.bn.name) for p in pairs] == [("c", "bn")]
        assert folded.get_layer("c").kernel.dtype == "float64"
        x = np.random.default_rng(0).random((2, 6, 6, 3))
        y_conv = keras.ops.convert_to_numpy(conv(x))
        assert y_conv.dtype == np.float64
        g, b, m, v = (keras.ops.convert_to_numpy(w) for w in
                      (bn.gamma, bn.beta, bn.moving_mean, bn.moving_variance))
        reference = (y_conv - m) / np.sqrt(v + bn.epsilon) * g + b
        y_folded = keras.ops.convert_to_numpy(folded(x))
        assert y_folded.dtype == np.float64
        err = np.abs(y_folded - reference).max() / np.abs(reference).max()
        assert err < 1e-12, err  # float64 all the way: exact to rounding
        assert max_rel_error(model, folded, x) <= RTOL


# ------------------------------------------------- a whole real network on every backend


@pytest.mark.slow
@pytest.mark.jax_ci
def test_real_mobilenet_v2_fold_equalize_and_fuse():
    """The real pretrained MobileNetV2 on real photo crops: folding, equalization (relu6 bound)
    and fusing for training keep the function, on every backend."""
    from cle import pretrained

    model = real_mobilenet_v2()
    x = pretrained.preprocess_imagenet(pretrained.sample_images(4))
    snapshot = weights_snapshot(model)

    def run(m):  # the compiled whole graph: on JAX op-by-op calls cost 3-4x more here
        return m.predict(x, batch_size=len(x), verbose=0).astype(np.float64)

    ref = run(model)

    def rel_error(m):
        return np.abs(run(m) - ref).max() / np.abs(ref).max()

    pairs, folded = cle.fold_all_batch_norms(model)
    assert len(pairs) == 52
    assert rel_error(folded) <= RTOL
    equalized, report = cle.equalize_model(model, return_report=True)
    assert len(report.sets) > 0
    assert rel_error(equalized) <= RTOL
    fused = cle.fuse_for_training(model)
    assert rel_error(fused) <= RTOL
    _assert_weights_equal(model, snapshot)
