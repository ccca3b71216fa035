"""The target's tools run in a child process of this Python (TF Lite Micro's interpreter,
Vela): both stop their process on some files instead of raising, and must not take the caller
with them. :func:`run` runs one; :func:`ended` says in one line how a failed one ended."""

from __future__ import annotations

import subprocess
import sys

__all__ = ["ended", "run"]


def run(args, timeout: float) -> subprocess.CompletedProcess:
    """``python ARGS`` (this interpreter) with its output captured as text."""
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout)


def ended(tool: str, done: subprocess.CompletedProcess, said: str) -> str:
    """How ``tool``'s child process ended without the result: stopped by a signal, or refused
    with ``said`` (its last words) or its exit status."""
    if done.returncode < 0:
        return (f"{tool}'s process was stopped by signal {-done.returncode}"
                + (f" ({said})" if said else " with no message"))
    return f"{tool} refused the file: {said or 'exit status ' + str(done.returncode)}"
