"""The rebuild skips random weight initialization (every weight is copied afterwards) and the
scaling math works layer by layer in float64 without float64 copies of whole kernels; neither
may change a result or a config."""

import keras
import numpy as np
from conftest import RTOL, inputs_for, max_rel_error, randomize_batch_norms, randomize_biases

import cle
from cle import _cls_math

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
        r32 = _cls_math.channel_ranges(k32, axis, kind, groups)
        r64 = _cls_math.channel_ranges(k64, axis, kind, groups)
        assert r32.dtype == np.float64
        np.testing.assert_array_equal(r32, r64)
        f = rng.uniform(0.5, 2.0, r64.shape[0])
        s32 = _cls_math.scale_channels(k32, f, axis, kind, groups)
        assert s32.dtype == np.float64
        np.testing.assert_array_equal(s32, _cls_math.scale_channels(k64, f, axis, kind, groups))
