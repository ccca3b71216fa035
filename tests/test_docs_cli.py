"""Every `cle` command line the documentation shows is one the command accepts, and docs/cli.md
names every command and every option the command has.

The command lines are taken from README.md and every page of docs/: each line of a code block
that starts with ``cle`` (or ``$ cle``), and each inline code span that does. They are parsed
by the real parser (:func:`cle.cli.build_parser`), never run: parsing opens no file, so
placeholders such as ``IN.keras`` are fine. A line of a code block, and a span that names a
model file (``model.keras``), is a command line: it must parse as it is, each option spelled
out in full (argparse would also take a prefix). Anything else (``cle quantize --tune`` in a
sentence, a synopsis line with ``[...]``) is a mention: its command must exist and each option
it names must be an option of that command.
"""

import argparse
import contextlib
import glob
import io
import os
import re
import shlex

import pytest

from cle import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))
CLI_MD = os.path.join(REPO, "docs", "cli.md")

FENCE_RE = re.compile(r"^```.*?^```[ \t]*$", re.MULTILINE | re.DOTALL)
INLINE_RE = re.compile(r"`([^`]+)`")
# Tokens that stand for "something here" in a synopsis or a sentence, never a real argument.
PLACEHOLDERS = {"...", "…", "COMMAND", "|"}
MODEL_FILE_RE = re.compile(r"\.(keras|h5)$")
# Generated blocks that show refused commands on purpose, with the error each gives (the
# inputs-and-outcomes table: tests/test_inputs_outcomes.py runs those and checks each outcome).
SHOWS_ERRORS = ("cli-outcomes",)


def _parser():
    return cli.build_parser()


def _commands(parser):
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _options(parser) -> set:
    return {s for a in parser._actions for s in a.option_strings}


def command_lines(text):
    """``(where, command line)`` of every ``cle ...`` line in a Markdown text: ``where`` is
    "code" (a line of a fenced block, ``$ `` and a trailing ``# comment`` dropped, ``\\``
    continuations joined; in a console session, only the lines after a ``$ `` prompt) or "inline" (a code span, whitespace collapsed)."""
    for name in SHOWS_ERRORS:
        text = re.sub(rf"(?ms)^<!-- generated:{name} -->$.*?^<!-- /generated:{name} -->$", "",
                      text)
    found = []
    for block in FENCE_RE.finditer(text):
        lines = block.group(0).splitlines()[1:-1]
        joined, k = [], 0
        while k < len(lines):
            line = lines[k]
            while line.rstrip().endswith("\\") and k + 1 < len(lines):
                k += 1
                line = line.rstrip()[:-1] + " " + lines[k].strip()
            joined.append(line)
            k += 1
        # A block with "$ " prompts is a console session: its other lines are the output
        # (e.g. a table row named "cle quantize, 64 photos"), not commands.
        console = any(line.strip().startswith("$ ") for line in joined)
        for line in joined:
            line = line.strip()
            if line.startswith("$ "):
                line = line[2:].strip()
            elif console:
                continue
            if line == "cle" or line.startswith("cle "):
                found.append(("code", line))
    for span in INLINE_RE.finditer(FENCE_RE.sub("", text)):
        line = " ".join(span.group(1).split())
        if line.startswith("cle "):
            found.append(("inline", line))
    return found


def _tokens(line):
    try:
        return shlex.split(line, comments=True)
    except ValueError:  # an unbalanced quote in a sentence's span
        return line.split()


def _mention_problem(tokens, parser) -> str | None:
    """Why a mention (``cle quantize --tune``, a synopsis line) names a command or an option
    the command does not have, or None."""
    commands = _commands(parser)
    words = [t.strip("[]") for t in tokens[1:]]
    words = [w for w in words if w and w not in PLACEHOLDERS]
    first = tokens[1] if len(tokens) > 1 else ""
    if first in commands:
        known = _options(commands[first])
    elif first in PLACEHOLDERS:  # `cle COMMAND --help`, `cle ... --unsafe-deserialization`
        known = set().union(*(_options(p) for p in commands.values()))
    elif first.startswith("-"):
        known = _options(parser)
    else:
        return f"no command '{first}' (the commands: {', '.join(commands)})"
    for word in words:
        if word.startswith("-") and len(word) > 1:
            flag = word.split("=", 1)[0]
            if flag not in known:
                return f"'{first}' has no option {flag}"
    return None


def check_command(where, line, parser=None) -> str | None:
    """Why ``line`` is not a command ``cle`` accepts, or None (see the module docstring)."""
    parser = parser or _parser()
    tokens = _tokens(line)
    if tokens[:1] != ["cle"]:
        return "does not start with 'cle'"
    synopsis = any(t in PLACEHOLDERS or t.startswith("[") or "{" in t for t in tokens)
    if not synopsis:
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                parser.parse_args(tokens[1:])
            # argparse also takes a prefix of an option (--calib): the pages spell it out
            return _mention_problem(tokens, parser)
        except SystemExit as exc:  # --help, --version
            if exc.code in (0, None):
                return None
            error = f"exit {exc.code}: {out.getvalue().strip()}"
        except cli.CliError as exc:
            error = exc.message
        names_a_model = any(MODEL_FILE_RE.search(t) and not t.startswith("-")
                            for t in tokens[1:])
        if where == "code" or names_a_model:
            return error
    return _mention_problem(tokens, parser)


def _page_lines():
    for path in PAGES:
        with open(path, encoding="utf-8") as f:
            for where, line in command_lines(f.read()):
                yield os.path.relpath(path, REPO), where, line


@pytest.mark.parametrize("path", PAGES, ids=lambda p: os.path.relpath(p, REPO))
def test_every_command_line_shown_is_accepted(path):
    parser = _parser()
    with open(path, encoding="utf-8") as f:
        lines = command_lines(f.read())
    problems = [f"{os.path.relpath(path, REPO)} ({where}): {line}\n    -> {why}"
                for where, line in lines
                for why in [check_command(where, line, parser)] if why]
    assert not problems, "command lines the cle parser refuses:\n" + "\n".join(problems)


def test_the_pages_show_command_lines():
    """The four pages that must tell one story show full command lines (not only mentions)."""
    seen = {}
    for page, where, line in _page_lines():
        if any(MODEL_FILE_RE.search(t) for t in _tokens(line)):
            seen.setdefault(page, []).append(line)
    for page in ("README.md", "docs/index.md", "docs/quantize_int8.md", "docs/cli.md"):
        assert seen.get(page), f"{page} shows no cle command line on a model file"


@pytest.mark.parametrize("where, line, expected", [
    ("code", "cle quantize m.keras -o m.tflite --no-such-flag", "unrecognized arguments"),
    ("code", "cle quantize m.keras -o m.tflite --ranges widest", "invalid choice"),
    ("code", "cle quantize m.keras", "required"),
    ("code", "cle frobnicate m.keras", "invalid choice"),
    ("inline", "cle equalize m.keras -o e.keras --relu6 clip", "invalid choice"),
    ("inline", "cle equalize --no-such-flag", "has no option --no-such-flag"),
    ("inline", "cle frobnicate --tune", "no command 'frobnicate'"),
    ("code", "cle quantize m.keras -o m.tflite --calib c.npy", "has no option --calib"),
    ("code", "cle inspect IN.keras [--overwrite]", "has no option --overwrite"),
])
def test_the_check_refuses_a_wrong_command(where, line, expected):
    assert expected in (check_command(where, line) or "")


@pytest.mark.parametrize("where, line", [
    ("code", "cle quantize model.keras -o model_nodata.tflite  # no data"),
    ("code", "cle --help"),
    ("code", "cle demo"),
    ("inline", "cle quantize --tune"),
    ("inline", "cle equalize … --report report.json"),
    ("inline", "cle COMMAND --help"),
])
def test_the_check_accepts_a_right_command(where, line):
    assert check_command(where, line) is None


def test_command_lines_are_found_in_code_blocks_and_spans():
    text = ("Run `cle quantize a.keras\n-o a.tflite` or:\n\n```bash\n$ cle fold a.keras \\\n"
            "    -o b.keras  # folds\npip install x\n```\n")
    assert command_lines(text) == [("code", "cle fold a.keras  -o b.keras  # folds"),
                                   ("inline", "cle quantize a.keras -o a.tflite")]


def _cli_md_by_hand():
    """docs/cli.md without its generated blocks (the synopsis would name every option)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_docblocks_cli", os.path.join(REPO, "scripts", "_docblocks.py"))
    docblocks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(docblocks)
    with open(CLI_MD, encoding="utf-8") as f:
        text = f.read()
    return text, docblocks.BLOCK_RE.sub("", text), docblocks.blocks(CLI_MD)


def test_cli_md_has_a_section_and_a_synopsis_line_for_every_command():
    text, _, blocks = _cli_md_by_hand()
    synopsis = blocks["cli-synopsis"]
    for name in _commands(_parser()):
        assert f"### `cle {name}`" in text, f"docs/cli.md has no section ### `cle {name}`"
        assert re.search(rf"(?m)^cle {name}( |$)", synopsis), (
            f"the synopsis of docs/cli.md has no line for cle {name}: run "
            "python scripts/gen_cli_docs.py")


def test_cli_md_says_what_every_option_does():
    """Every option of every command is named in the hand-written text of docs/cli.md (a
    table row or a sentence), not only in the generated synopsis."""
    _, by_hand, _ = _cli_md_by_hand()
    missing = sorted({f"cle {name} {flag}"
                      for name, p in _commands(_parser()).items()
                      for a in p._actions if not isinstance(a, argparse._HelpAction)
                      for flag in a.option_strings
                      if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", by_hand)})
    assert not missing, "options docs/cli.md does not describe:\n" + "\n".join(missing)
