"""A device event (a uevent, an inotify event on /dev), as plain data."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DeviceEvent:
    """One uevent, as plain data."""

    action: str  # add, remove, change, move, bind, unbind, ...
    paths: tuple[str, ...]  # host paths: the node, then its links (udev source only)
    subsystem: str
    number: tuple[int, int] | None = None  # major, minor
