"""The report of :func:`cle.analysis.analyze`: one :class:`LayerReport` per layer, the output's
figures, the summary a person reads and the JSON ``cle analyze --report`` writes."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from cle._math.json_numbers import json_number, sqnr_label, sqnr_words
from cle._quantize import analysis_stats

__all__ = ["AnalysisReport", "LayerReport", "output_figures"]



def output_figures(output: dict, digits: int = 2) -> str:
    """"top-1 agreement …, SQNR … dB" of the model's output, the top-1 agreement only for
    class scores (it is None or NaN for other outputs)."""
    top1 = output.get("top1_agreement")
    sqnr = sqnr_label(output["sqnr_db"], digits)
    return sqnr if top1 is None or math.isnan(top1) else \
        f"{output.get('agreement') or 'top-1'} agreement {top1:.1%}, {sqnr}"

@dataclasses.dataclass
class LayerReport:
    """One layer of the INT8 model (with the layers the converter fused into it).

    Attributes:
        name: the Keras layer's name (of the input model; its first layer with weights).
        layers: every Keras layer the entry covers, folded batch norms included.
        kind: the Keras class of the named layer (``InputLayer`` for the model input's own
            quantization).
        depth: position along the network (0: the input).
        sqnr_db: SQNR of the layer's output in the INT8 ``.tflite`` against the float model
            (everything before it quantized too).
        weight_sqnr_db: SQNR of its output with its weights alone quantized, on float inputs,
            the rest in float (None: no weights).
        activation_sqnr_db: the same with its activations alone quantized (its output's
            range and rounding; None: no quantized activation).
        simulated_sqnr_db: ``sqnr_db`` in the simulation with everything quantized (how
            closely the simulation follows the ``.tflite``).
        output_sqnr_db: SQNR of the model's output with this layer alone quantized (with
            several outputs, the lowest of ``outputs_sqnr_db``).
        share: its share of the output's error (the sum of every layer's error alone; with
            several outputs, each output's error over its signal, summed);
            ``weight_share`` + ``activation_share``.
        range: the range of its output tensor: ``low``, ``high``, ``how`` it was chosen,
            ``calibrated`` (the min/max of the calibration inputs).
        stats: measured facts about its output (``channel_spread``, ``clipped``,
            ``clip_share``, ``steps_used``, ``step``).
        weights: measured facts about its weights (``channel_spread``, ``outlier``), or None.
        reason: what :meth:`AnalysisReport.summary` says about it.
        outputs_sqnr_db: with several outputs, ``{output: SQNR}`` with this layer alone
            quantized; None with one output.
    """

    name: str
    layers: list
    kind: str
    depth: int
    sqnr_db: float
    weight_sqnr_db: float | None
    activation_sqnr_db: float | None
    simulated_sqnr_db: float
    output_sqnr_db: float
    share: float
    weight_share: float
    activation_share: float
    range: dict
    stats: dict
    weights: dict | None
    reason: str = ""
    outputs_sqnr_db: dict | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "layers": list(self.layers),
                "depth": self.depth, "sqnr_db": json_number(self.sqnr_db),
                "weight_sqnr_db": json_number(self.weight_sqnr_db),
                "activation_sqnr_db": json_number(self.activation_sqnr_db),
                "range": dict(self.range), "output_sqnr_db": json_number(self.output_sqnr_db),
                "share": json_number(self.share), "weight_share": json_number(self.weight_share),
                "activation_share": json_number(self.activation_share),
                "simulated_sqnr_db": json_number(self.simulated_sqnr_db),
                "stats": dict(self.stats), "weights": self.weights, "reason": self.reason,
                "outputs_sqnr_db": None if self.outputs_sqnr_db is None else {
                    k: json_number(v) for k, v in self.outputs_sqnr_db.items()}}


def _fmt(value) -> str:
    if value is None:
        return "-"
    # -inf here: no signal, or a simulated output made non-finite by the layer (analysis._db)
    return "no SQNR (a zero or non-finite output)" if value == -math.inf else sqnr_words(value)


@dataclasses.dataclass
class AnalysisReport:
    """Where the INT8 error of a model comes from (:func:`cle.analysis.analyze`).

    Attributes:
        target: ``per_channel``, ``integer_io``.
        calibration: "data" or "synthetic"; ``n_calibration`` inputs calibrated the ranges.
        check_inputs: what the output's figures were measured on (those of
            :func:`cle.quantize`'s check: held-out calibration inputs, or without data two
            sets of synthetic inputs the calibration never saw, the lower figure);
            ``n_check`` of them; the per-layer runs on the first ``n_layer_inputs`` of
            ``layer_inputs`` (without data, the set with the lower figure).
        calibration_inputs: what the calibration inputs are (without data: how many were
            distilled, how many are natural-image-like).
        bias_correction: the bias correction run.
        output: ``top1_agreement``, ``sqnr_db`` and ``agreement`` (what the agreement counts,
            :attr:`cle._measure.check.OutputCheck.agreement`) of the ``.tflite`` against the
            Keras model on the check inputs (what :func:`cle.quantize` reports), of its first
            output.
        outputs: every output's figures (``output``, ``kind``, ``sqnr_db``,
            ``top1_agreement``, ``agreement``), in the order of ``model.outputs``.
        layers: one :class:`LayerReport` per layer, in the order of the network.
        unmatched: ``(layer, reason)`` for layers with weights no entry holds.
        simulation: ``output_sqnr_db`` of the simulated INT8 model, ``sum_of_layers_share``
            (the layers' errors alone, summed, over the simulated model's output error) and
            ``n_runs``.
        tflite: the ``.tflite`` analysed (what :func:`cle.quantize` writes with these options).
        seconds: wall time of each stage.
        equalization: the equalize stage's :class:`cle.EqualizationReport`.
        notes: what the reader should know of the model analysed: a subclassed model's
            ``call()`` traced into a Functional model of its layers, which was analysed
            (:func:`cle._core.traced.functional_for`).
    """

    target: dict
    calibration: str
    n_calibration: int
    check_inputs: str
    n_check: int
    n_layer_inputs: int
    bias_correction: str
    output: dict
    layers: list
    unmatched: list
    simulation: dict
    tflite: bytes = dataclasses.field(repr=False, default=b"")
    seconds: dict = dataclasses.field(default_factory=dict)
    equalization: Any = dataclasses.field(repr=False, default=None)
    layer_inputs: str = ""
    calibration_inputs: str = "inputs given"
    outputs: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)

    def __post_init__(self):
        for layer in self.layers:
            if not layer.reason:
                layer.reason = analysis_stats.reason(layer, self.target["per_channel"])

    def worst(self, n: int = 5) -> list:
        """The ``n`` layers that add the most to the output's error, most first."""
        ranked = sorted(self.layers, key=lambda layer: -layer.share)
        return [layer for layer in ranked[:n] if layer.share > 0]

    def summary(self, n: int = 5) -> str:
        """The output's figures and the ``n`` worst layers, each with its reason."""
        t = self.target
        data = (f"{self.n_calibration} inputs given" if self.calibration == "data" else
                f"no real data: {self.n_calibration} synthetic inputs, "
                f"{self.calibration_inputs} (figures on synthetic inputs are a guess of what "
                "real inputs do: check on real inputs)")
        lines = [
            f"target: INT8 weights {'per-channel' if t['per_channel'] else 'per-tensor'}, "
            f"8-bit activations, {'int8' if t['integer_io'] else 'float32'} input/output; "
            f"calibration: {data}",
            *(f"note: {note}" for note in self.notes),
            *self._output_lines(),
            f"per-layer runs on {self.n_layer_inputs} "
            f"{'of them' if self.layer_inputs in ('', self.check_inputs) else self.layer_inputs}"
            ", each layer quantized alone: " + self._sum_line(),
            "worst layers (share of the output's error; output SQNR with the layer alone "
            "quantized; its own output's SQNR from weights / activations alone):",
        ]
        for k, layer in enumerate(self.worst(n), 1):
            share = (f"{layer.share:.0%}" if math.isfinite(layer.share) else
                     "quantized alone, it makes the simulated output non-finite")
            lines.append(f"  {k}. {layer.name} ({layer.kind}): {share}, "
                         f"{_fmt(layer.output_sqnr_db)}; weights "
                         f"{_fmt(layer.weight_sqnr_db)}, activations "
                         f"{_fmt(layer.activation_sqnr_db)}")
            lines.append(f"     {layer.reason}")
        for name, why in self.unmatched:
            lines.append(f"not analysed: {name}: {why}")
        return "\n".join(lines)

    __str__ = summary

    def _sum_line(self) -> str:
        share = self.simulation["sum_of_layers_share"]
        if math.isfinite(share):
            return f"their output errors add up to {share:.0%} of the INT8 model's"
        if self.simulation["output_sqnr_db"] == math.inf:
            return "the simulated INT8 model has no output error for them to add up to"
        return ("the simulation of the whole INT8 model gave a non-finite output, so the "
                "shares below are of the layers' summed errors")

    def _output_lines(self) -> list[str]:
        if len(self.outputs) < 2:
            return [f"output on {self.n_check} {self.check_inputs}: "
                    f"{output_figures(self.output)}"]
        lines = [f"outputs on {self.n_check} {self.check_inputs} (a layer's output SQNR "
                 "below is the lowest of its outputs', its share of their errors summed, "
                 "each over its output's signal):"]
        for o in self.outputs:
            lines.append(f"  output '{o['output']}': {output_figures(o)}")
        return lines

    def to_dict(self) -> dict:
        """A JSON-ready dict (what ``cle analyze --report`` writes): the output entry and one
        entry per layer."""
        return {"target": dict(self.target), "calibration": self.calibration,
                "n_calibration": self.n_calibration, "bias_correction": self.bias_correction,
                "calibration_inputs": self.calibration_inputs,
                "check": {"inputs": self.check_inputs, "n": self.n_check,
                          "layer_inputs": self.layer_inputs or self.check_inputs,
                          "n_layer_inputs": self.n_layer_inputs},
                "output": {k: v if k == "agreement" else json_number(v)
                           for k, v in self.output.items()},
                "outputs": [{k: json_number(v) if k in ("sqnr_db", "top1_agreement") else v
                             for k, v in o.items()} for o in self.outputs],
                "simulation": {k: v if isinstance(v, int) else json_number(v)
                               for k, v in self.simulation.items()},
                "layers": [layer.to_dict() for layer in self.layers],
                "unmatched": [{"layer": n, "reason": r} for n, r in self.unmatched],
                "notes": list(self.notes), "seconds": dict(self.seconds)}

    def plot(self, path, n: int = 5, title: str | None = None, note: str | None = None):
        """Write the per-layer picture (PNG) to ``path``: see :func:`cle.analysis.plot`."""
        from cle._quantize.analysis_plot import plot

        return plot(self, path, n, title, note)
