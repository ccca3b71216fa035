"""The ``cle`` command: quantize, analyze, fold, equalize and inspect saved Keras models, and run
the demo.

::

    cle quantize IN -o OUT.tflite [options]
    cle analyze IN [options]
    cle fold IN -o OUT.keras [options]
    cle equalize IN -o OUT.keras [options]
    cle inspect IN [options]
    cle demo [options]

The options of each command: ``cle COMMAND --help``, and the synopsis of ``docs/cli.md``, which
``scripts/gen_cli_docs.py`` writes from :func:`build_parser`. Errors a person can meet print
one line on stderr and exit with 2 (usage: a bad option, a missing or wrong input file) or 1
(anything else); ``CLE_DEBUG=1`` adds the traceback. See ``docs/cli.md``.

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
