"""Writes the generated blocks of docs/cli.md that show the command line at work:

- ``cli-help``: ``cle --help``;
- ``cli-session``: ``cle fold``, ``cle equalize`` and ``cle inspect`` on a tiny CNN;
- ``cli-report``: the JSON report ``cle equalize --report`` wrote in that session.

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

from _docblocks import replace_block  # noqa: E402

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
                report = f.read()
        finally:
            os.chdir(cwd)
    fence = "```"
    return {
        "cli-help": f"{fence}\n$ cle --help\n{help_text}{fence}",
        "cli-session": f"{fence}\n" + "\n".join(session) + fence,
        "cli-report": f"{fence}json\n{report}{fence}",
    }


def _run_help():
    from cle import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli.main(["--help"])
    return out.getvalue()


def main():
    for name, text in generate().items():
        changed = replace_block(DOC, name, text)
        print(f"{os.path.relpath(DOC, REPO)}: {name} {'updated' if changed else 'unchanged'}")


if __name__ == "__main__":
    main()
