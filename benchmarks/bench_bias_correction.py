"""Benchmark of empirical bias correction (``cle.correct_bias(model, calibration_data=...)``)
against one float ``predict`` over the same calibration data.

Run it directly::

    .venv/bin/python benchmarks/bench_bias_correction.py                  # all workloads
    .venv/bin/python benchmarks/bench_bias_correction.py --blocks 100 400 --no-mobilenet
    .venv/bin/python benchmarks/bench_bias_correction.py --docs           # 3 runs, docs table

With ``--docs`` it runs the whole benchmark ``--runs`` times (default 3), each in a fresh
process, and writes the range of each ratio over the runs into docs/bias_correction.md
(block ``bias-correction-cost``).

It prints figures, it does not assert anything. For each model, in one process:

* ``predict``: ``model.predict(x, batch_size=32)`` over the calibration data, median of
  ``--repeats`` runs after one warm-up run (so it excludes tracing);
* ``correct``: one ``cle.correct_bias(model, calibration_data=x)`` (everything included:
  rebuild, layer copies, tracing, the pass itself);
* ``ratio``: correct / predict. Target: <= 10, and the same ratio at every depth (linear cost).

Workloads: chains of N blocks ``Conv2D(16, 3, 'same') -> ReLU`` on 16x16x16 inputs (64
calibration samples) for N = 100, 400, 1600, and the real ImageNet MobileNetV2 of
``cle.pretrained`` after ``cle.equalize_model`` on 64 photo crops of 224x224.

Times are wall-clock: other processes on the machine inflate them (the load average is
printed), so compare the ratios, which are measured within one run.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

import cle  # noqa: E402

TARGET_RATIO = 10.0


# Keras builds a Functional graph (and clones one) by recursion over its depth: a chain of
# 1600 blocks (3200 layers) needs more than Python's default limit of 1000 frames.
sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))


def chain(n_blocks, size=16, channels=16, seed=0):
    rng = np.random.default_rng(seed)
    inp = keras.Input((size, size, channels), name="x")
    h = inp
    for i in range(n_blocks):
        h = keras.layers.Conv2D(channels, 3, padding="same", name=f"conv{i}")(h)
        h = keras.layers.ReLU(name=f"relu{i}")(h)
    model = keras.Model(inp, h, name=f"chain{n_blocks}")
    for layer in model.layers:
        if isinstance(layer, keras.layers.Conv2D):
            k = layer.kernel.shape
            # He-like scale (keeps activations O(1) at any depth), uneven channel ranges
            w = rng.normal(0, np.sqrt(2.0 / (9 * channels)), k) * rng.uniform(0.5, 1.0, k[-1])
            layer.kernel.assign(w)
            layer.bias.assign(rng.normal(0, 0.05, k[-1]))
    x = rng.normal(0, 1, (64, size, size, channels)).astype("float32")
    return model, x


def mobilenet():
    from cle import pretrained as P

    model = cle.equalize_model(P.mobilenet_v2_imagenet())
    x = P.preprocess_imagenet(P.sample_images(64, seed=1))
    return model, x


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "bias_correction.md")


def measure(name, model, x, repeats):
    model.predict(x, batch_size=32, verbose=0)
    times = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        model.predict(x, batch_size=32, verbose=0)
        times.append(time.perf_counter() - start)
    predict = statistics.median(times)
    gc.collect()
    start = time.perf_counter()
    _, records = cle.correct_bias(model, calibration_data=x, return_report=True)
    correct = time.perf_counter() - start
    ratio = correct / predict
    n = sum(r.corrected for r in records)
    ok = "ok   " if ratio <= TARGET_RATIO else "ABOVE"
    print(f"{name:<14} {n:>6} {len(x):>5} {predict:>10.2f} {correct:>10.2f} {ratio:>7.2f}  "
          f"{ok} {TARGET_RATIO:g}", flush=True)
    return {"model": name, "layers": n, "N": len(x), "predict": predict, "correct": correct,
            "ratio": ratio}


def _load() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, nargs="*", default=[100, 400, 1600],
                        help="chain depths (default 100 400 1600)")
    parser.add_argument("--no-mobilenet", action="store_true",
                        help="skip the real MobileNetV2")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed predict runs after the warm-up (default 3)")
    parser.add_argument("--docs", action="store_true",
                        help="run the benchmark --runs times and write the docs table")
    parser.add_argument("--runs", type=int, default=3, help="runs for --docs (default 3)")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.docs:
        return _docs(args)
    print(f"python {sys.version.split()[0]}, keras {keras.__version__}, "
          f"backend {keras.backend.backend()}, {os.cpu_count()} CPUs, "
          f"load average {_load()}\n", flush=True)
    print("== empirical bias correction vs one float predict over the same data (seconds)")
    header = (f"{'model':<14} {'layers':>6} {'N':>5} {'predict':>10} {'correct':>10} "
              f"{'ratio':>7}  target")
    print(header)
    print("-" * len(header))
    rows = []
    for n in args.blocks:
        keras.backend.clear_session()
        rows.append(measure(f"chain {n}", *chain(n), args.repeats))
    if not args.no_mobilenet:
        keras.backend.clear_session()
        rows.append(measure("MobileNetV2", *mobilenet(), args.repeats))
    print(f"\n   layers: layers corrected. Load average at the end {_load()} (wall-clock "
          "times: other processes on the machine inflate them).")
    if args.json:
        print(json.dumps(rows))
    return 0


def _docs(args) -> int:
    """Run the benchmark ``args.runs`` times, each in a fresh process, and write the range
    of each workload's figures into the docs."""
    cmd = [sys.executable, os.path.abspath(__file__), "--json", "--repeats", str(args.repeats),
           "--blocks", *map(str, args.blocks)] + (["--no-mobilenet"] if args.no_mobilenet
                                                  else [])
    runs = []
    for i in range(args.runs):
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        print(out.stdout, flush=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    load = os.getloadavg()[0]

    def span(values, fmt):
        lo, hi = min(values), max(values)
        return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else (
            f"{fmt.format(lo)}–{fmt.format(hi)}")

    lines = ["| workload | layers corrected | N | predict s | correction s | ratio |",
             "|---|---|---|---|---|---|"]
    for rows in zip(*runs):
        r = rows[0]
        lines.append(
            f"| {r['model']} | {r['layers']} | {r['N']} "
            f"| {span([x['predict'] for x in rows], '{:.2f}')} "
            f"| {span([x['correct'] for x in rows], '{:.2f}')} "
            f"| {span([x['ratio'] for x in rows], '{:.1f}')} |")
    worst = max(x["ratio"] for rows in runs for x in rows)
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from _docblocks import publish, wrap

    text = "\n".join(lines) + "\n\n" + wrap(
        f"Measured by `benchmarks/bench_bias_correction.py --docs` ({keras.backend.backend()}, "
        f"{args.runs} runs, each in a fresh process; ranges over the runs) on a shared 2-core "
        f"machine (load average {load:.1f} at the end). The ratio is one "
        "`correct_bias(model, calibration_data=x)` (everything included: the pass, the "
        "tracing of its compiled steps, the new model) to one warm `predict` over the same "
        f"data; target ≤ {TARGET_RATIO:g}, {'met' if worst <= TARGET_RATIO else 'NOT met'} in "
        "every run.")
    publish([(PAGE, "bias-correction-cost", text)], root=ROOT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
