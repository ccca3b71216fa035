"""Tier 2, transforms: batch-norm folding, the scaling sets and their plan, ReLU6 edits,
high-bias folding, the equalization report, the stepwise AIMET classes, bias correction and
the layers of training-time folding."""
