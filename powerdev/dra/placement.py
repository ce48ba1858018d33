"""Which ResourceSlice of a pool each device goes in, so that a change of
one device is a change of one slice (one write, at the same generation).

The API allows 128 devices a slice, and 64 in a slice where a device has
a taint or consumes counters. A node's pool can have either at any time
(a device's health is a taint), so its slices hold at most 64: a device
that turns degraded or failed then moves nobody. A cluster pool has
neither, and its slices hold 128. A pool packed anew fills its slices to
seven eighths (56 or 112), leaving room for devices that come later; a
device keeps its slice across changes, and one that comes goes to the
first slice with room. Pure; used by the node's pools (slices.py) and the
cluster pools (lun_controller.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_WITH_TAINTS = 64  # in a slice where any device has a taint or consumes counters
NODE_POOL = MAX_DEVICES_WITH_TAINTS  # a node pool's slice: any device may get a taint
CLUSTER_POOL = MAX_DEVICES_PER_SLICE  # a cluster pool's: no taints, no counters


def filled(capacity: int) -> int:
    """How many devices a slice packed anew holds: room left for 1/8 more."""
    return capacity - capacity // 8


def advanced(device: dict[str, Any]) -> bool:
    """Does the device need a slice of at most 64 (a taint, counters)?"""
    return "taints" in device or "consumesCounters" in device


def chunks(
    devices: Sequence[dict[str, Any]], capacity: int = NODE_POOL
) -> list[list[dict[str, Any]]]:
    """The devices in order, packed anew (at least one chunk, even empty)."""
    _check(devices, capacity)
    size = filled(capacity)
    return [list(devices[i : i + size]) for i in range(0, len(devices), size)] or [[]]


def place(
    slots: dict[str, int],
    count: int,
    devices: Sequence[dict[str, Any]],
    capacity: int = NODE_POOL,
) -> tuple[dict[str, int], int]:
    """Each device's slice, keeping where it was (`slots`, by device name,
    of a pool of `count` slices): a device that comes goes to the first
    slice with room (at most `capacity`), and a slice is added only when
    none has room. Empty slices at the end go; when more than half the
    slices could go, the pool is packed anew. Pure: the new slots and slice
    count."""
    _check(devices, capacity)
    needed = max(1, -(-len(devices) // filled(capacity)))
    if count == 0 or count >= 2 * needed + 1:
        packed = chunks(devices, capacity)
        return {d["name"]: i for i, chunk in enumerate(packed) for d in chunk}, len(packed)
    placed: dict[str, int] = {}
    sizes = [0] * count
    newcomers = []
    for device in devices:
        name = device["name"]
        at = slots.get(name)
        if at is None or at >= count or sizes[at] >= capacity:
            newcomers.append(name)  # new, or its slice is gone or (found so) over full
            continue
        placed[name] = at
        sizes[at] += 1
    i = 0
    for name in sorted(newcomers):
        while i < len(sizes) and sizes[i] >= capacity:
            i += 1
        if i == len(sizes):
            sizes.append(0)
        placed[name] = i
        sizes[i] += 1
    while len(sizes) > 1 and sizes[-1] == 0:  # the last slices emptied: they go
        sizes.pop()
    return placed, len(sizes)


def _check(devices: Sequence[dict[str, Any]], capacity: int) -> None:
    if capacity > MAX_DEVICES_WITH_TAINTS and any(advanced(d) for d in devices):
        raise ValueError(
            f"a slice of {capacity} devices cannot hold one with a taint or counters "
            f"(at most {MAX_DEVICES_WITH_TAINTS})"
        )
