"""Benchmark of batch-norm folding (``cle.fold_all_batch_norms``) against Keras' own rebuild.

Run it with ``make bench`` (which runs ``.venv/bin/python benchmarks/bench_fold.py``) or
directly::

    .venv/bin/python benchmarks/bench_fold.py            # everything (a few minutes on 2 cores)
    .venv/bin/python benchmarks/bench_fold.py --quick    # skip the N=1600 chain
    .venv/bin/python benchmarks/bench_fold.py --sizes 50 200 --repeats 5 --no-apps

It prints figures, it does not assert anything. All times are wall-clock
(``time.perf_counter``), median of ``--repeats`` runs after one warm-up run, measured in one
process on the same model object.

What is measured:

1. ``keras.applications.MobileNetV2`` and ``ResNet50`` (``weights=None``, 224×224, default
   heads):

   * ``clone``: ``keras.models.clone_model(model)`` — Keras rebuilding the same graph from layer
     configs, without copying weights. This is the floor for any rebuild.
   * ``clone+w``: ``clone_model`` followed by ``set_weights(get_weights())`` on every layer, i.e.
     a plain rebuild that also carries the weights over (what the fold has to do as well). Only
     a reference, it is not part of the target.
   * ``fold``: ``cle.fold_all_batch_norms(model)`` — graph view, matching, fold arithmetic,
     rebuild via ``clone_model`` with edited configs, and the weight copy.
   * ``fold/clone``: the ratio of the two medians. Target: ≤ 1.5.
   * the number of folded and skipped BatchNormalization layers.

2. Synthetic chains of N blocks ``Conv2D(8, 3×3, padding="same") → BatchNormalization → ReLU``
   on an 8×8×8 input (3N + 1 layers), for N = 100, 400, 1600 by default. For each N:
   ``fold`` and ``clone`` time, and the time per layer (time / number of layers). If folding
   scales linearly in the size of the graph, the per-layer figures stay roughly flat with N.

3. For the same chains, ``cle.find_foldable_batch_norms(model)`` alone (``find``): the graph
   view and the matching, no rebuild and no weight copy. This isolates keras-cle's own graph
   search from Keras' cost of building a new model.

Building the chains (especially N=1600) takes a while and is not timed. The chains' repeat count
is reduced for large N (``--repeats`` is the count for N ≤ 400, at most 2 above) to keep the run
short. Keras builds a Functional graph recursively (one Python frame per layer along the chain),
so the script raises ``sys.setrecursionlimit`` for the long chains; without it, ``keras.Model``
itself fails from about 330 blocks on.

Times are wall-clock: other processes running on the machine inflate them, so the load average
is printed at the start and at the end. Python's cyclic garbage collector is left on (as a user
would have it); a full collection that falls inside a timed run costs in proportion to every
live object in the process, which adds a size-dependent share to the largest chains.
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

import cle  # noqa: E402

TARGET_RATIO = 1.5


# ---------------------------------------------------------------------------- timing


def _time_once(fn):
    gc.collect()
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    del result
    return elapsed


def time_median(fns: dict, repeats: int) -> dict:
    """Median wall time of every callable in ``fns``, after one warm-up run of each.

    The callables are run interleaved (a, b, c, a, b, c, ...) so that slow drift of the machine
    affects them alike.
    """
    for fn in fns.values():
        _time_once(fn)
    samples = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            samples[name].append(_time_once(fn))
    return {name: statistics.median(s) for name, s in samples.items()}


# ---------------------------------------------------------------------------- workloads


def clone(model):
    return keras.models.clone_model(model)


def clone_with_weights(model):
    new = keras.models.clone_model(model)
    for old_layer, new_layer in zip(model.layers, new.layers):
        new_layer.set_weights(old_layer.get_weights())
    return new


def fold(model):
    return cle.fold_all_batch_norms(model)


def find(model):
    return cle.find_foldable_batch_norms(model)


def conv_bn_relu_chain(n_blocks: int, channels: int = 8, size: int = 8) -> keras.Model:
    inputs = keras.Input(shape=(size, size, channels), name="input")
    x = inputs
    for i in range(n_blocks):
        x = keras.layers.Conv2D(channels, 3, padding="same", name=f"conv_{i}")(x)
        x = keras.layers.BatchNormalization(name=f"bn_{i}")(x)
        x = keras.layers.ReLU(name=f"relu_{i}")(x)
    return keras.Model(inputs, x, name=f"chain_{n_blocks}")


# ---------------------------------------------------------------------------- sections


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.1f}"


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:9.1f}"


def bench_applications(repeats: int) -> list[float]:
    print("== keras.applications (weights=None, 224x224)   times in ms, median of "
          f"{repeats} after 1 warm-up")
    header = (f"{'model':<12} {'layers':>6} {'BNs':>4} {'folded':>6} {'skipped':>7} "
              f"{'clone':>9} {'clone+w':>9} {'fold':>9} {'fold/clone':>10}  target")
    print(header)
    print("-" * len(header))
    ratios = []
    for name, ctor in (("MobileNetV2", keras.applications.MobileNetV2),
                       ("ResNet50", keras.applications.ResNet50)):
        keras.backend.clear_session()
        gc.collect()
        model = ctor(weights=None, input_shape=(224, 224, 3))
        pairs, folded = fold(model)
        n_folded, n_skipped = len(pairs), len(pairs.skipped)
        del pairs, folded
        n_bn = sum(isinstance(layer, keras.layers.BatchNormalization)
                   for layer in model._flatten_layers())
        t = time_median({
            "clone": lambda: clone(model),
            "clone+w": lambda: clone_with_weights(model),
            "fold": lambda: fold(model),
        }, repeats)
        ratio = t["fold"] / t["clone"]
        ratios.append(ratio)
        ok = "ok" if ratio <= TARGET_RATIO else f"ABOVE {TARGET_RATIO}"
        print(f"{name:<12} {len(model.layers):>6} {n_bn:>4} {n_folded:>6} {n_skipped:>7} "
              f"{_ms(t['clone'])} {_ms(t['clone+w'])} {_ms(t['fold'])} {ratio:>10.2f}  {ok}",
              flush=True)
        del model
    print()
    return ratios


def _chain_repeats(n_blocks: int, repeats: int) -> int:
    if n_blocks <= 400:
        return repeats
    return max(1, min(repeats, 2))


def bench_chains(sizes: list[int], repeats: int) -> list[dict]:
    print("== chains of N x (Conv2D 3x3 same, 8 ch -> BatchNormalization -> ReLU) on 8x8x8")
    print("   times in ms (median after 1 warm-up); per-layer times in us = time / layers")
    header = (f"{'N':>5} {'layers':>6} {'folded':>6} {'skipped':>7} {'build':>9} {'reps':>4} "
              f"{'find':>9} {'clone':>9} {'fold':>9} {'fold/clone':>10} "
              f"{'find/lyr':>9} {'clone/lyr':>9} {'fold/lyr':>9}")
    print(header)
    print("-" * len(header))
    rows = []
    # Keras' Functional graph mapping (keras.src.ops.function._build_map_helper) recurses once
    # per layer along the chain, so the default limit of 1000 fails from ~N=330 blocks on.
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 4 * (3 * max(sizes) + 1) + 1000))
    for n in sizes:
        keras.backend.clear_session()
        gc.collect()
        start = time.perf_counter()
        model = conv_bn_relu_chain(n)
        build = time.perf_counter() - start
        n_layers = len(model.layers)
        report = find(model)
        n_folded, n_skipped = len(report.folds), len(report.skipped)
        del report
        reps = _chain_repeats(n, repeats)
        t = time_median({
            "find": lambda: find(model),
            "clone": lambda: clone(model),
            "fold": lambda: fold(model),
        }, reps)
        row = {"n": n, "layers": n_layers, **t}
        rows.append(row)
        print(f"{n:>5} {n_layers:>6} {n_folded:>6} {n_skipped:>7} {_ms(build)} {reps:>4} "
              f"{_ms(t['find'])} {_ms(t['clone'])} {_ms(t['fold'])} "
              f"{t['fold'] / t['clone']:>10.2f} "
              f"{_us(t['find'] / n_layers)} {_us(t['clone'] / n_layers)} "
              f"{_us(t['fold'] / n_layers)}", flush=True)
        del model
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        growth = last["layers"] / first["layers"]
        print(f"\n   per-layer time at N={last['n']} relative to N={first['n']} "
              f"(1.00 = linear; graph {growth:.0f}x larger):")
        for key in ("find", "clone", "fold"):
            rel = (last[key] / last["layers"]) / (first[key] / first["layers"])
            print(f"     {key:<6} {rel:5.2f}")
    print()
    return rows


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="skip the N=1600 chain")
    parser.add_argument("--sizes", type=int, nargs="+", default=None,
                        help="chain lengths N (default: 100 400 1600; --quick: 100 400)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed runs after the warm-up (default 3)")
    parser.add_argument("--no-apps", action="store_true",
                        help="skip MobileNetV2/ResNet50")
    parser.add_argument("--no-chains", action="store_true", help="skip the synthetic chains")
    args = parser.parse_args(argv)
    sizes = args.sizes or ([100, 400] if args.quick else [100, 400, 1600])

    print(f"python {sys.version.split()[0]}, keras {keras.__version__}, "
          f"backend {keras.backend.backend()}, cle {cle.__version__}, "
          f"{os.cpu_count()} CPUs, load average {_load()}\n", flush=True)
    total = time.perf_counter()
    if not args.no_apps:
        bench_applications(args.repeats)
    if not args.no_chains:
        bench_chains(sizes, args.repeats)
    print(f"total wall time {time.perf_counter() - total:.1f} s, load average {_load()} "
          "(times are wall-clock: other processes on the machine inflate them)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
