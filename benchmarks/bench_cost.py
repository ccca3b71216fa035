"""Cost of ``fold_all_batch_norms`` and ``equalize_model`` against one ``keras.models.clone_model``.

    .venv/bin/python benchmarks/bench_cost.py                    # VGG16, ResNet50, MobileNetV2 at 224
    .venv/bin/python benchmarks/bench_cost.py --all              # every keras.applications model,
                                                                 # smallest input
    .venv/bin/python benchmarks/bench_cost.py --docs             # also rewrite the docs table

Each model runs in its own subprocess (one model alive, memory figures not polluted by another).
In that process, with randomized BN statistics (``deep=True`` spread):

* ``eq peak MB``: the largest resident set size sampled every 2 ms during the first
  ``equalize_model(model)`` call, minus the resident set size just before it, in a process that
  holds one ``clone_model`` of the model: the first build of a model pays one-time costs of the
  process (TensorFlow kernels, Python code and allocator arenas) that are not memory
  ``equalize_model`` holds, and the clone stays alive so that its memory is not reused;
  ``×weights``: that divided by the size of the model's weights (target ≤ 2);
* ``cold eq/clone``: the same peak for the very first call of each, each in a fresh process,
  as a ratio (what a user's first call costs against a first ``clone_model``);
* ``fold/clone`` and ``eq/clone``: the fastest of ``--repeats`` runs of each, as ratios to the
  fastest ``clone_model(model)`` of the same process (targets: ≤ 1.2 and ≤ 1.5).

Times are wall-clock: on a loaded machine absolute figures are inflated, ratios within one process
much less so; the load average is printed.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT = ["VGG16", "ResNet50", "MobileNetV2"]
PAGE = ROOT / "docs" / "applications.md"


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_added(fn):
    gc.collect()
    base, peak, done = _rss(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.002)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out = fn()
    done.set()
    t.join()
    peak[0] = max(peak[0], _rss())
    return out, peak[0] - base


def _best(fn, repeats):
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
        del out
    return best


def measure(name, size, repeats, cold=None):
    sys.path.insert(0, str(ROOT / "tests"))
    import keras
    import numpy as np

    import cle
    from _apps import application_constructors, build_smallest
    from conftest import randomize_batch_norms

    ctor = application_constructors()[name]
    if size:
        model = ctor(weights=None, input_shape=(size, size, 3))
    else:
        model, size = build_smallest(ctor)
    randomize_batch_norms(model, deep=True)
    weight_bytes = sum(int(np.prod(w.shape)) * np.dtype(w.dtype).itemsize for w in model.weights)
    if cold is not None:
        fn = {"eq": lambda: cle.equalize_model(model),
              "clone": lambda: keras.models.clone_model(model)}[cold]
        return {"cold_" + cold: _peak_added(fn)[1]}
    # The process's one-time costs, paid by a clone that stays alive while equalize_model is
    # measured (a deleted one would leave its memory free for the new model to reuse).
    warm = keras.models.clone_model(model)
    gc.collect()
    new, added = _peak_added(lambda: cle.equalize_model(model))
    del new, warm
    clone = _best(lambda: keras.models.clone_model(model), repeats)
    fold = _best(lambda: cle.fold_all_batch_norms(model), repeats)
    eq = _best(lambda: cle.equalize_model(model), repeats)
    return {"model": name, "input": size, "weights_mb": weight_bytes / 2**20,
            "clone_s": clone, "fold_s": fold, "eq_s": eq,
            "fold_ratio": fold / clone, "eq_ratio": eq / clone,
            "peak_mb": added / 2**20, "peak_ratio": added / weight_bytes}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*")
    parser.add_argument("--all", action="store_true", help="every keras.applications model")
    parser.add_argument("--size", type=int, default=None,
                        help="input size (default 224 for the default models, else smallest)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--docs", action="store_true", help="rewrite the table in the docs")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--cold", choices=["eq", "clone"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, args.size, args.repeats, args.cold)))
        return
    if args.all:
        sys.path.insert(0, str(ROOT / "tests"))
        from _apps import application_constructors
        names, size = list(application_constructors()), args.size
    else:
        names, size = args.models or DEFAULT, args.size or 224
    start_load = os.getloadavg()
    print(f"load average at start: {start_load}", flush=True)
    header = ("| model | input | weights MB | clone s | fold/clone | eq/clone | eq peak MB "
              "| ×weights | cold eq/clone |\n|---|---|---|---|---|---|---|---|---|")
    print(header, flush=True)
    rows = []
    for name in names:
        cmd = [sys.executable, __file__, "--one", name, "--repeats", str(args.repeats)]
        if size:
            cmd += ["--size", str(size)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        cold = {}
        for what in ("eq", "clone"):
            if out.returncode == 0:
                c = subprocess.run(cmd + ["--cold", what], capture_output=True, text=True)
                out = c if c.returncode != 0 else out
                if c.returncode == 0:
                    cold.update(json.loads(c.stdout.strip().splitlines()[-1]))
        if out.returncode != 0:
            errs = [ln for ln in out.stderr.splitlines() if ln.strip() and not ln.startswith(
                ("I0000", "WARNING: All log"))]
            row = (f"| {name} | failed (exit code {out.returncode}): "
                   f"{errs[-1] if errs else 'no message (killed?)'} |")
            print(row, flush=True)
            rows.append(row)
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        row = (f"| {r['model']} | {r['input']} | {r['weights_mb']:.0f} | {r['clone_s']:.2f} | "
               f"{r['fold_ratio']:.2f} | {r['eq_ratio']:.2f} | {r['peak_mb']:.0f} | "
               f"{r['peak_ratio']:.2f} | {cold['cold_eq'] / cold['cold_clone']:.2f} |")
        print(row, flush=True)
        rows.append(row)
    load = os.getloadavg()
    print(f"load average at end: {load}", flush=True)
    if args.docs:
        sys.path.insert(0, str(ROOT / "scripts"))
        from _docblocks import cpu_name, replace_block

        text = (header + "\n" + "\n".join(rows) + "\n\n"
                f"Measured by `benchmarks/bench_cost.py` on {cpu_name()}, 2 cores, load average "
                f"{start_load[0]:.1f} at the start and {load[0]:.1f} at the end: absolute times "
                "depend on the machine and its load, ratios are within one process.")
        replace_block(PAGE, "cost", text)


if __name__ == "__main__":
    main()
