"""Symmetric uniform fake quantization of one kernel (pure numpy, float64), re-exported by
:mod:`cle.quantization`."""

from __future__ import annotations

import numpy as np

from cle._math.checks import check_bits, check_bool
from cle._math.rounding import keep_tap_sums


def quantize_kernel(kernel, bits=8, axis=None, depthwise=False) -> np.ndarray:
    """Symmetric uniform fake quantization of one kernel (pure numpy, float64).

    ``scale = max|W| / (2^(bits-1) - 1)`` over the whole tensor (``axis=None``) or over each
    output channel, and ``q = clip(round(W / scale), -(2^(bits-1) - 1), 2^(bits-1) - 1) * scale``.
    The grid is symmetric (the most negative integer ``-2^(bits-1)`` is not used, as in TF
    Lite's INT8 weights) and has no zero point. A channel (or tensor) whose values are all zero
    has scale 0 and stays zero. Rounding is to nearest, ties to even.

    Args:
        kernel: array-like of real numbers.
        bits: bit width, 2 to 32.
        axis: None for one scale per tensor, else the output-channel axis (one scale per
            index along it).
        depthwise: the kernel is a depthwise kernel ``(*k, in, mult)`` whose output channel
            ``c * mult + m`` spans the last two axes; with ``axis`` given (it must then be the
            last axis, ``-1``, as in :func:`cle._core.layouts.layout_of`) each ``(c, m)`` pair gets
            its own scale. Ignored when ``axis`` is None.

    Returns:
        A new float64 array of the kernel's shape holding the quantized values.

    Raises:
        ValueError: ``bits`` out of range, ``axis`` not an axis of the kernel (or not its last
            axis for a depthwise kernel), or the kernel has non-finite values.

    Example:
        >>> w = np.array([[1.0, 0.02], [-0.3, 0.01]])
        >>> quantize_kernel(w, bits=4)  # one scale, 1/7: the small column is lost
        array([[ 1.        ,  0.        ],
               [-0.28571429,  0.        ]])
        >>> quantize_kernel(w, bits=4, axis=-1)  # scales 1/7 and 0.02/7
        array([[ 1.        ,  0.02      ],
               [-0.28571429,  0.01142857]])
    """
    bits = check_bits(bits)
    depthwise = check_bool(depthwise, "depthwise")
    w = np.array(kernel, dtype=np.float64)  # a copy: the input is never modified
    if not np.isfinite(w).all():
        raise ValueError(
            f"`kernel` must be finite. Received: kernel with {int((~np.isfinite(w)).sum())} "
            "non-finite values"
        )
    qmax = float(2 ** (bits - 1) - 1)
    if axis is not None:
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not (
            -w.ndim <= axis < w.ndim
        ):
            raise ValueError(
                f"`axis` must be None or an axis of the {w.ndim}-D kernel. Received: axis={axis!r}"
            )
        axis = int(axis) % w.ndim
        if depthwise and (w.ndim < 2 or axis != w.ndim - 1):
            raise ValueError(
                "A depthwise kernel (*k, in, mult) is quantized per output channel with its last "
                f"axis (-1). Received: axis={axis} for a kernel of shape {w.shape}"
            )
    if w.size == 0:
        return w
    scale = _scale(w, qmax, axis, depthwise)
    safe = np.where(scale > 0, scale, 1.0)  # zero-range channels: W == 0 there, so q == 0
    return np.clip(np.round(w / safe), -qmax, qmax) * scale


def _scale(w, qmax, axis, depthwise):
    """The step of :func:`quantize_kernel`'s grid, broadcastable against ``w``."""
    a = np.abs(w)
    if axis is None:
        ranges = np.array(a.max())
    elif depthwise:
        ranges = a.reshape((-1,) + w.shape[-2:]).max(axis=0)  # (in, mult): one per c*mult+m
    else:
        ranges = a.max(axis=tuple(i for i in range(w.ndim) if i != axis), keepdims=True)
    return ranges / qmax


def round_kernel(kernel, bits=8, axis=None, depthwise=False, rounding="nearest"):
    """:func:`quantize_kernel` with a choice of rounding onto the same grid.

    ``rounding``: "nearest" (:func:`quantize_kernel` itself, what TF Lite's converter does)
    or "tapsum": to nearest, then the fewest weights of each (input, output) channel pair
    moved one step so that the pair's sum over the kernel's taps, its response to a constant
    input, stays within half a step of the float sum
    (:func:`cle._math.rounding.keep_tap_sums`). The taps are every axis but the last two; a
    kernel with one tap (Dense, 1×1 convolutions) is rounded to nearest either way.
    """
    if rounding not in ("nearest", "tapsum"):
        raise ValueError("`rounding` must be 'nearest' or 'tapsum'. Received: "
                         f"rounding={rounding!r}")
    near = quantize_kernel(kernel, bits, axis, depthwise)
    if rounding == "nearest" or near.ndim < 3 or near.size == 0 or (
            int(np.prod(near.shape[:-2])) == 1):
        return near
    w = np.asarray(kernel, dtype=np.float64)
    qmax = float(2 ** (int(bits) - 1) - 1)
    scale = np.broadcast_to(_scale(w, qmax, None if axis is None else int(axis) % w.ndim,
                                   depthwise), w.shape)
    safe = np.where(scale > 0, scale, 1.0)
    columns = (-1, w.shape[-2] * w.shape[-1])
    z = (w / safe).reshape(columns)
    q = keep_tap_sums(z, np.clip(np.round(z), -qmax, qmax), qmax)
    return q.reshape(w.shape) * scale
