"""Which public functions work on the current Keras backend, and how exact they are.

Run it once per backend (it prints one Markdown table per model, it asserts nothing)::

    KERAS_BACKEND=tensorflow .venv/bin/python benchmarks/backends.py
    KERAS_BACKEND=jax        .venv/bin/python benchmarks/backends.py
    KERAS_BACKEND=torch      /tmp/torchvenv/bin/python benchmarks/backends.py   # torch==2.13.0

``--write`` also writes the tables into the generated block ``backends-<backend>`` of
docs/backends.md (``backends-jax``, ``backends-torch``; scripts/_docblocks.py)::

    KERAS_BACKEND=jax   .venv/bin/python benchmarks/backends.py --models MobileNetV2 --write
    KERAS_BACKEND=torch /tmp/torchvenv/bin/python benchmarks/backends.py --models MobileNetV2 --write

``--suite`` runs the test suite instead, as the pytest commands of docs/backends.md (each in a
subprocess on the current backend: the non-slow suite without tests/test_fold_properties.py,
that file alone, and the ``jax_ci`` whole-network test alone), and prints pytest's counts and
times per command, the failing tests by id, the skip reasons and the load average at the end;
with ``--write`` into block ``backends-<backend>-suite`` (``backends-torch-suite``)::

    KERAS_BACKEND=torch /tmp/torchvenv/bin/python benchmarks/backends.py --suite --write

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

# Set here only for this process's own measurements: --suite runs pytest without it (the CLI's
# quiet-stderr test must see TensorFlow's defaults).
_TF_LOG_LEVEL_SET_HERE = "TF_CPP_MIN_LOG_LEVEL" not in os.environ
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import subprocess  # noqa: E402
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
                    help="write the tables into block backends-<backend> of docs/backends.md "
                    "(with --suite: block backends-<backend>-suite)")
    ap.add_argument("--suite", action="store_true",
                    help="run the test suite's pytest commands (docs/backends.md) on this "
                    "backend instead of the function tables")
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
    block = f"backends-{backend}-suite" if args.suite else f"backends-{backend}"
    if args.write:  # fail before the measurements, not after
        sys.path.insert(0, os.path.join(ROOT, "scripts"))
        from _docblocks import blocks, replace_block

        if block not in blocks(PAGE):
            ap.error(f"{os.path.relpath(PAGE, ROOT)} has no block <!-- generated:{block} -->")
    # "jax 0.10.2, keras 3.15.1": the backend's package first
    pkgs = ", ".join(f"{pkg} {v}" for pkg, v in sorted(versions.items(), key=lambda kv: kv[0] == "keras"))

    def publish(text):
        print()
        print(text)
        if args.write:
            changed = replace_block(PAGE, block, text)
            print(f"{'wrote' if changed else 'unchanged:'} {os.path.relpath(PAGE, ROOT)} "
                  f"block {block}", flush=True)

    if args.suite:
        publish(run_suite(backend, pkgs))
        return
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
    publish(render_tables(BACKEND_NAMES.get(backend, backend), pkgs, described, ROWS))


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


# ------------------------------------------------------------------ --suite: the test suite

#: The pytest commands of docs/backends.md, after ``python -m pytest -q -p no:cacheprovider``
#: (:data:`SUITE_COMMON`): the non-slow suite
#: without the hypothesis random graphs, those alone, and the one ``jax_ci`` whole-network test.
SUITE_COMMON = ["-q", "-p", "no:cacheprovider"]
SUITE_COMMANDS = [
    ["-m", "not slow", "tests/", "--ignore=tests/test_fold_properties.py"],
    ["tests/test_fold_properties.py"],
    ["tests/test_backends.py::test_real_mobilenet_v2_fold_equalize_and_fuse"],
]
COUNT_KEYS = ("passed", "skipped", "failed", "errors", "deselected")
_COUNT_RE = re.compile(r"(\d+) (passed|skipped|failed|errors?|deselected|xfailed|xpassed|"
                       r"warnings?|rerun)\b")
# pytest's last line: "753 passed, 19 skipped, 65 deselected in 219.12s (0:03:39)" (with -q;
# framed by "=" otherwise), or "no tests ran in 0.01s".
_SUMMARY_RE = re.compile(r"^=*\s*(?P<counts>.*?)\s+in (?P<secs>\d+(?:\.\d+)?)s"
                         r"(?: \(\d+:\d\d:\d\d\))?\s*=*$")
# -ra's short summary: "FAILED tests/t.py::test_x[a] - AssertionError: ...", "ERROR ...",
# "SKIPPED [2] tests/t.py:12: reason".
_PROBLEM_RE = re.compile(r"^(?P<kind>FAILED|ERROR) (?P<id>.+?)(?: - (?P<msg>.*))?$")
_SKIP_RE = re.compile(r"^SKIPPED \[(?P<n>\d+)\] (?P<file>[^:]+):\d+: (?P<reason>.*)$")


def parse_pytest_output(lines):
    """pytest's outcome from its output lines (``-ra``, as pyproject.toml's addopts).

    Returns:
        ``{"counts": {passed, skipped, failed, errors, deselected, ...}, "seconds": float,
        "problems": [(FAILED|ERROR, test id, message)], "skips": [(n, file, reason)]}``;
        ``counts`` and ``seconds`` are None when there is no final summary line (pytest
        crashed or was killed).
    """
    out = {"counts": None, "seconds": None, "problems": [], "skips": []}
    for line in lines:
        line = line.rstrip("\n")
        if m := _PROBLEM_RE.match(line):
            out["problems"].append((m["kind"], m["id"], (m["msg"] or "").strip()))
        elif m := _SKIP_RE.match(line):
            out["skips"].append((int(m["n"]), m["file"], m["reason"].strip()))
    for line in reversed(lines):
        m = _SUMMARY_RE.match(line.strip())
        if m and (_COUNT_RE.search(m["counts"]) or "no tests ran" in m["counts"]):
            counts = dict.fromkeys(COUNT_KEYS, 0)
            for n, key in _COUNT_RE.findall(m["counts"]):
                key = {"error": "errors", "warning": "warnings"}.get(key, key)
                counts[key] = counts.get(key, 0) + int(n)
            out["counts"], out["seconds"] = counts, float(m["secs"])
            break
    return out


def _duration(seconds):
    if seconds is None:
        return "–"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds:.0f} s ({seconds / 60:.1f} min)"


def _tests(n):
    return f"{n} test" if n == 1 else f"{n} tests"


def run_suite(backend, versions):
    """Run :data:`SUITE_COMMANDS` on ``backend`` (one subprocess each, the output echoed) and
    return the Markdown text of block ``backends-<backend>-suite``."""
    env = dict(os.environ, KERAS_BACKEND=backend)
    if _TF_LOG_LEVEL_SET_HERE:
        env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    results = []
    for args in SUITE_COMMANDS:
        cmd = [sys.executable, "-m", "pytest", *SUITE_COMMON, *args]
        print(f"$ KERAS_BACKEND={backend} {shlex.join(cmd)}", flush=True)
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1)
        lines = []
        for line in proc.stdout:
            print(line, end="", flush=True)
            lines.append(line.rstrip("\n"))
        rc = proc.wait()
        wall = time.perf_counter() - t0
        results.append((args, rc, wall, parse_pytest_output(lines), lines[-5:]))
    return render_suite(BACKEND_NAMES.get(backend, backend), backend, versions, results,
                        os.getloadavg(), os.cpu_count())


def render_suite(backend_name, backend, versions, results, loadavg, cpus):
    """The block's Markdown: one row per pytest command, then every failing test by id (or
    that none failed), the skip reasons, and the load average at the end."""
    python = sys.executable
    out = [f"**{backend_name}** ({versions}). Each command is `KERAS_BACKEND={backend} "
           f"python -m pytest {shlex.join(SUITE_COMMON)}` followed by the arguments in the "
           f"first column (`python`: `{python}`), run by `benchmarks/backends.py --suite`.", "",
           "| arguments | passed | skipped | failed | errors | deselected | pytest's time |",
           "|---|---|---|---|---|---|---|"]
    problems, skips, broken = [], {}, []
    for args, rc, wall, parsed, tail in results:
        shown = shlex.join(args)
        c = parsed["counts"]
        if c is None:
            broken.append((shown, rc, tail))
            out.append(f"| `{shown}` | no summary: pytest exited with {rc} after "
                       f"{wall:.0f} s | | | | | |")
            continue
        out.append(f"| `{shown}` | " + " | ".join(str(c[k]) for k in COUNT_KEYS)
                   + f" | {_duration(parsed['seconds'])} |")
        if rc not in (0, 1) or (rc == 1 and not parsed["problems"]):  # 5: no tests ran
            broken.append((shown, rc, tail))
        problems += parsed["problems"]
        for n, file, reason in parsed["skips"]:
            count, files = skips.get(reason, (0, []))
            name = os.path.basename(file)
            skips[reason] = (count + n, files if name in files else files + [name])
    out.append("")
    total_bad = sum(r[3]["counts"][k] for r in results if r[3]["counts"]
                    for k in ("failed", "errors"))
    if problems:
        out.append(f"**{_tests(total_bad)} failed or errored:**")
        out.append("")
        out += [f"- {kind} `{tid}`" + (f": {msg[:200]}" if msg else "")
                for kind, tid, msg in problems]
        out.append("")
    elif total_bad:
        out += [f"**{_tests(total_bad)} failed or errored** (pytest printed no ids: run with "
                "`-ra`).", ""]
    for shown, rc, tail in broken:
        out += [f"**`{shown}` did not finish normally** (exit code {rc}); its last lines:", "",
                "```", *tail, "```", ""]
    if not problems and not total_bad and not broken:
        out += ["No test failed and none errored.", ""]
    if skips:
        out += ["Skipped, with pytest's reasons:", "",
                "| tests | in | reason |", "|---|---|---|"]
        out += [f"| {n} | {', '.join(files)} | {reason.replace('|', '&#124;')} |"
                for reason, (n, files) in sorted(skips.items(), key=lambda kv: -kv[1][0])]
        out.append("")
    out.append(f"Times are wall-clock on {cpus} shared CPU cores, load average "
               f"{loadavg[0]:.1f} / {loadavg[1]:.1f} / {loadavg[2]:.1f} (1 / 5 / 15 min) when "
               "the last command finished: not comparable from one run to the next.")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
