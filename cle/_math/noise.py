"""Pure numpy model of the INT8 quantization noise of one scaling set, and the choice of
scales that minimizes it. No Keras import.

A set is a chain ``layer_0 ─► junction_1 ─► layer_1 [─► junction_2 ─► layer_2]`` (a pair or a
conv → depthwise → conv triplet) whose channels are scaled by ``s_k`` at junction ``k``: the
output channel ``i`` of the layer before the junction is divided by ``s_k[i]``, the activation
channel with it, and the input channel ``i`` of the layer after it is multiplied by ``s_k[i]``.
What the network computes does not change; what the quantizer sees does.

**The model.** Every quantized tensor ``T`` with step ``Δ`` adds uniform rounding noise of
variance ``Δ²/12`` per element. Each source is carried to the *output of the set's last layer*,
the one place whose scale does not depend on ``s`` (so noise from different sources adds up in
one unit), with the gain of the linear path from the source to there (sum of squared weights,
times the fraction of positions where an activation lets the noise pass):

* weights of the first layer (step from the per-tensor or per-output-channel range of
  ``W_0 / s``; noise ∝ ``Δ² · G_0`` with ``G_0`` the input power times fan-in),
* the activation tensor at each junction (per-tensor step from ``max_i a_i / s_i``, with
  ``a_i`` capped by the ReLU6 / :class:`cle.ClippedReLU` caps: TFLite quantizes the fused
  RELU's output with the MINIMUM's own scale),
* the depthwise weights of a triplet,
* the weights of the last layer (step from ``max_i s_i · R[i, o]`` per output channel ``o``,
  or over everything per tensor; noise ∝ ``Δ_o² · taps · Σ_i E[x_i²] / s_i²``).

Per-channel weight quantization of the layer before a junction is invariant to ``s`` (each
channel's step scales with it), which is why, for TFLite's default per-channel flow, equalizing
weight ranges alone buys nothing there and can only widen the activation ranges.

**The choice.** Candidates are the identity, Nagel's weight equalization, and a family that
weighs activation ranges in: per channel, the log-ranges of the set's quantities after scaling
(``W_0/s``, ``a/s``, ``W_1·s``, ...) are made as equal as possible in the weighted least-squares
sense (activation ranges with weight ``α``, weight ranges with ``1 − α``), then moved a fraction
``λ`` of the way from the identity. The candidate with the least modelled noise wins; the
identity wins ties; the caller leaves a set whose modelled noise does not drop by
:data:`MIN_GAIN_DB` as it is.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
from scipy.stats import norm

__all__ = [
    "QuantTarget",
    "Junction",
    "ChainWeights",
    "junction_from_bn",
    "junction_from_samples",
    "SampleStats",
    "chain_noise",
    "choose_scales",
    "row_blocks",
    "tensor_range",
    "ALPHAS",
    "LAMBDAS",
]

#: Activation-range weights ``α`` tried by :func:`choose_scales`.
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)
#: Fractions ``λ`` of the way from the identity tried by :func:`choose_scales`.
LAMBDAS = (0.25, 0.5, 0.75, 1.0)
#: Calibration samples assumed by the data-free tail model (TFLite calibrates the range of a
#: tensor on the max over every position of every calibration sample).
ASSUMED_CALIBRATION_SAMPLES = 100
#: Data-free ranges are uncertain per channel: the measured top of channel ``i`` lies at
#: ``β_i + γ_i · z · exp(RANGE_LOG_BIAS + RANGE_LOG_SPREAD · ε_i)``, ``ε_i ~ N(0, 1)``, with
#: ``z`` the Laplace tail (:func:`tail_z`). Fitted on both real ImageNet networks (MobileNetV2,
#: EfficientNet-Lite1; their ReLU6 junctions, 64 photos): the per-tensor range this predicts is
#: unbiased before and after scaling, where a certain per-channel range (spread 0)
#: under-predicts the range after the scaling it chooses and so promises gains that the
#: converter does not see. ``scripts/gen_int8_results.py --fit`` measures it (the block
#: ``int8-range-fit`` of docs/quantization_aware_scaling.md).
RANGE_LOG_SPREAD = 0.4
RANGE_LOG_BIAS = -0.4
#: Draws of the per-channel errors over which the expected per-tensor range is averaged (fixed
#: seed: the same model gives the same choice).
RANGE_DRAWS = 64
#: A set is scaled only when its modelled noise drops by at least this much (dB): the modelled
#: per-tensor ranges err by their rms log error (the fit in docs/quantization_aware_scaling.md),
#: a few dB of noise power, so a smaller modelled gain is not told apart from none. The margin
#: sweep that chose it (TFLite per-channel on both real networks) is the generated table there
#: (``scripts/gen_int8_results.py --sweep``).
MIN_GAIN_DB = 2.0

_TINY = 1e-12
#: Candidates whose modelled noise differs by less than this (relative) are a tie, which the
#: earlier one wins (the identity first, then Nagel's scales): the model's O(C·O) term is
#: summed in float32 (:class:`ChainWeights`), good to ~1e-7.
_TIE = 1e-6


@dataclasses.dataclass(frozen=True)
class QuantTarget:
    """The quantizer that will run.

    Attributes:
        per_channel: one weight scale per output channel (TFLite's default) or per tensor.
        weight_bits: symmetric weight bits (8: steps of range/127).
        activation_bits: asymmetric activation bits (8: steps of range/255).
    """

    per_channel: bool = True
    weight_bits: int = 8
    activation_bits: int = 8

    @property
    def qw(self) -> float:
        return float(2 ** (self.weight_bits - 1) - 1)

    @property
    def qa(self) -> float:
        return float(2 ** self.activation_bits - 1)


@dataclasses.dataclass
class Junction:
    """The activation between two layers of a set, per channel, in unscaled units.

    Attributes:
        hi, lo: largest and smallest pre-activation value the calibration will see.
        kind: "linear" (nothing between), "relu" (uncapped), "relu6" (a ReLU6 that stays fused
            as it is while the set is not scaled and becomes a ClippedReLU when it is) or
            "clipped" (a ClippedReLU already); both capped kinds are one INT8 tensor whose
            range is that of the capped activation.
        cap: per-channel cap ("relu6", "clipped"), else None.
        mean_sq: ``E[x²]`` of the activation (after the cap).
        passing: fraction of positions where noise added before the activation passes it.
        positive: fraction of positions where the activation is not 0 (noise of a tensor
            after a ReLU exists only there).
        hi_draws, lo_draws: (draws, C) plausible values of ``hi`` and ``lo`` when they are
            uncertain (the data-free model); the per-tensor range is then the mean over draws
            of the max over channels. None: ``hi`` and ``lo`` are measured.
        per_input: measured junctions: how many values of each channel one input gives (its
            positions); None when not known (the data-free model, or values given without
            the inputs they came from).
    """

    hi: np.ndarray
    lo: np.ndarray
    kind: str
    cap: np.ndarray | None
    mean_sq: np.ndarray
    passing: np.ndarray
    positive: np.ndarray
    hi_draws: np.ndarray | None = None
    lo_draws: np.ndarray | None = None
    per_input: int | None = None

    @functools.cached_property
    def top(self) -> np.ndarray:
        """Top of the activation per channel (draws, C) or (C,), unscaled: ``hi`` after the
        ReLU and, for the capped kinds, the cap. A fused ReLU6, or a ClippedReLU: TFLite fuses
        the RELU into the producer and gives the MINIMUM's input the MINIMUM's own
        quantization (it requires equal scales), so the whole junction lives on one grid whose
        range is the calibrated max of the *capped* output."""
        hi = self.hi if self.hi_draws is None else self.hi_draws
        top = np.maximum(hi, 0.0)
        return top if self.cap is None or self.kind == "relu" else np.minimum(top, self.cap)


@dataclasses.dataclass
class ChainWeights:
    """Weights of a set, channel-aligned (C channels through the set).

    Attributes:
        r_first: (C,) output-channel ranges of the first layer.
        g_first: power gain of the first layer's weight noise (input power times fan-in).
        r_mid, d_mid, taps_mid: a triplet's depthwise kernel: per-channel range, sum of
            squares, number of taps (None for a pair).
        p_first: (C,) power of the first layer's output channels without bias (bounds the
            noise of weights rounded to zero); None: unbounded.
        r_last: (C, O) range of the last layer's weights from input channel i to output o.
        sq_last: (C, O) sum of squares of those weights (over taps), same dtype as ``r_last``;
            None for one tap per (i, o) (Dense, 1×1 convolutions), where it is ``r_last²``.
            :func:`chain_noise` computes with these two in their own dtype: the library
            passes float32 (half the memory traffic of the one O(C·O) pass per candidate;
            the modelled noise then agrees with float64 arrays to ~1e-7 relative), tests may
            pass float64.
        taps_last: kernel taps of the last layer per (input, output) channel pair.
        r_last_in: (C,) range of the last layer's weights per input channel, float64 (default:
            from ``r_last``; pass it from the kernel itself when ``r_last`` is a rounded copy).
    """

    r_first: np.ndarray
    g_first: float
    r_last: np.ndarray
    sq_last: np.ndarray | None
    taps_last: int
    r_mid: np.ndarray | None = None
    d_mid: np.ndarray | None = None
    taps_mid: int = 1
    p_first: np.ndarray | None = None
    r_last_in: np.ndarray | None = None

    def __post_init__(self):
        if self.r_last_in is None:
            self.r_last_in = self.r_last.max(axis=1).astype(np.float64)

    @functools.cached_property
    def q_last(self) -> np.ndarray:
        """(C,) power gain from input channel i to the last layer's output (float64)."""
        q = np.empty(self.r_last.shape[0])
        for rows in row_blocks(self.r_last.shape):
            q[rows] = self.sq_block(rows).sum(axis=1, dtype=np.float64)
        return q

    def sq_block(self, rows: slice) -> np.ndarray:
        """``SQ[rows]`` (a new array when ``sq_last`` is None)."""
        return np.square(self.r_last[rows]) if self.sq_last is None else self.sq_last[rows]


# ------------------------------------------------------------------------ statistics


def _clipped_second_moment(mu, sd, lo, hi):
    """``E[clip(X, lo, hi)²]`` for ``X ~ N(μ, σ²)``, lo <= 0 <= hi, elementwise."""
    mu, sd, lo, hi = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64)
                                           for v in (mu, sd, lo, hi)))
    sd = np.maximum(np.abs(sd), _TINY)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        a, b = (lo - mu) / sd, (hi - mu) / sd
        pa, pb = norm.pdf(a), norm.pdf(b)
        ca, cb = norm.cdf(a), norm.cdf(b)
        fa = np.where(np.isfinite(a), a * pa, 0.0)
        fb = np.where(np.isfinite(b), b * pb, 0.0)
        mid = (mu ** 2 + sd ** 2) * (cb - ca) + 2 * mu * sd * (pa - pb) + sd ** 2 * (fa - fb)
        lo_t = np.where(np.isfinite(lo), lo ** 2 * ca, 0.0)
        hi_t = np.where(np.isfinite(hi), hi ** 2 * (1 - cb), 0.0)
    return np.maximum(mid + lo_t + hi_t, 0.0)


def tail_z(positions: int) -> float:
    """How many standard deviations above its mean the max of ``positions`` values lies,
    for a Laplace distribution: ``ln(positions / 2) / √2``.

    The folded BN predicts each channel's mean and standard deviation well, but real
    pre-activations have heavier tails than a normal distribution: the per-tensor max lies
    well above the normal model's. A Laplace tail with the same standard deviation brings it
    to the measured max in the median over the BNs (measured on both real ImageNet networks by
    ``scripts/gen_int8_results.py --fit``, docs/quantization_aware_scaling.md).
    """
    return float(np.log(max(float(positions), 2.0) / 2.0) / np.sqrt(2.0))


def junction_from_bn(gamma, beta, kind, cap=None, positions=1):
    """Data-free :class:`Junction` from the folded BN of the layer before it.

    The pre-activation of channel ``i`` has mean ``β_i`` and standard deviation ``|γ_i|``
    (what the BN was trained to produce); its moments after the activation are those of
    ``N(β_i, γ_i²)``. Its calibrated range is the max of ``positions`` values (spatial
    positions per sample times :data:`ASSUMED_CALIBRATION_SAMPLES`) under a heavier, Laplace
    tail (:func:`tail_z`), with a per-channel error whose spread is
    :data:`RANGE_LOG_SPREAD` (``hi``, ``lo``: its median; ``hi_draws``, ``lo_draws``:
    :data:`RANGE_DRAWS` draws), the exact cap on top.
    """
    gamma = np.abs(np.asarray(gamma, dtype=np.float64))
    beta = np.asarray(beta, dtype=np.float64)
    z = tail_z(positions * ASSUMED_CALIBRATION_SAMPLES) * np.exp(RANGE_LOG_BIAS)
    hi, lo = beta + z * gamma, beta - z * gamma
    eps = np.random.default_rng(0).standard_normal((RANGE_DRAWS,) + beta.shape)
    zd = z * np.exp(RANGE_LOG_SPREAD * eps)
    hi_draws, lo_draws = beta + zd * gamma, beta - zd * gamma
    sd = np.maximum(gamma, _TINY)
    if kind == "linear":
        ms = beta ** 2 + gamma ** 2
        passing = positive = np.ones_like(beta)
        capv = None
    else:
        capv = None if cap is None else np.broadcast_to(
            np.asarray(cap, dtype=np.float64), beta.shape).copy()
        top = np.inf if capv is None else capv
        ms = _clipped_second_moment(beta, sd, 0.0, top)
        positive = norm.sf(-beta / sd)
        passing = positive - (0.0 if capv is None else norm.sf((capv - beta) / sd))
    return Junction(hi, lo, kind, capv, ms, passing, positive, hi_draws, lo_draws)


class SampleStats:
    """Per-channel running statistics of a junction's pre-activations, batch by batch.

    Args:
        kind, cap: the junction's activation (see :class:`Junction`).
    """

    def __init__(self, kind, cap=None):
        self.kind, self.cap = kind, cap
        self.n = self.inputs = 0
        self.hi = self.lo = self.sq = self.pos = self.passing = None

    def update(self, pre):
        """Add values ``pre`` of shape (N, C). The values keep their float type (max, min and
        counts are exact in it); the squares are summed in float64."""
        pre = np.asarray(pre)
        if pre.dtype not in (np.float32, np.float64):
            pre = pre.astype(np.float64)
        positive = pre > 0
        if self.kind == "linear":
            post, passing = pre, positive
        elif self.cap is None:
            post, passing = np.maximum(pre, pre.dtype.type(0)), positive
        else:
            cap = np.asarray(self.cap, dtype=pre.dtype)
            post = np.clip(pre, pre.dtype.type(0), cap)
            passing = positive & (pre < cap)
        squares = np.square(post, out=None if post is pre else post)
        return self.add(pre.max(axis=0), pre.min(axis=0), squares.sum(axis=0, dtype=np.float64),
                        positive.sum(axis=0), passing.sum(axis=0), pre.shape[0])

    def add(self, hi, lo, sq, positive, passing, n, inputs=None):
        """Add the per-channel sums of ``n`` values computed elsewhere (e.g. by the backend,
        next to the values: :func:`cle._transforms.plan.measure_junctions`): their max and
        min, the sum of the squares after the activation, how many were positive and how many
        passed the activation (positive and below the cap); ``inputs``: how many model inputs
        gave them (the junction then knows its values per input, ``Junction.per_input``)."""
        stats = [np.asarray(v, dtype=np.float64) for v in (hi, lo, sq, positive, passing)]
        if self.n == 0:
            self.hi, self.lo, self.sq, self.pos, self.passing = stats
        else:
            self.hi = np.maximum(self.hi, stats[0])
            self.lo = np.minimum(self.lo, stats[1])
            self.sq, self.pos, self.passing = (
                self.sq + stats[2], self.pos + stats[3], self.passing + stats[4])
        self.n += int(n)
        self.inputs = None if inputs is None or self.inputs is None else self.inputs + inputs
        return self

    def junction(self) -> Junction:
        capv = None if self.cap is None else np.broadcast_to(
            np.asarray(self.cap, dtype=np.float64), self.hi.shape).copy()
        ones = np.ones(self.hi.shape)
        per_input = self.n // self.inputs if self.inputs else None
        if self.kind == "linear":
            return Junction(self.hi, self.lo, self.kind, None, self.sq / self.n, ones, ones,
                            per_input=per_input)
        return Junction(self.hi, self.lo, self.kind, capv, self.sq / self.n,
                        self.passing / self.n, self.pos / self.n, per_input=per_input)


def junction_from_samples(pre, kind, cap=None):
    """:class:`Junction` from measured pre-activations ``pre`` of shape (N, C): the range is
    their max (what TFLite's calibration takes), the moments their means."""
    return SampleStats(kind, cap).update(pre).junction()


# ------------------------------------------------------------------------ noise


def tensor_range(j: Junction, s: np.ndarray):
    """``(range, per-channel pass factor)`` of the tensor TFLite quantizes at a junction whose
    activation is divided by ``s``."""
    def expected_max(v):  # per-tensor max, averaged over the draws when uncertain
        return float(np.mean(np.max(v, axis=-1)))

    if j.kind == "linear":
        hi = j.hi if j.hi_draws is None else j.hi_draws
        lo = j.lo if j.lo_draws is None else j.lo_draws
        rng = max(expected_max(hi / s), 0.0) - min(-expected_max(-lo / s), 0.0)
        return rng, j.passing
    return max(expected_max(j.top / s), 0.0), j.positive


def chain_noise(w: ChainWeights, junctions, scales, target: QuantTarget, stop_at=np.inf):
    """Modelled quantization noise power at the output of the set's last layer.

    Args:
        w: the set's weights.
        junctions: one :class:`Junction` per junction (1 for a pair, 2 for a triplet).
        scales: one array ``s_k`` per junction.
        target: the quantizer.
        stop_at: if the parts other than the last layer's weights already reach it, that
            part (the one O(C·O) term) is not evaluated: the total returned is then only a
            lower bound, ``>= stop_at``, and ``parts`` has no "weights_last".

    Rounding noise of a value is ``Δ²/12`` as long as the step is small against the value;
    a step far above it rounds the value to zero, so each channel's noise is bounded by its
    own power (what makes a far too coarse step cost the channel's signal, not more).

    Returns:
        ``(total, parts)``: the total and a dict of its parts.
    """
    qw, qa = target.qw, target.qa
    s_last = scales[-1]
    # Gain from a junction's (scaled) activation channel to the last layer's output.
    gains = [None] * len(junctions)
    gains[-1] = s_last ** 2 * w.q_last
    if len(junctions) == 2:
        gains[0] = scales[0] ** 2 * w.d_mid * junctions[1].passing * w.q_last
    parts = {}
    # First layer's weights (noise before junction 1's activation).
    r0 = w.r_first / scales[0]
    d0 = r0 / qw if target.per_channel else np.full_like(r0, np.max(r0) / qw)
    n0 = d0 ** 2 / 12 * w.g_first
    if w.p_first is not None:
        n0 = np.minimum(n0, w.p_first / scales[0] ** 2)
    parts["weights_first"] = float(np.sum(n0 * junctions[0].passing * gains[0]))
    # Activations.
    act = 0.0
    for j, s, g in zip(junctions, scales, gains):
        power = j.mean_sq / s ** 2
        rng, factor = tensor_range(j, s)
        act += float(np.sum(np.minimum((rng / qa) ** 2 / 12, power) * factor * g))
    parts["activations"] = act
    # Depthwise weights of a triplet (noise before junction 2's activation).
    if len(junctions) == 2:
        s12, s23 = scales
        rm = w.r_mid * s12 / s23
        dm = rm / qw if target.per_channel else np.full_like(rm, np.max(rm) / qw)
        power_in = w.taps_mid * junctions[0].mean_sq / s12 ** 2
        parts["weights_mid"] = float(np.sum(dm ** 2 / 12 * power_in * junctions[1].passing
                                            * gains[1]))
    if sum(parts.values()) >= stop_at:
        return sum(parts.values()), parts
    # Last layer's weights: per (input i, output o), taps weights with step Δ_o, each
    # bounded by its own square, times the input power E[x_i²]/s_i² of channel i:
    #   Σ_io E[x_i²]/s_i² · min(taps·Δ_o²/12, SQ_io·s_i²) = Σ_i E[x_i²] Σ_o min(taps·Δ_o²/(12 s_i²), SQ_io).
    parts["weights_last"] = _last_weights_noise(w, s_last, junctions[-1].mean_sq, target)
    return sum(parts.values()), parts


def row_blocks(shape, elements=1 << 16):
    """Slices of rows of a (C, O) array, about ``elements`` at a time (a block's temporaries
    stay in the cache and never cost a whole (C, O) array)."""
    step = max(1, elements // max(1, shape[1]))
    return [slice(a, min(a + step, shape[0])) for a in range(0, shape[0], step)]


def _last_weights_noise(w: ChainWeights, s_last, mean_sq, target: QuantTarget) -> float:
    """The last layer's weight noise (see :func:`chain_noise`): the model's one O(C·O) term,
    evaluated per candidate. Computed in the arrays' own dtype block of rows by block of rows
    (a max over the rows for the steps, then each row's sum), each row summed in one piece
    and the rows summed in float64."""
    r, dt = w.r_last, w.r_last.dtype
    s = s_last.astype(dt)
    blocks = row_blocks(r.shape)
    buf = np.empty((blocks[0].stop - blocks[0].start, r.shape[1]), dt) if blocks else None
    top = np.zeros(r.shape[1], dt)
    for rows in blocks:
        t = np.multiply(r[rows], s[rows, None], out=buf[: rows.stop - rows.start])
        np.maximum(top, t.max(axis=0), out=top)
    dl = top.astype(np.float64) / target.qw
    if not target.per_channel:
        dl = np.full_like(dl, dl.max(initial=0.0))
    x = (1.0 / s_last ** 2).astype(dt)
    c = (w.taps_last * dl ** 2 / 12).astype(dt)
    per_row = np.empty(r.shape[0])
    for rows in blocks:
        t = np.multiply(x[rows, None], c[None, :], out=buf[: rows.stop - rows.start])
        np.minimum(t, w.sq_block(rows), out=t)
        per_row[rows] = t.sum(axis=1)
    return float(mean_sq @ per_row)


# ------------------------------------------------------------------------ choice


def _log(x):
    return np.log(np.maximum(np.asarray(x, dtype=np.float64), _TINY))


def _balanced_logs(w: ChainWeights, junctions, alpha: float):
    """Per channel, the log-scales ``l_k`` that make the set's log-ranges after scaling as
    equal as possible (weighted least squares; activation ranges weigh ``alpha``)."""
    acts = [_log(np.maximum(np.maximum(j.hi, -j.lo), _TINY)) for j in junctions]
    k = len(junctions)
    # Items: (coefficients on l_1..l_k, constant, weight). Value after scaling = c·l + v.
    items = [(np.eye(k)[0] * -1, _log(w.r_first), 1.0 - alpha), (np.eye(k)[0] * -1, acts[0], alpha)]
    if k == 2:
        items += [(np.array([1.0, -1.0]), _log(w.r_mid), 1.0 - alpha),
                  (np.array([0.0, -1.0]), acts[1], alpha)]
    items.append((np.eye(k)[-1], _log(w.r_last_in), 1.0))
    items = [it for it in items if it[2] > 0]
    # Unknowns [l_1..l_k, m]: minimize Σ w (c·l + v − m)² per channel.
    n = len(items)
    a = np.zeros((n, k + 1))
    for row, (c, _, wt) in enumerate(items):
        a[row, :k] = c * np.sqrt(wt)
        a[row, k] = -np.sqrt(wt)
    v = np.stack([-it[1] * np.sqrt(it[2]) for it in items])  # (n, C)
    sol, *_ = np.linalg.lstsq(a, v, rcond=None)  # (k+1, C)
    return [sol[i] for i in range(k)]


@dataclasses.dataclass
class Choice:
    """The outcome of :func:`choose_scales`."""

    scales: list  # one array per junction
    noise_before: float
    noise_after: float  # noise_before when no candidate cleared the gain asked for
    alpha: float | None  # None: identity or Nagel's scales
    lam: float


def _silent(j: Junction) -> np.ndarray:
    """Per channel, whether the junction's activation is 0 wherever it was measured (a ReLU
    that never fires on the calibration data, a channel of zeros). Such a channel keeps scale
    1: the balance of log-ranges reads its range as 0 and amplified it without bound (a
    hundred-thousandfold), and the one input in many that did fire it then set the tensor's
    range, every other channel's values a step or less of it (a file of one constant output,
    from a small classifier of a failure hunt)."""
    if j.hi_draws is not None:  # the data-free model: no channel is measured silent
        return np.zeros(np.shape(j.hi), bool)
    top = np.asarray(j.hi, np.float64) if j.kind != "linear" else np.maximum(
        np.asarray(j.hi, np.float64), -np.asarray(j.lo, np.float64))
    return top <= 0.0


def choose_scales(w: ChainWeights, junctions, target: QuantTarget, extra=(), min_gain_db=0.0):
    """The candidate scales with the least modelled noise, if it is at least ``min_gain_db``
    below the identity's; else the identity (which also wins ties).

    Args:
        w, junctions, target: as for :func:`chain_noise`.
        extra: more candidates (lists of per-junction arrays), e.g. Nagel's weight
            equalization.
        min_gain_db: the least gain (dB) that counts.

    A candidate's last-layer term, the model's one O(C·O) part, is evaluated only while the
    candidate can still matter: when its other parts alone reach the best noise so far or the
    noise the gain asks for, it can be neither the best nor a gain (most candidates on
    networks whose sets are left, e.g. every one of ResNet50's), and the choice is exactly
    what evaluating everything would give.

    Returns:
        :class:`Choice`.
    """
    c = w.r_first.shape[0]
    ident = [np.ones(c) for _ in junctions]
    base, _ = chain_noise(w, junctions, ident, target)
    need = base * 10 ** (-float(min_gain_db) / 10)  # at most this noise is a gain
    best = Choice(ident, base, base, None, 0.0)
    candidates = [(None, 1.0, [np.asarray(e, dtype=np.float64) for e in cand])
                  for cand in extra]
    for alpha in ALPHAS:
        logs = _balanced_logs(w, junctions, alpha)
        for lam in LAMBDAS:
            candidates.append((alpha, lam, [np.exp(lam * lg) for lg in logs]))
    dead = [_silent(j) for j in junctions]
    for alpha, lam, scales in candidates:
        scales = [np.where(np.isfinite(s) & (s > 0) & ~d, s, 1.0) for s, d in zip(scales, dead)]
        beat = best.noise_after * (1 - _TIE)
        noise, _ = chain_noise(w, junctions, scales, target, stop_at=min(beat, need))
        if noise < beat and noise <= need:
            best = Choice(scales, base, noise, alpha, lam)
    return best
