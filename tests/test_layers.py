"""cle.layers.ClippedReLU: numerics, the ReLU6 scaling identity, serialization, TFLite."""

import contextlib
import io
import os
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from cle.layers import ClippedReLU  # noqa: E402
from conftest import needs_nchw_conv  # noqa: E402

L = keras.layers


def _np(x):
    return keras.ops.convert_to_numpy(x)


def _reference(x, caps, axis):
    shape = [1] * x.ndim
    shape[axis] = -1
    return np.minimum(np.maximum(x, 0.0), np.reshape(caps, shape).astype(x.dtype))


# --------------------------------------------------------------------------------- numerics


@pytest.mark.parametrize(
    "shape, axis",
    [
        ((5, 4), -1),  # rank 2 (Dense features)
        ((2, 6, 7, 4), -1),  # rank 4 channels_last
        ((2, 4, 6, 7), 1),  # rank 4 channels_first
        ((2, 9, 4), -1),  # rank 3
        ((2, 4, 3, 3, 3), 1),  # rank 5 channels_first
    ],
)
def test_matches_numpy(shape, axis):
    rng = np.random.default_rng(0)
    caps = np.array([0.25, 1.0, 2.5, 6.0], dtype="float32")
    x = rng.normal(0.0, 3.0, shape).astype("float32")
    layer = ClippedReLU(caps=caps, axis=axis)
    y = _np(layer(x))
    assert y.shape == x.shape and y.dtype == np.float32
    np.testing.assert_array_equal(y, _reference(x, caps, axis))
    assert layer.caps.shape == (4,)
    assert layer.compute_output_shape((None,) + shape[1:]) == (None,) + shape[1:]


def test_scalar_caps_equals_relu6_exactly():
    rng = np.random.default_rng(1)
    x = rng.normal(0.0, 5.0, (3, 8, 8, 5)).astype("float32")
    x[0, 0, 0, :] = [-0.0, 0.0, 6.0, 6.000001, -1e30]
    layer = ClippedReLU()  # default 6.0
    np.testing.assert_array_equal(_np(layer(x)), _np(L.ReLU(max_value=6.0)(x)))
    np.testing.assert_array_equal(_np(layer.caps), np.full(5, 6.0, "float32"))
    np.testing.assert_array_equal(_np(ClippedReLU(caps=6)(x)), _np(L.ReLU(max_value=6.0)(x)))


def test_negative_inputs_give_zero():
    x = -np.abs(np.random.default_rng(2).normal(size=(4, 3))).astype("float32") - 1e-3
    y = _np(ClippedReLU(caps=[0.5, 1.0, 2.0])(x))
    np.testing.assert_array_equal(y, np.zeros_like(x))
    assert not np.signbit(y).any()


def test_scaling_identity_across_relu6():
    """s · ClippedReLU(caps=6/s)(x) == ReLU6(s · x) for s > 0, to float32 rounding."""
    rng = np.random.default_rng(3)
    for axis, shape in [(-1, (4, 5, 5, 16)), (1, (4, 16, 5, 5)), (-1, (32, 16))]:
        s = rng.uniform(0.05, 20.0, 16).astype("float32")
        bshape = [1] * len(shape)
        bshape[axis] = 16
        s_b = s.reshape(bshape)
        x = rng.normal(0.0, 2.0, shape).astype("float32")
        lhs = s_b * _np(ClippedReLU(caps=6.0 / s, axis=axis)(x))
        rhs = _np(L.ReLU(max_value=6.0)(s_b * x))
        # Equal where unclipped (both are fl(s·x)); where clipped, fl(s·fl(6/s)) is within
        # two float32 ulps of 6 (2 · 2^-23 ≈ 2.4e-7).
        np.testing.assert_allclose(lhs, rhs, rtol=2.4e-7, atol=0.0)


def test_dtype_policy_casts_caps():
    layer = ClippedReLU(caps=[1.0, 2.0], dtype="mixed_float16")
    x = np.array([[3.0, 3.0], [-1.0, 1.5]], dtype="float32")
    y = layer(x)
    assert keras.backend.standardize_dtype(y.dtype) == "float16"
    assert keras.backend.standardize_dtype(layer.caps.dtype) == "float32"
    np.testing.assert_array_equal(_np(y).astype("float32"), [[1.0, 2.0], [0.0, 1.5]])


# ------------------------------------------------------------------------------ validation


def test_unknown_channel_dim_raises():
    layer = ClippedReLU(caps=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="known channel dimension"):
        layer.build((None, 5, None))
    with pytest.raises(ValueError, match="known channel dimension"):
        ClippedReLU(axis=1).build((None, None, 4, 4))


@pytest.mark.parametrize(
    "kwargs, shape, match",
    [
        ({"caps": [1.0, 2.0]}, (None, 3), "2 caps but the input has 3 channels"),
        ({"axis": 2}, (None, 3), "not a channel axis"),
        ({"axis": 0}, (None, 3), "not a channel axis"),
        ({}, (3,), "rank >= 2"),
    ],
)
def test_bad_build_raises(kwargs, shape, match):
    with pytest.raises(ValueError, match=match):
        ClippedReLU(**kwargs).build(shape)


@pytest.mark.parametrize(
    "caps, match",
    [([[1.0, 2.0]], "scalar or a non-empty 1-D"), ([], "scalar or a non-empty 1-D"),
     ([1.0, float("nan")], "NaN")],
)
def test_bad_caps_raise(caps, match):
    with pytest.raises(ValueError, match=match):
        ClippedReLU(caps=caps)


# --------------------------------------------------------------------------- serialization


def test_config_round_trip():
    scalar = ClippedReLU(caps=4.5, axis=1, name="c1")
    config = scalar.get_config()
    assert config["caps"] == 4.5 and config["axis"] == 1
    clone = ClippedReLU.from_config(config)
    assert clone.get_config() == config
    np.testing.assert_array_equal(_np(clone(np.full((1, 3, 2), 9.0, "float32"))), 4.5)

    per_channel = ClippedReLU(caps=np.linspace(0.5, 6.0, 64), name="c2")
    per_channel.build((None, 64))
    config = per_channel.get_config()
    # Per-channel values are weights, not config.
    assert config["caps"] is None and config["axis"] == -1
    assert all(np.size(v) <= 1 for k, v in config.items() if k != "dtype")
    clone = ClippedReLU.from_config(config)
    assert clone.get_config() == config
    clone.build((None, 64))
    clone.set_weights(per_channel.get_weights())
    x = np.random.default_rng(4).normal(0.0, 4.0, (3, 64)).astype("float32")
    np.testing.assert_array_equal(_np(clone(x)), _np(per_channel(x)))
    assert keras.saving.get_registered_name(ClippedReLU) == "cle>ClippedReLU"


def test_caps_is_non_trainable_weight():
    layer = ClippedReLU(caps=[1.0, 2.0, 3.0])
    layer.build((None, 3))
    assert layer.trainable_weights == []
    assert [w.path for w in layer.non_trainable_weights] == [f"{layer.name}/caps"]
    assert layer.caps.name == "caps"


def test_caps_assign_in_place_changes_output():
    layer = ClippedReLU(caps=[6.0, 6.0, 6.0])
    x = np.array([[1.0, 3.0, 5.0]], dtype="float32")
    np.testing.assert_array_equal(_np(layer(x)), x)
    caps_var = layer.caps
    layer.caps.assign(layer.caps - np.array([0.0, 1.0, 2.5], "float32"))  # high-bias folding
    assert layer.caps is caps_var
    np.testing.assert_array_equal(_np(layer(x)), [[1.0, 3.0, 3.5]])


def _functional_model(channels_first=False):
    axis = 1 if channels_first else -1
    fmt = "channels_first" if channels_first else "channels_last"
    inp = keras.Input((3, 8, 8) if channels_first else (8, 8, 3))
    h = L.Conv2D(5, 3, padding="same", data_format=fmt, name="conv_a")(inp)
    h = ClippedReLU(caps=6.0, axis=axis, name="clip")(h)
    out = L.Conv2D(2, 3, data_format=fmt, name="conv_b")(h)
    return keras.Model(inp, out)


@pytest.mark.parametrize("channels_first", [False, pytest.param(True, marks=needs_nchw_conv)])
def test_keras_save_load_round_trip(tmp_path, channels_first):
    model = _functional_model(channels_first)
    rng = np.random.default_rng(5)
    caps = np.array([0.3, 0.9, 1.7, 2.2, 6.0], "float32")
    model.get_layer("clip").caps.assign(caps)
    x = rng.normal(0.0, 1.0, (4,) + tuple(model.inputs[0].shape[1:])).astype("float32")
    y = _np(model(x))

    path = tmp_path / "clipped.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)  # no custom_objects: registered under "cle"
    clip = loaded.get_layer("clip")
    assert isinstance(clip, ClippedReLU) and clip.axis == (1 if channels_first else -1)
    np.testing.assert_array_equal(_np(clip.caps), caps)
    np.testing.assert_array_equal(_np(loaded(x)), y)


# ---------------------------------------------------------------------------------- TFLite


def _convert(converter):
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        return converter.convert()


def _interpreter(tf, content):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType  # LiteRT, not tf.lite

    return Interpreter(model_content=content,
                       experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)


def _run_tflite(tf, content, x):
    interp = _interpreter(tf, content)
    inp = interp.get_input_details()[0]
    interp.resize_tensor_input(inp["index"], x.shape)
    interp.allocate_tensors()
    inp = interp.get_input_details()[0]
    out = interp.get_output_details()[0]
    if inp["dtype"] == np.int8:
        scale, zero = inp["quantization"]
        x = np.clip(np.round(x / scale) + zero, -128, 127).astype(np.int8)
    interp.set_tensor(inp["index"], x)
    interp.invoke()
    y = interp.get_tensor(out["index"])
    if out["dtype"] == np.int8:
        scale, zero = out["quantization"]
        y = (y.astype(np.float32) - zero) * scale
    return y, interp


def _analyzer_ops(tf, content):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        tf.lite.experimental.Analyzer.analyze(model_content=content, gpu_compatibility=False)
    text = buf.getvalue()
    ops = [line.split()[1] for line in text.splitlines() if line.strip().startswith("Op#")]
    return [op.split("(")[0] for op in ops]


def _fused_activations(content):
    """{op index: fused activation name} of the main subgraph, via the flatbuffer schema."""
    try:
        from tensorflow.lite.python import schema_py_generated as schema
    except ImportError:  # private module; the check that uses it is best-effort
        return None
    model = schema.ModelT.InitFromPackedBuf(bytearray(content), 0)
    names = {v: k for k, v in vars(schema.ActivationFunctionType).items() if not k.startswith("_")}
    out = {}
    for i, op in enumerate(model.subgraphs[0].operators):
        act = getattr(op.builtinOptions, "fusedActivationFunction", None)
        if act is not None:
            out[i] = names[act]
    return out


@pytest.fixture(scope="module")
def tflite_setup():
    if keras.backend.backend() != "tensorflow":
        pytest.skip("TensorFlow backend only (TFLite conversion of a Keras model)")
    tf = pytest.importorskip("tensorflow")
    keras.utils.set_random_seed(7)
    inp = keras.Input((12, 12, 3))
    h = L.Conv2D(8, 3, padding="same", name="conv_a")(inp)
    h = ClippedReLU(name="clip")(h)
    out = L.Conv2D(4, 3, name="conv_b")(h)
    model = keras.Model(inp, out)
    rng = np.random.default_rng(8)
    model.get_layer("conv_a").bias.assign(rng.normal(0.0, 0.3, 8))
    model.get_layer("conv_b").bias.assign(rng.normal(0.0, 0.3, 4))
    # Non-uniform caps, some well inside the activation range so the MINIMUM really clips.
    caps = np.array([0.2, 0.5, 0.8, 1.0, 1.5, 2.0, 3.0, 6.0], "float32")
    model.get_layer("clip").caps.assign(caps)

    def representative_dataset():
        r = np.random.default_rng(9)
        for _ in range(16):
            yield [r.normal(0.0, 1.0, (1, 12, 12, 3)).astype("float32")]

    float_content = _convert(tf.lite.TFLiteConverter.from_keras_model(model))

    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = representative_dataset
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = tf.int8
    converter.inference_output_type = tf.int8
    int8_content = _convert(converter)

    x = np.random.default_rng(10).normal(0.0, 1.0, (16, 12, 12, 3)).astype("float32")
    return tf, model, caps, x, float_content, int8_content


def test_tflite_float_matches_keras(tflite_setup):
    tf, model, _, x, float_content, _ = tflite_setup
    y_keras = _np(model(x))
    # The caps really clip: some channels of the activation sit at their cap.
    h = _np(keras.Model(model.input, model.get_layer("clip").output)(x))
    at_cap = (h == _np(model.get_layer("clip").caps)).mean(axis=(0, 1, 2))
    assert (at_cap[:4] > 0.05).all(), at_cap
    y_tfl, _ = _run_tflite(tf, float_content, x)
    rel = np.abs(y_tfl - y_keras).max() / np.abs(y_keras).max()
    assert rel <= 1e-5, rel
    ops = _analyzer_ops(tf, float_content)
    assert "MINIMUM" in ops, ops


def test_tflite_int8_full_integer(tflite_setup):
    tf, model, caps, x, float_content, int8_content = tflite_setup
    ops = _analyzer_ops(tf, int8_content)
    assert ops == ["CONV_2D", "MINIMUM", "CONV_2D"], ops
    # The ReLU is fused into the first convolution; nothing else is left of the activation.
    fused = _fused_activations(int8_content)
    if fused is not None:
        assert fused[0] == "RELU", fused

    y_int8, interp = _run_tflite(tf, int8_content, x)
    # No float fallback: every tensor any op reads or writes is an integer tensor.
    tensors = {t["index"]: t for t in interp.get_tensor_details()}
    for op in interp._get_ops_details():
        for i in list(op["inputs"]) + list(op["outputs"]):
            if i >= 0:
                assert tensors[i]["dtype"] in (np.int8, np.int32), (op["op_name"], tensors[i])
    # The cap vector is an INT8 constant sharing the activation's quantization.
    minimum = next(op for op in interp._get_ops_details() if op["op_name"] == "MINIMUM")
    act, cap_t = (tensors[i] for i in minimum["inputs"])
    assert cap_t["dtype"] == np.int8 and tuple(cap_t["shape"]) == (1, 1, 1, 8)
    assert cap_t["quantization"] == act["quantization"]
    scale, zero = cap_t["quantization"]
    q_caps = (interp.get_tensor(cap_t["index"]).astype(np.float32).ravel() - zero) * scale
    # Caps inside the calibrated range are kept to half a step; larger ones saturate at the
    # top of the range, which the activation can not exceed anyway.
    top = (127 - zero) * scale
    np.testing.assert_allclose(q_caps, np.minimum(caps, top), rtol=0, atol=scale / 2 + 1e-7)

    y_float, _ = _run_tflite(tf, float_content, x)
    sqnr = 10.0 * np.log10(np.sum(y_float**2) / np.sum((y_int8 - y_float) ** 2))
    assert sqnr > 20.0, sqnr
