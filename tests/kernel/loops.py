"""Real loop devices through /dev/loop-control: real kernel add/remove events."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

LOOP_CTL_ADD = 0x4C80
LOOP_CTL_REMOVE = 0x4C81
FIRST = 300  # indexes 300-399, matched by /dev/loop3[0-9][0-9], far from losetup's


class LoopControl:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.made: set[int] = set()

    def add(self, index: int) -> str:
        fcntl.ioctl(self.fd, LOOP_CTL_ADD, index)
        self.made.add(index)
        return f"loop{index}"

    def remove(self, index: int) -> None:
        fcntl.ioctl(self.fd, LOOP_CTL_REMOVE, index)
        self.made.discard(index)


@contextlib.contextmanager
def loop_control() -> Iterator[LoopControl]:
    """Loop devices made here are removed on the way out, whatever happened."""
    fd = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    control = LoopControl(fd)
    try:
        for index in range(FIRST, FIRST + 100):  # leftovers of an interrupted run
            with contextlib.suppress(OSError):
                control.remove(index)
        yield control
    finally:
        for index in sorted(control.made):
            with contextlib.suppress(OSError):
                control.remove(index)
        os.close(fd)
