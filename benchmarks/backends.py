"""Which public functions work on the current Keras backend, and how exact they are.

Run it once per backend (it prints one Markdown table per model, it asserts nothing)::

    KERAS_BACKEND=tensorflow .venv/bin/python benchmarks/backends.py
    KERAS_BACKEND=jax        .venv/bin/python benchmarks/backends.py
    KERAS_BACKEND=torch      /tmp/torchvenv/bin/python benchmarks/backends.py   # torch==2.13.0

``--write`` also writes the tables into the generated block ``backends-<backend>`` of
docs/backends.md (``backends-jax``, ``backends-torch``; scripts/_docblocks.py)::

    KERAS_BACKEND=jax   .venv/bin/python benchmarks/backends.py --models MobileNetV2 --write
    KERAS_BACKEND=torch /tmp/torchvenv/bin/python benchmarks/backends.py --models MobileNetV2 --write

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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "backends.md")
BACKEND_NAMES = {"tensorflow": "TensorFlow", "jax": "JAX", "torch": "PyTorch"}
FAILS = "FAILS: "

#: (model, function as a Markdown table cell, result)
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
        result = f"{FAILS}{type(e).__name__}: {msg}"
        if os.environ.get("CLE_BACKENDS_TRACE"):
            traceback.print_exc()
    dt = time.perf_counter() - t0
    ROWS.append((model_name, what, result))
    print(f"{model_name:12s} {what:70s} {result}   ({dt:.1f} s)", flush=True)


def exact(err):
    return f"exact {err:.1e}"


def by_design(err):
    return f"runs (changes the function by design: {err:.1e})"


def run_model(name, model, x, inputs="crops"):
    check(name, "`fold_all_batch_norms`", lambda: exact(rel(model, cle.fold_all_batch_norms(model)[1], x)))
    for relu6 in ("bound", "replace"):
        def eq(relu6=relu6):
            new = cle.equalize_model(model, relu6=relu6, high_bias_fold="none")
            err = rel(model, new, x)
            return exact(err) if relu6 == "bound" else by_design(err)
        check(name, f'`equalize_model(relu6="{relu6}")`', eq)
    check(name, '`equalize_model(high_bias_fold="unpadded")`', lambda: by_design(rel(model, cle.equalize_model(model, high_bias_fold="unpadded"), x)))

    def stepwise():
        bounded, _ = cle.replace_relu6_with_clipped_relu(model)
        _, folded = cle.fold_all_batch_norms(bounded)
        sets = cle.CrossLayerScaling.scale_model(folded)
        return f"{exact(rel(model, folded, x))} ({len(sets)} sets)"
    check(name, "stepwise: `replace_relu6_with_clipped_relu`, `fold_all_batch_norms`, "
          "`CrossLayerScaling.scale_model`", stepwise)

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
        return (f"runs (INT8 per-tensor weights SQNR {Q.sqnr_db(y, _np(q_plain(x))):.1f} → "
                f"{Q.sqnr_db(y, _np(q_corr(x))):.1f} dB)")
    check(name, '`equalize_model(bias_correction="analytic")`', lambda: bias_corr("analytic"))
    check(name, '`equalize_model(bias_correction="empirical")`', lambda: bias_corr("empirical"))

    def fused():
        f = cle.fuse_for_training(model)
        return f"exact {rel(model, f, x):.1e} / {rel(model, cle.export_folded(f), x):.1e}"
    check(name, "`fuse_for_training` / `export_folded` (inference)", fused)

    def fused_fit():
        f = cle.fuse_for_training(model, ema_freeze_delay=1)
        y = _np(model(x, training=False))
        f.compile(optimizer=keras.optimizers.SGD(1e-4), loss="mse")
        f.fit(x, y.astype("float32"), batch_size=len(x), epochs=2, verbose=0)
        fused_layer = next(l for l in f._flatten_layers() if hasattr(l, "is_frozen"))
        step = int(keras.ops.convert_to_numpy(fused_layer.step))
        intact = np.array_equal(_np(model(x, training=False)), y)  # no shared buffers
        return (f"runs; step counter {step} ({fused_layer.step.dtype}); "
                f"{'input model intact' if intact else 'INPUT MODEL CHANGED'}")
    check(name, "`fuse_for_training` + `fit` (2 steps)", fused_fit)

    def roundtrip():
        new = cle.equalize_model(model)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m.keras")
            new.save(path)
            loaded = keras.models.load_model(path)
        return exact(rel(model, loaded, x))
    check(name, "`equalize_model` → `.keras` save / load", roundtrip)
    check(name, "`quantization.fake_quantize_weights`", lambda: f"runs (INT8 per-channel weights SQNR {Q.sqnr_db(_np(model(x, training=False)), _np(Q.fake_quantize_weights(model, per_channel=True)(x))):.1f} dB)")

    def tflite():
        try:
            content = Q.convert_to_tflite_int8(cle.equalize_model(model), x[:4])
        except RuntimeError as e:
            # cle's own check, before any work (TF Lite cannot convert a PyTorch-backend model)
            if keras.backend.backend() == "torch" and "needs the TensorFlow or JAX" in str(e):
                return ("not on PyTorch: `RuntimeError` from cle (TF Lite's converter cannot "
                        "read the model, see below)")
            raise
        y_tfl = Q.run_tflite(content, x[:4])
        return (f"runs (full INT8, {Q.sqnr_db(_np(model(x[:4], training=False)), y_tfl):.1f} dB "
                f"on the first 4 {inputs}, TensorFlow installed)")
    check(name, "`quantization.convert_to_tflite_int8` / `run_tflite`", tflite)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["MobileNetV2", "ResNet50"])
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--write", action="store_true",
                    help="write the tables into block backends-<backend> of docs/backends.md")
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
    if args.write:  # fail before the measurements, not after
        sys.path.insert(0, os.path.join(ROOT, "scripts"))
        from _docblocks import blocks, replace_block

        if f"backends-{backend}" not in blocks(PAGE):
            ap.error(f"{os.path.relpath(PAGE, ROOT)} has no block <!-- generated:backends-{backend} -->")
    described = {}
    for name in args.models:
        if name == "MobileNetV2":
            model = pretrained.mobilenet_v2_imagenet()
            x = pretrained.preprocess_imagenet(pretrained.sample_images(args.images))
            described[name] = f"real MobileNetV2, {len(x)} photo crops"
            run_model(name, model, x, inputs="crops")
        else:
            model = keras.applications.ResNet50(weights=None, classifier_activation=None)
            randomize_biases(randomize_batch_norms(model, deep=True), scale=0.1)
            x = np.random.default_rng(3).normal(size=(args.images, 224, 224, 3)).astype("float32")
            described[name] = (f"ResNet50 (random weights, trained-like BN statistics and biases), "
                               f"{len(x)} random inputs")
            run_model(name, model, x, inputs="inputs")
    # "jax 0.10.2, keras 3.15.1": the backend's package first
    pkgs = ", ".join(f"{pkg} {v}" for pkg, v in sorted(versions.items(), key=lambda kv: kv[0] == "keras"))
    text = render_tables(BACKEND_NAMES.get(backend, backend), pkgs, described, ROWS)
    print()
    print(text)
    if args.write:
        changed = replace_block(PAGE, f"backends-{backend}", text)
        print(f"{'wrote' if changed else 'unchanged:'} {os.path.relpath(PAGE, ROOT)} "
              f"block backends-{backend}", flush=True)


def render_tables(backend, versions, described, rows):
    """One ``### <backend> (<versions>), <model>`` heading and ``| function | result |`` table
    per model, then whether every row finished."""
    out = []
    for name, what in described.items():
        mine = [(f, r) for m, f, r in rows if m == name]
        failed = sum(r.startswith(FAILS) for _, r in mine)
        out += [f"### {backend} ({versions}), {what}", "",
                "| function | result |", "|---|---|"]
        out += [f"| {f} | {r.replace('|', '&#124;')} |" for f, r in mine]  # an exception's "|"
        out += ["", "Every row finished." if not failed else
                f"{failed} of {len(mine)} rows failed (`FAILS`: exception type and message).", ""]
    return "\n".join(out)


if __name__ == "__main__":
    main()
