"""udev's view of a device: the properties its rules recorded (ID_MODEL,
ID_SERIAL, ID_WWN, DM_UUID...), read through pyudev (libudev), which takes
them from udev's database under /run/udev. In the DaemonSet that is the
host's /run/udev, mounted read-only; where there is none (no udevd, or not
mounted), a device has only the properties the kernel gives. Each query
reads the database anew, so properties that udev writes after powerdev
started are seen. The device code asks through the UdevDatabase protocol,
so tests pass a stand-in."""

from __future__ import annotations

import os
import threading
from typing import Protocol

import pyudev

Number = tuple[int, int]  # major, minor
_SUBSYSTEMS = {"b": "block", "block": "block", "c": "char", "char": "char"}


class UdevDatabase(Protocol):
    def properties(self, kind: str, number: Number) -> dict[str, str]:
        """The device's udev properties; {} when udev does not know it."""
        ...


class Pyudev:
    """The real database, through libudev. Discovery runs in worker threads,
    and a libudev context is not to be shared between threads: one each."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _context(self) -> pyudev.Context:
        context = getattr(self._local, "context", None)
        if context is None:
            context = self._local.context = pyudev.Context()
        return context

    def properties(self, kind: str, number: Number) -> dict[str, str]:
        try:
            device = pyudev.Devices.from_device_number(
                self._context(), _SUBSYSTEMS[kind], os.makedev(*number)
            )
            return dict(device.properties)
        except (pyudev.DeviceNotFoundError, OSError, ValueError, UnicodeDecodeError):
            return {}
