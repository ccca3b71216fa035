"""Writes the generated blocks of docs/targets.md:

- ``targets-table``: ``cle targets`` (without the column saying what is installed here), read
  from :data:`cle._tflite.targets.TARGETS`, so the page cannot disagree with the table the
  pipeline reads (tests/test_docs.py checks it is up to date);
- ``targets-example``: ``cle quantize --target ethos-u55-128`` and ``--target tflm
  --weight-bits 4`` on the tiny CNN of docs/cli.md with 40 seeded inputs: what the
  report says of the file on the microcontroller and on the NPU (measured: TF Lite Micro's
  and Vela's figures of this machine's run).

Run: ``python scripts/gen_targets_docs.py`` (``make results`` runs it with the others).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DOC = os.path.join(REPO, "docs", "targets.md")
sys.path.insert(0, HERE)

from _docblocks import publish  # noqa: E402


def table() -> str:
    from cle._cli.commands import targets_table

    return "```console\n$ cle targets\n" + "\n".join(targets_table(installed=False)) + "\n```"


def example() -> str:
    import numpy as np

    from cle import cli
    from gen_cli_docs import tiny_cnn

    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_cnn()
        model.save(os.path.join(tmp, "tiny.keras"))
        shape = (40,) + tuple(model.inputs[0].shape[1:])
        np.save(os.path.join(tmp, "x.npy"),
                np.random.default_rng(0).uniform(-1, 1, shape).astype("float32"))
        for flags in (["--target", "ethos-u55-128"],
                      ["--target", "tflm", "--weight-bits", "4"]):
            command = ["quantize", "tiny.keras", "-o", "tiny_int8.tflite", "--calibration",
                       "x.npy"] + flags
            out = io.StringIO()
            cwd = os.getcwd()
            os.chdir(tmp)
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                    cli.main(command)
            finally:
                os.chdir(cwd)
            keep = [line for line in out.getvalue().splitlines()
                    if not line.startswith("  equalize:")]
            lines += ["$ cle " + " ".join(command)] + keep + [""]
    return "```console\n" + "\n".join(lines).rstrip() + "\n```"


def generate(measured=True) -> dict[str, str]:
    out = {"targets-table": table()}
    if measured:
        out["targets-example"] = example()
    return out


def main():
    publish([(DOC, name, text) for name, text in generate().items()], root=REPO)


if __name__ == "__main__":
    main()
