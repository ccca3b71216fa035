"""The range of a model's inputs, found from the model itself (no data).

Quantizing without data needs the range the model's input tensor holds: it is the input's
quantization range, and the synthetic inputs must stay in it. A model knows it in two ways,
tried in this order for each input:

1. **Preprocessing layers.** From the input, the chain of single-input, shape-keeping layers
   without kernels (``Rescaling``, ``Normalization``, keras.applications' built-in
   preprocessing, weightless elementwise operations) is probed numerically: with ``g`` the
   longest prefix of the chain that is affine (``g(x1 + x2) + g(0) = g(x1) + g(x2)`` on random
   inputs), ``b = g(0)`` and column ``c`` of ``A`` is ``g(e_c) − b`` (spatial means). Such a
   chain exists to map pixel values to a normalized range, so each candidate input range
   (0..255, [0, 1], [−1, 1]) is scored by what the chain makes of it: about unit scale around
   0 (``|log(width / 2.5)| + max(0, |centre| − width/2) / width``). The best candidate is taken
   when it scores :data:`PRE_MARGIN` better than the next. First, a chain that scales every
   channel alike and maps 0 to the lower end of [0, 1] or [−1, 1] gives ``[0, top]``, what it
   maps onto that range, where ``top`` is no candidate's (raw counts 0..16 through
   ``Rescaling(1/16)``: :func:`_from_zero`).
2. **The first batch norm** whose input depends on this input alone, when the path ``f`` to it
   is affine (a ReLU on the way makes it "cannot tell"). Its moving mean is, per channel,
   ``μ_o = h_o + Σ_c G[c, o] m_c`` (``h``, ``G``: spatial means of ``f(0)`` and of
   ``f(e_c) − f(0)``, padding and stride included): a weighted least-squares fit gives the
   input's per-channel mean ``m``. For the scale, the input is modelled as ``x = a·p + b_c``
   with ``p`` pixels of natural images (:func:`natural_images`: ImageNet's mean and *pooled*
   standard deviation, channel correlation 0.9, a 1/f amplitude spectrum): each channel's
   moving variance gives ``a`` from ``σ²_o = a²·v_o + β_o`` (``v_o`` the variance of ``f``'s
   linear part on the fields, ``β_o`` the spread of ``f(m)`` over positions); ``a`` is their
   median in log space. The fitted range ``[min b, max(b + 255·a)]`` is then snapped to the
   usual conventions (:data:`CONVENTIONS`; a one-channel input only to those that treat every
   channel alike) by ``|log(w / w_k)| + |c − c_k| / w_k`` (width,
   centre), among the conventions that cover the fitted range (a convention narrower than
   what the statistics say would clip real inputs): the nearest within :data:`SNAP_MAX`,
   :data:`SNAP_MARGIN` ahead of the next; two close ones give their union, none the fitted
   range widened by :data:`UNSURE_PAD` of its width (both "unsure").
3. Neither: the range cannot be told.

The pooled standard deviation matters: the familiar ImageNet std (0.229, 0.224, 0.225) is an
average of per-image deviations and leaves out the variance between images, which a BN's
moving variance includes; with it the fitted scale came out too large on both real ImageNet
networks.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np

from cle._core.graph import graph_view, run_call
from cle._core.inputs import input_names
from cle._measure import bn_moments

__all__ = ["CONVENTIONS", "InputRange", "SPREAD", "bn_fit", "convention_range", "image_axis",
           "infer_input_ranges", "natural_images", "natural_inputs", "snap", "spread_inputs"]

#: Natural-image pixel statistics (ImageNet's, RGB 0..255): mean and *pooled* std.
PIXEL_MEAN = np.array([0.485, 0.456, 0.406]) * 255.0
PIXEL_STD = np.array([0.272, 0.264, 0.276]) * 255.0
CHANNEL_CORRELATION = 0.9
BETWEEN_IMAGE_SHARE = 0.25
#: The spread of the contrast between the synthetic inputs (the standard deviation of the log
#: of each image's contrast factor): photos differ in contrast, a flat patch of sky from a
#: textured one, and models that normalize an image or a patch (a LayerNormalization over
#: positions, a Dense over a map's pixels) meet on flat ones values that fields of one contrast
#: never reach. Set so that the fields spread like whole photos at every size, less than small
#: crops of a photo (``benchmarks/bench_contrast.py`` measures all three on the photo pool of
#: ``benchmarks/photo_pool.py``); a wider spread cost more on models that need none than it
#: gained on those that do (CHANGELOG.md).
CONTRAST_SPREAD = 0.4
#: Candidate input ranges of a preprocessing chain, and the score margin to take the best.
PRE_CANDIDATES = {"0..255": (0.0, 255.0), "[0, 1]": (0.0, 1.0), "[-1, 1]": (-1.0, 1.0)}
PRE_MARGIN = 1.0
_M, _S = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
#: The conventions of keras.applications' preprocessing and others:
#: ``x[..., c] = p[..., perm[c]] * scale[c] + offset[c]`` for RGB pixels ``p`` in 0..255.
CONVENTIONS = {
    "raw (0..255)": (np.ones(3), np.zeros(3), (0, 1, 2)),
    "[0, 1]": (np.full(3, 1 / 255), np.zeros(3), (0, 1, 2)),
    "tf ([-1, 1])": (np.full(3, 1 / 127.5), np.full(3, -1.0), (0, 1, 2)),
    "torch (ImageNet mean/std)": (1 / (255 * _S), -_M / _S, (0, 1, 2)),
    "caffe (BGR minus the ImageNet mean)": (np.ones(3), -np.array([103.939, 116.779, 123.68]),
                                            (2, 1, 0)),
}
SNAP_MAX, SNAP_MARGIN = 0.6, 0.25
#: How far (share of a convention's width) the fitted range may pass a convention's ends.
COVER_TOL = 0.06
UNSURE_PAD = 0.1
#: Natural-image fields per variance estimate; their size when the input's is free.
N_FIELDS, FREE_SIZE = 16, 64


def convention_range(name) -> tuple[float, float]:
    """``(lo, hi)`` a convention of :data:`CONVENTIONS` gives to pixels 0..255."""
    s, o, _ = CONVENTIONS[name]
    ends = np.stack([o, 255 * s + o])
    return float(ends.min()), float(ends.max())


@dataclasses.dataclass
class InputRange:
    """The range of one model input and where it came from.

    Attributes:
        name: the input's name.
        lo, hi: the range (NaN when it cannot be told).
        source: where it came from, in words (``"stated"``, ``"preprocessing layers ..."``,
            ``"the first batch norm ..."``, or why it cannot be told).
        sure: False for a guess the user should confirm (an unsure fit).
        convention: the named convention it matches (a key of :data:`CONVENTIONS`, or of
            :data:`PRE_CANDIDATES` for a preprocessing chain), else None.
        note: a doubt about a stated range (the model says otherwise), else None.
    """

    name: str
    lo: float
    hi: float
    source: str
    sure: bool = True
    convention: str | None = None
    note: str | None = None

    @property
    def known(self) -> bool:
        return bool(np.isfinite(self.lo) and np.isfinite(self.hi))

    def to_dict(self) -> dict:
        return {"input": self.name, "range": [self.lo, self.hi], "source": self.source,
                "sure": self.sure, "convention": self.convention}


# ---------------------------------------------------------------------- natural images


def natural_images(n, height, width, channels=3, seed=0, contrast_spread=0.0) -> np.ndarray:
    """``(n, height, width, channels)`` Gaussian random fields with the second-order
    statistics of natural images in pixel units (0..255 scale, not clipped): a 1/f amplitude
    spectrum, channels correlated, a share of the variance between images, the pooled
    ImageNet mean and std (one channel: their average); with ``contrast_spread``, each image's
    deviations from its mean scaled by a log-normal factor of that spread (renormalized: the
    pooled statistics and the share of the variance between images kept, before any
    clipping)."""
    rng = np.random.default_rng(seed)
    fy = np.fft.fftfreq(height)[:, None]
    fx = np.fft.fftfreq(width)[None, :]
    f = np.sqrt(fx ** 2 + fy ** 2)
    amp = np.where(f > 0, 1.0 / np.maximum(f, 1e-9), 0.0)
    fields = np.fft.ifft2(np.fft.fft2(rng.standard_normal((n, channels, height, width))) * amp).real
    fields /= fields.std()
    dc = rng.standard_normal((n, channels, 1, 1))
    if contrast_spread:  # drawn after the fields: with none, the same fields as before
        contrast = np.exp(contrast_spread * rng.standard_normal((n, 1, 1, 1)))
        fields *= contrast / np.sqrt(np.mean(contrast ** 2))
    fields = np.sqrt(1 - BETWEEN_IMAGE_SHARE) * fields + np.sqrt(BETWEEN_IMAGE_SHARE) * dc
    corr = np.full((channels, channels), CHANNEL_CORRELATION) + (
        1 - CHANNEL_CORRELATION) * np.eye(channels)
    fields = np.einsum("ij,njhw->nhwi", np.linalg.cholesky(corr), fields)
    fields = (fields - fields.mean(axis=(0, 1, 2))) / fields.std(axis=(0, 1, 2))
    mean, std = _pixel_stats(channels)
    return fields * std + mean


def _pixel_stats(channels):
    if channels == 3:
        return PIXEL_MEAN, PIXEL_STD
    return np.full(channels, PIXEL_MEAN.mean()), np.full(channels, PIXEL_STD.mean())


def image_axis(shape) -> int | None:
    """The channel axis (of a batch: -1 or 1) of an image-like sample shape (rank 3 with 1 or
    3 channels), else None."""
    if len(shape) != 3:
        return None
    if shape[-1] in (1, 3):
        return -1
    if shape[0] in (1, 3):
        return 1
    return None


def _layout(shape, axis):
    """``(height, width, channels)`` of an image-like sample shape."""
    return (shape[0], shape[1], shape[2]) if axis == -1 else (shape[1], shape[2], shape[0])


def _from_last(x, axis):
    """A batch of channels-last images in the layout of ``axis``."""
    return x if axis == -1 else np.moveaxis(x, -1, 1)


def _concrete(shape):
    return tuple(FREE_SIZE if d is None else int(d) for d in shape)


def natural_inputs(n, shape, rng_info, seed=0) -> np.ndarray:
    """``n`` float32 inputs of sample ``shape`` spread across an input's range: for an
    image-like input, natural-image fields of :data:`CONTRAST_SPREAD` (clipped to 0..255) put
    through the input's named convention, or mapped linearly onto ``[lo, hi]``; otherwise
    uniform in ``[lo, hi]``.

    Args:
        rng_info: an :class:`InputRange`, or ``(lo, hi)``.
    """
    if isinstance(rng_info, InputRange):
        lo, hi, convention = rng_info.lo, rng_info.hi, rng_info.convention
    else:
        (lo, hi), convention = rng_info, None
    shape = _concrete(shape)
    axis = image_axis(shape)
    if axis is None:
        return np.random.default_rng(seed).uniform(lo, hi, (n,) + shape).astype(np.float32)
    h, w, c = _layout(shape, axis)
    p = np.clip(natural_images(n, h, w, c, seed=seed, contrast_spread=CONTRAST_SPREAD), 0.0, 255.0)
    if convention in CONVENTIONS and c == 3:
        s, o, perm = CONVENTIONS[convention]
        x = p[..., list(perm)] * s + o
    else:
        x = lo + (hi - lo) * p / 255.0
    return _from_last(np.clip(x, lo, hi), axis).astype(np.float32)


# ------------------------------------------------------------------------- the graph


class _Graph:
    """The model's graph view, which inputs each tensor depends on, and eager evaluation of
    any tensor from one input (layers called on values: no node is added to the model)."""

    def __init__(self, model):
        self.view = graph_view(model)
        self.deps = {id(t): {i} for i, t in enumerate(self.view.inputs)}
        for call in self.view.calls:
            d = set().union(*(self.deps.get(id(t), set()) for t in call.inputs))
            for t in call.outputs:
                self.deps[id(t)] = d

    def function(self, index, target):
        """``f(x) -> target's value`` (float64 numpy) for values ``x`` of input ``index``."""
        view, needed, stack = self.view, set(), [target.producer]
        while stack:
            call = stack.pop()
            if call is not None and id(call) not in needed:
                needed.add(id(call))
                stack.extend(t.producer for t in call.inputs)
        order = [c for c in view.calls if id(c) in needed]

        def f(x):
            values = {id(view.inputs[index]): keras.ops.convert_to_tensor(
                np.asarray(x, np.float32))}
            for call in order:
                outs = run_call(call, [values[id(t)] for t in call.inputs])
                values.update((id(t), v) for t, v in zip(call.outputs, outs))
            return np.asarray(keras.ops.convert_to_numpy(values[id(target)]), np.float64)
        return f


def _is_affine(f, shape, rng, tol=1e-3):
    """``(ok, error)``: ``f(x1 + x2) + f(0) = f(x1) + f(x2)`` on random inputs of scale 1 and
    100, within ``tol`` of the output's size."""
    f0 = f(np.zeros((1,) + shape))
    worst = 0.0
    for scale in (1.0, 100.0):
        x1 = rng.standard_normal((2,) + shape) * scale + scale
        x2 = rng.standard_normal((2,) + shape) * scale
        rhs = f(x1) + f(x2)
        lhs = f(x1 + x2) + f0
        worst = max(worst, float(np.abs(lhs - rhs).max() / (np.abs(rhs - 2 * f0).max() + 1e-12)))
    return worst < tol, worst


def _channel_means(y, axis):
    y = np.moveaxis(y, axis, -1)
    return y.reshape(y.shape[0], -1, y.shape[-1]).mean(axis=1)


def _constant_probes(f, shape, axis):
    """``(h, G)``: spatial means of ``f(0)`` and of ``f(e_c) − f(0)`` per input channel."""
    c = _layout(shape, axis)[2]
    probes = np.zeros((c + 1,) + shape)
    for i in range(c):
        index = [i + 1] + [slice(None)] * len(shape)
        index[axis] = i
        probes[tuple(index)] = 1.0
    return f(probes), c


# ---------------------------------------------------------------- preprocessing chain


#: Layers that crop or resize the spatial axes and keep each channel's values: the chain
#: passes through them (a constant image stays the same constant), where a shape kept is
#: asked of any other step (hunt11: a CenterCrop before Rescaling(1/255) ended the chain, and
#: a model cle takes without data was refused for an unknown input range).
SPATIAL = (keras.layers.CenterCrop, keras.layers.Resizing, keras.layers.Cropping1D,
           keras.layers.Cropping2D, keras.layers.Cropping3D)


def _is_preprocessing(call, tensor):
    layer = call.layer
    if len(call.inputs) != 1 or len(call.outputs) != 1:
        return False
    out = call.outputs[0].shape
    if out != tensor.shape and not (isinstance(layer, SPATIAL) and len(out) == len(tensor.shape)
                                    and out[-1] == tensor.shape[-1]):
        return False
    if isinstance(layer, keras.layers.Layer):
        if isinstance(layer, (keras.layers.BatchNormalization, keras.layers.ZeroPadding2D)):
            return False
        if any(w.trainable for w in layer.weights) or hasattr(layer, "kernel"):
            return isinstance(layer, keras.layers.Normalization)
    return True


def _chain(graph, index):
    """The tensors that end each step of the preprocessing chain from input ``index``, and a
    name for each step."""
    t, ends, names = graph.view.inputs[index], [], []
    while (call := _step(t)) is not None:
        t = call.outputs[0]
        ends.append(t)
        names.append(f"{type(call.layer).__name__} '{call.layer.name}'")
    return ends, names


def _step(t):
    """The preprocessing call that takes ``t`` next: its one reader, or the first of several
    readers that are one step repeated (each member of an ensemble rescaling the input alike:
    hunt13's ``Average`` of three classifiers was refused for an unknown input range)."""
    calls = t.consumers
    if not calls or not all(_is_preprocessing(c, t) for c in calls):
        return None
    return calls[0] if all(_same_step(c, calls[0]) for c in calls[1:]) else None


def _same_step(a, b) -> bool:
    """Whether calls ``a`` and ``b`` compute the same function: layers of one class and one
    configuration (but their names), without weights."""
    la, lb = a.layer, b.layer
    if type(la) is not type(lb) or getattr(la, "weights", None) or getattr(lb, "weights", None):
        return False
    try:
        ca, cb = dict(la.get_config()), dict(lb.get_config())
    except (AttributeError, NotImplementedError):
        return False
    ca.pop("name", None), cb.pop("name", None)
    return ca == cb


def _chain_score(A, b, lo, hi):
    corners = np.stack([A @ np.full(A.shape[1], lo) + b, A @ np.full(A.shape[1], hi) + b])
    out_lo, out_hi = corners.min(axis=0), corners.max(axis=0)
    width = np.maximum(out_hi - out_lo, 1e-12)
    centre = (out_hi + out_lo) / 2
    s = np.abs(np.log(width / 2.5)) + np.maximum(0.0, np.abs(centre) - width / 2) / width
    return float(np.mean(s))


def _from_zero(A, b):
    """``(top, "[0, 1]" or "[-1, 1]")`` when the affine chain ``A x + b`` scales each channel
    alike (a diagonal ``A``, one positive scale) and maps 0 to the lower end of [0, 1] or of
    [−1, 1]: the input range is then ``[0, top]``, the values the chain maps onto that range
    (``Rescaling(1/16)`` on raw counts 0..16: the candidates' scores would take 0..255 for
    them, and every activation range came out over ten times too wide). Else None."""
    scale = np.diag(A)
    if not (scale > 0).all() or not np.allclose(A, np.diag(scale), atol=1e-6 * scale.max()):
        return None
    if not np.isclose(scale.min(), scale.max(), rtol=1e-3):
        return None
    for low, target in ((0.0, "[0, 1]"), (-1.0, "[-1, 1]")):
        if np.allclose(b, low, atol=1e-6 * max(1.0, abs(low))):
            return float((1.0 - low) / scale.mean()), target
    return None


def _zero_based(graph, index, shape, axis, name, rng, layers, top, onto):
    """The input range a chain :func:`_from_zero` read gives: ``[0, top]``; but a chain that
    maps 0 to 0 maps ``[-top, top]`` onto [−1, 1] as well (``Rescaling(1/80)`` on a spectrogram
    in decibels, −80..0), and the first batch norm's fit (:func:`bn_fit`) decides between the
    two by the centre it fits (the fit's centre, from the moving means, is surer than its
    width on inputs unlike photos: raw digit counts fit [−7, 20]); without one the range is a
    guess ("unsure", refused as any guess is)."""
    said = f"its preprocessing layers ({layers}) map [0, {top:.4g}] onto {onto}"
    if onto != "[0, 1]":
        return InputRange(name, 0.0, top, said)
    fit, why, _ = bn_fit(graph, index, shape, axis, rng)
    if fit is None:
        return InputRange(name, -top, top, f"{said} and [-{top:.4g}, {top:.4g}] onto [-1, 1], "
                          f"and {why}", sure=False)
    if (fit[0] + fit[1]) / 2 < top / 4:  # the centre nearer [-top, top]'s than [0, top]'s
        return InputRange(name, -top, top, f"its preprocessing layers ({layers}) map "
                          f"[-{top:.4g}, {top:.4g}] onto [-1, 1] (its first batch norm's "
                          f"statistics fit [{fit[0]:.3g}, {fit[1]:.3g}])")
    return InputRange(name, 0.0, top, f"{said} (its first batch norm's statistics fit "
                      f"[{fit[0]:.3g}, {fit[1]:.3g}])")


def _chain_answer(graph, index, shape, axis, name, rng):
    ends, names = _chain(graph, index)
    for k in range(len(ends), 0, -1):
        f = graph.function(index, ends[k - 1])
        if _is_affine(f, shape, rng)[0]:
            break
    else:
        return None
    y, c = _constant_probes(f, shape, axis)
    means = _channel_means(y, axis)
    b, A = means[0], (means[1:] - means[0]).T
    if A.shape[0] != c or (np.allclose(A, np.eye(c), atol=1e-6) and np.allclose(b, 0, atol=1e-6)):
        return None  # the identity, or a chain that changes the channels: says nothing
    layers = " → ".join(names[:k])
    top = _from_zero(A, b)
    if top is not None and not any(np.isclose(top[0], hi, rtol=0.01)
                                   for lo, hi in PRE_CANDIDATES.values()):
        return _zero_based(graph, index, shape, axis, name, rng, layers, *top)
    scores = {cand: _chain_score(A, b, *r) for cand, r in PRE_CANDIDATES.items()}
    order = sorted(scores, key=scores.get)
    if scores[order[1]] - scores[order[0]] < PRE_MARGIN:
        return None
    lo, hi = PRE_CANDIDATES[order[0]]
    return InputRange(name, lo, hi, f"its preprocessing layers ({layers}) expect {order[0]}",
                      convention=order[0])


# ---------------------------------------------------------------- first batch norm


def _first_batch_norm(graph, index):
    for call in graph.view.calls:
        if (isinstance(call.layer, keras.layers.BatchNormalization)
                and graph.view.n_calls(call.layer) == 1
                and graph.deps.get(id(call.inputs[0])) == {index}):
            return call
    return None


def bn_fit(graph, index, shape, axis, rng, seed=0):
    """The fitted range of input ``index`` from its first batch norm (module docstring), as
    ``((lo, hi), note, bn_name)``, or ``(None, why, bn_name)``. The batch norm's statistics
    are read with their start taken out (:func:`cle._measure.bn_moments.moments`); ``note``
    says so where it was, else it is empty."""
    call = _first_batch_norm(graph, index)
    if call is None:
        return None, "no batch norm depends on this input alone", None
    bn = call.layer
    f = graph.function(index, call.inputs[0])
    ok, _ = _is_affine(f, shape, rng)
    if not ok:
        return None, (f"the path to its first batch norm '{bn.name}' is not linear (it "
                      "passes an activation)"), bn.name
    bn_axis = bn.axis if isinstance(bn.axis, int) else bn.axis[0]
    steps = bn_moments.training_steps(graph.view.model)
    mu, var, w = bn_moments.moments(bn, steps)
    sd = np.sqrt(var + 1e-12)
    y, c = _constant_probes(f, shape, axis)
    means = _channel_means(y, bn_axis)
    h, G = means[0], means[1:] - means[0]  # (C_out,), (C_in, C_out)
    m, *_ = np.linalg.lstsq((G / sd).T, (mu - h) / sd, rcond=None)
    h_, w_, _ = _layout(shape, axis)
    p = natural_images(N_FIELDS, h_, w_, c, seed=seed)
    p = _from_last(p - p.reshape(-1, c).mean(axis=0), axis)
    v = _channel_var(f(p) - f(np.zeros((1,) + shape)), bn_axis)
    m_img = np.broadcast_to(_from_last(m.reshape(1, 1, 1, -1), axis), (1,) + shape)
    beta = _channel_var(f(m_img), bn_axis)
    keep = (var - beta > 0) & (v > 1e-12 * max(v.max(), 1e-300))
    if not keep.any():
        return None, f"the statistics of batch norm '{bn.name}' say nothing of the input", bn.name
    a = float(np.exp(np.median(0.5 * np.log((var[keep] - beta[keep]) / v[keep]))))
    b = m - a * _pixel_stats(c)[0]
    note = "" if not w else (f" (less the {w:.0%} their start still holds after {steps} "
                             f"training steps at momentum {bn.momentum:g})")
    return (float(np.min(b)), float(np.max(b + 255.0 * a))), note, bn.name


def _channel_var(y, axis):
    y = np.moveaxis(y, axis, -1)
    return y.reshape(-1, y.shape[-1]).var(axis=0)


def _uniform(name) -> bool:
    """Whether convention ``name`` treats every channel alike (no per-channel mean or order)."""
    scale, offset, perm = CONVENTIONS[name]
    return bool(np.all(scale == scale[0]) and np.all(offset == offset[0])
                and tuple(perm) == (0, 1, 2))


def snap(lo, hi, name, bn_name, channels=3, note=""):
    """The convention the fitted range ``[lo, hi]`` stands for (module docstring, step 2).
    A ``channels``-1 input (grayscale) is held only to the conventions that treat every
    channel alike: ImageNet's per-channel mean and std, or BGR order, say nothing of one
    channel, and a custom layer before the first batch norm once put a grayscale fit near
    the torch convention's range, "sure", for inputs in [0, 1]."""
    w, c = hi - lo, (hi + lo) / 2
    d, near = {}, {}
    for k in CONVENTIONS:
        if channels == 1 and not _uniform(k):
            continue
        lk, hk = convention_range(k)
        wk = hk - lk
        near[k] = abs(np.log(w / wk)) + abs(c - (hk + lk) / 2) / wk
        if lk <= lo + COVER_TOL * wk and hk >= hi - COVER_TOL * wk:  # covers the fit
            d[k] = near[k]
    order = sorted(d, key=d.get)
    where = f"the statistics of its first batch norm '{bn_name}'{note}"
    fit = f"[{lo:.3g}, {hi:.3g}]"
    if order and d[order[0]] < SNAP_MAX:
        close = [k for k in order if d[k] - d[order[0]] < SNAP_MARGIN]
        nearest = min(near, key=near.get)
        if nearest not in d and near[nearest] < SNAP_MAX:  # nearer, but narrower than the fit
            close.append(nearest)  # (sparse [0, 1] digits fit below 0: not tf's [-1, 1])
        if len(close) == 1:
            lo_k, hi_k = convention_range(order[0])
            return InputRange(name, lo_k, hi_k, f"{where} fit {fit}: the {order[0]} "
                              "convention", convention=order[0])
        ranges = [convention_range(k) for k in close]
        return InputRange(name, min(r[0] for r in ranges), max(r[1] for r in ranges),
                          f"{where} fit {fit}, between {' and '.join(close)}: their union",
                          sure=False)
    pad = UNSURE_PAD * w
    return InputRange(name, lo - pad, hi + pad, f"{where} fit {fit}, no usual convention "
                      f"close (a guess only: the fit and {UNSURE_PAD:.0%} of its width either "
                      "side)", sure=False)


# ------------------------------------------------------------------------ the answer


def infer_input_ranges(model, seed: int = 0) -> list[InputRange]:
    """The range of each of ``model``'s inputs, found from the model alone (module docstring).

    Returns:
        One :class:`InputRange` per input, in the order of ``model.inputs``; one whose range
        cannot be told has NaN ends and says why in ``source``.
    """
    graph = _Graph(model)
    rng = np.random.default_rng(seed)
    out = []
    for index, (tensor, name) in enumerate(zip(graph.view.inputs, input_names(model))):
        shape = _concrete(tensor.shape[1:])
        axis = image_axis(shape)
        if axis is None:
            out.append(InputRange(name, np.nan, np.nan, "not an image input (sample shape "
                                  f"{shape}) and no range stated", sure=False))
            continue
        answer = _chain_answer(graph, index, shape, axis, name, rng)
        if answer is None:
            fit, why, bn_name = bn_fit(graph, index, shape, axis, rng, seed)
            answer = (snap(*fit, name, bn_name, _layout(shape, axis)[2], note=why)
                      if fit is not None else
                      InputRange(name, np.nan, np.nan, f"no preprocessing layer, and {why}",
                                 sure=False))
        out.append(answer)
    return out


#: Features of a vector input (or entries of an output) whose values span less than the widest
#: one's over this factor get a few steps or none of one 8-bit range for the tensor.
SPREAD = 2.0 ** 7


def spread_inputs(x) -> list[str]:
    """A sentence for each vector input (``x``: :class:`cle._core.inputs.ModelInputs`) whose
    features span ranges more than :data:`SPREAD` apart: one 8-bit range for the input leaves
    the narrow ones a few steps or none (constant features left out)."""
    out = []
    for name, a in zip(x.names, x.arrays):
        if a.ndim != 2 or a.shape[1] < 2:
            continue
        spans = np.ptp(np.asarray(a, np.float64), axis=0)
        varying = spans[spans > 0]
        if len(varying) > 1 and varying.max() / varying.min() > SPREAD:
            narrow = int(np.sum(varying < varying.max() / SPREAD))
            out.append(f"input '{name}': {narrow} of its {a.shape[1]} features span less than "
                       f"1/{SPREAD:g} of the widest one's range ({varying.min():.3g} against "
                       f"{varying.max():.3g} on the calibration data), and one 8-bit range for "
                       "the input leaves them a few steps or none; standardize the features "
                       "before the model")
    return out
