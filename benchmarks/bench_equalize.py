"""Benchmark of cross-layer equalization (``cle.equalize_model``) against Keras' own rebuild.

Run it directly::

    .venv/bin/python benchmarks/bench_equalize.py                 # both models, 5 repeats
    .venv/bin/python benchmarks/bench_equalize.py --repeats 3 --models ResNet50

It prints figures, it does not assert anything. All times are wall-clock
(``time.perf_counter``), median of ``--repeats`` runs after one warm-up run, in one process on
the same model object.

What is measured, for ``keras.applications.MobileNetV2`` and ``ResNet50`` (``weights=None``,
224×224, default heads; the BatchNormalization statistics are randomized first, since with the
identity BNs of ``weights=None`` high-bias folding finds nothing to move and returns early):

1. Whole pipeline:

   * ``clone``: ``keras.models.clone_model(model)`` — Keras rebuilding the same graph from layer
     configs, without copying weights. The floor for any rebuild.
   * ``equalize``: ``cle.equalize_model(model, high_bias_fold="unpadded")`` — the full pipeline
     (the default, ``high_bias_fold="none"``, only skips the last stage): graph view, BN matching, set search for the ReLU6s to
     bound, ONE rebuild (BN folds and ReLU6 → ClippedReLU together, weights copied), a second
     graph view and set search on the new model, scaling and high-bias folding in place.
   * ``eq/clone``: the ratio of the two medians. Target: ≤ 2.0.

2. The stages, timed by calling the stepwise public pieces separately (each on a fresh input
   prepared outside the timed region, since scaling and high-bias folding work in place):

   * ``relu6``: ``cle.replace_relu6_with_clipped_relu(model)`` — a rebuild (for ResNet50, which
     has no ReLU6, a plain rebuild with weight copy);
   * ``fold``: ``cle.fold_all_batch_norms(bounded)`` — the second rebuild;
   * ``scale``: ``cle.CrossLayerScaling.scale_model(folded)`` — graph view, set search, scaling;
   * ``hbf``: ``cle.HighBiasFold.bias_fold(infos, {layer: bn for backward folds})``;
   * ``sum``: the four together. The stepwise flow rebuilds twice where ``equalize_model``
     rebuilds once, so ``sum`` is expected to exceed ``equalize`` by about one rebuild.

Times are wall-clock: other processes running on the machine inflate them, so the load average
is printed at the start and at the end.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import gc  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

import cle  # noqa: E402

TARGET_RATIO = 2.0
MODELS = {
    "MobileNetV2": keras.applications.MobileNetV2,
    "ResNet50": keras.applications.ResNet50,
}


# ---------------------------------------------------------------------------- timing


def _time_once(fn, setup=None):
    arg = setup() if setup is not None else None
    gc.collect()
    start = time.perf_counter()
    result = fn(arg) if setup is not None else fn()
    elapsed = time.perf_counter() - start
    del result, arg
    return elapsed


def time_median(fns: dict, repeats: int) -> dict:
    """Median wall time of every entry of ``fns`` after one warm-up run of each.

    An entry is a callable ``fn()`` or a pair ``(setup, fn)``: ``setup()`` runs untimed before
    each run and its result is passed to ``fn``. Entries run interleaved (a, b, c, a, b, c, ...)
    so that slow drift of the machine affects them alike.
    """
    def split(entry):
        return (entry[1], entry[0]) if isinstance(entry, tuple) else (entry, None)

    for entry in fns.values():
        _time_once(*split(entry))
    samples = {name: [] for name in fns}
    for _ in range(repeats):
        for name, entry in fns.items():
            samples[name].append(_time_once(*split(entry)))
    return {name: statistics.median(s) for name, s in samples.items()}


# ---------------------------------------------------------------------------- workloads


def randomize_batch_norms(model, seed=0):
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            c = layer.moving_mean.shape[0]
            layer.gamma.assign(rng.uniform(0.5, 1.5, c))
            layer.beta.assign(rng.normal(1.0, 1.5, c))
            layer.moving_mean.assign(rng.normal(0.0, 0.5, c))
            layer.moving_variance.assign(rng.uniform(0.5, 2.0, c))


def relu6_step(model):
    return cle.replace_relu6_with_clipped_relu(model)[0]


def fold_step(bounded):
    return cle.fold_all_batch_norms(bounded)


def scale_step(folded):
    return cle.CrossLayerScaling.scale_model(folded)


def backward_bns(pairs):
    return {layer: bn for layer, bn in (p for p in pairs if p.bn_after)}


def hbf_setup(bounded):
    pairs, folded = fold_step(bounded)
    infos = scale_step(folded)
    return folded, infos, backward_bns(pairs)


def hbf_step(prepared):
    _, infos, bns = prepared
    return cle.HighBiasFold.bias_fold(infos, bns)


# ---------------------------------------------------------------------------- report


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.1f}"


def bench(names, repeats: int):
    print(f"== keras.applications (weights=None, 224x224, random BN statistics)   times in ms, "
          f"median of {repeats} after 1 warm-up")
    header = (f"{'model':<12} {'layers':>6} {'sets':>4} {'hbf':>5} "
              f"{'clone':>9} {'equalize':>9} {'eq/clone':>8}  target   "
              f"{'relu6':>9} {'fold':>9} {'scale':>9} {'hbf':>9} {'sum':>9}")
    print(header)
    print("-" * len(header))
    ratios = {}
    for name in names:
        keras.backend.clear_session()
        gc.collect()
        model = MODELS[name](weights=None, input_shape=(224, 224, 3))
        randomize_batch_norms(model)
        _, report = cle.equalize_model(model, high_bias_fold="unpadded", return_report=True)
        n_sets = len(report.sets)
        n_hbf = sum(r.absorbed for r in report.bias_absorptions)
        del report
        bounded = relu6_step(model)  # input of the fold stage (not timed)
        t = time_median({
            "clone": lambda: keras.models.clone_model(model),
            "equalize": lambda: cle.equalize_model(model, high_bias_fold="unpadded"),
            "relu6": lambda: relu6_step(model),
            "fold": lambda: fold_step(bounded),
            "scale": (lambda: fold_step(bounded)[1], scale_step),
            "hbf": (lambda: hbf_setup(bounded), hbf_step),
        }, repeats)
        ratio = t["equalize"] / t["clone"]
        ratios[name] = ratio
        ok = "ok   " if ratio <= TARGET_RATIO else "ABOVE"
        total = t["relu6"] + t["fold"] + t["scale"] + t["hbf"]
        print(f"{name:<12} {len(model.layers):>6} {n_sets:>4} {n_hbf:>5} "
              f"{_ms(t['clone'])} {_ms(t['equalize'])} {ratio:>8.2f}  {ok} {TARGET_RATIO:<3} "
              f"{_ms(t['relu6'])} {_ms(t['fold'])} {_ms(t['scale'])} {_ms(t['hbf'])} "
              f"{_ms(total)}", flush=True)
        del model, bounded
    print("\n   sets: scaled sets; hbf: pairs whose bias was absorbed (default options).")
    print("   relu6 .. hbf: the stepwise public pieces, each timed alone; sum: their total "
          "(two rebuilds, where equalize_model does one).\n")
    return ratios


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed runs after the warm-up (default 5)")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS),
                        help="models to run (default: all)")
    args = parser.parse_args(argv)
    print(f"python {sys.version.split()[0]}, keras {keras.__version__}, "
          f"backend {keras.backend.backend()}, cle {cle.__version__}, "
          f"{os.cpu_count()} CPUs, load average {_load()}\n", flush=True)
    start = time.perf_counter()
    bench(args.models, args.repeats)
    print(f"total wall time {time.perf_counter() - start:.1f} s, load average {_load()} "
          "(times are wall-clock: other processes on the machine inflate them)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
