"""A versioned snapshot of one resource's devices.

Fan-out by version: every ListAndWatch stream remembers the version it sent
last and waits for a newer one, then sends the whole list. Nothing is queued
per stream, so a slow reader never holds up the others and bursts coalesce.

Changes cost what they change: the devices live in a dict keyed by path,
and the sorted snapshot is built only when someone reads a new version.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import trio

from powerdev.devices.model import Device


@dataclass(frozen=True)
class Snapshot:
    version: int
    devices: tuple[Device, ...]


class Inventory:
    def __init__(self, devices: Iterable[Device] = ()) -> None:
        self._devices: dict[str, Device] = {d.path: d for d in devices}
        self._version = 1
        self._snapshot: Snapshot | None = None
        self._changed = trio.Event()
        self._paths_changed: set[str] | None = None  # None: the whole list

    @property
    def version(self) -> int:
        return self._version

    @property
    def by_path(self) -> Mapping[str, Device]:
        return self._devices

    @property
    def current(self) -> Snapshot:
        if self._snapshot is None or self._snapshot.version != self._version:
            devices = tuple(sorted(self._devices.values(), key=lambda d: d.path))
            self._snapshot = Snapshot(self._version, devices)
        return self._snapshot

    def publish(self, devices: Iterable[Device], *, force: bool = False) -> bool:
        """Make `devices` the whole list; False (and no new version) if nothing
        changed, unless forced (what is advertised for them changed)."""
        new = {d.path: d for d in devices}
        if new == self._devices and not force:
            return False
        self._devices = new
        self._paths_changed = None
        self._bump()
        return True

    def update(self, changes: Mapping[str, Device | None]) -> bool:
        """Set (or, with None, remove) devices by path; True if anything changed."""
        changed = False
        for path, device in changes.items():
            if device is None:
                if self._devices.pop(path, None) is None:
                    continue
            elif self._devices.get(path) != device:
                self._devices[path] = device
            else:
                continue
            changed = True
            if self._paths_changed is not None:
                self._paths_changed.add(path)
        if changed:
            self._bump()
        return changed

    def take_paths_changed(self) -> set[str] | None:
        """The paths set or removed since the last call (None: the whole
        list was replaced), for the one reader that logs what changed."""
        taken, self._paths_changed = self._paths_changed, set()
        return taken

    def _bump(self) -> None:
        self._version += 1
        self._changed.set()
        self._changed = trio.Event()

    async def wait_newer(self, seen_version: int) -> Snapshot:
        """The current snapshot, once its version is newer than seen_version."""
        while self._version <= seen_version:
            await self._changed.wait()
        return self.current
