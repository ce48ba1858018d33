"""A real loop device's identity (root): the backing file, read from the real
/sys, names the device whatever loop number it is attached to."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from powerdev.devices.identity import identity, identity_id, numa_node, sysfs_dir
from powerdev.devtools.testing import LOOP_CTL_ADD, LOOP_CTL_REMOVE, bound
from tests.conftest import needs_root

pytestmark = [
    needs_root,
    pytest.mark.skipif(not os.path.exists("/dev/loop-control"), reason="no /dev/loop-control"),
]
INDEXES = range(380, 390)  # clear of the other tests' loop devices
SYS = Path("/sys")


@contextlib.contextmanager
def loop_control() -> Iterator[int]:
    fd = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    try:
        for index in INDEXES:  # leftovers of an interrupted run
            with contextlib.suppress(OSError):
                fcntl.ioctl(fd, LOOP_CTL_REMOVE, index)
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def new_loop(control: int) -> Iterator[int]:
    """A loop device made with LOOP_CTL_ADD at a free index of INDEXES; removed on the way out."""
    for index in INDEXES:
        try:
            fcntl.ioctl(control, LOOP_CTL_ADD, index)
        except OSError as error:
            if error.errno == errno.EEXIST:
                continue
            raise
        break
    else:
        pytest.fail(f"loop{INDEXES[0]}..loop{INDEXES[-1]} all exist: remove them with losetup -d")
    try:
        yield index
    finally:
        # EBUSY while udev still has it open after a change event: the next run removes it.
        with contextlib.suppress(OSError):
            fcntl.ioctl(control, LOOP_CTL_REMOVE, index)


def number_of(index: int) -> tuple[int, int]:
    major, _, minor = (SYS / "block" / f"loop{index}" / "dev").read_text().strip().partition(":")
    return int(major), int(minor)


@contextlib.contextmanager
def attached(index: int, backing: Path, nodes: Path) -> Iterator[tuple[int, int]]:
    """The loop device bound to the file (LOOP_SET_FD through a node made here),
    unbound (LOOP_CLR_FD) and closed on the way out."""
    number = number_of(index)
    node = nodes / f"loop{index}"
    os.mknod(node, stat.S_IFBLK | 0o600, os.makedev(*number))
    try:
        with bound(node, backing):
            yield number
    finally:
        node.unlink()


def test_a_loop_device_is_its_backing_file_whatever_its_number(tmp_path):
    backing = tmp_path / "disk.img"
    with backing.open("wb") as f:
        f.truncate(1 << 20)
    expected = ("LOOP_BACKING_FILE", str(backing.resolve()))
    nodes = tmp_path / "nodes"
    nodes.mkdir()
    with loop_control() as control, new_loop(control) as first, new_loop(control) as second:
        assert first != second
        with attached(first, backing, nodes) as number:
            assert sysfs_dir(SYS, "b", number) == Path(f"/sys/devices/virtual/block/loop{first}")
            first_identity = identity(SYS, None, "b", number)
            assert first_identity == expected
            assert numa_node(SYS, "b", number) is None  # virtual: no NUMA node
            first_number = number
        with attached(second, backing, nodes) as number:
            second_identity = identity(SYS, None, "b", number)
            second_number = number
        assert second_number != first_number
        assert second_identity == first_identity
        assert identity_id(*second_identity) == identity_id(*first_identity)
