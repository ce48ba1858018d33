"""Nodes only a literal pattern may grant: control nodes and kernel
interfaces, by numbers, sysfs class, kernel name and path; and names that
go through /proc, which are never followed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from powerdev.config import ResourceConfig
from powerdev.devices import special
from powerdev.devices.discovery import local_node, probe
from powerdev.resources.matching import discover
from tests.unit.test_inuse import add_device

NO_SYS = Path("/nonexistent/sys")


@pytest.mark.parametrize(
    ("kind", "major", "minor", "kernel"),
    [
        ("c", 1, 1, True),  # /dev/mem
        ("c", 1, 2, True),  # kmem
        ("c", 1, 4, True),  # port
        ("c", 1, 11, True),  # kmsg
        ("c", 1, 3, False),  # null: every container has it already
        ("c", 1, 5, False),  # zero
        ("c", 1, 9, False),  # urandom
        ("c", 4, 0, True),  # tty0
        ("c", 4, 64, True),  # ttyS0
        ("c", 5, 0, True),  # tty
        ("c", 5, 1, True),  # console
        ("c", 5, 2, True),  # ptmx
        ("c", 7, 1, True),  # vcs1
        ("c", 13, 64, True),  # input/event0
        ("c", 136, 0, True),  # pts/0
        ("c", 202, 0, True),  # cpu/0/msr
        ("c", 203, 0, True),  # cpu/0/cpuid
        ("b", 4, 0, False),  # a block device is never one
        ("c", 240, 0, False),  # a dynamic major sysfs does not know
    ],
)
def test_kernel_interfaces_by_number(kind, major, minor, kernel):
    assert (special.by_number(kind, major, minor, NO_SYS) is not None) is kernel


def test_kernel_interfaces_by_sysfs_class_and_misc_name(tmp_path):
    sys_root = tmp_path / "sys"
    add_device(sys_root, "pci0000:00/0000:00:05.0/tty", "ttyUSB0", "188:0", "char", subsystem="tty")
    add_device(sys_root, "virtual/misc", "kvm", "10:232", "char", subsystem="misc")
    add_device(sys_root, "virtual/misc", "nx-gzip", "10:61", "char", subsystem="misc")
    add_device(sys_root, "virtual/misc", "loop-control", "10:237", "char", subsystem="misc")
    add_device(sys_root, "virtual/mine", "acc0", "241:0", "char", subsystem="mine")
    assert special.by_number("c", 188, 0, sys_root) == (
        "a kernel interface (a terminal or console of the host)"
    )
    assert special.by_number("c", 10, 232, sys_root) is not None  # kvm
    assert special.by_number("c", 10, 237, sys_root) == special.CONTROL
    assert special.by_number("c", 10, 61, sys_root) is None  # a misc device of its own
    assert special.by_number("c", 241, 0, sys_root) is None


@pytest.mark.parametrize(
    ("path", "kernel"),
    [
        ("/dev/kvm", True),
        ("/dev/fuse", True),
        ("/dev/userfaultfd", True),
        ("/dev/net/tun", True),
        ("/dev/ttyS3", True),
        ("/dev/vcsa2", True),
        ("/dev/cpu/3/msr", True),
        ("/dev/mapper/control", True),
        ("/dev/mapper/mpatha", False),
        ("/dev/crypto/nx-gzip", False),
    ],
)
def test_kernel_interfaces_by_path_where_sysfs_does_not_know_them(path, kernel):
    assert (special.by_path("c", path) is not None) is kernel


def test_names_through_proc_are_never_followed(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "stdin").symlink_to("/proc/self/fd/0")
    (dev / "fd").symlink_to("/proc/self/fd")
    (dev / "up").symlink_to("../proc/kcore")  # the proc beside a host /dev mounted elsewhere
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "kcore").symlink_to("/dev/null")
    (dev / "null").symlink_to("/dev/null")
    (dev / "again").symlink_to("null")
    for name in ("stdin", "fd/0", "up"):
        assert local_node(dev, f"/dev/{name}") is None, name
        assert probe(dev, f"/dev/{name}") is None
    assert probe(dev, "/dev/again").key == ("c", 1, 3)  # links elsewhere are followed


def test_a_wide_glob_on_this_machine_reaches_no_kernel_interface():
    """`/dev/**` on the real /dev: whatever this machine has, no terminal,
    console, kernel log, hypervisor, fuse or /proc link is listed."""
    found = {
        d.path for d in discover(ResourceConfig(include=("/dev/**",)), Path("/dev"), Path("/sys"))
    }
    never = [
        "/dev/kmsg",
        "/dev/kvm",
        "/dev/console",
        "/dev/tty",
        "/dev/tty0",
        "/dev/ptmx",
        "/dev/fuse",
        "/dev/mem",
        "/dev/port",
        "/dev/cpu_dma_latency",
        "/dev/loop-control",
        "/dev/userfaultfd",
        "/dev/stdin",
        "/dev/stdout",
        "/dev/vcs",
    ]
    present = [p for p in never if os.path.lexists(p)]
    assert present, "this machine has none of the nodes this test looks for"
    assert not found & set(present), sorted(found & set(present))
    if os.path.exists("/dev/null"):
        assert "/dev/null" in found  # the harmless memory devices stay
    # named exactly, a kernel interface is offered
    if os.path.exists("/dev/kmsg"):
        exact = discover(ResourceConfig(include=("/dev/kmsg",)), Path("/dev"), Path("/sys"))
        assert [d.path for d in exact] == ["/dev/kmsg"]
