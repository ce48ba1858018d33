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
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from powerdev.devtools.harness import Harness


class DRAHarness(Harness):
    """One running draharness. call() sends a command and returns its reply;
    the other methods are the commands tests use most, by name."""

    name = "draharness"

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
        async with cls.spawn(argv, log) as harness:
            yield harness

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
