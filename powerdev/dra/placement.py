"""Which ResourceSlice of a pool each device goes in: at most 128 devices a
slice (the API's limit), 64 in a slice where a device has a taint or
consumes counters, and a device keeps its slice across changes (place()),
so that a change of one device is a change of one slice. Pure; used by
the node's pools (slices.py) and the cluster pools (lun_controller.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_WITH_TAINTS = 64  # in a slice where any device has a taint or consumes counters


def limit(advanced: bool) -> int:
    return MAX_DEVICES_WITH_TAINTS if advanced else MAX_DEVICES_PER_SLICE


def advanced(device: dict[str, Any]) -> bool:
    """Does the device lower its slice's limit to 64 (a taint, counters)?"""
    return "taints" in device or "consumesCounters" in device


def chunks(devices: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The devices in order, in slices of at most 128, or of at most 64
    where one of them has a taint or consumes counters."""
    packed: list[list[dict[str, Any]]] = [[]]
    tainted = False  # the last chunk has a tainted device
    for device in devices:
        has_taint = advanced(device)
        if len(packed[-1]) >= limit(tainted or has_taint):
            packed.append([])
            tainted = False
        packed[-1].append(device)
        tainted = tainted or has_taint
    return packed


def place(
    slots: dict[str, int], count: int, devices: Sequence[dict[str, Any]]
) -> tuple[dict[str, int], int]:
    """Each device's slice, keeping where it was (`slots`, by device name,
    of a pool of `count` slices): a device that comes goes to the first
    slice with room, a slice with a tainted device or one that consumes
    counters keeps at most 64 (its other devices move out), and more
    slices are added only when no slice has room. Empty slices at the end
    go; when half the slices or more could go, the pool is packed again
    from scratch. Pure: the new slots and slice count."""
    needed = max(1, -(-len(devices) // MAX_DEVICES_PER_SLICE))
    if count == 0 or count >= 2 * needed + 1:
        packed = chunks(list(devices))
        return {d["name"]: i for i, chunk in enumerate(packed) for d in chunk}, len(packed)
    placed: dict[str, int] = {}
    sizes = [0] * count
    tainted = [False] * count
    newcomers = []
    for device in devices:
        name = device["name"]
        at = slots.get(name)
        if at is None or at >= count:
            newcomers.append(device)
            continue
        placed[name] = at
        sizes[at] += 1
        if advanced(device):
            tainted[at] = True
    crowded = {i for i in range(count) if tainted[i] and sizes[i] > MAX_DEVICES_WITH_TAINTS}
    if crowded:  # a taint lowered a slice's limit: its untainted devices past 64 move
        members: dict[int, list[dict[str, Any]]] = {i: [] for i in crowded}
        for device in devices:
            at = placed.get(device["name"], -1)
            if at in members:
                members[at].append(device)
        for i, group in members.items():
            group.sort(key=lambda d: (not advanced(d), d["name"]))
            for device in group[MAX_DEVICES_WITH_TAINTS:]:
                del placed[device["name"]]
                newcomers.append(device)
            sizes[i] = MAX_DEVICES_WITH_TAINTS
    first_free = 0
    for device in sorted(newcomers, key=lambda d: d["name"]):
        has_taint = advanced(device)
        i = 0 if has_taint else first_free
        while i < len(sizes) and sizes[i] >= limit(tainted[i] or has_taint):
            i += 1
        if i == len(sizes):
            sizes.append(0)
            tainted.append(False)
        placed[device["name"]] = i
        sizes[i] += 1
        tainted[i] = tainted[i] or has_taint
        if not has_taint:
            first_free = i
    while len(sizes) > 1 and sizes[-1] == 0:  # the last slices emptied: they go
        sizes.pop()
    return placed, len(sizes)
