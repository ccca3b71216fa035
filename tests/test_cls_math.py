"""Pure numpy tests of ``cle._math.equalization``: every function against a brute-force loop or the
closed form of Nagel et al. 2019 (eq. 11, the conv → depthwise → conv triplet, §4.1)."""

import itertools

import numpy as np
import pytest

from cle._math import equalization as M

SEEDS = [0, 1, 2]


def _rng(seed):
    return np.random.default_rng(seed)


def _spread_kernel(rng, shape):
    """A kernel whose entries span several orders of magnitude, with both signs."""
    return rng.normal(size=shape) * np.exp(rng.uniform(-3.0, 3.0, size=shape))


# ------------------------------------------------------------------------ brute-force references


def _ranges_standard(kernel, axis):
    return np.array(
        [np.abs(np.take(kernel, c, axis=axis)).max() for c in range(kernel.shape[axis])]
    )


def _ranges_depthwise_out(kernel):
    """Output channel ``c * mult + m`` of a depthwise kernel ``(*k, in, mult)``."""
    n_in, mult = kernel.shape[-2:]
    out = np.zeros(n_in * mult)
    for c, m in itertools.product(range(n_in), range(mult)):
        out[c * mult + m] = np.abs(kernel[..., c, m]).max()
    return out


def _ranges_grouped_in(kernel, groups):
    """Input channel ``g * ipg + local`` of a grouped kernel ``(*k, ipg, out)``: it is read by
    the output channels ``g * opg .. (g + 1) * opg - 1`` only."""
    ipg, out = kernel.shape[-2:]
    opg = out // groups
    r = np.zeros(ipg * groups)
    for g, local in itertools.product(range(groups), range(ipg)):
        r[g * ipg + local] = np.abs(kernel[..., local, g * opg:(g + 1) * opg]).max()
    return r


def _scale_standard(kernel, f, axis):
    out = kernel.astype(np.float64).copy()
    for c in range(kernel.shape[axis]):
        idx = [slice(None)] * kernel.ndim
        idx[axis] = c
        out[tuple(idx)] *= f[c]
    return out


def _scale_depthwise_out(kernel, f):
    out = kernel.astype(np.float64).copy()
    n_in, mult = kernel.shape[-2:]
    for c, m in itertools.product(range(n_in), range(mult)):
        out[..., c, m] *= f[c * mult + m]
    return out


def _scale_grouped_in(kernel, f, groups):
    out = kernel.astype(np.float64).copy()
    ipg, n_out = kernel.shape[-2:]
    opg = n_out // groups
    for g, local in itertools.product(range(groups), range(ipg)):
        out[..., local, g * opg:(g + 1) * opg] *= f[g * ipg + local]
    return out


# ------------------------------------------------------------------------ channel_ranges


STANDARD_CASES = [
    # (shape, axis): conv out -1 / in -2, transpose out -2 / in -1, dense out -1 / in 0
    ((3, 4, 5), -1), ((3, 4, 5), -2), ((3, 3, 4, 6), -1), ((3, 3, 4, 6), -2),
    ((2, 2, 2, 3, 5), -1), ((2, 2, 2, 3, 5), -2), ((7, 5), 0), ((7, 5), -1), ((7, 5), 1),
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape,axis", STANDARD_CASES)
def test_channel_ranges_standard(shape, axis, seed):
    k = _spread_kernel(_rng(seed), shape)
    r = M.channel_ranges(k, axis)
    assert r.dtype == np.float64 and r.shape == (shape[axis],)
    np.testing.assert_array_equal(r, _ranges_standard(k, axis))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", [(3, 4, 1), (3, 4, 2), (3, 3, 5, 3), (1, 1, 2, 4), (5, 3)])
def test_channel_ranges_depthwise_out(shape, seed):
    k = _spread_kernel(_rng(seed), shape)
    r = M.channel_ranges(k, -1, "depthwise_out")
    assert r.shape == (shape[-2] * shape[-1],)
    np.testing.assert_array_equal(r, _ranges_depthwise_out(k))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "shape,groups",
    [((3, 2, 6), 2), ((3, 3, 2, 6), 3), ((3, 3, 3, 4), 2), ((2, 2, 2, 1, 4), 4), ((3, 4, 4), 1)],
)
def test_channel_ranges_grouped_in(shape, groups, seed):
    k = _spread_kernel(_rng(seed), shape)
    r = M.channel_ranges(k, -2, "grouped_in", groups)
    assert r.shape == (shape[-2] * groups,)
    np.testing.assert_array_equal(r, _ranges_grouped_in(k, groups))


def test_grouped_in_with_one_group_is_standard():
    k = _spread_kernel(_rng(5), (3, 3, 4, 6))
    np.testing.assert_array_equal(
        M.channel_ranges(k, -2, "grouped_in", 1), M.channel_ranges(k, -2)
    )


def test_channel_ranges_float32_input_is_exact_in_float64():
    k = _spread_kernel(_rng(6), (3, 3, 4, 5)).astype(np.float32)
    r = M.channel_ranges(k, -1)
    assert r.dtype == np.float64
    np.testing.assert_array_equal(r, np.abs(k).reshape(-1, 5).max(axis=0).astype(np.float64))


# ------------------------------------------------------------------------ scale_channels


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape,axis", STANDARD_CASES)
def test_scale_channels_standard(shape, axis, seed):
    rng = _rng(seed)
    k = _spread_kernel(rng, shape)
    f = np.exp(rng.uniform(-2, 2, shape[axis]))
    out = M.scale_channels(k, f, axis)
    assert out.dtype == np.float64 and out.shape == k.shape
    np.testing.assert_array_equal(out, _scale_standard(k, f, axis))
    np.testing.assert_allclose(M.channel_ranges(out, axis), M.channel_ranges(k, axis) * f,
                               rtol=1e-15)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", [(3, 4, 1), (3, 4, 2), (3, 3, 5, 3), (5, 3)])
def test_scale_channels_depthwise_out(shape, seed):
    rng = _rng(seed)
    k = _spread_kernel(rng, shape)
    f = np.exp(rng.uniform(-2, 2, shape[-2] * shape[-1]))
    out = M.scale_channels(k, f, -1, "depthwise_out")
    np.testing.assert_array_equal(out, _scale_depthwise_out(k, f))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape,groups", [((3, 2, 6), 2), ((3, 3, 2, 6), 3), ((3, 3, 3, 4), 2)])
def test_scale_channels_grouped_in(shape, groups, seed):
    rng = _rng(seed)
    k = _spread_kernel(rng, shape)
    f = np.exp(rng.uniform(-2, 2, shape[-2] * groups))
    out = M.scale_channels(k, f, -2, "grouped_in", groups)
    np.testing.assert_array_equal(out, _scale_grouped_in(k, f, groups))


SPEC_CASES = [
    ("standard_out", (3, 3, 4, 6), dict(axis=-1)),
    ("standard_in", (3, 3, 4, 6), dict(axis=-2)),
    ("transpose_out", (3, 3, 6, 4), dict(axis=-2)),
    ("dense_in", (7, 5), dict(axis=0)),
    ("depthwise_out", (3, 3, 4, 2), dict(axis=-1, kind="depthwise_out")),
    ("grouped_in", (3, 3, 2, 6), dict(axis=-2, kind="grouped_in", groups=3)),
]


@pytest.mark.parametrize("name,shape,spec", SPEC_CASES, ids=[c[0] for c in SPEC_CASES])
def test_scaling_by_inverse_range_gives_unit_ranges(name, shape, spec):
    """scale_channels and channel_ranges agree on which entries form a channel."""
    k = _spread_kernel(_rng(7), shape)
    r = M.channel_ranges(k, **spec)
    assert np.all(r > 0)
    unit = M.scale_channels(k, 1.0 / r, **spec)
    np.testing.assert_allclose(M.channel_ranges(unit, **spec), 1.0, rtol=1e-15)
    # and a positive per-channel factor multiplies exactly that channel's range
    f = np.exp(_rng(8).uniform(-3, 3, r.shape))
    np.testing.assert_allclose(M.channel_ranges(M.scale_channels(k, f, **spec), **spec), r * f,
                               rtol=1e-15)


def test_scale_channels_does_not_modify_its_input():
    k = _spread_kernel(_rng(9), (3, 3, 4, 6))
    k0 = k.copy()
    M.scale_channels(k, np.full(6, 2.0), -1)
    M.scale_channels(k, np.full(12, 2.0), -2, "grouped_in", 3)
    np.testing.assert_array_equal(k, k0)


# ------------------------------------------------------------------------ pair_scale


@pytest.mark.parametrize("seed", SEEDS)
def test_pair_scale_equalizes(seed):
    rng = _rng(seed)
    r1 = np.exp(rng.uniform(-6, 6, 50))
    r2 = np.exp(rng.uniform(-6, 6, 50))
    s = M.pair_scale(r1, r2)
    assert s.dtype == np.float64 and s.shape == (50,)
    target = np.sqrt(r1 * r2)
    np.testing.assert_allclose(r1 / s, target, rtol=1e-14)
    np.testing.assert_allclose(r2 * s, target, rtol=1e-14)
    np.testing.assert_allclose(s, np.sqrt(r1 / r2), rtol=1e-15)


def test_pair_scale_on_real_kernels_equalizes_ranges():
    """W1 output channels / s and W2 input channels * s end with the same range."""
    rng = _rng(11)
    w1 = _spread_kernel(rng, (3, 3, 3, 6))
    w2 = _spread_kernel(rng, (3, 3, 3, 4))  # grouped: groups=2, ipg=3 → 6 input channels
    r1 = M.channel_ranges(w1, -1)
    r2 = M.channel_ranges(w2, -2, "grouped_in", 2)
    s = M.pair_scale(r1, r2)
    a = M.channel_ranges(M.scale_channels(w1, 1 / s, -1), -1)
    b = M.channel_ranges(M.scale_channels(w2, s, -2, "grouped_in", 2), -2, "grouped_in", 2)
    np.testing.assert_allclose(a, b, rtol=1e-14)
    np.testing.assert_allclose(a, np.sqrt(r1 * r2), rtol=1e-14)


BAD = [0.0, np.inf, -np.inf, np.nan]


@pytest.mark.parametrize("bad", BAD, ids=["zero", "inf", "-inf", "nan"])
@pytest.mark.parametrize("where", ["r1", "r2", "both"])
def test_pair_scale_degenerate_ranges_give_one(bad, where):
    r1 = np.array([1.0, 4.0, 0.25, 9.0])
    r2 = np.array([4.0, 1.0, 1.0, 1.0])
    if where in ("r1", "both"):
        r1[2] = bad
    if where in ("r2", "both"):
        r2[2] = bad
    s = M.pair_scale(r1, r2)
    assert np.all(np.isfinite(s)) and np.all(s > 0)
    assert s[2] == 1.0
    np.testing.assert_allclose(s[[0, 1, 3]], [0.5, 2.0, 3.0], rtol=1e-15)


def test_pair_scale_all_zero_and_empty():
    np.testing.assert_array_equal(M.pair_scale(np.zeros(3), np.zeros(3)), np.ones(3))
    assert M.pair_scale(np.zeros(0), np.zeros(0)).shape == (0,)


def test_pair_scale_extreme_but_finite_ranges_stay_finite():
    # float32 extremes (largest normal, smallest subnormal) are handled exactly in float64
    r1 = np.array([1e-45, 3.4e38, 1e-30, 3.4e38])
    r2 = np.array([3.4e38, 1e-45, 1e30, 1e-45])
    s = M.pair_scale(r1, r2)
    np.testing.assert_allclose(s, np.sqrt(r1 / r2), rtol=1e-15)
    # beyond float64 (r1/r2 overflows): a finite factor all the same
    with np.errstate(over="ignore"):
        s = M.pair_scale(np.array([1e300, 1e-300]), np.array([1e-300, 1e300]))
    assert np.all(np.isfinite(s)) and np.all(s > 0)


def test_pair_scale_does_not_modify_inputs():
    r1, r2 = np.array([0.0, 2.0]), np.array([1.0, 8.0])
    M.pair_scale(r1, r2)
    np.testing.assert_array_equal(r1, [0.0, 2.0])
    np.testing.assert_array_equal(r2, [1.0, 8.0])


# ------------------------------------------------------------------------ triplet_scale


@pytest.mark.parametrize("seed", SEEDS)
def test_triplet_scale_equalizes(seed):
    rng = _rng(seed)
    r1, r2, r3 = (np.exp(rng.uniform(-6, 6, 40)) for _ in range(3))
    s12, s23 = M.triplet_scale(r1, r2, r3)
    assert s12.shape == s23.shape == (40,)
    c = np.cbrt(r1 * r2 * r3)
    np.testing.assert_allclose(r1 / s12, c, rtol=1e-13)
    np.testing.assert_allclose(r2 * s12 / s23, c, rtol=1e-13)
    np.testing.assert_allclose(r3 * s23, c, rtol=1e-13)
    np.testing.assert_allclose(s12, r1 / c, rtol=1e-14)
    np.testing.assert_allclose(s23, c / r3, rtol=1e-14)


def test_triplet_scale_on_real_kernels_equalizes_ranges():
    rng = _rng(12)
    w1 = _spread_kernel(rng, (1, 1, 3, 5))
    wd = _spread_kernel(rng, (3, 3, 5, 1))
    w3 = _spread_kernel(rng, (1, 1, 5, 4))
    r1, r2, r3 = (M.channel_ranges(w1, -1), M.channel_ranges(wd, -1, "depthwise_out"),
                  M.channel_ranges(w3, -2))
    s12, s23 = M.triplet_scale(r1, r2, r3)
    a = M.channel_ranges(M.scale_channels(w1, 1 / s12, -1), -1)
    b = M.channel_ranges(M.scale_channels(wd, s12 / s23, -1, "depthwise_out"), -1,
                         "depthwise_out")
    d = M.channel_ranges(M.scale_channels(w3, s23, -2), -2)
    np.testing.assert_allclose(a, b, rtol=1e-13)
    np.testing.assert_allclose(b, d, rtol=1e-13)
    np.testing.assert_allclose(a, np.cbrt(r1 * r2 * r3), rtol=1e-13)


@pytest.mark.parametrize("bad", BAD, ids=["zero", "inf", "-inf", "nan"])
@pytest.mark.parametrize("which", [0, 1, 2])
def test_triplet_scale_degenerate_ranges_give_one(bad, which):
    rs = [np.array([1.0, 8.0, 2.0]), np.array([1.0, 1.0, 3.0]), np.array([8.0, 1.0, 5.0])]
    rs[which][1] = bad
    with np.errstate(all="ignore"):
        s12, s23 = M.triplet_scale(*rs)
    for s in (s12, s23):
        assert np.all(np.isfinite(s)) and np.all(s > 0)
        assert s[1] == 1.0
    c = np.cbrt(np.array([1.0 * 1.0 * 8.0, 2.0 * 3.0 * 5.0]))
    np.testing.assert_allclose(s12[[0, 2]], np.array([1.0, 2.0]) / c, rtol=1e-14)
    np.testing.assert_allclose(s23[[0, 2]], c / np.array([8.0, 5.0]), rtol=1e-14)


def test_triplet_scale_all_zero():
    s12, s23 = M.triplet_scale(np.zeros(4), np.zeros(4), np.zeros(4))
    np.testing.assert_array_equal(s12, np.ones(4))
    np.testing.assert_array_equal(s23, np.ones(4))


def test_triplet_scale_extreme_but_finite_ranges_stay_finite():
    r = np.array([1e-40, 3.4e38, 1.0])
    s12, s23 = M.triplet_scale(r, r[::-1].copy(), np.array([1e38, 1e-38, 1.0]))
    for s in (s12, s23):
        assert np.all(np.isfinite(s)) and np.all(s > 0)


# ------------------------------------------------------------------------ constant_input_response


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", [(3, 3, 4, 5), (3, 4, 5), (2, 2, 2, 4, 5), (4, 5)])
def test_constant_input_response_standard(shape, seed):
    rng = _rng(seed)
    k = rng.normal(size=shape)
    v = rng.normal(size=shape[-2])
    n_in, n_out = shape[-2:]
    expected = np.zeros(n_out)
    for o in range(n_out):
        for c in range(n_in):
            expected[o] += k[..., c, o].sum() * v[c]
    np.testing.assert_allclose(M.constant_input_response(k, v), expected, rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", [(3, 3, 4, 1), (3, 3, 4, 3), (5, 4, 2)])
def test_constant_input_response_depthwise(shape, seed):
    rng = _rng(seed)
    k = rng.normal(size=shape)
    v = rng.normal(size=shape[-2])
    n_in, mult = shape[-2:]
    expected = np.zeros(n_in * mult)
    for c, m in itertools.product(range(n_in), range(mult)):
        expected[c * mult + m] = k[..., c, m].sum() * v[c]
    np.testing.assert_allclose(M.constant_input_response(k, v, "depthwise"), expected,
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape,groups", [((3, 3, 2, 6), 3), ((3, 2, 4), 2), ((3, 3, 1, 4), 4)])
def test_constant_input_response_grouped(shape, groups, seed):
    rng = _rng(seed)
    k = rng.normal(size=shape)
    ipg, n_out = shape[-2:]
    opg = n_out // groups
    v = rng.normal(size=ipg * groups)
    expected = np.zeros(n_out)
    for o in range(n_out):
        g = o // opg
        for local in range(ipg):
            expected[o] += k[..., local, o].sum() * v[g * ipg + local]
    np.testing.assert_allclose(M.constant_input_response(k, v, "grouped", groups), expected,
                               rtol=1e-12, atol=1e-12)


def test_constant_input_response_matches_a_valid_convolution():
    """A 'valid' 2-D convolution of a constant image gives the response at every position."""
    rng = _rng(13)
    k = rng.normal(size=(3, 2, 4, 5))
    v = rng.normal(size=4)
    img = np.broadcast_to(v, (6, 5, 4))
    out = np.zeros((4, 4, 5))
    for i, j in itertools.product(range(4), range(4)):
        out[i, j] = np.einsum("hwc,hwco->o", img[i:i + 3, j:j + 2], k)
    np.testing.assert_allclose(out, np.broadcast_to(M.constant_input_response(k, v), out.shape),
                               rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------ relu_shift


def test_relu_shift_formula():
    beta = np.array([5.0, 1.0, -2.0, 3.0, 0.0])
    gamma = np.array([0.5, 1.0, 0.1, -0.5, 2.0])
    np.testing.assert_allclose(M.relu_shift(beta, gamma), [3.5, 0.0, 0.0, 1.5, 0.0])
    np.testing.assert_allclose(M.relu_shift(beta, gamma, margin=1.0), [4.5, 0.0, 0.0, 2.5, 0.0])
    np.testing.assert_allclose(M.relu_shift(beta, gamma, margin=0.0), [5.0, 1.0, 0.0, 3.0, 0.0])
    np.testing.assert_array_equal(M.relu_shift(beta, gamma, relu=False), beta)


@pytest.mark.parametrize("seed", SEEDS)
def test_relu_shift_random(seed):
    rng = _rng(seed)
    beta, gamma = rng.normal(0, 3, 30), rng.normal(0, 1, 30)
    c = M.relu_shift(beta, gamma, margin=2.5)
    assert c.dtype == np.float64
    np.testing.assert_array_equal(c, np.maximum(0.0, beta - 2.5 * np.abs(gamma)))
    assert np.all(c >= 0) and np.all(c <= np.maximum(beta, 0))


def test_relu_shift_linear_returns_a_copy():
    beta = np.array([1.0, -2.0])
    c = M.relu_shift(beta, np.ones(2), relu=False)
    c[0] = 99.0
    np.testing.assert_array_equal(beta, [1.0, -2.0])


def test_relu_shift_is_exact_above_c():
    """relu(x - c) + c == relu(x) wherever x >= c, which is what the 3σ rule relies on."""
    rng = _rng(14)
    beta, gamma = rng.uniform(2, 6, 8), rng.uniform(0.2, 1, 8)
    c = M.relu_shift(beta, gamma)
    x = beta + gamma * rng.uniform(-3, 3, (100, 8))  # within beta ± 3|gamma|
    np.testing.assert_allclose(np.maximum(x - c, 0) + c, np.maximum(x, 0), rtol=1e-14)
