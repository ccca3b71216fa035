"""keras-cle: prepare Keras 3 convolutional networks for INT8 post-training quantization
without data (Nagel et al. 2019, "Data-Free Quantization through Weight Equalization and
Bias Correction").

Stage one, batch-norm folding::

    import cle
    folded_pairs, folded_model = cle.fold_all_batch_norms(model)
    for skip in folded_pairs.skipped:
        print(skip.bn.name, skip.reason)
"""

from cle.batch_norm_fold import (
    BatchNormFoldReport,
    FoldedPair,
    FoldedPairs,
    SkippedBatchNorm,
    find_foldable_batch_norms,
    fold_all_batch_norms,
    fold_given_batch_norms,
)

from cle.bias_correction import (
    BiasCorrectionRecord,
    bn_stats_from_folded_pairs,
    bn_stats_from_report,
    correct_bias,
)
from cle.cross_layer_equalization import (
    BiasAbsorption,
    ClsSetInfo,
    CrossLayerScaling,
    EqualizationReport,
    HighBiasFold,
    equalize_model,
    replace_relu6_with_clipped_relu,
    replace_relu6_with_relu,
)
from cle.layers import ClippedReLU
from cle.training_fold import (
    FakeQuant,
    FoldedConv1D,
    FoldedConv2D,
    FoldedDense,
    FoldedDepthwiseConv1D,
    FoldedDepthwiseConv2D,
    export_folded,
    fuse_for_training,
)

__version__ = "0.1.0.dev0"

__all__ = [
    "BatchNormFoldReport",
    "BiasAbsorption",
    "BiasCorrectionRecord",
    "bn_stats_from_folded_pairs",
    "bn_stats_from_report",
    "correct_bias",
    "ClippedReLU",
    "ClsSetInfo",
    "CrossLayerScaling",
    "EqualizationReport",
    "FakeQuant",
    "FoldedConv1D",
    "FoldedConv2D",
    "FoldedDense",
    "FoldedDepthwiseConv1D",
    "FoldedDepthwiseConv2D",
    "export_folded",
    "fuse_for_training",
    "HighBiasFold",
    "equalize_model",
    "replace_relu6_with_clipped_relu",
    "replace_relu6_with_relu",
    "FoldedPair",
    "FoldedPairs",
    "SkippedBatchNorm",
    "find_foldable_batch_norms",
    "fold_all_batch_norms",
    "fold_given_batch_norms",
]
