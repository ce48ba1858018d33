"""What one resource lists: the host paths its config names, matched and
described as it wants them (udev properties, identity, unit IDs), from the
device table's facts.

candidates() are the paths a full look reads; wanted() and wanted_key()
say whether a path concerns the resource; reaches() whether it lists the
device there (host use aside: that is the verdict's); describe() makes
the Device it advertises. discover() is one look, on a table of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from powerdev.config import ResourceConfig
from powerdev.devices import gomatch, identity, special
from powerdev.devices.discovery import (
    NX_GZIP,
    block_candidates,
    include_candidates,
    is_virtual_block,
    matches_any,
    missing_directories,
    probe,
)
from powerdev.devices.family import Key
from powerdev.devices.model import HOST_DEV, Device, device_id
from powerdev.devices.table import DeviceTable
from powerdev.devices.udevdb import UdevDatabase


def wanted_device(resource: ResourceConfig, device: Device) -> bool:
    """After probing: block discovery (no include patterns) lists block nodes only."""
    return bool(resource.include) or device.kind == "b" or device.path == NX_GZIP


def wanted(resource: ResourceConfig, host_path: str, subsystem: str) -> bool:
    """Would discovery list this path for this resource (if it is a device node)?"""
    if matches_any(resource.exclude, host_path):
        return False
    if resource.nx_gzip and host_path == NX_GZIP:
        return True
    if resource.include:
        return matches_any(resource.include, host_path)
    name = host_path.removeprefix(HOST_DEV + "/")
    return subsystem == "block" and "/" not in name and not is_virtual_block(name)


def wanted_key(resource: ResourceConfig, host_path: str, key: Key) -> bool:
    """wanted(), for a path the device table has found to name `key`."""
    if resource.nx_gzip and host_path == NX_GZIP and not matches_any(resource.exclude, host_path):
        return True
    return wanted(resource, host_path, "block" if key[0] == "b" else "") and (
        bool(resource.include) or key[0] == "b"
    )


def literal_only(
    resource: ResourceConfig, host_path: str, key: Key, table: DeviceTable
) -> str | None:
    """Why this node is granted only when named literally, if it is and this
    resource does not name it so (special.py); None otherwise."""
    why = special.by_path(key[0], host_path) or table.facts(key).literal_only
    if why is None:
        return None
    if special.named_literally(host_path, resource.include):
        return None
    if resource.nx_gzip and host_path == NX_GZIP:
        return None
    return why


def reaches(resource: ResourceConfig, host_path: str, key: Key, table: DeviceTable) -> bool:
    """Does the resource list this name, host use aside: its patterns and
    properties match, and it is not a node only a literal pattern grants?"""
    return (
        wanted_key(resource, host_path, key)
        and literal_only(resource, host_path, key, table) is None
        and properties_ok(resource, key, table)
    )


def properties_ok(resource: ResourceConfig, key: Key, table: DeviceTable) -> bool:
    if not resource.match_properties:
        return True
    return properties_match(resource.match_properties, table.properties(key))


def describe(
    resource: ResourceConfig,
    key: Key,
    host_path: str,
    table: DeviceTable,
    *,
    unit: str | None = None,
) -> Device:
    """The device as this resource lists it, from the table's facts: its
    NUMA node and identity; in "each" mode named by its identity
    (multipath UUID, WWN, serial, loop backing file) where it has one, so
    the same disk keeps its ID across reboots and renumbering; for a DRA
    resource, a block device with its size, vendor and model. `unit`: the
    ID, where the caller chose it ("all" mode, a device with several names)."""
    facts = table.facts(key)
    kind, major, minor = key
    if unit is not None:
        pass
    elif resource.allocation == "each":
        unit = unit_id(key, facts.identity, facts.kernel_name)
    else:
        unit = device_id(host_path)
    return Device(
        unit,
        host_path,
        kind,
        major,
        minor,
        numa=facts.numa,
        identity=facts.identity_text,
        whole_disk=facts.whole_disk,
        has_partitions=facts.has_partitions,
        facts=table.block_facts(key) if resource.dra and kind == "b" else None,
        key=key,
    )


def shared_id(names: Iterable[str], kernel_name: str | None) -> str:
    """ "all" mode: the one ID of every name of a device: the kernel's own
    node's where it is among them, else the shortest name's."""
    names = list(names)
    own = f"{HOST_DEV}/{kernel_name}" if kernel_name else None
    chosen = own if own in names else min(names, key=lambda p: (len(p), p))
    return device_id(chosen)


def unit_id(key: Key, found: tuple[str, str] | None, kernel_name: str | None) -> str:
    """ "each": the ID of the unit a device is, the same for every name of it
    (the node, its /dev/mapper and /dev/disk/by-* links): its identity where
    it has one; else the kernel's name for the node (sdb, dm-3); else, for a
    node sysfs does not know, its kind and numbers."""
    if found is not None:
        return identity.identity_id(*found)
    if kernel_name is not None:
        return device_id(f"{HOST_DEV}/{kernel_name}")
    kind = "block" if key[0] == "b" else "char"
    return f"{kind}-{key[1]}-{key[2]}"


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
) -> tuple[Device, ...]:
    """Every device the resource would list now, host use aside, sorted by
    host path: one look, through a device table of its own."""
    table = DeviceTable(dev_root, sys_root, udev=udev)
    paths = [p for p in dict.fromkeys(candidates(resource, dev_root, sys_root))]
    table.look(paths)
    devices = []
    for path in sorted(paths):
        key = table.key_of(path)
        if key is not None and reaches(resource, path, key, table):
            devices.append(describe(resource, key, path, table))
    return tuple(devices)


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
        if len(kept) == 1:
            return "1 path matches, but it is not a character or block device node"
        return f"{len(kept)} paths match, but none is a character or block device node"
    return "the nodes that match are control nodes or in use by the host (see above)"


def start_warnings(resource: ResourceConfig, dev_root: Path) -> list[str]:
    """What an operator should hear about a resource before any device is
    looked at: a pattern whose directory does not exist, nx-gzip asked for
    on a host without it. `powerdev run` logs these, `powerdev scan` prints
    them: one list, so the two say the same."""
    said = [
        f"{resource.name}: include-devices pattern {pattern!r} can match nothing yet: "
        f"{where} does not exist (it is watched, and its devices are found if it appears)"
        for pattern, where in missing_directories(resource.include, dev_root)
    ]
    if resource.nx_gzip and probe(dev_root, NX_GZIP) is None:
        said.append(
            f"{resource.name}: nx-gzip is true, but this host has no {NX_GZIP} (it is made "
            "by the nx-gzip driver on IBM Power9 and later with the NX accelerator): it is "
            "watched, and advertised if it appears; set nx-gzip to false on other hosts"
        )
    return said
