"""The input statistics a layer's rounding is chosen on (pure numpy): the second moments of
its im2col patches over calibration positions, in the row layout of :mod:`cle._math.rounding`.

A convolution's output at one position is a dot product of its kernel with the input patch
under it, so the layer's mean squared output error for a kernel error ``e`` is ``eᵀ H e`` with
``H = E[p pᵀ]`` over patches ``p`` (a trailing 1 stands for the bias). :func:`moments` gives
``H`` of the quantized network's inputs and ``G = E[p_q p_fᵀ]`` crossing them with the float
network's, for up to ``max_positions`` output positions drawn at random (the same positions
in both streams). Patches are gathered tap by tap from the channels-last input, never as a
whole im2col array; zero padding follows TensorFlow's ``'same'`` (the extra row or column at
the end).
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["Geometry", "moments"]

#: Rows of patches multiplied at once (float32 products, float64 sums).
CHUNK = 8192


@dataclasses.dataclass(frozen=True)
class Geometry:
    """How a layer reads its input.

    Attributes:
        kind: "conv" (groups allowed), "depthwise" or "dense".
        kernel: spatial kernel size ``(kh, kw)`` (``(1, 1)`` for dense).
        strides, dilation: per spatial axis.
        padding: "same" or "valid".
        groups: input channel groups of a convolution (1 otherwise).
    """

    kind: str
    kernel: tuple = (1, 1)
    strides: tuple = (1, 1)
    dilation: tuple = (1, 1)
    padding: str = "valid"
    groups: int = 1

    def out_size(self, n, axis):
        """``(output size, padding before)`` along spatial ``axis`` for input size ``n``."""
        k, s, d = self.kernel[axis], self.strides[axis], self.dilation[axis]
        keff = (k - 1) * d + 1
        if self.padding == "same":
            out = -(-n // s)
            return out, max((out - 1) * s + keff - n, 0) // 2
        return (n - keff) // s + 1, 0


def _positions(geometry, shape, max_positions, rng):
    """``(image, row, column)`` indices of the output positions used: all of them, or
    ``max_positions`` drawn without replacement (sorted, for memory locality)."""
    n, h, w = shape[:3]
    oh, _ = geometry.out_size(h, 0)
    ow, _ = geometry.out_size(w, 1)
    total = n * oh * ow
    flat = (np.arange(total) if max_positions is None or total <= max_positions
            else np.sort(rng.choice(total, int(max_positions), replace=False)))
    image, rest = np.divmod(flat, oh * ow)
    row, col = np.divmod(rest, ow)
    return image, row, col


def _patches(x, geometry, where):
    """``(P, taps, C)`` float32 patches of the channels-last input ``x`` at positions
    ``where``, taps in the kernel's ``(kh, kw)`` order, zeros where a tap falls in the
    padding."""
    image, row, col = where
    _, h, w, c = x.shape
    _, ph = geometry.out_size(h, 0)
    _, pw = geometry.out_size(w, 1)
    kh, kw = geometry.kernel
    out = np.empty((image.size, kh * kw, c), np.float32)
    for i in range(kh):
        yy = row * geometry.strides[0] + i * geometry.dilation[0] - ph
        for j in range(kw):
            xx = col * geometry.strides[1] + j * geometry.dilation[1] - pw
            valid = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
            tap = x[image, np.clip(yy, 0, h - 1), np.clip(xx, 0, w - 1)]
            if not valid.all():
                tap[~valid] = 0.0
            out[:, i * kw + j] = tap
    return out


def _problems(patches, geometry):
    """The patches as ``(B, P, D)``: one problem for a convolution or dense layer, one per
    group for a grouped convolution, one per channel for a depthwise convolution."""
    p, taps, c = patches.shape
    if geometry.kind == "depthwise":
        return np.ascontiguousarray(patches.transpose(2, 0, 1))  # (C, P, taps)
    g = geometry.groups
    if g == 1:
        return patches.reshape(1, p, taps * c)
    return np.ascontiguousarray(
        patches.reshape(p, taps, g, c // g).transpose(2, 0, 1, 3).reshape(g, p, taps * c // g))


def _second_moment(a, b, bias):
    """``E[ã b̃ᵀ]`` over axis 1 of ``(B, P, D)`` arrays, ``ã = [a, 1]`` with ``bias``."""
    n_b, p, d = a.shape
    out = np.zeros((n_b, d + bias, d + bias))
    for start in range(0, p, CHUNK):
        ca, cb = a[:, start:start + CHUNK], b[:, start:start + CHUNK]
        out[:, :d, :d] += np.matmul(np.swapaxes(ca, 1, 2), cb, dtype=np.float32)
        if bias:
            out[:, :d, d] += ca.sum(axis=1, dtype=np.float64)
            out[:, d, :d] += cb.sum(axis=1, dtype=np.float64)
    if bias:
        out[:, d, d] = p
    return out / max(p, 1)


def moments(x_q, x_f, geometry: Geometry, bias: bool, max_positions=None, seed=0):
    """``(H, G)``, each ``(B, D + bias, D + bias)``: ``H = E[p̃_q p̃_qᵀ]`` over the layer's
    input patches in the quantized stream ``x_q`` and ``G = E[p̃_q p̃_fᵀ]`` crossing them
    with the float stream ``x_f`` (``G is H`` when ``x_f is x_q``), ``p̃ = [p, 1]`` with
    ``bias``. Inputs are channels-last: ``(N, H, W, C)`` for convolutions, ``(..., D)`` for
    dense layers (every leading position is a sample)."""
    rng = np.random.default_rng(seed)
    same = x_f is x_q
    if geometry.kind == "dense":
        d = x_q.shape[-1]
        x_q, x_f = (np.reshape(v, (-1, 1, 1, d)) for v in (x_q, x_f))
    where = _positions(geometry, x_q.shape, max_positions, rng)
    a = _problems(_patches(np.asarray(x_q, np.float32), geometry, where), geometry)
    H = _second_moment(a, a, bias)
    if same:
        return H, H
    b = _problems(_patches(np.asarray(x_f, np.float32), geometry, where), geometry)
    return H, _second_moment(a, b, bias)
