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
from collections.abc import AsyncIterator
from pathlib import Path

from powerdev.config import DEFAULT_RESOURCE_NAME
from powerdev.devtools.harness import Harness, HarnessError

__all__ = ["DeviceManager", "HarnessError"]


class DeviceManager(Harness):
    """One running dmharness. call() sends a command and returns its reply."""

    name = "dmharness"

    @classmethod
    @contextlib.asynccontextmanager
    async def running(
        cls, binary: Path, log: Path, resource: str = DEFAULT_RESOURCE_NAME
    ) -> AsyncIterator[DeviceManager]:
        """The harness as a child process, killed on the way out if still there."""
        async with cls.spawn([str(binary), "-resource", resource], log) as harness:
            yield harness
