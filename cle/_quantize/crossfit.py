"""Cross-fitting: every calibration input checked by a build that was not calibrated on it.

With data, :func:`cle.quantize` calibrates its build on the first three quarters of the data
and holds the last quarter out (:func:`cle._measure.calibration.split_holdout`). The held-out
quarter alone is few inputs (16 of 64): its figures are rough and a choice among builds made
on them has little power. Cross-fitting uses the rest too. The calibration quarters are split
into :data:`FOLDS` − 1 parts; for each part, a build of the same kind is made with its
activation ranges calibrated on every input but that part's (the other parts and the
held-out quarter), and run on that part. Together with the build written, run on the held-out
quarter, every input is checked once, by a build whose ranges never saw it, and each build
calibrated on as many inputs as the build written.

What it costs: the candidates built from cle's equalized model (its ranges at their tails, or
at min/max) are made from the values each activation tensor took on each input, which the
build measured already (the held-out quarter's are measured once more), and the converter's
quantization step: a fraction of a second each. The plain conversion needs the converter's
own calibration, once per part.

What it does not re-fit: the equalized float model (its empirical bias correction was computed
on the first three quarters), so the inputs of those quarters were seen by the bias
correction, though not by the ranges of the build that checks them. Nor the widening of a
classifier's softmax logits (:func:`cle._quantize.ranges.logit_widening`, ``r.logit``): chosen
once on every calibration input left out in turn, it is reused by every fold, so a fold's
inputs had a say in how far its build's logits reach (helper-31's review: a mild optimism of
the cross-fitted figure where one input passes the others' logits). The held-out quarter's
figures are the build written's own.
"""

from __future__ import annotations

import copy

import numpy as np

from cle._core.inputs import ModelInputs
from cle._math.order import largest, smallest
from cle._measure.inference import outputs_once
from cle._quantize import ranges as _ranges
from cle._quantize.ranges import as_kind, pick_range, tensor_roles
from cle._tflite import converter as tflite

__all__ = ["FOLDS", "KIND", "CrossFit"]

#: The folds: :data:`FOLDS` − 1 parts of the calibration inputs and the held-out quarter.
FOLDS = 4
#: The kind of range (:data:`cle._quantize.ranges.KINDS`) of each candidate built from cle's
#: equalized model.
KIND = {"cle": "tails", "cle, min/max ranges": "min/max", "cle, widened ranges": "widened"}


def _join(parts) -> ModelInputs:
    first = parts[0]
    return ModelInputs(tuple(np.concatenate([p.arrays[k] for p in parts])
                             for k in range(len(first.arrays))), first.names, first.shapes)


class _Tails:
    """A tensor's sample known by its ends: the ``bottom`` and ``top`` values of a sample of
    ``n`` values, enough of them for the quantiles :func:`cle._quantize.ranges.tail_range`
    reads (``np.quantile``'s linear interpolation, the same figures)."""

    def __init__(self, bottom, top, n):
        self.bottom, self.top, self.n = np.sort(bottom), np.sort(top), n

    def quantile(self, q):
        position = q * (self.n - 1)
        if position <= (self.n - 1) / 2:
            ends, at = self.bottom, position
        else:
            ends, at = self.top, position - (self.n - len(self.top))
        low = int(np.floor(at))
        high = min(low + 1, len(ends) - 1)
        return float(ends[low] + (ends[high] - ends[low]) * (at - low))


class CrossFit:
    """The folds of one build's calibration and held-out inputs, and each candidate's outputs
    on all of them, each input by a build not calibrated on it (made once per candidate).

    ``build`` is a :class:`cle._quantize.pipeline.Int8Build` made with data, with its
    ``values`` and ``extremes`` (the activation tensors' values and extremes on each
    calibration input); ``written`` maps a candidate to its bytes on the held-out quarter
    (the build's own, calibrated on the three quarters); ``plain``, the
    :class:`cle._tflite.converter.PlainConversion` of ``model`` that made ``written["plain"]``
    (None: a new one), makes the plain conversion of each fold."""

    def __init__(self, model, build, written: dict, plain=None):
        self.model, self.build, self.written = model, build, written
        self.plain = plain or tflite.PlainConversion(model, build.opts.per_channel,
                                                     build.opts.integer_io)
        x_cal, x_hold = build.inputs.calibration, build.inputs.checks[0][1]
        self.parts = np.array_split(np.arange(len(x_cal)), FOLDS - 1)
        self.folds = [x_cal[idx] for idx in self.parts] + [x_hold]
        self.n = len(x_cal) + len(x_hold)
        self._held = None
        self._outputs = {}
        self._tail_lists = {}
        self._roles = None

    # ------------------------------------------------------------------ statistics

    def _held_stats(self):
        """The values and extremes of every activation tensor on the held-out inputs, as
        many values per input as the build kept per calibration input."""
        if self._held is None:
            build = self.build
            x_hold = self.folds[-1]
            per_input = tflite.sample_per_input(len(build.inputs.calibration))
            extremes = {}
            values = tflite.observe(build.calibrated, x_hold, [r.index for r in build.ranges],
                                    per_tensor=per_input * len(x_hold), extremes=extremes)
            self._held = values, extremes
        return self._held

    def _stats(self, index, k):
        """``(values, (min, max), (lows, highs))`` of tensor ``index`` on every input but part
        ``k``'s (on every input when ``k`` is None): a sample of its values, its extremes, and
        its min and max on each of those inputs."""
        build = self.build
        values, extremes = self._held_stats()
        n_cal = len(build.inputs.calibration)
        keep = np.ones(n_cal, bool)
        if k is not None:
            keep[self.parts[k]] = False
        lows, highs = build.extremes[index]
        held_lows, held_highs = extremes[index]
        bottom, top, n_kept = self._tails(index)
        sample = _Tails(np.concatenate([bottom[:n_cal][keep], bottom[n_cal:]]).ravel(),
                        np.concatenate([top[:n_cal][keep], top[n_cal:]]).ravel(),
                        n_kept * (int(keep.sum()) + len(self.folds[-1])))
        lows = np.concatenate([lows[keep], held_lows])
        highs = np.concatenate([highs[keep], held_highs])
        return sample, (float(lows.min()), float(highs.max())), (lows, highs)

    def extremes(self, index) -> tuple[np.ndarray, np.ndarray]:
        """``(lows, highs)``: tensor ``index``'s min and max on every input, in the order of
        :meth:`reference`."""
        return self._stats(index, None)[2]

    def _tails(self, index):
        """Per input (calibration inputs, then held-out ones), the smallest and the largest
        values of tensor ``index`` a tail of :data:`cle._quantize.ranges.TAIL` of any fold's
        sample can reach, and how many values each input gave: the tails of a fold are those
        of the union of its inputs' lists (the quantiles of :func:`_Tails.quantile`), so the
        whole sample is read once per tensor, not once per fold (each input's ends by
        :func:`cle._math.order.smallest` and :func:`~cle._math.order.largest`)."""
        if index not in self._tail_lists:
            build = self.build
            values, _ = self._held_stats()
            n_cal = len(build.inputs.calibration)
            per = np.concatenate([build.values[index][:-2].reshape(n_cal, -1),
                                  values[index][:-2].reshape(len(self.folds[-1]), -1)])
            n_kept = per.shape[1]
            k = min(n_kept, int(np.ceil(_ranges.TAIL * n_kept * len(per))) + 2)
            bottom = np.stack([smallest(row, k) for row in per])
            top = np.stack([largest(row, k) for row in per])
            self._tail_lists[index] = bottom, top, n_kept
        return self._tail_lists[index]

    # ------------------------------------------------------------------ the builds

    def _ranges(self, k, kind: str):
        """Every activation tensor's range as the build would set it from all inputs but part
        ``k``'s: at its tails (:func:`cle._quantize.ranges.pick_range`), then made a range of
        ``kind`` (:func:`cle._quantize.ranges.as_kind`)."""
        build = self.build
        if self._roles is None:  # read from the flatbuffer once, not once per fold
            self._roles = tensor_roles(build.calibrated)
        roles = self._roles
        ranges = [copy.copy(r) for r in build.ranges]
        for r in ranges:
            sample, (lo, hi), (lows, highs) = self._stats(r.index, k)
            pick_range(r, sample, (lo, hi), roles, {}, build.opts.integer_io)
            as_kind(r, kind, lows, highs, roles[1], roles[3])
        return ranges

    def _content(self, name, k) -> tuple[bytes, list | None]:
        """``(bytes, ranges)`` of the build of kind ``name`` calibrated on every input but
        part ``k``'s (every input: ``k`` None); no ranges for the plain conversion."""
        opts = self.build.opts
        if name == "plain":  # the file written is the converter's own, to the byte
            x = _join([f for j, f in enumerate(self.folds) if j != k])
            return (self.plain.on(x) if k is not None else tflite.convert_int8(
                self.model, x, per_channel=opts.per_channel, integer_io=opts.integer_io)), None
        ranges = self._ranges(k, KIND[name])
        return tflite.quantize_calibrated(tflite.with_ranges(self.build.calibrated, ranges),
                                          per_channel=opts.per_channel,
                                          integer_io=opts.integer_io), ranges

    def refit(self, name) -> tuple[bytes, list | None]:
        """``(bytes, ranges)``: a build of kind ``name`` with its ranges calibrated on every
        input (the plain conversion: the float model converted with all of them, what the
        user had; no ranges)."""
        return self._content(name, None)

    # ------------------------------------------------------------------ the outputs

    def reference(self) -> list:
        """The float model's outputs on every input, fold by fold."""
        return self._pooled([outputs_once(self.build.runs, self.model, x)
                             for x in self.folds])

    def outputs(self, name) -> list:
        """Candidate ``name``'s outputs on every input, each fold's by the build not
        calibrated on it (the held-out quarter's by ``written[name]``)."""
        if name not in self._outputs:
            runs = self.build.runs
            per_fold = [outputs_once(runs, self._content(name, k)[0], x)
                        for k, x in enumerate(self.folds[:-1])]
            per_fold.append(outputs_once(runs, self.written[name], self.folds[-1]))
            self._outputs[name] = self._pooled(per_fold)
        return self._outputs[name]

    def inputs(self) -> ModelInputs:
        """Every input, fold by fold (the order of :meth:`reference`)."""
        return _join(self.folds)

    def label(self) -> str:
        """What the cross-fitted check ran on, in words."""
        return (f"calibration inputs, each checked by a build not calibrated on it "
                f"({FOLDS} folds of about {len(self.folds[-1])})")

    @staticmethod
    def _pooled(per_fold) -> list:
        return [np.concatenate([fold[o] for fold in per_fold]) for o in range(len(per_fold[0]))]
