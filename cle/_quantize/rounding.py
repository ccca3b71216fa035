"""The rounding stage of :func:`cle.quantize`: every Conv1D/2D, DepthwiseConv1D/2D,
SeparableConv1D/2D and Dense kernel put on its ``bits``-bit grid, rounded for the layer's
output rather than to nearest (a separable layer's two kernels one after the other).

:func:`round_model` walks the model's graph view once, in order, with two streams of
activations over the calibration inputs (real data, or the synthetic inputs the no-data path
distils): the *float* stream (the weights as the equalize stage left them) and the
*quantized* stream (every kernel before the current one already rounded; kernels the stage
does not round go through 8-bit round-to-nearest, as TF Lite's converter will store them). At
each layer it rounds (:func:`cle._math.rounding.round_rows`) on the second moments of the
layer's input patches in the quantized stream crossed with the float stream
(:func:`cle._math.moments.moments`), so each layer reproduces the float layer's output from
the inputs the quantized network will really give it; the bias takes the mean output error
away. Each layer's output is then measured in the quantized stream against the float stream,
rounded to nearest and as chosen. The model (the pipeline's own equalized copy) is rounded in
place.

A layer of more than :data:`MAX_FAN_IN` inputs per output is rounded on the diagonal blocks of
its statistics (:func:`cle._math.rounding.round_rows_blocked`), never on the whole matrices;
its record says so and why.
"""

from __future__ import annotations

import collections
import dataclasses
import time

import keras
import numpy as np

from cle._core.graph import calls_leading_to, graph_view, is_plain_call, run_call
from cle._core.layouts import bias_on_wrong_axis, layout_of, untouchable_reason
from cle._math import rounding as R
from cle._math.json_numbers import sqnr_words
from cle._math.moments import column_blocks, moments, numpy_gram
from cle._quantize.layer_parts import (KINDS, NOT_ROUNDED, channels_last, depthwise_out,
                                       kind_of, parts)
from cle._tflite.weight_store import NO_INT4, LayerWeights, int8_file_bytes
from cle._transforms.bias_pass import quantized_kernels

__all__ = ["MAX_FAN_IN", "METHODS", "RoundedLayer", "RoundingReport", "reads_inputs",
           "round_model"]

METHODS = R.METHODS
#: Output positions (over all calibration inputs) a layer's statistics are measured on.
MAX_POSITIONS = 1 << 16
#: The most inputs per output (a kernel's rows' length, per group; its bias not counted) a
#: layer is rounded with on its inputs' whole second moments. The rounding reads a layer's
#: inputs through ``(fan-in + 1)²`` float64 matrices, several at once (``H`` and ``G``, the
#: products they are summed from, GPTQ's inverse and factor, AdaRound's copy): 8·fan-in² bytes
#: each, 30.7 GB for a Dense on a flattened 22x22x128 map (61,952 inputs; issue #41). A wider
#: layer is rounded on contiguous blocks of at most this many inputs
#: (:func:`cle._math.moments.column_blocks`), each with the diagonal block of the matrices only
#: (:func:`cle._math.rounding.round_rows_blocked`; the correlations between blocks left out),
#: so no matrix passes 8·MAX_FAN_IN² bytes (134 MB) and no array of patches
#: :data:`cle._math.moments.CHUNK` positions of a block, whatever the layer's fan-in. 4096 is
#: above every layer of the networks measured in docs/quantize_w4.md (the widest:
#: ConvNeXtTiny's dense layers of 3,072 inputs), which keep their whole matrices.
MAX_FAN_IN = 1 << 12


@dataclasses.dataclass
class RoundedLayer:
    """One kernel the stage rounded: a layer's, or one of a separable layer's two.

    Attributes:
        layer: the layer's name.
        kind: "conv", "depthwise" or "dense"; a separable layer's "depthwise" and
            "pointwise".
        shape: its kernel's shape.
        sqnr_nearest_db: SQNR (dB) of its output with the kernel rounded to nearest, against
            the float layer, on the calibration inputs in the quantized stream (None when not
            measured: "nearest" measures no output). A separable layer's depthwise kernel: the
            output of that kernel, before the pointwise one; its pointwise kernel: the layer's
            output with both kernels rounded to nearest.
        sqnr_db: the same with the rounding chosen (and its bias).
        seconds: time spent on the layer.
        bits: the grid's bits of this layer (8 for a kernel kept wide: ``wide_share``).
        reason: why the kernel was rounded on blocks of its inputs (its fan-in over
            :data:`MAX_FAN_IN`), or None when it was rounded on its whole statistics.
    """

    layer: str
    kind: str
    shape: tuple
    sqnr_nearest_db: float | None = None
    sqnr_db: float | None = None
    seconds: float = 0.0
    bits: int | None = None
    reason: str | None = None

    def line(self) -> str:
        why = "" if self.reason is None else f"; {self.reason}"
        if self.sqnr_db is None:
            return f"{self.layer} ({self.kind} {'x'.join(map(str, self.shape))}){why}"
        return (f"{self.layer} ({self.kind} {'x'.join(map(str, self.shape))}): output SQNR "
                f"{sqnr_words(self.sqnr_nearest_db)} to nearest -> {sqnr_words(self.sqnr_db)}, "
                f"{self.seconds:.1f} s{why}")


@dataclasses.dataclass
class RoundingReport:
    """What the rounding stage did.

    Attributes:
        method: "nearest", "gptq" or "adaround".
        bits: the grid's bits.
        per_channel: one step per output channel (else one per kernel).
        source: what the statistics were measured on ("calibration data", "synthetic
            inputs"; "" when none were: "nearest" without bias correction).
        n_inputs: how many.
        layers: every kernel rounded, in order (a :class:`RoundedLayer` each; a separable
            layer has two).
        kept: ``(layer, reason)`` of every layer with a kernel the stage left to TF Lite's
            converter (8 bits, rounded to nearest).
        seconds: the stage's time.
        per_tensor: ``{kind: reason}``: kinds on per-tensor grids despite ``per_channel``.
    """

    method: str
    bits: int
    per_channel: bool
    source: str = ""
    n_inputs: int = 0
    layers: list = dataclasses.field(default_factory=list)
    kept: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    size_ratio: float | None = None
    per_tensor: dict = dataclasses.field(default_factory=dict)

    def summary_lines(self) -> list[str]:
        grid = f"{self.bits}-bit {'per-channel' if self.per_channel else 'per-tensor'} grid"
        wide = [r for r in self.layers if r.bits is not None and r.bits != self.bits]
        n_layers, n_wide = len({r.layer for r in self.layers}), len({r.layer for r in wide})
        head = (f"rounding ({self.method}): {n_layers} layers on their {grid}"
                + (f" ({n_wide} of them on 8-bit grids)" if wide else "")
                + (f", chosen for their outputs on {self.n_inputs} {self.source}"
                   if self.method != "nearest" else ", to nearest")
                + f", {self.seconds:.1f} s")
        lines = [head] + [f"  {kind} layers on per-tensor grids: {why}"
                          for kind, why in self.per_tensor.items()
                          if any(r.kind == kind for r in self.layers)]
        measured = [r for r in self.layers if r.sqnr_db is not None]
        if measured:
            gain = [g for g in (r.sqnr_db - r.sqnr_nearest_db for r in measured) if np.isfinite(g)]
            lines.append(f"  layer output SQNR against the float layer: median "
                         f"{np.median([r.sqnr_nearest_db for r in measured]):.1f} dB to nearest "
                         f"-> {np.median([r.sqnr_db for r in measured]):.1f} dB" + (
                             f" (gain {np.median(gain):.1f} dB at the median, "
                             f"{min(gain):.1f} dB at the least)" if gain else ""))
        if wide:
            size = sum(int(np.prod(r.shape)) for r in self.layers)
            lines.append(f"  {len(wide)} kernels kept on 8-bit grids "
                         f"({sum(int(np.prod(r.shape)) for r in wide) / size:.1%} of the "
                         "rounded weights"
                         + (f"; those whose {self.bits}-bit rounding to nearest adds the most "
                            "noise to their output per weight, within a file of "
                            f"{self.size_ratio:g}x the 8-bit one" if self.size_ratio else "")
                         + ")")
        blocked = [r for r in self.layers if r.reason is not None]
        if blocked:
            lines.append(f"  {len(blocked)} kernels rounded on blocks of their inputs (more "
                         f"than {MAX_FAN_IN} inputs per output): "
                         + ", ".join(f"{r.layer} ({r.kind})" for r in blocked))
        if self.kept:
            lines.append(f"  {len(self.kept)} layers with kernels left to TF Lite's converter "
                         "(see the weights)")
        return lines

    def to_dict(self) -> dict:
        return {"method": self.method, "bits": self.bits, "per_channel": self.per_channel,
                "source": self.source, "n_inputs": self.n_inputs,
                "layers": [dataclasses.asdict(r) | {"shape": list(r.shape)}
                           for r in self.layers],
                "kept": [{"layer": n, "reason": r} for n, r in self.kept],
                "size_ratio": self.size_ratio, "seconds": self.seconds,
                "per_tensor": dict(self.per_tensor)}


def kept_reason(call, view, bits) -> str | None:
    """Why the stage leaves the kernel of ``call`` to the converter, or None."""
    layer = call.layer
    reason = untouchable_reason(layer, view.n_calls(layer))
    if reason:
        return reason + "; rounded to nearest at 8 bits by TF Lite's converter"
    if type(layer) not in KINDS:
        kind = layout_of(layer).kind
        why = NO_INT4["TRANSPOSE_CONV"] if kind == "transpose" and bits <= 4 else NOT_ROUNDED
        return f"{why}; rounded to nearest at 8 bits by TF Lite's converter"
    if getattr(layer, "padding", None) == "causal":
        return ("causal padding (the rounding stage reads 'same' and 'valid' patches); rounded "
                "to nearest at 8 bits by TF Lite's converter")
    if not is_plain_call(call):
        return ("called with arguments other than its input; rounded to nearest at 8 bits "
                "by TF Lite's converter")
    reason = bias_on_wrong_axis(layer, call.outputs[0].shape)
    if reason:
        return reason + "; rounded to nearest at 8 bits by TF Lite's converter"
    return None


def _entry_key(layer, i):
    """Key of a layer's ``i``-th part's :class:`LayerWeights` in :func:`_plan`."""
    return id(layer) if i == 0 else (id(layer), i)


def _plan(view, bits):
    """``(calls to round, [(layer name, reason)] kept, [LayerWeights] of every layer with a
    kernel)`` in the order of the view."""
    targets, kept, entries, seen = [], [], {}, set()
    for call in view.calls:
        layer = call.layer
        if id(layer) in seen or not call.is_layer or layout_of(layer) is None:
            continue
        seen.add(id(layer))
        reason = kept_reason(call, view, bits)
        layout = layout_of(layer)
        kernel = getattr(layer, layout.out_kernel, None)
        if reason is None:
            targets.append(call)
        else:
            kept.append((layer.name, reason))
        bias = getattr(layer, "bias", None)
        bias = None if bias is None else keras.ops.convert_to_numpy(bias)
        if kernel is not None and layout.out_kernel == layout.in_kernel:
            entries[id(layer)] = LayerWeights(
                layer.name, layout.kind, keras.ops.convert_to_numpy(kernel), bias,
                reason=reason)
        elif type(layer) in KINDS:  # a separable layer: a DEPTHWISE_CONV_2D, a 1x1 CONV_2D
            for i, part in enumerate(parts(layer)):
                entries[_entry_key(layer, i)] = LayerWeights(
                    layer.name, part.kind,
                    keras.ops.convert_to_numpy(getattr(layer, part.attr)),
                    bias if part.bias else None, reason=reason)
    return targets, kept, entries


def _rows(layer, part):
    kernel = keras.ops.convert_to_numpy(getattr(layer, part.attr))
    bias = keras.ops.convert_to_numpy(layer.bias) if part.bias else None
    return R.to_rows(kernel, bias, part.kind, part.groups)


def _to_nearest(layer, part, bits, per_tensor):
    """Round the part's kernel to nearest on its ``bits``-bit grid, in place (its bias as it
    is); returns the grid's steps."""
    W = _rows(layer, part)
    Q, _, s = R.round_rows(W, None, None, bits, "nearest", W.shape[2] - int(part.bias),
                           per_tensor)
    _assign(layer, part, Q, None)
    return s


def _kernel(layer, part, Q):
    """The part's kernel (its Keras shape) whose rows are ``Q``."""
    return R.from_rows(Q, part.kind, tuple(getattr(layer, part.attr).shape),
                       part.groups).astype(np.float32)


def _assign(layer, part, Q, bias):
    """Write rows ``Q`` (and the bias columns) into the layer's part."""
    getattr(layer, part.attr).assign(_kernel(layer, part, Q))
    if part.bias and bias is not None:
        layer.bias.assign(np.asarray(bias, np.float64).reshape(-1).astype(np.float32))


def _sqnr(reference, test) -> float:
    """SQNR in dB (float32 dot products: the figure is reported to 0.1 dB)."""
    ref = np.asarray(keras.ops.convert_to_numpy(reference), np.float32).ravel()
    err = ref - np.asarray(keras.ops.convert_to_numpy(test), np.float32).ravel()
    signal, noise = float(np.dot(ref, ref)), float(np.dot(err, err))
    return float("inf") if noise == 0 else 10 * np.log10(max(signal, 1e-300) / noise)


def _gram(a, b):
    """:func:`cle._math.moments.numpy_gram`'s products: a convolution's or dense layer's one
    large product on the backend (TensorFlow's or XLA's thread pool, float32 sums), which on
    a loaded machine ran several times faster than through numpy's BLAS; a depthwise layer's
    many small products through numpy, which ran faster there."""
    if a.ndim != 2:
        return numpy_gram(a, b)
    return keras.ops.convert_to_numpy(keras.ops.einsum("pd,pe->de", a, b))


def reads_inputs(method, free_bias) -> bool:
    """Whether rounding by ``method`` reads the calibration inputs: every rounding but
    "nearest" without a bias to correct."""
    return method != "nearest" or bool(free_bias)


def _round_call(call, xf, xq, method, bits, per_tensor, free_bias, seed, damp=R.DAMP,
                shrink=0.0):
    """Round one layer on its inputs in both streams, part by part
    (:func:`cle._quantize.layer_parts.parts`: a separable layer's pointwise kernel on the
    output of its depthwise kernel, float and rounded); returns ``(float output, quantized
    output, [RoundedLayer], [steps])``, one record and one array of steps per part. A part's
    time includes the layer's own float run for the first part."""
    start = time.perf_counter()
    layer = call.layer
    split = parts(layer)
    a_q = a_f = None
    if len(split) > 1 or reads_inputs(method, free_bias and split[0].bias):
        a_q = channels_last(layer, xq[0])
        a_f = channels_last(layer, xf[0]) if xf[0] is not xq[0] else a_q
    out_f = out_q = None
    records, steps, nearest = [], [], []
    for i, part in enumerate(split):
        var = getattr(layer, part.attr)
        W = _rows(layer, part)
        n = W.shape[2] - int(part.bias)
        H = G = reason = None
        reads = reads_inputs(method, free_bias and part.bias)
        blocks = (column_blocks(n, MAX_FAN_IN) if reads and part.kind != "depthwise"
                  else [(0, n)])
        if reads and len(blocks) == 1:
            H, G = moments(a_q, a_f, part.geometry, part.bias, MAX_POSITIONS, seed, _gram)
            if shrink:
                H, G = R.shrunk(H, G, shrink, n)
        if i + 1 == len(split) and len(blocks) == 1:
            a_q = a_f = None  # (a large layer's inputs: freed before its outputs are made)
        if len(blocks) == 1:
            Q, bias, s = R.round_rows(W, H, G, bits, method, n, per_tensor, free_bias, damp)
        else:  # a fan-in over MAX_FAN_IN: the statistics' diagonal blocks, one at a time
            Q, bias, s = R.round_rows_blocked(W, _block_stats(a_q, a_f, part, seed, shrink),
                                              blocks, bits, method, n, per_tensor, free_bias,
                                              damp)
            reason = _blocked_reason(n, blocks, method)
            if i + 1 == len(split):
                a_q = a_f = None
        del H, G
        q_near, _, _ = R.round_rows(W, None, None, bits, "nearest", n, per_tensor)
        near = _kernel(layer, part, q_near)
        nearest.append((var, keras.ops.convert_to_tensor(near)))
        if out_f is None:
            out_f = run_call(call, xf)  # the float layer, before any of its kernels is rounded
        if i + 1 < len(split):  # the depthwise part: its output is the next part's input
            mid_f = depthwise_out(part, a_f, keras.ops.convert_to_numpy(var))
            sqnr_near = _sqnr(mid_f, depthwise_out(part, a_q, near))
            _assign(layer, part, Q, bias)
            a_q, a_f = depthwise_out(part, a_q, _kernel(layer, part, Q)), mid_f
            sqnr = (sqnr_near, _sqnr(a_f, a_q))
            del mid_f
        else:
            with keras.StatelessScope(state_mapping=nearest):  # every kernel to nearest
                out_n = run_call(call, xq)
            _assign(layer, part, Q, bias)
            out_q = run_call(call, xq)
            sqnr = (_sqnr(out_f[0], out_n[0]), _sqnr(out_f[0], out_q[0]))
            del out_n
        record = RoundedLayer(layer.name, part.label, tuple(var.shape), *sqnr, bits=bits,
                              reason=reason)
        record.seconds = time.perf_counter() - start
        start = time.perf_counter()
        records.append(record)
        steps.append(s)
    return out_f, out_q, records, steps


def _block_stats(a_q, a_f, part, seed, shrink):
    """``moments_of(start, stop)`` for :func:`cle._math.rounding.round_rows_blocked`: the
    statistics of the part's input columns ``[start, stop)`` (with the bias's), on the
    positions the whole layer's would be measured on, shrunk as the whole would be."""
    def moments_of(start, stop):
        H, G = moments(a_q, a_f, part.geometry, part.bias, MAX_POSITIONS, seed, _gram,
                       columns=(start, stop))
        return R.shrunk(H, G, shrink, stop - start) if shrink else (H, G)
    return moments_of


def _blocked_reason(n, blocks, method) -> str:
    """Why (and how) a kernel of ``n`` inputs per output was rounded on ``blocks``."""
    widest = max(stop - start for start, stop in blocks)
    how = ("its bias's mean-error correction measured block by block (the same correction)"
           if method == "nearest" else
           "each block rounded on its own inputs' statistics, the correlations between "
           "blocks left out")
    size = 8 * (n + 1) ** 2
    size = f"{size / 1e9:.1f} GB" if size >= 1e9 else f"{size / 1e6:.3g} MB"
    return (f"{n:,} inputs per output, more than {MAX_FAN_IN:,} (their whole second-moment "
            f"matrix would take {size}): rounded on {len(blocks)} "
            f"blocks of at most {widest:,} inputs, {how}")


def _nearest_noise(call, xf, xq, method, bits, per_tensor, free_bias, seed, damp=R.DAMP,
                   shrink=0.0):
    """:func:`_round_call`'s contract for the noise pass of :func:`round_model`: the kernels
    rounded to nearest on their ``bits``-bit grid (no statistics), and in the one record's
    ``sqnr_db`` the noise they add to the layer's output, measured on the quantized stream's
    inputs against the float kernels on the same inputs, relative to the float layer's
    output (as an SQNR in dB)."""
    start = time.perf_counter()
    layer = call.layer
    out_f = run_call(call, xf)
    out_qf = out_f if all(a is b for a, b in zip(xf, xq)) else run_call(call, xq)
    steps = [_to_nearest(layer, part, bits, per_tensor) for part in parts(layer)]
    out_q = run_call(call, xq)
    record = RoundedLayer(layer.name, kind_of(layer), (_sizes([call])[0],),
                          sqnr_db=_sqnr(out_f[0], out_f[0] + out_q[0] - out_qf[0]), bits=bits)
    record.seconds = time.perf_counter() - start
    return out_f, out_q, [record], steps


def _pass_through(call, xf, xq, per_channel) -> tuple[list, list]:
    """Float and quantized outputs of a call not rounded (its kernels 8-bit to nearest)."""
    out_f = run_call(call, xf)
    mapping = quantized_kernels(call.layer, 8, per_channel) if call.is_layer else []
    if all(a is b for a, b in zip(xf, xq)) and not mapping:
        return out_f, out_f
    with keras.StatelessScope(state_mapping=mapping):
        return out_f, run_call(call, xq)


def _stream_pass(view, targets, inputs, method, bits, per_channel, free_bias, say,
                 damp=R.DAMP, shrink=0.0, layer_fn=None, per_tensor=None):
    """Both streams through the graph, rounding each target on the way (``bits``: one per
    target; ``per_tensor``: one per target, a per-tensor grid, else ``not per_channel``;
    ``layer_fn``: :func:`_round_call` or :func:`_nearest_noise`); yields ``(call,
    [RoundedLayer], [steps])``, one of each per part."""
    per_tensor = per_tensor or [not per_channel] * len(targets)
    layer_fn = layer_fn or _round_call
    calls = calls_leading_to(view, targets)
    index = {id(c): k for k, c in enumerate(targets, start=1)}
    uses = collections.Counter(id(t) for call in calls for t in call.inputs)
    live = {id(t): (v, v) for t, v in zip(view.inputs,
                                          [keras.ops.convert_to_tensor(x) for x in inputs])}
    for call in calls:
        xf, xq = (list(v) for v in zip(*(live[id(t)] for t in call.inputs)))
        k = index.get(id(call))
        if k is not None:
            out_f, out_q, records, steps = layer_fn(call, xf, xq, method, bits[k - 1],
                                                    per_tensor[k - 1], free_bias, seed=k,
                                                    damp=damp, shrink=shrink)
            if layer_fn is _round_call:
                for record in records:
                    say(f"rounding [{k}/{len(targets)}] {record.line()}")
            yield call, records, steps
        else:
            out_f, out_q = _pass_through(call, xf, xq, per_channel)
        for t in call.inputs:
            uses[id(t)] -= 1
            if uses[id(t)] == 0:
                live.pop(id(t), None)
        for t, f, q in zip(call.outputs, out_f, out_q):
            if uses.get(id(t), 0):
                live[id(t)] = (f, q)


def round_model(model, inputs, *, bits, per_channel, method, free_bias=True, source="",
                say=None, wide_share=0.0, wide_by="size", size_ratio=None, damp=R.DAMP,
                shrink=0.0, per_tensor_kinds=None):
    """Round the kernels of ``model`` in place (the caller's own copy) for the ``bits``-bit
    target.

    Args:
        model: a Functional or Sequential model (the equalized copy :func:`cle.quantize`
            made).
        inputs: one array per model input (the calibration source), unless ``method`` is
            "nearest" without ``free_bias``, which reads none.
        bits: the grid's bits (4 or 8).
        per_channel: one step per output channel, else one per kernel.
        method: "nearest", "gptq" or "adaround" (:func:`cle._math.rounding.round_rows`).
        free_bias: the bias of each rounded layer takes its mean output error away (for
            "nearest", :func:`cle._math.rounding.mean_bias` on the calibration inputs; else
            what the rounding leaves least, :func:`cle._math.rounding.best_bias`).
        source: what ``inputs`` are, for the report.
        say: ``callable(str)`` told about each layer.
        wide_share: below 8 bits, kernels up to this share of the rounded weights go on
            8-bit grids instead, chosen by ``wide_by``.
        wide_by: "size": the smallest kernels (:func:`cle._math.rounding.smallest_within`);
            "noise": the kernels whose ``bits``-bit rounding to nearest adds the most noise
            to their own layer's output per weight (:func:`cle._math.rounding.noisiest_within`),
            measured on ``inputs`` in a first pass of both streams with every kernel rounded
            to nearest (no statistics; the kernels are restored before the rounding).
        size_ratio: below 8 bits and for a rounding other than "nearest", the share of the
            model's 8-bit ``.tflite`` the file may take: ``wide_share`` is then the share of
            the rounded weights that fills it (:func:`wide_share_within`; 0 when even an
            all-``bits`` file would not fit), and ``wide_by`` is "noise".
        damp: GPTQ's relative ridge on ``H`` (:data:`cle._math.rounding.DAMP`).
        shrink: the off-diagonal of each layer's input (cross-)covariance scaled by ``1 −
            shrink`` before rounding (:func:`cle._math.rounding.shrunk`): the inputs'
            correlations trusted less than their variances and means.
        per_tensor_kinds: ``{kind: reason}``: layers of these kinds (:func:`kind_of`) go on
            per-tensor grids whatever ``per_channel`` (the target runs them so only).

    Returns:
        ``(RoundingReport, [LayerWeights])``: what the stage did, and every layer with a
        kernel as the writer (:func:`cle._tflite.weight_store.store_weights`) needs it.
    """
    say = say or (lambda message: None)
    start = time.perf_counter()
    view = graph_view(model)
    targets, kept, entries = _plan(view, bits)
    reads = reads_inputs(method, free_bias)
    report = RoundingReport(method, bits, per_channel, source if reads else "",
                            len(inputs[0]) if reads else 0, kept=kept)
    if size_ratio is not None and bits < 8 and method != "nearest":
        wide_share, wide_by = wide_share_within(model, targets, bits, size_ratio), "noise"
        report.size_ratio = size_ratio
    wide_by = "noise" if wide_by == "noise" and method != "nearest" else "size"
    per_tensor_kinds = dict(per_tensor_kinds or {}) if per_channel else {}
    report.per_tensor = per_tensor_kinds
    tensor = [not per_channel or kind_of(call.layer) in per_tensor_kinds for call in targets]
    if wide_share > 0 and bits < 8 and wide_by == "noise":
        widths = _widths_by_noise(view, targets, inputs, bits, per_channel, wide_share, say,
                                  tensor)
    else:
        widths = _widths(targets, bits, wide_share)
    if not reads:
        done = []
        for call, b, flat in zip(targets, widths, tensor):
            split = parts(call.layer)
            steps = [_to_nearest(call.layer, part, b, flat) for part in split]
            done.append((call, [RoundedLayer(call.layer.name, part.label,
                                             tuple(getattr(call.layer, part.attr).shape),
                                             bits=b) for part in split], steps))
    else:
        done = _stream_pass(view, targets, inputs, method, widths, per_channel, free_bias,
                            say, damp, shrink, per_tensor=tensor)
    for call, records, steps in done:
        layer = call.layer
        flat = not per_channel or kind_of(layer) in per_tensor_kinds
        for i, (part, record, s) in enumerate(zip(parts(layer), records, steps)):
            report.layers.append(record)
            entry = entries[_entry_key(layer, i)]
            entry.kernel = keras.ops.convert_to_numpy(getattr(layer, part.attr))
            entry.bias = keras.ops.convert_to_numpy(layer.bias) if part.bias else None
            entry.bits = record.bits
            entry.scales = np.ravel(s)[:1] if flat else R.channel_order(s)
            if record.bits != bits:
                entry.wide_reason = _wide_reason(bits, wide_by, report.size_ratio)
            elif per_channel and flat:
                entry.wide_reason = "per-tensor: " + per_tensor_kinds[kind_of(layer)]
    report.seconds = time.perf_counter() - start
    return report, list(entries.values())


def wide_share_within(model, targets, bits, size_ratio) -> float:
    """The share of the weights of ``targets`` (the kernels to round at ``bits`` bits) that
    can stay on 8-bit grids while the file stays within ``size_ratio`` of the model's 8-bit
    one (:func:`int8_file_bytes`): each weight below 8 bits saves ``(8 − bits) / 8`` bytes,
    and the file must save ``(1 − size_ratio)`` of the 8-bit one. 0 when even every kernel at
    ``bits`` bits does not save that much."""
    n = sum(_sizes(targets))
    if n == 0:
        return 0.0
    narrow = (1.0 - size_ratio) * int8_file_bytes(model) * 8 / (8 - bits)
    return max(0.0, (n - narrow) / n)


def _wide_reason(bits, wide_by, size_ratio) -> str:
    """Why a kernel of a ``bits``-bit rounding is on an 8-bit grid."""
    which = (f"its {bits}-bit rounding to nearest adds more noise to its output per weight "
             "than the other kernels' roundings" if wide_by == "noise"
             else "one of the smallest kernels")
    room = (f"within a file of {size_ratio:g}x the 8-bit one" if size_ratio
            else "within the share of the weights kept 8-bit")
    return f"kept 8-bit, {which}, {room}"


def _sizes(targets) -> list[int]:
    """The weights of each target's kernels."""
    return [sum(int(np.prod(getattr(call.layer, part.attr).shape))
                for part in parts(call.layer)) for call in targets]


def _widths(targets, bits, wide_share, noise=None):
    """The grid's bits of each target: ``bits``, or 8 (below 8 bits) for the kernels within
    ``wide_share`` of the rounded weights: the smallest, or with ``noise`` (one figure per
    target) those with the most noise per weight."""
    widths = [bits] * len(targets)
    if wide_share > 0 and bits < 8:
        sizes = _sizes(targets)
        wide = (R.smallest_within(sizes, wide_share) if noise is None
                else R.noisiest_within(sizes, noise, wide_share))
        for i in wide:
            widths[i] = 8
    return widths


def _widths_by_noise(view, targets, inputs, bits, per_channel, wide_share, say,
                     per_tensor=None):
    """The grid's bits of each target: 8 for the kernels adding the most noise per weight
    at ``bits`` bits to nearest within ``wide_share`` of the rounded weights, measured in one
    pass of both streams over ``inputs`` (the kernels are given back as they were)."""
    start = time.perf_counter()
    saved = [(getattr(call.layer, part.attr), keras.ops.convert_to_numpy(
        getattr(call.layer, part.attr))) for call in targets for part in parts(call.layer)]
    try:
        noise = {id(call): 10 ** (-records[0].sqnr_db / 10) for call, records, _ in
                 _stream_pass(view, targets, inputs, "nearest", [bits] * len(targets),
                              per_channel, False, say, layer_fn=_nearest_noise,
                              per_tensor=per_tensor)}
    finally:
        for var, kernel in saved:
            var.assign(kernel)
    widths = _widths(targets, bits, wide_share, [noise[id(call)] for call in targets])
    say(f"rounding: the 8-bit kernels chosen by the noise each adds at {bits} bits "
        f"({time.perf_counter() - start:.1f} s)")
    return widths
