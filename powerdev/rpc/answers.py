"""Encoded replies for one resource, shared by every stream, call and registration.

A reply is encoded once per inventory version with protobuf's C encoder
(upb: about 12 ms for a 10,000-device list or Allocate answer, where
betterproto took over a second), in a worker thread, so the Trio thread
never waits on it. Every stream and every Allocate of that version then
sends the same bytes through the door's pass-through codec. An Allocate
answer of at most INLINE entries ("each": the devices one container asked
for) is encoded where it is asked for: microseconds, where the trip to a
worker thread and back costs about 0.2 ms on every Allocate.

An AllocateResponse with several containers is the join of one framed
container response per container: protobuf concatenation semantics, so the
container's bytes are encoded once and repeated. A list is the join of
one framed entry per unit; an entry whose unit is listed as it was is
copied from the last list's bytes, so a list sent after one device changed
encodes one entry.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Hashable

import trio

from powerdev._proto import api_pb2 as pb
from powerdev.devices.inventory import Snapshot
from powerdev.resources.allocation import CdiGrant, Grant, PathsGrant, Unit
from powerdev.resources.plugin import Plugin

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
INLINE = 64  # entries in a container answer encoded on the Trio thread (a few µs each)


class _Slot:
    """One cached encoding and the key it was made for."""

    def __init__(self) -> None:
        self.key: Hashable = None
        self.value = b""


class Answers:
    def __init__(self, plugin: Plugin) -> None:
        self._plugin = plugin
        self._list = _Slot()
        self._container = _Slot()
        self._lock = trio.Lock()
        # The last list encoded: its units in order, its bytes, and where each
        # unit's framed entry ends in them (4 bytes a unit, where keeping each
        # entry as an object of its own cost about 85 at 10,000 devices).
        self._listed: tuple[Unit, ...] = ()
        self._listed_bytes = b""
        self._ends = array("I")

    async def list_and_watch(self, snapshot: Snapshot) -> bytes:
        """The encoded ListAndWatchResponse for a snapshot."""
        units = await self._plugin.units_soon(snapshot)
        return await self._cached(self._list, units, lambda: self._encode_list(units))

    def _encode_list(self, units: tuple[Unit, ...]) -> bytes:
        """In a worker thread, under the lock: the list, as the join of each
        unit's entry, encoded once for as long as the unit is listed as it is
        (a device event encodes the entries it changed, not 10,000): an entry
        the last list had is copied from its bytes."""
        was = {unit: i for i, unit in enumerate(self._listed)}
        ends, joined = self._ends, bytearray()
        new_ends = array("I")
        with memoryview(self._listed_bytes) as last:
            for unit in units:
                i = was.get(unit)
                if i is None:
                    joined += encode_list((unit,))
                else:
                    joined += last[ends[i - 1] if i else 0 : ends[i]]
                new_ends.append(len(joined))
        encoded = bytes(joined)
        self._listed, self._listed_bytes, self._ends = units, encoded, new_ends
        return encoded

    async def allocate(self, grants: list[Grant | CdiGrant]) -> bytes:
        """The encoded AllocateResponse: one container response per grant.
        The plugin hands out one grant tuple per version, so it is the key."""
        if not grants:
            return b""
        grant = grants[0]
        if any(g is not grant for g in grants):  # never today; correct all the same
            return b"".join([await self._framed(g) for g in grants])
        return await self._framed(grant) * len(grants)

    async def _framed(self, grant: Grant | CdiGrant) -> bytes:
        entries = len(grant.names) if isinstance(grant, CdiGrant) else len(grant)
        if entries <= INLINE:
            slot = self._container
            if slot.key is not grant:  # no await: no other task sees the slot half set
                slot.key, slot.value = grant, encode_container(grant)
            return slot.value
        return await self._cached(self._container, grant, lambda: encode_container(grant))

    async def _cached(self, slot: _Slot, key: Hashable, make: Callable[[], bytes]) -> bytes:
        async with self._lock:
            if slot.key is not key:
                slot.value = await trio.to_thread.run_sync(make)
                slot.key = key
            return slot.value


def encode_list(units: tuple[Unit, ...]) -> bytes:
    reply = pb.ListAndWatchResponse()
    add = reply.devices.add
    for unit in units:
        device = add(ID=unit.id, health=HEALTHY if unit.healthy else UNHEALTHY)
        if unit.numa is not None:
            device.topology.nodes.add(ID=unit.numa)
    return reply.SerializeToString()


def encode_container(grant: Grant | CdiGrant) -> bytes:
    """One container response, framed as an AllocateResponse with one entry:
    DeviceSpecs, or in CDI mode the CDI device names (field 5)."""
    reply = pb.AllocateResponse()
    container = reply.container_responses.add()
    if isinstance(grant, CdiGrant):
        for name in grant.names:
            container.cdi_devices.add(name=name)
        return reply.SerializeToString()
    add = container.devices.add
    if isinstance(grant, PathsGrant):
        permissions = grant.permissions
        for path in grant.paths:
            add(container_path=path, host_path=path, permissions=permissions)
    else:
        for g in grant:
            add(container_path=g.container_path, host_path=g.host_path, permissions=g.permissions)
    return reply.SerializeToString()
