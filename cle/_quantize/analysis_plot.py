"""The picture of :func:`cle.analysis.analyze`: per-layer SQNR along the depth of the network,
weights and activations apart, and each layer's share of the output's error, the worst named."""

from __future__ import annotations

import io
import math

from cle._math.json_numbers import sqnr_words
from cle._quantize.analysis_report import output_figures

__all__ = ["plot", "render"]

MATPLOTLIB_HINT = "pip install matplotlib"
_WEIGHT, _ACTIVATION, _CUMULATIVE, _OUTPUT = "#1f77b4", "#d62728", "0.25", "#2ca02c"


def _finite(values, floor):
    """``values`` with None and +inf drawn at the top of the axis, -inf at ``floor``."""
    out = []
    for v in values:
        if v is None:
            out.append(math.nan)
        elif math.isinf(v):
            out.append(math.nan if v > 0 else floor)
        else:
            out.append(v)
    return out


def _sqnr_panel(ax, report, worst, depth):
    layers = report.layers
    weight = _finite([layer.weight_sqnr_db for layer in layers], 0)
    act = _finite([layer.activation_sqnr_db for layer in layers], 0)
    cum = _finite([layer.sqnr_db for layer in layers], 0)
    ax.plot(depth, cum, color=_CUMULATIVE, linewidth=1.6, zorder=3,
            label="INT8 model: the layer's output, everything before it quantized too")
    ax.scatter(depth, weight, s=22, marker="s", color=_WEIGHT, zorder=4,
               label="its weights alone quantized (on float inputs)")
    ax.scatter(depth, act, s=22, marker="o", color=_ACTIVATION, zorder=4,
               label="its output's range and rounding alone (on float inputs)")
    outputs = report.outputs if len(report.outputs) > 1 else [
        {"output": None, "sqnr_db": report.output["sqnr_db"]}]
    for k, o in enumerate(outputs):  # one dashed line per output
        what = "the model's output" if o["output"] is None else f"output '{o['output']}'"
        ax.axhline(o["sqnr_db"], color=_OUTPUT, linestyle=("--", ":", "-.")[k % 3],
                   linewidth=1.2, label=f"{what}: {sqnr_words(o['sqnr_db'])}")
    for layer in worst:
        ax.axvline(layer.depth, color="0.8", linewidth=5, zorder=0)
    ax.set_ylabel("SQNR against float (dB)\nhigher is better")
    ax.grid(axis="y", linewidth=0.3)
    ax.legend(loc="lower left", fontsize=8, framealpha=0.9)


def _share_panel(ax, report, worst, depth):
    layers = report.layers
    # a layer that makes the output non-finite has no share to draw (the summary names it)
    w = [100 * layer.weight_share if math.isfinite(layer.weight_share) else 0.0
         for layer in layers]
    a = [100 * layer.activation_share if math.isfinite(layer.activation_share) else 0.0
         for layer in layers]
    ax.bar(depth, w, color=_WEIGHT, width=0.8, label="from its weights")
    ax.bar(depth, a, bottom=w, color=_ACTIVATION, width=0.8, label="from its activations")
    top = max([x + y for x, y in zip(w, a)] + [1.0])
    ax.set_ylim(0, top * 1.75)
    by_depth = sorted(worst, key=lambda layer: layer.depth)
    rank = {id(layer): k for k, layer in enumerate(worst, 1)}
    for i, layer in enumerate(by_depth):
        ax.axvline(layer.depth, color="0.85", linewidth=5, zorder=0)
        x_text = (i + 0.5) / len(by_depth) * len(layers) - 0.5
        ax.annotate(f"{rank[id(layer)]}. {layer.name}\n{100 * layer.share:.0f}%",
                    xy=(layer.depth, 100 * layer.share), xytext=(x_text, top * (1.45 - 0.2 * (i % 2))),
                    fontsize=8, ha="center", va="center",
                    bbox={"boxstyle": "round,pad=0.25", "fc": "white", "ec": "0.6", "lw": 0.6},
                    arrowprops={"arrowstyle": "-", "color": "0.5", "lw": 0.7})
    ax.set_ylabel("share of the output's\nerror (%)")
    ax.grid(axis="y", linewidth=0.3)
    ax.legend(loc="center right", fontsize=8)


def _ticks(ax, layers):
    """A layer name every few layers, for orientation."""
    every = max(1, len(layers) // 12)
    picks = list(range(0, len(layers), every))
    ax.set_xticks(picks, [layers[k].name for k in picks], rotation=30, ha="right", fontsize=7)


def plot(report, path, n: int = 5, title: str | None = None, note: str | None = None):
    """Write the analysis picture of ``report`` (an :class:`AnalysisReport`) as a PNG file.

    Top: along the depth of the network, each layer's output SQNR in the INT8 model (a line),
    and with its weights alone or its activations alone quantized (markers); the output's SQNR
    dashed. Bottom: each layer's share of the output's error, split into weights and
    activations, the ``n`` worst named. ``title`` replaces the default title; ``note`` is
    written small in the bottom corner (e.g. the machine the figures come from).

    Returns:
        ``path`` (written atomically).

    Raises:
        ImportError: matplotlib is not installed (with the pip command).
    """
    from cle._core.files import write_bytes_atomic

    write_bytes_atomic(str(path), render(report, n, title, note))
    return path


def render(report, n: int = 5, title: str | None = None, note: str | None = None) -> bytes:
    """The PNG bytes of :func:`plot`."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(f"the analysis picture needs matplotlib: {MATPLOTLIB_HINT}") from exc

    worst = report.worst(n)
    depth = [layer.depth for layer in report.layers]
    fig = Figure(figsize=(12, 7.6))
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    _sqnr_panel(top, report, worst, depth)
    _share_panel(bottom, report, worst, depth)
    bottom.set_xlim(-1, len(depth))
    _ticks(bottom, report.layers)
    t = report.target
    fig.suptitle(title or "Where the INT8 error comes from, layer by layer", fontsize=12)
    figures = (output_figures(report.output, 1) if len(report.outputs) < 2 else
               f"{len(report.outputs)} outputs, lowest SQNR "
               f"{sqnr_words(min(float(o['sqnr_db']) for o in report.outputs))}")
    top.set_title(
        f"INT8 weights {'per-channel' if t['per_channel'] else 'per-tensor'}; output on "
        f"{report.n_check} {report.check_inputs}: {figures}; "
        f"per-layer runs on {report.n_layer_inputs} of them", fontsize=9)
    if note:
        fig.text(0.99, 0.005, note, ha="right", va="bottom", fontsize=7, color="0.4")
    fig.tight_layout(rect=(0, 0.015, 1, 1))
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()
