"""The kubelet's real device manager, driven from Trio.

`dmharness` (conformance/dmharness, built by `bash conformance/build` at the
Kubernetes release that conformance/go.mod names) links the kubelet's device
manager (registration server, endpoint client, capacity, admission, Allocate,
checkpoint) and its PodResources service, and reads one command per line on
stdin, answering each with one JSON object per line. This module runs it as
a child process (kit.py finds it), for the conformance tests and `powerdev
bench`; nothing in the daemon uses it.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio

from powerdev.config import DEFAULT_RESOURCE_NAME


class HarnessError(Exception):
    """The device manager harness failed or answered with an error."""


class DeviceManager:
    """One running dmharness. call() sends a command and returns its reply."""

    def __init__(self, proc: trio.Process, log: Path) -> None:
        self._proc = proc
        self.log = log
        self._buffer = b""

    @classmethod
    @contextlib.asynccontextmanager
    async def running(
        cls, binary: Path, log: Path, resource: str = DEFAULT_RESOURCE_NAME
    ) -> AsyncIterator[DeviceManager]:
        """The harness as a child process, killed on the way out if still there."""
        with log.open("ab") as stderr:
            proc = await trio.lowlevel.open_process(
                [str(binary), "-resource", resource],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
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
            raise HarnessError(f"{reply['cmd']}: {reply['error']}")
        return reply

    async def send(self, *words: object) -> dict[str, Any]:
        """Run one command; its JSON reply as it is, errors included."""
        line = " ".join(str(w) for w in words)
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
                raise HarnessError(f"dmharness exited; see {self.log}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    async def kill(self) -> None:
        """SIGKILL, as a kubelet that crashes: no cleanup of any kind."""
        self._proc.send_signal(signal.SIGKILL)
        await self._proc.wait()
