"""`cle.quantize` on the zoo (benchmarks/zoo_models.py), with data and without, against the
plain converter: issue #41's goals, measured on held-out inputs.

Run it (each model in a process of its own, so a crash of the converter or of LiteRT costs
that model only; trained models are cached, see zoo_models.py)::

    nice -n 10 .venv/bin/python benchmarks/bench_zoo.py
    nice -n 10 .venv/bin/python benchmarks/bench_zoo.py --models digits_dict two_input \
        --modes data --json /tmp/zoo.jsonl
    .venv/bin/python benchmarks/bench_zoo.py --table /tmp/zoo.jsonl   # print, measure nothing
    nice -n 10 .venv/bin/python benchmarks/bench_zoo.py --zoo hunt7_models   # a hunt's models

``--timeout`` (default 3600 s) stops a model's process that takes longer (a crash row). The
pretrained models need packages that are not dependencies (zoo_models.py names the install
commands); a model whose package is missing is printed as skipped, with the command.

It prints figures, it asserts nothing. For each model:

* **plain**: the float model straight into TF Lite's converter
  (``cle.quantization.convert_to_tflite_int8``, the same flatbuffer as
  ``TFLiteConverter.from_keras_model``, per-channel) calibrated on the model's 64 calibration
  inputs, made once per model;
* **data**: ``cle.quantize(model, x_cal, compare=True)`` with those 64 inputs (it holds a
  quarter out for its own check);
* **nodata**: ``cle.quantize(model, None, compare=True)``;

each ``.tflite`` run by LiteRT on the model's held-out inputs (never calibrated on: 1000 where
the source is generated, 192 of sklearn's fixed sets, ``zoo_models.N_EVAL_GENERATED`` and
``N_EVAL``) and compared with the float model, per output: SQNR with its 90 % interval by a
bootstrap over those inputs (how far another draw of as many could move it), top-1 agreement
for class outputs, and *cle − plain*, the gain over the plain converter with its interval by
a paired bootstrap (the same inputs, both files). Next to each real figure, the figure
``cle.quantize`` printed (``report.outputs``: its own check) and the plain converter's real
figure. Flags:

* ``below-plain``: real SQNR below plain − 0.5 dB (with data) or plain − 3 dB (without);
* ``claim-off``: the claimed SQNR more than 2 dB from the real one, and its interval (shown
  in brackets) does not hold the real one; ``in-interval`` when it does;
* ``CORRUPT``: a ``.tflite`` returned without error that is broken where the plain
  converter's is not: outputs not finite, a real SQNR under 10 dB and 10 dB below plain's, or
  a top-1 agreement 20 points below plain's; ``SILENT-CORRUPT`` when, moreover, the claim is
  more than 2 dB above the real figure (the report hides it: a silent corruption);
* ``CRASH``: an exception other than a refusal (the exception's last line is printed);
* ``refused``: a documented refusal (no input range, no batch norm to distil from), or a
  ``ValueError`` that cle raised itself, saying what of the model it cannot take (a
  subclassed model, layers TF Lite's converter cannot write): :func:`refusal`.

The column *plain real, 48* is the plain converter calibrated on the first 48 calibration
inputs only, the ones ``cle.quantize`` calibrates on (it holds the last 16 out for its
check): it tells what of a gap to *plain real* comes from the inputs held out.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

MODES = ("data", "nodata")
#: Goals (issue #41): with data, real SQNR >= plain - DATA_MARGIN; without, >= plain -
#: NODATA_MARGIN or a refusal; the claim within CLAIM_DB of the real figure.
DATA_MARGIN, NODATA_MARGIN, CLAIM_DB, CORRUPT_DB = 0.5, 3.0, 2.0, 10.0
#: Exceptions that are documented refusals, not crashes (matched by class name: the benchmark
#: uses the public API only).
REFUSALS = ("InputRangeUnknown", "NeedsData")


def refusal(exc) -> bool:
    """Whether ``exc`` is a refusal: one of :data:`REFUSALS`, or a ``ValueError`` raised in
    cle's own code (its innermost frame in ``cle/``: a check that names what of the model cle
    cannot take). Raised inside Keras, TensorFlow or NumPy it is a crash."""
    if type(exc).__name__ in REFUSALS:
        return True
    frames = traceback.extract_tb(exc.__traceback__)
    return (isinstance(exc, ValueError) and bool(frames)
            and f"{os.sep}cle{os.sep}" in frames[-1].filename)


EVAL_BATCH = 32
#: The module of models measured (in benchmarks/: the zoo, ``zoo_models``, or a hunt's with its
#: interface, ``--zoo hunt7_models``); the model processes read it from this variable.
ZOO_ENV = "CLE_BENCH_ZOO"
#: Keyword arguments for every ``cle.quantize`` call, as JSON (``--option``; for sweeps of an
#: option such as ``ranges``); the model processes read it from this variable.
OPTIONS_ENV = "CLE_BENCH_OPTIONS"
#: Seconds one model (both modes) may take before its process is stopped.
TIMEOUT = 3600.0


# ------------------------------------------------------------------------------ measuring


def _outputs(y):
    import keras

    return [float_array(a) for a in keras.tree.flatten(y)]


def float_array(a):
    import numpy as np

    return np.asarray(a, np.float64)


def _figures(content, x_eval, reference, kinds, other=None):
    """Per output ``{"sqnr_db", "interval", "top1"}`` of a ``.tflite`` on the held-out inputs
    (``interval``: the figure's 90 % interval by a bootstrap over those inputs), whether every
    output is finite, and the outputs. ``other``: another file's outputs on the same inputs
    (the plain converter's): each output's figure then also holds ``vs_plain``, the SQNR gain
    over it with its interval by a paired bootstrap (:func:`cle._measure.check.sqnr_gain`)."""
    import numpy as np
    from cle import quantization as Q
    from cle._measure import check as C

    got = Q.run_tflite(content, x_eval, batch_size=EVAL_BATCH)
    got = [float_array(y) for y in (got if isinstance(got, list) else [got])]
    out, finite = [], True
    for k, (ref, y, kind) in enumerate(zip(reference, got, kinds)):
        ok = bool(np.all(np.isfinite(y)))
        finite &= ok
        interval = C.sqnr_interval(ref, y) if ok else None
        fig = {"sqnr_db": Q.sqnr_db(ref, y) if ok else -math.inf,
               "interval": None if interval is None else list(interval),
               "top1": Q.top1_agreement(ref, y) if kind == "class" and ok else None,
               "finite": ok}
        if other is not None and ok and np.all(np.isfinite(other[k])):
            gain, bounds, _ = C.sqnr_gain([ref], [y], [other[k]])
            fig["vs_plain"] = {"gain": gain, "interval": None if bounds is None else list(bounds)}
        out.append(fig)
    return out, finite, got


def _last_line(exc):
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:300]


def _where(exc):
    """The innermost frame of the library that raised (file:line function)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/cle/" in f.filename]
    f = frames[-1] if frames else traceback.extract_tb(exc.__traceback__)[-1]
    return f"{os.path.relpath(f.filename, ROOT) if '/cle/' in f.filename else f.filename}:" \
           f"{f.lineno} {f.name}"


def zoo():
    """The module of models measured (:data:`ZOO_ENV`; default ``zoo_models``)."""
    return importlib.import_module(os.environ.get(ZOO_ENV) or "zoo_models")


def measure_model(name, modes, emit):
    """Every row of one model (``emit(row)`` for each as soon as it is known)."""
    import cle
    from cle import quantization as Q

    Z = zoo()

    base = {"model": name}
    if os.environ.get(OPTIONS_ENV):
        base["options"] = json.loads(os.environ[OPTIONS_ENV])
    try:
        start = time.perf_counter()
        model, data = Z.build(name)
        build_s = time.perf_counter() - start
    except Z.Missing as exc:
        emit(dict(base, status="skipped", why=str(exc)))
        return
    from cle._core.backend import exact_graph_kernels

    with exact_graph_kernels(model):  # as called (a fused TensorFlow kernel can drop a slope)
        reference = _outputs(model.predict(data.x_eval, batch_size=EVAL_BATCH, verbose=0))
    names = [f"{k}" for k in range(len(reference))]
    info = {"params": int(model.count_params()), "source": data.source,
            "n_cal": _count(data.x_cal), "n_eval": _count(data.x_eval),
            "build_s": build_s}
    emit(dict(base, status="info", **info))
    start = time.perf_counter()
    try:
        plain_bytes = Q.convert_to_tflite_int8(model, data.x_cal)
        plain, _, plain_y = _figures(plain_bytes, data.x_eval, reference, data.kinds)
        plain_error = None
    except Exception as exc:  # noqa: BLE001 - the converter's failure is a figure too
        plain, plain_error, plain_y = None, _last_line(exc), None
    plain_s = time.perf_counter() - start
    try:  # the plain converter on the inputs cle.quantize calibrates on (it holds a quarter out)
        kept = n_kept(_count(data.x_cal))
        plain_kept = _figures(Q.convert_to_tflite_int8(model, _head(data.x_cal, kept)),
                              data.x_eval, reference, data.kinds)[0]
    except Exception:  # noqa: BLE001 - the converter's failure is in plain_error already
        plain_kept = None
    for mode in modes:
        row = dict(base, mode=mode, load=os.getloadavg()[0])
        start = time.perf_counter()
        try:
            content, report = cle.quantize(
                model, data.x_cal if mode == "data" else None, compare=True,
                **json.loads(os.environ.get(OPTIONS_ENV) or "{}"))
        except Exception as exc:  # noqa: BLE001 - recorded, the benchmark goes on
            refused = refusal(exc)
            emit(dict(row, status="refused" if refused else "crash", error=_last_line(exc),
                      where=_where(exc), seconds=time.perf_counter() - start,
                      plain=plain, plain_error=plain_error))
            continue
        seconds = time.perf_counter() - start
        try:
            real, finite, _ = _figures(content, data.x_eval, reference, data.kinds, plain_y)
        except Exception as exc:  # noqa: BLE001 - a .tflite LiteRT cannot run
            emit(dict(row, status="crash", error="running the .tflite: " + _last_line(exc),
                      where=_where(exc), seconds=seconds, plain=plain,
                      plain_error=plain_error))
            continue
        claimed = [{"sqnr_db": o.sqnr_db, "top1": None if math.isnan(o.top1_agreement)
                    else o.top1_agreement, "name": o.name, "kind": o.kind,
                    "interval": None if o.sqnr_interval is None else list(o.sqnr_interval)}
                   for o in report.outputs]
        plain_claimed = [{"sqnr_db": o.sqnr_db} for o in (report.plain or {}).get(
            "outputs", [])]
        for k, kind in enumerate(data.kinds):
            emit(dict(row, status="ok", output=k, output_name=claimed[k]["name"] if k < len(
                claimed) else names[k], kind=kind, real=real[k],
                claimed=claimed[k] if k < len(claimed) else None,
                plain=plain[k] if plain else None, plain_error=plain_error,
                plain_kept=plain_kept[k] if plain_kept else None,
                plain_claimed=plain_claimed[k] if k < len(plain_claimed) else None,
                # each check set's figure of the output, and whether it bounds the claim
                claimed_sets=[{"inputs": c["inputs"], "bounds": c.get("bounds", True),
                               "sqnr_db": c["outputs"][k].sqnr_db,
                               "interval": None if c["outputs"][k].sqnr_interval is None
                               else list(c["outputs"][k].sqnr_interval)}
                              for c in report.check_sets if k < len(c["outputs"])],
                finite=real[k]["finite"], seconds=seconds, plain_seconds=plain_s,
                warnings=len(report.warnings), all_finite=finite,
                # with data: the build written and every candidate's cross-fitted figures
                written=report.choice.written if report.choice else None,
                crossfit=report.choice.crossfit if report.choice else None))


def n_kept(n):
    """How many of ``n`` calibration inputs ``cle.quantize`` calibrates on (it holds the last
    quarter out for its check when at least 8 remain)."""
    hold = int(round(n * 0.25))
    return n if hold < 1 or n - hold < 8 else n - hold


def _head(x, n):
    return {k: v[:n] for k, v in x.items()} if isinstance(x, dict) else x[:n]


def _count(x):
    if isinstance(x, dict):
        x = next(iter(x.values()))
    return int(len(x))


# ------------------------------------------------------------------------------- the table


def flags(r):
    """The flags of one row (see the module docstring)."""
    if r["status"] == "crash":
        return ["CRASH"]
    if r["status"] == "refused":
        return ["refused"]
    out = []
    real = r["real"]["sqnr_db"]
    plain = r["plain"]["sqnr_db"] if r.get("plain") else None
    margin = DATA_MARGIN if r["mode"] == "data" else NODATA_MARGIN
    claim = (r.get("claimed") or {}).get("sqnr_db")
    if _corrupt(r):
        hidden = claim is None or not math.isfinite(real) or claim - real > CLAIM_DB
        out.append("SILENT-CORRUPT" if hidden else "CORRUPT")
    if plain is not None and real < plain - margin:
        out.append("below-plain")
    if claim is None:
        out.append("claim-off")
    elif not _close(claim, real, CLAIM_DB):
        gap = f"({claim - real:+.1f})" if math.isfinite(claim - real) else ""
        out.append(("in-interval" if _covered(r) else "claim-off") + gap)
    return out


def _covered(r):
    """Whether the claim's interval (rows that have one) holds the real figure."""
    interval = (r.get("claimed") or {}).get("interval")
    return interval is not None and interval[0] <= r["real"]["sqnr_db"] <= interval[1]


def _corrupt(r):
    """A ``.tflite`` returned without error that is broken where the plain converter's is
    not: outputs not finite, an SQNR under ``CORRUPT_DB`` and ``CORRUPT_DB`` below plain's,
    or a top-1 agreement 20 points below plain's."""
    if not r["finite"]:
        return True
    plain = r.get("plain")
    if not plain:
        return r["real"]["sqnr_db"] < CORRUPT_DB
    if r["real"]["sqnr_db"] < min(CORRUPT_DB, plain["sqnr_db"] - CORRUPT_DB):
        return True
    top1, plain_top1 = r["real"].get("top1"), plain.get("top1")
    return top1 is not None and plain_top1 is not None and top1 < plain_top1 - 0.2


def _claim_off(r):
    return any(f.startswith("claim-off") for f in flags(r))


def _close(a, b, tol):
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= tol


def _fig(f):
    if not f:
        return "–"
    s = f"{f['sqnr_db']:.1f}" if math.isfinite(f["sqnr_db"]) else str(f["sqnr_db"])
    if f.get("interval"):
        s += f" [{f['interval'][0]:.1f}, {f['interval'][1]:.1f}]"
    return (f"{f['top1']:.0%} / {s}" if f.get("top1") is not None else s)


def _gain(real):
    """The SQNR gain over the plain converter on the held-out inputs, with its interval."""
    g = real.get("vs_plain")
    if not g:
        return "–"
    out = f"{g['gain']:+.1f}" if math.isfinite(g["gain"]) else str(g["gain"])
    return out + (f" [{g['interval'][0]:+.1f}, {g['interval'][1]:+.1f}]" if g.get("interval")
                  else "")


def table(rows, markdown=True):
    """The table of the rows (one per model × mode × output), a line per skip or crash."""
    head = ["model", "mode", "output", "cle real", "cle claimed", "plain real",
            "cle − plain", "plain real, 48", "flags", "cle s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r["status"] in ("info",):
            continue
        if r["status"] == "skipped":
            lines.append(f"| {r['model']} | – | – | skipped: {r['why']} | | | | | | |")
            continue
        if r["status"] in ("crash", "refused"):
            plain = " · ".join(_fig(p) for p in r.get("plain") or []) or \
                (r.get("plain_error") or "–")
            lines.append(f"| {r['model']} | {r['mode']} | all | {r['status']}: "
                         f"{r['error'][:160]} ({r['where']}) | – | {plain} | – | – | "
                         f"{' '.join(flags(r))} | {r['seconds']:.0f} |")
            continue
        plain = _fig(r.get("plain")) if r.get("plain") else f"converter: {r['plain_error']}"
        out = f"{r['output']} {r['output_name']} ({r['kind']})"
        lines.append(f"| {r['model']} | {r['mode']} | {out} | {_fig(r['real'])} | "
                     f"{_fig(r['claimed'])} | {plain} | {_gain(r['real'])} | "
                     f"{_fig(r.get('plain_kept'))} | "
                     f"{' '.join(flags(r))} | "
                     f"{r['seconds']:.0f} |")
    return "\n".join(lines)


def models_table(rows):
    """One line per model: kind, weights, parameters, data."""
    lines = ["| model | parameters | weights and data |", "|---|---|---|"]
    for r in rows:
        if r["status"] == "info":
            lines.append(f"| {r['model']} | {r['params']:,} | {r['source']} "
                         f"({r['n_cal']} calibration, {r['n_eval']} held out) |")
        elif r["status"] == "skipped":
            lines.append(f"| {r['model']} | – | skipped: {r['why']} |")
    return "\n".join(lines)


def summary(rows):
    """The goals, counted."""
    out = []
    ok = [r for r in rows if r["status"] == "ok"]
    for mode, margin in (("data", DATA_MARGIN), ("nodata", NODATA_MARGIN)):
        mine = [r for r in ok if r["mode"] == mode]
        runs = {r["model"] for r in rows if r.get("mode") == mode}
        if not runs:
            continue
        refused = sorted(r["model"] for r in rows if r.get("mode") == mode
                         and r["status"] == "refused")
        crashed = sorted(r["model"] for r in rows if r.get("mode") == mode
                         and r["status"] == "crash")
        good = [r for r in mine if "below-plain" not in flags(r)]
        claims = [r for r in mine if not _claim_off(r)]
        within = [r for r in claims if not any(f.startswith("in-interval") for f in flags(r))]
        broken = sorted({r["model"] for r in mine if {"CORRUPT", "SILENT-CORRUPT"} & set(
            flags(r))})
        corrupt = sorted({r["model"] for r in mine if "SILENT-CORRUPT" in flags(r)})
        misses = [f"{r['model']}[{r['output']}] {r['real']['sqnr_db']:.1f} vs "
                  f"{r['plain']['sqnr_db']:.1f} (gain {_gain(r['real'])})"
                  for r in mine if "below-plain" in flags(r)]
        off = [f"{r['model']}[{r['output']}] claimed {r['claimed']['sqnr_db']:.1f}, real "
               f"{r['real']['sqnr_db']:.1f}" for r in mine if _claim_off(r)]
        met = sorted(m for m in runs if m in refused and mode == "nodata" or (
            m not in crashed and m not in refused
            and all("below-plain" not in flags(r) for r in mine if r["model"] == m)))
        out.append(f"{mode}: models meeting the goal (every output >= plain - {margin:g} dB"
                   f"{' or a refusal' if mode == 'nodata' else ''}): {len(met)}/{len(runs)}")
        out.append(f"  {len(runs)} models; outputs >= plain - {margin:g} dB: "
                   f"{len(good)}/{len(mine)}; claims within {CLAIM_DB:g} dB: "
                   f"{len(within)}/{len(mine)}, or within their interval: "
                   f"{len(claims)}/{len(mine)}; crashes: {len(crashed)}{_names(crashed)}; "
                   f"refusals: {len(refused)}{_names(refused)}; broken files: {len(broken)}"
                   f"{_names(broken)}, of which silent (claim > real + {CLAIM_DB:g} dB): "
                   f"{len(corrupt)}{_names(corrupt)}")
        if misses:
            out.append(f"  below plain: {'; '.join(misses)}")
        if off:
            out.append(f"  claim off: {'; '.join(off)}")
    skipped = sorted(r["model"] for r in rows if r["status"] == "skipped")
    if skipped:
        out.append(f"skipped (weights package missing): {len(skipped)}{_names(skipped)}")
    return "\n".join(out)


def _names(names):
    return f" ({', '.join(names)})" if names else ""


def machine():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from _docblocks import cpu_name

    return f"{cpu_name()}, {os.cpu_count()} CPUs, {platform.python_version()}"


# ----------------------------------------------------------------------------- the driver


def _worker(name, modes, path):
    def emit(row):
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row, default=float) + "\n")

    measure_model(name, modes, emit)


def read_rows(path):
    rows = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    return rows


def run(names, modes, path, timeout=TIMEOUT):
    """Each model in a child process; a child that dies (or takes more than ``timeout``
    seconds) is recorded as a crash of the modes it had not finished."""
    for name in names:
        part = path + f".{name}.part"
        if os.path.exists(part):
            os.remove(part)
        start = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", name,
                                   "--modes", *modes, "--json", part],
                                  capture_output=True, text=True, timeout=timeout)
            code, tail = proc.returncode, (proc.stderr.strip().splitlines() or [""])[-1][:300]
        except subprocess.TimeoutExpired:
            code, tail = "timeout", f"no answer within {timeout:g} s"
        rows = read_rows(part)
        done = {r.get("mode") for r in rows if r["status"] != "info"}
        if code != 0:
            for mode in modes:
                if mode not in done and not any(r["status"] == "skipped" for r in rows):
                    rows.append({"model": name, "mode": mode, "status": "crash",
                                 "error": f"process died (exit {code}): {tail}",
                                 "where": "-", "seconds": time.perf_counter() - start})
        with open(path, "a", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, default=float) + "\n")
        if os.path.exists(part):
            os.remove(part)
        print(table([r for r in rows]), flush=True)
        print(f"({name}: {time.perf_counter() - start:.0f} s)", flush=True)


def _option(text, ap):
    name, eq, value = text.partition("=")
    if not eq or not name.isidentifier():
        ap.error(f"--option {text}: expected NAME=VALUE")
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--zoo", default=None, help="the module of models (in benchmarks/): "
                    "zoo_models (default), or hunt7_models (helper-32's hunt)")
    ap.add_argument("--models", nargs="*", metavar="MODEL",
                    help="default: every model of the zoo; NAME@K: a hunt's model with its "
                    "K-th other draw of calibration inputs")
    ap.add_argument("--modes", nargs="*", choices=MODES, default=list(MODES))
    ap.add_argument("--json", help="rows as JSON lines (appended; default: a temporary file)")
    ap.add_argument("--table", metavar="JSONL", help="print the table of a JSON lines file, "
                    "measure nothing")
    ap.add_argument("--timeout", type=float, default=TIMEOUT,
                    help="seconds per model before its process is stopped (a crash row)")
    ap.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                    help="a keyword argument of every cle.quantize call (a sweep, e.g. "
                    "ranges=minmax; VALUE read as JSON, else as a string); repeatable")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.zoo:
        os.environ[ZOO_ENV] = args.zoo  # the model processes inherit it
    if args.option:
        os.environ[OPTIONS_ENV] = json.dumps(dict(_option(o, ap) for o in args.option))
    Z = zoo()
    draws = hasattr(Z, "DRAW")  # a hunt's module takes NAME@K
    unknown = [m for m in args.models or ()
               if (m.partition("@")[0] if draws else m) not in Z.MODELS]
    if unknown:
        ap.error(f"--models: not in {Z.__name__}: {', '.join(unknown)} (it has: "
                 f"{', '.join(Z.MODELS)})")
    if args.worker:
        return _worker(args.worker, args.modes, args.json)
    if args.table:
        rows = read_rows(args.table)
    else:
        path = args.json or os.path.join(tempfile.mkdtemp(prefix="cle-zoo-"), "zoo.jsonl")
        print(f"rows: {path}", flush=True)
        start = len(read_rows(path))
        run(args.models or list(Z.MODELS), args.modes, path, args.timeout)
        rows = read_rows(path)[start:]
    print()
    print(models_table(rows))
    print()
    print(table(rows))
    print()
    print(f"Machine: {machine()}; load average {os.getloadavg()[0]:.1f}.")
    print("Cells: top-1 agreement / SQNR (dB) against the float model on the held-out inputs; "
          "'claimed' is what cle.quantize's report said (its own check).")
    print(summary(rows))


if __name__ == "__main__":
    main()
