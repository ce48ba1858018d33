"""Mounts and swap changes on the host, as device events for Trio.

Neither a mount nor swapon sends a uevent, but the kernel flags both on
files that can be polled: a mountinfo file (proc(5): POLLPRI when its mount
namespace changes) and /proc/swaps (POLLPRI on swapon and swapoff). Trio
waits only for readability, and these files are always readable, so one
worker thread blocks in poll(2) for POLLPRI on them (plus a pipe that ends
the wait on the way out): no timer, and an idle daemon uses no CPU. (An
epoll set of our own, waited on by Trio, was tried first: nested epoll may
drop a wake-up that arrives while the outer epoll looks at the inner one,
and a test caught it.) A wake-up becomes a rescan only when the set of block
devices mounted or swapped on, or the set of active swap files, changed, so
the mounts of every starting pod (overlay, tmpfs, binds of the same disks)
cost one small read and no more. (A swap file going on or off changes what
the guard counts: while one is active, every filesystem alive in sysfs.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
from pathlib import Path

import trio

from powerdev.devices.inuse import Number, mounted, read_text, swap_files, swapping
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
        self._fds: list[int] = []
        for path in (mountinfo, swaps):
            if path is None:
                continue
            try:
                self._fds.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
            except OSError as err:
                log.warning("not following %s (%s): changes there show on rescans only", path, err)
        self._stop_read, self._stop_write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        # The files are closed by whoever is last: __exit__, or a wait that
        # was still blocked in its thread when the source was closed.
        self._lock = threading.Lock()
        self._waiting = False
        self._closed = False
        self.used = self.in_use()

    def in_use(self) -> frozenset[Number | str]:
        """The block devices the host mounts or swaps on, and the active swap
        files, right now."""
        swaps = read_text(self.swaps)
        found: set[Number | str] = set(mounted(read_text(self.mountinfo), self.dev_root))
        found.update(swapping(swaps, self.dev_root))
        found.update(swap_files(swaps))
        return frozenset(found)

    def __enter__(self) -> HostUseEvents:
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._closed = True
            with contextlib.suppress(OSError):
                os.write(self._stop_write, b"x")  # ends a wait blocked in its thread
            if not self._waiting:
                self._close_files()

    def _close_files(self) -> None:
        for fd in [*self._fds, self._stop_read, self._stop_write]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []

    def _wait(self) -> bool:
        """In a worker thread: block until a file flags a change (True) or
        the source is closed (False)."""
        with self._lock:
            if self._closed:
                return False
            self._waiting = True
        try:
            poller = select.poll()
            for fd in self._fds:
                poller.register(fd, select.POLLPRI)
            poller.register(self._stop_read, select.POLLIN)
            while True:
                ready = dict(poller.poll())
                if self._stop_read in ready:
                    return False
                if any(ready.get(fd, 0) & (select.POLLPRI | select.POLLERR) for fd in self._fds):
                    return True
        finally:
            with self._lock:
                self._waiting = False
                if self._closed:
                    self._close_files()

    def ready_batch(self) -> list[DeviceEvent] | str:
        """Nothing without waiting: a mount change is looked at by next_batch()."""
        return []

    async def next_batch(self) -> list[DeviceEvent] | str:
        """RESCAN once the devices mounted or swapped on have changed."""
        if not self._fds:
            await trio.sleep_forever()
        while True:
            if not await trio.to_thread.run_sync(self._wait, abandon_on_cancel=True):
                await trio.sleep_forever()  # stopping: the source is closed
            now = self.in_use()
            if now != self.used:
                self.used = now
                log.info("the host mounted, unmounted or swapped a device: rescanning")
                return RESCAN
