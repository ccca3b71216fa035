"""How long ``cle demo`` takes, as a new user runs it: ``cle demo`` in a child process (Python
start and the TensorFlow import included), against its budget of :data:`BUDGET_SECONDS` on
2 cores (issue #43), with the child's peak resident memory (``getrusage``'s ``ru_maxrss``)
and the load average before and after (the machine may be shared).

Run it directly, or with ``make bench``::

    .venv/bin/python benchmarks/bench_demo.py

It prints figures and asserts nothing.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

#: The demo's time budget, in seconds on 2 cores.
BUDGET_SECONDS = 120.0
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    cle = shutil.which("cle", path=os.path.dirname(sys.executable)) or shutil.which("cle")
    command = [cle] if cle else [sys.executable, "-m", "cle"]
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        proc = subprocess.run([*command, "demo", "--out", os.path.join(tmp, "cle_demo")],
                              cwd=tmp, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": REPO})
        seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    if proc.returncode != 0:
        print(proc.stdout[-2000:], proc.stderr[-2000:], sep="\n")
        print(f"cle demo: exit {proc.returncode} after {seconds:.1f} s")
        return 1
    steps = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    print("cle demo, step starts (seconds since the demo's start):")
    for line in steps:
        print("  " + line[:100])
    verdict = "within" if seconds <= BUDGET_SECONDS else "OVER"
    print(f"cle demo: {seconds:.1f} s wall, process start and imports included; budget "
          f"{BUDGET_SECONDS:.0f} s on 2 cores: {verdict}; {os.cpu_count()} cores here; peak "
          f"memory {peak / 2**30:.2f} GiB; load average {load:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after")
    return 0


if __name__ == "__main__":
    sys.exit(main())
