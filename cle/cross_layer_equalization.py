"""Cross-layer equalization (Nagel et al. 2019): ReLU6 handling, cross-layer scaling,
high-bias folding, and :func:`equalize_model`, which runs the whole pipeline.

Pipeline of :func:`equalize_model`, building the new model once::

    model ─► one graph view ─► plan: BN folds, sets, scales, high-bias shifts, ReLU6 edits
          ─► one rebuild ─► (bias correction, in place on the new model) ─► new model, report

The stepwise API follows Qualcomm AIMET's Keras API (``CrossLayerScaling``, ``ClsSetInfo``,
``HighBiasFold``); its functions work **in place** on the layers they are given, as AIMET's do.
Both run the same weight math (:mod:`cle._transforms.scaling`).
"""

from cle._transforms.equalize import (  # noqa: F401
    BiasAbsorption,
    ClsSetInfo,
    CrossLayerScaling,
    EqualizationReport,
    HighBiasFold,
    NotExactError,
    equalize_model,
    replace_relu6_with_clipped_relu,
    replace_relu6_with_relu,
)

__all__ = [
    "BiasAbsorption",
    "ClsSetInfo",
    "CrossLayerScaling",
    "EqualizationReport",
    "HighBiasFold",
    "NotExactError",
    "equalize_model",
    "replace_relu6_with_clipped_relu",
    "replace_relu6_with_relu",
]
