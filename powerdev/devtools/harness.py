"""A conformance-kit harness as a child process, driven from Trio: one
command per line on its stdin, one JSON object per line on its stdout,
each echoing the command it answers (dmharness and draharness both speak
this). devicemanager.py and draharness.py add their commands by name.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Self

import trio


class HarnessError(Exception):
    """A harness failed or answered with an error."""


class Harness:
    """One running harness. call() sends a command and returns its reply."""

    name = "harness"  # for messages: which binary

    def __init__(self, proc: trio.Process, log: Path) -> None:
        self._proc = proc
        self.log = log
        self._buffer = b""

    @classmethod
    @contextlib.asynccontextmanager
    async def spawn(cls, argv: list[str], log: Path) -> AsyncIterator[Self]:
        """The harness as a child process, its stderr (klog) appended to
        `log`; killed on the way out if still there."""
        with log.open("ab") as stderr:
            proc = await trio.lowlevel.open_process(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr
            )
        try:
            yield cls(proc, log)
        finally:
            if proc.returncode is None:
                proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()
                for pipe in (proc.stdin, proc.stdout):
                    if pipe is not None:
                        await pipe.aclose()

    async def call(self, *words: object) -> dict[str, Any]:
        """Run one command; its JSON reply. HarnessError if it says "error"."""
        reply = await self.send(*words)
        if "error" in reply:
            raise HarnessError(f"{reply['cmd']}: {reply['error']} (log: {self.log})")
        return reply

    async def send(self, *words: object) -> dict[str, Any]:
        """Run one command; its JSON reply as it is, errors included."""
        line = " ".join(str(w) for w in words)
        if not line or "\n" in line:
            raise ValueError(f"one command on one line, not {line!r}")
        assert self._proc.stdin is not None
        await self._proc.stdin.send_all(line.encode() + b"\n")
        reply = json.loads(await self._read_line())
        if reply.get("cmd") != line:
            raise HarnessError(f"asked {line!r}, got an answer to {reply.get('cmd')!r}")
        return reply  # type: ignore[no-any-return]

    async def _read_line(self) -> bytes:
        assert self._proc.stdout is not None
        while b"\n" not in self._buffer:
            chunk = await self._proc.stdout.receive_some(65536)
            if not chunk:
                raise HarnessError(f"{self.name} exited; see {self.log}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    async def kill(self) -> None:
        """SIGKILL, as a kubelet that crashes: no cleanup of any kind."""
        self._proc.send_signal(signal.SIGKILL)
        await self._proc.wait()
