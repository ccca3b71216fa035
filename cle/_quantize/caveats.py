"""What makes a :func:`cle.quantize` result or its figures doubtful, in sentences for the
report's ``warnings``: :func:`caveats` from the check's sets and the inputs, and
:func:`float_gap` where TF Lite computes an output differently even before quantization."""

from __future__ import annotations

import math

import numpy as np

from cle._core.inputs import input_names
from cle._measure import check as _check
from cle._math.json_numbers import sqnr_words
from cle._measure.input_range import image_axis
from cle._tflite import converter as tflite

__all__ = ["CONVERGED_LOSS", "FIT_GAP_DB", "FLOAT_GAP_DB", "FLOAT_SOUND_DB", "caveats",
           "float_gap", "rounding_fit"]

#: A synthetic batch whose final BN-statistics loss is above this did not converge: for the
#: calibration's batches the run stops (``pipeline.FAILED_LOSS``), for the check's a warning.
CONVERGED_LOSS = 1.0
#: The float conversion bounds an output's figure where its own SQNR against the Keras model
#: is less than this many dB above the figure (it then holds a tenth of the noise or more) ...
FLOAT_GAP_DB = 10.0
#: ... and below this: a float32 conversion that computes what Keras computes reads far above
#: it (float32 rounding alone), so no sound model is told.
FLOAT_SOUND_DB = 60.0
#: With data, a rounding fitted for the layers' outputs (4-bit weights; "gptq", "adaround")
#: reads higher on the calibration inputs it fitted than on the held-out ones; more than this
#: many dB is said: the rounding has learnt those inputs, and inputs unlike them read lower.
FIT_GAP_DB = 2.0


def caveats(model, sets, inputs, input_ranges, declared=None) -> list[str]:
    """What makes the result or its figures doubtful, each a sentence: ``sets``, the check's
    sets (:func:`cle._quantize.pipeline.check_sets`); ``inputs``, the calibration inputs and
    the distillation's loss; ``input_ranges``, without data, each input's range;
    ``declared``: the caller's ``output_kinds``."""
    out = [f"output '{name}' is a linear vector that may hold class scores: it is checked as "
           "values (SQNR only); if it holds class scores, say so to get its top-1 agreement: "
           f"output_kinds={{{name!r}: 'classes'}} or --output-kind {name}=classes"
           for name in _check.undeclared_scores(model, declared)]
    out += [r.note for r in input_ranges or () if r.note]
    if fixed := tflite.fixed_sizes(model, inputs.calibration):
        out.append(fixed)
    if inputs.loss is not None and max(inputs.loss) > CONVERGED_LOSS:
        out.append(f"the distillation of the check's inputs did not converge (final "
                   f"batch-norm loss {max(inputs.loss):.3g}, above {CONVERGED_LOSS:g}; the "
                   "calibration's did, or the run would have stopped): the check's synthetic "
                   "inputs do not match the model's batch-norm statistics, so its figures may "
                   "be far from real inputs'; give calibration data")
    names, kinds = _check.output_names(model), _check.output_kinds(model, declared)
    for c in (c for c in sets if "reference" in c):
        out += _check.idle_top1(c["reference"], c["test"], names, kinds, c["inputs"])
    if len(sets) == 1:  # data: too few inputs, halves that disagree, poor or narrow entries
        out += _check.held_out_caveats(sets[0], names, kinds, inputs.calibration)
    else:  # without data: an estimate, and the two sets of synthetic inputs that disagree
        out.append(_check.estimate_caveat())
        out += _other_maps(model)
        out += _saturated(sets)
        for a, b in zip(*(c["outputs"] for c in sets)):
            if abs(a.sqnr_db - b.sqnr_db) > _check.DISAGREE_DB:
                out.append(f"output '{a.name}': the check's two sets of synthetic inputs "
                           f"disagree ({sqnr_words(a.sqnr_db)} on {sets[0]['inputs']}, "
                           f"{sqnr_words(b.sqnr_db)} on {sets[1]['inputs']}): without real "
                           "data the figure is rough; give calibration data to know it")
    return out


def _saturated(sets) -> list[str]:
    """Without data, a sentence per output that every synthetic check set reads as exact
    while its float values there take at most two values (saturated: a sparsemax or a hard
    sigmoid at its ends, each exactly on the file's grid): "exact" then says nothing of
    inputs that do not saturate it (hunt5's sparsemax head: exact on the synthetic inputs,
    nowhere near it on real ones, for TF Lite's plain conversion too)."""
    out = []
    for k, checks in enumerate(zip(*(c["outputs"] for c in sets))):
        if all(o.sqnr_db == math.inf for o in checks) and all(
                "reference" in c and np.unique(np.asarray(c["reference"][k])).size <= 2
                for c in sets):
            out.append(f"output '{checks[0].name}': exact on every synthetic check input, where "
                       "its float values take at most two values (saturated, or constant): the "
                       "figure says nothing of inputs that do not saturate it; give calibration "
                       "data to know it")
    return out


def _other_maps(model) -> list[str]:
    """Without data, a sentence naming the inputs that are maps but not images of 1 or 3
    channels (:func:`image_axis`: four channels, a clip, a volume; inputs of rank 1 or 2 are
    refused before any work): the estimate's bound was measured on images."""
    names = [name for name, t in zip(input_names(model), model.inputs)
             if image_axis(tuple(t.shape[1:])) is None]
    if not names:
        return []
    return [f"the input{'s' if len(names) > 1 else ''} {', '.join(repr(n) for n in names)} "
            f"{'are' if len(names) > 1 else 'is'} not an image of 1 or 3 channels: the bound "
            "above was measured on such images, not on maps of other kinds, so these figures "
            "are less sure; give calibration data to know them"]


def float_gap(choice, outputs) -> list[str]:
    """Per output whose figure TF Lite's float conversion bounds, a sentence: ``choice``, the
    :class:`cle._quantize.choice.Choice` made (its ``float_db``: the float conversion of the
    model, before any quantization, against the Keras model on the held-out inputs; nothing
    without a choice), ``outputs``: the report's :class:`cle._measure.check.OutputCheck`.
    Where the converter computes an output differently (a channels_first layer whose bias
    Keras' TensorFlow backend adds on another axis, docs/backends.md), no choice of ranges or
    rounding brings the file closer than that, and a user reading a low figure would look for
    the cause in the quantization."""
    if choice is None or not choice.float_db:
        return []
    return [f"output '{o.name}': TF Lite's float conversion of the model, before any "
            f"quantization, reads {f:.1f} dB against the Keras model on the {choice.n} "
            "held-out inputs: TF Lite computes this output differently even in float, so no "
            "quantized file comes much closer than that (a channels_first layer whose bias "
            "Keras adds on another axis is one known cause: docs/backends.md); check the float "
            "conversion (tf.lite.TFLiteConverter without optimizations) against your model"
            for o, f in zip(outputs, choice.float_db)
            if f < FLOAT_SOUND_DB and f < o.sqnr_db + FLOAT_GAP_DB]


def rounding_fit(fitted, checked) -> list[str]:
    """With data, per output whose figure on the inputs the rounding stage fitted
    (``fitted``: the check of the same file on them, :func:`cle._quantize.pipeline.check_sets`'
    form) is more than :data:`FIT_GAP_DB` above its held-out figure (``checked``, the report's
    outputs), a sentence. The held-out inputs come from the same calibration set, so the
    check cannot see inputs unlike it; a rounding that learnt its inputs reads far lower on
    those than its figure (measured on photos the calibration did not contain:
    docs/quantize_w4.md, "Few calibration crops")."""
    return [f"output '{o.name}': the rounding of the kernels fitted its calibration inputs: "
            f"the file's figure is {sqnr_words(f.sqnr_db)} on the {fitted['n']} inputs it "
            f"fitted and {sqnr_words(o.sqnr_db)} on the held-out ones; inputs unlike the "
            "calibration set (other scenes, sources, conditions) can read lower still, so check "
            "it on such inputs and calibrate on more varied ones (the 8-bit default fits far "
            "less)"
            for f, o in zip(fitted["outputs"], checked)
            if math.isfinite(o.sqnr_db) and f.sqnr_db - o.sqnr_db > FIT_GAP_DB]
