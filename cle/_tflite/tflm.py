"""TF Lite Micro, the runtime of microcontrollers, running a ``.tflite`` through its own Python
interpreter (the ``tflite-micro`` package): the outputs on given inputs and the bytes of the
tensor arena the file needs.

TFLM runs in a child process. Its kernels stop the process on some inputs instead of raising
(its int8 SOFTMAX aborts on rows of near-uniform scores over many classes, measured here on
MobileNetV2 files), and a runtime that may abort must not take the caller with it: the child's
death is a :class:`TflmFailed` naming how it ended. The child imports NumPy and TFLM only.

Facts the code relies on (measured with ``tflite-micro`` of October 2026): the interpreter
allocates every tensor when it is made, so the arena it reports then (``print_allocations``,
"Arena allocation total") is the smallest ``arena_size`` it runs with; it takes one input
at the file's own shape (batch 1, no resizing); the input must be set before every invoke (the
arena reuses the input's bytes); float tensors have no quantization.
"""

from __future__ import annotations

import os
import pickle
import tempfile

import numpy as np

from cle._tflite import child
from cle._tflite.flatgraph import FlatGraph
from cle._tflite.runtime import input_name, keras_output_order

__all__ = ["ARENA_LIMIT", "TflmFailed", "TflmRun", "run_tflm"]

#: The arena the child offers TFLM (it uses what the file needs: the figure reported).
ARENA_LIMIT = 256 << 20

# The child: reads (content, inputs) from a pickle, writes (outputs, arena bytes) to another.
_CHILD = r"""
import os, pickle, re, sys, tempfile
import numpy as np
from tflite_micro.python.tflite_micro import runtime

src, dst, arena = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(src, "rb") as f:
    content, arrays, n_out = pickle.load(f)
it = runtime.Interpreter.from_bytes(content, arena_size=arena)
with tempfile.TemporaryFile() as log:
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)
    try:
        it.print_allocations()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    log.seek(0)
    found = re.search(rb"Arena allocation total (\d+) bytes", log.read())
used = int(found.group(1)) if found else None

def quantized(x, d):
    q = d["quantization_parameters"]
    if np.dtype(d["dtype"]) in (np.int8, np.int16) and len(q["scales"]):
        info = np.iinfo(d["dtype"])
        x = np.clip(np.round(x / q["scales"][0]) + q["zero_points"][0], info.min, info.max)
    return x.astype(d["dtype"])

def real(y, d):
    q = d["quantization_parameters"]
    if np.dtype(d["dtype"]) in (np.int8, np.int16) and len(q["scales"]):
        return (y.astype(np.float32) - q["zero_points"][0]) * np.float32(q["scales"][0])
    return y.astype(np.float32)

ins = [it.get_input_details(i) for i in range(len(arrays))]
outs = [it.get_output_details(k) for k in range(n_out)]
results = [[] for _ in outs]
for j in range(len(arrays[0]) if arrays else 0):
    for i, (a, d) in enumerate(zip(arrays, ins)):
        it.set_input(quantized(a[j: j + 1].reshape(d["shape"]), d), i)
    it.invoke()
    for k, d in enumerate(outs):
        results[k].append(real(np.array(it.get_output(k)), d))
with open(dst, "wb") as f:
    pickle.dump(([np.concatenate(r, axis=0) if r else None for r in results], used), f)
"""


class TflmFailed(RuntimeError):
    """TF Lite Micro could not run the file: it refused it, or its process died."""


class TflmRun:
    """What TFLM did with a file: ``outputs`` (float arrays in the Keras model's output
    order, integer outputs dequantized) and ``arena_bytes`` (the tensor arena it allocated)."""

    def __init__(self, outputs, arena_bytes):
        self.outputs, self.arena_bytes = outputs, arena_bytes


def _order_inputs(x, names) -> list[np.ndarray]:
    """``x`` (:class:`cle._core.inputs.ModelInputs`) in the flatbuffer's input order."""
    by_name = dict(zip(x.names, x.arrays))
    keys = [input_name(n) for n in names]
    if all(k in by_name for k in keys):
        return [np.asarray(by_name[k], np.float32) for k in keys]
    return [np.asarray(a, np.float32) for a in x.arrays]


def run_tflm(content: bytes, x, timeout: float = 3600.0) -> TflmRun:
    """Run ``content`` in TF Lite Micro on every input of ``x`` (a
    :class:`cle._core.inputs.ModelInputs`, one input at a time), in a child process.

    Raises:
        TflmFailed: TFLM refused the file (its message) or its process died (the signal).
    """
    graph = FlatGraph(content)
    out_names = [graph.name(t) for t in graph.outputs]
    arrays = _order_inputs(x, [graph.name(t) for t in graph.inputs])
    with tempfile.TemporaryDirectory(prefix="cle_tflm_") as tmp:
        src, dst = os.path.join(tmp, "in.pkl"), os.path.join(tmp, "out.pkl")
        with open(src, "wb") as f:
            pickle.dump((bytes(content), arrays, len(out_names)), f)
        done = child.run(["-c", _CHILD, src, dst, str(ARENA_LIMIT)], timeout)
        if done.returncode != 0 or not os.path.exists(dst):
            raise TflmFailed(_failure(done))
        with open(dst, "rb") as f:
            outputs, arena = pickle.load(f)
    order = keras_output_order(out_names, [graph.name(t) for t in graph.inputs])
    return TflmRun([outputs[k] for k in order], arena)


def _failure(done) -> str:
    """TFLM's refusal, in one line: its last message lines, or how its process ended."""
    text = (done.stderr or "").split("Traceback (most recent call last)")
    lines = [line.strip() for line in text[0].splitlines() if line.strip()]
    last = [line.strip() for line in text[-1].splitlines() if line.strip()][-1:]
    said = "; ".join(lines[-2:] + (last if len(text) > 1 else []))[:500]
    return child.ended("TF Lite Micro", done, said)
