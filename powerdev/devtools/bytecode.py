"""Byte-compile powerdev's own modules before a bench starts the daemon.

The image byte-compiles powerdev when it is built (see the Dockerfile), so
the daemon in a pod loads bytecode. A checkout run with
PYTHONDONTWRITEBYTECODE set, as CI and this project's machines are,
compiles all of powerdev's source again at every start instead, which
costs start-up time and memory that the image never pays (measured:
powerdev's modules 4.8 MiB instead of 2.8 in importcost, the daemon's RSS
0.5 MiB more at 1,000 devices). The benches call compile_for_bench() first
so that they measure what runs in a pod.
"""

from __future__ import annotations

import compileall
import io
import sys
from contextlib import redirect_stdout
from pathlib import Path

import powerdev


def compile_powerdev() -> str | None:
    """Write the bytecode of every powerdev module that lacks a current one;
    None when done, else why not (say, a read-only install)."""
    package = Path(powerdev.__file__).parent
    listing = io.StringIO()
    with redirect_stdout(listing):  # compileall prints what it could not write
        done = compileall.compile_dir(package, quiet=1)
    if done:
        return None
    why = listing.getvalue().strip().splitlines()
    return f"cannot byte-compile {package}: {why[-1] if why else 'compileall failed'}"


def compile_for_bench(prog: str) -> None:
    """compile_powerdev(), saying on stderr when it could not."""
    problem = compile_powerdev()
    if problem:
        print(f"{prog}: note: {problem}; the daemon compiles its source at start", file=sys.stderr)
