"""4-bit weights (W4A8) and the rounding candidates on both real networks: the tables of
docs/quantize_w4.md (blocks ``w4a8-goals`` and ``w4a8-candidates``).

The figures come from ``benchmarks/bench_w4a8.py``, which writes one JSON line per row::

    .venv/bin/python benchmarks/bench_w4a8.py --net mobilenet_v2 --json w4.jsonl
    .venv/bin/python benchmarks/bench_w4a8.py --net mobilenet_v2 --json w4.jsonl \\
        --rows w4_nearest w4_adaround w8_gptq w8_adaround          # the other candidates
    .venv/bin/python scripts/gen_w4a8_results.py --jsonl w4.jsonl    # save, write the docs
    .venv/bin/python scripts/gen_w4a8_results.py --render            # docs from docs/data

``benchmarks/bench_w4a8_knobs.py`` sweeps the 4-bit rounding's two knobs (block
``w4a8-knobs``, rows in ``docs/data/w4a8_knobs.json``)::

    .venv/bin/python scripts/gen_w4a8_results.py --knobs knobs.jsonl

``benchmarks/bench_w4a8_apps.py`` runs W4A8 on ``keras.applications`` models with random
weights (block ``w4a8-apps``, rows in ``docs/data/w4a8_apps.json``)::

    .venv/bin/python scripts/gen_w4a8_results.py --apps apps.jsonl

``benchmarks/bench_w4_generalize.py`` measures issue #44's levers for the rounding's
generalization from few crops (block ``w4a8-generalize``, rows in
``docs/data/w4_generalize.json``)::

    .venv/bin/python scripts/gen_w4a8_results.py --generalize gen.jsonl

``benchmarks/bench_w4_distinct.py`` measures issue #44's goal with 64 distinct photos to
calibrate (``benchmarks/photo_pool.py``'s) and photos of other packages to judge (block
``w4a8-distinct``, rows in ``docs/data/w4_distinct.json``)::

    .venv/bin/python scripts/gen_w4a8_results.py --distinct distinct.jsonl

``benchmarks/bench_w4_distill.py`` measures issue #44's item 4, what the distillation of the
synthetic inputs can give the rounding without data (block ``w4a8-distill``, rows in
``docs/data/w4_distill.json``)::

    .venv/bin/python scripts/gen_w4a8_results.py --distill distill.jsonl

``--jsonl`` keeps the last row of each (network, row) in ``docs/data/w4a8.json`` (rows saved
earlier stay unless measured again), then renders. A row without the machine's name (older
benchmark output) gets the name of the machine this script runs on: run it where the
benchmark ran.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _docblocks import cpu_name, publish, wrap  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.join(HERE, "..")
DATA = os.path.join(REPO, "docs", "data", "w4a8.json")
KNOBS = os.path.join(REPO, "docs", "data", "w4a8_knobs.json")
APPS = os.path.join(REPO, "docs", "data", "w4a8_apps.json")
GENERALIZE = os.path.join(REPO, "docs", "data", "w4_generalize.json")
DISTINCT = os.path.join(REPO, "docs", "data", "w4_distinct.json")
DISTILL = os.path.join(REPO, "docs", "data", "w4_distill.json")
DOC = "docs/quantize_w4.md"
NETS = {"mobilenet_v2": "MobileNetV2", "efficientnet_lite1": "EfficientNet-Lite1",
        "efficientnet_lite0": "EfficientNet-Lite0 (outside the repository)"}
#: (row name, what it is) of the goals' table.
GOAL_ROWS = [
    ("baseline W8A8", "float model straight into TF Lite's converter, W8A8 (the baseline)"),
    ("W4A8 data", "`cle.quantize(model, crops, weight_bits=4)`"),
    ("W4A8 no data", "`cle.quantize(model, weight_bits=4, input_range=...)`, no data"),
    ("W8A8 default", "`cle.quantize(model, crops)` (rounding `auto`)"),
]
#: (weight bits, rounding, row names that measure it) of the candidates' table.
#: "W4A8 data" is the default's row ("adaround" at 4 bits with data, "gptq" without).
CANDIDATE_ROWS = [
    (4, "nearest", ("W4A8 nearest",)),
    (4, "gptq", ("W4A8 gptq",)),
    (4, "adaround", ("W4A8 data", "W4A8 adaround")),
    (8, "nearest", ("W8A8 nearest",)),
    (8, "gptq", ("W8A8 gptq",)),
    (8, "adaround", ("W8A8 adaround",)),
    ("4, no data", "gptq", ("W4A8 no data",)),
    ("4, no data", "adaround", ("W4A8 no data adaround",)),
]


def load():
    with open(DATA, encoding="utf-8") as f:
        return json.load(f)


def _merge(target, paths, key, order=None):
    """Merge the rows of the JSON-lines files ``paths`` into the JSON file ``target`` (the
    last row of each ``key(row)`` kept; ``order``: a sort key), each row with the machine's
    name."""
    try:
        with open(target, encoding="utf-8") as f:
            rows = {key(r): r for r in json.load(f)["rows"]}
    except FileNotFoundError:
        rows = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    if r.get("n_eval", 256) != 256:
                        raise SystemExit(f"{path}: a row evaluated on {r['n_eval']} crops; "
                                         "the tables are on the goals' 256 (run the "
                                         "benchmark without --eval-crops)")
                    r.setdefault("cpu", cpu_name())
                    r.setdefault("cores", os.cpu_count())
                    rows[key(r)] = r
    ordered = sorted(rows.values(), key=order) if order else list(rows.values())
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "w", encoding="utf-8") as f:
        json.dump({"rows": ordered}, f, indent=1)
        f.write("\n")


def save_rows(paths):
    """Merge the rows of the JSON-lines files into :data:`DATA`."""
    _merge(DATA, paths, lambda r: (r["net"], r["row"]),
           lambda r: (list(NETS).index(r["net"]), r["row"]))


def _cell(r):
    wide = r.get("kernels_8bit")
    return f"{r['top1']:.1%} / {r['sqnr_db']:.2f}" + (f" ({wide} kernels 8-bit)" if wide else "")


def _time(r):
    rounding = r.get("stages", {}).get("rounding")
    return f"{r['seconds']:.0f} s" + (f" (rounding {rounding:.0f} s)" if rounding else "")


def _machine(rows):
    cpus = sorted({f"{r['cpu']}, {r['cores']} cores" for r in rows})
    loads = [r["load"] for r in rows if r.get("load") is not None]
    load = (f" (load average {min(loads):.1f}–{max(loads):.1f} at the end of the rows"
            + ("; not recorded for some" if len(loads) < len(rows) else "") + ")"
            if loads else " (load not recorded; some rows ran beside another measurement)")
    return wrap(f"Measured on {'; '.join(cpus)}, shared with other work{load}.")


def goals_table(rows):
    by = {(r["net"], r["row"]): r for r in rows}
    nets = [n for n in NETS if (n, "baseline W8A8") in by]
    lines = [
        wrap("TFLite, per-channel weights; top-1 agreement / logit SQNR (dB) against the float "
             "model on 256 real photo crops; calibration: 64 other crops; size of the "
             "`.tflite` (and its share of the baseline's); wall time of the call, its own "
             "check included:"),
        "",
        "| network | model | top-1 / SQNR (dB) | size | time |",
        "|---|---|---|---|---|",
    ]
    used = []
    for net in nets:
        for name, label in GOAL_ROWS:
            r = by.get((net, name))
            if r is not None:
                used.append(r)
                share = r["bytes"] / by[(net, "baseline W8A8")]["bytes"]
                lines.append(f"| {NETS[net]} | {label} | {_cell(r)} | "
                             f"{r['bytes'] / 1e6:.2f} MB ({share:.2f}×) | {_time(r)} |")
    return "\n".join(lines) + "\n\n" + _machine(used) + "\n"


def _head(caption, labels, nets):
    """A table's caption and header: the ``labels`` columns, then one column per network."""
    return [wrap(caption), "",
            "| " + " | ".join(labels) + " | " + " | ".join(NETS[n] for n in nets) + " |",
            "|" + "---|" * (len(labels) + len(nets))]


def candidates_table(rows):
    by = {(r["net"], r["row"]): r for r in rows}
    nets = [n for n in NETS if any(by.get((n, names[0])) for _, _, names in CANDIDATE_ROWS)]
    lines = _head(
        "`cle.quantize(model, crops, weight_bits=..., rounding=...)` with 64 real crops "
        "(\"no data\": `cle.quantize(model, weight_bits=4, input_range=..., rounding=...)`), "
        "TFLite per-channel; top-1 agreement / logit SQNR (dB) against the float model on "
        "256 other crops; wall time of the call (of its rounding stage). A dash: not "
        "measured. At 4 bits, \"k kernels 8-bit\": the kernels the rounding kept on "
        "8-bit grids within the file budget (`WIDE_SIZE_RATIO`); an INT4 row without it "
        "has every kernel at 4 bits (`nearest` always; the other roundings when "
        "measured before that rule).", ("weights", "rounding"), nets)
    used = []
    for bits, method, names in CANDIDATE_ROWS:
        cells = []
        for net in nets:
            r = next((by[(net, n)] for n in names if (net, n) in by), None)
            if r is None:
                cells.append("–")
            else:
                used.append(r)
                cells.append(f"{_cell(r)}, {_time(r)}")
        lines.append(f"| INT{bits} | `{method}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + _machine(used) + "\n"


def save_knobs(paths):
    """The rows of ``benchmarks/bench_w4a8_knobs.py`` (JSON lines) into :data:`KNOBS`, the
    last of each (network, rounding, budget, ridge) kept."""
    _merge(KNOBS, paths, lambda r: (r["net"], r["rounding"], r["size_ratio"], r["damp"]))


def knobs_table(rows):
    nets = [n for n in NETS if any(r["net"] == n for r in rows)]
    keys = list(dict.fromkeys((r["rounding"], r["size_ratio"], r["damp"]) for r in rows))
    by = {(r["net"], r["rounding"], r["size_ratio"], r["damp"]): r for r in rows}
    lines = _head(
        "`cle.quantize(model, crops, weight_bits=4, rounding=...)` with 64 real crops, "
        "TFLite per-channel, with `WIDE_SIZE_RATIO` (the file budget of the 8-bit kernels; "
        "none: every kernel 4-bit) and `DATA_DAMP_LOW_BITS` (the rounding's ridge) set as "
        "the row says, the defaults first for each rounding; top-1 agreement / logit SQNR "
        "(dB) against the float model on 256 other crops, and the file's size against the "
        "same build's 8-bit file.",
        ("rounding", "file budget", "ridge"), nets)
    for method, ratio, damp in keys:
        cells = []
        for net in nets:
            r = by.get((net, method, ratio, damp))
            cells.append("–" if r is None else
                         f"{_cell(r)}, {r['bytes'] / r['bytes_int8']:.3f}×")
        budget = "none" if ratio is None else f"{ratio:g}×"
        lines.append(f"| `{method}` | {budget} | {damp:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + _machine(rows) + "\n"


def _net_rows(rows, order, cells) -> list[str]:
    """A table's lines, network by network in :data:`NETS`' order and row by row in ``order``
    (``(row key, label)``): ``| network | label | cells(row) |`` for each row measured."""
    by = {(r["net"], r["row"]): r for r in rows}
    return [f"| {NETS[net]} | {label} | {cells(by[net, key])} |"
            for net in NETS for key, label in order if (net, key) in by]


#: (row of bench_w4_generalize.py, what the rounding stage did) of the generalization table.
GENERALIZE_ROWS = [
    ("baseline", "none: the float model straight into TF Lite's converter, W8A8 (the goal)"),
    ("int8", "none: `cle.quantize(model, crops)`, 8-bit weights rounded to nearest"),
    ("default", "layer-wise AdaRound on the 48 crops the build calibrates on (the default)"),
    ("ridge", "the same with ten times the ridge (`DATA_DAMP_LOW_BITS`)"),
    ("shrink", "the same with the correlations between a layer's inputs shrunk as without data "
               "(`SYNTHETIC_SHRINK`)"),
    ("outputs", "the same with the 8-bit kernels chosen by the noise each adds to the model's "
                "outputs"),
    ("flips", "the same on the 48 and a horizontally flipped copy of each"),
    ("mix", "the same on the 48 and 48 mixes of them (a rectangle of another crop pasted in)"),
    ("all", "the same on all 64 crops (the check's 16 among them)"),
    ("block", "block reconstruction: each inverted residual's kernels rounded together for "
              "the block's output"),
]


def save_generalize(paths):
    """The rows of ``benchmarks/bench_w4_generalize.py`` into :data:`GENERALIZE`."""
    _merge(GENERALIZE, paths, lambda r: (r["net"], r["row"]),
           lambda r: (r["net"], [k for k, _ in GENERALIZE_ROWS].index(r["row"])))


def generalize_table(rows):
    lines = [wrap(
        "`cle.quantize(model, crops, weight_bits=4)` with 64 real crops, only the rounding "
        "stage's inputs or method changed (`benchmarks/bench_w4_generalize.py`): top-1 "
        "agreement / logit SQNR (dB) against the float model on 256 other crops of the nine "
        "photos the calibration crops are cut from, on the 48 crops the rounding fits (for "
        "the rows without a rounding: the same 48), and on 256 crops of 13 new photos (none of "
        "the nine; a dash: not measured); wall time of the call."),
        "", "| network | rounding | 256 other crops | the 48 fitted | new photos | time |",
        "|---|---|---|---|---|---|"]
    lines += _net_rows(rows, GENERALIZE_ROWS, lambda r: (
        f"{r['top1']:.1%} / {r['sqnr_db']:.2f} | {r['fit_top1']:.1%} / {r['fit_sqnr_db']:.2f} | "
        + (f"{r['new_top1']:.1%} / {r['new_sqnr_db']:.2f}" if "new_top1" in r else "–")
        + f" | {r['seconds']:.0f} s"))
    return "\n".join(lines) + "\n\n" + _machine(rows) + "\n"


#: ((calibration, row) of bench_w4_distinct.py, in words) of its table, in order.
DISTINCT_ROWS = [
    (("pool", "baseline"), "64 distinct photos", "the float model straight into TF Lite's "
                                                 "converter, W8A8 (the goal)"),
    (("pool", "int8"), "64 distinct photos", "`cle.quantize(model, x)`, W8A8"),
    (("pool", "w4"), "64 distinct photos", "`cle.quantize(model, x, weight_bits=4)`, W4A8"),
    (("nine", "baseline"), "64 crops of the nine", "the float model straight into TF Lite's "
                                                   "converter, W8A8"),
    (("nine", "w4"), "64 crops of the nine", "`cle.quantize(model, x, weight_bits=4)`, W4A8"),
]


def save_distinct(paths):
    """The rows of ``benchmarks/bench_w4_distinct.py`` into :data:`DISTINCT`."""
    keys = [k for k, _, _ in DISTINCT_ROWS]
    _merge(DISTINCT, paths, lambda r: (r["net"], r["calibration"], r["row"]),
           lambda r: (list(NETS).index(r["net"]), keys.index((r["calibration"], r["row"]))))


def distinct_table(rows):
    lines = [wrap(
        "Calibrated on one crop of each of 64 distinct photos (GCompris' activity photos, "
        "`benchmarks/photo_pool.py`) or on the docs' 64 crops of the nine sample photos, and "
        "judged on a centre crop of each photo of the pool's other packages (wallpapers, "
        "OpenCV's samples, a photo album, Tux Paint's templates, photos in wheels; "
        "`benchmarks/bench_w4_distinct.py`): top-1 agreement / logit SQNR (dB) against the "
        "float model (LiteRT); the build's claim, its own check (of the 4-bit builds on the 16 "
        "inputs they held out; of cle's 8-bit default cross-fitted on all 64); wall time of "
        "the call."),
        "", "| network | calibration | build | photos of other packages | claimed | time |",
        "|---|---|---|---|---|---|"]
    by = {(r["net"], r["calibration"], r["row"]): r for r in rows}
    for net in NETS:
        for (source, row), said, build in DISTINCT_ROWS:
            r = by.get((net, source, row))
            if r is not None:
                lines.append(
                    f"| {NETS[net]} | {said} | {build} | {r['top1']:.1%} / {r['sqnr_db']:.2f} "
                    f"({r['judged']} photos) | "
                    + ("–" if r["claim"] is None else f"{r['claim']:.2f}")
                    + f" | {r['seconds']:.0f} s |")
    return "\n".join(lines) + "\n\n" + _machine(rows) + "\n"


#: (row of bench_w4_distill.py, how the synthetic inputs were distilled) of its table.
DISTILL_ROWS = [
    ("base", "20 Adam steps from white noise (the default)"),
    ("again", "the default again, another run of the same call"),
    ("pink", "20 steps from noise of a natural image's spectrum (1/f), channels apart"),
    ("pink_corr0.8", "20 steps from 1/f noise, 80 % of each pixel's variance common to its "
                     "channels"),
    ("s100", "100 steps from white noise"),
    ("pink_corr0.8_s100", "100 steps from that 1/f noise"),
    ("s300", "300 steps from white noise"),
    ("pink_corr0.8_s300", "300 steps from that 1/f noise"),
    ("distilled", "the default's, the rounding fitted on its distilled half alone"),
    ("fields", "the default's, the rounding fitted on its natural-image fields alone"),
    ("n96", "96 distilled inputs instead of 32 (the fields as before)"),
    ("n160", "160 distilled inputs instead of 32"),
    ("real48", "not a method, a bound: the default's, the rounding fitted on the 48 real crops a "
               "build with data fits, with the settings it takes on real data"),
]


def save_distill(paths):
    """The rows of ``benchmarks/bench_w4_distill.py`` into :data:`DISTILL`."""
    _merge(DISTILL, paths, lambda r: (r["net"], r["row"]),
           lambda r: (list(NETS).index(r["net"]), [k for k, _ in DISTILL_ROWS].index(r["row"])))


def distill_table(rows):
    lines = [wrap(
        "`cle.quantize(model, weight_bits=4, input_range=...)` without data, only the "
        "distillation of its synthetic inputs, or which of them the rounding fits, changed "
        "(`benchmarks/bench_w4_distill.py`): "
        "top-1 agreement / logit SQNR (dB) against the float model on 256 real photo crops; "
        "wall time of the call (of its synthesis). The plain W8A8 conversion with 64 real "
        "crops, the goal's baseline, is in the goals' table above."),
        "", "| network | synthetic inputs | top-1 / SQNR (dB) | time |", "|---|---|---|---|"]
    lines += _net_rows(rows, DISTILL_ROWS, lambda r: (
        f"{r['top1']:.1%} / {r['sqnr_db']:.2f} | {r['seconds']:.0f} s (synthesis "
        f"{r['stages']['synthesize']:.0f} s)"))
    return "\n".join(lines) + "\n\n" + _machine(rows) + "\n"


def save_apps(paths):
    """The rows of ``benchmarks/bench_w4a8_apps.py`` (JSON lines) into :data:`APPS`, the last
    of each (model, mode, rounding) kept, in the models' order."""
    _merge(APPS, paths, lambda r: (r["model"], r["mode"], r["rounding"]),
           lambda r: (r["model"], r["rounding"] != "auto", r["rounding"], r["mode"]))


def _app_cell(r):
    if r is None:
        return "–"
    if r["result"] != "ran":
        return r["result"].replace("|", "/")
    rounding = r.get("rounding_s")
    return (f"ran, {r['bytes'] / 1e6:.2f} MB, {r['seconds']:.0f} s"
            + ("" if rounding is None else f" (rounding {rounding:.0f} s)"))


def apps_table(rows):
    by = {(r["model"], r["rounding"], r["mode"]): r for r in rows}
    keys = list(dict.fromkeys((r["model"], r["rounding"]) for r in rows))
    lines = [wrap(
        "`cle.quantize(model, x, weight_bits=4, rounding=...)` on `keras.applications` "
        "models at the smallest input each accepts, with random weights "
        "(`benchmarks/bench_w4a8_apps.py`): with data, 24 photo crops (`compare=True`); "
        "without, none. Whether the call gave a `.tflite` that LiteRT ran (its size), or "
        "what it said instead; wall time of the call (of its rounding stage). With random "
        "weights the check's figures say nothing about a trained model, so none are shown."),
        "", "| model | weights | rounding | with data | without data |", "|---|---|---|---|---|"]
    for model, method in keys:
        r0 = by.get((model, method, "data")) or by.get((model, method, "no data"))
        lines.append(f"| {model} | {r0['params'] / 1e6:.1f}M | `{method}` | "
                     f"{_app_cell(by.get((model, method, 'data')))} | "
                     f"{_app_cell(by.get((model, method, 'no data')))} |")
    return "\n".join(lines) + "\n\n" + _machine(rows) + "\n"


def rendered():
    """``{(doc path relative to the repo, block name): text}`` from the saved rows."""
    rows = load()["rows"]
    out = {(DOC, "w4a8-goals"): goals_table(rows),
           (DOC, "w4a8-candidates"): candidates_table(rows)}
    if os.path.exists(KNOBS):
        with open(KNOBS, encoding="utf-8") as f:
            out[(DOC, "w4a8-knobs")] = knobs_table(json.load(f)["rows"])
    if os.path.exists(GENERALIZE):
        with open(GENERALIZE, encoding="utf-8") as f:
            out[(DOC, "w4a8-generalize")] = generalize_table(json.load(f)["rows"])
    if os.path.exists(DISTINCT):
        with open(DISTINCT, encoding="utf-8") as f:
            out[(DOC, "w4a8-distinct")] = distinct_table(json.load(f)["rows"])
    if os.path.exists(DISTILL):
        with open(DISTILL, encoding="utf-8") as f:
            out[(DOC, "w4a8-distill")] = distill_table(json.load(f)["rows"])
    if os.path.exists(APPS):
        with open(APPS, encoding="utf-8") as f:
            out[(DOC, "w4a8-apps")] = apps_table(json.load(f)["rows"])
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jsonl", nargs="+", help="bench_w4a8.py's JSON lines to save")
    parser.add_argument("--knobs", nargs="+",
                        help="bench_w4a8_knobs.py's JSON lines to save")
    parser.add_argument("--apps", nargs="+", help="bench_w4a8_apps.py's JSON lines to save")
    parser.add_argument("--generalize", nargs="+",
                        help="bench_w4_generalize.py's JSON lines to save")
    parser.add_argument("--distinct", nargs="+",
                        help="bench_w4_distinct.py's JSON lines to save")
    parser.add_argument("--distill", nargs="+",
                        help="bench_w4_distill.py's JSON lines to save")
    parser.add_argument("--render", action="store_true",
                        help="only render the docs from docs/data/w4a8.json (the default "
                             "without --jsonl)")
    parser.add_argument("--no-write", action="store_true", help="print the blocks instead")
    args = parser.parse_args(argv)
    if args.jsonl and not args.render:
        save_rows(args.jsonl)
    if args.knobs and not args.render:
        save_knobs(args.knobs)
    if args.apps and not args.render:
        save_apps(args.apps)
    if args.generalize and not args.render:
        save_generalize(args.generalize)
    if args.distinct and not args.render:
        save_distinct(args.distinct)
    if args.distill and not args.render:
        save_distill(args.distill)
    publish([(os.path.join(REPO, doc), name, text) for (doc, name), text in rendered().items()],
            print_only=args.no_write, root=REPO)


if __name__ == "__main__":
    main()
