"""``cle.quantize(..., tune=True)``: activation ranges chosen tensor by tensor, where they
measure better on inputs the check does not use.

:func:`tune_build` splits the inputs first (:func:`split_for_tuning`): with data, the held-out
calibration inputs in two halves, one to tune on and one for the check; too few held out to
split, the same inputs for both, and the report warns that the check flatters; without data,
the synthetic calibration inputs tune and the check's sets of synthetic inputs, which neither
the calibration nor the tuning saw, check.

An int8-only target cannot leave a layer in float; what it can change is each activation
tensor's range. :func:`tune_ranges` ranks the tensors by what each adds to the output's error
on its own (the switchable simulation of :mod:`cle._tflite.quant_sim`, that tensor alone
quantized, the rest in float), takes the :data:`TOP` that add most, and for each measures the
output's error with its range at each candidate (:data:`KINDS`): its 1e-4 tails (what
``cle.quantize`` chooses), its min/max, the range that minimizes the tensor's own quantization
MSE on the calibration samples, and narrower tails. The candidates' scales and zero points are the converter's own (one
conversion per candidate kind). A tensor takes the candidate whose error alone is lowest, by at
least :data:`MIN_GAIN`; the model with every change is then converted and checked against the
untuned one on the tuning inputs, and kept only if it is closer to the float model there on SQNR
without losing agreement: top-1 for class scores, the label sets for independent labels
(:func:`cle._measure.ties.agreement`); a value output's SQNR alone decides.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time

import numpy as np

from cle._measure.check import output_kinds
from cle._measure import evaluation as Q
from cle._measure.inference import predict
from cle._measure.ties import agreement
from cle._quantize.pool_spread import POOL_SPREAD
from cle._quantize.ranges import MAX_KEPT, PEAKED, POOLED, mse_range, tail_range
from cle._tflite import converter as tflite, quant_sim
from cle._tflite.flatgraph import FlatGraph, align, with_constants
from cle._tflite.layer_map import map_layers
from cle._tflite.runtime import TFLITE_BATCH

__all__ = ["TuneReport", "split_for_tuning", "tune_build", "tune_ranges"]

#: Tensors whose ranges are tried (those that add most to the output's error alone).
TOP = 8
#: Share by which a tensor's output error alone must drop for a new range to be kept.
MIN_GAIN = 0.1
#: Tuning inputs the ranking and the choices are measured on (the check of the whole uses all).
RANK_INPUTS, CHOICE_INPUTS = 2, 4
#: The ranges tried besides a tensor's 1e-4 tails: min/max, the least-MSE range of the tensor
#: alone, and narrower tails (which the output measured better than both on MobileNetV2's
#: worst tensors).
KINDS = ("min/max", "least MSE", "1e-3 tails", "1e-2 tails")
#: Calibration inputs the bias correction measures the mean error of each layer's input
#: quantization on.
BIAS_INPUTS = 2
#: Held-out inputs at least, for them to be split into tuning and check halves.
SPLIT_MIN = 8
#: Without data: synthetic calibration inputs the tuning uses (evenly spread over them).
SYNTHETIC_TUNE = 16


@dataclasses.dataclass
class TuneReport:
    """What ``tune=True`` tried and kept.

    Attributes:
        inputs: what the choices were measured on; ``n`` how many.
        tried: tensors whose ranges were tried (``(tensor, before, after, error_ratio)`` in
            ``changes`` for those that took a new one: the output's error with that tensor
            alone quantized, after over before).
        before, after: ``top1_agreement`` (None for a value output), ``agreement`` (what it
            counts: ``"top-1"``, ``"label-set"`` for independent labels, or None) and
            ``sqnr_db`` of the untuned and tuned models on the tuning inputs.
        kept: whether the tuned ranges are the ones written; ``reason`` says why (not).
        seconds: wall time.
        bias: the bias correction tried after the ranges: ``layers`` corrected, ``kept``,
            ``reason``, ``before``/``after`` on the tuning inputs.
        held_out: the tuning inputs are held-out calibration inputs the check does not use.
        flatters: the check runs on the tuning inputs too (too few were held out to split).
    """

    inputs: str
    n: int
    tried: int
    changes: list
    before: dict
    after: dict | None
    kept: bool
    reason: str
    seconds: float = 0.0
    bias: dict | None = None
    held_out: bool = False
    flatters: bool = False

    def lines(self) -> list[str]:
        out = [f"tuning on {self.n} {self.inputs}: {self.tried} tensors' ranges tried, "
               f"{len(self.changes)} changed; {self.reason}"]
        if self.bias is not None:
            out.append(f"  bias correction for the quantization of each layer's inputs: "
                       f"{self.bias['layers']} layers; {self.bias['reason']}")
        for t, before, after, ratio in self.changes:
            out.append(f"  {t}: {before['low']:.3g}..{before['high']:.3g} ({before['how']}) -> "
                       f"{after['low']:.3g}..{after['high']:.3g} ({after['how']}), its error "
                       f"alone ×{ratio:.2f}")
        return out

    def to_dict(self) -> dict:
        return {"inputs": self.inputs, "n": self.n, "tried": self.tried,
                "changes": [{"tensor": t, "before": b, "after": a, "error_ratio": r}
                            for t, b, a, r in self.changes],
                "before": self.before, "after": self.after, "kept": self.kept,
                "reason": self.reason, "bias": self.bias, "held_out": self.held_out,
                "flatters": self.flatters, "seconds": self.seconds}

    def warnings(self) -> list[str]:
        if not self.flatters:
            return []
        return ["the check ran on the tuning inputs too (too few calibration inputs were "
                "held out to split them): its figures flatter the tuned model; give more "
                "calibration data"]


def split_for_tuning(build):
    """``(x_tune, what, held_out, checks)``: the tuning inputs (an array: one-input models),
    what they are, whether they are held-out calibration inputs, and the check's sets of
    inputs after the split (see the module docstring)."""
    if build.calibration != "data":
        cal = build.inputs.calibration
        step = max(1, len(cal) // SYNTHETIC_TUNE)
        return (cal.arrays[0][::step], "synthetic calibration inputs (the check's sets are "
                "others, which neither the calibration nor the tuning saw)", False,
                list(build.inputs.checks))
    label, x = build.inputs.checks[0]
    if build.inputs.held_out and len(x) >= SPLIT_MIN:
        half = len(x) // 2
        return (x.arrays[0][:half], f"{label} (the check uses the other {len(x) - half})",
                True, [(label, x[half:])])
    return (x.arrays[0], label, False,
            [(f"{label}, also the tuning inputs: the check flatters", x)])


def tune_build(build, model, say):
    """Tune the :class:`cle._quantize.pipeline.Int8Build` ``build`` in place: its
    ``content``, ``ranges``, ``tuning`` and the check's inputs (``inputs.checks``)."""
    x_tune, what, held_out, checks = split_for_tuning(build)
    content, ranges, report = tune_ranges(build, model, x_tune, what, build.opts.per_channel,
                                          build.opts.integer_io, say)
    report.held_out = held_out
    report.flatters = build.calibration == "data" and not held_out
    build.content, build.ranges, build.tuning = content, ranges, report
    build.inputs.checks = checks


def _fixed(build, integer_io) -> set:
    """Tensors whose range is not open to tuning: the output and the logits before a softmax
    (they decide the top class), the input when its range is stated, usual or int8, and
    the tensors kept at min/max for a global max pooling or a map of sparse peaks and the
    widened outputs of a global average pooling (the inputs the tuning measures on do not
    show what their tails cut, nor how far new inputs' averages reach)."""
    protected, inputs = tflite.protected_indices(build.calibrated)
    fixed = set(protected)
    for r in build.ranges:
        if r.how in ("input range", "usual range", MAX_KEPT, PEAKED, POOLED,
                     POOL_SPREAD) or (
                integer_io and r.index in inputs):
            fixed.add(r.index)
    return fixed


def _alone(sim, x, tensors, n) -> dict:
    """Output error energy on ``x[:n]`` with each switch of ``tensors`` (switch index lists)
    alone on: ``{key: energy}``."""
    keys = list(tensors)
    plan = [row for i in range(n) for row in [(i, None)] + [(i, k) for k in keys]]
    masks = np.zeros((len(plan), len(sim.switches)), np.float32)
    for r, (_, k) in enumerate(plan):
        if k is not None:
            masks[r, tensors[k]] = 1.0
    out, ref, energy = sim.float_graph.outputs[0], {}, dict.fromkeys(keys, 0.0)

    def consume(start, stop, read):
        y = read(out).astype(np.float64)
        for r in range(start, stop):
            i, k = plan[r]
            if k is None:
                ref[i] = y[r - start]
            else:
                energy[k] += float(np.sum((y[r - start] - ref[i]) ** 2))

    sim.run(x, np.array([p[0] for p in plan]), masks, consume)
    return energy


def _candidate(kind, r, values):
    """``(low, high)`` of one candidate kind for a tensor, or None."""
    if kind == "min/max":
        return r.calibrated
    if values is None:
        return None
    if kind == "least MSE":
        return mse_range(values, *r.calibrated)
    return tail_range(values, r.calibrated, float(kind.split()[0]))


def _candidates(build, top) -> dict:
    """``{kind: ranges}``: every tensor's range, the ``top`` ones set to that kind where it
    applies."""
    out = {}
    for kind in KINDS:
        ranges = copy.deepcopy(build.ranges)
        for r in ranges:
            values = build.values.get(r.index) if build.values else None
            pick = _candidate(kind, r, values) if r.index in top else None
            if pick is not None:
                r.lo, r.hi, r.how = pick[0], pick[1], kind
        out[kind] = ranges
    return out


def tune_ranges(build, model, x_tune, inputs: str, per_channel: bool, integer_io: bool, say):
    """``(content, ranges, TuneReport)``: the tuned ``.tflite`` and its ranges, or the
    untuned ones when no change measures better (see the module docstring)."""
    start = time.perf_counter()
    f = FlatGraph(build.calibrated)
    fixed = _fixed(build, integer_io)
    sim = quant_sim.build(build.calibrated, build.content, like=x_tune)
    open_ = {s.tensor: [s.index] for s in sim.switches
             if s.kind == "activation" and not s.requantize and s.tensor not in fixed
             and s.tensor in {r.index for r in build.ranges}}
    say(f"tuning: ranking {len(open_)} activation tensors on {min(RANK_INPUTS, len(x_tune))} "
        "inputs")
    rank = _alone(sim, x_tune, open_, min(RANK_INPUTS, len(x_tune)))
    top = sorted(rank, key=lambda t: -rank[t])[:TOP]
    kinds = _candidates(build, set(top))
    alternatives = {t: [] for t in top}
    for kind, ranges in kinds.items():
        calibrated = tflite.with_ranges(build.calibrated, ranges)
        content = tflite.quantize_calibrated(calibrated, per_channel=per_channel,
                                             integer_io=integer_io)
        q = FlatGraph(content)
        int8_of = align(f, q).int8_of
        for t in top:
            alternatives[t].append(q.params(int8_of[t]))
    sim = quant_sim.build(build.calibrated, build.content, alternatives=alternatives,
                          like=x_tune)
    switches = {(s.tensor, s.alternative): s.index for s in sim.switches
                if s.tensor in alternatives and not s.requantize and s.kind == "activation"}
    say(f"tuning: trying {len(kinds)} other ranges for each of the {len(top)} tensors that add "
        "most")
    energy = _alone(sim, x_tune, {key: [i] for key, i in switches.items()},
                    min(CHOICE_INPUTS, len(x_tune)))
    ranges, changes = _choose(build, kinds, top, energy, _names(build, x_tune, f))
    report = TuneReport(inputs, len(x_tune), len(top), changes, {}, None, False, "")
    content, calibrated = build.content, build.calibrated
    if changes:
        content, calibrated, report = _check(build, model, x_tune, ranges, report, per_channel,
                                             integer_io)
    else:
        report.reason = "no other range measured better"
    content = _tune_biases(build, model, x_tune, calibrated, content, report, per_channel,
                           integer_io, say)
    report.seconds = time.perf_counter() - start
    return (content, ranges if report.kept else build.ranges, report)


def _figures(model_outputs, content, x, kind):
    """``top1_agreement`` (None for values), ``agreement`` (what it counts: ``"top-1"``, or
    ``"label-set"`` for independent labels, :func:`cle._measure.ties.agreement`; None) and
    ``sqnr_db`` of the file ``content`` on ``x`` against the float model's ``model_outputs``,
    its output of kind ``kind`` (:func:`cle._measure.check.output_kinds`)."""
    y = Q.run_tflite(content, x, batch_size=TFLITE_BATCH)
    top1, labels = agreement(model_outputs, y, kind)
    counted = not math.isnan(top1)
    return {"top1_agreement": top1 if counted else None,
            "agreement": ("label-set" if labels else "top-1") if counted else None,
            "sqnr_db": Q.sqnr_db(model_outputs, y)}


def _kind(build, model) -> str:
    """The kind of the model's one output, as the check reads it."""
    return output_kinds(model, build.opts.output_kinds)[0]


def _better(before, after) -> bool:
    """Closer in SQNR, and no lower in agreement where the output has one (a value output's
    SQNR alone decides: its argmax means nothing)."""
    return after["sqnr_db"] > before["sqnr_db"] and (
        before["top1_agreement"] is None or after["top1_agreement"] >= before["top1_agreement"])


def _verdict(before, after, better) -> str:
    told = (f", {before['agreement']} agreement {before['top1_agreement']:.1%} -> "
            f"{after['top1_agreement']:.1%}" if before["top1_agreement"] is not None else "")
    return (f"{'kept' if better else 'not kept'}: SQNR {after['sqnr_db'] - before['sqnr_db']:+.2f} "
            f"dB{told} on the tuning inputs")


def _tune_biases(build, model, x_tune, calibrated, content, report, per_channel, integer_io,
                 say):
    """Correct every bias for the INT8 model's mean error at its layer's pre-activation
    (measured on calibration inputs); keep it if it checks better on the tuning inputs."""
    x = build.inputs.calibration.arrays[0][:BIAS_INPUTS]
    say(f"tuning: bias correction for the error of each layer's input quantization, measured "
        f"on {len(x)} calibration inputs")
    new_calibrated, new_content, layers = correct_biases(calibrated, content, x, per_channel,
                                                         integer_io)
    if layers == 0:
        report.bias = {"layers": 0, "kept": False, "before": None, "after": None,
                       "reason": "no operator with weights has a bias input to correct (the "
                                 "converter of a JAX model adds each bias as an operator of "
                                 "its own)"}
        return content
    reference = predict(model, x_tune)
    kind = _kind(build, model)
    before = _figures(reference, content, x_tune, kind)
    after = _figures(reference, new_content, x_tune, kind)
    better = layers > 0 and _better(before, after)
    report.bias = {"layers": layers, "kept": better, "reason": _verdict(before, after, better),
                   "before": before, "after": after}
    return new_content if better else content


def correct_biases(calibrated, content, x, per_channel, integer_io):
    """``(calibrated, content, layers)``: each operator's bias less the mean, per output
    channel, of the error the quantization of its inputs alone (their range and rounding, on
    float values, the rest in float) leaves at its pre-activation on ``x``. The weights' own
    error is not corrected again: the float model already carries its bias correction."""
    sim = quant_sim.build(calibrated, content, pre_activations=True, like=x)
    f = sim.float_graph
    reads = {}
    for key in sim.readable:
        if not isinstance(key, tuple):
            continue
        op = f.ops[key[1]]
        b_at = quant_sim.WEIGHT_OPS[op.kind][1]
        if b_at >= len(op.inputs) or op.inputs[b_at] < 0 or f.constant(op.inputs[b_at]) is None:
            continue
        feeds = {t for t in op.inputs if t >= 0}
        switches = [s.index for s in sim.switches if s.kind == "activation" and not s.alternative
                    and ((s.tensor in feeds and not s.requantize)
                         or (s.requantize and s.op == op.index))]
        if switches:
            reads[key] = (op.inputs[b_at], switches)
    deltas = _mean_errors(sim, x, reads)
    values = {t: f.constant(t) - deltas[key] for key, (t, _) in reads.items()}
    calibrated = with_constants(calibrated, values)
    content = tflite.quantize_calibrated(calibrated, per_channel=per_channel,
                                         integer_io=integer_io)
    return calibrated, content, len(values)


def _mean_errors(sim, x, reads) -> dict:
    """Per key of ``reads`` (``("pre", op) -> (bias tensor, switches)``): the mean over
    samples and positions, per channel, of the pre-activation with those switches alone on
    less its value with every switch off."""
    keys = list(reads)
    plan = [(i, key) for i in range(len(x)) for key in [None] + keys]
    masks = np.zeros((len(plan), len(sim.switches)), np.float32)
    for r, (_, key) in enumerate(plan):
        if key is not None:
            masks[r, reads[key][1]] = 1.0
    sums, counts, off = {}, dict.fromkeys(keys, 0), {}

    def consume(start, stop, read):
        for r in range(start, stop):
            i, key = plan[r]
            if key is None:
                off[i] = {k: read(k)[r - start].astype(np.float64) for k in keys}
                continue
            v = read(key)[r - start].astype(np.float64)
            d = (v - off[i][key]).reshape(-1, v.shape[-1])
            sums[key] = sums.get(key, 0.0) + d.sum(axis=0)
            counts[key] += d.shape[0]

    sim.run(x, np.array([p[0] for p in plan]), masks, consume)
    return {key: (sums[key] / counts[key]).astype(np.float32) for key in keys}


def _names(build, x, f) -> dict:
    """Tensor -> the Keras layer whose entry computes it (``layer (tensor n)`` when the entry
    has several tensors), for the report."""
    lmap = map_layers(build.equalized, build.calibrated, x[:2])
    names = {}
    for entry in lmap.entries:
        outs = [t for k in entry.ops for t in f.ops[k].outputs]
        for t in outs:
            names[t] = entry.name if t == entry.tensor else f"{entry.name} (inside: {f.name(t)})"
    for t in f.inputs:
        names[t] = "the model input"
    return names


def _choose(build, kinds, top, energy, names):
    ranges = copy.deepcopy(build.ranges)
    by_index = {r.index: r for r in ranges}
    changes = []
    for t in top:
        base = energy.get((t, 0), 0.0)
        options = [(energy.get((t, j), np.inf), kind) for j, kind in enumerate(kinds, 1)]
        best, kind = min(options)
        if base > 0 and best <= (1.0 - MIN_GAIN) * base:
            new = next(r for r in kinds[kind] if r.index == t)
            old = by_index[t]
            before = {"low": float(old.lo), "high": float(old.hi), "how": old.how}
            old.lo, old.hi, old.how = new.lo, new.hi, new.how
            changes.append((names.get(t, str(t)), before,
                            {"low": float(new.lo), "high": float(new.hi), "how": new.how},
                            best / base))
    return ranges, changes


def _check(build, model, x, ranges, report, per_channel, integer_io):
    calibrated = tflite.with_ranges(build.calibrated, ranges)
    content = tflite.quantize_calibrated(calibrated, per_channel=per_channel,
                                         integer_io=integer_io)
    reference = predict(model, x)
    kind = _kind(build, model)
    report.before = _figures(reference, build.content, x, kind)
    report.after = _figures(reference, content, x, kind)
    report.kept = _better(report.before, report.after)
    report.reason = _verdict(report.before, report.after, report.kept)
    if report.kept:
        return content, calibrated, report
    return build.content, build.calibrated, report
