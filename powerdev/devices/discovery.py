"""Device nodes on the host, by path: what a path is (probe), which paths
patterns match, the host's block devices, and the control nodes that must
never be granted by a wildcard. No config here: resources/matching.py asks
these for each resource.

Patterns are host paths ("/dev/dm-*") matched as Go's filepath.Match does:
`*` never crosses a "/". The host's /dev may be mounted elsewhere
(`dev_root`, e.g. /host/dev); reported paths are always host paths.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from powerdev.devices import gomatch, identity
from powerdev.devices.model import HOST_DEV, Device, device_id

NX_GZIP = "/dev/crypto/nx-gzip"
# Memory-backed block devices that are never SAN or local disks. Loop devices
# are left out of block discovery too; include them with a pattern.
_VIRTUAL_BLOCK_PREFIXES = ("ram", "loop", "zram")
# Nodes whose ioctls create or remove devices on the host (loop devices, dm
# maps, btrfs device scans, ublk and cuse devices, input and HID devices, NVMe
# fabrics controllers, virtual Bluetooth controllers), by the kernel's name
# for them (sysfs /sys/dev/char/M:m) and by their usual paths.
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


def matches(pattern: str, host_path: str) -> bool:
    """Go's filepath.Match (patterns were checked when the config was read)."""
    return gomatch.match(pattern, host_path)


def matches_any(patterns: Iterable[str], host_path: str) -> bool:
    return any(matches(p, host_path) for p in patterns)


def to_local(dev_root: Path, host_path: str) -> Path:
    """Where a host path is visible to us, given the host /dev is at dev_root."""
    rel = host_path.removeprefix(HOST_DEV).lstrip("/")
    return dev_root / rel if rel else dev_root


def probe(dev_root: Path, host_path: str) -> Device | None:
    """The device at host_path if it is a character or block node (links followed)."""
    try:
        st = os.stat(to_local(dev_root, host_path))
    except OSError:
        return None
    if stat.S_ISBLK(st.st_mode):
        kind = "b"
    elif stat.S_ISCHR(st.st_mode):
        kind = "c"
    else:
        return None  # regular file, directory, FIFO, socket: never a device
    return Device(device_id(host_path), host_path, kind, os.major(st.st_rdev), os.minor(st.st_rdev))


def is_virtual_block(name: str) -> bool:
    return name.startswith(_VIRTUAL_BLOCK_PREFIXES)


def block_candidates(sys_root: Path) -> list[str]:
    """Host paths of the block devices the kernel lists: disks, partitions, dm-*."""
    class_block = sys_root / "class" / "block"
    try:
        names = sorted(os.listdir(class_block))
    except OSError:
        return []
    paths = []
    for name in names:
        if is_virtual_block(name):
            continue
        paths.append(f"{HOST_DEV}/{identity.devname(class_block / name) or name}")
    return paths


def include_candidates(dev_root: Path, patterns: Iterable[str]) -> list[str]:
    """Host paths under dev_root that match any include pattern (Go's Glob)."""
    found: list[str] = []
    for pattern in patterns:
        rel = pattern.removeprefix(HOST_DEV)
        if rel.startswith("/"):  # the config refuses patterns outside /dev
            found.extend(f"{HOST_DEV}{p}" for p in gomatch.glob(dev_root, rel))
    return found


MISC_MAJOR = 10  # the kernel's misc devices: loop-control, mapper/control, ...


def is_control_node(device: Device, sys_root: Path) -> bool:
    """Does this node let its user create or remove host devices?"""
    if device.path in CONTROL_PATHS:
        return True
    if device.kind != "c" or device.major != MISC_MAJOR:
        return False  # the control nodes are all misc character devices
    try:
        target = os.readlink(
            os.path.join(sys_root, "dev", "char", f"{device.major}:{device.minor}")
        )
    except OSError:
        return False
    return os.path.basename(target) in CONTROL_NAMES


def control_allowed(device: Device, include: Iterable[str], sys_root: Path) -> bool:
    """Control nodes are granted only when a pattern names them literally
    (no wildcard): `/dev/loop*` never grants /dev/loop-control."""
    if not is_control_node(device, sys_root):
        return True
    return any(p == device.path and not gomatch.has_magic(p) for p in include)


def missing_directories(patterns: Iterable[str], dev_root: Path) -> list[tuple[str, Path]]:
    """(pattern, directory) for each pattern whose fixed directory part does
    not exist under dev_root: it can match nothing until that directory appears."""
    missing = []
    for pattern in patterns:
        elements = pattern.removeprefix(HOST_DEV).strip("/").split("/")[:-1]
        fixed = []
        for element in elements:
            if gomatch.has_magic(element):
                break
            fixed.append(element)
        where = dev_root.joinpath(*fixed)
        if not where.is_dir():
            missing.append((pattern, where))
    return missing
