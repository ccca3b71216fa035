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

A layer of many inputs per output (a Dense on a flattened map: 61,952 inputs make ``H`` a
30 GB matrix) is rounded on ``H``'s diagonal blocks instead (:func:`column_blocks`;
:func:`moments` with ``columns``): each block's moments gather only the block's columns of the
patches, :data:`CHUNK` positions at a time, so their memory is bounded by the block's size
whatever the layer's.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["Geometry", "column_blocks", "moments", "numpy_gram"]

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


def _tap(x, geometry, where, t, channels=slice(None)):
    """Tap ``t`` (in the kernel's ``(kh, kw)`` order) of the patches of the channels-last
    input ``x`` at positions ``where``, its ``channels`` only: a ``(P, C)`` float32 array,
    zeros where the tap falls in the padding."""
    image, row, col = where
    _, h, w, _ = x.shape
    _, ph = geometry.out_size(h, 0)
    _, pw = geometry.out_size(w, 1)
    i, j = divmod(t, geometry.kernel[1])
    yy = row * geometry.strides[0] + i * geometry.dilation[0] - ph
    xx = col * geometry.strides[1] + j * geometry.dilation[1] - pw
    valid = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
    tap = x[image, np.clip(yy, 0, h - 1), np.clip(xx, 0, w - 1), channels]
    if not valid.all():
        tap[~valid] = 0.0
    return tap


def _taps(x, geometry, where):
    """Each tap of the patches of the channels-last input ``x`` at positions ``where``, in
    the kernel's ``(kh, kw)`` order: ``(P, C)`` float32 arrays (:func:`_tap`)."""
    kh, kw = geometry.kernel
    for t in range(kh * kw):
        yield _tap(x, geometry, where, t)


def _problems(x, geometry, where):
    """The patches as one matrix per problem: ``[(P, D)]`` for a convolution (one per group)
    or a dense layer; ``(C, taps, P)`` for a depthwise convolution (one problem per channel,
    positions along the last axis, which keeps each product's rows contiguous)."""
    n = where[0].size
    kh, kw = geometry.kernel
    c = x.shape[-1]
    if geometry.kind == "depthwise":
        out = np.empty((c, kh * kw, n), np.float32)
        for t, tap in enumerate(_taps(x, geometry, where)):
            out[:, t, :] = np.ascontiguousarray(tap.T)  # (a strided .T write is slow)
        return out
    out = np.empty((n, kh * kw, c), np.float32)
    for t, tap in enumerate(_taps(x, geometry, where)):
        out[:, t, :] = tap
    g = geometry.groups
    if g == 1:
        return [out.reshape(n, -1)]
    out = out.reshape(n, kh * kw, g, c // g)
    return [np.ascontiguousarray(out[:, :, k, :]).reshape(n, -1) for k in range(g)]


def column_blocks(n, limit):
    """``[(start, stop)]``: ``n`` columns in contiguous blocks of at most ``limit``, as few as
    that allows and of sizes differing by at most one (a single block when ``n <= limit``)."""
    k = max(1, -(-int(n) // int(limit)))
    edges = [i * n // k for i in range(k + 1)]
    return list(zip(edges[:-1], edges[1:]))


def _block_problems(x, geometry, where, columns):
    """:func:`_problems`' matrices of a convolution or dense layer, columns ``[start, stop)``
    of each problem only: ``[(P, stop − start)]``, one per group, gathered tap by tap (a
    patch's column ``t · C/groups + c`` is tap ``t``'s channel ``c`` of the group)."""
    start, stop = columns
    g = geometry.groups
    cg = x.shape[-1] // g
    n = where[0].size
    out = []
    for k in range(g):
        block = np.empty((n, stop - start), np.float32)
        for t in range(start // cg, -(-stop // cg)):
            lo, hi = max(start - t * cg, 0), min(stop - t * cg, cg)
            block[:, t * cg + lo - start:t * cg + hi - start] = _tap(
                x, geometry, where, t, slice(k * cg + lo, k * cg + hi))
        out.append(block)
    return out


def _block_moments(x_q, x_f, geometry, where, columns, bias, gram):
    """:func:`moments` of the patch columns ``columns`` only, the positions ``where`` taken
    :data:`CHUNK` at a time (float64 sums of ``gram``'s products): no array holds more than
    a chunk of positions or a block's square."""
    same = x_f is x_q
    n = where[0].size
    prod_h = prod_g = sum_q = sum_f = 0.0
    for start in range(0, max(n, 1), CHUNK):
        at = tuple(v[start:start + CHUNK] for v in where)
        a = _block_problems(x_q, geometry, at, columns)
        b = a if same else _block_problems(x_f, geometry, at, columns)
        prod_h = prod_h + np.stack([np.asarray(gram(ak, ak), np.float64) for ak in a])
        sum_q = sum_q + np.stack([ak.sum(axis=0, dtype=np.float64) for ak in a])
        if not same:
            prod_g = prod_g + np.stack([np.asarray(gram(ak, bk), np.float64)
                                        for ak, bk in zip(a, b)])
            sum_f = sum_f + np.stack([bk.sum(axis=0, dtype=np.float64) for bk in b])
        del a, b
    H = _augmented(prod_h, sum_q, sum_q, n, bias)
    del prod_h
    return H, (H if same else _augmented(prod_g, sum_q, sum_f, n, bias))


def _augmented(prod, sum_a, sum_b, n, bias):
    """``E[ã b̃ᵀ]`` from ``Σ a bᵀ`` ``(B, D, D)``, ``Σ a``, ``Σ b`` ``(B, D)`` over ``n``."""
    n_b, d, _ = prod.shape
    out = np.zeros((n_b, d + bias, d + bias))
    out[:, :d, :d] = prod
    if bias:
        out[:, :d, d] = sum_a
        out[:, d, :d] = sum_b
        out[:, d, d] = n
    return out / max(n, 1)


def numpy_gram(a, b):
    """``aᵀ b`` of two ``(P, D)`` arrays, or ``a bᵀ`` per problem of two ``(B, D, P)``
    arrays (the products :func:`moments` needs), as float64: float32 products of
    :data:`CHUNK` positions at a time, summed in float64."""
    n = a.shape[0] if a.ndim == 2 else a.shape[2]
    out = None
    for start in range(0, n, CHUNK):
        if a.ndim == 2:
            part = a[start:start + CHUNK].T @ b[start:start + CHUNK]
        else:
            part = np.matmul(a[:, :, start:start + CHUNK],
                             np.swapaxes(b[:, :, start:start + CHUNK], 1, 2))
        out = part.astype(np.float64) if out is None else out + part
    return out


def _second_moment(a, b, bias, gram):
    """``E[ã b̃ᵀ]`` per problem of :func:`_problems`' output, ``ã = [a, 1]`` with ``bias``."""
    if isinstance(a, np.ndarray):  # depthwise (C, taps, P)
        return _augmented(np.asarray(gram(a, b), np.float64), a.sum(axis=2, dtype=np.float64),
                          b.sum(axis=2, dtype=np.float64), a.shape[2], bias)
    prod = np.stack([np.asarray(gram(ak, bk), np.float64) for ak, bk in zip(a, b)])
    return _augmented(prod, np.stack([ak.sum(axis=0, dtype=np.float64) for ak in a]),
                      np.stack([bk.sum(axis=0, dtype=np.float64) for bk in b]), a[0].shape[0],
                      bias)


def moments(x_q, x_f, geometry: Geometry, bias: bool, max_positions=None, seed=0,
            gram=numpy_gram, columns=None):
    """``(H, G)``, each ``(B, D + bias, D + bias)``: ``H = E[p̃_q p̃_qᵀ]`` over the layer's
    input patches in the quantized stream ``x_q`` and ``G = E[p̃_q p̃_fᵀ]`` crossing them
    with the float stream ``x_f`` (``G is H`` when ``x_f is x_q``), ``p̃ = [p, 1]`` with
    ``bias``. Inputs are channels-last: ``(N, H, W, C)`` for convolutions, ``(..., D)`` for
    dense layers (every leading position is a sample). ``gram`` computes the products (the
    caller may hand them to another linear algebra library: :func:`numpy_gram`'s
    contract).

    ``columns``: ``(start, stop)`` of a convolution's or dense layer's patch columns (of each
    group's): the moments of those inputs only (with the bias's row and column), a diagonal
    block of the whole ``H`` and ``G``, on the same positions for the same ``seed``
    (:func:`_block_moments`: the products summed over :data:`CHUNK` positions at a time, so
    the figures differ from the whole matrices' in the last bits)."""
    rng = np.random.default_rng(seed)
    same = x_f is x_q
    if geometry.kind == "dense":
        d = x_q.shape[-1]
        x_q, x_f = (np.reshape(v, (-1, 1, 1, d)) for v in (x_q, x_f))
    where = _positions(geometry, x_q.shape, max_positions, rng)
    if columns is not None:
        if geometry.kind == "depthwise":
            raise ValueError("`columns` is for a convolution's or dense layer's patches; a "
                             "depthwise layer's inputs are its taps")
        xq = np.asarray(x_q, np.float32)
        return _block_moments(xq, xq if same else np.asarray(x_f, np.float32), geometry,
                              where, tuple(columns), bias, gram)
    a = _problems(np.asarray(x_q, np.float32), geometry, where)
    H = _second_moment(a, a, bias, gram)
    if same:
        return H, H
    b = _problems(np.asarray(x_f, np.float32), geometry, where)
    return H, _second_moment(a, b, bias, gram)
