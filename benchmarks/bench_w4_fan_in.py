"""Peak memory of ``cle.quantize(model, ..., weight_bits=4)`` on a model with a Dense layer of
61,952 inputs (issue #41): a grayscale 96x96x1 classifier whose convolutions end on a 22x22x128
map, flattened into ``Dense(128)`` (7.9 M of its 8.0 M weights), then ``Dense(7)``.

Each mode runs in a child process of its own, so that each peak is that run's alone: "data"
(64 random-ish inputs, the default rounding: ``adaround``) and "no data" (the inputs distilled
from the batch norms' statistics: ``gptq``). The peak is the child's largest resident set
(``getrusage``'s ``ru_maxrss``). A watchdog thread ends a child whose resident set passes
``--rss-limit-gb`` (the machine is shared: a run that would grow without bound is stopped and
reported as such, not left to the OOM killer).

Run it directly (minutes per mode on 2 cores, tens of minutes for the default ``adaround``
with data on a loaded machine; the random weights make the check's figures meaningless, so
only memory and time are printed)::

    .venv/bin/python benchmarks/bench_w4_fan_in.py
    .venv/bin/python benchmarks/bench_w4_fan_in.py --modes data --rounding gptq

It prints figures and asserts nothing.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402


def _rss_bytes() -> int:
    """This process's resident set now (Linux's ``/proc/self/status``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _watchdog(limit_bytes, stage):
    """End the process (exit code 3) once its resident set passes ``limit_bytes``; ``stage``
    (a one-item list) holds the last progress line, printed with the verdict."""
    while True:
        rss = _rss_bytes()
        if rss > limit_bytes:
            print(json.dumps({"result": f"stopped: resident set {rss / 2**30:.1f} GiB passed "
                                        f"{limit_bytes / 2**30:.1f} GiB",
                              "last_progress": stage[0]}), flush=True)
            os._exit(3)
        time.sleep(0.05)


def build_model(seed=0):
    """The 96x96x1 classifier with the 61,952-input Dense layer (random weights, BN
    statistics set so that the no-data path has something to distil from)."""
    import keras
    import numpy as np
    keras.utils.set_random_seed(seed)
    L = keras.layers
    x = inp = keras.Input((96, 96, 1))
    for filters, pad in ((32, "same"), (64, "same")):
        x = L.Conv2D(filters, 3, padding=pad, use_bias=False)(x)
        x = L.BatchNormalization()(x)
        x = L.ReLU()(x)
        x = L.MaxPooling2D()(x)                      # 48, then 24
    x = L.Conv2D(128, 3, padding="valid", use_bias=False)(x)   # 22x22x128
    x = L.BatchNormalization()(x)
    x = L.ReLU()(x)
    x = L.Flatten()(x)                               # 61,952
    x = L.Dense(128, activation="relu")(x)
    out = L.Dense(7, activation="softmax")(x)
    model = keras.Model(inp, out, name="emotion_like")
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, L.BatchNormalization):
            c = layer.moving_mean.shape[0]
            layer.moving_mean.assign(rng.normal(0, 0.2, c).astype("float32"))
            layer.moving_variance.assign(rng.uniform(0.5, 2.0, c).astype("float32"))
    return model


def child(mode, rounding, n, limit_gb):
    """One run: prints a JSON line."""
    import numpy as np

    import cle
    stage = [""]
    if limit_gb > 0:
        threading.Thread(target=_watchdog, args=(int(limit_gb * 2**30), stage),
                         daemon=True).start()

    def say(message):
        stage[0] = message
        print("  " + message, file=sys.stderr, flush=True)

    model = build_model()
    fan_in = max(int(w.shape[0]) for w in model.weights if len(w.shape) == 2)
    data = None
    if mode == "data":
        rng = np.random.default_rng(1)
        # Smooth random images: a coarse field upsampled, plus noise, in [0, 1].
        coarse = rng.uniform(0, 1, (n, 12, 12, 1))
        data = (np.kron(coarse, np.ones((1, 8, 8, 1)))
                + rng.normal(0, 0.05, (n, 96, 96, 1))).clip(0, 1).astype("float32")
    start = time.perf_counter()
    _, report = cle.quantize(model, data, weight_bits=4, rounding=rounding,
                             input_range=None if data is not None else (0, 1), progress=say)
    dense = [r for r in report.rounding.layers if r.kind == "dense"]
    row = {"result": "ran", "mode": mode, "rounding": report.rounding.method,
           "fan_in": fan_in, "params": model.count_params(),
           "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
           "seconds": time.perf_counter() - start,
           "rounding_seconds": report.rounding.seconds,
           "dense": [{"layer": r.layer, "sqnr_nearest_db": r.sqnr_nearest_db,
                      "sqnr_db": r.sqnr_db, "seconds": r.seconds,
                      "reason": getattr(r, "reason", None)} for r in dense],
           "load": os.getloadavg()[0]}
    print(json.dumps(row), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", nargs="+", default=["data", "no data"],
                    choices=["data", "no data"])
    ap.add_argument("--rounding", default="auto", help="cle.quantize's rounding (default auto)")
    ap.add_argument("--n", type=int, default=64, help="calibration inputs with data")
    ap.add_argument("--rss-limit-gb", type=float, default=8.0,
                    help="stop a run whose resident set passes this (0: no limit)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args.child, args.rounding, args.n, args.rss_limit_gb)
    for mode in args.modes:
        proc = subprocess.run(
            [sys.executable, __file__, "--child", mode, "--rounding", args.rounding,
             "--n", str(args.n), "--rss-limit-gb", str(args.rss_limit_gb)],
            stdout=subprocess.PIPE, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        row = json.loads(lines[-1]) if lines else {"result": f"exit code {proc.returncode}"}
        row.setdefault("mode", mode)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
