"""Mounts and swap changes on the host, as device events, read by Trio.

Neither a mount nor swapon sends a uevent, but the kernel flags both on
files that can be polled: a mountinfo file (proc(5): POLLPRI when its mount
namespace changes) and /proc/swaps (POLLPRI on swapon and swapoff). Trio
waits only for readability, so the files are put in an epoll set of our own,
registered for EPOLLPRI; that epoll fd turns readable when one of them
fires, and Trio waits on it: no thread, no timer. A wake-up is turned into a
rescan only when the set of block devices mounted or swapped on changed, so
the mounts of every starting pod (overlay, tmpfs, binds of the same disks)
cost one small read and nothing more.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
from pathlib import Path

import trio

from powerdev.devices.inuse import Number, mounted, read_text, swapping
from powerdev.devices.tracker import DeviceEvent
from powerdev.devices.uevents import RESCAN

log = logging.getLogger(__name__)


class HostUseEvents:
    """Use as a context manager; next_batch() like the netlink source, but it
    only ever returns RESCAN: the guard then looks at every device again."""

    def __init__(self, dev_root: Path, mountinfo: Path | None, swaps: Path | None) -> None:
        self.dev_root = dev_root
        self.mountinfo = mountinfo
        self.swaps = swaps
        self._epoll = select.epoll()
        self._fds: list[int] = []
        for path in (mountinfo, swaps):
            if path is None:
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as err:
                log.warning("not following %s (%s): changes there show on rescans only", path, err)
                continue
            self._fds.append(fd)
            try:
                self._epoll.register(fd, select.EPOLLPRI)
            except OSError as err:  # a file that cannot be polled
                log.warning("cannot wait for changes of %s (%s)", path, err)
        self.used = self.in_use()

    def in_use(self) -> frozenset[Number]:
        """The block devices the host mounts or swaps on, right now."""
        found = set(mounted(read_text(self.mountinfo), self.dev_root))
        found.update(swapping(read_text(self.swaps), self.dev_root))
        return frozenset(found)

    def __enter__(self) -> HostUseEvents:
        return self

    def __exit__(self, *exc: object) -> None:
        trio.lowlevel.notify_closing(self._epoll.fileno())
        self._epoll.close()
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []

    async def next_batch(self) -> list[DeviceEvent] | str:
        """RESCAN once the devices mounted or swapped on have changed."""
        while True:
            await trio.lowlevel.wait_readable(self._epoll.fileno())
            # Drain what is ready; looking at the epoll fd may already have
            # taken the flag off the files, so compare what is in use instead.
            self._epoll.poll(0)
            now = self.in_use()
            if now != self.used:
                self.used = now
                log.info("the host mounted, unmounted or swapped a device: rescanning")
                return RESCAN
