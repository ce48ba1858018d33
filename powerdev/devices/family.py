"""A device's family: the devices whose blocks overlap its own.

Two holders must never reach the same blocks, whatever the names and
numbers. The family of a device is every other device that reaches some of
its blocks:

- the same storage under other numbers: a disk's character aliases (SCSI
  generic /dev/sg*, /dev/bsg/*, NVMe generic /dev/ng*n*, an NVMe
  controller), devices with the same identity (two paths to one LUN
  without multipathd share a WWID; two loop devices on one file share a
  backing file), and the members of one stacked device or filesystem
  (multipath legs, md members, the physical volumes of one logical volume,
  the devices of one btrfs);
- what it lies on, all the way down: its whole disk, what it is stacked on
  (sysfs slaves/), a loop device's backing device;
- what lies on it, all the way up: its partitions (kernel partitions and
  kpartx maps, including ones that appear later), what is stacked on it
  (holders/), loop devices over it.

Two partitions of one disk are not family: they share no block. Nor are
two logical volumes of one volume group. A device the kernel does not show
in sysfs has only the family its identity gives it.

Plain functions over a BlockTopology (devices/inuse.py) and a lookup of
the devices that share an identity; the device table (table.py) keeps the
answers and their reverse, so that a relation either side sees counts for
both.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from powerdev.devices.inuse import BlockTopology

Key = tuple[str, int, int]  # kind, major, minor


@dataclass(frozen=True, slots=True)
class Family:
    """The devices that overlap one device, by how (keys, itself excluded)."""

    same: frozenset[Key] = frozenset()  # the same storage under other numbers
    below: frozenset[Key] = frozenset()  # what it lies on
    above: frozenset[Key] = frozenset()  # what lies on it
    # all of them (kept: every verdict asks it)
    overlapping: frozenset[Key] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "overlapping", self.same | self.below | self.above)


NO_FAMILY = Family()


def family(
    topology: BlockTopology, key: Key, same_identity: Callable[[Key], Iterable[Key]]
) -> Family:
    """The family of the device `key`, from sysfs (topology) and the devices
    that share its identity (same_identity)."""
    kind, major, minor = key
    if kind == "b":
        name = topology.name((major, minor))
        starts = [name] if name is not None else []
    else:
        starts = list(topology.aliased_disks((major, minor)))
    extra = {k for k in same_identity(key) if k != key}
    for other in list(extra):
        if other[0] == "b":
            name = topology.name(other[1:])
            if name is not None:
                starts.append(name)
    if not starts:
        return Family(same=frozenset(extra)) if extra else NO_FAMILY

    def keys(names: Iterable[str]) -> set[Key]:
        found = set()
        for name in names:
            number = topology.number(name)
            if number is not None:
                found.add(("b", *number))
        return found

    same_names = _closure(starts, lambda n: _same(topology, n, same_identity))
    below_names = _closure(
        [d for n in same_names for d in _down(topology, n)],
        lambda n: (*_down(topology, n), *_same(topology, n, same_identity)),
    )
    above_names = _closure(
        [u for n in same_names for u in _up(topology, n)],
        lambda n: (*_up(topology, n), *_same(topology, n, same_identity)),
    )
    same = (keys(same_names) | extra) - {key}
    below = keys(below_names) - same - {key}
    above = keys(above_names) - same - below - {key}
    return Family(frozenset(same), frozenset(below), frozenset(above))


def _closure(starts: Iterable[str], step: Callable[[str], Iterable[str]]) -> list[str]:
    seen = dict.fromkeys(starts)
    queue = deque(seen)
    while queue:
        for other in step(queue.popleft()):
            if other not in seen:
                seen[other] = None
                queue.append(other)
    return list(seen)


def _down(topology: BlockTopology, name: str) -> tuple[str, ...]:
    disk = topology.disk(name)
    return (*((disk,) if disk else ()), *topology.slaves(name))


def _up(topology: BlockTopology, name: str) -> tuple[str, ...]:
    return (*topology.parts(name), *topology.holders(name))


def _same(
    topology: BlockTopology, name: str, same_identity: Callable[[Key], Iterable[Key]]
) -> list[str]:
    """The names that are the same storage as this one: the other members
    of what holds it (not its own partition maps), of its btrfs, and the
    devices with its identity."""
    found = [
        member
        for holder in topology.held_by(name)
        if topology.disk(holder) is None  # a partition map is on it, not made of it
        for member in topology.slaves(holder)
        if member != name
    ]
    found += topology.btrfs_members(name)
    number = topology.number(name)
    if number is not None:
        for other in same_identity(("b", *number)):
            if other[0] == "b" and other[1:] != number:
                other_name = topology.name(other[1:])
                if other_name is not None:
                    found.append(other_name)
    return found
