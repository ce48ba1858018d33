"""Nodes that only a literal pattern may grant: control nodes and kernel
interfaces.

Some character nodes are not a device a pod should be handed by accident:

- control nodes, whose ioctls create or remove devices on the host
  (/dev/loop-control, /dev/mapper/control, btrfs-control, ublk-control,
  cuse, uinput, uhid, nvme-fabrics, vhci);
- kernel interfaces, which reach the whole machine rather than a device of
  its own: its memory and I/O ports (/dev/mem, /dev/kmem, /dev/port), the
  kernel log (/dev/kmsg), terminals and consoles (/dev/tty*, /dev/console,
  /dev/ptmx, /dev/pts/*, /dev/vcs*), the hypervisor and the fuse,
  userfaultfd, vhost, tun, autofs, hpet, watchdog, snapshot, rfkill and
  latency nodes, the CPUs' MSRs and CPUID, and input devices (keyboards).

Each is offered only when a pattern names its path exactly, with no
wildcard: `/dev/**` or `/dev/loop*` never reaches one. The harmless memory
devices every container already has from its runtime (/dev/null, zero,
full, random, urandom) are not kernel interfaces here: granting them gives
a pod nothing it lacks.

A node is recognised by its numbers where the kernel fixes them, by its
class in sysfs (/sys/dev/char/M:m -> .../subsystem) and by the kernel's
name for it (misc devices, major 10), and by its usual host path where
sysfs does not know it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from powerdev.devices import gomatch

MISC_MAJOR = 10  # the kernel's misc devices: loop-control, mapper/control, kvm, fuse, ...
MEM_MAJOR = 1

CONTROL = "a control node (it creates or removes host devices)"
_MEMORY = "a kernel interface (the machine's memory, I/O ports or kernel log)"
_TERMINAL = "a kernel interface (a terminal or console of the host)"
_CPU = "a kernel interface (the CPUs' registers)"
_INPUT = "a kernel interface (the host's input devices)"
_KERNEL = "a kernel interface (it reaches the kernel, not a device of its own)"

# The kernel's names for control nodes (sysfs /sys/dev/char/10:N), and their usual paths.
CONTROL_NAMES = frozenset(
    {
        "loop-control",
        "device-mapper",
        "btrfs-control",
        "ublk-control",
        "cuse",
        "uinput",
        "uhid",
        "nvme-fabrics",
        "vhci",
    }
)
CONTROL_PATHS = frozenset(
    {
        "/dev/loop-control",
        "/dev/mapper/control",
        "/dev/btrfs-control",
        "/dev/ublk-control",
        "/dev/cuse",
        "/dev/uinput",
        "/dev/input/uinput",
        "/dev/uhid",
        "/dev/nvme-fabrics",
        "/dev/vhci",
    }
)
# Memory devices (major 1) that reach the machine: mem, kmem, port, kmsg, oldmem.
_MEM_MINORS = {1: "mem", 2: "kmem", 4: "port", 11: "kmsg", 12: "oldmem"}
_HARMLESS_MEM = frozenset({3, 5, 7, 8, 9})  # null, zero, full, random, urandom
# Majors the kernel fixes: virtual consoles and serial ports (4), tty,
# console and ptmx (5), vcs (7), input (13), pty slaves (136-143), msr, cpuid.
_FIXED_MAJORS = {4: _TERMINAL, 5: _TERMINAL, 7: _TERMINAL, 13: _INPUT, 202: _CPU, 203: _CPU}
_PTY_SLAVES = range(136, 144)
# Misc devices (major 10) that are kernel interfaces, by the kernel's name.
_KERNEL_MISC = frozenset(
    {
        "kvm",
        "fuse",
        "userfaultfd",
        "vhost-net",
        "vhost-vsock",
        "tun",
        "net/tun",
        "hpet",
        "autofs",
        "cpu_dma_latency",
        "network_latency",
        "network_throughput",
        "snapshot",
        "mcelog",
        "vga_arbiter",
        "rfkill",
        "watchdog",
        "nvram",
        "microcode",
        "cpu/microcode",
        "psaux",
        "udmabuf",
        "vsock",
    }
)
# sysfs classes whose every node is a kernel interface.
_KERNEL_CLASSES = {
    "tty": _TERMINAL,
    "vc": _TERMINAL,
    "input": _INPUT,
    "msr": _CPU,
    "cpuid": _CPU,
    "watchdog": _KERNEL,
}
# Usual paths, for nodes sysfs does not know (a made tree, a stale node).
_KERNEL_PATHS = {
    "/dev/mem": _MEMORY,
    "/dev/kmem": _MEMORY,
    "/dev/port": _MEMORY,
    "/dev/kmsg": _MEMORY,
    "/dev/console": _TERMINAL,
    "/dev/tty": _TERMINAL,
    "/dev/ptmx": _TERMINAL,
    "/dev/kvm": _KERNEL,
    "/dev/fuse": _KERNEL,
    "/dev/userfaultfd": _KERNEL,
    "/dev/vhost-net": _KERNEL,
    "/dev/vhost-vsock": _KERNEL,
    "/dev/net/tun": _KERNEL,
    "/dev/hpet": _KERNEL,
    "/dev/autofs": _KERNEL,
    "/dev/cpu_dma_latency": _KERNEL,
    "/dev/snapshot": _KERNEL,
    "/dev/rfkill": _KERNEL,
    "/dev/watchdog": _KERNEL,
}
_KERNEL_PATH_PATTERNS = (
    ("/dev/tty*", _TERMINAL),
    ("/dev/vcs*", _TERMINAL),
    ("/dev/pts/*", _TERMINAL),
    ("/dev/watchdog*", _KERNEL),
    ("/dev/cpu/*/msr", _CPU),
    ("/dev/cpu/*/cpuid", _CPU),
    ("/dev/input/*", _INPUT),
)
_KERNEL_PREFIXES = tuple(p.split("*", 1)[0] for p, _ in _KERNEL_PATH_PATTERNS)


def _sysfs_char(sys_root: Path, major: int, minor: int) -> str | None:
    """Where sysfs keeps the character device, as the link's target; None if absent."""
    try:
        return os.readlink(os.path.join(sys_root, "dev", "char", f"{major}:{minor}"))
    except OSError:
        return None


def _subsystem(sys_root: Path, major: int, minor: int) -> str | None:
    try:
        target = os.readlink(os.path.join(sys_root, "dev", "char", f"{major}:{minor}", "subsystem"))
    except OSError:
        return None
    return os.path.basename(target)


def by_number(kind: str, major: int, minor: int, sys_root: Path) -> str | None:
    """Why only a literal pattern may grant this device, from its numbers,
    its sysfs class and the kernel's name for it; None for a device."""
    if kind != "c":
        return None  # every node here is a character device
    if major == MEM_MAJOR:
        return None if minor in _HARMLESS_MEM else _MEMORY
    if major in _FIXED_MAJORS:
        return _FIXED_MAJORS[major]
    if major in _PTY_SLAVES:
        return _TERMINAL
    if major == MISC_MAJOR:
        target = _sysfs_char(sys_root, major, minor)
        name = os.path.basename(target) if target else None
        if name in CONTROL_NAMES:
            return CONTROL
        return _KERNEL if name in _KERNEL_MISC else None
    return _KERNEL_CLASSES.get(_subsystem(sys_root, major, minor) or "")


def by_path(kind: str, path: str) -> str | None:
    """Why only a literal pattern may grant the node at this host path, from
    the path alone (nodes sysfs does not know); None for a device."""
    if path in CONTROL_PATHS:
        return CONTROL
    if kind != "c":
        return None
    if path in _KERNEL_PATHS:
        return _KERNEL_PATHS[path]
    if not path.startswith(_KERNEL_PREFIXES):
        return None  # the common case, at the cost of one call
    for pattern, why in _KERNEL_PATH_PATTERNS:
        if gomatch.match(pattern, path):
            return why
    return None


def why_literal_only(kind: str, major: int, minor: int, path: str, sys_root: Path) -> str | None:
    """Why only a literal pattern may grant this node (a control node, a
    kernel interface), or None for an ordinary device."""
    return by_path(kind, path) or by_number(kind, major, minor, sys_root)


def named_literally(path: str, include: Iterable[str]) -> bool:
    """Does a pattern name this path exactly, with no wildcard?"""
    return any(p == path and not gomatch.has_magic(p) for p in include)
