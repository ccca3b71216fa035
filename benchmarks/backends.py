"""Which public functions work on the current Keras backend, and how exact they are.

Run it once per backend (it prints a Markdown table for docs/backends.md, it asserts nothing)::

    KERAS_BACKEND=tensorflow .venv/bin/python benchmarks/backends.py
    KERAS_BACKEND=jax        .venv/bin/python benchmarks/backends.py
    KERAS_BACKEND=torch      /tmp/torchvenv/bin/python benchmarks/backends.py   # torch==2.13.0

Models: the real pretrained MobileNetV2 (``cle.pretrained``, real photo crops) and
``keras.applications.ResNet50(weights=None)`` with randomized, trained-like BN statistics and
biases (random inputs). "exact" is ``max|y_new − y| / max|y|`` against the input model, for the
transforms that keep the float function (folding, equalization with relu6="bound", fusing for
training, ``.keras`` round trips). Transforms that change the function on purpose (bias
correction, relu6="replace", fake quantization) report "runs" and a sanity figure instead.
Every check is wrapped: a failure prints its exception type and first line instead of stopping.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from conftest import randomize_batch_norms, randomize_biases  # noqa: E402

import cle  # noqa: E402
from cle import pretrained  # noqa: E402
from cle import quantization as Q  # noqa: E402

ROWS: list[tuple[str, str, str]] = []


def _np(y):
    return keras.ops.convert_to_numpy(y).astype(np.float64)


def rel(ref, new, x):
    a, b = _np(ref(x, training=False)), _np(new(x, training=False))
    return float(np.abs(a - b).max() / np.abs(a).max())


def check(model_name, what, fn):
    t0 = time.perf_counter()
    try:
        result = fn()
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        msg = str(e).strip().splitlines()[0][:140] if str(e).strip() else ""
        result = f"FAILS: {type(e).__name__}: {msg}"
        if os.environ.get("CLE_BACKENDS_TRACE"):
            traceback.print_exc()
    dt = time.perf_counter() - t0
    ROWS.append((model_name, what, result))
    print(f"{model_name:12s} {what:55s} {result}   ({dt:.1f} s)", flush=True)


def exact(err):
    return f"exact {err:.1e}"


def run_model(name, model, x):
    check(name, "fold_all_batch_norms", lambda: exact(rel(model, cle.fold_all_batch_norms(model)[1], x)))
    for relu6 in ("bound", "replace"):
        def eq(relu6=relu6):
            new = cle.equalize_model(model, relu6=relu6, high_bias_fold="none")
            err = rel(model, new, x)
            return exact(err) if relu6 == "bound" else f"runs (changes the function: {err:.1e})"
        check(name, f"equalize_model(relu6={relu6!r})", eq)
    check(name, "equalize_model(high_bias_fold='unpadded')", lambda: f"runs ({rel(model, cle.equalize_model(model, high_bias_fold='unpadded'), x):.1e})")

    def stepwise():
        bounded, _ = cle.replace_relu6_with_clipped_relu(model)
        _, folded = cle.fold_all_batch_norms(bounded)
        sets = cle.CrossLayerScaling.scale_model(folded)
        return f"{exact(rel(model, folded, x))} ({len(sets)} sets)"
    check(name, "stepwise: replace_relu6_with_clipped_relu, fold, scale_model", stepwise)

    def bias_corr(mode):
        # per_channel_weights=False: equalization and correction target the per-tensor INT8
        # weights measured here (the default targets per-channel weights, whose per-tensor
        # figure is no sanity check: 9.4 dB on the real MobileNetV2, on every backend).
        kwargs = {"calibration_data": x} if mode == "empirical" else {}
        new = cle.equalize_model(model, bias_correction=mode, per_channel_weights=False, **kwargs)
        q_plain = Q.fake_quantize_weights(cle.equalize_model(model, per_channel_weights=False),
                                          per_channel=False)
        q_corr = Q.fake_quantize_weights(new, per_channel=False)
        y = _np(model(x, training=False))
        return (f"runs (INT8 per-tensor SQNR {Q.sqnr_db(y, _np(q_plain(x))):.1f} dB → "
                f"{Q.sqnr_db(y, _np(q_corr(x))):.1f} dB)")
    check(name, "equalize_model(bias_correction='analytic')", lambda: bias_corr("analytic"))
    check(name, "equalize_model(bias_correction='empirical')", lambda: bias_corr("empirical"))

    def fused():
        f = cle.fuse_for_training(model)
        return f"{exact(rel(model, f, x))}; export_folded {exact(rel(model, cle.export_folded(f), x))}"
    check(name, "fuse_for_training / export_folded (inference)", fused)

    def fused_fit():
        f = cle.fuse_for_training(model, ema_freeze_delay=1)
        y = _np(model(x, training=False))
        f.compile(optimizer=keras.optimizers.SGD(1e-4), loss="mse")
        f.fit(x, y.astype("float32"), batch_size=len(x), epochs=2, verbose=0)
        fused_layer = next(l for l in f._flatten_layers() if hasattr(l, "is_frozen"))
        step = int(keras.ops.convert_to_numpy(fused_layer.step))
        intact = np.array_equal(_np(model(x, training=False)), y)  # no shared buffers
        return f"runs (step {step} {fused_layer.step.dtype}, input model intact: {intact})"
    check(name, "fuse_for_training + fit 2 steps", fused_fit)

    def roundtrip():
        new = cle.equalize_model(model)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m.keras")
            new.save(path)
            loaded = keras.models.load_model(path)
        return exact(rel(model, loaded, x))
    check(name, "equalize_model → .keras save/load", roundtrip)
    check(name, "quantization.fake_quantize_weights", lambda: f"runs (INT8 per-channel SQNR {Q.sqnr_db(_np(model(x, training=False)), _np(Q.fake_quantize_weights(model, per_channel=True)(x))):.1f} dB)")

    def tflite():
        content = Q.convert_to_tflite_int8(cle.equalize_model(model), x[:4])
        y_tfl = Q.run_tflite(content, x[:4])
        return f"runs (SQNR vs float {Q.sqnr_db(_np(model(x[:4], training=False)), y_tfl):.1f} dB)"
    check(name, "quantization.convert_to_tflite_int8 / run_tflite", tflite)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["MobileNetV2", "ResNet50"])
    ap.add_argument("--images", type=int, default=8)
    args = ap.parse_args(argv)
    import importlib.metadata as md

    backend = keras.backend.backend()
    versions = {"keras": md.version("keras")}
    for pkg in {"tensorflow": ["tensorflow-cpu", "tensorflow"], "jax": ["jax"],
                "torch": ["torch"]}[backend]:
        try:
            versions[pkg] = md.version(pkg)
            break
        except md.PackageNotFoundError:
            pass
    print(f"backend {backend}, {versions}", flush=True)
    for name in args.models:
        if name == "MobileNetV2":
            model = pretrained.mobilenet_v2_imagenet()
            x = pretrained.preprocess_imagenet(pretrained.sample_images(args.images))
        else:
            model = keras.applications.ResNet50(weights=None, classifier_activation=None)
            randomize_biases(randomize_batch_norms(model, deep=True), scale=0.1)
            x = np.random.default_rng(3).normal(size=(args.images, 224, 224, 3)).astype("float32")
        run_model(name, model, x)
    print()
    print(f"| model | function | {backend} |")
    print("|---|---|---|")
    for m, what, result in ROWS:
        print(f"| {m} | {what} | {result} |")


if __name__ == "__main__":
    main()
