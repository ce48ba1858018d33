"""What one resource lists: the host paths its config names, matched and
described as it wants them (udev properties, identity, unit IDs).

discover() is a full look for one resource; wanted() and wanted_device()
say whether an event's path concerns it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from powerdev.config import ResourceConfig
from powerdev.devices import gomatch, identity
from powerdev.devices.discovery import (
    NX_GZIP,
    block_candidates,
    control_allowed,
    include_candidates,
    is_virtual_block,
    matches_any,
    missing_directories,
    probe,
)
from powerdev.devices.inuse import BlockTopology
from powerdev.devices.model import HOST_DEV, Device, device_id
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
    same disk keeps its ID across reboots and renumbering; for a DRA
    resource, a block device with its size, vendor and model."""
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
    whole_disk, has_partitions = None, False
    facts = None
    if device.kind == "b":
        whole_disk, has_partitions = BlockTopology(sys_root).place(number)
        if resource.dra:  # size, vendor, model: DRA publishes them
            facts = identity.block_facts(sys_root, number)
    return replace(
        device,
        id=device_id,
        numa=numa,
        identity=described,
        whole_disk=whole_disk,
        has_partitions=has_partitions,
        facts=facts,
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
