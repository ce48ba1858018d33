"""What the kubelet is told: advertised units, Allocate answers, preferences.

Plain functions over plain data. Two allocation modes:

- "all" (IBM's plugin's): every grant carries every healthy device of the
  resource: the resource is a ticket to the devices, and its units count how
  many containers may hold one at once. upper-limit 0: one unit per device
  (every name of it: /dev/dm-3 and /dev/mapper/mpatha are one unit), with
  the device's ID and health, so capacity equals the device count;
  upper-limit N: N units `share-1` .. `share-N`, Healthy while the
  resource has at least one healthy device.
- "each": a unit is one device (every name of it: /dev/dm-3 and its
  /dev/mapper link share an identity, so they are one unit), and a grant
  carries exactly the devices the kubelet chose. GetPreferredAllocation
  keeps a container's devices on one NUMA node where it can.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from powerdev.devices.model import Device


@dataclass(frozen=True, slots=True)
class Unit:
    id: str
    healthy: bool
    numa: int | None = None  # reported as the device's topology


@dataclass(frozen=True, slots=True)
class DeviceGrant:
    host_path: str
    container_path: str
    permissions: str


@dataclass(frozen=True, slots=True)
class PathsGrant:
    """ "all" mode's answer: every healthy device at its own host path in
    the container, with the resource's permissions. Kept as paths, which the
    devices hold already (a DeviceGrant for each of 10,000 devices would be
    about 560 KiB more for as long as the list stands); iterating it gives
    the DeviceGrants."""

    paths: tuple[str, ...]
    permissions: str

    def __iter__(self) -> Iterator[DeviceGrant]:
        return (DeviceGrant(p, p, self.permissions) for p in self.paths)

    def __len__(self) -> int:
        return len(self.paths)


Grant = tuple[DeviceGrant, ...] | PathsGrant  # a container's device nodes


@dataclass(frozen=True, slots=True)
class CdiGrant:
    """A container's answer in CDI mode: fully qualified CDI device names."""

    names: tuple[str, ...]


class AllocationRefused(ValueError):
    """A request the plugin must refuse; str() says which ID and why."""


def units(devices: Sequence[Device], upper_limit: int, mode: str = "all") -> tuple[Unit, ...]:
    """One unit per device (every name of one device is one unit, in
    either mode), or with upper-limit N in "all" mode, N shares."""
    if mode == "each" or upper_limit <= 0:
        # one pass, and no object a device but its unit (10,000 short-lived
        # ones would leave the allocator's pools half empty for good)
        at: dict[str, int] = {}
        found: list[Unit] = []
        for d in devices:
            i = at.get(d.id)
            if i is None:
                at[d.id] = len(found)
                found.append(Unit(d.id, d.healthy, d.numa))
            elif not d.healthy and found[i].healthy:  # one sick name: the unit is
                found[i] = Unit(d.id, False, found[i].numa)
        return tuple(found)
    any_healthy = any(d.healthy for d in devices)
    return tuple(Unit(f"share-{i}", any_healthy) for i in range(1, upper_limit + 1))


def check_request(ids: Sequence[str], advertised: dict[str, Unit]) -> None:
    """Refuse an ID the plugin does not advertise or advertises as Unhealthy."""
    for unit_id in ids:
        unit = advertised.get(unit_id)
        if unit is None:
            raise AllocationRefused(
                f"unknown device ID {unit_id[:100]!r}: this plugin advertises "
                f"{len(advertised)} IDs and that is not one of them"
            )
        if not unit.healthy:
            raise AllocationRefused(
                f"device ID {unit_id!r} is Unhealthy: its device is now another one, the "
                "host uses it, another resource also matches it, or a pod may still hold "
                "it as another unit (powerdev's log says which)"
            )


def by_unit(devices: Sequence[Device]) -> dict[str, tuple[Device, ...]]:
    """Devices grouped by ID: in "each" mode, every name of one device (a
    tuple each: nearly all have one name, and a tuple of one is the least a
    group can cost)."""
    grouped: dict[str, tuple[Device, ...]] = {}
    for device in devices:
        have = grouped.get(device.id)
        grouped[device.id] = (device,) if have is None else (*have, device)
    return grouped


Named = Device | tuple[Device, ...]  # a unit's devices: the device itself for one name


def units_named(devices: Sequence[Device]) -> dict[str, Named]:
    """by_unit(), kept for as long as a list stands: a unit with one name
    (nearly all) holds its device itself, not a tuple of one. named() reads it."""
    grouped: dict[str, Named] = {}
    for device in devices:
        have = grouped.get(device.id)
        if have is None:
            grouped[device.id] = device
        else:
            grouped[device.id] = (have, device) if isinstance(have, Device) else (*have, device)
    return grouped


def named(grouped: dict[str, Named], unit_id: str) -> tuple[Device, ...]:
    """A unit's devices in units_named()'s map (none for an unknown unit)."""
    have = grouped.get(unit_id)
    if have is None:
        return ()
    return (have,) if isinstance(have, Device) else have


def grant_chosen(
    by_id: dict[str, Named], ids: Sequence[str], permissions: str
) -> tuple[DeviceGrant, ...]:
    """ "each": the devices the kubelet chose, every name of each."""
    return tuple(
        DeviceGrant(d.path, d.path, permissions)
        for unit_id in dict.fromkeys(ids)
        for d in named(by_id, unit_id)
    )


def grant(devices: Sequence[Device], permissions: str) -> PathsGrant:
    """Every healthy device, at the same path in the container, with the permissions."""
    return PathsGrant(tuple(d.path for d in devices if d.healthy), permissions)


_DIGITS = re.compile(r"(\d+)")


def natural_key(text: str) -> tuple[list[Any], str]:
    """loop4 < loop5 < loop42: digits compare as numbers. (Text and numbers
    alternate, text first, so two keys always compare.) Names that compare
    the same so (loop03, loop3) are in plain text order: two names never
    tie, so any list of them has one natural order."""
    parts: list[Any] = _DIGITS.split(text)
    parts[1::2] = map(int, parts[1::2])
    return parts, text


def natural_text(text: str) -> str:
    """natural_key() as one string that sorts the same way, for sorting
    many names at once (a key of one string a name, where natural_key's
    list, tuple and numbers made 10,000 short-lived objects that left the
    allocator's pools half empty for good): each run of digits becomes a
    mark below any printable character, its length and its value's digits;
    then, after a mark below that, the text itself breaks ties."""
    return _DIGITS.sub(_number_text, text) + "\x00" + text


def natural_sorted(names: Iterable[str]) -> list[str]:
    """Names in natural_key()'s order, by natural_text() where it sorts the
    same: unless a name holds one of the two marks it uses (a control
    character a device path may hold, in principle)."""
    names = list(names)
    joined = "".join(names)
    marked = "\x00" in joined or "\x01" in joined
    return sorted(names, key=natural_key if marked else natural_text)


def _number_text(digits: re.Match[str]) -> str:
    value = str(int(digits.group()))
    return f"\x01{chr(len(value) + 1)}{value}"


def preferred_on_one_node(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    numa_of: dict[str, int | None],
    order: dict[str, int] | None = None,
    *,
    one_node: bool = False,
) -> list[str]:
    """ "each": the must-include IDs, then devices on one NUMA node where one
    node has enough (the must-include devices' node first, then the node with
    the most), then the rest, each in natural order (`order`: each ID's
    place in it, where the caller has it). Only as many IDs are ranked as
    are taken: a pod asking for one of 1,000 free devices costs one pass.
    `one_node`: every ID `order` knows is on one NUMA node (or none), the
    usual case, so free IDs it knows all are need no grouping at all."""
    chosen = list(dict.fromkeys(must_include))
    if len(chosen) >= size:
        return chosen
    free = dict.fromkeys(available)
    for unit_id in chosen:
        free.pop(unit_id, None)
    if one_node and order is not None:
        try:  # one group: the natural order alone (an ID it does not know raises)
            return chosen + heapq.nsmallest(size - len(chosen), free, key=order.__getitem__)
        except KeyError:
            pass  # not one of the list's IDs: grouped by node as below
    nodes = list(map(numa_of.get, free))  # each free ID's node, in order
    count = {node: nodes.count(node) for node in set(nodes)}
    need = size - len(chosen)
    wanted_nodes = {numa_of.get(i) for i in chosen} - {None}

    def rank(node: int | None) -> tuple[object, ...]:
        return (
            node not in wanted_nodes,
            count[node] < need,
            node is None,
            -count[node],
            -1 if node is None else node,
        )

    # The natural order, computed once a list, where it knows every ID.
    key = order.__getitem__ if order is not None and free.keys() <= order.keys() else natural_key
    for node in sorted(count, key=rank):
        room = size - len(chosen)
        if room <= 0:
            break
        if len(count) == 1:
            on_node = list(free)
        else:
            on_node = [u for u, n in zip(free, nodes, strict=True) if n == node]
        chosen.extend(heapq.nsmallest(room, on_node, key=key))
    return chosen


def preferred(available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
    """A preferred choice: the required IDs first, then available ones, in order."""
    chosen = list(dict.fromkeys(must_include))
    seen = set(chosen)
    for unit_id in available:
        if len(chosen) >= size:
            break
        if unit_id not in seen:
            chosen.append(unit_id)
            seen.add(unit_id)
    return chosen
