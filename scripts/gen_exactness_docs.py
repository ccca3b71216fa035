"""Measures how exact BN folding and cross-layer equalization are, and how much equalization
flattens the weight ranges, and writes those figures into the docs:

- docs/batch_norm_folding.md ``exactness-fold``: BNs folded / skipped and ``max|Δ| / max|y|``
  of ``cle.fold_all_batch_norms`` against the input model on randomized-BN
  ``keras.applications`` networks (MobileNetV2, ResNet50, EfficientNetB0, DenseNet121 at
  224×224; EfficientNetB0 in float64 with the wide BN spread) and on the real pretrained
  MobileNetV2 (96 photo crops, top-1 compared on each); DenseNet121's skips by the layer the
  BN's input comes from;
- docs/results.md ``exactness-transforms``: the exactness table of every transform (the same
  measurements, plus ``equalize_model`` with ``objective="weights"`` and with the defaults, and
  ``export_folded(fuse_for_training(m))``);
- docs/results.md ``exactness-depthwise``: the weights of ``expanded_conv_depthwise`` of the real
  MobileNetV2 after BN folding and after weight-range equalization (what ``cle_demo_ranges.png``
  shows);
- docs/cross_layer_equalization.md ``exactness-cle``: ``equalize_model`` exactness on the real
  MobileNetV2 (64 photo crops) and on the randomized-BN networks in the ``"bound"`` and
  ``"keep"`` modes, and the weight range spread (largest / median per-output-channel range,
  :func:`cle.quantization.weight_range_spread`) after BN folding and after equalization.

The randomized networks are those of tests/test_fold_applications.py: ``weights=None`` kernels
(drawn under ``keras.utils.set_random_seed``), BN statistics from tests/conftest.py
``randomize_batch_norms(seed=11, deep=True)``, biases from ``randomize_biases(seed=12,
scale=0.1)``, a batch of 2 uniform random inputs (seed 5). Everything is seeded: a rerun on
the same machine and library versions writes the same figures (another CPU or version may
differ in the last digit). One network is alive at a time.

Run::

    .venv/bin/python scripts/gen_exactness_docs.py            # measures, writes the docs
    .venv/bin/python scripts/gen_exactness_docs.py --print    # measures, prints only

``make results`` runs it with the other generators (about 30 s on 2 cores). Too slow for
the test suite: tests/test_docs.py checks the blocks' form and that this script owns them.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import gc  # noqa: E402
import pathlib  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))

from _docblocks import fmt_error as fmt, publish, wrap  # noqa: E402

FOLD_DOC = ROOT / "docs" / "batch_norm_folding.md"
RESULTS_DOC = ROOT / "docs" / "results.md"
CLE_DOC = ROOT / "docs" / "cross_layer_equalization.md"

#: Randomized-BN networks at 224×224; which of them are also equalized.
NETWORKS = ("MobileNetV2", "ResNet50", "EfficientNetB0", "DenseNet121")
EQUALIZED = ("MobileNetV2", "ResNet50", "EfficientNetB0")
SIZE, BATCH = 224, 2
BN_SEED, BIAS_SEED, BIAS_SCALE, INPUT_SEED, KERNEL_SEED = 11, 12, 0.1, 5, 0
#: EfficientNetB0 in float64 with the wide BN spread (tests/test_fold_applications.py).
FLOAT64_SIZE = 96
#: Real photo crops (cle.pretrained.sample_images): for folding, for equalization (the crops
#: of tests/test_fold_applications.py and tests/test_equalize.py).
FOLD_PHOTOS, FOLD_PHOTO_SEED = 96, 0
EQ_PHOTOS, EQ_PHOTO_SEED = 64, 1
FIRST_DEPTHWISE = "expanded_conv_depthwise"
NO_HBF = {"relu6": "bound", "high_bias_fold": "none"}


def minus(v: float, spec: str) -> str:
    """A number with a typographic minus sign, as the hand-written prose."""
    return format(v, spec).replace("-", "−")


def versions() -> str:
    import keras

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        backend = f"TensorFlow {tf.__version__}"
    return f"CPU, Keras {keras.__version__}, {backend}"


def machine() -> str:
    # No load average: these figures do not depend on the load, and a rerun writes the same text.
    return f"`scripts/gen_exactness_docs.py` on {os.cpu_count()} CPU cores"


def _top1(y, y_new) -> str:
    same = int((y.argmax(1) == y_new.argmax(1)).sum())
    return ("same top-1 on every crop" if same == len(y)
            else f"same top-1 on {same} of {len(y)} crops")


def _rel(y, y_new) -> float:
    import numpy as np

    return float(np.abs(y - y_new).max() / np.abs(y).max())


def _scaled(report) -> str:
    return f"{len(report.sets)} of {len(report.scaling)} sets scaled"


def _depthwise_extremes(model):
    """(min, max) of the channel with the largest range, and the largest |w|, of
    :data:`FIRST_DEPTHWISE`."""
    import keras
    import numpy as np

    k = keras.ops.convert_to_numpy(model.get_layer(FIRST_DEPTHWISE).kernel).astype(np.float64)
    w = k.reshape(k.shape[0] * k.shape[1], -1).T  # (channels, taps)
    c = int(np.abs(w).max(axis=1).argmax())
    return float(w[c].min()), float(w[c].max()), float(np.abs(w).max())


def _spread_summary(spread: dict, names: list) -> dict:
    import numpy as np

    vals = np.array([spread[n] for n in names], dtype=float)
    return {"first": spread[FIRST_DEPTHWISE], "median": float(np.median(vals)),
            "largest": float(vals.max())}


# --------------------------------------------------------------------------- real MobileNetV2


def measure_real():
    """The real ImageNet MobileNetV2: folding on 96 crops, equalization (weights / quantized
    objective) on 64 crops, weight range spreads and the first depthwise kernel's extremes."""
    import numpy as np

    import cle
    from cle import pretrained
    from cle import quantization as q

    model = pretrained.mobilenet_v2_imagenet()
    r = {}

    def predict(m, x):
        return np.asarray(m.predict(x, batch_size=32, verbose=0), dtype=np.float64)

    x = pretrained.preprocess_imagenet(pretrained.sample_images(FOLD_PHOTOS, seed=FOLD_PHOTO_SEED))
    y = predict(model, x)
    pairs, folded = cle.fold_all_batch_norms(model)
    y_new = predict(folded, x)
    r["fold"] = {"folded": len(pairs), "skipped": len(pairs.skipped), "err": _rel(y, y_new),
                 "top1": _top1(y, y_new)}
    spread = {"folded": q.weight_range_spread(folded)}
    r["depthwise"] = {"folded": _depthwise_extremes(folded)}
    del folded, pairs
    gc.collect()

    x = pretrained.preprocess_imagenet(pretrained.sample_images(EQ_PHOTOS, seed=EQ_PHOTO_SEED))
    y = predict(model, x)
    for objective in ("weights", "quantized"):
        new, report = cle.equalize_model(model, objective=objective, return_report=True, **NO_HBF)
        y_new = predict(new, x)
        r[objective] = {"err": _rel(y, y_new), "top1": _top1(y, y_new),
                        "scaled": _scaled(report), "folded": len(report.folded)}
        spread[objective] = q.weight_range_spread(new)
        r["depthwise"][objective] = _depthwise_extremes(new)
        del new, report
        gc.collect()
    names = [n for n in spread["folded"] if all(n in s for s in spread.values())]
    r["kernels"] = len(names)
    r["spread"] = {k: _spread_summary(s, names) for k, s in spread.items()}
    del model
    gc.collect()
    return r


# --------------------------------------------------------------------------- randomized BN


def _randomized(name):
    import keras
    from conftest import randomize_batch_norms, randomize_biases

    keras.utils.set_random_seed(KERNEL_SEED)
    model = getattr(keras.applications, name)(weights=None, input_shape=(SIZE, SIZE, 3),
                                              classifier_activation=None)
    return randomize_biases(randomize_batch_norms(model, seed=BN_SEED, deep=True),
                            seed=BIAS_SEED, scale=BIAS_SCALE)


def _skip_sources(skipped) -> dict:
    """``{layer class: count}`` of the layers the skipped BNs' inputs come from."""
    out: dict[str, int] = {}
    for s in skipped:
        m = re.search(r"its input comes from '[^']*' \((\w+)\)", s.reason)
        key = m.group(1) if m else "other"
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def measure_randomized(name):
    import numpy as np
    from conftest import max_rel_error

    import cle

    model = _randomized(name)
    x = np.random.default_rng(INPUT_SEED).uniform(-1, 1, (BATCH, SIZE, SIZE, 3)).astype("float32")
    pairs, folded = cle.fold_all_batch_norms(model)
    r = {"folded": len(pairs), "skipped": len(pairs.skipped),
         "fold": max_rel_error(model, folded, x), "sources": _skip_sources(pairs.skipped)}
    del folded, pairs
    gc.collect()
    if name in EQUALIZED:
        for key, kwargs in (("bound", {"objective": "weights", **NO_HBF}),
                            ("keep", {"objective": "weights", "relu6": "keep",
                                      "high_bias_fold": "none"}),
                            ("quantized", {})):
            new, report = cle.equalize_model(model, return_report=True, **kwargs)
            r[key] = {"err": max_rel_error(model, new, x), "scaled": _scaled(report)}
            del new, report
            gc.collect()
    if name == "MobileNetV2":
        from cle.training_fold import export_folded, fuse_for_training

        fused = fuse_for_training(model)
        r["export"] = max_rel_error(fused, export_folded(fused), x)
        del fused
    del model
    gc.collect()
    return r


def measure_float64():
    """EfficientNetB0 in float64 with the wide BN spread (tests/test_fold_applications.py)."""
    import keras
    import numpy as np
    from conftest import max_rel_error, randomize_batch_norms, randomize_biases

    import cle

    floatx, policy = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    try:
        keras.utils.set_random_seed(KERNEL_SEED)
        model = keras.applications.EfficientNetB0(
            weights=None, input_shape=(FLOAT64_SIZE, FLOAT64_SIZE, 3), classifier_activation=None)
        randomize_biases(randomize_batch_norms(model, seed=BN_SEED), seed=BIAS_SEED)
        x = np.random.default_rng(INPUT_SEED).uniform(-1, 1, (BATCH, FLOAT64_SIZE,
                                                               FLOAT64_SIZE, 3))
        pairs, folded = cle.fold_all_batch_norms(model)
        r = {"folded": len(pairs), "skipped": len(pairs.skipped),
             "fold": max_rel_error(model, folded, x)}
        del model, folded, pairs
    finally:
        keras.config.set_floatx(floatx)
        keras.config.set_dtype_policy(policy)
    gc.collect()
    return r


# --------------------------------------------------------------------------- the blocks


def _setup():
    import keras

    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        tf.get_logger().setLevel("ERROR")


def measure(progress=print) -> dict:
    _setup()
    start = time.perf_counter()
    m = {"real": measure_real()}
    progress(f"real MobileNetV2 measured ({time.perf_counter() - start:.0f} s)")
    m["nets"] = {}
    for name in NETWORKS:
        m["nets"][name] = measure_randomized(name)
        progress(f"{name} measured ({time.perf_counter() - start:.0f} s)")
    m["float64"] = measure_float64()
    progress(f"EfficientNetB0 float64 measured ({time.perf_counter() - start:.0f} s)")
    m["versions"], m["machine"] = versions(), machine()
    return m


def _randomized_setup() -> str:
    return (f"`weights=None` kernels drawn under `keras.utils.set_random_seed({KERNEL_SEED})`, BN "
            f"statistics from tests/conftest.py `randomize_batch_norms(seed={BN_SEED}, "
            f"deep=True)` (γ from 0.5 to 1.5, β and μ normal, σ² from 0.5 to 2), biases from "
            f"`randomize_biases(seed={BIAS_SEED}, scale={BIAS_SCALE:g})`, a batch of {BATCH} "
            f"uniform random inputs in [−1, 1]")


def _sources_text(sources: dict) -> str:
    parts = [f"{n} from {cls} layers" if n > 1 else f"{n} from a {cls} layer"
             for cls, n in sources.items()]
    return ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]


def fold_block(m) -> str:
    real, nets, f64 = m["real"], m["nets"], m["float64"]
    lines = [
        wrap(f"{m['versions']}. `max|Δ| / max|y|` of `cle.fold_all_batch_norms` against the "
             f"input model. Randomized BN: {_randomized_setup()}. Float64 row: the wide spread "
             f"of `randomize_batch_norms(seed={BN_SEED})` (γ of both signs, σ² from 0.2 to 3), "
             f"biases `randomize_biases(seed={BIAS_SEED})`, {FLOAT64_SIZE}×{FLOAT64_SIZE} "
             "inputs, every layer in float64. Real row: `cle.pretrained.mobilenet_v2_imagenet()` "
             f"on {FOLD_PHOTOS} photo crops (`sample_images({FOLD_PHOTOS}, "
             f"seed={FOLD_PHOTO_SEED})`, `preprocess_imagenet`)."),
        "",
        "| network | BNs folded | skipped | max\\|Δ\\| / max\\|y\\| |",
        "|---|---|---|---|",
    ]
    for name in NETWORKS:
        r = nets[name]
        lines.append(f"| {name} ({SIZE}×{SIZE}, randomized BN) | {r['folded']} | "
                     f"{r['skipped']} | {fmt(r['fold'])} |")
    lines.append(f"| EfficientNetB0, float64, wide BN spread ({FLOAT64_SIZE}×{FLOAT64_SIZE}) | "
                 f"{f64['folded']} | {f64['skipped']} | {fmt(f64['fold'])} |")
    rf = real["fold"]
    lines.append(f"| **real pretrained MobileNetV2** (torchvision ImageNet weights), "
                 f"{FOLD_PHOTOS} real photo crops | {rf['folded']} | {rf['skipped']} | "
                 f"{fmt(rf['err'])}, {rf['top1']} |")
    dn = nets["DenseNet121"]
    lines += ["", wrap(f"DenseNet121's {dn['skipped']} skipped BNs, by the layer their input "
                       f"comes from: {_sources_text(dn['sources'])}. Measured by "
                       f"{m['machine']}.")]
    return "\n".join(lines)


def transforms_block(m) -> str:
    real, nets = m["real"], m["nets"]

    def row(names, key):
        return " / ".join(fmt(nets[n][key] if key == "fold" else nets[n][key]["err"])
                          for n in names)

    def scaled(key):
        return "sets scaled: " + " / ".join(
            nets[n][key]["scaled"].split(" sets")[0] for n in EQUALIZED)

    eq_names = " / ".join(EQUALIZED)
    lines = [
        "| transform | model | max\\|Δ\\| / max\\|y\\| |",
        "|---|---|---|",
        f"| `fold_all_batch_norms` | real MobileNetV2, {FOLD_PHOTOS} photos | "
        f"{fmt(real['fold']['err'])}, {real['fold']['top1']} |",
        f"| `equalize_model(objective=\"weights\", relu6=\"bound\", high_bias_fold=\"none\")` | "
        f"real MobileNetV2, {EQ_PHOTOS} photos | {fmt(real['weights']['err'])}, "
        f"{real['weights']['top1']} ({real['weights']['scaled']}) |",
        f"| `equalize_model()` (defaults: `objective=\"quantized\"`, `relu6=\"bound\"`, "
        f"`high_bias_fold=\"none\"`) | real MobileNetV2, {EQ_PHOTOS} photos | "
        f"{fmt(real['quantized']['err'])}, {real['quantized']['top1']} "
        f"({real['quantized']['scaled']}) |",
        f"| `fold_all_batch_norms` | randomized-BN {' / '.join(NETWORKS)} | "
        f"{row(NETWORKS, 'fold')} |",
        f"| `equalize_model(objective=\"weights\", high_bias_fold=\"none\")`, `relu6=\"bound\"` | "
        f"randomized-BN {eq_names} | {row(EQUALIZED, 'bound')} |",
        f"| the same with `relu6=\"keep\"` | randomized-BN {eq_names} | "
        f"{row(EQUALIZED, 'keep')} |",
        f"| `equalize_model()` (defaults) | randomized-BN {eq_names} | "
        f"{row(EQUALIZED, 'quantized')} ({scaled('quantized')}) |",
        f"| `export_folded(fuse_for_training(m))` | randomized-BN MobileNetV2 | "
        f"{fmt(nets['MobileNetV2']['export'])} (vs the fused model) |",
        "",
        wrap(f"{m['versions']}; randomized BN at {SIZE}×{SIZE}: {_randomized_setup()}. "
             f"Measured by {m['machine']}."),
    ]
    return "\n".join(lines)


def depthwise_block(m) -> str:
    lo, hi, _ = m["real"]["depthwise"]["folded"]
    _, _, eq_abs = m["real"]["depthwise"]["weights"]
    return wrap(f"After BN folding one channel of `{FIRST_DEPTHWISE}` spans "
                f"{minus(lo, '.2g')}…+{minus(hi, '.2g')}; after equalization "
                f"(`objective=\"weights\"`, as `cle demo --equalization`) every channel is within "
                f"±{eq_abs:.2g} (measured by `scripts/gen_exactness_docs.py`).")


def cle_block(m) -> str:
    real, nets = m["real"], m["nets"]
    w, qd = real["weights"], real["quantized"]
    sf, sw, sq = (real["spread"][k] for k in ("folded", "weights", "quantized"))

    def per_net(key):
        return ", ".join(f"{n} {fmt(nets[n][key]['err'])} ({nets[n][key]['scaled']})"
                         for n in EQUALIZED)

    paras = [
        f"{m['versions']}. On the real MobileNetV2 ({EQ_PHOTOS} photo crops, "
        f"`sample_images({EQ_PHOTOS}, seed={EQ_PHOTO_SEED})`), `relu6=\"bound\"` without HBF is "
        f"exact: `max|Δ| / max|y|` = {fmt(w['err'])} with `objective=\"weights\"` "
        f"({w['scaled']}), {w['top1']}; with the default `objective=\"quantized\"` "
        f"({qd['scaled']}) {fmt(qd['err'])}, {qd['top1']}.",
        f"CLS flattens the weight ranges (spread = largest / median per-output-channel range, "
        f"`cle.quantization.weight_range_spread`; after BN folding → after "
        f"`equalize_model(objective=\"weights\")`): the first depthwise layer "
        f"`{FIRST_DEPTHWISE}` drops from {sf['first']:.1f} to {sw['first']:.1f}; across all "
        f"{real['kernels']} kernels the largest spread drops from {sf['largest']:.1f} to "
        f"{sw['largest']:.1f} and the median from {sf['median']:.2f} to {sw['median']:.2f}. "
        f"With the default objective, which scales fewer sets: {sq['first']:.1f}, largest "
        f"{sq['largest']:.1f}, median {sq['median']:.2f}.",
        f"Randomized-BN `keras.applications` models ({SIZE}×{SIZE}, no HBF, "
        f"`objective=\"weights\"`; {_randomized_setup()}): {per_net('bound')} in `\"bound\"` "
        f"mode; {per_net('keep')} in `\"keep\"` mode; with the defaults "
        f"(`objective=\"quantized\"`) {per_net('quantized')}. Measured by {m['machine']}.",
    ]
    return "\n\n".join(wrap(p) for p in paras)


def blocks(m) -> dict:
    """``{(doc, block name): text}``."""
    return {
        (FOLD_DOC, "exactness-fold"): fold_block(m),
        (RESULTS_DOC, "exactness-transforms"): transforms_block(m),
        (RESULTS_DOC, "exactness-depthwise"): depthwise_block(m),
        (CLE_DOC, "exactness-cle"): cle_block(m),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print only, do not edit the docs")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    publish(((doc, name, text) for (doc, name), text in blocks(measure()).items()),
            print_only=args.print, root=ROOT)
    print(f"done in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
