"""The implementation behind :mod:`cle.cli` (its public face, where the API is documented)."""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from cle._cli.commands import cmd_demo, cmd_equalize, cmd_fold, cmd_inspect, cmd_targets
from cle._cli.quantize import (
    check_calibration_options, check_quantize_options, cmd_analyze, cmd_quantize,
    input_range_arg, output_kind_arg,
)
from cle._cli.commands import inspect_lines  # noqa: F401  (cle.cli.inspect_lines)
from cle._cli.common import (
    EXIT_FAILURE, EXIT_USAGE, CliError, check_model_file, check_output_path, check_parent_dir,
    data_use, format_table, load_custom_objects, one_line,
)
from cle._cli.common import EXIT_OK  # noqa: F401  (cle.cli.EXIT_OK)
from cle._tflite.targets import DEFAULT_TARGET, EXTRA, TARGETS

__all__ = ["CliError", "main", "load_custom_objects", "format_table"]


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line: ``cle: error: ... (see 'cle equalize --help')``."""

    def error(self, message):
        raise CliError(f"{message} (see '{self.prog} --help')", EXIT_USAGE)


# ---------------------------------------------------------------------------- helpers


def _debug() -> bool:
    return os.environ.get("CLE_DEBUG", "").strip() not in ("", "0")


def _import_keras_quietly():
    """Import Keras (and TensorFlow) without TensorFlow's start-up lines on stderr.

    ``TF_CPP_MIN_LOG_LEVEL=3`` hides most C++ logs, but TensorFlow 2.21 still prints the absl
    preamble and the oneDNN notice while it loads, so stderr (fd 2) is sent to a temporary file
    for the import and replayed only if the import fails. Nothing to do when TensorFlow is
    already imported (e.g. by ``cle/__init__.py``).

    On another backend (JAX, PyTorch), Keras imports TensorFlow later if it is installed (its
    data adapters and TFLite conversion do), outside this window: TensorFlow is then imported
    here too, so that its lines stay off stderr whenever it loads.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if "tensorflow" in sys.modules or _debug():
        import keras  # noqa: F401
        return
    import importlib.util
    import tempfile

    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    also_tf = backend != "tensorflow" and importlib.util.find_spec("tensorflow") is not None

    sys.stderr.flush()
    with tempfile.TemporaryFile() as log:
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            import keras  # noqa: F401

            if also_tf:
                import tensorflow  # noqa: F401
        except BaseException:
            os.dup2(saved, 2)
            log.seek(0)
            sys.stderr.write(log.read().decode("utf-8", "replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _after_keras_import():
    import logging

    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    try:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:  # pragma: no cover - absl comes with TensorFlow
        pass


def _check_option_combinations(args):
    """Usage errors between options, before anything is loaded."""
    if getattr(args, "command", None) in ("quantize", "analyze"):
        return check_quantize_options(args)
    if getattr(args, "command", None) == "demo" and not args.tflite and not args.equalization:
        raise CliError("--no-tflite is for --equalization (the demo's main job is the .tflite "
                       "files); received --no-tflite without --equalization", EXIT_USAGE)
    if not hasattr(args, "bias_correction"):
        return
    uses = data_use(args)
    if uses and not args.calibration:
        raise CliError(f"{uses[0]} needs --calibration PATH; received no --calibration",
                       EXIT_USAGE)
    if args.calibration and not uses:
        raise CliError(
            f"--calibration {args.calibration} is given but nothing would read it: it is for "
            "--bias-correction empirical and/or --activation-ranges calibration; received "
            f"--bias-correction {args.bias_correction} --activation-ranges "
            f"{args.activation_ranges}", EXIT_USAGE)
    if args.activation_ranges == "calibration" and args.objective != "quantized":
        raise CliError(
            "--activation-ranges calibration is for --objective quantized (the measured "
            "ranges choose its scales); received --objective weights", EXIT_USAGE)
    if args.preprocessing and not args.calibration:
        raise CliError(f"--preprocessing is for a --calibration folder of images; received "
                       f"--preprocessing {args.preprocessing} without --calibration", EXIT_USAGE)
    check_calibration_options(args)
    _equalize_options(args)


def _equalize_options(args):
    """The library's own check of the ``equalize`` / ``inspect`` options
    (:class:`cle._transforms.options.EqualizeOptions`), so that the command line and
    :func:`cle.equalize_model` agree on every combination."""
    from cle._transforms.options import EqualizeOptions

    try:
        args.options = EqualizeOptions(
            relu6=args.relu6, high_bias_fold=args.high_bias_fold, margin=args.margin,
            bias_correction=args.bias_correction, weight_bits=args.weight_bits,
            per_channel_weights=args.per_channel, objective=args.objective,
            activation_bits=args.activation_bits, activation_ranges=args.activation_ranges,
            has_data=bool(args.calibration))
    except ValueError as exc:
        raise CliError(one_line(exc), EXIT_USAGE) from exc


# ---------------------------------------------------------------------------- parser


def _margin(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _bits(text):
    value = _positive_int(text)
    if not 2 <= value <= 16:
        raise argparse.ArgumentTypeError(f"must be between 2 and 16, got {text}")
    return value


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def _quantize_data_options(p, calibration_help):
    """The data and target options ``cle quantize`` and ``cle analyze`` share."""
    p.add_argument("--calibration", metavar="PATH", help=calibration_help)
    p.add_argument("--preprocessing", metavar="NAME",
                   help="for a folder of images: tf ([-1, 1]), torch (ImageNet mean/std), "
                        "caffe (BGR minus mean), raw (0..255) or module:function; without "
                        "--calibration it states the input range")
    p.add_argument("--input-range", type=input_range_arg, action="append",
                   metavar="[INPUT=]LOW,HIGH",
                   help="without --calibration: the input range, of every input or of the "
                        "named one (repeat it per input); write it with '=' "
                        "(--input-range=-1,1): a negative LOW would read as an option. "
                        "Default: found from the model (its preprocessing layers or its first "
                        "batch norm); refused when the model cannot tell")
    p.add_argument("--output-kind", type=output_kind_arg, action="append",
                   metavar="OUTPUT=KIND",
                   help="classes or values: what an output holds, where the model does not "
                        "show it (repeat it per output). Class scores get a top-1 agreement: "
                        "outputs ending in a softmax, a log_softmax or a sigmoid over two "
                        "entries or more, "
                        "and those declared classes (e.g. linear logits), here or by the "
                        "loss a .keras file was compiled with (a cross-entropy from logits); "
                        "the rest get their SQNR only")
    p.add_argument("--limit", type=_positive_int, metavar="N",
                   help="read at most N images from a --calibration folder")
    p.add_argument("--per-tensor", dest="per_channel", action="store_false",
                   help="per-tensor weights (default: per-channel, TF Lite's default)")
    io = p.add_mutually_exclusive_group()
    io.add_argument("--integer-io", dest="integer_io", action="store_true", default=None,
                    help="int8 model input and output (default: the target's: float32 on "
                         "litert, int8 on a microcontroller or an NPU)")
    io.add_argument("--float-io", dest="integer_io", action="store_false",
                    help="float32 model input and output, on any target (the ends quantize "
                         "and dequantize on the device's CPU)")
    p.add_argument("--bias-correction", choices=("auto", "empirical", "analytic", "none"),
                   default="auto",
                   help="auto (default): empirical with --calibration, analytic without")
    p.add_argument("--ranges", choices=("auto", "percentile", "minmax"), default="auto",
                   help="activation ranges: auto (default: each tensor's 1e-4 tails; with "
                        "--calibration the file written is the closest to the float model on "
                        "every calibration input, cross-fitted, of that build, the same with "
                        "min/max ranges (and widened ones for a value output) and the plain "
                        "conversion), percentile (the tails, always) or minmax (the "
                        "converter's own)")


def _analyze_options(p):
    """``cle analyze``'s options: ``cle quantize``'s data and target options, the analysis'
    own, --report and --plot."""
    _quantize_data_options(
        p, "calibration inputs, as for cle quantize (a quarter is held out and the analysis "
           "runs on it); without it: synthetic inputs, as cle quantize makes them (the "
           "analysis runs on its check's synthetic inputs, which the calibration never saw)")
    p.add_argument("--layer-inputs", type=_positive_int, default=4, metavar="N",
                   help="check inputs the per-layer runs use (default 4; each costs one run "
                        "of the model per layer)")
    p.add_argument("--worst", type=_positive_int, default=5, metavar="N",
                   help="how many of the worst layers to print and name in the picture "
                        "(default 5)")
    p.add_argument("--report", metavar="JSON",
                   help="write every layer's figures as JSON (AnalysisReport.to_dict())")
    p.add_argument("--plot", metavar="PNG",
                   help="write the per-layer picture (needs matplotlib)")


_EPILOG = """\
exit status: 0 success, 1 failure, 2 usage error (bad option, missing or wrong input file),
3 written, but the --target's runtime refused the file or its compiler stopped.
CLE_DEBUG=1 prints tracebacks. Documentation: docs/cli.md."""


def build_parser() -> argparse.ArgumentParser:
    from cle import __version__
    from cle._cli.demo import ANALYSIS_PNG, DEFAULT_IMAGES, DEFAULT_OUT_DIR
    from cle._cli.demo_equalization import PNG_NAME

    parser = _Parser(
        prog="cle",
        description="Data-free INT8 quantization preparation for Keras 3 CNNs (Nagel et al. "
                    "2019):\nbatch-norm folding, cross-layer equalization, optional high-bias "
                    "folding and bias correction.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"cle {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def model_args(p):
        p.add_argument("model", metavar="IN", help="input model (.keras, or legacy .h5)")
        p.add_argument("--custom-objects", metavar="MODULE.py",
                       help="Python file whose Keras layers/models/functions are registered "
                            "as custom objects for loading (and saving)")
        p.add_argument("--unsafe-deserialization", action="store_true",
                       help="load a model whose Lambda layers (or other objects) Keras loads "
                            "only with safe_mode=False, which runs the Python code stored in "
                            "the file: only for files you trust")

    def output_args(p):
        p.add_argument("-o", "--output", required=True, metavar="OUT",
                       help="output model (.keras or .h5); written atomically (the old file "
                            "stays intact if the run is interrupted)")
        p.add_argument("--overwrite", action="store_true",
                       help="allow OUT to be the input model itself (refused otherwise)")

    def cle_options(p):
        p.add_argument("--relu6", choices=("bound", "replace", "keep"), default="bound",
                       help="bound (default): scale across ReLU6 exactly with per-channel "
                            "ClippedReLU caps; replace: ReLU6 -> ReLU first (changes the "
                            "output); keep: a ReLU6 ends a scaling set")
        p.add_argument("--high-bias-fold", choices=("none", "unpadded", "all"),
                       default="none",
                       help="none (default; measured best for INT8 on MobileNetV2): skip; "
                            "unpadded: absorb biases only into layers that see no zero "
                            "padding; all: textbook, every layer")
        p.add_argument("--margin", type=_margin, default=3.0,
                       help="high-bias folding margin in standard deviations (default 3.0)")
        p.add_argument("--objective", choices=("quantized", "weights"), default="quantized",
                       help="quantized (default): choose scales that lower the modelled INT8 "
                            "noise of weights and activations for the target quantizer, and "
                            "leave a set whose noise would not drop by 2 dB; weights: equalize "
                            "weight ranges only (Nagel / AIMET)")
        p.add_argument("--per-tensor", dest="per_channel", action="store_false",
                       help="target INT8 per-tensor weights (default: per-channel, TFLite's "
                            "default); scaling and bias correction are chosen for the target")
        p.add_argument("--weight-bits", type=_bits, default=8, metavar="N",
                       help="target weight bits (default 8)")
        p.add_argument("--activation-bits", type=_bits, default=8, metavar="N",
                       help="target activation bits (default 8)")
        p.add_argument("--bias-correction", choices=("none", "analytic", "empirical"),
                       default="none",
                       help="finish with bias correction for the target weights: analytic "
                            "(data-free, from the folded BN statistics) or empirical (needs "
                            "--calibration)")
        p.add_argument("--activation-ranges", choices=("bn", "calibration"), default="bn",
                       help="activation statistics for --objective quantized: bn (default, "
                            "data-free, from the folded BNs) or calibration (measured on "
                            "--calibration)")
        p.add_argument("--calibration", metavar="PATH",
                       help="calibration inputs for --bias-correction empirical and "
                            "--activation-ranges calibration: a .npy/.npz of inputs "
                            "preprocessed as the model expects (.npz: one array per input "
                            "name), or a folder of images with --preprocessing")
        p.add_argument("--preprocessing", metavar="NAME",
                       help="for a --calibration folder of images: tf ([-1, 1]), torch "
                            "(ImageNet mean/std), caffe (BGR minus mean), raw (0..255) or "
                            "module:function")
        p.add_argument("--limit", type=_positive_int, metavar="N",
                       help="read at most N images from a --calibration folder")

    p = sub.add_parser("fold", help="fold every foldable BatchNormalization",
                       description="Fold every BatchNormalization that can be folded exactly "
                                   "and save the new model.", epilog=_EPILOG)
    model_args(p)
    output_args(p)
    p.add_argument("--report", metavar="JSON", help="write what was folded/skipped as JSON")
    p.set_defaults(func=cmd_fold)

    p = sub.add_parser("equalize", help="BN folding + cross-layer equalization (+ optional "
                                        "high-bias folding, bias correction)",
                       description="Run cle.equalize_model (BN folding, ReLU6 handling, "
                                   "cross-layer scaling; high-bias folding and bias correction "
                                   "if asked for) and save the new model.", epilog=_EPILOG)
    model_args(p)
    output_args(p)
    cle_options(p)
    p.add_argument("--report", metavar="JSON",
                   help="write the full report (EqualizationReport.to_dict()) as JSON")
    p.set_defaults(func=cmd_equalize)

    p = sub.add_parser("quantize", help="a full-integer .tflite (INT8 or INT4 weights), "
                                        "checked against the float model",
                       description="Run cle.quantize: BN folding, cross-layer scaling for the "
                                   "target, bias correction, the kernels rounded for their "
                                   "outputs (--rounding), activation ranges from "
                                   "--calibration (or, without it, from synthetic inputs "
                                   "distilled from the model's batch-norm statistics), TF "
                                   "Lite's converter, and a check of the .tflite against the "
                                   "float model on inputs it was not calibrated on.",
                       epilog=_EPILOG)
    model_args(p)
    p.add_argument("-o", "--output", required=True, metavar="OUT.tflite",
                   help="output TF Lite model; written atomically")
    p.add_argument("--overwrite", action="store_true",
                   help="allow OUT to be the input model itself (refused otherwise)")
    _quantize_data_options(
        p, "calibration inputs: a .npy/.npz of inputs preprocessed as the model expects "
           "(.npz: one array per input name), or a folder of images (with --preprocessing); "
           "a quarter is held out for the check. Without it: no data (the input range is "
           "found from the model, synthetic inputs are distilled from its batch norms)")
    p.add_argument("--weight-bits", type=int, choices=(4, 8), default=8,
                   help="8 (default) or 4: INT4 weights (W4A8) for Conv1D/2D, "
                        "DepthwiseConv1D/2D, SeparableConv1D/2D and Dense layers, stored packed "
                        "in the .tflite where LiteRT runs them")
    p.add_argument("--rounding", choices=("auto", "nearest", "tapsum", "gptq", "adaround"),
                   default="auto",
                   help="how kernels are rounded onto their grid: nearest (TF Lite's way), "
                        "tapsum (8 bits: to nearest, each channel pair's sum over the taps "
                        "kept), "
                        "gptq (layer by layer for the layer's output, on --calibration or the "
                        "synthetic inputs), adaround (the same aim, learned; slower); auto "
                        "(default): at 4 bits adaround with --calibration, gptq without; "
                        "at 8, tapsum with --per-tensor or without --calibration, else "
                        "nearest")
    p.add_argument("--activation-bits", type=int, choices=(8, 16), default=8,
                   help="8 (default) or 16 (TF Lite's 16x8 mode)")
    p.add_argument("--compare", action="store_true",
                   help="also convert the float model straight and check it the same way "
                        "(one more conversion)")
    p.add_argument("--tune", action="store_true",
                   help="choose the ranges of the activation tensors that add most to the "
                        "output's error among their 1e-4 tails, min/max, least-MSE and "
                        "narrower tails, where that measures better on inputs the check does "
                        "not use (half of the held-out ones; without --calibration the "
                        "synthetic calibration inputs); one-input, one-output models; see "
                        "docs/analyze.md")
    p.add_argument("--target", choices=tuple(TARGETS), default=DEFAULT_TARGET, metavar="NAME",
                   help="where the file will run (cle targets lists them): litert (default), "
                        "tflm (TF Lite Micro: run in its interpreter, arena and flash bytes "
                        "reported), or an Ethos-U NPU such as ethos-u55-128 (compiled by Vela "
                        "into OUT_vela.tflite, its figures reported); tflm and ethos-u need "
                        f"pip install {EXTRA}")
    p.add_argument("--report", metavar="JSON", help="write the QuantizeReport as JSON")
    p.set_defaults(func=cmd_quantize)

    p = sub.add_parser("analyze", help="where the INT8 error comes from, layer by layer",
                       description="Build the .tflite `cle quantize` writes with the same "
                                   "options and measure, for every layer of the model: its "
                                   "output's SQNR in the INT8 model, with its weights alone "
                                   "and its activations alone quantized, its output's range "
                                   "and how it was chosen, and its share of the output's "
                                   "error. Prints the worst layers with the reason.",
                       epilog=_EPILOG)
    model_args(p)
    _analyze_options(p)
    p.set_defaults(func=cmd_analyze)

    p = sub.add_parser("targets", help="the targets cle quantize --target makes files for",
                       description="List every target of cle quantize --target: the runtime "
                                   "that checks the file, its default input/output, which "
                                   "operators take INT4 weights, and what it needs installed.",
                       epilog=_EPILOG)
    p.set_defaults(func=cmd_targets)

    p = sub.add_parser("inspect", help="show what equalize would fold, scale and absorb",
                       description="Show, without writing anything, what `cle equalize` with "
                                   "the same options would do: BN folds and skips, scaling "
                                   "sets, chain ends, ReLU6 changes, high-bias decisions, "
                                   "each with its reason.", epilog=_EPILOG)
    model_args(p)
    cle_options(p)
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser(
        "demo", help="cle quantize against TF Lite's converter on the real MobileNetV2",
        description="Quantize the real ImageNet MobileNetV2 to INT8 three ways: the float model "
                    "straight into TF Lite's converter, cle quantize with photos, cle quantize "
                    "without data; judge the three on other photos, then show with cle analyze "
                    "where the remaining error comes from. Writes the model, the photos, the "
                    f"three .tflite files and {ANALYSIS_PNG} into --out DIR. --equalization "
                    "runs the earlier demo instead: INT8 before and after weight-range "
                    f"equalization, with the per-channel range figure {PNG_NAME}.",
        epilog=_EPILOG)
    p.add_argument("--images", type=_positive_int, default=DEFAULT_IMAGES, metavar="N",
                   help="number of photo crops to judge on (default: %(default)s)")
    p.add_argument("--out", metavar="DIR", default=DEFAULT_OUT_DIR,
                   help="directory for the demo's files, created if missing (default: "
                        "%(default)s/ in the current directory)")
    p.add_argument("--equalization", action="store_true",
                   help="the equalization demo: INT8 before and after weight-range "
                        f"equalization, and {PNG_NAME}")
    p.add_argument("--no-tflite", dest="tflite", action="store_false",
                   help="with --equalization: skip the TFLite int8 conversions (weight-only "
                        "rows only)")
    p.set_defaults(func=cmd_demo)
    return parser


# ---------------------------------------------------------------------------- main


def _check_not_input(args):
    """Refuse to write over the input model (the user's only copy) without --overwrite, and
    never let two outputs of one command name the same file."""
    from cle._core.files import same_file

    model, output, report = (getattr(args, k, None) for k in ("model", "output", "report"))
    if model and output and same_file(model, output) and not getattr(args, "overwrite", False):
        raise CliError(
            f"-o {output} is the input model: writing it would replace the original; choose "
            "another output file, or pass --overwrite to replace it on purpose",
            EXIT_USAGE,
        )
    if model and report and same_file(model, report):
        raise CliError(f"--report {report} is the input model; choose another file name",
                       EXIT_USAGE)
    if output and report and same_file(output, report):
        raise CliError(f"--report {report} is also the output model (-o); choose another "
                       "file name", EXIT_USAGE)


def _precheck(args):
    if getattr(args, "model", None) is not None:
        check_model_file(args.model)
    if getattr(args, "output", None) is not None:
        check_output_path(args.output, tflite=args.command == "quantize")
    if getattr(args, "report", None):
        check_parent_dir(args.report, "--report")
    if getattr(args, "plot", None):
        _check_plot(args)
    _check_not_input(args)
    _check_option_combinations(args)
    path = getattr(args, "custom_objects", None)
    if path is not None:
        if not os.path.isfile(path):
            raise CliError(f"--custom-objects {path}: no such file", EXIT_USAGE)
        if not path.endswith(".py"):
            raise CliError(f"--custom-objects {path}: expected a Python file (.py)",
                           EXIT_USAGE)
    out = getattr(args, "out", None)
    if out is not None and os.path.exists(out) and not os.path.isdir(out):
        raise CliError(f"--out {out}: not a directory", EXIT_USAGE)


def _check_plot(args):
    """--plot: a .png path cle can write, not another output or the model, and matplotlib."""
    import importlib.util

    from cle._core.files import same_file

    if not args.plot.lower().endswith(".png"):
        raise CliError(f"--plot {args.plot}: the picture's file name must end in .png",
                       EXIT_USAGE)
    check_parent_dir(args.plot, "--plot")
    for option, other in (("IN", args.model), ("--report", getattr(args, "report", None))):
        if other and same_file(args.plot, other):
            raise CliError(f"--plot {args.plot} is also {option}; choose another file name",
                           EXIT_USAGE)
    if importlib.util.find_spec("matplotlib") is None:
        raise CliError(f"--plot {args.plot} needs matplotlib: pip install matplotlib",
                       EXIT_USAGE)


def _error(message: str):
    print(f"cle: error: {message}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    """Run the ``cle`` command line; returns the exit status."""
    debug = _debug()
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        _precheck(args)  # usage errors first, before the slow Keras import
        _import_keras_quietly()
        _after_keras_import()
        return args.func(args)
    except SystemExit as exc:  # --help / --version
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except CliError as exc:
        if debug:
            traceback.print_exc()
        _error(exc.message)
        return exc.code
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    except Exception as exc:
        if debug:
            traceback.print_exc()
        _error(f"{type(exc).__name__}: {one_line(exc)} (set CLE_DEBUG=1 for the traceback)")
        return EXIT_FAILURE
