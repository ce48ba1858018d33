"""Mounts and swap changes on the host, as device events for Trio.

Neither a mount nor swapon sends a uevent, but the kernel flags both on
files that can be polled: a mountinfo file (proc(5): POLLPRI when its mount
namespace changes) and /proc/swaps (POLLPRI on swapon and swapoff). Trio
waits only for readability, and these files are always readable, so one
worker thread blocks in poll(2) for POLLPRI on them (plus a pipe that ends
the wait on the way out): no timer, and an idle daemon uses no CPU. (An
epoll set of our own, waited on by Trio, was tried first: nested epoll may
drop a wake-up that arrives while the outer epoll looks at the inner one,
and a test caught it.) A wake-up becomes a look at the host only when the
set of block devices mounted or swapped on, or the set of active swap
files, changed, so the mounts of every starting pod (overlay, tmpfs, binds
of the same disks) cost one small read and no more; and that look reads
again only the devices joined to one whose use changed.

One timer, for one case. While a swap file is active the host-use rule counts
every filesystem sysfs shows alive (/sys/fs/<type>/<device>), since a swap
file keeps its filesystem alive after a lazy unmount, where no mount table
shows it. But an ordinary unmount also leaves the filesystem alive for a
moment after the mount table changes (the kernel syncs and tears it down
after it wakes us), and nothing flags the moment it is gone. So while a
swap file is active and some filesystem is alive that no mount table line
names, the wait also ends after 1 s, then 2, 4 ... up to 64 s, and the
sysfs entries are looked at again: a device whose filesystem went away is
listed again within about a minute, one that stays (a lazily unmounted
filesystem holding the swap file) costs one small read a minute.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
from pathlib import Path

import trio

from powerdev.devices.events import DeviceEvent
from powerdev.devices.inuse import (
    Number,
    live_devices,
    mounted,
    read_text,
    swap_files,
    swapping,
)

log = logging.getLogger(__name__)
HOST_USE = "host use"  # next_batch() result: the host's mounts or swap changed
SETTLE = (1.0, 64.0)  # the first and the longest wait while a filesystem lingers


class HostUseEvents:
    """Use as a context manager; next_batch() like the netlink source, but it
    only ever returns HOST_USE: the device table then reads the host's
    tables again and looks again at the devices joined to a changed use."""

    source = "host_use"

    def __init__(
        self,
        dev_root: Path,
        mountinfo: Path | None,
        swaps: Path | None,
        *,
        sys_root: Path = Path("/sys"),
        settle: tuple[float, float] = SETTLE,
    ) -> None:
        self.dev_root = dev_root
        self.mountinfo = mountinfo
        self.swaps = swaps
        self.sys_root = sys_root
        self._settle = settle
        self._step = settle[0]
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
        self.used, self._lingering = self._look()

    def in_use(self) -> frozenset[Number | str]:
        """The block devices the host mounts or swaps on, the active swap
        files, and (while one is active) the filesystems alive in sysfs."""
        return self._look()[0]

    def _look(self) -> tuple[frozenset[Number | str], frozenset[Number]]:
        """in_use(), and the devices of the live filesystems that no mount
        table line names while a swap file is active (lingering)."""
        swaps = read_text(self.swaps)
        mounts = mounted(read_text(self.mountinfo), self.dev_root)
        found: set[Number | str] = set(mounts)
        found.update(swapping(swaps, self.dev_root))
        files = swap_files(swaps)
        found.update(f"swap file {path}" for path in files)
        lingering: frozenset[Number] = frozenset()
        if files:
            alive = live_devices(self.sys_root)
            found.update(f"alive {major}:{minor}" for major, minor in alive)
            lingering = frozenset(number for number in alive if number not in mounts)
        return frozenset(found), lingering

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

    def _wait(self, timeout: float | None) -> bool | None:
        """In a worker thread: block until a file flags a change (True), the
        source is closed (False) or `timeout` seconds pass (None)."""
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
                ready = dict(poller.poll(None if timeout is None else int(timeout * 1000)))
                if not ready:
                    return None
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
        """HOST_USE once the devices mounted or swapped on have changed."""
        if not self._fds:
            await trio.sleep_forever()
        while True:
            timeout = self._step if self._lingering else None
            woke = await trio.to_thread.run_sync(self._wait, timeout, abandon_on_cancel=True)
            if woke is False:
                await trio.sleep_forever()  # stopping: the source is closed
            now, lingering = self._look()
            if lingering != self._lingering:
                self._lingering, self._step = lingering, self._settle[0]
            elif woke is None:
                self._step = min(self._step * 2, self._settle[1])
            if now != self.used:
                self.used = now
                log.info("the host mounted, unmounted or swapped a device: looking again")
                return HOST_USE
