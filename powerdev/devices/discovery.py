"""Find the device nodes a resource should advertise.

With include patterns: the existing character and block nodes that match.
Without: the host's block devices (disks, partitions, dm), as the seed does.
Plus /dev/crypto/nx-gzip when nx-gzip is on; minus the exclude patterns.
Patterns are host paths ("/dev/dm-*") matched as Go's filepath.Match does:
`*` never crosses a "/". The host's /dev may be mounted elsewhere
(`dev_root`, e.g. /host/dev); reported paths are always host paths.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from powerdev.config import ResourceConfig
from powerdev.devices import gomatch, identity
from powerdev.devices.model import HOST_DEV, Device, device_id
from powerdev.devices.udevdb import UdevDatabase

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
        paths.append(f"{HOST_DEV}/{_devname(class_block / name) or name}")
    return paths


def _devname(sys_dir: Path) -> str | None:
    """DEVNAME from a sysfs uevent file (the node's name under /dev)."""
    try:
        text = (sys_dir / "uevent").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("DEVNAME="):
            return line.partition("=")[2]
    return None


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


def describe(
    resource: ResourceConfig,
    device: Device,
    sys_root: Path,
    udev: UdevDatabase | None,
    *,
    with_identity: bool = False,
) -> Device | None:
    """The device as this resource lists it: None when its udev properties do
    not match; with its NUMA node; in "each" mode, named by its identity
    (multipath UUID, WWN, serial, loop backing file) where it has one, so the
    same disk keeps its ID across reboots and renumbering."""
    number = (device.major, device.minor)
    if resource.match_properties:
        props = identity.properties(sys_root, udev, device.kind, number)
        if not properties_match(resource.match_properties, props):
            return None
    numa = identity.numa_node(sys_root, device.kind, number)
    found = None
    if resource.allocation == "each" or with_identity:  # a few reads a device: only when used
        found = identity.identity(sys_root, udev, device.kind, number)
    device_id = device.id
    if resource.allocation == "each":
        device_id = unit_id(device, found, sys_root)
    described = f"{found[0]}={found[1]}" if found is not None else None
    whole_disk, has_partitions = identity.place(sys_root, device.kind, number)
    return replace(
        device,
        id=device_id,
        numa=numa,
        identity=described,
        whole_disk=whole_disk,
        has_partitions=has_partitions,
    )


def unit_id(device: Device, found: tuple[str, str] | None, sys_root: Path) -> str:
    """ "each": the ID of the unit a device is, the same for every name of it
    (the node, its /dev/mapper and /dev/disk/by-* links): its identity where
    it has one; else the kernel's name for the node (sdb, dm-3); else, for a
    node sysfs does not know, its kind and numbers."""
    if found is not None:
        return identity.identity_id(*found)
    name = identity.kernel_name(sys_root, device.kind, (device.major, device.minor))
    if name is not None:
        return device_id(f"{HOST_DEV}/{name}")
    kind = "block" if device.kind == "b" else "char"
    return f"{kind}-{device.major}-{device.minor}"


def properties_match(
    wanted: tuple[tuple[str, tuple[str, ...]], ...], props: dict[str, str]
) -> bool:
    """Every property is there, and matches one of its globs."""
    return all(
        key in props and any(gomatch.match(g, props[key]) for g in globs) for key, globs in wanted
    )


def candidates(resource: ResourceConfig, dev_root: Path, sys_root: Path) -> list[str]:
    """The host paths a resource looks at: what its include patterns match
    (or the host's block devices), and nx-gzip when it is on; maybe repeated."""
    if resource.include:
        found = include_candidates(dev_root, resource.include)
    else:
        found = block_candidates(sys_root)
    if resource.nx_gzip:
        found.append(NX_GZIP)
    return found


def discover(
    resource: ResourceConfig,
    dev_root: Path,
    sys_root: Path,
    udev: UdevDatabase | None = None,
    unmatched: list[Device] | None = None,
) -> tuple[Device, ...]:
    """Every device the resource advertises now, sorted by host path. Nodes
    whose udev properties do not match go to `unmatched`, when given: their
    properties may change later."""
    devices = {}
    for host_path in candidates(resource, dev_root, sys_root):
        if host_path in devices or matches_any(resource.exclude, host_path):
            continue
        device = probe(dev_root, host_path)
        if device is not None and control_allowed(device, resource.include, sys_root):
            described = describe(resource, device, sys_root, udev)
            if described is not None:
                devices[host_path] = described
            elif unmatched is not None:
                unmatched.append(device)
    return tuple(sorted(devices.values(), key=lambda d: d.path))


def why_nothing(resource: ResourceConfig, dev_root: Path, sys_root: Path) -> str:
    """Why discovery finds no device for this resource, in one phrase."""
    if resource.include:
        candidates = include_candidates(dev_root, resource.include)
        if not candidates:
            return f"nothing under {dev_root} matches include-devices {list(resource.include)}"
    else:
        candidates = block_candidates(sys_root)
        if not candidates:
            return f"{sys_root}/class/block lists no disk, partition or dm device"
    kept = [p for p in candidates if not matches_any(resource.exclude, p)]
    if not kept:
        return f"every one of the {len(candidates)} matching paths is in exclude-devices"
    if not any(probe(dev_root, p) is not None for p in kept):
        return f"{len(kept)} paths match, but none is a character or block device node"
    return "the nodes that match are control nodes or in use by the host (see above)"


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
