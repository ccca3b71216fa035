"""The rebuild skips random weight initialization (every weight is copied afterwards) and the
scaling math works layer by layer in float64 without float64 copies of whole kernels; neither
may change a result or a config."""

import keras
import numpy as np
from conftest import RTOL, inputs_for, max_rel_error, randomize_batch_norms, randomize_biases

import cle
from cle._math import equalization

L = keras.layers


def _model():
    inp = keras.Input((9, 9, 3))
    x = L.Conv2D(6, 3, kernel_initializer="he_normal", bias_initializer="ones", name="c1")(inp)
    x = L.ReLU(name="r1")(L.BatchNormalization(gamma_initializer="ones", name="bn1")(x))
    x = L.Dense(4, kernel_initializer=keras.initializers.RandomNormal(0.0, 0.3), name="d")(x)
    return randomize_biases(randomize_batch_norms(keras.Model(inp, x)))


def test_rebuilt_layers_keep_their_initializers_and_configs():
    model = _model()
    for new in (cle.fold_all_batch_norms(model)[1], cle.equalize_model(model)):
        for name in ("c1", "d"):
            old_cfg, new_cfg = model.get_layer(name).get_config(), new.get_layer(name).get_config()
            for key in ("kernel_initializer", "bias_initializer"):
                assert new_cfg[key] == old_cfg[key]
            assert type(new.get_layer(name).kernel_initializer) is type(
                model.get_layer(name).kernel_initializer)
        assert max_rel_error(model, new, inputs_for(model)) <= RTOL
    # A plain clone through the rebuild copies every weight exactly (nothing left at zero).
    rebuilt = cle.fold_given_batch_norms(model, [])
    for a, b in zip(model.get_weights(), rebuilt.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_ranges_and_scaling_in_the_kernel_dtype_match_float64():
    rng = np.random.default_rng(0)
    cases = [((3, 3, 4, 6), -1, "standard", 1), ((3, 3, 4, 6), -2, "standard", 1),
             ((3, 3, 5, 2), -1, "depthwise_out", 1), ((3, 3, 2, 6), -2, "grouped_in", 3),
             ((7, 5), 0, "standard", 1)]
    for shape, axis, kind, groups in cases:
        k32 = rng.normal(0, 1, shape).astype(np.float32)
        k64 = k32.astype(np.float64)
        r32 = equalization.channel_ranges(k32, axis, kind, groups)
        r64 = equalization.channel_ranges(k64, axis, kind, groups)
        assert r32.dtype == np.float64
        np.testing.assert_array_equal(r32, r64)
        f = rng.uniform(0.5, 2.0, r64.shape[0])
        s32 = equalization.scale_channels(k32, f, axis, kind, groups)
        assert s32.dtype == np.float64
        np.testing.assert_array_equal(s32, equalization.scale_channels(k64, f, axis, kind, groups))


def _deep_model(n=8, c=160):
    inp = keras.Input((6, 6, c))
    x = inp
    for i in range(n):
        x = L.Conv2D(c, 3, padding="same", name=f"c{i}")(x)
        x = L.ReLU(name=f"r{i}")(L.BatchNormalization(name=f"bn{i}")(x))
    return randomize_batch_norms(keras.Model(inp, x))


def test_equalize_holds_one_layer_of_float64_at_a_time():
    """Numpy memory held by equalize_model (tracemalloc sees numpy's buffers, not the new
    model's variables) stays within a few layers' float64 temporaries: float64 copies of every
    folded kernel at once (the plan of a whole model) would be twice the weights."""
    import tracemalloc

    model = _deep_model()
    weight_bytes = sum(int(np.prod(w.shape)) * 4 for w in model.weights)
    layer_bytes = max(int(np.prod(w.shape)) * 4 for w in model.weights)
    cle.equalize_model(model)  # one-time costs (traces, caches)
    tracemalloc.start()
    try:
        cle.equalize_model(model)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # A set's two layers in float64 (4 layer sizes) and their temporaries (measured 7.4); the
    # model has 8 such layers, so holding them all in float64 is 16 layer sizes (the plan of
    # every folded kernel at once measured 19.4).
    assert peak <= 10 * layer_bytes, (peak / layer_bytes, weight_bytes / layer_bytes)


def test_new_model_variables_are_independent_of_the_input_model():
    """Copied (unedited) and computed (folded) variables: writing to the new model's leaves the
    input model's as they were, and the other way round (a backend may share a buffer until a
    write, as TensorFlow does, but never across one)."""
    model = _model()
    before = [keras.ops.convert_to_numpy(w).copy() for w in model.weights]
    new = cle.equalize_model(model)
    after = [keras.ops.convert_to_numpy(w).copy() for w in new.weights]
    for w in new.weights:
        w.assign_add(keras.ops.ones(w.shape, w.dtype))
    for a, w in zip(before, model.weights):
        np.testing.assert_array_equal(a, keras.ops.convert_to_numpy(w))
    for w in model.weights:
        w.assign(keras.ops.zeros(w.shape, w.dtype))
    for a, w in zip(after, new.weights):
        np.testing.assert_array_equal(a + 1, keras.ops.convert_to_numpy(w))
