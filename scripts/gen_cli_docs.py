"""Writes the generated blocks of docs/cli.md that show the command line at work:

- ``cli-synopsis``: every command with its arguments and options, read from the parser
  (:func:`synopsis`), so that the page's synopsis cannot leave a command or a flag out;
  ``cli-usage-quantize`` and ``cli-usage-analyze``: the same lines of one command, at the top of
  its section;
- ``cli-help``: ``cle --help``;
- ``cli-session``: ``cle fold``, ``cle equalize`` and ``cle inspect`` on a tiny CNN;
- ``cli-report``: the JSON report ``cle equalize --report`` wrote in that session;
- ``cli-outcomes``: the inputs-and-outcomes table, one row per :data:`OUTCOME_CASES` entry
  (the bad-input matrix tests/test_inputs_outcomes.py checks: one line, no traceback, no
  leftover file).

Everything runs in-process on a tiny model whose weights come from a seeded numpy generator,
so the text is the same on every machine and backend, and takes a few seconds: the test suite
checks that the blocks are up to date (tests/test_docs.py). Run: ``python
scripts/gen_cli_docs.py`` (``make results`` runs it with the other generators).
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from _docblocks import publish  # noqa: E402

DOC = os.path.join(REPO, "docs", "cli.md")
WIDTH = "100"  # the terminal width the tables are fitted to
SESSION = [
    "cle fold tiny.keras -o tiny_folded.keras --report fold.json",
    "cle equalize tiny.keras -o tiny_cle.keras --report cle.json",
    "cle inspect tiny.keras",
]


def tiny_cnn():
    """BN on the input, conv -> BN -> ReLU6 -> depthwise -> BN -> ReLU6 -> conv -> BN, global
    pooling, a softmax Dense; every weight and BN statistic from ``default_rng(0)``."""
    import keras
    import numpy as np

    L = keras.layers
    inp = keras.Input((16, 16, 3), name="image")
    x = L.BatchNormalization(name="input_bn")(inp)
    x = L.Conv2D(8, 3, padding="same", name="stem_conv")(x)
    x = L.BatchNormalization(name="stem_bn")(x)
    x = L.ReLU(6.0, name="stem_relu6")(x)
    x = L.DepthwiseConv2D(3, padding="valid", name="stem_depthwise")(x)
    x = L.BatchNormalization(name="stem_depthwise_bn")(x)
    x = L.ReLU(6.0, name="stem_depthwise_relu6")(x)
    x = L.Conv2D(8, 1, name="stem_project")(x)
    x = L.BatchNormalization(name="stem_project_bn")(x)
    x = L.GlobalAveragePooling2D(name="pool")(x)
    out = L.Dense(5, activation="softmax", name="predictions")(x)
    model = keras.Model(inp, out, name="tiny_cnn")
    rng = np.random.default_rng(0)
    for layer in model.layers:
        if isinstance(layer, L.BatchNormalization):
            c = layer.moving_mean.shape[0]
            layer.set_weights([rng.uniform(0.5, 1.5, c), rng.normal(0.0, 1.0, c),
                               rng.normal(0.0, 0.5, c), rng.uniform(0.5, 2.0, c)])
        elif layer.weights:
            layer.set_weights([rng.normal(0.0, 0.3, w.shape).astype("float32")
                               for w in layer.get_weights()])
    return model


def _lambda_cnn():
    """tiny_cnn with a Lambda layer after the project BN (Keras loads it only unsafely)."""
    import keras

    base = tiny_cnn()
    x = base.get_layer("stem_project_bn").output
    x = keras.layers.Lambda(lambda t: t * 0.5, name="halve")(x)
    x = base.get_layer("pool")(x)
    return keras.Model(base.inputs, base.get_layer("predictions")(x), name="lambda_cnn")


def _late_bn_cnn():
    """conv -> ReLU -> conv -> BN: nothing before its first batch norm is linear, and it has no
    preprocessing layer, so it cannot tell its input range."""
    import keras

    L = keras.layers
    inp = keras.Input((16, 16, 3), name="image")
    x = L.Conv2D(4, 3, activation="relu", name="c1")(inp)
    x = L.BatchNormalization(name="bn")(L.Conv2D(4, 3, name="c2")(x))
    out = L.Dense(3, activation="softmax", name="scores")(L.GlobalAveragePooling2D(name="pool")(x))
    return keras.Model(inp, out, name="late_bn_cnn")


def _box_cnn():
    """conv -> BN -> ReLU -> dense of 4 linear values (a box): a regression head, whose range
    synthetic inputs cannot tell."""
    import keras

    L = keras.layers
    inp = keras.Input((16, 16, 3), name="image")
    x = L.ReLU(name="relu")(L.BatchNormalization(name="bn")(L.Conv2D(4, 3, name="c1")(inp)))
    out = L.Dense(4, name="box")(L.GlobalAveragePooling2D(name="pool")(x))
    return keras.Model(inp, out, name="box_cnn")


def _signal_cnn():
    """Conv1D -> BN -> ReLU -> softmax over 4 classes of a 1-D signal: without data, an input
    that is not an image."""
    import keras

    L = keras.layers
    inp = keras.Input((64, 1), name="signal")
    x = L.ReLU(name="relu")(L.BatchNormalization(name="bn")(L.Conv1D(4, 3, name="c1")(inp)))
    out = L.Dense(4, activation="softmax", name="scores")(L.GlobalAveragePooling1D(name="pool")(x))
    return keras.Model(inp, out, name="signal_cnn")


def _no_bn_cnn():
    """conv -> dense, no batch norm: nothing to distill synthetic inputs from."""
    import keras

    L = keras.layers
    inp = keras.Input((16, 16, 3), name="image")
    x = L.Conv2D(4, 3, activation="relu", name="c1")(inp)
    out = L.Dense(3, name="logits")(L.GlobalAveragePooling2D(name="pool")(x))
    return keras.Model(inp, out, name="no_bn_cnn")


def _setup_files(names):
    """Create the input files a case needs, in the current directory."""
    import numpy as np

    for name in names:
        if name == "tiny.keras":
            tiny_cnn().save(name)
        elif name == "lambda.keras":
            _lambda_cnn().save(name)
        elif name == "late.keras":
            _late_bn_cnn().save(name)
        elif name == "nobn.keras":
            _no_bn_cnn().save(name)
        elif name == "box.keras":
            _box_cnn().save(name)
        elif name == "signal.keras":
            _signal_cnn().save(name)
        elif name == "bad.npy":
            np.save(name, np.zeros((4, 16, 16, 1), "float32"))
        elif name == "notes.keras":
            with open(name, "w") as f:
                f.write("not a model\n")
        elif name == "calib.npy":
            np.save(name, np.zeros((4, 16, 16, 3), "float32"))
        elif name == "objects.npy":
            np.save(name, np.array([{"a": 1}], dtype=object), allow_pickle=True)
        elif name.endswith("/"):
            os.mkdir(name.rstrip("/"))
        else:
            raise ValueError(f"unknown setup file {name!r}")


# The inputs-and-outcomes table of docs/cli.md (block cli-outcomes), and the bad-input matrix
# of tests/test_inputs_outcomes.py: (situation, files to create first, command).
OUTCOME_CASES = [
    ("input missing", [], "cle fold missing.keras -o out.keras"),
    ("input is not a model file", ["notes.keras"], "cle fold notes.keras -o out.keras"),
    ("output name without .keras/.h5", ["tiny.keras"], "cle fold tiny.keras -o out.txt"),
    ("output directory missing", ["tiny.keras"], "cle fold tiny.keras -o nodir/out.keras"),
    ("output path is a directory", ["tiny.keras", "taken.keras/"],
     "cle fold tiny.keras -o taken.keras"),
    ("`-o` is the input", ["tiny.keras"], "cle equalize tiny.keras -o tiny.keras"),
    ("`--report` is the input", ["tiny.keras"],
     "cle fold tiny.keras -o out.keras --report tiny.keras"),
    ("`--report` is a directory", ["tiny.keras", "reports/"],
     "cle fold tiny.keras -o out.keras --report reports"),
    ("bad option value", ["tiny.keras"], "cle equalize tiny.keras -o out.keras --relu6 clip"),
    ("`--calibration` that nothing reads", ["tiny.keras", "calib.npy"],
     "cle equalize tiny.keras -o out.keras --calibration calib.npy"),
    ("empirical bias correction without data", ["tiny.keras"],
     "cle equalize tiny.keras -o out.keras --bias-correction empirical"),
    ("calibrated ranges with `--objective weights`", ["tiny.keras", "calib.npy"],
     "cle inspect tiny.keras --activation-ranges calibration --calibration calib.npy "
     "--objective weights"),
    ("calibration file missing", ["tiny.keras"],
     "cle equalize tiny.keras -o out.keras --bias-correction empirical --calibration nope.npy"),
    ("calibration file of Python objects", ["tiny.keras", "objects.npy"],
     "cle equalize tiny.keras -o out.keras --bias-correction empirical --calibration "
     "objects.npy"),
    ("calibration data that does not fit the model", ["tiny.keras", "bad.npy"],
     "cle equalize tiny.keras -o out.keras --bias-correction empirical --calibration bad.npy"),
    ("a preprocessing that contradicts `--input-range`", ["tiny.keras"],
     "cle quantize tiny.keras -o out.tflite --preprocessing tf --input-range=0,1"),
    ("no data, and the model cannot tell its input range", ["late.keras"],
     "cle quantize late.keras -o out.tflite"),
    ("no data, and no batch norm to distill inputs from", ["nobn.keras"],
     "cle quantize nobn.keras -o out.tflite --input-range=0,1"),
    ("no data, and a regression output", ["box.keras"],
     "cle quantize box.keras -o out.tflite --input-range=0,1"),
    ("no data, and an input that is not an image", ["signal.keras"],
     "cle quantize signal.keras -o out.tflite --input-range=-1,1"),
    ("a `Lambda` layer, no opt-in", ["lambda.keras"], "cle fold lambda.keras -o out.keras"),
    ("a `Lambda` layer, with the opt-in", ["lambda.keras"],
     "cle fold lambda.keras -o out.keras --unsafe-deserialization"),
    ("nothing to scale", ["tiny.keras"], "cle equalize tiny.keras -o out.keras"),
]


def run_outcome_case(case, directory):
    """Run one OUTCOME_CASES entry in ``directory`` (created empty by the caller); returns
    ``(exit code, stdout, stderr, files the command left that were not there before)``."""
    from cle import cli

    _, files, command = case
    cwd = os.getcwd()
    os.chdir(directory)
    try:
        _setup_files(files)
        before = set(os.listdir("."))
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(shlex.split(command)[1:])
        new = sorted(set(os.listdir(".")) - before)
    finally:
        os.chdir(cwd)
    here = os.path.realpath(directory)
    return code, out.getvalue().replace(here, "."), err.getvalue().replace(here, "."), new


def _outcomes_table():
    rows = ["| input | command | exit | message (errors: stderr; success: the last reason "
            "line, else the last line) | new files |",
            "|---|---|---|---|---|"]
    for case in OUTCOME_CASES:
        with tempfile.TemporaryDirectory() as tmp:
            code, out, err, new = run_outcome_case(case, tmp)
        lines = (err if code else out).strip().splitlines()
        reasons = [ln.strip() for ln in lines if " ×" in ln]  # why a set or BN was left
        message = ((reasons if code == 0 and reasons else lines) or [""])[-1]
        message = message.replace("|", "\\|")
        rows.append(f"| {case[0]} | `{case[2]}` | {code} | `{message}` | "
                    f"{', '.join(new) if new else 'none'} |")
    return "\n".join(rows)


def _subparsers(parser):
    """``{command name: its parser}``, in the order ``cle --help`` lists them."""
    import argparse

    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _usage_token(action) -> str:
    """One argument as the synopsis writes it: ``IN``, ``-o OUT``, ``[--per-tensor]``,
    ``[--relu6 {bound,replace,keep}]``, ``[--input-range [INPUT=]LOW,HIGH ...]`` (repeatable)."""
    import argparse

    if not action.option_strings:
        return action.metavar or action.dest.upper()
    flag = action.option_strings[0]
    if action.nargs == 0:  # store_true / store_false / store_const
        text = flag
    else:
        value = action.metavar or (
            "{" + ",".join(str(c) for c in action.choices) + "}" if action.choices
            else action.dest.upper())
        text = f"{flag} {value}"
        if isinstance(action, argparse._AppendAction):
            text += " ..."
    return text if action.required else f"[{text}]"


def command_usage(name, parser, indent=0, width=int(WIDTH)) -> list[str]:
    """``cle NAME`` with its arguments, wrapped at ``width`` columns: the positional
    arguments first, then the required options, then the others in the parser's order
    (``-h`` left out: every command has it)."""
    import argparse

    actions = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    ordered = ([a for a in actions if not a.option_strings]
               + [a for a in actions if a.option_strings and a.required]
               + [a for a in actions if a.option_strings and not a.required])
    head = f"cle {name}".ljust(indent or len(f"cle {name}")) + " "
    lines, line = [], head
    for token in map(_usage_token, ordered):
        if line.strip() != head.strip() and len(line) + len(token) > width:
            lines.append(line.rstrip())
            line = " " * len(head)
        line += token + " "
    lines.append(line.rstrip())
    return lines


def synopsis() -> str:
    """Every ``cle`` command with its usage (:func:`command_usage`), then the global options."""
    from cle import cli

    commands = _subparsers(cli.build_parser())
    indent = max(len(f"cle {name}") for name in commands)
    lines = [ln for name, p in commands.items() for ln in command_usage(name, p, indent)]
    lines += ["cle COMMAND --help", "cle --help | --version"]
    return "```\n" + "\n".join(lines) + "\n```"


def _usage_block(name) -> str:
    from cle import cli

    return "```\n" + "\n".join(command_usage(name, _subparsers(cli.build_parser())[name])) + "\n```"


def _run(command):
    from cle import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = cli.main(shlex.split(command)[1:])
    if code != 0:
        raise RuntimeError(f"{command} failed ({code}): {out.getvalue()}")
    return out.getvalue()


def generate() -> dict[str, str]:
    """``{block name: text}`` for docs/cli.md."""
    os.environ["COLUMNS"] = WIDTH
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            help_text = _run_help()
            tiny_cnn().save("tiny.keras")
            session = []
            for command in SESSION:
                session.append(f"$ {command}\n{_run(command)}")
            with open("cle.json", encoding="utf-8") as f:
                report = _rounded_json(f.read())
        finally:
            os.chdir(cwd)
    os.environ["COLUMNS"] = WIDTH
    outcomes = _outcomes_table()
    fence = "```"
    return {
        "cli-synopsis": synopsis(),
        "cli-usage-quantize": _usage_block("quantize"),
        "cli-usage-analyze": _usage_block("analyze"),
        "cli-outcomes": outcomes,
        "cli-help": f"{fence}\n$ cle --help\n{help_text}{fence}",
        "cli-session": f"{fence}\n" + "\n".join(session) + fence,
        "cli-report": f"{fence}json\n{report}{fence}",
    }


def _rounded_json(text: str) -> str:
    """The report with every float to 6 significant digits: its last digits differ between
    CPUs (TensorFlow's kernels differ with oneDNN), and the block must be the same on each."""
    import json

    def rounded(value):
        if isinstance(value, float):
            return float(f"{value:.6g}")
        if isinstance(value, list):
            return [rounded(v) for v in value]
        if isinstance(value, dict):
            return {k: rounded(v) for k, v in value.items()}
        return value

    indent = 2 if '\n  "' in text else None
    return json.dumps(rounded(json.loads(text)), indent=indent) + "\n"


def _run_help():
    from cle import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli.main(["--help"])
    return out.getvalue()


def main():
    publish([(DOC, name, text) for name, text in generate().items()], root=REPO)


if __name__ == "__main__":
    main()
