"""Device events from the kernel or udev, over netlink, read by Trio.

The monitor's socket is waited on with trio.lowlevel.wait_readable: no
thread, no timer, so an idle daemon uses no CPU. Everything readable is read
at once, so a burst of events becomes one batch (and one list update).

Sources: "udev" (udevd's events: properties settled, links such as
/dev/mapper/* made; needs /run/udev from the host) or "kernel" (the raw
uevents; devtmpfs has made or removed the node by the time one arrives, but
links are unknown). "auto" takes udev when udevd's control socket exists.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pyudev
import trio

from powerdev.devices.events import DeviceEvent

log = logging.getLogger(__name__)

RESCAN = "rescan"  # next_batch() result: events were lost, rescan everything
RECEIVE_BUFFER = 32 * 1024 * 1024  # room for storms; needs CAP_NET_ADMIN, best effort
UDEV_CONTROL = Path("/run/udev/control")


def choose_source(wanted: str) -> str:
    if wanted == "auto":
        return "udev" if UDEV_CONTROL.exists() else "kernel"
    return wanted


class NetlinkEvents:
    """A live netlink monitor; use as a context manager."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._monitor = pyudev.Monitor.from_netlink(pyudev.Context(), source=source)
        try:
            self._monitor.set_receive_buffer_size(RECEIVE_BUFFER)
        except OSError as err:
            log.debug("cannot enlarge the uevent buffer (%s); overflows cause a rescan", err)
        self._monitor.start()

    def __enter__(self) -> NetlinkEvents:
        return self

    def __exit__(self, *exc: object) -> None:
        trio.lowlevel.notify_closing(self._monitor.fileno())
        self._monitor = None  # libudev closes the socket when the last reference goes

    async def next_batch(self) -> list[DeviceEvent] | str:
        """Every event that is ready, at least one; or RESCAN after an overflow."""
        while True:
            await trio.lowlevel.wait_readable(self._monitor.fileno())
            batch = self.ready_batch()
            if batch:
                return batch

    def ready_batch(self) -> list[DeviceEvent] | str:
        """The events queued now, without waiting (maybe none); or RESCAN."""
        batch: list[DeviceEvent] = []
        while True:
            try:
                device = self._monitor.poll(timeout=0)
            except OSError as err:
                if err.errno == errno.ENOBUFS:
                    log.warning("uevents were lost (socket buffer overflow): rescanning")
                    return RESCAN
                raise
            if device is None:
                return batch
            batch.append(to_event(device))


def to_event(device: pyudev.Device) -> DeviceEvent:
    paths = []
    if device.device_node:
        paths.append(device.device_node)
    links = device.properties.get("DEVLINKS", "")
    paths.extend(link for link in links.split() if link.startswith("/dev/"))
    number = device.device_number
    return DeviceEvent(
        action=device.action or "",
        paths=tuple(paths),
        subsystem=device.subsystem or "",
        number=(os.major(number), os.minor(number)) if number else None,
    )
