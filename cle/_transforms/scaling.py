"""The one copy of what scaling a set and folding a high bias do to weights.

Both users go through it: the planner of :func:`cle.equalize_model` (which reads the weights a
layer *will* have, through :class:`PlannedWeights`, and turns the result into ``LayerEdit``s)
and the in-place AIMET-style classes (which read and assign live variables). A ``reader`` is
``reader(layer, attr) -> array`` (None for the bias of a layer without one).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from cle._math import equalization as _cls_math
from cle._transforms.sets import Link, in_spec, out_spec
from cle._core.layouts import bias_on_wrong_axis, layout_of, read_weight
from cle.layers import ClippedReLU

__all__ = ["BiasAbsorption", "Factor", "PlannedWeights", "absorb", "apply", "cap_refs",
           "nagel_scales", "padding_reason", "set_factors"]

CAPS, FUSED_CAPS = "caps", "fused_caps"  # a ClippedReLU's caps; those a fused ReLU6 will get


@dataclasses.dataclass
class BiasAbsorption:
    """One pair considered by high-bias folding.

    Attributes:
        layer1, layer2: layer names.
        absorbed: True if a shift moved from layer1's bias into layer2's.
        channels: number of channels with a non-zero shift.
        max_shift: largest per-channel shift ``c``.
        reason: why nothing was absorbed (empty when ``absorbed``).
    """

    layer1: str
    layer2: str
    absorbed: bool
    channels: int = 0
    max_shift: float = 0.0
    reason: str = ""


@dataclasses.dataclass(frozen=True, eq=False)
class Factor:
    """One weight's change: a kernel's channels multiplied by ``factor`` along ``axis``, or a
    per-channel vector (``axis`` None: a bias, caps) divided by it."""

    layer: Any
    attr: str
    factor: np.ndarray
    axis: int | None = None
    kind: str = "standard"
    groups: int = 1


def apply(value, f: Factor):
    if f.axis is None:
        return np.asarray(value, dtype=np.float64) / f.factor
    return _cls_math.scale_channels(value, f.factor, f.axis, f.kind, f.groups)


def cap_refs(link: Link | None) -> list[tuple[Any, str]]:
    """``(layer, attr)`` of the caps on a link that follow its scale (a fused ReLU6 that will
    be bounded counts as the caps of its layer1)."""
    if link is None:
        return []
    refs = [(c.layer, CAPS) for c in link.caps]
    if link.fused_cap:
        refs.insert(0, (link.first.layer, FUSED_CAPS))
    return refs


def nagel_scales(layers, reader):
    """Nagel's weight equalization of a pair or a triplet: ``[s]`` or ``[s12, s23]``."""
    first, last = layers[0], layers[-1]
    a1, ax1, k1 = out_spec(first)
    a3, ax3, k3, g3 = in_spec(last)
    r1 = _cls_math.channel_ranges(reader(first, a1), ax1, k1)
    r3 = _cls_math.channel_ranges(reader(last, a3), ax3, k3, g3)
    if len(layers) == 2:
        return [_cls_math.pair_scale(r1, r3)]
    rd = _cls_math.channel_ranges(reader(layers[1], "kernel"), -1, "depthwise_out")
    return list(_cls_math.triplet_scale(r1, rd, r3))


def set_factors(layers, scales, links, has_bias) -> list[Factor]:
    """What scaling a set by ``scales`` (one array per junction) does to each weight:
    ``W1[..., i] /= s``, ``b1 /= s``, ``W2[..., i, :] *= s`` (a triplet's middle kernel by
    ``s12 / s23``, its bias by ``1 / s23``), caps on the links divided by their junction's s."""
    first, last = layers[0], layers[-1]
    a1, ax1, k1 = out_spec(first)
    a3, ax3, k3, g3 = in_spec(last)
    s_first, s_last = scales[0], scales[-1]
    out = [Factor(first, a1, 1.0 / s_first, ax1, k1)]
    if has_bias(first):
        out.append(Factor(first, "bias", s_first))
    if len(layers) == 3:
        dw = layers[1]
        out.append(Factor(dw, "kernel", s_first / s_last, -1, "depthwise_out"))
        if has_bias(dw):
            out.append(Factor(dw, "bias", s_last))
    out.append(Factor(last, a3, s_last, ax3, k3, g3))
    for link, s in zip(links, scales):
        out += [Factor(layer, attr, s) for layer, attr in cap_refs(link)]
    return out


def padding_reason(layer2, link):
    if link is not None and link.zero_padding:
        return f"a ZeroPadding between the layers pads the shifted activation of '{layer2.name}'"
    layout = layout_of(layer2)
    if layout.kind == "dense":
        return None
    kernel = getattr(layer2, "kernel_size", (1,))
    if getattr(layer2, "padding", "valid") != "valid" and any(k > 1 for k in kernel):
        return (
            f"'{layer2.name}' zero-pads its input (padding='{layer2.padding}', "
            f"kernel {tuple(kernel)}): the border would see 0 instead of -c"
        )
    return None


def absorb(layer1, layer2, scale, relu, link, gamma_beta, margin, absorb_padded, reader):
    """High-bias folding of one pair: ``(BiasAbsorption, [(layer, attr, new value)])``.

    ``gamma_beta``: ``(BN name, γ, β)`` of the BN folded backward into ``layer1``, float64;
    ``link``: the path between the layers (the caller finds it first); ``relu``: a ReLU-like
    activation lies between (the 3σ rule), else ``c = β̂``.
    """
    bn_name, gamma, beta = gamma_beta
    record = BiasAbsorption(layer1.name, layer2.name, False)
    layout2 = layout_of(layer2)
    if layout2.kind == "transpose":
        record.reason = f"'{layer2.name}' is a transposed convolution: a shift is not exact there"
        return record, []
    if link.second is not None:
        wrong = bias_on_wrong_axis(layer2, link.second.outputs[0].shape)
        if wrong:
            record.reason = wrong
            return record, []
    b1, b2 = reader(layer1, "bias"), reader(layer2, "bias")
    if b1 is None or b2 is None:
        record.reason = f"'{(layer2 if b1 is not None else layer1).name}' has no bias"
        return record, []
    if not absorb_padded:
        reason = padding_reason(layer2, link)
        if reason:
            record.reason = reason
            return record, []
    s = np.asarray(scale, dtype=np.float64)
    n = s.shape[0]
    if gamma.shape[0] != n:
        record.reason = f"BN '{bn_name}' has {gamma.shape[0]} channels, the set {n}"
        return record, []
    c = _cls_math.relu_shift(beta / s, gamma / s, margin, relu)
    caps = cap_refs(link)
    for layer, attr in caps:
        c = np.minimum(c, np.maximum(reader(layer, attr), 0.0))
    if not np.any(c != 0):
        record.reason = (f"no channel has beta - {margin:g}*|gamma| > 0" if relu
                         else "beta is 0 on every channel")
        return record, []
    updates = [(layer, attr, reader(layer, attr) - c) for layer, attr in caps]
    updates.append((layer1, "bias", b1 - c))
    if layout2.kind == "separable":
        dw_shift = _cls_math.constant_input_response(
            reader(layer2, "depthwise_kernel"), c, "depthwise")
        shift = _cls_math.constant_input_response(reader(layer2, "pointwise_kernel"), dw_shift)
    else:
        attr, _, kind, groups = in_spec(layer2)
        kind = {"grouped_in": "grouped"}.get(kind, kind)
        if layout2.kind == "depthwise":
            kind = "depthwise"
        shift = _cls_math.constant_input_response(reader(layer2, attr), c, kind, groups)
    updates.append((layer2, "bias", b2 + shift))
    record.absorbed = True
    record.channels = int(np.count_nonzero(c))
    record.max_shift = float(np.max(np.abs(c))) if c.size else 0.0
    return record, updates


def _dtype_of(layer, attr):
    """The dtype of the variable ``attr`` of ``layer`` in the new model: its own, else (a bias
    a fold adds, the caps of a ReLU6 that becomes a ClippedReLU) the layer's variable dtype."""
    var = None if attr == FUSED_CAPS else getattr(layer, attr, None)
    return np.dtype(getattr(var, "dtype", None) or layer.dtype_policy.variable_dtype)


def _round(value, dtype):
    """``value`` rounded to ``dtype``, what assigning it to a variable does. Held in that dtype:
    the math that reads it promotes it to float64 exactly, as it promoted the variables the
    in-place stages read."""
    return np.asarray(value, dtype=dtype)


class PlannedWeights:
    """``reader(layer, attr)``: the weight a layer of the input model will have in the new
    model: its fold edit's values (computed on demand) or its own, then every recorded kernel
    :class:`Factor`; biases and caps once changed are held whole (vectors).

    Values are rounded as the stages before the one-rebuild design assigned them: the fold's
    float64 values to each variable's dtype, then again after each set and each high-bias
    update (held in that dtype). :attr:`exact` reads without rounding (the fold's float64 values
    and the sets' float64 products), which is what the scale decisions read.

    Kernel values are cached only for the layers passed to :meth:`keep` (one set's layers),
    so planning never holds every kernel at once; the rebuild computes each layer's final
    values (:meth:`final`) when it assigns them.
    """

    def __init__(self, edits):
        self.edits = edits
        self.factors: dict[int, list[Factor]] = {}
        self.vectors: dict[tuple[int, str, bool], np.ndarray] = {}
        self.cache: dict[tuple[int, str, bool], Any] = {}
        self.base_cache: dict[int, dict] = {}  # the fold's float64 values of kept layers
        self.kept: set[int] = set()
        self.layers: dict[int, Any] = {}  # every layer whose weights change

    def keep(self, layer_ids):
        self.kept = set(layer_ids)
        self.cache = {k: v for k, v in self.cache.items() if k[0] in self.kept}
        self.base_cache = {k: v for k, v in self.base_cache.items() if k in self.kept}

    def _base(self, layer, attr, exact=False):
        if attr == FUSED_CAPS or (attr == CAPS and not isinstance(layer, ClippedReLU)):
            return None  # filled by record() from the factor's length
        edit = self.edits.get(id(layer))
        if edit is not None and edit.sets_weights:
            if exact or id(layer) in self.kept:  # one computation while the layer is kept
                values = self._exact_fold(layer, edit)
                if attr in values:  # rounded: the same bits as computing it in the dtype
                    v = values[attr]
                    return v if exact else _round(v, _dtype_of(layer, attr))
            else:
                values = self._edited(layer)
                if attr in values:
                    return values[attr]
        if attr == "bias" and not getattr(layer, "use_bias", False):
            return None
        return read_weight(getattr(layer, attr))

    def _exact_fold(self, layer, edit) -> dict:
        """The fold edit's float64 values, cached while the layer is kept."""
        values = self.base_cache.get(id(layer))
        if values is None:
            values = edit.new_values()
            if id(layer) in self.kept:
                self.base_cache[id(layer)] = values
        return values

    def _edited(self, layer) -> dict:
        """The values a layer's fold edit gives it (none without one), each rounded to its
        variable's dtype as the rebuild assigns it."""
        edit = self.edits.get(id(layer))
        if edit is None or not edit.sets_weights:
            return {}
        dtypes = {np.dtype(w.dtype) for w in layer.weights}
        values = edit.new_values(dtypes.pop() if len(dtypes) == 1 else None)
        return {a: _round(v, _dtype_of(layer, a)) for a, v in values.items()}

    def _apply(self, f, value, exact):
        value = apply(value, f)
        return value if exact else _round(value, _dtype_of(f.layer, f.attr))

    def _scaled(self, layer, attr, value, exact=False):
        """``value`` after the layer's recorded kernel factors (rounded after each unless
        ``exact``: each set assigned its result to the variable)."""
        for f in self.factors.get(id(layer), ()):
            if f.attr == attr:
                value = self._apply(f, value, exact)
        return value

    def read(self, layer, attr, exact=False):
        key = (id(layer), attr, exact)
        if key in self.vectors:
            return self.vectors[key]
        if key in self.cache:
            return self.cache[key]
        value = self._scaled(layer, attr, self._base(layer, attr, exact), exact)
        if id(layer) in self.kept:
            self.cache[key] = value
        return value

    def __call__(self, layer, attr):
        return self.read(layer, attr)

    def exact(self, layer, attr):
        return self.read(layer, attr, exact=True)

    def has_bias(self, layer):
        """The layer has a bias in the new model (a fold edit may add one)."""
        if (id(layer), "bias", False) in self.vectors:
            return True
        edit = self.edits.get(id(layer))
        if edit is not None and "use_bias" in edit.config:
            return bool(edit.config["use_bias"])
        return bool(getattr(layer, "use_bias", False))

    def record(self, factors):
        """Take a set's factors: vectors are applied now, kernels when read."""
        for f in factors:
            self.layers[id(f.layer)] = f.layer
            if f.axis is not None:
                self.factors.setdefault(id(f.layer), []).append(f)
            for exact in (False, True):
                key = (id(f.layer), f.attr, exact)
                if f.axis is None:
                    value = self.read(f.layer, f.attr, exact)
                    if value is None:  # caps of a ReLU6 that becomes a ClippedReLU
                        value = np.full(np.shape(f.factor), 6.0)
                    self.vectors[key] = self._apply(f, value, exact)
                elif key in self.cache:
                    self.cache[key] = self._apply(f, self.cache[key], exact)

    def set(self, layer, attr, value):
        self.layers[id(layer)] = layer
        self.vectors[(id(layer), attr, False)] = _round(value, _dtype_of(layer, attr))
        self.vectors[(id(layer), attr, True)] = np.asarray(value, dtype=np.float64)

    def vector(self, layer, attr):
        """A changed bias or caps vector, or None."""
        return self.vectors.get((id(layer), attr, False))

    def final(self, layer, dtype=None) -> dict:
        """Every weight of ``layer`` in the new model, by attribute (``dtype`` if given)."""
        if isinstance(layer, ClippedReLU):
            attrs = (CAPS,)
        else:
            attrs = layout_of(layer).kernel_attrs + (("bias",) if self.has_bias(layer) else ())
        base = self._edited(layer)  # nothing is kept while the rebuild assigns
        values = {}
        for attr in attrs:
            value = self.vector(layer, attr)
            if value is None:
                value = base[attr] if attr in base else read_weight(getattr(layer, attr))
                value = self._scaled(layer, attr, value)
            values[attr] = value if dtype is None else np.asarray(value, dtype=dtype)
        return values
