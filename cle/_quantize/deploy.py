"""The file on its target (``cle.quantize(..., target=...)``): run in the target's own runtime
and compiled by the target's own compiler, with their figures in ``report.target``.

* **TF Lite Micro** (targets "tflm" and every Ethos-U: the NPU's CPU side runs TFLM, and its
  reference kernels are what the NPU's results are checked against): the written file runs in
  TFLM's interpreter on up to :data:`TARGET_INPUTS` inputs of the check, and in LiteRT on the
  same inputs. ``report.target`` gains ``runtime_check``: each runtime's SQNR against the float
  model, output by output, and TFLM's against LiteRT's; ``arena_bytes`` (the tensor arena
  TFLM allocated for the file: the RAM it needs beyond the program) and ``file_bytes`` (on a
  microcontroller also ``flash_bytes``: the file is what goes to flash). A runtime that
  refuses the file, or stops, is a warning naming what it said: the file is written, the
  report says it does not run there, and ``report.target["failures"]`` holds the warning
  (``cle quantize`` then exits with status 3).
* **Vela** (Ethos-U): the file is compiled for the accelerator; ``report.target`` gains
  Vela's operator counts (``npu_ops``, ``cpu_ops``, ``cpu_op_names``, ``cpu_reasons``),
  ``sram_bytes``, ``flash_bytes``, ``dram_bytes`` and ``inference_seconds``, and
  ``report.compiled`` holds the compiled model (``cle quantize`` writes it beside the output
  as ``OUT_vela.tflite``). Operators left to the CPU are a warning that says which, and why
  in Vela's words (with float input/output: the
  QUANTIZE and DEQUANTIZE at the ends, which ``integer_io`` moves to the caller).
"""

from __future__ import annotations

import numpy as np

from cle._measure import check as _check
from cle._measure.inference import outputs_once
from cle._tflite import tflm, vela

__all__ = ["TARGET_INPUTS", "check_on_target"]

#: Inputs of the check run in the target's runtime (one at a time there).
TARGET_INPUTS = 64


def check_on_target(model, build, report, say) -> None:
    """Run, compile and measure ``build.content`` on the build's target; fills
    ``report.target``, ``report.compiled`` and ``report.warnings``."""
    spec = build.opts.target_spec
    report.target["runtime"] = spec.runtime
    if spec.runtime == "tflm":
        _runtime_check(model, build, report, say)
    if spec.accelerator:
        say(f"compiling the .tflite with Vela for {spec.accelerator}")
        try:
            result = vela.compile_for_npu(build.content, spec.accelerator, "model")
        except vela.VelaFailed as exc:
            report.target["compiled"] = False
            _failed(report, f"Vela could not compile the file for {spec.accelerator}: {exc}")
            return
        report.target.update(result.to_dict(), compiled=True, accelerator=spec.accelerator)
        report.compiled = result.content
        if result.cpu_ops:
            why = "; ".join(f"{op}: {reason}" for op, reason in result.cpu_reasons.items())
            report.warnings.append(
                f"Vela left {result.cpu_ops} operators to the CPU ("
                f"{', '.join(sorted(set(result.cpu_op_names))) or 'see Vela'})"
                + (f"; Vela says {why}" if why else "")
                + (": the float32 input/output's QUANTIZE and DEQUANTIZE; integer_io=True "
                   "(--integer-io) puts every operator on the NPU"
                   if not build.opts.integer_io else ""))


def _failed(report, message) -> None:
    """The target's runtime or compiler said no: a warning, and ``report.target["failures"]``
    (``cle quantize`` exits with status 3 when it holds any)."""
    report.warnings.append(message)
    report.target.setdefault("failures", []).append(message)


def _runtime_check(model, build, report, say) -> None:
    what, x = build.inputs.checks[0]
    if len(x) > TARGET_INPUTS:
        x = x[:TARGET_INPUTS]
    say(f"running the .tflite in TF Lite Micro on {len(x)} {what}")
    report.target["file_bytes"] = len(build.content)
    if not build.opts.target_spec.accelerator:  # on an NPU, flash is what Vela says
        report.target["flash_bytes"] = len(build.content)
    try:
        run = tflm.run_tflm(build.content, x)
    except tflm.TflmFailed as exc:
        report.target["runs"] = False
        _failed(report, f"the file does not run in TF Lite Micro: {exc}")
        return
    report.target.update(runs=True, arena_bytes=run.arena_bytes)
    # the float model's and LiteRT's outputs: those the check computed, where it ran these
    reference = outputs_once(build.runs, model, x)
    litert = outputs_once(build.runs, build.content, x)
    names = _check.output_names(model)
    kinds = _check.output_kinds(model, build.opts.output_kinds)
    with np.errstate(invalid="ignore"):  # identical outputs: an infinite SQNR, no interval
        mine = _check.check_outputs(reference, run.outputs, names, kinds)
        theirs = _check.check_outputs(reference, litert, names, kinds)
        same = _check.check_outputs(litert, run.outputs, names, kinds)
    report.target["runtime_check"] = {
        "runtime": "tflm", "inputs": what, "n": len(x),
        "outputs": [{"name": n, "sqnr_db": _check.json_number(a.sqnr_db), "top1_agreement": (
                         None if np.isnan(a.top1_agreement) else float(a.top1_agreement)),
                     "agreement": a.agreement,
                     "litert_sqnr_db": _check.json_number(b.sqnr_db),
                     "tflm_vs_litert_db": _check.json_number(c.sqnr_db),
                     "max_difference": float(np.max(np.abs(t - r))) if t.size else 0.0}
                    for n, a, b, c, t, r in zip(names, mine, theirs, same, run.outputs, litert)]}
