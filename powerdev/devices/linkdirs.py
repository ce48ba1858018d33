"""Links appearing and vanishing in the directories include patterns name.

udev makes links such as /dev/mapper/mpatha or /dev/disk/by-id/* after it has
handled a device; kernel uevents never name them. An inotify watch on each
literal directory of an include pattern (/dev/mapper for "/dev/mapper/*")
turns their creation and removal into device events, with no polling.
Directories with wildcards, and /dev itself (its nodes come with uevents),
are not watched.
"""

from __future__ import annotations

import glob
import logging
import posixpath
from collections.abc import Iterable
from pathlib import Path

from inotify_simple import flags as F

from powerdev.devices.discovery import to_local
from powerdev.devices.model import HOST_DEV
from powerdev.devices.tracker import DeviceEvent
from powerdev.devices.uevents import RESCAN
from powerdev.watching import Watcher

log = logging.getLogger(__name__)
_NEW = F.CREATE | F.MOVED_TO
_MASK = F.CREATE | F.MOVED_TO | F.DELETE | F.MOVED_FROM


def link_dirs(patterns: Iterable[str]) -> list[str]:
    """The literal host directories below /dev that the patterns point into."""
    dirs = []
    for pattern in patterns:
        parent = posixpath.dirname(pattern)
        if parent != HOST_DEV and parent.startswith(HOST_DEV + "/") and not glob.has_magic(parent):
            dirs.append(parent)
    return sorted(set(dirs))


class LinkDirEvents:
    """Use as a context manager; next_batch() like the netlink source."""

    def __init__(self, dev_root: Path, host_dirs: list[str]) -> None:
        self._watcher = Watcher()
        self._dev_root = dev_root
        self._dirs: dict[int, str] = {}
        self.watch(host_dirs)

    def watch(self, host_dirs: list[str]) -> list[str]:
        """Watch these directories too; returns the ones newly watched."""
        added = []
        for host_dir in host_dirs:
            if host_dir in self._dirs.values():
                continue
            try:
                wd = self._watcher.add(to_local(self._dev_root, host_dir), _MASK)
            except OSError as err:
                log.info("not watching %s for links (%s); rescans will find them", host_dir, err)
                continue
            self._dirs[wd] = host_dir
            added.append(host_dir)
        return added

    @property
    def watched(self) -> list[str]:
        return sorted(self._dirs.values())

    def __enter__(self) -> LinkDirEvents:
        return self

    def __exit__(self, *exc: object) -> None:
        self._watcher.__exit__()

    async def next_batch(self) -> list[DeviceEvent] | str:
        """Every change that is ready, at least one; or RESCAN if the kernel's
        inotify queue overflowed and changes were lost."""
        while True:
            events = await self._watcher.events()
            if any(e.mask & F.Q_OVERFLOW for e in events):
                log.warning("link changes were lost (inotify queue overflow): rescanning")
                return RESCAN
            batch = [
                DeviceEvent(
                    "add" if e.mask & _NEW else "remove", (f"{self._dirs[e.wd]}/{e.name}",), "link"
                )
                for e in events
                if e.wd in self._dirs and e.name
            ]
            if batch:
                return batch
