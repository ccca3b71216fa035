"""Pure numpy cross-layer scaling and high-bias folding math. No Keras import.

Channel conventions follow ``cle._core.layouts``: a kernel is described by ``(axis, kind)`` where
``kind`` is "standard" (one axis indexes the channels), "depthwise_out" (``(*k, in, mult)``,
channel ``c * mult + m``) or "grouped_in" (``(*k, in/groups, out)`` read by input channel
``c = group * (in/groups) + local``).

Cross-layer scaling of a pair (Nagel et al. 2019, eq. 11): with r1 the per-output-channel
range of layer 1 and r2 the per-input-channel range of layer 2, ``s = sqrt(r1 / r2)``; layer 1's
output channel i is divided by ``s_i`` and layer 2's input channel i multiplied by it, so that
both ranges become ``sqrt(r1 * r2)``. A triplet conv → depthwise → conv uses
``c = cbrt(r1 r2 r3)``, ``S12 = r1 / c``, ``S23 = c / r3``.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "channel_ranges",
    "pair_scale",
    "scale_channels",
    "triplet_scale",
    "constant_input_response",
    "relu_shift",
]


def _as64(x):
    return np.asarray(x, dtype=np.float64)


def _grouped_view(kernel, groups):
    """``(*k, ipg, out)`` → ``(*k, ipg, groups, opg)``."""
    shape = kernel.shape
    return kernel.reshape(shape[:-1] + (groups, shape[-1] // groups))


def channel_ranges(kernel, axis, kind="standard", groups=1):
    """Per-channel ``max |W|`` over every other axis.

    Args:
        kernel: the kernel array.
        axis: channel axis for "standard".
        kind: "standard", "depthwise_out" (output channel ``c*mult+m`` of a depthwise kernel)
            or "grouped_in" (input channel of a grouped convolution).
        groups: number of groups for "grouped_in".

    Returns:
        float64 array of shape (C,).
    """
    # |W| and max are exact in the kernel's own dtype, and so is the cast of the result to
    # float64: the same ranges as in float64, without a float64 copy of the whole kernel.
    a = np.abs(np.asarray(kernel))
    if kind == "depthwise_out":
        return _as64(a.reshape((-1, a.shape[-2] * a.shape[-1])).max(axis=0))
    if kind == "grouped_in":
        g = _grouped_view(a, groups)  # (*k, ipg, groups, opg)
        per = g.reshape((-1,) + g.shape[-3:]).max(axis=(0, 3))  # (ipg, groups)
        return _as64(per.T.reshape(-1))
    axis = axis % a.ndim
    return _as64(a.max(axis=tuple(i for i in range(a.ndim) if i != axis)))


def scale_channels(kernel, factors, axis, kind="standard", groups=1):
    """Multiply each channel (as in :func:`channel_ranges`) by ``factors``; returns float64.

    The product is computed in float64 (numpy promotes the kernel's float32 to float64 exactly)
    without a separate float64 copy of the kernel first.
    """
    k = np.asarray(kernel)
    if not np.issubdtype(k.dtype, np.floating):
        k = _as64(k)
    f = _as64(factors)
    if kind == "depthwise_out":
        shape = k.shape
        return (k.reshape(shape[:-2] + (shape[-2] * shape[-1],)) * f).reshape(shape)
    if kind == "grouped_in":
        g = _grouped_view(k, groups)
        ipg = g.shape[-3]
        per = f.reshape(groups, ipg).T  # (ipg, groups)
        return (g * per[:, :, None]).reshape(k.shape)
    shape = [1] * k.ndim
    shape[axis] = f.shape[0]
    return k * f.reshape(shape)


def _safe(s):
    s = np.where(np.isfinite(s) & (s > 0), s, 1.0)
    return s


def pair_scale(r1, r2):
    """``s = sqrt(r1 / r2)``; channels where either range is zero (or not finite) keep 1."""
    r1, r2 = _as64(r1), _as64(r2)
    ok = (r1 > 0) & (r2 > 0) & np.isfinite(r1) & np.isfinite(r2)
    s = np.ones_like(r1)
    s[ok] = np.sqrt(r1[ok] / r2[ok])
    return _safe(s)


def triplet_scale(r1, r2, r3):
    """``(S12, S23)`` with ``c = cbrt(r1 r2 r3)``, ``S12 = r1 / c``, ``S23 = c / r3``.

    After ``W1 /= S12``, ``Wdw *= S12 / S23``, ``W3 *= S23`` all three ranges equal ``c``.
    Channels where any range is zero (or not finite) keep 1 for both factors.
    """
    r1, r2, r3 = _as64(r1), _as64(r2), _as64(r3)
    ok = (r1 > 0) & (r2 > 0) & (r3 > 0) & np.isfinite(r1 * r2 * r3)
    s12, s23 = np.ones_like(r1), np.ones_like(r1)
    c = np.cbrt(r1[ok] * r2[ok] * r3[ok])
    s12[ok] = r1[ok] / c
    s23[ok] = c / r3[ok]
    return _safe(s12), _safe(s23)


def constant_input_response(kernel, values, kind="standard", groups=1):
    """Output (no bias) of a layer whose input is the constant ``values[c]`` on channel c.

    ``kernel`` is ``(*k, in, out)`` ("standard", Dense ``(in, out)``), ``(*k, in, mult)``
    ("depthwise") or ``(*k, in/groups, out)`` ("grouped"). Exact for every output position only
    if the layer sees no padding.
    """
    k = _as64(kernel)
    v = _as64(values)
    taps = k.reshape((-1,) + k.shape[-2:]).sum(axis=0)  # (in | ipg, out | mult)
    if kind == "depthwise":
        return (taps * v[:, None]).reshape(-1)
    if kind == "grouped":
        ipg, out = taps.shape
        opg = out // groups
        per = taps.reshape(ipg, groups, opg)  # [local, group, o]
        vin = v.reshape(groups, ipg).T  # [local, group]
        return (per * vin[:, :, None]).sum(axis=0).reshape(-1)
    return v @ taps


def relu_shift(beta, gamma, margin=3.0, relu=True):
    """High-bias amount ``c`` per channel (Nagel et al. 2019, section 4.1).

    With a ReLU-like activation between the layers, ``c = max(0, beta - margin * |gamma|)``: the
    pre-activation ``N(beta, gamma^2)`` stays above ``c`` with probability Φ(margin), where the
    shift is exact. With nothing between, the whole ``beta`` moves (exact).
    """
    beta, gamma = _as64(beta), _as64(gamma)
    if not relu:
        return beta.copy()
    return np.maximum(0.0, beta - float(margin) * np.abs(gamma))
