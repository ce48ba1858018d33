"""A versioned snapshot of one resource's devices.

Fan-out by version: every ListAndWatch stream remembers the version it sent
last and waits for a newer one, then sends the whole list. Nothing is queued
per stream, so a slow reader never holds up the others and bursts coalesce.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from powerdev.devices.model import Device


@dataclass(frozen=True)
class Snapshot:
    version: int
    devices: tuple[Device, ...]
    by_id: dict[str, Device] = field(repr=False, compare=False)


class Inventory:
    def __init__(self, devices: tuple[Device, ...] = ()) -> None:
        self._snapshot = Snapshot(1, devices, {d.id: d for d in devices})
        self._changed = trio.Event()

    @property
    def current(self) -> Snapshot:
        return self._snapshot

    def publish(self, devices: tuple[Device, ...], *, force: bool = False) -> bool:
        """Make `devices` the current list; False (and no new version) if nothing
        changed, unless forced (what is advertised for them changed)."""
        if devices == self._snapshot.devices and not force:
            return False
        self._snapshot = Snapshot(self._snapshot.version + 1, devices, {d.id: d for d in devices})
        self._changed.set()
        self._changed = trio.Event()
        return True

    async def wait_newer(self, seen_version: int) -> Snapshot:
        """The current snapshot, once its version is newer than seen_version."""
        while self._snapshot.version <= seen_version:
            await self._changed.wait()
        return self._snapshot
