"""Devices of one pool that share blocks, as counters the scheduler honours.

A disk and its partitions, a disk and its SCSI generic alias, two loop
devices on one file: the device table (devices/family.py) knows which
devices overlap. Where both are in one pool, the pool says so with shared
counters (DRAPartitionableDevices, beta and on in Kubernetes 1.36), so
that the scheduler itself never allocates two overlapping devices to two
claims, rather than powerdev refusing the second at prepare time and its
pod waiting.

Counters are written only for a resource with "whole-disks": true; any
other pool publishes its families apart (below), so that a claim for all
of a pool's devices can still be allocated.

The rule. The overlapping devices of a pool fall into families (connected
groups). In a family, devices that are the same storage (aliases, one
identity) form a class, and the classes nest: each lies on the classes
below it (a partition on its disk, a loop device on the partition that
holds its file). Where the classes of a family form a tree, each class
with classes on it, or with more than one device, gets a counter whose
value is the number of leaves under it (1 for a leaf); a device consumes,
of its own class's counter and of the counter of every class below it,
the number of leaves under its own class. Two devices that do not overlap
lie on disjoint leaves, so any set of them fits; two that overlap (one
class under the other, or both in one class) need more than the counter
has. One counter set per family; the counters of a pool go in slices of
their own, 8 sets a slice (the API's limits).

Where counters cannot say it (a family that is not a tree, such as a
logical volume over partitions of two disks, or an NVMe controller with
two namespaces, the same storage as each but they not as each other; more
than 32 counters in one family; an API server that drops counters, its
DRAPartitionableDevices gate off), the family is published as devices
that do not overlap, the smallest first: partitions before their disk, a
block device before its character alias. The others are left out, each
with its reason. Pure functions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from powerdev.devices.family import Key

MAX_COUNTERS = 32  # in one counter set, and consumed by one device from one set
MAX_SETS_PER_SLICE = 8
NO_COUNTERS = "this API server drops counters (its DRAPartitionableDevices gate is off)"
APART = (
    'the resource publishes such devices apart (with "whole-disks": true it publishes '
    "them all, and counters keep the scheduler from giving two of them to two claims)"
)
TOO_MANY = f"its family needs more than the {MAX_COUNTERS} counters a counter set may have"
NOT_NESTED = "its family does not nest (a device reaches two that do not overlap)"
_BELOW = ("disk", "below")  # table.relation(): the other lies under this one
_ABOVE = ("partition", "above")  # the other lies on this one


@dataclass(frozen=True)
class Families:
    """What a pool publishes for its overlapping devices."""

    counter_sets: list[dict[str, Any]] = field(default_factory=list)  # sorted by name
    consumes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # unit ID ->
    left_out: dict[str, str] = field(default_factory=dict)  # unit ID -> why


def plan(
    members: Mapping[str, Key],
    overlapping: Callable[[Key], frozenset[Key]],
    relation: Callable[[Key, Key], str],
    *,
    counters: bool = True,
    apart: str = NO_COUNTERS,
    shown: Callable[[str], str] = str,
    label: Callable[[str], str] = "family-{}".format,
) -> Families:
    """The counters (or, without them, the devices left out, `apart` saying
    why) for the pool's devices `members` (unit ID -> key) that overlap
    others of them. A reason names the other device as shown(unit ID); a
    family's counter set is named label(its first unit ID)."""
    name_of = {key: name for name, key in members.items()}
    near: dict[Key, set[Key]] = {key: set() for key in name_of}
    for key in name_of:
        for other in overlapping(key):
            if other in near and other != key:
                near[key].add(other)
                near[other].add(key)
    result = Families()
    seen: set[Key] = set()
    for key in sorted(name_of, key=name_of.__getitem__):
        if key in seen or not near[key]:
            continue
        group = _group(key, near)
        seen |= group
        why = apart
        if counters:
            tree = _tree(group, near, relation)
            if tree is not None and len(tree.counted) <= MAX_COUNTERS:
                _count(tree, name_of, label, result)
                continue
            why = NOT_NESTED if tree is None else TOO_MANY
        _apart(group, near, relation, name_of, why, shown, result)
    result.counter_sets.sort(key=lambda s: s["name"])
    return result


def _group(start: Key, near: dict[Key, set[Key]]) -> set[Key]:
    group, todo = {start}, [start]
    while todo:
        for other in near[todo.pop()]:
            if other not in group:
                group.add(other)
                todo.append(other)
    return group


@dataclass
class _Tree:
    classes: list[frozenset[Key]]  # each a set of keys that are the same storage
    below: list[list[int]]  # class -> the classes under it, nearest last
    leaves: list[int]  # class -> leaves under it (1 for a leaf)
    counted: list[int]  # the classes with a counter


def _tree(
    group: set[Key], near: dict[Key, set[Key]], relation: Callable[[Key, Key], str]
) -> _Tree | None:
    """The family's classes as a tree, or None where they do not nest."""
    same: dict[Key, Key] = {key: key for key in group}  # union-find over "same"

    def root(key: Key) -> Key:
        while same[key] != key:
            same[key] = same[same[key]]
            key = same[key]
        return key

    under: list[tuple[Key, Key]] = []  # (upper, lower) pairs of keys
    for key in group:
        for other in near[key]:
            how = relation(key, other)
            if how in _BELOW:
                under.append((key, other))
            elif how in _ABOVE:
                under.append((other, key))
            else:
                same[root(key)] = root(other)
    roots = sorted({root(k) for k in group})
    index = {r: i for i, r in enumerate(roots)}
    classes = [frozenset(k for k in group if root(k) == r) for r in roots]
    down: list[set[int]] = [set() for _ in roots]
    for upper, lower in under:
        a, b = index[root(upper)], index[root(lower)]
        if a == b:
            return None  # one storage both above and below itself
        down[a].add(b)
    below = _closure(down)
    if below is None:
        return None
    ordered: list[list[int]] = []
    for c in range(len(classes)):
        chain = sorted(below[c], key=lambda x: len(below[x]))
        # nested: what lies under c is one chain, each under the next
        if any(below[x] != set(chain[:i]) for i, x in enumerate(chain)):
            return None
        # and every device of c overlaps every other of c and of that chain:
        # "the same storage" is not always transitive (an NVMe controller
        # reaches each of its namespaces, which do not overlap each other)
        reach = [k for x in (c, *chain) for k in classes[x]]
        if any(k != other and other not in near[k] for k in classes[c] for other in reach):
            return None
        ordered.append(chain)
    above: list[list[int]] = [[] for _ in classes]  # class -> the classes right on it
    for c, chain in enumerate(ordered):
        if chain:
            above[chain[-1]].append(c)
    leaves = [0] * len(classes)
    for c in sorted(range(len(classes)), key=lambda x: -len(ordered[x])):  # the top first
        leaves[c] = sum(leaves[x] for x in above[c]) or 1
    counted = [c for c in range(len(classes)) if above[c] or len(classes[c]) > 1]
    return _Tree(classes, ordered, leaves, counted)


def _closure(down: list[set[int]]) -> list[set[int]] | None:
    """Everything under each class, all the way down; None on a cycle."""
    done: dict[int, set[int]] = {}
    busy: set[int] = set()

    def walk(c: int) -> set[int] | None:
        if c in done:
            return done[c]
        if c in busy:
            return None
        busy.add(c)
        found: set[int] = set()
        for x in down[c]:
            deeper = walk(x)
            if deeper is None:
                return None
            found |= {x, *deeper}
        busy.discard(c)
        done[c] = found
        return found

    out = [walk(c) for c in range(len(down))]
    return None if any(x is None for x in out) else out  # type: ignore[return-value]


def _count(
    tree: _Tree, name_of: dict[Key, str], label: Callable[[str], str], result: Families
) -> None:
    first = min(name_of[k] for c in tree.classes for k in c)
    set_name = label(first)
    counter = {c: f"c{i}" for i, c in enumerate(tree.counted)}
    result.counter_sets.append(
        {
            "name": set_name,
            "counters": {counter[c]: {"value": str(tree.leaves[c])} for c in tree.counted},
        }
    )
    for c, keys in enumerate(tree.classes):
        need = str(tree.leaves[c])
        used = {counter[x]: {"value": need} for x in (*tree.below[c], c) if x in counter}
        for key in keys:
            result.consumes[name_of[key]] = [{"counterSet": set_name, "counters": used}]


def _apart(
    group: set[Key],
    near: dict[Key, set[Key]],
    relation: Callable[[Key, Key], str],
    name_of: dict[Key, str],
    why: str,
    shown: Callable[[str], str],
    result: Families,
) -> None:
    """The family as devices that do not overlap, the smallest first."""

    def size(key: Key) -> tuple[int, bool, str]:
        on_it = sum(1 for other in near[key] if relation(key, other) in _ABOVE)
        return on_it, key[0] != "b", name_of[key]

    kept: list[Key] = []
    for key in sorted(group, key=size):
        clash = next((k for k in kept if k in near[key]), None)
        if clash is None:
            kept.append(key)
        else:
            other = shown(name_of[clash])
            result.left_out[name_of[key]] = f"it shares blocks with {other}, and {why}"
