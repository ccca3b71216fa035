"""The check of a quantized model against the float model, output by output.

Every output gets its SQNR against the float model's; an output of class scores also gets its
top-1 agreement (the share of samples, or of pixels, whose highest score is the float
model's). An output counts as class scores when it ends in a softmax (any rank, two classes
or more) or when it is a vector of at least :data:`MIN_CLASSES` linear scores; anything else
(a regression value, box coordinates, an image) gets its SQNR only, since the position of its
largest entry means nothing.

The figures come with what makes them rough: fewer than :data:`MIN_RELIABLE` inputs, or the
two halves of the inputs disagreeing by more than :data:`DISAGREE_DB` in SQNR. Non-finite
outputs are an error, never a figure. A top-1 agreement measured on inputs none of whose
decisions is close (:func:`close_calls`) can hardly fall below 100 % whatever the error, and
the report says so (:func:`idle_top1`).
"""

from __future__ import annotations

import dataclasses
import math

import keras
import numpy as np

from cle._core import keras_internals as internals

__all__ = ["MIN_CLASSES", "OutputCheck", "check_outputs", "close_calls", "estimate_caveat",
           "idle_top1", "output_kinds", "output_names", "rough_figures"]

#: A linear vector output with at least this many entries is taken for class logits.
MIN_CLASSES = 10
#: Fewer check inputs than this give rough figures (said in the report).
MIN_RELIABLE = 16
#: The two halves of the check inputs disagreeing by more SQNR than this: rough figures.
DISAGREE_DB = 3.0
#: Without data: how much lower than the synthetic check's SQNR real inputs have read, at most:
#: a bound above the largest gap measured, on the models benchmarks/bench_quantize_nodata.py
#: measures and on real ImageNet networks that are not in this repository, per-channel and
#: per-tensor (docs/design.md). Said on every run without data.
SYNTHETIC_OVERSHOOT_DB = 5.0
#: A decision is close when the float model's lead of its top class over the runner-up is
#: less than this many times the typical change (root mean square over the inputs) the
#: quantized model makes to that lead.
CLOSE_LEAD = 2.0


def _activation_name(layer):
    fn = getattr(layer, "activation", None)
    return getattr(fn, "__name__", "") if fn is not None else ""


def output_kinds(model) -> list[str]:
    """``"probabilities"``, ``"logits"`` or ``"values"`` for each output of ``model``."""
    kinds = []
    for out in model.outputs:
        shape = tuple(out.shape)
        producer = internals.producer_of(out)
        classes = shape[-1] if shape and shape[-1] is not None else 0
        if classes >= 2 and (isinstance(producer, keras.layers.Softmax)
                             or _activation_name(producer) == "softmax"):
            kinds.append("probabilities")
        elif len(shape) == 2 and classes >= MIN_CLASSES and _activation_name(producer) in (
                "", "linear"):
            kinds.append("logits")
        else:
            kinds.append("values")
    return kinds


def output_names(model) -> list[str]:
    """Each output's name, in the order of ``model.outputs``: for outputs given as a dict,
    its key (the name ``model.predict`` returns it under; keys of nested dicts joined with
    '/'), else the layer that makes it."""
    keys = _output_keys(model)
    names = []
    for k, out in enumerate(model.outputs):
        producer = internals.producer_of(out)
        names.append(keys[k] if keys else getattr(producer, "name", None) or f"output {k}")
    return names


def _output_keys(model) -> list[str] | None:
    """The dict keys of each output, in the order of ``model.outputs``, or None when the
    outputs are not given by key (one tensor, a list or a tuple; a Sequential model, whose
    ``output`` Keras gives only once it has been called)."""
    if not isinstance(model, keras.Model) or isinstance(model, keras.Sequential):
        return None
    try:
        struct = model.output
    except (AttributeError, ValueError):
        return None
    paths = [path for path, _ in keras.tree.flatten_with_path(struct)]
    if len(paths) != len(model.outputs) or not any(
            isinstance(p, str) for path in paths for p in path):
        return None
    return ["/".join(str(p) for p in path) for path in paths]


@dataclasses.dataclass
class OutputCheck:
    """The check's figures for one output.

    Attributes:
        name: the output (the layer that makes it).
        kind: "probabilities", "logits" (class scores) or "values".
        sqnr_db: SQNR of the quantized output against the float one, in dB.
        top1_agreement: for class scores, the share of samples (or pixels) whose top class is
            the float model's; NaN for other outputs.
    """

    name: str
    kind: str
    sqnr_db: float
    top1_agreement: float = math.nan

    @property
    def class_scores(self) -> bool:
        return self.kind != "values"

    def text(self) -> str:
        top1 = f"top-1 agreement {self.top1_agreement:.1%}, " if self.class_scores else ""
        return f"{top1}SQNR {self.sqnr_db:.2f} dB"

    def to_dict(self) -> dict:
        return {"output": self.name, "kind": self.kind, "sqnr_db": self.sqnr_db,
                "top1_agreement": None if not self.class_scores else self.top1_agreement}


def _sqnr(ref, y):
    noise = float(np.sum((ref - y) ** 2))
    if noise == 0.0:
        return math.inf
    signal = float(np.sum(ref ** 2))
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def _top1(ref, y):
    return float(np.mean(ref.argmax(axis=-1) == y.argmax(axis=-1)))


def _finite(arrays, what):
    for k, a in enumerate(arrays):
        bad = ~np.isfinite(a)
        if bad.any():
            raise RuntimeError(
                f"{what} are not finite ({int(bad.sum())} NaN or infinite values in output "
                f"{k}): the check cannot give a figure")


def check_outputs(reference, test, names, kinds) -> list[OutputCheck]:
    """One :class:`OutputCheck` per output.

    Args:
        reference, test: lists of arrays ``(N, ...)``, one per output: the float model's and
            the quantized model's outputs on the same inputs.
        names, kinds: of each output (:func:`output_names`, :func:`output_kinds`).

    Raises:
        RuntimeError: an output is not finite.
    """
    _finite(reference, "the float model's outputs")
    _finite(test, "the quantized model's outputs")
    out = []
    for ref, y, name, kind in zip(reference, test, names, kinds):
        ref, y = np.asarray(ref, np.float64), np.asarray(y, np.float64)
        top1 = _top1(ref, y) if kind != "values" else math.nan
        out.append(OutputCheck(name, kind, _sqnr(ref, y), top1))
    return out


def close_calls(reference, test) -> tuple[int, int]:
    """``(close, decisions)`` of one class output (``(N, ..., classes)``; each sample, or
    pixel, a decision): how many decisions have a float lead of the top class over the
    runner-up below :data:`CLOSE_LEAD` times the root mean square change the quantized model
    makes to that lead, out of how many. Close decisions are the ones that flip: where none
    is, a top-1 agreement of 100 % says little of the error (``close`` is 0 also when the lead
    never changes)."""
    r = np.asarray(reference, np.float64)
    r = r.reshape(-1, r.shape[-1])
    y = np.asarray(test, np.float64).reshape(r.shape)
    if r.shape[0] == 0 or r.shape[1] < 2:
        return 0, r.shape[0]
    top = np.argsort(-r, axis=1, kind="stable")[:, :2]
    rows = np.arange(r.shape[0])
    lead = r[rows, top[:, 0]] - r[rows, top[:, 1]]
    change = (y[rows, top[:, 0]] - y[rows, top[:, 1]]) - lead
    rms = float(np.sqrt(np.mean(change ** 2)))
    return int(np.sum(lead < CLOSE_LEAD * rms)) if rms > 0 else 0, r.shape[0]


def idle_top1(reference, test, names, kinds, label) -> list[str]:
    """A sentence per class output whose top-1 agreement on these inputs (``label``) cannot
    tell the error: none of its decisions is close (:func:`close_calls`)."""
    out = []
    for ref, y, name, kind in zip(reference, test, names, kinds):
        if kind == "values":
            continue
        close, n = close_calls(ref, y)
        if close == 0 and n and not np.array_equal(ref, y):
            out.append(f"output '{name}': its top-1 agreement on the {label} tells little: "
                       f"none of their {n} decisions is close (the float model's lead over "
                       f"the runner-up under {CLOSE_LEAD:g} times the typical change the "
                       "quantized model makes to it), so hardly any could flip; read its SQNR")
    return out


def estimate_caveat() -> str:
    """What every check without real data says of its own figures."""
    return (f"no real data was seen: the check's figures are an estimate from synthetic inputs; "
            f"on real inputs they have read up to {SYNTHETIC_OVERSHOOT_DB:g} dB lower in SQNR "
            "(and lower in top-1 agreement) on the models measured for the documentation; "
            "check on your own inputs, or give calibration data")


def rough_figures(reference, test, names, n) -> list[str]:
    """Why the check's figures are rough (each a sentence), or nothing."""
    why = []
    if n < MIN_RELIABLE:
        why.append(f"the check ran on {n} inputs only (fewer than {MIN_RELIABLE}): its "
                   "figures are rough")
        if n < 4:
            return why
    half = n // 2
    for ref, y, name in zip(reference, test, names):
        a = _sqnr(np.asarray(ref[:half], np.float64), np.asarray(y[:half], np.float64))
        b = _sqnr(np.asarray(ref[half:], np.float64), np.asarray(y[half:], np.float64))
        if math.isfinite(a) and math.isfinite(b) and abs(a - b) > DISAGREE_DB:
            why.append(f"output '{name}': the two halves of the check inputs disagree "
                       f"({a:.1f} dB against {b:.1f} dB): its figures are rough")
    return why
