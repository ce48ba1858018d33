"""The kubelet's real DRA manager and plugin manager, driven from Trio.

`draharness` (conformance/draharness, built by `bash conformance/build` at
the Kubernetes release that conformance/go.mod names) links the kubelet's
DRA manager (prepare and unprepare through the driver, its checkpoint, the
ResourceSlice wipe at start) and its plugin manager (registration through
plugins_registry/), reads pods and ResourceClaims from a real API server,
and answers one command per line with one JSON object per line. This
module runs it as a child process (kit.py finds it) for the DRA conformance
tests; nothing in the daemon uses it. The neighbour for the device plugin
API is devicemanager.py.
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

from powerdev.devtools.devicemanager import HarnessError


class DRAHarness:
    """One running draharness. call() sends a command and returns its reply;
    the other methods are the commands tests use most, by name."""

    def __init__(self, proc: trio.Process, log: Path) -> None:
        self._proc = proc
        self.log = log
        self._buffer = b""

    @classmethod
    @contextlib.asynccontextmanager
    async def running(
        cls,
        binary: Path,
        log: Path,
        *,
        node_name: str,
        kubeconfig: Path | None = None,
        verbosity: int = 2,
    ) -> AsyncIterator[DRAHarness]:
        """The harness as a child process, acting as the kubelet of
        `node_name`; without `kubeconfig` only registration works. Killed on
        the way out if still there; its log (klog) goes to `log`."""
        argv = [str(binary), "-node-name", node_name, f"-v={verbosity}"]
        if kubeconfig is not None:
            argv += ["-kubeconfig", str(kubeconfig)]
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
                raise HarnessError(f"draharness exited; see {self.log}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    # --- the commands, by name --------------------------------------------------------

    async def start(self, registry: Path, plugins: Path, state: Path) -> dict[str, Any]:
        """A plugin manager on `registry`, a DRA manager with its checkpoint in `state`."""
        return await self.call("start", registry, plugins, state)

    async def drivers(self) -> list[dict[str, Any]]:
        """The DRA drivers registered now: name, endpoint, versions."""
        return (await self.call("drivers"))["drivers"]  # type: ignore[no-any-return]

    async def wait_driver(self, name: str, timeout_ms: int = 10_000) -> list[dict[str, Any]]:
        """Until driver `name` is registered (HarnessError after timeout_ms); the drivers."""
        return (await self.call("waitdriver", name, timeout_ms))["drivers"]  # type: ignore[no-any-return]

    async def wait_gone(self, name: str, timeout_ms: int = 10_000) -> None:
        """Until driver `name` is no longer registered."""
        await self.call("waitgone", name, timeout_ms)

    async def wait_wipe(self, count: int = 1, timeout_ms: int = 10_000) -> list[dict[str, Any]]:
        """Until the DRA manager has deleted the node's ResourceSlices `count`
        times since the last start or restart (once at every start)."""
        return (await self.call("waitwipe", count, timeout_ms))["wipes"]  # type: ignore[no-any-return]

    async def prepare(self, namespace: str, pod: str) -> dict[str, list[str]]:
        """PrepareResources for the pod; then container name -> CDI device IDs."""
        return (await self.call("prepare", f"{namespace}/{pod}"))["containers"]  # type: ignore[no-any-return]

    async def unprepare(self, namespace: str, pod: str) -> None:
        await self.call("unprepare", f"{namespace}/{pod}")

    async def resources(self, namespace: str, pod: str) -> dict[str, list[str]]:
        """Container name -> CDI device IDs, from what the manager holds (no prepare)."""
        return (await self.call("resources", f"{namespace}/{pod}"))["containers"]  # type: ignore[no-any-return]

    async def checkpoint(self) -> dict[str, Any]:
        """The DRA manager's checkpoint: "raw" text, and its claims as "data"."""
        return await self.call("checkpoint")

    async def restart(self) -> dict[str, Any]:
        """Both managers stopped, and new ones on the same directories."""
        return await self.call("restart")

    async def kill(self) -> None:
        """SIGKILL, as a kubelet that crashes: no cleanup of any kind."""
        self._proc.send_signal(signal.SIGKILL)
        await self._proc.wait()
