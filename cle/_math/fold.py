"""Pure numpy batch-norm folding math. No Keras import.

All functions compute in float64 and return float64 arrays; callers cast once to the
layer's dtype. A BatchNormalization in inference mode is the per-channel affine map

    BN(y)_c = s_c * y_c + t_c,   s = gamma / sqrt(var + eps),   t = beta - mean * s

(missing gamma means 1, missing beta means 0). Folding it

* after a layer (backward fold):  ``W'[..., o] = W[..., o] * s_o``, ``b' = s * b + t``;
* before a layer (forward fold):  ``W'[..., c, o] = W[..., c, o] * s_c``,
  ``b'_o = b_o + sum_{k, c} W[k, c, o] * t_c`` (exact only without padding).

Kernel layouts are the channels-last Keras ones (see ``cle._core.layouts``): standard kernels are
``(*k, in, out)`` (Dense is ``(in, out)``, transposed convolutions ``(*k, out, in)``),
depthwise kernels are ``(*k, in, mult)`` with output channel ``c * mult + m``.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "bn_affine",
    "fold_bn_after",
    "fold_bn_before",
    "fold_bn_before_separable",
    "scale_axis",
]


def bn_affine(gamma, beta, mean, var, eps):
    """Per-channel ``(s, t)`` with ``BN(y) = s * y + t`` in inference mode.

    Args:
        gamma: scale, shape (C,), or None for ``scale=False``.
        beta: offset, shape (C,), or None for ``center=False``.
        mean: moving mean, shape (C,).
        var: moving variance, shape (C,).
        eps: the BN's epsilon.

    Returns:
        ``(s, t)``, two float64 arrays of shape (C,).
    """
    mean = np.asarray(mean, dtype=np.float64)
    var = np.asarray(var, dtype=np.float64)
    gamma = np.ones_like(mean) if gamma is None else np.asarray(gamma, np.float64)
    beta = np.zeros_like(mean) if beta is None else np.asarray(beta, np.float64)
    s = gamma / np.sqrt(var + float(eps))
    return s, beta - mean * s


def scale_axis(kernel, scale, axis, depthwise=False, dtype=None):
    """Multiply ``kernel`` by ``scale`` along one channel axis.

    Args:
        kernel: array of any rank.
        scale: shape (C,).
        axis: axis of ``kernel`` that ``scale`` indexes.
        depthwise: if True, ``kernel`` is ``(*k, in, mult)`` and ``scale`` indexes the
            output channel ``c * mult + m`` (``axis`` is ignored).

        dtype: the result's dtype (default float64). The product is computed in float64
            either way; another dtype gets it rounded once, without a float64 array of the
            kernel's size in between.

    Returns:
        A new array of ``kernel``'s shape.
    """
    # The product promotes the kernel to float64 exactly, element by element: one pass, no
    # float64 copy of the kernel first; with a narrower dtype, numpy's buffered loop rounds
    # each float64 product into the result.
    kernel = np.asarray(kernel)
    scale = np.asarray(scale, dtype=np.float64)
    out = np.empty(kernel.shape, dtype=np.float64 if dtype is None else dtype)
    if depthwise:
        shape = kernel.shape
        flat = kernel.reshape(shape[:-2] + (shape[-2] * shape[-1],))
        np.multiply(flat, scale, dtype=np.float64, out=out.reshape(flat.shape), casting="unsafe")
        return out
    bshape = [1] * kernel.ndim
    bshape[axis] = scale.shape[0]
    np.multiply(kernel, scale.reshape(bshape), dtype=np.float64, out=out, casting="unsafe")
    return out


def fold_bn_after(kernel, bias, s, t, out_axis=-1, depthwise=False, dtype=None):
    """Fold ``BN(layer(x))`` into the layer: ``W' = W * s`` (output axis), ``b' = s*b + t``.

    Args:
        kernel: the kernel that produces the output channels.
        bias: shape (C,), or None for a layer without bias.
        s, t: the BN's affine map from :func:`bn_affine`.
        out_axis: output-channel axis of ``kernel``.
        depthwise: ``kernel`` is ``(*k, in, mult)`` (output channel ``c * mult + m``).

        dtype: the new kernel's dtype (default float64; see :func:`scale_axis`).

    Returns:
        ``(kernel, bias)``; the bias in float64.
    """
    s = np.asarray(s, dtype=np.float64)
    b = np.zeros_like(s) if bias is None else np.asarray(bias, dtype=np.float64)
    return scale_axis(kernel, s, out_axis, depthwise, dtype), s * b + np.asarray(t, np.float64)


def _constant_response(kernel, t, depthwise):
    """Output of a kernel (no bias) on a constant input that is ``t_c`` on channel c."""
    kernel = np.asarray(kernel, dtype=np.float64)
    t = np.asarray(t, dtype=np.float64)
    taps = kernel.reshape((-1,) + kernel.shape[-2:]).sum(axis=0)  # (in, out|mult)
    if depthwise:
        return (taps * t[:, None]).reshape(-1)
    return t @ taps


def fold_bn_before(kernel, bias, s, t, depthwise=False):
    """Fold ``layer(BN(x))`` into the layer (forward fold).

    Exact only when the layer sees every input position through every tap, i.e. it has
    ``padding="valid"`` (no zero padding would have been normalized), groups=1 and is not a
    transposed convolution; the caller checks that.

    Args:
        kernel: ``(*k, in, out)`` (Dense: ``(in, out)``), or ``(*k, in, mult)`` if
            ``depthwise``.
        bias: shape (out,), or None.
        s, t: the BN's affine map, shape (in,). For Flatten → Dense, pass them repeated over
            the flattened positions.
        depthwise: depthwise kernel layout.

    Returns:
        ``(kernel, bias)`` as float64 arrays.
    """
    new_kernel = scale_axis(kernel, s, -2)
    shift = _constant_response(kernel, t, depthwise)
    b = np.zeros_like(shift) if bias is None else np.asarray(bias, dtype=np.float64)
    return new_kernel, b + shift


def fold_bn_before_separable(depthwise_kernel, pointwise_kernel, bias, s, t):
    """Fold ``SeparableConv(BN(x))``: scale the depthwise input channels, push the shift
    through both kernels into the (single, pointwise) bias.

    Args:
        depthwise_kernel: ``(*k, in, mult)``.
        pointwise_kernel: ``(*1, in * mult, out)``.
        bias: shape (out,), or None.
        s, t: the BN's affine map, shape (in,).

    Returns:
        ``(depthwise_kernel, pointwise_kernel, bias)`` as float64 arrays.
    """
    new_dw = scale_axis(depthwise_kernel, s, -2)
    dw_shift = _constant_response(depthwise_kernel, t, depthwise=True)
    shift = _constant_response(pointwise_kernel, dw_shift, depthwise=False)
    b = np.zeros_like(shift) if bias is None else np.asarray(bias, dtype=np.float64)
    return new_dw, np.asarray(pointwise_kernel, dtype=np.float64), b + shift
