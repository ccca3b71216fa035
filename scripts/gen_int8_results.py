"""INT8 fidelity of the pipeline's variants on the real pretrained networks: the table in
docs/results.md (blocks ``int8-mobilenet_v2`` and ``int8-efficientnet_lite1``), and the fit of
the data-free activation-range model (``--fit``, block ``int8-range-fit``).

Run it (``make results`` runs every ``scripts/gen_*.py``)::

    .venv/bin/python scripts/gen_int8_results.py                      # everything, writes docs
    .venv/bin/python scripts/gen_int8_results.py --sweep              # only the margin sweep
    .venv/bin/python scripts/gen_int8_results.py --modes              # only ReLU6 x high-bias
    .venv/bin/python scripts/gen_int8_results.py --fit                # only the range-model fit
    .venv/bin/python scripts/gen_int8_results.py --render             # docs from docs/data
    .venv/bin/python scripts/gen_int8_results.py --net mobilenet_v2 --variants 0,2 --no-write

For each variant of the network it measures, against the original float model's logits on
256 evaluation crops (``cle.pretrained.sample_images``, seed 0):

* the variant in float (exact transforms: SQNR above 100 dB);
* weight-only INT8 (``fake_quantize_weights``, activations float), per-tensor and per-channel;
* TFLite full INT8 (``convert_to_tflite_int8`` + ``run_tflite``), per-tensor and per-channel,
  calibrated on 64 *other* crops; the mean over three calibration sets (seeds 1, 2, 3),
  because which way each value happens to round moves a quantized network's SQNR by about
  ±0.2 dB from one calibration set to the next, as much as some of the effects measured.

A variant that targets a quantizer (``per_channel_weights``) is built for the column's
granularity: the per-tensor columns measure the model built for per-tensor weights. A variant
that uses calibration data gets the same crops the converter calibrates on. Top-1 agreement is
the share of crops whose top-1 class equals the float model's (one crop is 0.4 points).

``--fit`` measures, on the first calibration set (64 crops, seed 1), the pre-activation of every
junction whose folded BN the data-free model reads, and compares it with what
the noise model (``junction_from_bn``) predicts from that BN's γ, β (docs/quantization_aware_scaling.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import cle  # noqa: E402
from cle import pretrained as P  # noqa: E402
from cle import quantization as Q  # noqa: E402
from cle._measure import studies  # noqa: E402

NETS = {
    # name: (title, builder, preprocessing, input size)
    "mobilenet_v2": ("MobileNetV2", P.mobilenet_v2_imagenet, P.preprocess_imagenet, 224),
    "efficientnet_lite1": ("EfficientNet-Lite1", P.efficientnet_lite1_imagenet,
                           P.preprocess_efficientnet_lite, P.LITE1_INPUT_SIZE),
}
EVAL_CROPS, CALIB_CROPS, CALIB_SEEDS = 256, 64, (1, 2, 3)

#: (label, build(model, per_channel, calibration) -> model, uses calibration data)
VARIANTS = [
    ("BN folding only", lambda m, pc, xc: cle.fold_all_batch_norms(m)[1], False),
    ("weight-range equalization (AIMET: `objective=\"weights\"`)",
     lambda m, pc, xc: cle.equalize_model(m, objective="weights"), False),
    ("**`equalize_model()`** (defaults)",
     lambda m, pc, xc: cle.equalize_model(m, per_channel_weights=pc), False),
    ("+ `bias_correction=\"analytic\"`",
     lambda m, pc, xc: cle.equalize_model(m, per_channel_weights=pc,
                                          bias_correction="analytic"), False),
    ("`activation_ranges=\"calibration\"`",
     lambda m, pc, xc: cle.equalize_model(m, per_channel_weights=pc,
                                          activation_ranges="calibration",
                                          calibration_data=xc), True),
    ("+ `bias_correction=\"empirical\"`",
     lambda m, pc, xc: cle.equalize_model(m, per_channel_weights=pc,
                                          activation_ranges="calibration",
                                          bias_correction="empirical", calibration_data=xc),
     True),
]


def _predict(model, x):
    return np.asarray(model.predict(x, batch_size=32, verbose=0), dtype=np.float64)


def _scores(ref, y):
    return Q.top1_agreement(ref, y), Q.sqnr_db(ref, y)


def _setup(net):
    """The network, the evaluation crops, the calibration sets and the reference outputs."""
    _, build, prep, size = NETS[net]
    model = build()
    x = prep(P.sample_images(EVAL_CROPS, size=size, seed=0))
    calib = {s: prep(P.sample_images(CALIB_CROPS, size=size, seed=s)) for s in CALIB_SEEDS}
    return model, x, calib, _predict(model, x)


def _tflite(models, x, calib, ref, per_channel):
    """(top-1, SQNR) of TFLite full INT8, the mean over the calibration sets; ``models`` maps a
    calibration seed to the model built with that set (or holds one model for all)."""
    runs = []
    for s in CALIB_SEEDS:
        m = models.get(s, next(iter(models.values())))
        yq = Q.run_tflite(Q.convert_to_tflite_int8(m, calib[s], per_channel=per_channel), x,
                          batch_size=32)
        runs.append(_scores(ref, yq))
    return tuple(float(v) for v in np.mean(runs, axis=0)), runs


def measure(net, wanted=None, log=print):
    """One dict per variant: float SQNR, weight-only and TFLite (top-1, SQNR) per granularity."""
    model, x, calib, ref = _setup(net)
    rows = []
    for i, (label, make, uses_data) in enumerate(VARIANTS):
        if wanted and i not in wanted:
            continue
        t = time.perf_counter()
        row = {"variant": label}
        for pc in (False, True):
            g = "pc" if pc else "pt"
            built = {s: make(model, pc, calib[s]) for s in (CALIB_SEEDS if uses_data else (1,))}
            first = built[CALIB_SEEDS[0]]
            if pc:
                row["float_sqnr"] = Q.sqnr_db(ref, _predict(first, x))
            _, folded = cle.fold_all_batch_norms(first)
            row[f"weights_{g}"] = _scores(
                ref, _predict(Q.fake_quantize_weights(folded, bits=8, per_channel=pc), x))
            row[f"tflite_{g}"], row[f"tflite_{g}_runs"] = _tflite(built, x, calib, ref, pc)
        row["seconds"] = round(time.perf_counter() - t)
        log(json.dumps(row))
        rows.append(row)
    return rows


#: The do-no-harm margin sweep (docs/quantization_aware_scaling.md): label, noise settings.
SWEEP = [
    ("ranges taken as certain, no margin",
     {"RANGE_LOG_SPREAD": 0.0, "RANGE_LOG_BIAS": 0.0, "MIN_GAIN_DB": 0.0}),
    ("uncertain ranges, no margin", {"MIN_GAIN_DB": 0.0}),
    ("margin 0.5", {"MIN_GAIN_DB": 0.5}),
    ("margin 1", {"MIN_GAIN_DB": 1.0}),
    ("**margin 2** (default)", {"MIN_GAIN_DB": 2.0}),
    ("margin 3", {"MIN_GAIN_DB": 3.0}),
]


def sweep(net, log=print):
    """Per-channel TFLite INT8 of ``equalize_model()`` under each :data:`SWEEP` setting."""
    model, x, calib, ref = _setup(net)

    def tflite(m):
        return _tflite({1: m}, x, calib, ref, True)[0]

    rows = [("BN folding only", None, tflite(cle.fold_all_batch_norms(model)[1]))]
    log(json.dumps(rows[-1]))
    for label, settings in SWEEP:
        with studies.noise_settings(settings):
            m, report = cle.equalize_model(model, return_report=True)
        rows.append((label, sum(d.scaled for d in report.scaling), tflite(m)))
        log(json.dumps(rows[-1]))
    return rows


#: The ReLU6 × high-bias table (docs/cross_layer_equalization.md): weight-range equalization
#: (objective "weights", which scales every set, so that the ReLU6 and high-bias options act).
MODES = [(r, h) for r in ("bound", "replace", "keep") for h in ("none", "unpadded", "all")]


def modes(net="mobilenet_v2", log=print):
    """Per ReLU6 mode × high-bias option: float, TFLite per-tensor / per-channel (mean of the
    calibration sets) and weight-only per-tensor, against the original float model."""
    model, x, calib, ref = _setup(net)
    rows = []
    variants = [("no CLE", lambda: cle.fold_all_batch_norms(model)[1])] + [
        (f"{r} / {h}", lambda r=r, h=h: cle.equalize_model(model, objective="weights", relu6=r,
                                                           high_bias_fold=h))
        for r, h in MODES]
    for label, make in variants:
        m = make()
        row = {"variant": label, "float": _scores(ref, _predict(m, x))}
        _, folded = cle.fold_all_batch_norms(m)
        row["weights_pt"] = _scores(
            ref, _predict(Q.fake_quantize_weights(folded, bits=8, per_channel=False), x))
        for pc in (False, True):
            row["tflite_pc" if pc else "tflite_pt"] = _tflite({1: m}, x, calib, ref, pc)[0]
        log(json.dumps(row))
        rows.append(row)
    return rows


def modes_table(rows):
    lines = [
        f"MobileNetV2, `equalize_model(objective=\"weights\", relu6=..., high_bias_fold=...)`, "
        f"{EVAL_CROPS} photo crops, TFLite calibrated on {CALIB_CROPS} other crops (mean of "
        f"{len(CALIB_SEEDS)} calibration sets); top-1 agreement / logit SQNR (dB) against the "
        "original float model; weight-only: INT8 per-tensor weights, float activations.",
        "",
        "| relu6 / high_bias_fold | float | TFLite per-tensor | TFLite per-channel | "
        "weight-only per-tensor |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        top1, sqnr = r["float"]
        fl = f"{top1:.1%} / " + ("∞" if not np.isfinite(sqnr) else f"{sqnr:.1f}")
        lines.append(f"| {r['variant']} | {fl} | {_cell(r['tflite_pt'])} | "
                     f"{_cell(r['tflite_pc'])} | {_cell(r['weights_pt'])} |")
    return "\n".join(lines) + "\n"


#: The range models ``--fit`` compares (label, ``cle._math.noise`` settings): channel ranges taken
#: as certain, and the library's defaults (uncertain per channel).
FIT_MODELS = [
    ("certain", {"RANGE_LOG_SPREAD": 0.0, "RANGE_LOG_BIAS": 0.0}),
    ("default", {}),
]
#: The scales after which ``--fit`` compares per-tensor ranges: each set's choice by
#: ``equalize_model()`` under the range model of that name with no margin (every modelled gain
#: counts; a set it leaves has no "after"), and Nagel's weight equalization of every set.
FIT_SCALES = ("certain", "default", "nagel")
#: The crops the fit measures on: the first calibration set of the tables.
FIT_CROPS, FIT_SEED = CALIB_CROPS, CALIB_SEEDS[0]


def fit(net, log=print):
    """One row per junction of a scaling set whose folded BN the data-free model reads: the
    BN's prediction against the pre-activation measured on :data:`FIT_CROPS` crops, and for
    the capped junctions the per-tensor range of each :data:`FIT_MODELS` model against the
    measured one, before and after each :data:`FIT_SCALES` scaling
    (:func:`cle._measure.studies.junction_study`)."""
    t = time.perf_counter()
    _, build, prep, size = NETS[net]
    model = build()
    x = prep(P.sample_images(FIT_CROPS, size=size, seed=FIT_SEED))
    rows = _rounded(studies.junction_study(model, x, FIT_SCALES, FIT_MODELS))
    log(json.dumps({"net": net, "junctions": len(rows),
                    "capped": sum("ranges" in r for r in rows),
                    "seconds": round(time.perf_counter() - t, 1)}))
    return rows


def _rounded(v, digits=6):
    """``v`` with every float rounded to ``digits`` significant digits (the saved rows)."""
    if isinstance(v, float):
        return float(f"{v:.{digits}g}")
    if isinstance(v, dict):
        return {k: _rounded(x, digits) for k, x in v.items()}
    if isinstance(v, list):
        return [_rounded(x, digits) for x in v]
    return v


def _fit_meta():
    """What the fit's rows depend on besides the networks (saved with them)."""
    return {"crops": FIT_CROPS, "seed": FIT_SEED,
            "calibration_samples": studies.noise_constant("ASSUMED_CALIBRATION_SAMPLES"),
            "models": {label: {k: settings.get(k, studies.noise_constant(k)) for k in
                               ("RANGE_LOG_SPREAD", "RANGE_LOG_BIAS", "RANGE_DRAWS")}
                       for label, settings in FIT_MODELS}}


def _spread(values, digits=2):
    """``median (middle half; all)`` of some values."""
    v = np.asarray(values, dtype=np.float64)
    q = [f"{x:.{digits}f}".replace("-", "−") for x in np.percentile(v, [50, 25, 75, 0, 100])]
    return f"{q[0]} ({q[1]} to {q[2]}; {q[3]} to {q[4]})"


def _log_error(rows, model, scales):
    """``bias / rms (junctions)`` of ln(predicted / measured) per-tensor range."""
    e = np.array([np.log(r["ranges"][model][scales] / r["ranges"]["measured"][scales])
                  for r in rows if scales in r["ranges"]["measured"]])
    if not e.size:
        return "–"
    return f"{e.mean():+.2f} / {np.sqrt(np.mean(e ** 2)):.2f} ({e.size})".replace("-", "−")


def fit_table(data):
    """The ``int8-range-fit`` block from the saved fit (``{"meta": ..., "nets": {...}}``)."""
    meta, results = data["meta"], data["nets"]
    nets = [n for n in NETS if n in results]
    title = [NETS[n][0] for n in nets]

    def row(label, cell):
        return f"| {label} | " + " | ".join(cell(results[n]) for n in nets) + " |"

    def by(rows, producer):
        return [r for r in rows if r["producer"] == producer]

    lines = [
        f"Every folded BN before a junction of a scaling set, against its pre-activation measured "
        f"on {meta['crops']} photo crops (seed {meta['seed']}); per BN one value, then the median "
        "over the BNs (middle half; all). The model's maxima are those of spatial positions × "
        f"{meta['calibration_samples']} values (`ASSUMED_CALIBRATION_SAMPLES`), as the library "
        "computes them; the top of a channel is `(max − β_i)/|γ_i|`, compared with the Laplace "
        "tail's `z` in log.",
        "",
        "| | " + " | ".join(title) + " |",
        "|---|" + "---|" * len(nets),
        row("BNs before a junction (at a ReLU6)",
            lambda rows: f"{len(rows)} ({sum('ranges' in r for r in rows)})"),
        row("data std / γ (median over channels)",
            lambda rows: _spread([r["std_over_gamma"] for r in rows])),
        row("data mean / β (least-squares slope over channels; BNs with Σβ² < Σγ²/100 left "
            "out)",
            lambda rows: _spread([r["mean_over_beta"] for r in rows
                                  if r["mean_over_beta"] is not None])
            + f", {sum(r['mean_over_beta'] is not None for r in rows)} BNs"),
        row("measured per-tensor max / the normal model's",
            lambda rows: _spread([r["max_measured"] / r["max_normal"] for r in rows])),
        row("Laplace tail's per-tensor max / measured",
            lambda rows: _spread([r["max_laplace"] / r["max_measured"] for r in rows])),
    ]
    for producer, what in (("conv", "convolution"), ("depthwise", "depthwise")):
        lines.append(row(f"per-channel log scatter of the top ({what} outputs)",
                         lambda rows, p=producer: _spread([r["log_scatter"] for r in by(rows, p)])
                         + f", {len(by(rows, p))} BNs"))
        lines.append(row(f"per-channel log offset of the top ({what} outputs)",
                         lambda rows, p=producer: _spread([r["log_offset"] for r in by(rows, p)])))
    models = meta["models"]
    lines += [
        "",
        "Per-tensor range of each junction at a ReLU6 (the max over channels of the capped "
        "activation divided by the scales: what the converter calibrates), predicted from the "
        "BN against measured: mean of ln(predicted / measured) (log bias) / rms (junctions). "
        "Range models: *certain*, spread {0} and bias {1}; *default*, the library's, spread {2} "
        "and bias {3} over {4} draws. Scales: each set's choice by `equalize_model()` under that "
        "range model with no margin (`MIN_GAIN_DB = 0`; only the junctions of the sets it "
        "scales), and Nagel's weight equalization of every set (`objective=\"weights\"`)."
        .format(*[f"{v:g}".replace("-", "−") for v in (
            models["certain"]["RANGE_LOG_SPREAD"], models["certain"]["RANGE_LOG_BIAS"],
            models["default"]["RANGE_LOG_SPREAD"], models["default"]["RANGE_LOG_BIAS"])],
            models["default"]["RANGE_DRAWS"]),
        "",
        "| range model | before scaling | after the certain model's scales | after the default "
        "model's scales | after Nagel's scales |",
        "|---|---|---|---|---|",
    ]
    pooled = [r for n in nets for r in results[n] if "ranges" in r]
    groups = [(t, [r for r in results[n] if "ranges" in r]) for t, n in zip(title, nets)]
    if len(nets) > 1:
        groups.append(("both networks", pooled))
    for name, rows in groups:
        for model, _ in FIT_MODELS:
            label = f"{model}, {name}"
            if model == "default" and name == groups[-1][0]:
                label = f"**{label}**"
            lines.append(f"| {label} | " + " | ".join(
                _log_error(rows, model, s) for s in ("before",) + FIT_SCALES) + " |")
    return "\n".join(lines) + "\n"


def sweep_table(results):
    nets = list(results)
    lines = [
        "`equalize_model()` on the real networks, TFLite full INT8 with per-channel weights, "
        f"{EVAL_CROPS} crops, mean of {len(CALIB_SEEDS)} calibration sets: sets scaled, top-1 "
        "agreement / logit SQNR (dB) against the float model.",
        "",
        "| setting | " + " | ".join(NETS[n][0] for n in nets) + " |",
        "|---|" + "---|" * len(nets),
    ]
    for i, (label, _, _) in enumerate(results[nets[0]]):
        cells = []
        for n in nets:
            _, scaled, pair = results[n][i]
            cells.append(("" if scaled is None else f"{scaled} set{'s' if scaled != 1 else ''}, ")
                         + _cell(pair))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def calibration_spread(results):
    """One line: how far a single calibration set's TFLite SQNR lies from the mean of the
    three, over every TFLite cell of the results tables (why each figure is a mean)."""
    dev = [abs(run[1] - row[key][1]) for rows in results.values() for row in rows
           for key in ("tflite_pt", "tflite_pc") for run in row.get(key + "_runs", ())]
    if not dev:
        return ""
    return ("\nOne calibration set against the mean of the "
            f"{len(CALIB_SEEDS)} (same model, other photos), over every TFLite cell of "
            f"docs/results.md: median {float(np.median(dev)):.2f} dB, largest "
            f"{max(dev):.2f} dB.\n")


def _cell(pair):
    top1, sqnr = pair
    return f"{top1:.1%} / {sqnr:.2f}"


def table(net, rows):
    title = NETS[net][0]
    lines = [
        f"{title}: {EVAL_CROPS} photo crops; TFLite calibrated on {CALIB_CROPS} other crops, "
        f"mean of {len(CALIB_SEEDS)} calibration sets; top-1 agreement / logit SQNR (dB) "
        "against the original float model.",
        "",
        "| variant | float SQNR | weight-only INT8 per-tensor | weight-only per-channel | "
        "TFLite INT8 per-tensor | TFLite INT8 per-channel |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        f = r["float_sqnr"]
        lines.append(
            f"| {r['variant']} | {'∞' if not np.isfinite(f) else f'{f:.1f}'} | "
            f"{_cell(r['weights_pt'])} | {_cell(r['weights_pc'])} | "
            f"{_cell(r['tflite_pt'])} | {_cell(r['tflite_pc'])} |")
    return "\n".join(lines) + "\n"


#: Where the measured rows are kept, so that the docs can be rendered again without measuring.
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "data")


def _save(name, rows):
    os.makedirs(DATA, exist_ok=True)
    with open(os.path.join(DATA, f"{name}.json"), "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=1)
        f.write("\n")


def _load(name):
    with open(os.path.join(DATA, f"{name}.json"), encoding="utf-8") as f:
        return json.load(f)


#: README summary: (label, variant index, column).
SUMMARY = [
    ("BN folding only", 0, "tflite_pc"),
    ("`equalize_model()` (defaults)", 2, "tflite_pc"),
    ("weight-range equalization (AIMET's behaviour)", 1, "tflite_pc"),
    ("`equalize_model(per_channel_weights=False, bias_correction=\"analytic\")`, per-tensor "
     "INT8", 3, "tflite_pt"),
]


def summary(results):
    nets = [n for n in NETS if n in results]
    lines = [
        f"TFLite full INT8 ({EVAL_CROPS} real photo crops, mean of {len(CALIB_SEEDS)} "
        "calibration sets), top-1 agreement / logit SQNR (dB) against the original float "
        "model; per-channel weights (TFLite's default) unless stated:",
        "",
        "| | " + " | ".join(NETS[n][0] for n in nets) + " |",
        "|---|" + "---|" * len(nets),
    ]
    for label, index, column in SUMMARY:
        lines.append(f"| {label} | " + " | ".join(_cell(results[n][index][column])
                                                  for n in nets) + " |")
    return "\n".join(lines) + "\n"


def rendered():
    """``{(doc path relative to the repo, block name): text}`` from the saved rows."""
    out, results = {}, {}
    for net in NETS:
        try:
            results[net] = _load(f"int8_{net}")
        except FileNotFoundError:
            continue
        out[("docs/results.md", f"int8-{net}")] = table(net, results[net])
    if len(results) == len(NETS) and all(len(r) == len(VARIANTS) for r in results.values()):
        out[("README.md", "int8-summary")] = summary(results)
    try:
        margins = {net: _load(f"int8_margins_{net}") for net in NETS}
    except FileNotFoundError:
        return out
    out[("docs/quantization_aware_scaling.md", "int8-margins")] = (
        sweep_table(margins) + calibration_spread(results))
    try:
        out[("docs/cross_layer_equalization.md", "int8-modes")] = modes_table(
            _load("int8_modes_mobilenet_v2"))
    except FileNotFoundError:
        pass
    try:
        out[("docs/quantization_aware_scaling.md", "int8-range-fit")] = fit_table(
            _load("int8_range_fit"))
    except FileNotFoundError:
        pass
    return out


def render(here):
    """Write every block from the saved rows."""
    from _docblocks import replace_block

    for (doc, name), text in rendered().items():
        replace_block(os.path.join(here, "..", doc), name, text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--net", choices=sorted(NETS), action="append")
    ap.add_argument("--variants", default="", help="comma-separated indices (default: all)")
    ap.add_argument("--sweep", action="store_true",
                    help="only the do-no-harm margin sweep (docs/quantization_aware_scaling.md)")
    ap.add_argument("--modes", action="store_true",
                    help="only the ReLU6 x high-bias table (docs/cross_layer_equalization.md)")
    ap.add_argument("--fit", action="store_true",
                    help="only the fit of the data-free range model "
                         "(docs/quantization_aware_scaling.md)")
    ap.add_argument("--render", action="store_true",
                    help="measure nothing: write the docs from the rows saved in docs/data")
    ap.add_argument("--no-write", action="store_true", help="print, do not write the docs")
    args = ap.parse_args(argv)
    wanted = {int(v) for v in args.variants.split(",") if v}
    nets = args.net or list(NETS)
    write = not args.no_write and not wanted
    here = os.path.dirname(os.path.abspath(__file__))
    if args.modes:
        rows = modes()
        print(modes_table(rows))
        if write:
            _save("int8_modes_mobilenet_v2", rows)
    elif args.fit:
        _run_fit(nets, write)
    elif not args.render:
        if not args.sweep:
            for net in nets:
                rows = measure(net, wanted)
                print(table(net, rows))
                if write:
                    _save(f"int8_{net}", rows)
        if not (args.sweep or args.net or wanted):
            rows = modes()
            print(modes_table(rows))
            if write:
                _save("int8_modes_mobilenet_v2", rows)
        if args.sweep or not (args.net or wanted):
            for net in nets:
                rows = sweep(net)
                print(sweep_table({net: rows}))
                if write:
                    _save(f"int8_margins_{net}", rows)
        if not (args.sweep or args.net or wanted):
            _run_fit(nets, write)
    if write:
        render(here)


def _run_fit(nets, write):
    """Fit on ``nets``; the saved fit keeps the other networks' rows if they were measured
    the same way."""
    try:
        data = _load("int8_range_fit")
    except FileNotFoundError:
        data = None
    if data is None or data["meta"] != _fit_meta():
        data = {"meta": _fit_meta(), "nets": {}}
    data["nets"].update({net: fit(net) for net in nets})
    data["nets"] = {n: data["nets"][n] for n in NETS if n in data["nets"]}
    print(fit_table(data))
    if write:
        _save("int8_range_fit", data)


if __name__ == "__main__":
    main()
