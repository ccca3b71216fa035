"""Quantization-aware fine-tuning with batch norms folded during training, then full-int8 TFLite.

Steps, on a small CNN and a synthetic 4-class task (oriented stripes in noise, 16x16 grey)::

    train a float model                 Conv → BN → ReLU blocks, depthwise block, Dense → BN
    cle.fuse_for_training(model, ...)   every layer → BN pair becomes one fused layer whose
                                        folded kernel goes through cle.FakeQuant(8)
    model.fit(...)                      fine-tune: batch statistics until ema_freeze_delay
                                        steps, moving statistics after
    cle.export_folded(qat)              plain Conv2D / DepthwiseConv2D / Dense, folded weights
    TFLiteConverter (full int8)         from_keras_model + representative dataset

It prints the accuracy of each stage, how far the exported Keras model is from the fused model
(should be float32 round-off: the same folded, fake-quantized kernels), and how far the int8
TFLite model's logits are from the exported model's. It runs in well under a minute on 2 CPU
cores.

Run::

    .venv/bin/python examples/qat_finetune.py [--seed 0] [--out model_int8.tflite]
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import io  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402


@contextlib.contextmanager
def quiet_stderr():
    """Silence the C++ logging TensorFlow and the TFLite converter write straight to fd 2
    (``TF_CPP_MIN_LOG_LEVEL`` does not cover absl's early messages); Python errors raised inside
    still propagate and are printed after stderr is restored."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


with quiet_stderr():
    import tensorflow as tf  # noqa: E402
    import keras  # noqa: E402

import numpy as np  # noqa: E402

from cle.quantization import convert_to_tflite_int8  # noqa: E402
from cle.training_fold import FakeQuant, export_folded, fuse_for_training  # noqa: E402

L = keras.layers
SIZE, CLASSES = 16, 4


def make_data(n, rng):
    """Oriented stripes (0°, 90°, 45°, 135°) with random frequency and phase, in noise."""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype("float32")
    labels = rng.integers(0, CLASSES, n)
    angles = np.array([0.0, 0.5, 0.25, 0.75])[labels] * np.pi
    freq = rng.uniform(0.5, 1.2, n)[:, None, None]
    phase = rng.uniform(0, 2 * np.pi, n)[:, None, None]
    proj = np.cos(angles)[:, None, None] * xx + np.sin(angles)[:, None, None] * yy
    images = np.sin(freq * proj + phase) + rng.normal(0.0, 2.0, (n, SIZE, SIZE))
    return images[..., None].astype("float32"), labels.astype("int32")


def build_model():
    inp = keras.Input((SIZE, SIZE, 1), name="image")
    h = L.Conv2D(16, 3, padding="same", use_bias=False, name="conv1")(inp)
    h = L.BatchNormalization(momentum=0.9, name="bn1")(h)
    h = L.ReLU(name="relu1")(h)
    h = L.DepthwiseConv2D(3, strides=2, padding="same", depth_multiplier=2, name="dw2")(h)
    h = L.BatchNormalization(momentum=0.9, name="bn2")(h)
    h = L.ReLU(name="relu2")(h)
    h = L.Conv2D(32, 1, use_bias=False, name="pw3")(h)
    h = L.BatchNormalization(momentum=0.9, name="bn3")(h)
    h = L.ReLU(name="relu3")(h)
    h = L.GlobalAveragePooling2D(name="pool")(h)
    h = L.Dense(32, name="fc4")(h)
    h = L.BatchNormalization(momentum=0.9, name="bn4")(h)
    h = L.ReLU(name="relu4")(h)
    out = L.Dense(CLASSES, name="logits")(h)
    return keras.Model(inp, out, name="stripes")


def compile_model(model, lr):
    model.compile(
        optimizer=keras.optimizers.Adam(lr),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )


def accuracy(logits, labels):
    return float((np.argmax(logits, axis=-1) == labels).mean())


def to_int8_tflite(model, calibration):
    """Full-integer TFLite model with int8 input and output (cle's converter wrapper)."""
    return convert_to_tflite_int8(model, calibration, integer_io=True)


def run_tflite(content, x):
    with quiet_stderr():
        interp = tf.lite.Interpreter(
            model_content=content,
            experimental_op_resolver_type=(
                tf.lite.experimental.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES),
        )
    inp, out = interp.get_input_details()[0], interp.get_output_details()[0]
    interp.resize_tensor_input(inp["index"], x.shape)
    interp.allocate_tensors()
    scale, zero = inp["quantization"]
    interp.set_tensor(inp["index"], np.clip(np.round(x / scale) + zero, -128, 127).astype(np.int8))
    interp.invoke()
    scale, zero = out["quantization"]
    y = (interp.get_tensor(out["index"]).astype("float32") - zero) * scale
    ops = sorted({d["op_name"] for d in interp._get_ops_details()})
    return y, inp["dtype"], ops


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="also write the int8 .tflite file here")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    keras.utils.set_random_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    x_train, y_train = make_data(2048, rng)
    x_test, y_test = make_data(512, rng)

    # 1. A float model with batch norms, trained briefly.
    model = build_model()
    compile_model(model, 3e-3)
    model.fit(x_train, y_train, batch_size=64, epochs=3, verbose=0)
    float_logits = model.predict(x_test, verbose=0)
    print(f"1. float model:        test accuracy {accuracy(float_logits, y_test):.3f}")

    # 2. Fuse every layer -> BN pair; the folded kernels go through an 8-bit fake quantizer.
    steps_per_epoch = len(x_train) // 64
    qat, pairs = fuse_for_training(
        model, kernel_quantizer=FakeQuant(bits=8), ema_freeze_delay=steps_per_epoch,
        return_pairs=True,
    )
    fused_names = ", ".join(f"{layer.name} ({type(layer).__name__})" for layer, _ in pairs)
    print(f"2. fuse_for_training:  {len(pairs)} fused: {fused_names}; {len(pairs.skipped)} skipped")
    qat_before = qat.predict(x_test, verbose=0)
    print(f"   fake-quantized, before fine-tuning: accuracy {accuracy(qat_before, y_test):.3f}")

    # 3. Fine-tune: one epoch with batch statistics, one with frozen moving statistics.
    compile_model(qat, 1e-3)
    qat.fit(x_train, y_train, batch_size=64, epochs=2, verbose=0)
    steps = sorted({int(keras.ops.convert_to_numpy(layer.step)) for layer, _ in pairs})
    qat_logits = qat.predict(x_test, verbose=0)
    print(f"3. fine-tuned (QAT):   test accuracy {accuracy(qat_logits, y_test):.3f}; "
          f"step counters {steps}, frozen after {steps_per_epoch}")

    # 4. Plain layers with the folded, fake-quantized weights.
    plain = export_folded(qat)
    kinds = sorted({type(layer).__name__ for layer in plain.layers})
    plain_logits = plain.predict(x_test, verbose=0)
    diff = float(np.abs(plain_logits - qat_logits).max() / np.abs(qat_logits).max())
    print(f"4. export_folded:      layers {kinds}")
    print(f"   max|exported - fused| / max|fused| = {diff:.2e}")

    # 5. Full-integer TFLite.
    content = to_int8_tflite(plain, x_train[:256])
    tfl_logits, in_dtype, ops = run_tflite(content, x_test)
    tfl_diff = float(np.abs(tfl_logits - plain_logits).max() / np.abs(plain_logits).max())
    agree = float((tfl_logits.argmax(-1) == plain_logits.argmax(-1)).mean())
    print(f"5. TFLite int8:        {len(content)} bytes, "
          f"input {np.dtype(in_dtype).name}, ops {ops}")
    print(f"   test accuracy {accuracy(tfl_logits, y_test):.3f}; top-1 agreement with Keras "
          f"{agree:.3f}; max|int8 - float| / max|float| = {tfl_diff:.3f}")
    if args.out:
        with open(args.out, "wb") as f:
            f.write(content)
        print(f"   written to {args.out}")
    print(f"done in {time.perf_counter() - start:.1f} s")
    if diff > 1e-5:
        print("ERROR: the exported model does not match the fused model", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
