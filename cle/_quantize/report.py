"""What :func:`cle.quantization.quantize` did and what its check measured:
:class:`QuantizeReport`, its summary and its JSON form."""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any

import numpy as np

from cle._math.json_numbers import json_safe, sqnr_words
from cle._quantize.pool_spread import POOL_SPREAD, SPREAD
from cle._quantize.ranges import (LOGIT_WIDENINGS, LOGITS, MAX_KEPT, PEAKED, POOL_WIDENING,
                                  POOLED, WIDEN_INPUTS)
from cle._tflite.converter import PADDED

__all__ = ["HELD_OUT", "QuantizeReport"]

#: What the check's inputs are (``check_inputs``) with data, when some were held out of the
#: calibration.
HELD_OUT = "held-out calibration inputs"


#: How the target line names each rounding (:data:`cle._quantize.options.ROUNDINGS`).
ROUNDING_SAID = {
    "nearest": "to nearest (TF Lite's converter)",
    "tapsum": "tapsum (to nearest, each channel pair's sum over its taps kept)",
    "gptq": "gptq (for each layer's output)",
    "adaround": "adaround (for each layer's output, learned)",
}


def _rounding_said(method) -> str:
    """The target line's ending that names the kernels' rounding ("" for none known)."""
    return f"; rounding {ROUNDING_SAID.get(method, method)}" if method else ""


@dataclasses.dataclass
class QuantizeReport:
    """What :func:`quantize` did, and how close the quantized model is to the float model.

    Attributes:
        target: the target: ``name`` (:data:`cle._tflite.targets.TARGETS`),
            ``per_channel``, ``weight_bits``, ``activation_bits``, ``integer_io``,
            ``rounding`` (the method ``rounding="auto"`` resolved to); on a microcontroller or
            an NPU also what its runtime and compiler said (:mod:`cle._quantize.deploy`):
            ``runs``, ``runtime_check``, ``arena_bytes``, ``flash_bytes``, ``failures`` (what
            the runtime or the compiler refused, each a warning too); for an Ethos-U
            ``npu_ops``, ``cpu_ops``, ``cpu_op_names``, ``cpu_reasons``, ``sram_bytes``,
            ``dram_bytes``, ``inference_seconds``.
        calibration: "data" (the inputs given) or "synthetic" (no real data was seen).
        n_calibration: inputs the activation ranges were calibrated on.
        calibration_inputs: what they are (without data: how many were distilled from the
            model's batch-norm statistics, how many are natural-image-like inputs).
        check_inputs: what the check ran on: "held-out calibration inputs", "calibration
            inputs" (too few were given to hold any out), or without data "synthetic
            natural-image-like inputs across the input range" (inputs the distillation did
            not shape).
        n_check: how many.
        equalization: the :class:`cle.EqualizationReport` of the equalize stage.
        bias_correction: the bias correction run ("empirical", "analytic", "none", or
            "rounding": the rounding stage's, each rounded layer's bias taking its mean
            output error away).
        ranges: every activation tensor's calibrated and chosen range
            (:class:`cle._tflite.converter.TensorRange`); empty for 16-bit activations.
        input_ranges: without data, each input's range and where it came from (stated,
            the model's preprocessing layers, or its first batch norm's statistics), as
            dicts; with data, empty (the data sets the input's range).
        outputs: the check of each output (:class:`cle._measure.check.OutputCheck`): SQNR,
            and top-1 agreement for class scores; without data, per output the figures of
            the check set where its SQNR is the lowest.
        check_sets: each set of check inputs, ``{"inputs", "n", "outputs", "bounds"}``: with
            data the held-out inputs; without data natural-image-like inputs across the input
            range and inputs distilled apart from the calibration inputs (no real data was
            seen). ``bounds``: whether its figures bound ``outputs`` (not for
            natural-image-like inputs the batch norms say are unlike the data:
            :mod:`cle._quantize.check_sets`).
        top1_agreement: the first output's top-1 agreement (its label-set agreement for independent
            sigmoid labels, :func:`cle._measure.ties.agreement`; NaN when it is not class scores).
        sqnr_db: the first output's SQNR against the float output, in dB.
        plain: with ``compare=True``, the same figures for the float model converted straight
            (TF Lite's defaults, the same calibration inputs): what the user had, as
            ``{"top1_agreement", "sqnr_db"}`` of the first output and ``"outputs"``.
        synthesis_loss: without data, the final BN-statistics loss of each synthetic batch.
        warnings: what makes the result or its figures doubtful (an input range that is a
            guess, a distillation that did not converge, rough check figures).
        seconds: wall time of each stage.
        tuning: with ``tune=True``, the :class:`cle._quantize.tune.TuneReport`.
        rounding: the :class:`cle._quantize.rounding.RoundingReport` of the rounding stage
            (None when the converter rounds: 8 bits, ``rounding="nearest"``).
        weights: how each weight tensor of the ``.tflite`` is stored and why
            (:class:`cle._tflite.weight_store.StoredWeight`).
        size: the ``.tflite``'s size in bytes.
        size_int8: the size of the same build's ``.tflite`` as TF Lite's converter wrote it,
            every weight 8-bit, before the rounded kernels were stored (0: not known).
        choice: with data, which build was written (:class:`cle._quantize.choice.Choice`:
            cle's, cle's with min/max activation ranges, or the float model straight into the
            converter, whichever is closest to the float model on the held-out inputs);
            without data, between the tails and min/max ranges on the check's synthetic sets
            (:class:`cle._quantize.synthetic_choice.NoDataChoice`); None where no choice was
            made.
        compiled: for an Ethos-U target, the model Vela compiled (``OUT_vela.tflite``);
            else None.
    """

    target: dict
    calibration: str
    n_calibration: int
    check_inputs: str
    n_check: int
    equalization: Any
    calibration_inputs: str = "inputs given"
    bias_correction: str = "none"
    ranges: list = dataclasses.field(default_factory=list)
    input_ranges: list = dataclasses.field(default_factory=list)
    outputs: list = dataclasses.field(default_factory=list)
    check_sets: list = dataclasses.field(default_factory=list)
    plain: dict | None = None
    synthesis_loss: list | None = None
    warnings: list = dataclasses.field(default_factory=list)
    seconds: dict = dataclasses.field(default_factory=dict)
    tail: float = 1e-4
    tuning: Any = None
    rounding: Any = None
    weights: list = dataclasses.field(default_factory=list)
    size: int = 0
    size_int8: int = 0
    choice: Any = None
    compiled: bytes | None = None

    @property
    def top1_agreement(self) -> float:
        return self.outputs[0].top1_agreement if self.outputs else math.nan

    @property
    def sqnr_db(self) -> float:
        return self.outputs[0].sqnr_db if self.outputs else math.nan

    def _range_lines(self):
        if not self.ranges:
            return ["activation ranges: the converter's (16-bit activations)"]
        usual = sorted({(r.lo, r.hi) for r in self.ranges if r.how == "usual range"})
        said = ("; an input whose calibration values nearly span a usual range takes it ("
                + ", ".join(f"[{lo:g}, {hi:g}]" for lo, hi in usual) + ")") if usual else ""
        logits = [r for r in self.ranges if r.how == LOGITS]
        if logits:
            chosen = [r.logit[1] for r in logits if r.logit]
            times = sorted(set(chosen) | ({WIDEN_INPUTS} if len(chosen) < len(logits) else set()))
            said = ("; the logits before a softmax are widened past their min/max to the "
                    f"extremes {' and '.join(f'{t:g}×' for t in times)} as many inputs would be "
                    "expected to reach" + (
                        f" (of {LOGIT_WIDENINGS[0]:g}× to {LOGIT_WIDENINGS[-1]:g}×, the one of "
                        "least expected error on the calibration inputs, and no lower than "
                        "the softmax's 8-bit output can show)" if chosen else "") + said)
        if any(r.how == POOLED for r in self.ranges):
            said = ("; the outputs of a global average pooling that gate a map are widened past "
                    f"their min/max to the extremes {POOL_WIDENING:g}× as many inputs would be "
                    "expected to reach" + said)
        if any(r.how == POOL_SPREAD for r in self.ranges):
            said = ("; the outputs of a global average pooling that gate a map reach as far as "
                    f"{SPREAD:g} standard deviations of each channel of the map they average "
                    "past its mean, within the map's range (synthetic inputs' averages stay "
                    "near the mean)" + said)
        if any(r.how == PADDED for r in self.ranges):
            said += ("; a padding by a value below its input's, before a max pooling, takes its "
                     "input's range (a value below that range pads as its lowest 8-bit value)")
        narrowed = [r for r in self.ranges if r.how == "percentile"]
        widened = [r for r in self.ranges if r.how.endswith(", widened")]
        if widened:
            ratios = np.array([(r.hi - r.lo) / max(r.calibrated[1] - r.calibrated[0], 1e-30)
                               for r in widened])
            return [f"activation ranges: {len(widened)} of {len(self.ranges)} tensors widened "
                    f"past their min/max to the extremes {WIDEN_INPUTS:g}× as many inputs would "
                    f"be expected to reach (width {np.median(ratios):.2f}× the min/max range at "
                    f"the median, {ratios.max():.2f}× at the widest); the others keep min/max"
                    + said]
        if not narrowed:
            why = (" (every tensor a map output of sparse peaks is computed from keeps it: "
                   "their tails would cut the peaks)"
                   if any(r.how == PEAKED for r in self.ranges) else "")
            return [f"activation ranges: min/max of {len(self.ranges)} tensors{why}" + said]
        ratios = np.array([(r.hi - r.lo) / max(r.calibrated[1] - r.calibrated[0], 1e-30)
                           for r in narrowed])
        kept = ["the model's outputs"]
        if any(r.how == "min/max (decides an output)" for r in self.ranges):
            kept.append("the tensors an output only reshapes or passes through a softmax")
        max_kept = sum(r.how == MAX_KEPT for r in self.ranges)
        if max_kept:
            kept.append(f"the {max_kept} tensors whose largest values a global max pooling "
                        "keeps")
        if any(r.how == PEAKED for r in self.ranges):
            kept.append("the tensors a map output of sparse peaks is computed from")
        line = (f"activation ranges: {len(narrowed)} of {len(self.ranges)} tensors set to their "
                f"{self.tail:g} tails (width {np.median(ratios):.2f}× the min/max range at the "
                f"median, {ratios.min():.2f}× at the narrowest); {' and '.join(kept)} keep "
                "min/max")
        if any(r.how == "input range" for r in self.ranges):
            line += "; the inputs take their input range"
        return [line + said]

    def _calibration_line(self):
        if self.calibration == "data":
            tuned = (self.tuning.n if self.tuning is not None and self.tuning.held_out
                     else 0)
            if self.choice is not None and self.choice.n_all:
                return (f"calibration: {self.n_calibration} inputs given, all of them setting "
                        f"the activation ranges; the last {self.choice.n} held out from the "
                        "equalization (its bias correction) and first checked alone; then "
                        "every input checked by a build not calibrated on it (cross-fitted)")
            held_out = self.n_check if self.check_inputs == HELD_OUT else 0
            given = self.n_calibration + tuned + held_out
            held = (f": {self.n_calibration} to calibrate, "
                    + (f"{tuned} held out to tune, " if tuned else "")
                    + f"{held_out} held out for the check"
                    if given > self.n_calibration else " (too few to hold any out)")
            return f"calibration: {given} inputs given{held}"
        loss = (f" (distillation: final batch-norm loss {max(self.synthesis_loss):.3g})"
                if self.synthesis_loss else "")
        return (f"calibration: no real data; {self.n_calibration} synthetic inputs, "
                f"{self.calibration_inputs}{loss}")

    def _input_lines(self):
        return [f"input '{r['input']}': range [{r['range'][0]:.4g}, {r['range'][1]:.4g}], "
                f"{r['source']}" for r in self.input_ranges]

    def _check_lines(self):
        if len(self.check_sets) > 1:
            lines = ["check on inputs the calibration never saw (no real data was seen); the "
                     "figures of each output are the lower of:"]
            for c in self.check_sets:
                aside = ("" if c.get("bounds", True) else
                         " (not counted: unlike the data to the batch norms, as the "
                         "calibration line says)")
                lines += _figure_lines(f"  {c['n']} {c['inputs']}{aside}", c["outputs"], "  ")
        else:
            what = f"check on {self.n_check} {self.check_inputs}"
            if self.calibration != "data":
                what += " (no real data was seen)"
            lines = _figure_lines(what, self.outputs, "")
        if self.plain is not None:
            lines += _figure_lines("  the float model converted straight", self.plain["outputs"],
                                   "  ")
            lines += [_verdict_line(v, len(self.plain["outputs"]) > 1,
                                    len(self.check_sets) > 1)
                      for v in self.plain.get("verdicts", [])]
        return lines

    def summary(self) -> str:
        """The report on a few lines: each stage, what changed and why, the check, and the
        warnings."""
        t = self.target
        named = "" if t.get("name", "litert") == "litert" else f"{t['name']}, "
        lines = [
            f"target: {named}INT{t['weight_bits']} weights "
            f"{'per-channel' if t['per_channel'] else 'per-tensor'}, "
            f"{t['activation_bits']}-bit activations, "
            f"{('int16' if t['activation_bits'] == 16 else 'int8') if t['integer_io'] else 'float32'}"
            " input/output" + _rounding_said(t.get("rounding")),
            self._calibration_line(),
        ]
        lines += self._input_lines()
        lines += ["equalize: " + line for line in self.equalization.summary().splitlines()]
        corrected = [r for r in self.equalization.bias_corrections if r.corrected]
        if self.bias_correction == "rounding":
            lines.append("bias correction (rounding): each rounded layer's bias takes its mean "
                         "output error away")
        else:
            lines.append(f"bias correction ({self.bias_correction}): {len(corrected)} layers "
                         f"corrected, {len(self.equalization.bias_corrections) - len(corrected)}"
                         " left (see the equalization report for why)")
        if self.rounding is not None:
            lines += self.rounding.summary_lines()
        lines += self._range_lines()
        lines += _storage_lines(self.weights, self.size, t["weight_bits"], self.size_int8)
        if self.tuning is not None:
            lines += self.tuning.lines()
        if self.choice is not None:
            lines.append(self.choice.line())
        lines += self._check_lines()
        lines += _target_lines(t)
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)

    __str__ = summary

    def to_dict(self) -> dict:
        """A JSON-ready dict (what ``cle quantize --report`` writes)."""
        plain = None if self.plain is None else {
            "top1_agreement": _json_float(self.plain["top1_agreement"]),
            "agreement": _first_agreement(self.plain["outputs"]),
            "sqnr_db": self.plain["sqnr_db"],
            "outputs": [o.to_dict() for o in self.plain["outputs"]],
            "verdicts": [dict(v, interval_db=None if v["interval_db"] is None
                              else list(v["interval_db"]))
                         for v in self.plain.get("verdicts", [])]}
        return json_safe({
            "target": dict(self.target),
            "calibration": self.calibration,
            "calibration_inputs": self.calibration_inputs,
            "real_data": self.calibration == "data",
            "bias_correction": self.bias_correction,
            "n_calibration": self.n_calibration,
            "input_ranges": [dict(r) for r in self.input_ranges],
            "check": {"inputs": self.check_inputs, "n": self.n_check,
                      "top1_agreement": _json_float(self.top1_agreement),
                      "agreement": _first_agreement(self.outputs),
                      "sqnr_db": self.sqnr_db,
                      "outputs": [o.to_dict() for o in self.outputs],
                      "sets": [{"inputs": c["inputs"], "n": c["n"],
                                "bounds": c.get("bounds", True),
                                "outputs": [o.to_dict() for o in c["outputs"]]}
                               for c in self.check_sets]},
            "plain_conversion": plain,
            "synthesis_loss": self.synthesis_loss,
            "warnings": list(self.warnings),
            "ranges": [{"tensor": r.name, "calibrated": list(r.calibrated),
                        "chosen": [r.lo, r.hi], "how": r.how} for r in self.ranges],
            "equalization": self.equalization.to_dict(),
            "tuning": self.tuning.to_dict() if self.tuning is not None else None,
            "rounding": None if self.rounding is None else self.rounding.to_dict(),
            "weights": [w.to_dict() for w in self.weights],
            "size": self.size,
            "size_int8": self.size_int8,
            "choice": None if self.choice is None else self.choice.to_dict(),
            "seconds": dict(self.seconds),
        })


def _target_lines(t) -> list[str]:
    """What the target's runtime and compiler said of the file (:mod:`cle._quantize.deploy`)."""
    lines = []
    check = t.get("runtime_check")
    if check:
        figures = "; ".join(
            f"{o['name']}: {_sqnr(o['sqnr_db'])} (LiteRT {_sqnr(o['litert_sqnr_db'], '')}, "
            f"TFLM against LiteRT {_same(o['tflm_vs_litert_db'])})" for o in check["outputs"])
        lines.append(f"TF Lite Micro ran the file on {check['n']} {check['inputs']}: "
                     f"{figures}")
    if t.get("arena_bytes"):
        lines.append(f"TF Lite Micro: tensor arena {t['arena_bytes']:,} bytes, file "
                     f"{t['file_bytes']:,} bytes")
    if t.get("compiled"):
        memory = f"SRAM {t['sram_bytes']:,} bytes, flash {t['flash_bytes']:,} bytes" + (
            f", DRAM {t['dram_bytes']:,} bytes" if t.get("dram_bytes") else "")
        lines.append(f"Vela ({t['accelerator']}, {t['system_config']}, {t['memory_mode']}): "
                     f"{t['npu_ops']} operators on the NPU, {t['cpu_ops']} on the CPU; "
                     f"{memory}; estimated {t['inference_seconds'] * 1e3:.3g} ms per inference")
    return lines


def _db(value) -> str:
    return f"{value:.2f} dB" if isinstance(value, float) else f"{value} dB"


def _sqnr(value, said="SQNR ") -> str:
    """An SQNR of the target's check ("inf", JSON's form: the file reproduces the output;
    "-inf": the float output is zero, the file's is not)."""
    if value in ("inf", "-inf"):
        return sqnr_words(float(value))
    return f"{said}{_db(value)}"


def _same(value) -> str:
    return "identical" if value == "inf" else _db(value)


def _storage_lines(stored, size, weight_bits, size_int8=0) -> list[str]:
    """The report's lines on the weights as stored: counts by type and operator, and every
    weight the rounding did not store on its grid, with the reason."""
    if not stored:
        return []
    counts = collections.Counter(w.storage for w in stored if w.storage)
    by_op = collections.defaultdict(collections.Counter)
    for w in stored:
        by_op[w.storage][w.op] += 1
    parts = [f"{n} {storage} ({', '.join(f'{c} {op}' for op, c in by_op[storage].items())})"
             for storage, n in counts.items()]
    lines = [f"weights stored: {'; '.join(parts)}; file {size:,} bytes"
             + (f" ({size / size_int8:.3f}x the same model's 8-bit file)"
                if size_int8 and weight_bits < 8 else "")]
    for w in stored:
        if not w.rounded and (w.layer or weight_bits == 4):
            lines.append(f"  {w.layer or w.op}: {w.storage or 'as converted'}, {w.reason}")
    return lines


def _figure_lines(head, outputs, indent):
    """``head: figures`` for one output, else ``head:`` and a line per output."""
    if len(outputs) == 1:
        return [f"{head}: {outputs[0].text()}"]
    return [f"{head}:"] + [f"{indent}  output '{o.name}': {o.text()}" for o in outputs]


def _verdict_line(v, name_output, name_inputs) -> str:
    """One line of ``compare``'s verdict: this file against the plain conversion."""
    where = (f" output '{v['output']}'" if name_output else "") + (
        f" on the {v['inputs']}" if name_inputs else "")
    interval = "" if v["interval_db"] is None else (
        f" (the difference in SQNR, {v['interval_db'][0]:+.1f} to {v['interval_db'][1]:+.1f}"
        " dB, is a 90% bootstrap interval over the inputs)")
    said = {"better": "this file is closer to the float model than the plain conversion",
            "worse": "the plain conversion is closer to the float model than this file"}
    text = said.get(v["verdict"], "this file and the plain conversion cannot be told apart "
                                  f"on these inputs ({v['verdict']})")
    return f"  verdict{where}: {text}{interval}"


def _json_float(value):
    return None if isinstance(value, float) and math.isnan(value) else value


def _first_agreement(outputs) -> str | None:
    """What the top-level ``top1_agreement`` (the first output's) counts: ``"top-1"``,
    ``"label-set"`` (independent labels) or None (a value output, or no output)."""
    return outputs[0].agreement if outputs else None
