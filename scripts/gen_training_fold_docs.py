"""Measures batch-norm folding during training (``cle.training_fold``) and writes the figures of
docs/training_fold.md:

- ``training-table``: per layer → BN case, ``max|Δ| / max|reference|`` of the fused layer
  against the layer followed by Keras BN (inference; training without a quantizer; training
  through the quantizer path with ``Q`` = identity) and of ``export_folded`` against the fused
  layer with ``FakeQuant(8)``;
- ``training-statistics``: the moving statistics after 3 training steps (against Keras BN's and
  against the update formula), and in ``model.fit`` (against the original BNs, and the freeze);
- ``training-mixed``: the same comparisons under the ``mixed_float16`` policy;
- ``training-mobilenet``: MobileNetV2 fused, exported and fake-quantized, with times;
- ``training-example``: the output of ``python examples/qat_finetune.py``, run as a user runs
  it (a subprocess from the repository root), with its wall time and the work time it prints.

The layer cases are those of tests/test_training_fold.py (tests/_training_cases.py), seeded:
the errors are the same from run to run on one machine (they may differ in the last digit on
another CPU or library version); times depend on the load, which the blocks state.

Run::

    .venv/bin/python scripts/gen_training_fold_docs.py            # measures, writes the doc
    .venv/bin/python scripts/gen_training_fold_docs.py --print    # measures, prints only
    .venv/bin/python scripts/gen_training_fold_docs.py --no-example

``make results`` runs it with the other generators (about a minute on 2 cores). Too slow for
the test suite: tests/test_docs.py checks the blocks' form and that this script owns them.
"""

from __future__ import annotations

import os

# The example runs with the environment the user has, not with this script's settings.
USER_ENV = dict(os.environ)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import pathlib  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))

from _docblocks import fmt_error as fmt, publish, wrap  # noqa: E402

DOC = ROOT / "docs" / "training_fold.md"
EXAMPLE = "examples/qat_finetune.py"

#: Table rows: case of tests/_training_cases.py -> label in the doc.
LABELS = {
    "conv2d": "Conv2D same",
    "conv2d_nobias_strided": "Conv2D strided, no bias",
    "conv2d_groups": "Conv2D groups=2",
    "depthwise2d_mult2": "DepthwiseConv2D ×2",
    "dense": "Dense",
    "dense_rank3": "Dense on (batch, 6, 4)",
    "conv1d_causal": "Conv1D causal",
    "depthwise1d": "DepthwiseConv1D ×3",
}
STEPS = 3  # training steps per case
MOBILENET_BATCH, REPEATS = 4, 3


def machine() -> str:
    load = os.getloadavg()[0]
    return f"measured on a shared {os.cpu_count()}-core machine, load average {load:.1f}"


def _identity(w):
    return w


# --------------------------------------------------------------------------- single layers


def _train_steps(case, quantizer):
    """Max error over STEPS training steps of the fused layer against layer → BN(training), and
    the moving statistics' errors after them."""
    import numpy as np
    from _training_cases import _np, fused_pair, rel, training_steps

    model, fused_model, fused, x = fused_pair(case, kernel_quantizer=quantizer)
    bn = model.get_layer("bn")
    m = bn.momentum
    err = formula_mean = formula_var = 0.0
    for xs in training_steps(x, STEPS):
        y_raw = _np(model.get_layer("layer")(xs)).astype(np.float64)
        axes = tuple(range(y_raw.ndim - 1))
        mean_b, var_b = y_raw.mean(axes), y_raw.var(axes)  # biased variance, as Keras BN
        mm0, mv0 = _np(bn.moving_mean).astype(np.float64), _np(bn.moving_variance)
        y_ref = model(xs, training=True)
        err = max(err, rel(fused_model(xs, training=True), y_ref))
        formula_mean = max(formula_mean, rel(bn.moving_mean, mm0 * m + mean_b * (1 - m)))
        formula_var = max(formula_var, rel(bn.moving_variance, mv0 * m + var_b * (1 - m)))
    assert int(_np(fused.step)) == STEPS
    return err, {
        "mean": rel(fused.moving_mean, bn.moving_mean),
        "var": rel(fused.moving_variance, bn.moving_variance),
        "formula_mean": formula_mean,
        "formula_var": formula_var,
    }


def measure_cases():
    """``{case: {column: error}}`` and the moving statistics' errors, max over every run."""
    from _training_cases import CASES, fused_pair, rel

    from cle.training_fold import FakeQuant, export_folded

    rows, stats = {}, {}
    for case in CASES:
        model, fused_model, _, x = fused_pair(case)
        bn = model.get_layer("bn")
        stats["momentum"], stats["epsilon"] = bn.momentum, bn.epsilon
        inference = rel(fused_model(x, training=False), model(x, training=False))
        plain, plain_stats = _train_steps(case, None)
        through_q, q_stats = _train_steps(case, _identity)
        _, fq_model, _, x = fused_pair(case, kernel_quantizer=FakeQuant(8))
        export = rel(export_folded(fq_model)(x), fq_model(x, training=False))
        rows[case] = {"inference": inference, "training": plain, "through_q": through_q,
                      "export": export}
        for s in (plain_stats, q_stats):
            for k, v in s.items():
                stats[k] = max(stats.get(k, 0.0), v)
    return rows, stats


FREEZE = 2  # ema_freeze_delay in the model.fit measurement (one more step is run)


def measure_fit():
    """model.fit (tf.function) on the tests' small model, zero learning rate, freeze after
    FREEZE steps, FREEZE + 1 steps: fused moving statistics against the original BNs after
    FREEZE and FREEZE + 1 steps."""
    import keras
    import numpy as np
    from _training_cases import _np, rel, small_model

    from cle.training_fold import fuse_for_training

    model = small_model(seed=2)
    rng = np.random.default_rng(3)
    n = 4 * (FREEZE + 1)  # batches of 4
    x = rng.normal(0.0, 1.0, (n, 12, 12, 3)).astype("float32")
    y = rng.integers(0, 3, n)
    fused_model, pairs = fuse_for_training(model, ema_freeze_delay=FREEZE, return_pairs=True)
    for m in (model, fused_model):
        m.compile(keras.optimizers.SGD(0.0),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    fused_model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)  # FREEZE + 1 steps
    model.fit(x[:-4], y[:-4], batch_size=4, epochs=1, shuffle=False, verbose=0)  # FREEZE steps
    at_freeze = max(max(rel(f.moving_mean, bn.moving_mean), rel(f.moving_variance,
                                                                   bn.moving_variance))
                    for f, bn in pairs)
    model.fit(x[-4:], y[-4:], batch_size=4, epochs=1, shuffle=False, verbose=0)  # one more
    after = min(max(rel(f.moving_mean, bn.moving_mean), rel(f.moving_variance,
                                                              bn.moving_variance))
                for f, bn in pairs)
    steps = sorted({int(_np(f.step)) for f, _ in pairs})
    return {"pairs": len(pairs), "at_freeze": at_freeze, "after": after, "steps": steps}


def measure_mixed():
    """The table's first three columns under the mixed_float16 policy (max over the cases)."""
    import keras
    from _training_cases import CASES, fused_pair, rel, training_steps

    worst = {"inference": 0.0, "training": 0.0, "through_q": 0.0}
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        for case in CASES:
            model, fused_model, _, x = fused_pair(case)
            worst["inference"] = max(worst["inference"], rel(fused_model(x, training=False),
                                                             model(x, training=False)))
            for key, q in (("training", None), ("through_q", _identity)):
                model, fused_model, _, x = fused_pair(case, kernel_quantizer=q)
                for xs in training_steps(x, STEPS):
                    y_ref = model(xs, training=True)
                    worst[key] = max(worst[key], rel(fused_model(xs, training=True), y_ref))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return worst


# --------------------------------------------------------------------------- MobileNetV2


def _median_time(fn, repeats=REPEATS):
    """(median wall time of ``repeats`` calls after one warm-up call, the last result)."""
    result = fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


def measure_mobilenet():
    import keras
    import numpy as np
    from _training_cases import randomize_bn, rel

    from cle.training_fold import FakeQuant, export_folded, fuse_for_training

    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV2(weights=None, input_shape=(224, 224, 3),
                                           classifier_activation=None)
    rng = np.random.default_rng(0)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            randomize_bn(layer, rng)
    x = rng.uniform(-1.0, 1.0, (MOBILENET_BATCH, 224, 224, 3)).astype("float32")
    r = {"bns": sum(isinstance(la, keras.layers.BatchNormalization) for la in model.layers)}
    r["clone_s"], _ = _median_time(lambda: keras.models.clone_model(model))
    r["fuse_s"], (fused, pairs) = _median_time(
        lambda: fuse_for_training(model, return_pairs=True))
    r["fused"], r["skipped"] = len(pairs), len(pairs.skipped)
    r["inference"] = rel(fused(x, training=False), model(x, training=False))
    r["export_s"], exported = _median_time(lambda: export_folded(fused))
    r["exported"] = rel(exported(x), fused(x, training=False))
    fq = fuse_for_training(model, kernel_quantizer=FakeQuant(8))
    r["fq_vs_float"] = rel(fq(x), model(x))
    r["fq_exported"] = rel(export_folded(fq)(x), fq(x))
    # Last: training mode updates the moving statistics of both models.
    r["training"] = rel(fused(x, training=True), model(x, training=True))
    return r


# --------------------------------------------------------------------------- the example


def run_example():
    """(stdout, stderr, wall time) of ``python examples/qat_finetune.py`` from the repo root."""
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, EXAMPLE], cwd=ROOT, env=USER_ENV,
                          capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"{EXAMPLE} exited with {proc.returncode}:\n{proc.stdout}\n"
                           f"{proc.stderr[-3000:]}")
    return proc.stdout, proc.stderr, wall


def example_block(stdout, stderr, wall):
    work = float(stdout.rstrip().splitlines()[-1].split("done in ")[1].split()[0])
    quiet = "stderr silent" if not stderr.strip() else (
        f"{len(stderr.strip().splitlines())} lines on stderr")
    return (wrap(f"About {work:.0f} s of work, {wall:.0f} s with imports "
                 f"(`python {EXAMPLE}`, wall time), {quiet}:") + "\n\n"
            f"```\n$ python {EXAMPLE}\n{stdout.rstrip()}\n```\n\n"
            + wrap(f"Run by `scripts/gen_training_fold_docs.py`, {machine()}."))


# --------------------------------------------------------------------------- the blocks


def blocks(example=True) -> dict[str, str]:
    """``{block name: text}`` for docs/training_fold.md."""
    out = {}
    if example:  # first, while this process is idle: the example has the CPU to itself
        out["training-example"] = example_block(*run_example())

    import keras
    from _training_cases import BATCH, BN_GAMMA_RANGE, BN_VARIANCE_RANGE

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        tf.get_logger().setLevel("ERROR")  # retracing warnings: one new model per case
        backend = f"TensorFlow {tf.__version__}"
    rows, stats = measure_cases()
    g0, g1 = BN_GAMMA_RANGE
    v0, v1 = BN_VARIANCE_RANGE
    lines = [
        wrap(f"CPU, Keras {keras.__version__}, {backend}. `max|Δ| / max|reference|` on a "
             f"batch of {BATCH} random inputs, randomized BN statistics (|γ| from {g0:g} to "
             f"{g1:g}, both signs; σ² from {v0:g} to {v1:g}), `momentum={stats['momentum']:g}` "
             f"and `epsilon={stats['epsilon']:g}` taken from the BN; training columns: the largest "
             f"over {STEPS} training steps on inputs with different statistics:"),
        "",
        "| layer → BN | inference vs conv → BN | training vs conv → BN(training), no quantizer "
        "| same, through the quantizer path (`Q` = identity) | export vs fused (FakeQuant 8) |",
        "|---|---|---|---|---|",
    ]
    for case, r in rows.items():
        lines.append(f"| {LABELS[case]} | {fmt(r['inference'])} | {fmt(r['training'])} | "
                     f"{fmt(r['through_q'])} | {fmt(r['export'])} |")
    out["training-table"] = "\n".join(lines)

    fit = measure_fit()
    if stats["mean"] == stats["var"] == 0:
        vs_keras = "moving mean and variance bit-identical to Keras BN's"
    else:
        vs_keras = (f"moving mean {fmt(stats['mean'])} and moving variance "
                    f"{fmt(stats['var'])} from Keras BN's")
    out["training-statistics"] = (
        f"Moving statistics after {STEPS} training steps, every case above with and without the "
        f"quantizer path: {vs_keras}; Keras BN's against the formula above: mean "
        f"{fmt(stats['formula_mean'])}, "
        f"variance {fmt(stats['formula_var'])}. In `model.fit` (tf.function; the tests' small "
        f"model, {fit['pairs']} fused layers, `ema_freeze_delay={FREEZE}`, zero learning rate, "
        f"{'/'.join(map(str, fit['steps']))} steps): the fused layers' statistics are "
        f"{fmt(fit['at_freeze'])} from the original BNs' after {FREEZE} steps, and at least "
        f"{fmt(fit['after'])} from theirs after {FREEZE + 1} (the last step moved the BNs, not "
        "the frozen fused layers).")

    mixed = measure_mixed()
    out["training-mixed"] = (
        "Under the `mixed_float16` policy (float16 convolutions, BN math in float32), the fused "
        "layer against layer → BN under the same policy, the largest over the cases above: "
        f"inference {fmt(mixed['inference'])}, training without quantizer "
        f"{fmt(mixed['training'])}, through the quantizer path {fmt(mixed['through_q'])}.")

    mb = measure_mobilenet()
    out["training-mobilenet"] = (
        f"MobileNetV2 (224×224, random weights, logits, {mb['bns']} BNs randomized as above, "
        f"a batch of {MOBILENET_BATCH} random inputs): {mb['fused']} BNs fused, "
        f"{mb['skipped']} skipped, in {mb['fuse_s']:.2f} s (`clone_model`: "
        f"{mb['clone_s']:.2f} s); inference {fmt(mb['inference'])}, training mode "
        f"{fmt(mb['training'])}{' (bit-identical)' if mb['training'] == 0 else ''}; "
        f"`export_folded` {mb['export_s']:.2f} s, exported vs fused {fmt(mb['exported'])}; with "
        f"`FakeQuant(8)` the fused model is {fmt(mb['fq_vs_float'])} from the float model and "
        f"the exported model {fmt(mb['fq_exported'])} from the fused one. Times: median of "
        f"{REPEATS} runs after a warm-up, {machine()}.")
    for name in ("training-statistics", "training-mixed", "training-mobilenet"):
        out[name] = wrap(out[name])
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print only, do not edit the doc")
    parser.add_argument("--no-example", action="store_true",
                        help=f"do not run {EXAMPLE} (its block is left as it is)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    publish(((DOC, name, text) for name, text in blocks(example=not args.no_example).items()),
            print_only=args.print, root=ROOT)
    print(f"done in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
