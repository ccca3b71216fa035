"""Arm's Vela compiling a ``.tflite`` for an Ethos-U NPU (the ``ethos-u-vela`` package), and its
own figures: operators placed on the NPU and left to the CPU, SRAM, flash and DRAM used, and
its estimate of one inference's time.

Vela runs in a child process (``python -m ethosu.vela``): it stops its process on some files
(version 5.2 with a floating point exception on any INT4 weight tensor), which must not take
the caller with it. It writes ``NAME_vela.tflite`` (the NPU's part as one ``ethos-u`` custom
operator per part; what it cannot place stays a TF Lite operator for the CPU) and a summary CSV
beside it; its printed summary gives the operator counts ("CPU operators = …", "NPU operators
= …"), which this module reads as printed, so the report says what Vela says.
"""

from __future__ import annotations

import csv
import dataclasses
import glob
import os
import re
import tempfile

from cle._tflite import child
from cle._tflite.flatgraph import FlatGraph

__all__ = ["VelaFailed", "VelaResult", "compile_for_npu"]

KIB = 1024


class VelaFailed(RuntimeError):
    """Vela could not compile the file (its message, or how its process ended)."""


@dataclasses.dataclass
class VelaResult:
    """Vela's compiled model and its figures.

    Attributes:
        content: the compiled ``.tflite`` (``OUT_vela.tflite``, Vela's naming).
        npu_ops, cpu_ops: the operator counts Vela printed.
        cpu_op_names: the TF Lite operators left in the compiled file for the CPU.
        cpu_reasons: ``{operator: reason}`` as Vela printed them (its "supported operators"
            warnings), for the operators it could not place on the NPU.
        sram_bytes, flash_bytes, dram_bytes: memory Vela says the model uses (flash: on-chip
            and off-chip).
        inference_seconds: Vela's estimate of one inference.
        system_config, memory_mode: the configuration Vela compiled for (its defaults).
    """

    content: bytes
    npu_ops: int
    cpu_ops: int
    cpu_op_names: list
    cpu_reasons: dict
    sram_bytes: int
    flash_bytes: int
    dram_bytes: int
    inference_seconds: float
    system_config: str
    memory_mode: str

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        del out["content"]
        return out


def compile_for_npu(content: bytes, accelerator: str, name: str = "model",
                    timeout: float = 1800.0) -> VelaResult:
    """Compile ``content`` with Vela for ``accelerator`` (e.g. ``"ethos-u55-128"``).

    Raises:
        VelaFailed: Vela refused the file, or its process died.
    """
    with tempfile.TemporaryDirectory(prefix="cle_vela_") as tmp:
        src, out = os.path.join(tmp, f"{name}.tflite"), os.path.join(tmp, "out")
        with open(src, "wb") as f:
            f.write(content)
        done = child.run(["-m", "ethosu.vela", src, "--accelerator-config", accelerator,
                          "--output-dir", out], timeout)
        compiled = os.path.join(out, f"{name}_vela.tflite")
        summaries = glob.glob(os.path.join(out, f"{name}_summary_*.csv"))
        if done.returncode != 0 or not os.path.exists(compiled) or not summaries:
            raise VelaFailed(_failure(done))
        with open(compiled, "rb") as f:
            data = f.read()
        with open(summaries[0], newline="") as f:
            row = next(csv.DictReader(f))
    counts = {k: int(v) for k, v in re.findall(r"^(CPU|NPU) operators = (\d+)", done.stdout,
                                               flags=re.M)}
    kib = lambda key: int(round(float(row.get(key) or 0.0) * KIB))  # noqa: E731
    return VelaResult(
        content=data, npu_ops=counts.get("NPU", 0), cpu_ops=counts.get("CPU", 0),
        cpu_op_names=_cpu_ops(data), cpu_reasons=_reasons(done.stdout),
        sram_bytes=kib("sram_memory_used"),
        flash_bytes=kib("on_chip_flash_memory_used") + kib("off_chip_flash_memory_used"),
        dram_bytes=kib("dram_memory_used"), inference_seconds=float(row["inference_time"]),
        system_config=row.get("system_config", ""), memory_mode=row.get("memory_mode", ""))


def _reasons(printed: str) -> dict[str, str]:
    """``{operator: reason}`` from Vela's "Warning (supported operators) operator: X, ofm: …"
    and the "Reason: …" line after it (the first reason per operator kind)."""
    found = {}
    for op, reason in re.findall(r"Warning \(supported operators\) operator: (\w+), ofm: "
                                 r"[^\n]*\nReason: ([^\n]*)", printed):
        found.setdefault(op, reason.strip())
    return found


def _cpu_ops(compiled: bytes) -> list[str]:
    """The TF Lite operators of Vela's output that are not its NPU custom operator."""
    return [op.kind for op in FlatGraph(compiled).ops if op.kind != "CUSTOM"]


def _failure(done) -> str:
    lines = [line.strip() for line in ((done.stdout or "") + "\n" + (done.stderr or ""))
             .splitlines() if line.strip() and "dynamic signature" not in line
             and not line.startswith("Warning: No ")]
    said = "; ".join(lines[-2:])[:500]
    return child.ended("Vela", done, said)
