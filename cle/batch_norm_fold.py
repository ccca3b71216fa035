"""Batch-norm folding: stage one of the data-free quantization pipeline.

Before / after (backward fold, BN after the layer)::

    x ─► Conv(W, b) ─► BN(γ, β, μ, σ²) ─► y        x ─► Conv(W·s, s·b + t) ─► y

Before / after (forward fold, BN before the layer)::

    x ─► BN ─► Conv(W, b, padding="valid") ─► y     x ─► Conv(W·s_in, b + Σ W·t) ─► y

with ``s = γ / sqrt(σ² + ε)`` and ``t = β − μ·s`` (see :mod:`cle._math.fold`).

Conditions, checked before anything is rewritten (each failed check is a skip with a reason):

* the BN is called exactly once, in inference mode, normalizes the layer's channel axis and
  has finite statistics with ``σ² + ε > 0``;
* backward: the BN's input comes from a Conv/Depthwise/Separable/Transpose/Dense layer of
  exactly that class, called once, with a linear activation, whose output feeds only the BN
  (or from a BN already folded backward into such a layer, which feeds only this BN);
* forward (tried when backward is not possible): the BN's output feeds only a Conv,
  DepthwiseConv, SeparableConv or Dense layer (or a Flatten feeding only a Dense), called once,
  with ``padding="valid"`` and ``groups=1`` — with padding, the zeros the layer adds would
  not have been normalized, so the fold would not be exact.

Skip reasons are returned (``folded_pairs.skipped``, :func:`find_foldable_batch_norms`) and
logged at INFO level on the logger ``"cle.batch_norm_fold"``.
"""

from cle._transforms.bn_fold import (  # noqa: F401
    BatchNormFoldReport,
    FoldedPair,
    FoldedPairs,
    SkippedBatchNorm,
    find_foldable_batch_norms,
    fold_all_batch_norms,
    fold_given_batch_norms,
)

__all__ = [
    "BatchNormFoldReport",
    "FoldedPair",
    "FoldedPairs",
    "SkippedBatchNorm",
    "find_foldable_batch_norms",
    "fold_all_batch_norms",
    "fold_given_batch_norms",
]
