"""Device nodes and links appearing and vanishing, seen by inotify.

Kernel uevents name a node, never the links udev makes (/dev/mapper/mpatha,
/dev/disk/by-id/...), and nothing at all is sent when someone runs `rm` in
/dev or in a host /dev mounted elsewhere. So every directory a pattern can
point into is watched: /dev itself, and each directory matching each
directory level of an include pattern ("/dev/disk/by-*/wwn-*" watches /dev,
/dev/disk and every /dev/disk/by-*). A watched level that appears later, or
is removed and made again, is watched again, and since nodes may have been
made in it before the watch was in place, that is a reason to rescan.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Iterable
from pathlib import Path

from inotify_simple import flags as F

from powerdev.devices import gomatch
from powerdev.devices.discovery import matches, to_local
from powerdev.devices.events import DeviceEvent
from powerdev.devices.model import HOST_DEV
from powerdev.devices.uevents import RESCAN
from powerdev.support.inotify import Inotify, Watcher

log = logging.getLogger(__name__)
_NEW = F.CREATE | F.MOVED_TO
_MASK = F.CREATE | F.MOVED_TO | F.DELETE | F.MOVED_FROM | F.DELETE_SELF | F.MOVE_SELF
INOTIFY = "inotify"  # DeviceEvent.subsystem of these events: the kind of node is unknown


def watch_levels(patterns: Iterable[str]) -> list[str]:
    """The directory patterns to watch for these path patterns: /dev, and
    every directory level of each pattern below it (globs kept)."""
    levels = {HOST_DEV}
    for pattern in patterns:
        parent = posixpath.dirname(pattern)
        while parent.startswith(HOST_DEV + "/"):
            levels.add(parent)
            parent = posixpath.dirname(parent)
    return sorted(levels)


class DirEvents:
    """Use as a context manager; next_batch() and ready_batch() like the
    netlink source. `watch(levels)` sets the directory patterns to follow."""

    source = "inotify"

    def __init__(
        self, dev_root: Path, levels: Iterable[str] = (), inotify: Inotify | None = None
    ) -> None:
        self._watcher = Watcher(inotify)
        self._dev_root = dev_root
        self._levels: list[str] = []
        self._dirs: dict[int, str] = {}  # watch descriptor -> host directory
        self.watch(levels)

    def watch(self, levels: Iterable[str]) -> list[str]:
        """Follow these directory patterns; returns the directories newly watched."""
        self._levels = sorted(set(levels))
        return self._expand()

    def _expand(self) -> list[str]:
        added = []
        watched = set(self._dirs.values())
        for level in self._levels:
            for host_dir in self._existing(level):
                if host_dir in watched:
                    continue
                try:
                    wd = self._watcher.add(to_local(self._dev_root, host_dir), _MASK)
                except OSError as err:
                    log.info("cannot watch %s (%s); rescans will find its devices", host_dir, err)
                    continue
                self._dirs[wd] = host_dir
                watched.add(host_dir)
                added.append(host_dir)
        return added

    def _existing(self, level: str) -> list[str]:
        """Host directories that exist now and match a directory pattern."""
        if level == HOST_DEV:
            return [level] if self._dev_root.is_dir() else []
        found = gomatch.glob(self._dev_root, level.removeprefix(HOST_DEV))
        return [
            f"{HOST_DEV}{r}" for r in found if to_local(self._dev_root, f"{HOST_DEV}{r}").is_dir()
        ]

    def _is_level(self, host_dir: str) -> bool:
        return any(matches(level, host_dir) for level in self._levels)

    @property
    def watched(self) -> list[str]:
        return sorted(self._dirs.values())

    def __enter__(self) -> DirEvents:
        return self

    def __exit__(self, *exc: object) -> None:
        self._watcher.__exit__()

    async def next_batch(self) -> list[DeviceEvent] | str:
        """Every change that is ready, at least one; or RESCAN."""
        while True:
            await self._watcher.wait()
            batch = self.ready_batch()
            if batch:
                return batch

    def ready_batch(self) -> list[DeviceEvent] | str:
        """The changes queued now, without waiting (maybe none); RESCAN if
        changes were lost or a watched directory came or went."""
        events = self._watcher.ready()
        rescan = False
        batch = []
        for event in events:
            if event.mask & F.Q_OVERFLOW:
                log.warning("device node changes were lost (inotify queue overflow): rescanning")
                rescan = True
                continue
            if event.mask & (F.IGNORED | F.MOVE_SELF):
                # The directory is gone (its parent's event says so, and
                # brings a rescan); a moved one is watched no longer.
                if self._dirs.pop(event.wd, None) is not None and event.mask & F.MOVE_SELF:
                    self._watcher.remove(event.wd)
                continue
            host_dir = self._dirs.get(event.wd)
            if host_dir is None or not event.name:
                continue
            path = f"{host_dir}/{event.name}"
            if event.mask & F.ISDIR:
                if self._is_level(path):
                    what = "made" if event.mask & _NEW else "removed"
                    log.info("%s was %s: rescanning", path, what)
                    rescan = True
                continue
            batch.append(DeviceEvent("add" if event.mask & _NEW else "remove", (path,), INOTIFY))
        if rescan:
            self._expand()
            return RESCAN
        return batch
