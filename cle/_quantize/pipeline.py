"""The implementation of :func:`cle.quantization.quantize` (stages: :mod:`cle.quantization`),
a small function each; everything is checked once, at the door, and handed down."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from cle._core.backend import check_runnable, exact_kernels
from cle._core.checks import check_model
from cle._core.graph import graph_view
from cle._core.inputs import ModelInputs, check_calibration_data
from cle._core.traced import functional_for
from cle._measure import calibration as _calibration
from cle._measure import check as _check
from cle._measure import field_spread as _field_spread
from cle._measure import input_range as _input_range
from cle._measure import synthetic as _synthetic
from cle._measure.calibration import input_range_of  # noqa: F401  (cle.quantization's)
from cle._measure.inference import outputs_once
from cle._quantize import caveats as _caveats
from cle._quantize import choice as _choice
from cle._quantize import constant_features as _constant_features
from cle._quantize import deploy
from cle._quantize import synthetic_choice as _nodata_choice
from cle._quantize import tune as _tune
from cle._quantize import weight_stages
from cle._quantize.caveats import CONVERGED_LOSS  # noqa: F401  (read from here)
from cle._quantize.check_sets import check_label, lower, public
from cle._quantize.input_ranges import (  # noqa: F401  (input_ranges_of: read from here)
    InputRangeUnknown, input_ranges_of, ranges_without_data)
from cle._quantize.options import QuantizeOptions
from cle._quantize.ranges import MIN_WIDTH, TAIL, choose_percentile_ranges  # noqa: F401
from cle._quantize.report import HELD_OUT, QuantizeReport
from cle._tflite import converter as tflite
from cle._transforms.equalize import equalize_checked
from cle._transforms.options import EqualizeOptions

__all__ = ["InputRangeUnknown", "Int8Build", "QuantizeOptions", "QuantizeReport",
           "build_checked", "check_build", "check_label", "check_sets", "input_ranges_of",
           "lower", "quantize", "quantize_checked"]

#: Share of the calibration data held out for the check (when at least 8 remain to calibrate).
HOLDOUT = 0.25
#: Without data, the calibration inputs: inputs distilled from the BN statistics and as many
#: natural-image-like inputs across the input range (unless those are unlike the data to the
#: batch norms: :mod:`cle._measure.field_spread`); the check: other natural-image-like
#: inputs, and inputs distilled apart (another seed, other batches).
SYNTHETIC_CALIBRATION, SYNTHETIC_CHECK, DISTILLED_CHECK = 32, 32, 16
#: A synthetic calibration batch whose final BN-statistics loss is above ``FAILED_LOSS`` did
#: not converge, and the run stops: inputs that do not match the batch norms cannot stand in
#: for data (the trained networks measured end well below it; blob-grid classifiers whose
#: distillation ended above it got broken files, their logits' range set by inputs that never
#: reached a positive logit, their check far above the real figure: CHANGELOG). The check's
#: batch distilled apart is held to ``CONVERGED_LOSS`` by a warning
#: (:mod:`cle._quantize.caveats`).
FAILED_LOSS = CONVERGED_LOSS


@dataclasses.dataclass
class _Inputs:
    """The calibration inputs and the check's sets of inputs (``(what, inputs)``); ``unlike``:
    the sets (by what) unlike the data to the batch norms, whose figures do not bound the
    report's (:mod:`cle._quantize.check_sets`)."""

    calibration: ModelInputs
    checks: list
    loss: list | None = None
    what: str = "inputs given"
    unlike: tuple = ()

    @property
    def held_out(self) -> bool:
        """Whether the check runs on calibration inputs the calibration did not use."""
        return self.checks[0][0] == HELD_OUT


def quantize(model, calibration_data=None, *, per_channel: bool = True, weight_bits: int = 8,
             activation_bits: int = 8, integer_io: bool | None = None,
             bias_correction: str = "auto", ranges: str = "auto",
             input_range=None, compare: bool = False, seed: int = 0,
             progress: Callable[[str], Any] | None = None,
             tune: bool = False, rounding: str = "auto",
             output_kinds=None, target: str = "litert") -> tuple[bytes, QuantizeReport]:
    """A full-integer TF Lite model of ``model`` (8-bit activations and 8- or 4-bit weights,
    or TF Lite's 16x8 mode), as close to it as this library can make it.

    Args:
        model: a Functional or Sequential ``keras.Model`` (any number of inputs and outputs);
            it is not modified.
        calibration_data: model inputs, preprocessed as the model expects: an array
            ``(N, *input_shape)``, an iterable of batches or a ``tf.data.Dataset``; for a
            model with several inputs, a dict ``{input name: array}`` or a tuple of arrays
            (:func:`cle.load_calibration` reads ``.npy``/``.npz`` files and image folders).
            A quarter is held out for the check when at least 8 inputs remain to calibrate on.
            None: no data (synthetic inputs distilled from the model's BN statistics, and
            the input range found from the model, or ``input_range``).
        per_channel: one weight scale per output channel (TF Lite's default) or, with False,
            one per tensor; the scaling is chosen for it.
        weight_bits: 8, or 4: INT4 weights (W4A8) for every Conv1D/2D, DepthwiseConv1D/2D,
            SeparableConv1D/2D and Dense layer (packed two per byte in the ``.tflite``, where
            LiteRT runs them; the report's ``weights`` says per layer what was stored how and
            why a layer stays 8-bit).
        activation_bits: 8, or 16 for TF Lite's 16x8 mode (per-channel weights only).
        integer_io: int8 (int16 in 16x8 mode) model inputs and outputs instead of float32;
            None (default): the target's (float32 on "litert", int8 on a microcontroller or
            an NPU).
        bias_correction: "auto" (default): empirical with data, analytic without; or
            "empirical" (needs data), "analytic", "none".
        ranges: "auto" (default): each activation tensor's range holds all but a
            :data:`TAIL` share of its values on each side, and with calibration data (8-bit
            weights rounded by the converter, 8-bit activations, no tuning) the file written
            is the closest to the float model, on every calibration input cross-fitted, of
            that build, the same with every range at its min/max (and, for a model with a
            value output, widened past it) and the float model straight into TF Lite's
            converter (:mod:`cle._quantize.choice`; ``report.choice``); "percentile": the
            tails, always; "minmax": the converter's own min/max.
        input_range: without data only: ``(low, high)`` of every input (e.g. ``(-1, 1)`` for
            the ``tf`` preprocessing), or ``{input name: (low, high)}`` for some of them. An
            input without a stated range gets the range its preprocessing layers or its
            first batch norm's statistics say (:mod:`cle._measure.input_range`).
        compare: also convert the float model straight (TF Lite's defaults, the same
            calibration inputs) and check it the same way.
        seed: seed of the synthetic inputs.
        progress: optional ``callable(str)`` told about each stage.
        tune: choose the ranges of the activation tensors that add most to the output's
            error among their 1e-4 tails, min/max, least-MSE range and narrower tails, where
            the choice measures better (:mod:`cle._quantize.tune`), then a bias correction
            for the error of each layer's input quantization, kept where it measures better.
            With data, half of the held-out inputs tune and the other half check; without
            data, the synthetic calibration inputs tune and the check's sets (which tuning
            never saw) check. Models with one input and one output only; 8-bit weights
            rounded to nearest only (the tuning requantizes with TF Lite's own rounding).
        rounding: how kernels are rounded onto their grid: "nearest" (what TF Lite's
            converter does; below 8 bits each layer's bias then takes its mean output error
            away on the calibration inputs, unless ``bias_correction="none"``), "tapsum" (8
            bits: to nearest, then the fewest weights of each (input, output) channel pair of
            a Conv2D or DepthwiseConv2D kernel moved one step so that its sum over the taps
            stays within half a step of the float one; the converter keeps them), "gptq"
            (layer by layer for the layer's output, on the calibration inputs, or without
            data on the synthetic calibration inputs, never on the check's; each layer's
            bias takes its mean output error away, unless ``bias_correction="none"``),
            "adaround" (the same aim, learned; slower), or "auto" (default): at 4 bits
            "adaround" with data, "gptq" without; at 8, "tapsum" with per-tensor weights or
            without data (8-bit activations), else "nearest" (chosen by measurement:
            docs/quantize_w4.md).
        output_kinds: ``{output name: "classes" | "values"}`` for outputs whose kind the
            model does not show: the check gives top-1 agreement for class scores only, which
            are outputs ending in a softmax or a sigmoid over two entries or more, and the
            outputs declared "classes" (e.g. linear logits). A linear vector is values
            unless declared, here or by its compiled loss (:mod:`cle._measure.losses`).
            Names are the layers that make the outputs (or the model's output names).
        target: where the file will run (:data:`cle._tflite.targets.TARGETS`; ``cle
            targets`` lists them): "litert" (default: LiteRT on a CPU), "tflm" (TF Lite
            Micro on a microcontroller: INT4 weights only where its kernels run them, the
            file run in its own interpreter, ``report.target["arena_bytes"]``), or an Ethos-U
            NPU such as "ethos-u55-128" (compiled by Vela, whose figures the report gives and
            whose compiled model is ``report.compiled``; 4-bit grids stored as INT8, which
            Vela compiles). Those need ``pip install keras-cle[targets]``.

    Returns:
        ``(tflite_bytes, report)``: the ``.tflite`` flatbuffer and a :class:`QuantizeReport`.

    Raises:
        TypeError: ``model`` is not a ``keras.Model``.
        ValueError: an option out of range or options that contradict each other,
            calibration data that does not fit the model's inputs (one line naming what the
            model expects and what was received), without data an input whose range the
            model cannot tell and no ``input_range`` (:class:`InputRangeUnknown`), a model
            without batch norms and without data, or ``tune=True`` with several inputs or
            outputs, 16-bit activations, ``ranges="minmax"``, 4-bit weights or a rounding
            other than to nearest; 4-bit weights or a rounding other than to nearest with
            16-bit activations or with ``bias_correction="analytic"`` or ``"empirical"`` (the
            rounding stage sets the biases then); a target whose tools are not installed or
            that does not take the activation bits asked for; a layer TF Lite's converter
            cannot write (a recurrent layer not unrolled, 3-D pooling: each named, up front).
        RuntimeError: the PyTorch backend (TF Lite's converter cannot read its models), or
            non-finite synthetic inputs or outputs.

    Example:
        >>> content, report = cle.quantize(model, x_calibration)
        >>> print(report.summary())
    """
    opts = QuantizeOptions.from_call(
        calibration_data, per_channel=per_channel, weight_bits=weight_bits,
        activation_bits=activation_bits, integer_io=integer_io,
        bias_correction=bias_correction, ranges=ranges, input_range=input_range,
        compare=compare, seed=seed, tune=tune, rounding=rounding, output_kinds=output_kinds,
        target=target)
    return quantize_checked(model, calibration_data, opts, progress)


@exact_kernels
def quantize_checked(model, calibration_data, opts: QuantizeOptions, progress=None, builds=None):
    """:func:`quantize` with its options already made: the door and the stages up to the
    ``.tflite`` (:func:`build_checked`), the tuning if asked for, then the check
    (:func:`check_build`); a model converted again is not exported again (``shared_exports``).
    On a device target every conversion reads the model with a batch of one (``static_batch``
    in :mod:`cle._tflite.converter`), and the file runs in the target's runtime. ``builds``:
    a list the :class:`Int8Build` is appended to (``cle demo`` analyses it)."""
    say = progress if progress is not None else (lambda message: None)
    device = opts.target_spec.runtime != "litert"
    check_model(model)
    model, traced = functional_for(model, calibration_data)  # a subclassed model, traced
    with tflite.static_batch(1 if device else None), tflite.shared_exports():
        build = build_checked(model, calibration_data, opts, say,
                              "cle.quantize(tune=True)" if opts.tune else None)
        if opts.tune:
            _timed(build.seconds, "tune", _tune.tune_build, build, model, say)
        choice, plain = (_timed(build.seconds, "choose", _choice.choose, model, build, say)
                         if _choice.chooses(build) else _nodata_choice.choose(model, build, say))
        build.values, build.extremes = None, {}  # the samples are large: not kept any longer
        report = check_build(model, build, say, plain, choice)
    if build.calibration == "synthetic":
        _synthetic.refuse_far_file(report.outputs)
    report.warnings[:0] = [w for w in (traced, tflite.tanh_gelu_note(model)) if w]
    if builds is not None:
        builds.append(build)
    if device:
        _timed(build.seconds, "target", deploy.check_on_target, model, build, report, say)
    return build.content, report


@dataclasses.dataclass
class Int8Build:
    """What :func:`quantize` builds before its check, for the routes that go on from there
    (the tuning, ``cle.analyze``).

    Attributes:
        opts: the checked :class:`QuantizeOptions`.
        inputs: the calibration inputs (``inputs.calibration``, a
            :class:`cle._core.inputs.ModelInputs`) and the check's sets
            (``inputs.checks``, ``(what, inputs)``), ``inputs.loss`` and ``inputs.what``.
        calibration: "data" or "synthetic".
        input_ranges: without data, every input's
            :class:`cle._measure.input_range.InputRange`; with data None.
        equalized, equalization: the equalized float model (its kernels rounded onto their
            grids when the rounding stage ran) and the equalize stage's report.
        calibrated: the float flatbuffer with the chosen ranges written in (what the quantize
            step read; None in 16x8 mode, which the converter runs in one step).
        ranges: every activation tensor's :class:`cle._tflite.converter.TensorRange`.
        content: the ``.tflite``.
        seconds: wall time of each stage.
        values: the values each activation tensor took on the calibration inputs (a sample,
            by tensor index, as many per input; None with ``ranges="minmax"``), for the tuning
            and the cross-fitted check (:mod:`cle._quantize.crossfit`); dropped after them.
        extremes: each activation tensor's min and max on each calibration input
            (``{index: (lows, highs)}``), for the same.
        crossfit: after the choice, the check's figures on every calibration input, each
            by a build not calibrated on it (:mod:`cle._quantize.crossfit`):
            ``{"inputs", "n", "reference", "test", "clipping", "clipping_plain"}`` and,
            when measured, ``"plain"``.
        tuning: after the tuning, its :class:`cle._quantize.tune.TuneReport`.
        rounding: the :class:`cle._quantize.rounding.RoundingReport` of the rounding stage
            (None when TF Lite's converter rounds: 8 bits, to nearest).
        weights: how each weight tensor of the ``.tflite`` is stored and why
            (:class:`cle._tflite.weight_store.StoredWeight`).
        snapped: with ``rounding="tapsum"``, the float kernels the layers of ``equalized``
            had before they were put on their grids (``equalized`` and ``calibrated`` hold
            them on their grids), ``{layer name: {attribute: kernel}}``.
        int8_size: the bytes of the converter's file, every weight 8-bit, before the store
            stage put the rounded kernels in it.
        runs: the outputs already computed on the check's inputs, by model or ``.tflite``
            and inputs (:func:`cle._measure.inference.outputs_once`): the choice's runs on
            the held-out inputs, which the check and ``compare`` take from there.
        notes: what the prepared model changed that is not exact (:mod:`.constant_features`).
    """

    opts: QuantizeOptions
    inputs: Any
    calibration: str
    input_ranges: list | None
    equalized: Any
    equalization: Any
    calibrated: bytes | None
    ranges: list
    content: bytes
    seconds: dict
    values: dict | None = None
    tuning: Any = None
    rounding: Any = None
    weights: list = dataclasses.field(default_factory=list)
    snapped: dict = dataclasses.field(default_factory=dict)
    int8_size: int = 0
    runs: dict = dataclasses.field(default_factory=dict)
    extremes: dict = dataclasses.field(default_factory=dict)
    notes: list = dataclasses.field(default_factory=list)
    crossfit: dict | None = None

    @property
    def n_calibrated(self) -> int:
        """How many inputs set the ``.tflite``'s activation ranges: every calibration input
        once the choice wrote its build calibrated on all of them, else the calibration
        inputs less those held out."""
        return len(self.inputs.calibration) if self.crossfit is None else self.crossfit["n"]


def build_checked(model, calibration_data, opts: QuantizeOptions, say,
                  single_io: str | None = None) -> Int8Build:
    """The door and :func:`quantize`'s stages up to the ``.tflite``, without its check.
    ``single_io`` names the route (``"cle.analyze"``, ...) that takes models with one input
    and one output only: others are refused at the door."""
    view, x, input_ranges = _door(model, calibration_data, opts, single_io)
    seconds: dict[str, float] = {}
    inputs = _calibration_inputs(model, x, input_ranges, opts, say, seconds)
    equalized, eq_report = _timed(seconds, "equalize", _equalize, model, view, x, inputs,
                                  opts, say)
    equalized, notes = (_constant_features.tame(equalized, inputs.calibration)
                        if x is not None else (equalized, []))
    snapped = (_timed(seconds, "rounding", weight_stages.snap_stage, equalized, opts, say)
               if opts.rounding_method == "tapsum" else {})
    rounded, entries = _timed(
        seconds, "rounding", weight_stages.round_stage, equalized, inputs.calibration, opts,
        "calibration inputs" if x is not None else "synthetic inputs", say
    ) if opts.rounds else (None, None)
    extremes = {}
    content, tensor_ranges, calibrated, values = _timed(
        seconds, "convert", _convert, equalized, inputs.calibration, opts, input_ranges, say,
        extremes, x is None)
    int8_size = len(content)
    content, stored = _timed(seconds, "store", weight_stages.store_stage, content, entries, say,
                             opts.target_spec)
    return Int8Build(opts, inputs, "data" if x is not None else "synthetic", input_ranges,
                     equalized, eq_report, calibrated, tensor_ranges, content, seconds,
                     values, rounding=rounded, weights=stored, snapped=snapped,
                     int8_size=int8_size, extremes=extremes, notes=notes)


def check_sets(model, build: Int8Build, say) -> list:
    """The check of the build's ``.tflite`` on each of its sets of check inputs (see
    :func:`_check_model`), timed as the "check" stage, each with whether its figures bound the
    report's (``"bounds"``: :mod:`cle._quantize.check_sets`); after the choice, the one set
    of every calibration input it cross-fitted (``build.crossfit``)."""
    if build.crossfit is not None:
        fit, names = build.crossfit, _check.output_names(model)
        kinds = _check.output_kinds(model, build.opts.output_kinds)
        return [{**fit, "outputs": _check.check_outputs(
            fit["reference"], fit["test"], names, kinds, fit.get("clipping"), fit.get("ties"))}]
    clipping = (_choice.unchosen_clipping(model, build) if build.calibration == "data"
                else None)
    sets = _timed(build.seconds, "check", _check_model, model, build.content,
                  build.inputs.checks, build.opts, say, build.runs, clipping)
    return [{**c, "bounds": c["inputs"] not in build.inputs.unlike} for c in sets]


def check_build(model, build: Int8Build, say, straight=None, choice=None) -> QuantizeReport:
    """The check of the build's ``.tflite`` (and, with ``compare``, of the float model
    converted straight: ``straight``, its bytes when made already), and the
    :class:`QuantizeReport` (``choice``: the :class:`cle._quantize.choice.Choice` made)."""
    opts, inputs, seconds = build.opts, build.inputs, build.seconds
    sets = check_sets(model, build, say)
    fitted = None if build.crossfit is None else build.crossfit.get("plain")
    plain = (_timed(seconds, "compare", _compare, model, inputs, sets, opts, say, straight,
                    build.runs, fitted) if opts.compare else None)
    warned = [] if choice is None or choice.warning() is None else [choice.warning()]
    data = build.calibration == "data"
    outputs = lower(sets)
    if build.rounding is not None and build.rounding.n_inputs and data and inputs.held_out:
        on_fit = _timed(seconds, "check fitted", _check_model, model, build.content, [(
            "calibration inputs the rounding fitted", inputs.calibration)], opts, say,
            build.runs)[0]
        warned += _caveats.rounding_fit(on_fit, outputs)
    return QuantizeReport(
        target=opts.settings, calibration=build.calibration,
        n_calibration=build.n_calibrated,
        check_inputs=check_label(sets), n_check=sum(c["n"] for c in sets),
        equalization=build.equalization,
        bias_correction=opts.bias_mode, ranges=build.ranges,
        input_ranges=[] if data else [r.to_dict() for r in build.input_ranges],
        outputs=outputs, check_sets=[public(c) for c in sets], plain=plain,
        calibration_inputs=inputs.what, synthesis_loss=inputs.loss,
        choice=choice,
        warnings=warned + build.notes + _caveats.caveats(model, sets, inputs, build.input_ranges,
                                           opts.output_kinds)
        + _caveats.float_gap(choice, outputs) + (
            build.tuning.warnings() if build.tuning is not None else []),
        seconds=seconds, tail=TAIL, tuning=build.tuning, rounding=build.rounding,
        weights=build.weights, size=len(build.content), size_int8=build.int8_size)


def _timed(seconds, stage, fn, *args):
    start = time.perf_counter()
    try:
        return fn(*args)
    finally:
        seconds[stage] = time.perf_counter() - start


# ---------------------------------------------------------------------------- the door


def _door(model, calibration_data, opts, single_io=None):
    """Everything checked once, before any work: the model and its graph (with
    ``single_io``, one input and one output), the backend, the data (one float32 copy) and,
    without data, every input's range. Returns ``(view, x or None, input ranges or None)``."""
    check_model(model)
    view = graph_view(model)  # a clear error for a model whose graph cannot be read
    if single_io is not None and (len(model.inputs) != 1 or len(model.outputs) != 1):
        raise ValueError(
            f"{single_io} supports models with one input and one output so far (several "
            "inputs or outputs are not supported there yet; cle.quantize without tuning takes "
            f"them). Received: model '{model.name}' with {len(model.inputs)} inputs and "
            f"{len(model.outputs)} outputs")
    _check.declared_kinds(model, opts.output_kinds)  # names that are no output: refused here
    tflite.check_convertible(model, "cle.quantize")
    if opts.activation_bits == 16:
        tflite.check_int16(model)
    check_runnable(model, "cle.quantize")
    if calibration_data is not None:
        return view, check_calibration_data(model, calibration_data), None
    # A model without batch norms needs data whatever its input range: say that first, so
    # one refusal names the one thing that settles it (not the input range, then the data).
    _synthetic.check_distillable(model)
    return view, None, ranges_without_data(
        model, opts.input_range, _synthetic.regression_outputs(model, opts.output_kinds),
        _synthetic.coded_outputs(model, opts.output_kinds))


# ---------------------------------------------------------------------------- the stages


def _calibration_inputs(model, x, input_ranges, opts, say, seconds) -> _Inputs:
    """With data: the data less a held-out part for the check. Without data: inputs
    distilled from the model's BN statistics and natural-image-like inputs across the input
    ranges to calibrate on (the distilled alone where the fields are unlike the data to the
    batch norms: :func:`cle._measure.field_spread.calibration_inputs`); to check on, other
    natural-image-like inputs and inputs distilled apart, none of which the calibration saw."""
    if x is not None:
        x_cal, x_check = _calibration.split_holdout(x, HOLDOUT)
        if x_check is None:
            return _Inputs(x_cal, [("calibration inputs (the same: too few to hold out)",
                                    x_cal)])
        return _Inputs(x_cal, [(HELD_OUT, x_check)])
    start = time.perf_counter()
    ranges = [(r.lo, r.hi) for r in input_ranges]
    say(f"no calibration data: distilling {SYNTHETIC_CALIBRATION + DISTILLED_CHECK} synthetic "
        "inputs from the model's batch-norm statistics, in the input range "
        + ", ".join(f"[{lo:.4g}, {hi:.4g}]" for lo, hi in ranges))
    distilled, loss = _synthetic.distill(model, SYNTHETIC_CALIBRATION, input_range=ranges,
                                         seed=opts.seed, progress=say, fail_above=FAILED_LOSS,
                                         output_kinds=opts.output_kinds)
    apart, loss_apart = _synthetic.distill(model, DISTILLED_CHECK, input_range=ranges,
                                           seed=opts.seed + 1000, progress=say,
                                           output_kinds=opts.output_kinds)
    seconds["synthesize"] = time.perf_counter() - start
    fields = _fields(distilled, input_ranges, SYNTHETIC_CHECK, opts.seed + 1)
    calibration, what = _field_spread.calibration_inputs(model, distilled, fields)
    checks = [("natural-image-like inputs across the input range",
               _fields(distilled, input_ranges, SYNTHETIC_CHECK, opts.seed + 2)),
              ("inputs distilled apart from the calibration inputs", apart)]
    unlike = (checks[0][0],) if calibration is distilled else ()  # the fields left out
    return _Inputs(calibration, checks, loss + loss_apart, what, unlike)


def _fields(like, input_ranges, n, seed):
    """``n`` natural-image-like inputs across each input's range
    (:func:`cle._measure.input_range.natural_inputs`)."""
    return ModelInputs(tuple(_input_range.natural_inputs(n, shape, r, seed=seed)
                             for shape, r in zip(like.shapes, input_ranges)),
                       like.names, like.shapes)


def _equalize(model, view, x, inputs, opts, say):
    """``equalize_model`` for the target, with bias correction (empirical on the calibration
    inputs with data, analytic without; none when the rounding stage sets the biases: the
    float model it rounds against is the uncorrected one) and, with data, measured activation
    ranges."""
    mode = "none" if opts.bias_mode == "rounding" else opts.bias_mode
    with_data = mode == "empirical" or x is not None
    eq_opts = EqualizeOptions(
        bias_correction=mode, weight_bits=opts.weight_bits,
        per_channel_weights=opts.per_channel, activation_bits=opts.activation_bits,
        activation_ranges="calibration" if with_data else "bn", has_data=with_data,
        weight_rounding="tapsum" if opts.rounding_method == "tapsum" else "nearest",
        stable_activations=True)
    say(f"equalizing (cross-layer scaling for "
        f"{'per-channel' if opts.per_channel else 'per-tensor'} INT{opts.weight_bits}, {mode} "
        "bias correction)")
    return equalize_checked(model, view, eq_opts, inputs.calibration if with_data else None,
                            guard_inputs=inputs.calibration)


def _convert(equalized, x_cal, opts, input_ranges, say, extremes=None, synthetic=False):
    """``(tflite bytes, tensor ranges, calibrated flatbuffer, sampled values)``: the
    converter's 16x8 mode (no calibrated flatbuffer), or its calibrate step, the chosen ranges
    written in, and its quantize step; the values each tensor took on ``x_cal`` when the
    ranges were chosen from them."""
    if opts.activation_bits == 16:
        say(f"converting (TF Lite 16x8, calibration on {len(x_cal)} inputs)")
        return (tflite.convert_int16(equalized, x_cal, integer_io=opts.integer_io), [], None,
                None)
    percentile = opts.tails
    say(f"calibrating activation ranges on {len(x_cal)} inputs")
    # With percentile ranges every min/max is measured again on all of x_cal, so one input
    # gives the converter what it needs (the tensors that carry a range).
    calibrated = tflite.calibrate(equalized, x_cal[:1] if percentile else x_cal)
    tensor_ranges, values = tflite.ranges_of(calibrated), None
    if percentile:
        stated = {r.name: (r.lo, r.hi) for r in input_ranges} if input_ranges else {}
        values = choose_percentile_ranges(calibrated, x_cal, tensor_ranges, stated,
                                          opts.integer_io, say, extremes, synthetic)
    if percentile or tflite.padded_below(calibrated):  # min/max: the converter's but those
        calibrated = tflite.with_ranges(calibrated, tensor_ranges)
    say("quantizing")
    return (tflite.quantize_calibrated(calibrated, per_channel=opts.per_channel,
                                       integer_io=opts.integer_io), tensor_ranges, calibrated,
            values)


def _check_model(model, content, checks, opts, say, runs=None, clipping=None):
    """For each set of check inputs, ``{"inputs", "n", "reference", "test", "outputs"}``: the
    float and quantized outputs and each output's :class:`cle._measure.check.OutputCheck`
    (taken from ``runs`` where computed already; ``clipping``: per output, the clipping new
    inputs are expected to add, which the interval reaches down to)."""
    runs = {} if runs is None else runs
    what = ("16x8" if opts.activation_bits == 16 else
            "W4A8" if opts.weight_bits == 4 else "INT8")
    names, kinds = _check.output_names(model), _check.output_kinds(model, opts.output_kinds)
    sets = []
    for label, x in checks:
        say(f"checking the {what} model on {len(x)} {label}")
        reference = outputs_once(runs, model, x)
        y = outputs_once(runs, content, x)
        sets.append({"inputs": label, "n": len(x), "reference": reference, "test": y,
                     "outputs": _check.check_outputs(reference, y, names, kinds, clipping)})
    return sets


def _compare(model, inputs, sets, opts, say, straight=None, runs=None, fitted=None):
    """The check's figures for the float model converted straight (TF Lite's defaults;
    ``straight``: its bytes, when the choice of the build made them already, with its
    outputs in ``runs``; ``fitted``: its outputs on the cross-fitted check's one set)."""
    runs = {} if runs is None else runs
    if fitted is not None:
        straight = b""  # not run again: its outputs on every input are ``fitted``
    if straight is None:
        say("converting the float model straight, for comparison")
        straight = (tflite.convert_int16(model, inputs.calibration)
                    if opts.activation_bits == 16 else
                    tflite.convert_int8(model, inputs.calibration, per_channel=opts.per_channel))
    names, kinds = _check.output_names(model), _check.output_kinds(model, opts.output_kinds)
    plain, verdicts = [], []
    for c, (_, x) in zip(sets, inputs.checks):
        y = fitted if fitted is not None else outputs_once(runs, straight, x)
        clip = zip(*(c.get(k) or [0.0] * len(names) for k in ("clipping", "clipping_plain")))
        plain.append({"outputs": _check.check_outputs(c["reference"], y, names, kinds,
                                                       c.get("clipping_plain")),
                      "bounds": c.get("bounds", True)})
        verdicts += [{"inputs": c["inputs"], "output": name, "verdict": verdict,
                      "interval_db": interval}
                     for name, ref, ours, theirs, (ca, cb) in zip(names, c["reference"],
                                                                   c["test"], y, clip)
                     for verdict, interval in [_check.compare_verdict(
                         ref, ours, theirs, clipping=(ca, cb))]]
    outputs = lower(plain)
    return {"top1_agreement": outputs[0].top1_agreement, "sqnr_db": outputs[0].sqnr_db,
            "outputs": outputs, "verdicts": verdicts}


def load_calibration(path, model, preprocessing: str | None = None, limit: int | None = None):
    """Calibration inputs for ``model`` from a ``.npy``/``.npz`` file or a folder of images.

    A folder's images are resized (shorter side) and center-cropped to the model's input
    size, then preprocessed with ``preprocessing``: ``"tf"`` ([−1, 1]), ``"torch"`` (ImageNet
    mean/std), ``"caffe"`` (BGR minus ImageNet mean), ``"raw"`` (0..255), ``"module:function"``.

    Args:
        path: a ``.npy`` file; a ``.npz`` file with one array per model input named by the
            input (for a one-input model also its one array, or the one named ``x`` /
            ``inputs``); or a folder of images (one-input models).
        model: the ``keras.Model`` the inputs are for.
        preprocessing: for a folder of images (required there; refused for arrays).
        limit: read at most this many images.

    Returns:
        A float32 array ``(N, *input_shape)`` for a one-input model, else a dict
        ``{input name: array}`` (what :func:`quantize` takes).

    Raises: ValueError, one line naming what was expected and what was received.
    """
    x = _calibration.load_calibration(path, model, preprocessing, limit)
    return x.arrays[0] if len(x.arrays) == 1 else x.as_dict()
