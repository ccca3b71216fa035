"""``cle quantize`` and ``cle analyze``: their option checks (before the model is loaded,
through the library's own :class:`cle._quantize.options.QuantizeOptions`, so that the command
line and :func:`cle.quantization.quantize` / :func:`cle.analysis.analyze` agree on every
combination) and the commands. Standard library only at import, like :mod:`cle.cli`."""

from __future__ import annotations

import dataclasses
import math
import os
import sys

from cle._cli.common import (
    EXIT_OK, EXIT_TARGET, EXIT_USAGE, CliError, Session, check_graph, json_bytes, one_line,
    write_outputs,
)

__all__ = ["check_quantize_options", "cmd_analyze", "cmd_quantize", "input_range_arg",
           "output_kind_arg", "quantize_options"]


def input_range_arg(text):
    """``--input-range`` as ``(None, (lo, hi))`` for every input or ``(name, (lo, hi))``."""
    import argparse

    name, _, pair = text.rpartition("=")
    try:
        lo, hi = (float(v) for v in pair.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected LOW,HIGH or INPUT=LOW,HIGH (e.g. --input-range=-1,1); received "
            f"{text!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise argparse.ArgumentTypeError(f"expected LOW < HIGH; received {text!r}")
    return name or None, (lo, hi)


def output_kind_arg(text):
    """``--output-kind OUTPUT=KIND`` as ``(output name, kind)``."""
    import argparse

    from cle._quantize.options import OUTPUT_KINDS

    name, _, kind = text.rpartition("=")
    if not name or kind not in OUTPUT_KINDS:
        raise argparse.ArgumentTypeError(
            f"expected OUTPUT=KIND with KIND one of {', '.join(OUTPUT_KINDS)} (e.g. "
            f"--output-kind predictions=classes); received {text!r}")
    return name, kind


def _stated_range(args):
    """The library's ``input_range`` from ``--input-range`` (repeatable) or a named
    ``--preprocessing`` without data; contradictions are usage errors."""
    given = args.input_range or []
    named = {n: r for n, r in given if n is not None}
    unnamed = [r for n, r in given if n is None]
    if unnamed and (named or len(unnamed) > 1):
        raise CliError("--input-range LOW,HIGH sets every input's range; give it once, or "
                       "name each input (--input-range=NAME=LOW,HIGH)", EXIT_USAGE)
    stated = unnamed[0] if unnamed else (named or None)
    if args.preprocessing and not args.calibration:
        from cle._measure.calibration import PREPROCESSING

        if args.preprocessing not in PREPROCESSING:
            if stated is None:
                raise CliError(f"--preprocessing {args.preprocessing} gives no known input "
                               "range for synthetic inputs; pass --input-range LOW,HIGH",
                               EXIT_USAGE)
            return stated
        from cle._measure.calibration import input_range_of

        implied = input_range_of(args.preprocessing)
        if stated is not None and (named or any(
                abs(a - b) > 1e-6 * max(1.0, abs(b)) for a, b in zip(stated, implied))):
            shown = ", ".join(f"{n or 'every input'}: {lo:g},{hi:g}"
                              for n, (lo, hi) in given)
            raise CliError(f"--preprocessing {args.preprocessing} means the input range "
                           f"{implied[0]:g},{implied[1]:g}, which contradicts --input-range "
                           f"({shown}); give one of them", EXIT_USAGE)
        return implied
    return stated


def quantize_options(args):
    """The :class:`cle._quantize.options.QuantizeOptions` of the flags (a usage error if the
    library refuses them)."""
    from cle._quantize.options import QuantizeOptions

    try:
        return QuantizeOptions(
            per_channel=args.per_channel, activation_bits=getattr(args, "activation_bits", 8),
            integer_io=args.integer_io, bias_correction=args.bias_correction,
            ranges=args.ranges, input_range=_stated_range(args),
            compare=getattr(args, "compare", False), tune=getattr(args, "tune", False),
            weight_bits=getattr(args, "weight_bits", 8),
            rounding=getattr(args, "rounding", "auto"),
            output_kinds=dict(args.output_kind) if getattr(args, "output_kind", None) else None,
            has_data=bool(args.calibration), target=getattr(args, "target", "litert"))
    except ValueError as exc:
        raise CliError(one_line(exc), EXIT_USAGE) from exc


def check_quantize_options(args):
    """``cle quantize``'s and ``cle analyze``'s usage errors, before the model is loaded, in
    the command line's words; then the library's own check of the same options."""
    data, bits = args.calibration, getattr(args, "activation_bits", 8)
    if args.bias_correction == "empirical" and not data:
        raise CliError("--bias-correction empirical needs --calibration; received no "
                       "--calibration", EXIT_USAGE)
    if bits == 16 and not args.per_channel:
        raise CliError("--activation-bits 16 (TF Lite's 16x8 mode) quantizes weights per "
                       "channel; received --per-tensor", EXIT_USAGE)
    if getattr(args, "tune", False) and (bits != 8 or args.ranges == "minmax"):
        raise CliError("--tune chooses among 8-bit activation ranges measured on the "
                       f"calibration data; received --activation-bits {bits} --ranges "
                       f"{args.ranges}", EXIT_USAGE)
    _check_weight_flags(args, bits)
    if data and args.input_range:
        raise CliError(f"--input-range is for synthetic inputs (no --calibration); received "
                       f"--calibration {data}", EXIT_USAGE)
    check_calibration_options(args)
    args.options = quantize_options(args)


def _check_weight_flags(args, bits):
    """``--weight-bits`` and ``--rounding`` against the other flags (the library's checks,
    in the flags' words)."""
    from cle._quantize.options import GRID_ROUNDINGS, resolve_rounding, stage_rounds

    weight_bits, rounding = getattr(args, "weight_bits", 8), getattr(args, "rounding", "auto")
    method = resolve_rounding(rounding, weight_bits, getattr(args, "per_channel", True),
                              bool(args.calibration), getattr(args, "activation_bits", 8))
    if weight_bits == 4 and bits != 8:
        raise CliError("--weight-bits 4 goes with 8-bit activations (W4A8): TF Lite's 16x8 "
                       f"mode has 8-bit weights; received --activation-bits {bits}", EXIT_USAGE)
    if method == "tapsum" and weight_bits != 8:
        raise CliError("--rounding tapsum puts 8-bit kernels on their grid for TF Lite's "
                       f"converter; received --weight-bits {weight_bits}", EXIT_USAGE)
    if method not in GRID_ROUNDINGS and bits == 16:
        raise CliError(f"--rounding {method} is for 8-bit activations (TF Lite's 16x8 mode is "
                       "converted in one step); received --activation-bits 16", EXIT_USAGE)
    rounds = stage_rounds(weight_bits, method)
    if rounds and args.bias_correction in ("analytic", "empirical"):
        raise CliError(f"--rounding {method} at {weight_bits} bits sets the bias of every "
                       "layer it rounds; use "
                       "--bias-correction auto, or none to leave biases as they are; received "
                       f"--bias-correction {args.bias_correction}"
                       + (f" with --weight-bits {weight_bits}" if rounding == "auto" else ""),
                       EXIT_USAGE)
    if getattr(args, "tune", False) and rounds:
        raise CliError("--tune requantizes with TF Lite's own rounding, which would undo the "
                       "rounded kernels; it takes 8-bit weights rounded to nearest; received "
                       f"--tune --weight-bits {weight_bits} --rounding {rounding}", EXIT_USAGE)


def check_calibration_options(args):
    """``--calibration``, ``--preprocessing`` and ``--limit`` together (every command that
    reads calibration data)."""
    data = getattr(args, "calibration", None)
    preprocessing, limit = getattr(args, "preprocessing", None), getattr(args, "limit", None)
    if data and not os.path.exists(data):
        raise CliError(f"--calibration {data}: no such file or folder", EXIT_USAGE)
    folder = bool(data) and os.path.isdir(data)
    if folder and not preprocessing:
        raise CliError(f"--calibration {data} is a folder of images: name its --preprocessing "
                       "(tf, torch, caffe, raw or module:function)", EXIT_USAGE)
    if data and not folder and preprocessing:
        raise CliError(f"--preprocessing is for a folder of images; --calibration {data} is a "
                       "file of inputs already preprocessed", EXIT_USAGE)
    if limit is not None and not folder:
        raise CliError("--limit is for a --calibration folder of images; received "
                       f"--calibration {data or '(none)'}", EXIT_USAGE)
    if preprocessing:
        from cle._measure.calibration import preprocessing_function

        try:
            preprocessing_function(preprocessing)
        except ValueError as exc:
            raise CliError(f"--preprocessing: {one_line(exc)}", EXIT_USAGE) from exc


def read_calibration(args, model):
    """The ``--calibration`` inputs (None without), read by the one reader of calibration
    files and checked against ``model`` (data that does not fit is a usage error)."""
    if not getattr(args, "calibration", None):
        return None
    from cle._measure.calibration import load_calibration

    try:
        return load_calibration(args.calibration, model, getattr(args, "preprocessing", None),
                                getattr(args, "limit", None))
    except ValueError as exc:
        message = one_line(exc)
        if message.startswith(f"{args.calibration} "):  # the path is said once
            raise CliError(f"--calibration {message}", EXIT_USAGE) from exc
        raise CliError(f"--calibration {args.calibration}: {message}", EXIT_USAGE) from exc


def _progress(message):
    print(f"cle: {message}", file=sys.stderr, flush=True)


def _told_by_loss(args, model):
    """``args.options`` with the output kinds the model file's loss tells
    (:func:`cle._measure.check.compiled_kinds`; the commands load a model uncompiled, so its
    loss is read from the file) under those ``--output-kind`` declares."""
    from cle._measure.check import compiled_kinds, output_names
    from cle._measure.losses import file_loss

    names = output_names(model)  # said by name: outputs of one nested model share theirs
    told = {k: kind for k, kind in compiled_kinds(model, file_loss(args.model)).items()
            if names.count(names[k]) == 1}
    if not told:
        return args.options
    declared = {names[k]: kind for k, kind in told.items()}
    declared.update(args.options.output_kinds or {})
    return dataclasses.replace(args.options, output_kinds=declared)


def _run(args, model, calibration, analyze=False):
    """The library's quantize (or analyze) on checked values; what the model cannot do is a
    usage error in the command line's words."""
    from cle._measure.synthetic import NeedsData
    from cle._quantize.pipeline import InputRangeUnknown, quantize_checked

    try:
        options = _told_by_loss(args, model)
        if analyze:
            from cle._quantize.analysis import analyze_checked

            return analyze_checked(model, calibration, options, args.layer_inputs, _progress)
        return quantize_checked(model, calibration, options, _progress)
    except InputRangeUnknown as exc:
        raise CliError(f"{args.model}: cannot tell the input range of model "
                       f"'{exc.model_name}' ({exc.why()}); pass --input-range=LOW,HIGH, "
                       "--preprocessing NAME or --calibration PATH", EXIT_USAGE) from exc
    except NeedsData as exc:
        raise CliError(f"{args.model}: {exc.why}; pass --calibration PATH", EXIT_USAGE) from exc
    except ValueError as exc:  # what the model cannot do (no BN without data, ...)
        raise CliError(f"{args.model}: {one_line(exc)}", EXIT_USAGE) from exc


def _traced(args, model):
    """``(model, note)``: for a subclassed model given with ``--calibration`` of one ``.npy``
    array, or without ``--calibration`` built for one input, the Functional model of its
    layers its ``call()`` traces to (:func:`cle._core.traced.functional_for`) and the note
    that says so (on stderr now, in the report later); any other model as it is, and None (a
    subclassed one is then refused, in one line, by :func:`check_graph`)."""
    from cle._core.graph import inner_function

    path = getattr(args, "calibration", None)
    if inner_function(model) is not None or path and not str(path).endswith(".npy"):
        return model, None
    import numpy as np

    from cle._core.traced import functional_for

    try:
        model, note = functional_for(model, np.load(path, allow_pickle=False) if path else None)
    except ValueError as exc:
        if not path:
            return model, None  # nothing to trace it with: check_graph's refusal
        raise CliError(f"{args.model}: {one_line(exc, limit=600)}", EXIT_USAGE) from exc
    print(f"cle: note: {note}", file=sys.stderr, flush=True)
    return model, note


def _runnable(args, model, command):
    """``(model, note)``: the model to run (a subclassed one traced, :func:`_traced`), checked
    for what the command needs, and the trace's note (None)."""
    model, note = _traced(args, model)
    check_graph(args.model, model)
    from cle._core.backend import channels_first_problem

    problem = channels_first_problem(model)
    if problem is not None:
        raise CliError(f"{args.model}: {command} runs the model, but {problem}")
    return model, note


def cmd_quantize(args) -> int:
    with Session(args) as session:
        model, note = _runnable(args, session.load(), "cle quantize")
        content, report = _run(args, model, read_calibration(args, model))
        if note:  # the model quantized is the trace: the report says so first, as the API's
            report.warnings.insert(0, note)
        outputs = [(args.output, content)]
        compiled = os.path.splitext(args.output)[0] + "_vela.tflite"  # Vela's naming
        if report.compiled is not None:
            outputs.append((compiled, report.compiled))
        # Vela failed: a compiled model there is an earlier run's, of another file
        stale = report.target.get("compiled") is False and os.path.exists(compiled)
        if args.report:
            outputs.append((args.report, json_bytes(report.to_dict())))
        write_outputs(outputs)
        if stale:
            os.remove(compiled)
    print(f"{args.model}: cle quantize")
    for line in report.summary().splitlines():
        print("  " + line)
    for path, _ in outputs:
        print(f"wrote {path}")
    failures = report.target.get("failures", [])
    for failure in failures:
        print(f"cle: error: {args.output} was written, but on target "
              f"{report.target['name']}: {failure}", file=sys.stderr, flush=True)
    if stale:
        print(f"cle: removed {compiled}: an earlier run compiled it, and Vela did not compile "
              "this one", file=sys.stderr, flush=True)
    return EXIT_TARGET if failures else EXIT_OK


def cmd_analyze(args) -> int:
    with Session(args) as session:
        model, note = _runnable(args, session.load(), "cle analyze")
        report = _run(args, model, read_calibration(args, model), analyze=True)
        if note:
            report.notes.insert(0, note)
        outputs = []
        if args.report:
            outputs.append((args.report, json_bytes(report.to_dict())))
        if args.plot:
            from cle._quantize.analysis_plot import render

            outputs.append((args.plot, render(report, args.worst,
                                              f"{os.path.basename(args.model)}: where the "
                                              "INT8 error comes from, layer by layer")))
        if outputs:
            write_outputs(outputs)
    print(f"{args.model}: cle analyze")
    for line in report.summary(args.worst).splitlines():
        print("  " + line)
    for path, _ in outputs:
        print(f"wrote {path}")
    return EXIT_OK
