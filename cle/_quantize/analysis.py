"""The implementation of :func:`cle.analysis.analyze` (documented in :mod:`cle.analysis`).

It builds the ``.tflite`` :func:`cle.quantize` would write (through its door and the same
stages, :func:`cle._quantize.pipeline.build_checked`; any number of inputs and outputs),
pairs every Keras layer with its operators and tensors in it
(:func:`cle._tflite.layer_map.map_layers`), and measures on the check inputs:

* the INT8 model itself, every tensor kept: each layer's output against the float model's;
* the switchable simulation of the INT8 model (:mod:`cle._tflite.quant_sim`), one run per
  layer with that layer's weights alone quantized and one with its activations alone, the
  rest of the network in float: the layer's own output against float (the layer's weight and
  activation SQNR) and the model's output against float (what the layer adds to the
  output's error);
* the check's own figures: the ``.tflite`` against the Keras model, top-1 agreement and SQNR,
  on the same inputs as :func:`cle.quantize`'s check (without data, the lower of its two sets
  of synthetic inputs the calibration never saw; the per-layer runs use that set).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import numpy as np

from cle._core.backend import exact_kernels
from cle._core.checks import check_model
from cle._core.traced import functional_for
from cle._quantize import analysis_stats as describe
from cle._quantize import weight_stages
from cle._quantize.analysis_report import AnalysisReport, LayerReport
from cle._quantize.choice import chooses, refit_cle
from cle._quantize.options import QuantizeOptions
from cle._quantize import synthetic_choice
from cle._quantize.pipeline import build_checked, check_label, check_sets, lower
from cle._tflite import converter as tflite, quant_sim
from cle._tflite.flatgraph import FlatGraph, dequantize
from cle._tflite.layer_map import Entry, map_layers
from cle._tflite.runtime import (input_details_by_name, input_name, interpreter,
                                 keras_output_order, to_input)

__all__ = ["analyze"]

#: Check inputs the per-layer runs use (each costs one run of the simulation per layer).
LAYER_INPUTS = 4
#: Inputs the Keras layers are paired with the flatbuffer's tensors on.
PROBE_INPUTS = 2
#: Rows of the simulation per invocation.
SIM_BATCH = 16


def analyze(model, calibration_data=None, *, per_channel: bool = True,
            integer_io: bool = False, bias_correction: str = "auto",
            ranges: str = "auto", input_range=None, seed: int = 0,
            layer_inputs: int = LAYER_INPUTS,
            progress: Callable[[str], Any] | None = None, output_kinds=None) -> AnalysisReport:
    """Where the INT8 error of ``model`` comes from, layer by layer (see :mod:`cle.analysis`)."""
    opts = QuantizeOptions.from_call(
        calibration_data, per_channel=per_channel, integer_io=integer_io,
        bias_correction=bias_correction, ranges=ranges, input_range=input_range, seed=seed,
        output_kinds=output_kinds)
    return analyze_checked(model, calibration_data, opts, layer_inputs, progress)


def holds_cle_build(build) -> bool:
    """Whether a :class:`cle._quantize.pipeline.Int8Build` that ``quantize_checked`` made
    holds cle's build as :func:`analyze_checked` analyses it: its choice kept cle's build (its
    ranges then calibrated on every input), or it made no choice."""
    return not chooses(build) or (build.crossfit is not None
                                  and build.crossfit["written"] == "cle")


@exact_kernels
def analyze_checked(model, calibration_data, opts: QuantizeOptions,
                    layer_inputs: int = LAYER_INPUTS, progress=None,
                    build=None) -> AnalysisReport:
    """:func:`analyze` with :func:`cle.quantize`'s options already made (``cle analyze``).
    ``build``: the :class:`cle._quantize.pipeline.Int8Build` a ``quantize_checked`` call made
    of the same model, data and options (``builds=``) that wrote cle's build (its choice kept
    it, or made none): analysed as it is, not built again (``cle demo``)."""
    say = progress if progress is not None else (lambda message: None)
    if isinstance(layer_inputs, bool) or not isinstance(layer_inputs, (int, np.integer)) or (
            layer_inputs < 1):
        raise ValueError("`layer_inputs` must be a positive integer. Received: "
                         f"layer_inputs={layer_inputs!r}")
    if opts.rounds:
        raise ValueError("cle.analyze measures the INT8 model TF Lite's converter writes "
                         "(8-bit weights rounded to nearest); its simulation does not read "
                         "INT4 weights or kernels the rounding stage stored. Received: "
                         f"weight_bits={opts.weight_bits}, rounding={opts.rounding!r}")
    if opts.activation_bits != 8 or opts.tune or opts.compare:
        raise ValueError("cle.analyze analyses the INT8 model cle.quantize writes with 8-bit "
                         "activations, untuned, without a comparison. Received: "
                         f"activation_bits={opts.activation_bits}, tune={opts.tune}, "
                         f"compare={opts.compare}")
    check_model(model)
    model, traced = functional_for(model, calibration_data)  # a subclassed model, traced
    if build is None:
        build = build_checked(model, calibration_data, opts, say)
        if chooses(build):  # the file cle.quantize writes when it keeps cle's build
            refit_cle(model, build, say)
        else:  # without data: the ranges cle.quantize chooses on its check's synthetic sets
            synthetic_choice.choose(model, build, say)
    elif build.opts != opts or not holds_cle_build(build):
        raise ValueError("cle.analyze analyses cle's build: the build of a cle.quantize call "
                         "with the same options that wrote it")
    build.values, build.extremes = None, {}  # the samples are large, and not read here
    sets = check_sets(model, build, say)
    outputs = lower(sets)
    worst = min(range(len(sets)), key=lambda k: min(o.sqnr_db for o in sets[k]["outputs"]))
    x_check = build.inputs.checks[worst][1]
    seconds = dict(build.seconds)  # a build given keeps its own
    start = time.perf_counter()
    x_layer = x_check[: min(int(layer_inputs), len(x_check))]
    reference = _float_reference(build, say)
    say(f"pairing the model's layers with the .tflite's tensors on {min(PROBE_INPUTS, len(x_layer))}"
        " inputs")
    lmap = map_layers(build.equalized, reference, x_layer[:PROBE_INPUTS])
    sim = quant_sim.build(reference, build.content, watch=[e.tensor for e in lmap.entries],
                          like=x_layer)
    entries, entry_of = _with_switches(_input_entries(x_layer.names, sim) + lmap.entries,
                                       lmap.owner, sim)
    seconds["map"] = time.perf_counter() - start

    start = time.perf_counter()
    measured = _Measure(sim, entries, entry_of, x_layer)
    say(f"measuring {len(entries)} layers on {len(x_layer)} inputs "
        f"({len(measured.rows)} runs of the simulated INT8 model)")
    sim.run(x_layer, measured.rows, measured.masks, measured.consume, batch=SIM_BATCH)
    measured.real(build.content)
    seconds["layers"] = time.perf_counter() - start

    return AnalysisReport(
        target={"per_channel": bool(opts.per_channel), "integer_io": bool(opts.integer_io)},
        calibration=build.calibration, n_calibration=build.n_calibrated,
        check_inputs=check_label(sets), n_check=sum(c["n"] for c in sets),
        n_layer_inputs=len(x_layer), layer_inputs=sets[worst]["inputs"],
        calibration_inputs=build.inputs.what, bias_correction=opts.bias_mode,
        output={"top1_agreement": outputs[0].top1_agreement, "sqnr_db": outputs[0].sqnr_db,
                "agreement": outputs[0].agreement},
        outputs=[o.to_dict() for o in outputs],
        layers=_layers(entries, measured, build, sim, [o.name for o in outputs]),
        unmatched=list(lmap.unmatched),
        simulation=measured.summary(), tflite=build.content, seconds=seconds,
        equalization=build.equalization,
        notes=([traced] if traced else []) + _rewritten(build.equalization) + build.notes)


def _rewritten(equalization) -> list[str]:
    """A note naming the layers of the input model the layers below stand for, where the
    prepared model put cle's exact forms in their place (``equalization.stable_changed``)."""
    names = list(getattr(equalization, "stable_changed", []))
    if not names:
        return []
    return [f"the layers below are those of cle's prepared model: a StableActivation or a "
            f"ChannelAffine stands for each of {', '.join(repr(n) for n in names)} (the same "
            f"function in a form 8-bit tensors can hold); one split out of a layer is named "
            f"'<layer>_<activation>'"]


def _float_reference(build, say) -> bytes:
    """The float flatbuffer the INT8 model is measured against: the build's own, or, when
    the kernels were put on their grids before converting (``rounding="tapsum"``), the
    equalized model with its float kernels given back, converted again and given the
    build's ranges (else each such layer's weight error would not show)."""
    if not build.snapped:
        return build.calibrated
    say("converting the equalized model with its float kernels, as the float reference")
    weight_stages.unsnap(build.equalized, build.snapped)
    # The build's ranges are written into every tensor that carries one, so one input gives
    # the converter the layout they need (as in the build's own conversion).
    calibrated = tflite.calibrate(build.equalized, build.inputs.calibration[:1])
    return tflite.with_ranges(calibrated, build.ranges)


def _input_entries(names, sim) -> list[Entry]:
    """Each model input's own quantization, named after its ``InputLayer`` (``names``, in
    the order of the model's inputs)."""
    graph = sim.float_graph
    found = {input_name(graph.name(t)): t for t in graph.inputs}
    tensors = ([found[n] for n in names] if all(n in found for n in names)
               else sorted(graph.inputs))
    return [Entry(n or "input", [n or "input"], "InputLayer", t)
            for n, t in zip(names, tensors)]


def _with_switches(entries, owner, sim) -> tuple[list[Entry], np.ndarray]:
    """The entries that own a quantization (a layer the INT8 model computes exactly, such as
    zero padding at its input's scale, has none), and each switch's entry among them.
    ``entries`` are the model inputs' then the layer map's; ``owner`` (operator -> entry of
    the layer map, -1 for none) places an operator's switches (an operator of no entry
    counts for the first input)."""
    n_in = len(sim.float_graph.inputs)
    inputs = {e.tensor: k for k, e in enumerate(entries[:n_in])}
    full = [inputs.get(s.tensor, 0) if s.op < 0 else
            (n_in + owner[s.op] if owner.get(s.op, -1) >= 0 else 0) for s in sim.switches]
    keep = sorted(set(full))
    new = {old: k for k, old in enumerate(keep)}
    return [entries[k] for k in keep], np.array([new[e] for e in full], np.int64)


class _Measure:
    """The simulation's rows (per input: all switches off, all on, then each entry's weights
    alone and activations alone) and what they measure."""

    def __init__(self, sim, entries, entry_of, x):
        self.sim, self.entries, self.x, self.entry_of = sim, entries, x, entry_of
        n_e = len(entries)
        kinds = np.array([s.kind if s.alternative == 0 else "alternative"
                          for s in sim.switches])
        graph = sim.float_graph
        self.outputs = [graph.outputs[k] for k in
                        keras_output_order([graph.name(t) for t in graph.outputs],
                                           [graph.name(t) for t in graph.inputs])]
        plan = []  # (input, what, entry)
        for i in range(len(x)):
            plan += [(i, "off", -1), (i, "on", -1)]
            for e in range(n_e):
                for what in ("weight", "activation"):
                    if np.any((self.entry_of == e) & (kinds == what)):
                        plan.append((i, what, e))
        self.plan = plan
        self.rows = np.array([p[0] for p in plan], np.int64)
        self.masks = np.zeros((len(plan), len(sim.switches)), np.float32)
        for r, (i, what, e) in enumerate(plan):
            if what == "on":
                self.masks[r] = 1.0
            elif what != "off":
                self.masks[r] = (self.entry_of == e) & (kinds == what)
        self.ref: dict = {}
        z = np.zeros(n_e)
        self.signal, self.sim_noise, self.real_noise = z.copy(), z.copy(), z.copy()
        self.local = {"weight": z.copy(), "activation": z.copy()}
        n_o = len(self.outputs)
        self.out = {"weight": np.zeros((n_e, n_o)), "activation": np.zeros((n_e, n_o))}
        self.out_signal, self.out_on = np.zeros(n_o), np.zeros(n_o)
        self.stats = [describe.Accumulator() for _ in entries]

    def consume(self, start, stop, read):
        cache = {}

        def get(t):
            if t not in cache:
                cache[t] = read(t)
            return cache[t]

        for r in range(start, stop):
            i, what, e = self.plan[r]
            b = r - start
            y = [get(t)[b].astype(np.float64) for t in self.outputs]
            if what == "off":
                self.ref[i] = {"out": y}
                self.out_signal += [float(np.sum(v ** 2)) for v in y]
                for k, entry in enumerate(self.entries):
                    v = get(entry.tensor)[b]
                    self.ref[i][k] = v
                    self.signal[k] += float(np.sum(v.astype(np.float64) ** 2))
                    self.stats[k].add(v, self._params(k))
                continue
            if what == "on":
                self.out_on += [_energy(v, w) for v, w in zip(y, self.ref[i]["out"])]
                for k, entry in enumerate(self.entries):
                    self.sim_noise[k] += _energy(get(entry.tensor)[b], self.ref[i][k])
                continue
            self.local[what][e] += _energy(get(self.entries[e].tensor)[b], self.ref[i][e])
            self.out[what][e] += [_energy(v, w) for v, w in zip(y, self.ref[i]["out"])]

    def _params(self, k):
        """The INT8 quantization of entry ``k``'s output tensor (None: not quantized)."""
        t = self.entries[k].tensor
        for s in self.sim.switches:
            if s.tensor == t and s.params is not None and not s.requantize:
                return s.params
        return None

    def real(self, content):
        """Each entry's output in the INT8 model itself against the float values."""
        interp = interpreter(content, preserve_all_tensors=True)
        ins = input_details_by_name(interp, self.x.names)
        for d, a in zip(ins, self.x.arrays):
            interp.resize_tensor_input(d["index"], (1,) + a.shape[1:], strict=False)
        interp.allocate_tensors()
        int8_of = self.sim.alignment.int8_of
        q = FlatGraph(content)
        for i in range(len(self.x)):
            for d, a in zip(ins, self.x.arrays):  # integer inputs (integer_io) quantized
                interp.set_tensor(d["index"], to_input(a[i: i + 1], d))
            interp.invoke()
            for k, entry in enumerate(self.entries):
                u = int8_of.get(entry.tensor)
                if u is None or q.params(u) is None:
                    self.real_noise[k] = np.nan
                    continue
                v = dequantize(interp.get_tensor(u), q.params(u))  # one sample's
                self.real_noise[k] += _energy(v.reshape(np.shape(self.ref[i][k])),
                                              self.ref[i][k])
        self.ref = {}

    def relative(self, noise) -> np.ndarray:
        """Output noise energies (last axis: one per output) over each output's signal,
        summed over the outputs: the error of several outputs in one figure (for one
        output, its noise over its signal)."""
        return np.sum(np.asarray(noise) / np.maximum(self.out_signal, 1e-300), axis=-1)

    def layer_errors(self) -> tuple[np.ndarray, float]:
        """Each layer's output error alone (:meth:`relative`, weights and activations) and
        their sum over the finite ones: a layer that, quantized alone, makes the simulated
        output non-finite (a LOG or RSQRT fed a value rounded to 0) is said apart."""
        each = self.relative(self.out["weight"] + self.out["activation"])
        return each, float(np.sum(each[np.isfinite(each)]))

    def summary(self) -> dict:
        _, total = self.layer_errors()
        whole = float(self.relative(self.out_on))
        return {"output_sqnr_db": min(_db(s, n) for s, n in zip(self.out_signal, self.out_on)),
                "sum_of_layers_share": total / whole if whole > 0 else np.nan,
                "n_runs": int(len(self.plan))}


def _energy(a, b) -> float:
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    return float(np.sum(d * d))


def _db(signal, noise) -> float:
    if noise <= 0:
        return float("inf")
    if signal <= 0:
        return float("-inf")
    return 10.0 * float(np.log10(signal / noise))


def _share(part, total) -> float:
    """``part`` of ``total``; inf for a part that is not finite (NaN: an output made
    non-finite), 0 when nothing adds up."""
    if not np.isfinite(part):
        return math.inf
    return float(part) / total if total > 0 else 0.0


def _layers(entries, m: _Measure, build, sim, names) -> list[LayerReport]:
    """One :class:`LayerReport` per entry; ``names``: the model's outputs'. With several
    outputs, a layer's output SQNR is the lowest of its outputs' and the shares are of the
    outputs' errors, each over its output's signal, summed (:meth:`_Measure.relative`)."""
    ranges = {r.index: r for r in build.ranges}
    protected = describe.protected_tensors(build.calibrated)
    folded = {}
    for pair in build.equalization.folded:
        folded.setdefault(pair.layer.name, []).append(pair.bn.name)
    added = m.out["weight"] + m.out["activation"]
    relative = {what: m.relative(m.out[what]) for what in ("weight", "activation")}
    both, total = m.layer_errors()  # a non-finite one's share is inf (_share)
    out = []
    for k, entry in enumerate(entries):
        has = {what: bool(np.any((m.entry_of == k) & np.array(
            [s.kind == what for s in sim.switches]))) for what in ("weight", "activation")}
        layers = list(entry.layers)
        for name in entry.layers:
            layers += [f"{bn} (folded)" for bn in folded.get(name, [])]
        per_output = [_db(s, n) for s, n in zip(m.out_signal, added[k])]
        r = ranges.get(entry.tensor)
        out.append(LayerReport(
            name=entry.name, layers=layers, kind=entry.kind, depth=k,
            sqnr_db=_db(m.signal[k], m.real_noise[k]),
            weight_sqnr_db=_db(m.signal[k], m.local["weight"][k]) if has["weight"] else None,
            activation_sqnr_db=(_db(m.signal[k], m.local["activation"][k])
                                if has["activation"] else None),
            simulated_sqnr_db=_db(m.signal[k], m.sim_noise[k]),
            output_sqnr_db=min(per_output),
            outputs_sqnr_db=dict(zip(names, per_output)) if len(names) > 1 else None,
            share=_share(both[k], total),
            weight_share=_share(relative["weight"][k], total),
            activation_share=_share(relative["activation"][k], total),
            range=describe.range_of(r, m.stats[k], protected),
            stats=m.stats[k].summary(),
            weights=describe.weights_of(sim.float_graph, entry.ops)))
    return out
