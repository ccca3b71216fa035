"""Where a ``.tflite`` will run, held as data: one :class:`Target` per runtime or accelerator,
read by the pipeline instead of branching on names (``cle targets`` prints the table).

Each row says which runtime checks the file, which input/output type it takes by default,
which operators take INT4 weights at which granularity (and why the others do not), and which
tool compiles the file for the device. The facts were measured on this machine with the
runtimes' own Python packages (``tflite-micro``, the TF Lite Micro interpreter; ``ethos-u-vela``
5.2.0, Arm's compiler for the Ethos-U NPUs); docs/targets.md says how. Standard library only:
the command line reads the table before importing NumPy.
"""

from __future__ import annotations

import dataclasses
import importlib.util

__all__ = ["DEFAULT_TARGET", "EXTRA", "TARGETS", "Target", "target_named"]

#: The target of a call that names none: today's behaviour.
DEFAULT_TARGET = "litert"
#: The optional dependencies the microcontroller and NPU targets need.
EXTRA = "keras-cle[targets]"

#: Granularities of a weight tensor's quantization.
BOTH = ("per-channel", "per-tensor")

#: LiteRT's operators with INT4 weights: its kernels read packed INT4 filters for these.
_LITERT_INT4 = {"CONV_2D": BOTH, "DEPTHWISE_CONV_2D": BOTH, "FULLY_CONNECTED": BOTH}
#: Why LiteRT keeps an operator at INT8 (operators not named: no INT4 kernel).
_LITERT_NO_INT4 = {"TRANSPOSE_CONV": "LiteRT's TRANSPOSE_CONV takes INT8 weights only (an INT4 "
                                     "weight fails when the model is loaded)"}
#: TF Lite Micro: its reference kernels read INT4 filters for CONV_2D and DEPTHWISE_CONV_2D at
#: either granularity; its FULLY_CONNECTED refuses a per-channel INT4 filter when the model is
#: prepared (fully_connected_common.cc) and runs a per-tensor one.
_TFLM_INT4 = {"CONV_2D": BOTH, "DEPTHWISE_CONV_2D": BOTH, "FULLY_CONNECTED": ("per-tensor",)}
_TFLM_NO_INT4 = {
    "FULLY_CONNECTED": "TFLM's FULLY_CONNECTED refuses per-channel INT4 weights when the model "
                       "is prepared and runs per-tensor ones",
    "TRANSPOSE_CONV": "TFLM's TRANSPOSE_CONV takes INT8 weights only",
}
#: Vela 5.2 stops with a floating point exception on any INT4 weight tensor; the same integers
#: stored as INT8 compile, and its weight encoder compresses them.
_VELA_NO_INT4 = ("Vela 5.2 crashes on INT4 weight tensors (floating point exception); the "
                 "integers of the 4-bit grid are stored as INT8, which Vela compiles and its "
                 "weight encoder compresses")


#: The operator each kind of rounded kernel becomes.
_OP_KINDS = {"CONV_2D": "conv", "DEPTHWISE_CONV_2D": "depthwise", "FULLY_CONNECTED": "dense"}


@dataclasses.dataclass(frozen=True)
class Target:
    """One place a ``.tflite`` runs.

    Attributes:
        name: what ``--target`` takes.
        summary: one line for ``cle targets``.
        runtime: the interpreter that runs the file on the device: "litert" (LiteRT, the
            desktop and mobile runtime) or "tflm" (TF Lite Micro).
        integer_io: the input/output type the file takes unless the caller says otherwise
            (True: int8, what a microcontroller or an NPU is fed).
        int4: operator → granularities whose INT4 weights the runtime runs.
        no_int4: operator → why it keeps INT8 weights (any operator: ``"*"``).
        accelerator: Vela's ``--accelerator-config`` for an Ethos-U NPU, else None.
        activation_bits: the activation widths the target takes.
        needs: the Python modules the target's tools come in (the :data:`EXTRA`).
    """

    name: str
    summary: str
    runtime: str = "litert"
    integer_io: bool = False
    int4: dict = dataclasses.field(default_factory=lambda: dict(_LITERT_INT4))
    no_int4: dict = dataclasses.field(default_factory=lambda: dict(_LITERT_NO_INT4))
    accelerator: str | None = None
    activation_bits: tuple = (8, 16)
    needs: tuple = ()

    def int4_refusal(self, op: str, per_channel: bool) -> str | None:
        """Why the ``op`` operator keeps INT8 weights on this target at this granularity,
        or None where it takes INT4."""
        granularity = "per-channel" if per_channel else "per-tensor"
        if granularity in self.int4.get(op, ()):
            return None
        return self.no_int4.get(op) or self.no_int4.get("*") or (
            f"{op} has no INT4 kernel on {self.name}")

    def per_tensor_kinds(self, per_channel: bool) -> dict[str, str]:
        """``{layer kind: reason}`` of the kernels to round onto per-tensor INT4 grids even with
        ``per_channel``: those whose operator runs INT4 weights per tensor only (kinds as
        :class:`cle._tflite.weight_store.LayerWeights` names them)."""
        if not per_channel:
            return {}
        return {kind: self.no_int4.get(op, f"{op} takes per-tensor INT4 weights only")
                for op, kind in _OP_KINDS.items()
                if self.int4.get(op) == ("per-tensor",)}

    def missing(self) -> list[str]:
        """The modules of :attr:`needs` that are not installed."""
        return [m for m in self.needs if importlib.util.find_spec(m.split(".")[0]) is None]

    def to_dict(self) -> dict:
        return {"name": self.name, "runtime": self.runtime, "integer_io": self.integer_io,
                "accelerator": self.accelerator}


def _ethos(accelerator: str, what: str) -> Target:
    return Target(accelerator, f"Arm {what} NPU ({accelerator.split('-')[-1]} MACs/cycle): "
                  "compiled by Vela, checked in TF Lite Micro", runtime="tflm", integer_io=True,
                  int4={}, no_int4={"*": _VELA_NO_INT4}, accelerator=accelerator,
                  activation_bits=(8,), needs=("tflite_micro", "ethosu.vela"))


#: Every target, by name.
TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("litert", "LiteRT (TF Lite) on a CPU: desktop, server, phone (the default)"),
    Target("tflm", "TF Lite Micro on a microcontroller: int8 input/output, checked in its "
                   "own interpreter", runtime="tflm", integer_io=True, int4=dict(_TFLM_INT4),
           no_int4=dict(_TFLM_NO_INT4), activation_bits=(8,), needs=("tflite_micro",)),
    *(_ethos(f"ethos-u55-{n}", "Ethos-U55") for n in (32, 64, 128, 256)),
    *(_ethos(f"ethos-u65-{n}", "Ethos-U65") for n in (256, 512)),
    *(_ethos(f"ethos-u85-{n}", "Ethos-U85") for n in (128, 256, 512, 1024, 2048)),
)}


def target_named(name) -> Target:
    """The :class:`Target` called ``name``.

    Raises:
        ValueError: no target has that name (the message lists them).
    """
    if not isinstance(name, str) or name not in TARGETS:
        raise ValueError(f"`target` must be one of {', '.join(TARGETS)} (cle targets lists "
                         f"them). Received: target={name!r}")
    return TARGETS[name]
