"""Rounding one layer's weights onto an integer grid, chosen for the layer's output
(pure numpy, float64).

Every function works on a *batch* of independent problems, so that a depthwise layer (each
channel its own small problem) or a grouped convolution runs vectorized:

* ``W``: ``(B, R, D)`` weights: ``B`` problems of ``R`` rows (output channels), ``D`` inputs
  each. A Conv2D / Dense is one problem (``R`` = output channels, ``D`` = kh·kw·C_in or
  D_in); a grouped convolution ``groups`` problems; a depthwise convolution ``C`` problems of
  ``R`` = depth multiplier rows over ``D`` = kh·kw taps. The last ``D − n_quant`` columns are
  the bias (an input that is always 1): never rounded, free to absorb the mean output error.
* ``H``: ``(B, D, D)``, the second moment ``E[x xᵀ]`` of the layer's inputs over calibration
  positions (one im2col patch per output position, with a trailing 1 for the bias). For a row
  ``w`` and its rounded ``q`` the mean squared output error is ``(w − q)ᵀ H (w − q)``, so rows
  are independent problems.
* ``s``: ``(B, R)``, the step of each row's grid; integers ``k ∈ [qmin, qmax]``, value ``s·k``,
  zero point 0 (:func:`grid_max`, :func:`grid_min`): at 8 bits the symmetric [−127, 127] TF
  Lite's quantization spec asks of INT8 weights; below 8 bits the whole two's-complement
  range, at 4 bits [−8, 7] (an INT4 tensor holds −8, and LiteRT unpacks it to an INT8 −8 for
  the same kernels, so the 16th level is free). The functions of a grid take ``qmax`` and
  ``qmin`` (``None``: ``−qmax``); :func:`keep_tap_sums` is for the symmetric 8-bit grid only.

Methods: :func:`nearest` (round each weight to the nearest grid point), :func:`gptq` (round
the columns in order, each time moving the error onto the columns not rounded yet so that the
output error stays least: Optimal Brain Quantization with a fixed order, as in GPTQ, extended
to convolutions by their im2col patches) and :func:`adaround` (a soft up/down choice per
weight learned by Adam on the quadratic output loss, with AdaRound's regularizer).
:func:`asymmetric_target` gives the weights that best reproduce the *float* layer's outputs
from the *quantized* network's inputs, so that each layer also undoes part of the error of the
layers before it.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "METHODS", "adaround", "asymmetric_target", "best_bias", "channel_order", "damped",
    "from_rows", "gptq", "grid_max", "grid_min", "keep_tap_sums", "mean_bias", "nearest",
    "noisiest_within", "output_error", "round_rows", "round_rows_blocked", "scale_maxabs",
    "scale_mse", "schur_bias",
    "shrunk", "smallest_within", "to_rows",
]

#: Relative ridge added to ``H``'s diagonal (GPTQ's dampening).
DAMP = 0.01
#: Candidate shrink factors of the largest-weight step (:func:`scale_mse`).
ALPHAS = np.linspace(0.3, 1.0, 71)
#: AdaRound's rectified sigmoid stretch.
ZETA, GAMMA = 1.1, -0.1


def grid_max(bits: int) -> int:
    """The largest integer of the ``bits``-bit grid, ``2^(bits−1) − 1``."""
    return 2 ** (int(bits) - 1) - 1


def grid_min(bits: int) -> int:
    """The smallest integer of the ``bits``-bit grid: ``−2^(bits−1)`` below 8 bits (INT4's
    −8), ``−(2^(bits−1) − 1)`` from 8 bits on (the symmetric INT8 weights of TF Lite's
    quantization spec, whose kernels may rely on it)."""
    return -grid_max(bits) - (1 if int(bits) < 8 else 0)


def _lo(qmax, qmin):
    return -qmax if qmin is None else qmin


def _safe(s):
    return np.where(s > 0, s, 1.0)


def nearest(W, s, qmax, qmin=None):
    """``s · clip(round(W / s), qmin, qmax)`` per row (``s`` ``(B, R)``); a row of step 0 is
    all zeros."""
    s = np.asarray(s, np.float64)[..., None]
    return np.clip(np.round(W / _safe(s)), _lo(qmax, qmin), qmax) * s


def keep_tap_sums(z, q, qmax):
    """Integers ``q`` (``z`` rounded, both ``(T, N)``: ``T`` taps of ``N`` columns, each an
    (input, output) channel pair of a kernel on its grid) with the fewest entries moved one
    step so that each column's sum is within half a step of ``z``'s: for a sum rounded up
    by ``n`` steps, the ``n`` entries rounded up the most go one step down (and the other
    way round). Entries at ``±qmax`` stay (the grid's end keeps the kernel's largest weight,
    so the step TF Lite computes from the kernel stays the same). Returns a new array.

    Rounding each weight to nearest leaves a column's sum off by up to ``T/2`` steps, and a
    depthwise kernel that detects edges (taps summing to about 0, weights large) then passes
    a share of the smooth part of its input it was trained to cancel.
    """
    z, q = np.asarray(z, np.float64), np.array(q, np.float64)
    d = q - z
    n = np.round(d.sum(axis=0))
    free = np.abs(q) < qmax
    # Rank of each entry within its column: by how far it was rounded up (down).
    rank_up = np.argsort(np.argsort(-np.where(free, d, -np.inf), axis=0, kind="stable"),
                         axis=0, kind="stable")
    rank_down = np.argsort(np.argsort(np.where(free, d, np.inf), axis=0, kind="stable"),
                           axis=0, kind="stable")
    q -= free & (n > 0) & (rank_up < n)
    q += free & (n < 0) & (rank_down < -n)
    return q


def scale_maxabs(W, qmax, per_tensor=False, qmin=None):
    """The least step that clips no weight of the row (or, ``per_tensor``, of the whole
    kernel): ``max(max w / qmax, min w / qmin)``, ``(B, R)``; on the symmetric grid
    ``max|w| / qmax``."""
    a = np.maximum(W.max(axis=-1, initial=0.0) / qmax,
                   np.abs(W.min(axis=-1, initial=0.0)) / -_lo(qmax, qmin))
    if per_tensor:
        a = np.full(a.shape, a.max(initial=0.0))
    return a


def scale_mse(W, qmax, per_tensor=False, alphas=ALPHAS, qmin=None):
    """The step ``α ·`` :func:`scale_maxabs` with ``α`` from ``alphas`` that makes the squared
    rounding error of the row (or, ``per_tensor``, of the whole kernel) least: clipping a few
    large weights buys a finer step for all the others. The first ``α`` wins ties, so a kernel
    already on a grid keeps it when no coarser grid holds it."""
    s0 = scale_maxabs(W, qmax, per_tensor, qmin)
    best = np.full(s0.shape, np.inf)
    out = s0.copy()
    for a in alphas:
        s = a * s0
        err = ((nearest(W, s, qmax, qmin) - W) ** 2).sum(-1)
        if per_tensor:
            err = np.full(err.shape, err.sum())
        better = err < best * (1 - 1e-12)
        best = np.where(better, err, best)
        out = np.where(better, s, out)
    return out


def damped(H, damp=DAMP, n_quant=None):
    """``H + damp · mean(diag H[:n_quant]) · I`` per problem; an input that is always zero
    (diagonal 0) gets a unit diagonal instead, so the matrix stays invertible."""
    H = np.array(H, np.float64)
    n_quant = H.shape[1] if n_quant is None else n_quant
    d = np.einsum("bii->bi", H)  # a view: writes go into H
    d[d == 0] = 1.0
    lam = damp * d[:, :n_quant].mean(axis=1)
    d += lam[:, None]
    return H


def asymmetric_target(W, H, G, damp=DAMP, n_quant=None):
    """The weights ``v`` that best reproduce the float layer's output from the quantized
    network's inputs: ``argmin_v E‖x_fᵀw − x_qᵀv‖²`` ridge-damped towards ``w``,
    ``v = (H + λI)⁻¹ (G w + λ w)`` with ``H = E[x_q x_qᵀ]``, ``G = E[x_q x_fᵀ]``. Then
    ``E‖x_fᵀw − x_qᵀq‖² = (v − q)ᵀ H (v − q) + const``, so rounding ``v`` against ``H``
    minimizes the error against the float layer. With ``G = H`` (no earlier error) ``v = w``."""
    Hd = damped(H, damp, n_quant)
    lam = np.einsum("bii->bi", Hd) - np.einsum("bii->bi", np.asarray(H, np.float64))
    rhs = np.einsum("bij,brj->bri", G, W) + lam[:, None, :] * W
    return np.swapaxes(np.linalg.solve(Hd, np.swapaxes(rhs, 1, 2)), 1, 2)


def gptq(W, H, s, qmax, n_quant, damp=DAMP, block=128, qmin=None):
    """Round the first ``n_quant`` columns of every row in order, each time moving the
    rounding error onto the columns not rounded yet so that the output error stays least.

    With ``U`` the upper Cholesky factor of ``(H + λI)⁻¹``, rounding column ``i`` to ``q_i``
    changes the later columns by ``−(w_i − q_i) / U_ii · U[i, i+1:]`` (the least-squares
    compensation while they are still free). The columns from ``n_quant`` on (the bias) are
    never rounded and take the last compensation. The updates are applied per ``block`` of
    columns (the same result, fewer passes over ``W``).

    Returns:
        ``(Q, rest)``: ``(B, R, n_quant)`` grid values and ``(B, R, D − n_quant)`` the free
        columns after compensation.
    """
    W = np.array(W, np.float64)
    s = np.asarray(s, np.float64)
    dead = np.einsum("bii->bi", np.asarray(H)) == 0
    W[np.broadcast_to(dead[:, None, :], W.shape)] = 0.0  # an input never seen: weight moot
    Hinv = np.linalg.inv(damped(H, damp, n_quant))
    Hinv = (Hinv + np.swapaxes(Hinv, 1, 2)) / 2
    U = np.swapaxes(np.linalg.cholesky(Hinv), 1, 2)  # Hinv = Uᵀ U, U upper triangular
    Q = np.zeros(W.shape[:2] + (n_quant,))
    safe, lo = _safe(s), _lo(qmax, qmin)
    for i0 in range(0, n_quant, block):
        i1 = min(i0 + block, n_quant)
        W1 = W[:, :, i0:i1].copy()
        E = np.zeros_like(W1)
        for j in range(i1 - i0):
            w = W1[:, :, j]
            q = np.clip(np.round(w / safe), lo, qmax) * s
            Q[:, :, i0 + j] = q
            e = (w - q) / U[:, None, i0 + j, i0 + j]
            W1[:, :, j:] -= e[:, :, None] * U[:, None, i0 + j, i0 + j:i1]
            E[:, :, j] = e
        W[:, :, i1:] -= E @ U[:, i0:i1, i1:]
    return Q, W[:, :, n_quant:]


def best_bias(W, Q, H, n_quant):
    """The free columns (the bias) that minimize ``(w − [q, b])ᵀ H (w − [q, b])`` for the
    rounded ``q``: ``b = w_b + H_bb⁻¹ H_bx (w_x − q)``, the bias that takes the mean output
    error away (bias correction, measured on the same inputs as ``H``)."""
    if W.shape[2] == n_quant:
        return W[:, :, n_quant:]
    hbx = H[:, n_quant:, :n_quant]
    hbb = H[:, n_quant:, n_quant:]
    corr = np.linalg.solve(hbb, hbx @ np.swapaxes(W[:, :, :n_quant] - Q, 1, 2))
    return W[:, :, n_quant:] + np.swapaxes(corr, 1, 2)


def mean_bias(W, Q, H, G, n_quant):
    """The free columns (the bias, an input that is always 1) that take the mean output error
    away: ``b + E[x_f]ᵀw − E[x_q]ᵀq``, the quantized layer on the quantized stream's inputs
    then has the float layer's mean output on the float stream's (empirical bias correction;
    ``E[x_q]`` is ``H``'s bias row, ``E[x_f]`` ``G``'s)."""
    mean_q = np.asarray(H, np.float64)[:, n_quant:n_quant + 1, :n_quant]
    mean_f = mean_q if G is H else np.asarray(G, np.float64)[:, n_quant:n_quant + 1, :n_quant]
    shift = (np.einsum("bki,bri->brk", mean_f, W[:, :, :n_quant])
             - np.einsum("bki,bri->brk", mean_q, Q))
    out = np.array(W[:, :, n_quant:], np.float64)
    out[:, :, :1] += shift
    return out


def schur_bias(H, n_quant):
    """``H`` of the rounded columns with the bias free: the Schur complement
    ``H_xx − H_xb H_bb⁻¹ H_bx`` (the input covariance when ``H`` is a second moment over
    ``[x, 1]``)."""
    if H.shape[1] == n_quant:
        return H
    hx = H[:, :n_quant, n_quant:]
    hb = H[:, n_quant:, n_quant:]
    return H[:, :n_quant, :n_quant] - hx @ np.linalg.solve(hb, np.swapaxes(hx, 1, 2))


def adaround(W, H, s, qmax, iters=500, lr=0.1, lam=1.0, beta=(20.0, 2.0), warmup=0.2,
             qmin=None):
    """AdaRound on the quadratic output loss: each weight becomes ``s·(⌊w/s⌋ + h(V))`` with
    the rectified sigmoid ``h(V) = clip(σ(V)(ζ−γ) + γ, 0, 1)``; Adam minimizes

        Σ_rows (w̃ − w)ᵀ Ĥ (w̃ − w) / s²  +  λ Σ (1 − |2h − 1|^β)

    with ``Ĥ = H / mean(diag H)`` (errors in grid steps, so ``λ`` means the same for every
    layer). No regularizer for the first ``warmup`` share of the iterations, then ``β``
    anneals from ``beta[0]`` to ``beta[1]``, which pushes each ``h`` to 0 or 1; the result is
    rounded hard (``h ≥ ½`` rounds up). ``H`` covers the rounded columns only (pass
    :func:`schur_bias` of it to let the bias absorb the mean error). Returns ``(B, R, D)`` grid
    values.
    """
    safe = _safe(np.asarray(s, np.float64))[..., None]
    lo = _lo(qmax, qmin)
    Wn = W / safe  # in grid steps
    base = np.floor(Wn)
    Hn = (H / np.einsum("bii->bi", H).mean(axis=1).clip(min=1e-30)[:, None, None]).astype(
        np.float32)
    rest = np.clip(Wn - base, 0.01, 0.99)
    V = (-np.log((ZETA - GAMMA) / (rest - GAMMA) - 1)).astype(np.float32)
    m, v = np.zeros_like(V), np.zeros_like(V)
    Wn32, base32 = Wn.astype(np.float32), base.astype(np.float32)
    n_warm = int(warmup * iters)
    for t in range(1, iters + 1):
        sig = 1 / (1 + np.exp(-V))
        hr = sig * (ZETA - GAMMA) + GAMMA
        h = np.clip(hr, 0, 1)
        inside = (base32 + h >= lo) & (base32 + h <= qmax)
        g_h = 2 * ((np.clip(base32 + h, lo, qmax) - Wn32) @ Hn) * inside
        if t > n_warm:
            b = beta[0] + (beta[1] - beta[0]) * (t - n_warm) / max(1, iters - n_warm)
            u = 2 * h - 1
            g_h = g_h - lam * b * np.abs(u) ** (b - 1) * np.sign(u) * 2
        g_v = g_h * ((hr > 0) & (hr < 1)) * sig * (1 - sig) * (ZETA - GAMMA)
        m = 0.9 * m + 0.1 * g_v
        v = 0.999 * v + 0.001 * g_v * g_v
        V -= lr * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
    up = (1 / (1 + np.exp(-V)) * (ZETA - GAMMA) + GAMMA >= 0.5)
    return np.clip(base + up, lo, qmax) * np.asarray(s, np.float64)[..., None]


def output_error(W, Q, H):
    """``Σ_rows (w − q)ᵀ H (w − q)``: the layer's mean squared output error (summed over
    rows and problems) when its weights ``W`` become ``Q`` (both ``(B, R, D)``)."""
    d = np.asarray(W, np.float64) - Q
    return float(np.einsum("bri,bij,brj->", d, H, d))


# ------------------------------------------------------------------- one layer

#: The rounding methods :func:`round_rows` knows.
METHODS = ("nearest", "gptq", "adaround")


def round_rows(W, H, G, bits, method, n_quant, per_tensor=False, free_bias=True,
               damp=DAMP):
    """One layer's rows rounded by ``method``: ``(Q, bias, s)`` with ``Q`` ``(B, R,
    n_quant)`` grid values, ``bias`` ``(B, R, D − n_quant)`` (the free columns) and ``s``
    ``(B, R)`` the steps.

    The grid is :func:`grid_min` to :func:`grid_max` of ``bits``. "nearest" rounds each
    weight to the nearest point of the finest grid that clips none of the row's (or,
    ``per_tensor``, the kernel's) weights, as TF Lite's converter does at 8 bits; given
    ``H`` (and ``G``) and ``free_bias``, the bias takes the mean output error away
    (:func:`mean_bias`), else it is unchanged. "gptq" and "adaround" round
    :func:`asymmetric_target` (``G`` crossing the quantized stream's inputs with the float
    stream's; pass ``G is H`` when they are the same) on the step :func:`scale_mse` chooses;
    with ``free_bias`` the bias takes the mean output error away (:func:`best_bias`), else it
    stays as it is and the rounding is chosen without it.
    """
    if method not in METHODS:
        raise ValueError(f"`method` must be one of {METHODS}. Received: method={method!r}")
    qmax, qmin = grid_max(bits), grid_min(bits)
    W = np.asarray(W, np.float64)
    if method == "nearest":
        s = scale_maxabs(W[:, :, :n_quant], qmax, per_tensor, qmin)
        Q = nearest(W[:, :, :n_quant], s, qmax, qmin)
        if H is None or not free_bias or W.shape[2] == n_quant:
            return Q, W[:, :, n_quant:], s
        return Q, mean_bias(W, Q, H, G, n_quant), s
    if not free_bias and W.shape[2] > n_quant:
        Hs = H[:, :n_quant, :n_quant]
        Gs = Hs if G is H else G[:, :n_quant, :n_quant]
        Q, _, s = round_rows(W[:, :, :n_quant], Hs, Gs, bits, method, n_quant, per_tensor,
                             True, damp)
        return Q, W[:, :, n_quant:], s
    target = W if G is H else asymmetric_target(W, H, G, damp, n_quant)
    s = scale_mse(target[:, :, :n_quant], qmax, per_tensor, qmin=qmin)
    if method == "gptq":
        Q, _ = gptq(target, H, s, qmax, n_quant, damp, qmin=qmin)
    else:
        Q = adaround(target[:, :, :n_quant], schur_bias(damped(H, damp, n_quant), n_quant),
                     s, qmax, qmin=qmin)
    return Q, best_bias(target, Q, H, n_quant), s


def round_rows_blocked(W, moments_of, blocks, bits, method, n_quant, per_tensor=False,
                       free_bias=True, damp=DAMP):
    """:func:`round_rows` on the diagonal blocks of ``H`` and ``G`` over the contiguous column
    blocks ``blocks`` (``[(start, stop)]`` covering the first ``n_quant`` columns), for a layer
    whose whole ``(D, D)`` matrices would not fit in memory: ``moments_of(start, stop)`` gives
    ``(H_k, G_k)`` of those inputs with the bias's row and column (``G_k is H_k`` when the two
    streams are one), and only one block's are held at a time.

    Each block is its own layer, with a bias of its own (starting at 0): its target
    (:func:`asymmetric_target`) and its rounding ("gptq": the error moved onto the block's
    later columns only; "adaround") see only the block's inputs, and the bias it takes
    (:func:`best_bias`; "nearest": :func:`mean_bias`) is added to the layer's. The covariances
    between blocks are left out; the mean output error is still taken away whole, as the means
    of every block are. Each row's step is chosen on the whole row (:func:`scale_mse` of every
    block's target; "nearest": :func:`scale_maxabs`), as :func:`round_rows` does, so for
    "gptq" and "adaround" with two streams every block's moments are measured twice (the
    targets first, the rounding then; the last block's once). With one block this is
    :func:`round_rows` up to the order of the floating-point sums. The ridge of ``damp`` is
    relative to each block's own mean input power."""
    if method not in METHODS:
        raise ValueError(f"`method` must be one of {METHODS}. Received: method={method!r}")
    qmax, qmin = grid_max(bits), grid_min(bits)
    W = np.asarray(W, np.float64)
    extra = W.shape[2] - n_quant
    if method == "nearest":
        return _blocked_nearest(W, moments_of, blocks, qmax, qmin, n_quant, per_tensor,
                                free_bias)
    if not free_bias and extra:  # the bias kept: the blocks rounded without its row
        def without_bias(start, stop):
            H, G = moments_of(start, stop)
            d = stop - start
            h = H[:, :d, :d]
            return h, (h if G is H else G[:, :d, :d])
        Q, _, s = round_rows_blocked(W[:, :, :n_quant], without_bias, blocks, bits, method,
                                     n_quant, per_tensor, True, damp)
        return Q, W[:, :, n_quant:], s
    targets, held = _blocked_targets(W, moments_of, blocks, n_quant, damp)
    s = scale_mse(np.concatenate([t[:, :, :t.shape[2] - extra] for t in targets], 2), qmax,
                  per_tensor, qmin=qmin)
    Q = np.zeros(W.shape[:2] + (n_quant,))
    bias = np.array(W[:, :, n_quant:])
    for k in sorted(range(len(blocks)), key=lambda k: k != held[0]):  # held's first
        start, stop = blocks[k]
        H = held[1] if held is not None and held[0] == k else moments_of(start, stop)[0]
        held, target, d = None, targets[k], stop - start
        if method == "gptq":
            Q[:, :, start:stop], _ = gptq(target, H, s, qmax, d, damp, qmin=qmin)
        else:
            Q[:, :, start:stop] = adaround(target[:, :, :d],
                                           schur_bias(damped(H, damp, d), d), s, qmax,
                                           qmin=qmin)
        bias += best_bias(target, Q[:, :, start:stop], H, d)
        del H
    return Q, bias, s


def _own_block(W, start, stop, n_quant):
    """Columns ``[start, stop)`` of ``W`` with bias columns of their own, at 0."""
    bias = np.zeros(W.shape[:2] + (W.shape[2] - n_quant,))
    return np.concatenate([W[:, :, start:stop], bias], 2)


def _blocked_nearest(W, moments_of, blocks, qmax, qmin, n_quant, per_tensor, free_bias):
    """:func:`round_rows_blocked` for "nearest": the whole rows to nearest; with
    ``free_bias`` the bias takes each block's mean output error away (:func:`mean_bias`,
    which reads only the moments' bias rows: exact, the blocks' shares add up)."""
    s = scale_maxabs(W[:, :, :n_quant], qmax, per_tensor, qmin)
    Q = nearest(W[:, :, :n_quant], s, qmax, qmin)
    bias = np.array(W[:, :, n_quant:])
    if free_bias and W.shape[2] > n_quant:
        for start, stop in blocks:
            H, G = moments_of(start, stop)
            bias += mean_bias(_own_block(W, start, stop, n_quant), Q[:, :, start:stop], H, G,
                              stop - start)
    return Q, bias, s


def _blocked_targets(W, moments_of, blocks, n_quant, damp):
    """``([target of each block], (k, H_k) of the last block measured)``: each block's
    :func:`asymmetric_target`; with one stream (``G is H``) the weights as they are, after the
    first block's moments only."""
    targets, held = [], None
    for k, (start, stop) in enumerate(blocks):
        H, G = moments_of(start, stop)
        own = _own_block(W, start, stop, n_quant)
        if G is H:  # one stream: the weights are the target, block by block
            return [_own_block(W, a, b, n_quant) for a, b in blocks], (k, H)
        targets.append(asymmetric_target(own, H, G, damp, stop - start))
        held = (k, H)
        del G
    return targets, held


def smallest_within(sizes, share):
    """The indices of the smallest kernels whose sizes add up to at most ``share`` of the
    total (``sizes``: parameters per kernel), taken smallest first (ties in order), skipping
    any kernel that would overrun the budget. At 4 bits these are the kernels worth keeping
    on an 8-bit grid: the bytes they add are at most ``share / 2`` of the 4-bit kernels'
    (half a byte more per weight), and small kernels (depthwise 3x3, the first convolution,
    the early blocks) are the ones whose 4-bit error the rest of the network carries
    furthest."""
    sizes = np.asarray(sizes, np.int64).ravel()
    return _taken_within(sizes, np.argsort(sizes, kind="stable"), share)


def noisiest_within(sizes, noise, share):
    """The indices of the kernels with the most noise per weight whose sizes add up to at
    most ``share`` of the total (``sizes``: parameters per kernel; ``noise``: what each adds
    to the model's error at the lower width, e.g. the noise-to-signal ratio it adds to its
    layer's output rounded to nearest), taken most noise per weight first (ties in order),
    skipping any kernel that would overrun the budget: the 8-bit kernels that buy the most
    error per byte they cost (half a byte more per weight at 4 bits)."""
    sizes = np.asarray(sizes, np.int64).ravel()
    per_weight = np.asarray(noise, np.float64).ravel() / np.maximum(sizes, 1)
    return _taken_within(sizes, np.argsort(-per_weight, kind="stable"), share)


def _taken_within(sizes, order, share):
    """The indices taken in ``order`` whose ``sizes`` add up to at most ``share`` of the
    total, skipping any that would overrun it; sorted."""
    budget = share * sizes.sum()
    chosen, used = [], 0
    for i in order:
        if used + sizes[i] <= budget:
            chosen.append(int(i))
            used += int(sizes[i])
    return sorted(chosen)


def shrunk(H, G, shrink, n_quant):
    """``(H, G)`` with the off-diagonal of the inputs' (cross-)covariance scaled by ``1 −
    shrink``: each input's variance and every mean (the bias row and column, when ``H`` has
    more than ``n_quant`` columns) kept, the correlations between inputs trusted less
    (covariance shrinkage towards the diagonal; ``G is H`` stays so). The result stays
    positive semi-definite, as a mix of two covariances."""
    def one(M):
        M = np.array(M, np.float64)
        d = n_quant
        mean = (np.einsum("bi,bj->bij", M[:, :d, d], M[:, d, :d]) if M.shape[1] > d
                else np.zeros_like(M[:, :d, :d]))
        C = M[:, :d, :d] - mean
        idx = np.arange(d)
        diag = C[:, idx, idx].copy()
        C *= 1.0 - shrink
        C[:, idx, idx] = diag
        M[:, :d, :d] = C + mean
        return M
    h = one(H)
    return h, (h if G is H else one(G))


# ------------------------------------------------------------------- kernels as rows


def to_rows(kernel, bias, kind, groups=1):
    """A Keras kernel (and bias, or None) as ``(B, R, D [+ 1])`` rows ``[w, b]``: ``kind``
    "conv" (``(kh, kw, C/groups, O)``), "depthwise" (``(kh, kw, C, m)``) or "dense"
    (``(D, O)``). Inputs are ordered as :func:`cle._math.moments.moments` orders a patch."""
    k = np.asarray(kernel, np.float64)
    if kind == "depthwise":
        c, m = k.shape[-2:]
        W = k.reshape(-1, c, m).transpose(1, 2, 0)  # (C, m, taps)
    elif kind == "dense":
        W = k.T[None]
    else:
        o = k.shape[-1]
        W = k.reshape(-1, groups, o // groups).transpose(1, 2, 0)  # (g, O/g, D)
    if bias is None:
        return W
    return np.concatenate([W, np.asarray(bias, np.float64).reshape(W.shape[:2] + (1,))], 2)


def from_rows(Q, kind, shape, groups=1):
    """The Keras kernel of shape ``shape`` whose rows (:func:`to_rows`, without the bias)
    are ``Q``."""
    if kind == "dense":
        return np.asarray(Q)[0].T.reshape(shape)
    return np.asarray(Q).transpose(2, 0, 1).reshape(shape)  # (taps[·C/g], B, R) -> kernel


def channel_order(a):
    """A ``(B, R)`` per-row array (step, error, ...) in the layer's output channel order
    (group-major for a grouped convolution, ``c·m + j`` for a depthwise one)."""
    return np.asarray(a).reshape(-1)
