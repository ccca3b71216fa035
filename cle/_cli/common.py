"""What the ``cle`` command's parts share (:mod:`cle.cli`, :mod:`cle._cli.commands`): exit
codes and :class:`CliError`, one-line error text, tables, the checks of input and output paths,
custom objects, loading a model with one-line errors, and writing the outputs atomically.
Standard library only at import, like :mod:`cle.cli`."""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import json
import os
import re
import shutil
import sys
import textwrap
import zipfile

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
#: ``cle quantize --target``: the file is written, but the target's runtime refused it or its
#: compiler stopped.
EXIT_TARGET = 3

_MODEL_SUFFIXES = (".keras", ".h5", ".hdf5")
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_module_counter = itertools.count()


class CliError(Exception):
    """An error reported as one line on stderr, with an exit code (2: usage, 1: other)."""

    def __init__(self, message: str, code: int = EXIT_FAILURE):
        super().__init__(message)
        self.message = message
        self.code = code


def one_line(exc: BaseException, limit: int = 400) -> str:
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


def check_model_file(path: str):
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


def check_output_path(path: str, option: str = "-o", tflite: bool = False):
    suffix = os.path.splitext(path)[1].lower()
    if tflite and suffix != ".tflite":
        raise CliError(f"{option} {path}: the output file name must end in .tflite", EXIT_USAGE)
    if not tflite and suffix not in _MODEL_SUFFIXES:
        raise CliError(
            f"{option} {path}: the output file name must end in .keras (or .h5)", EXIT_USAGE
        )
    check_parent_dir(path, option)


def check_parent_dir(path: str, option: str):
    """An output path a file can be written at, checked before any work (by creating and
    removing a temporary file next to it)."""
    from cle._core.files import unwritable_reason

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
            f"{option}: importing it failed: {type(exc).__name__}: {one_line(exc)}"
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
    check_model_file(path)
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
        raise CliError(f"cannot load {path}: {one_line(exc)}") from exc


class Session:
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


def check_graph(path, model):
    """One line for a model whose graph cle cannot read (subclassed model, unbuilt Sequential,
    not a keras.Model): the ValueError/TypeError of the graph view. Errors raised later by
    the transforms themselves are not caught here (they would be bugs, shown with the
    CLE_DEBUG hint)."""
    from cle._core.graph import graph_view

    try:
        graph_view(model)
    except (ValueError, TypeError) as exc:
        raise CliError(f"{path}: {one_line(exc, limit=600)}") from exc


def model_bytes(model, path):
    """The bytes of ``model`` saved as ``path`` would be: Keras writes into a private temporary
    directory, so nothing appears next to ``path`` until :func:`write_outputs`."""
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
        raise CliError(f"cannot write {path}: {one_line(exc)}") from exc


def json_bytes(data):
    """``data`` as the JSON text of a report (no ``Infinity`` or ``NaN``: strict JSON)."""
    from cle._math.json_numbers import json_safe

    return (json.dumps(json_safe(data), indent=2, allow_nan=False) + "\n").encode("utf-8")


def write_outputs(files):
    """Write every ``(path, bytes)`` atomically, all or none (:mod:`cle._core.files`): a run that
    fails leaves no new file and every old one as it was."""
    from cle._core.files import write_all_or_nothing

    try:
        write_all_or_nothing(files)
    except OSError as exc:
        raise CliError(f"cannot write {exc.filename or files[0][0]}: {exc.strerror or exc}; "
                       "nothing was written") from exc


def data_use(args):
    """The options that read --calibration, as the user would write them."""
    uses = []
    if getattr(args, "bias_correction", "none") == "empirical":
        uses.append("--bias-correction empirical")
    if getattr(args, "activation_ranges", "bn") == "calibration":
        uses.append("--activation-ranges calibration")
    return uses
