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
(:mod:`cle._core.files`).

This module holds the parser, the checks of the command line and :func:`main`; the commands
are in :mod:`cle._cli.commands`, what both share in :mod:`cle._cli.common`.
"""

from cle._cli.main import (  # noqa: F401
    CliError,
    main,
    load_custom_objects,
    format_table,
    build_parser,
    inspect_lines,
    EXIT_OK,
)

__all__ = [
    "CliError",
    "main",
    "load_custom_objects",
    "format_table",
]
