"""Write the documentation site's figures (PNG, matplotlib) from measurements, never by hand.

- ``docs/img/int8_quality.png``: the INT8 quality table as a chart, from the rows that
  ``scripts/gen_int8_results.py`` saved in ``docs/data/int8_<net>.json`` (TFLite full INT8,
  top-1 agreement and logit SQNR against the float model, per-channel and per-tensor weights).
- ``docs/img/layer_ranges_mobilenet_v2.png``: per-layer weight-range spread (largest / median
  output-channel range, :func:`cle.quantization.weight_range_spread`) of the real ImageNet
  MobileNetV2 after BN folding, after ``equalize_model()`` (defaults) and after weight-range
  equalization (``objective="weights"``, AIMET's behaviour), from
  ``docs/data/layer_ranges_mobilenet_v2.json``.

Run::

    .venv/bin/python scripts/gen_doc_figures.py            # measure the ranges (real
                                                            # MobileNetV2, seconds), then draw
    .venv/bin/python scripts/gen_doc_figures.py --render   # draw from docs/data only

The third picture on the site, ``docs/cle_demo_ranges.png``, is drawn by ``cle demo``
(``scripts/gen_demo_results.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "docs", "data")
IMG = os.path.join(REPO, "docs", "img")
NETS = {"mobilenet_v2": "MobileNetV2", "efficientnet_lite1": "EfficientNet-Lite1"}
RANGES_JSON = "layer_ranges_mobilenet_v2.json"
#: (key in the saved ranges, legend label)
RANGE_VARIANTS = [
    ("folded", "BN folding only"),
    ("equalized", "equalize_model() (defaults)"),
    ("weights", 'equalize_model(objective="weights") (AIMET\'s behaviour)'),
]


def _plain(label: str) -> str:
    """A table label without Markdown emphasis and code marks."""
    return label.replace("**", "").replace("`", "")


def _figure(width, height):
    # The Agg canvas on a bare Figure: no pyplot state, no display needed.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def int8_chart(data_dir=DATA, out=os.path.join(IMG, "int8_quality.png")) -> str:
    """Draw the INT8 quality chart from ``int8_<net>.json``; return the PNG path."""
    rows = {}
    for net in NETS:
        with open(os.path.join(data_dir, f"int8_{net}.json"), encoding="utf-8") as f:
            rows[net] = json.load(f)
    fig = _figure(12, 1.2 + 0.55 * max(len(r) for r in rows.values()) * len(NETS))
    axes = fig.subplots(len(NETS), 2, squeeze=False)
    for i, (net, title) in enumerate(NETS.items()):
        labels = [_plain(r["variant"]) for r in rows[net]]
        ys = range(len(labels))
        for j, (metric, what) in enumerate(((0, "top-1 agreement"), (1, "logit SQNR (dB)"))):
            ax = axes[i][j]
            h = 0.38
            ax.barh([y - h / 2 for y in ys], [r["tflite_pc"][metric] for r in rows[net]], h,
                    label="per-channel weights", color="#1f77b4")
            ax.barh([y + h / 2 for y in ys], [r["tflite_pt"][metric] for r in rows[net]], h,
                    label="per-tensor weights", color="#ff7f0e")
            ax.set_yticks(list(ys))
            ax.set_yticklabels(labels if j == 0 else [""] * len(labels), fontsize=8)
            ax.invert_yaxis()
            ax.set_title(f"{title}: {what}", fontsize=10)
            ax.grid(axis="x", alpha=0.3)
            if metric == 0:
                ax.set_xlim(0, 1)
            if i == 0 and j == 1:
                ax.legend(fontsize=8, loc="lower right")
    fig.suptitle("TFLite full INT8 against the float model (docs/data/int8_*.json)",
                 fontsize=11)
    fig.tight_layout()
    os.makedirs(os.path.dirname(out), exist_ok=True)
    fig.savefig(out, dpi=100)
    return out


def measure_ranges(out=os.path.join(DATA, RANGES_JSON)) -> str:
    """Per-layer weight-range spread of the real MobileNetV2 for :data:`RANGE_VARIANTS`."""
    import cle
    from cle import pretrained
    from cle.quantization import weight_range_spread

    model = pretrained.mobilenet_v2_imagenet()
    models = {
        "folded": cle.fold_all_batch_norms(model)[1],
        "equalized": cle.equalize_model(model),
        "weights": cle.equalize_model(model, objective="weights"),
    }
    saved = {key: {name: round(v, 4) for name, v in weight_range_spread(m).items()}
             for key, m in models.items()}
    with open(out, "w", encoding="utf-8") as f:
        json.dump(saved, f, indent=1)
    return out


def ranges_chart(data_dir=DATA, out=os.path.join(IMG, "layer_ranges_mobilenet_v2.png")) -> str:
    """Draw the per-layer range-spread chart from :data:`RANGES_JSON`; return the PNG path."""
    with open(os.path.join(data_dir, RANGES_JSON), encoding="utf-8") as f:
        saved = json.load(f)
    names = list(saved["folded"])
    fig = _figure(12, 4.5)
    ax = fig.subplots()
    for (key, label), marker in zip(RANGE_VARIANTS, "osx"):
        ax.plot(range(len(names)), [saved[key][n] for n in names], marker=marker,
                markersize=4, linewidth=1, label=label)
    ax.set_ylim(bottom=1)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=90, fontsize=6)
    ax.set_ylabel("largest / median channel range")
    ax.set_title("Real ImageNet MobileNetV2: weight-range spread per layer "
                 "(lower is easier for per-tensor INT8)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    os.makedirs(os.path.dirname(out), exist_ok=True)
    fig.savefig(out, dpi=100)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--render", action="store_true",
                        help="draw from docs/data only (no measurement)")
    args = parser.parse_args(argv)
    if not args.render:
        print(f"measured {os.path.relpath(measure_ranges(), REPO)}")
    for path in (int8_chart(), ranges_chart()):
        print(f"wrote {os.path.relpath(path, REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
