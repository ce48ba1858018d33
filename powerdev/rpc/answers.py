"""Encoded replies for one resource, reused by every stream, call and registration.

A protobuf message is the concatenation of its fields, and a repeated field
may be split over several concatenated messages. So each list entry (a
Device, a DeviceSpec) is encoded once, as a one-entry message, and kept
while it stays in the list; a whole reply is a join of those pieces. A change
encodes only the entries that changed, and a reply costs a join, not a
serialization of thousands of messages.
"""

from __future__ import annotations

from betterproto import encode_varint

from powerdev._proto.v1beta1 import (
    ContainerAllocateResponse,
    Device,
    DeviceSpec,
    ListAndWatchResponse,
)
from powerdev.allocation import DeviceGrant, Unit
from powerdev.devices.inventory import Snapshot
from powerdev.plugin import Plugin

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
_CONTAINER_RESPONSES = b"\x0a"  # AllocateResponse field 1, length-delimited


class Answers:
    def __init__(self, plugin: Plugin) -> None:
        self._plugin = plugin
        self._units: dict[Unit, bytes] = {}
        self._specs: dict[DeviceGrant, bytes] = {}
        self._list_key: tuple[int, int] | None = None
        self._list = b""
        self._grant: tuple[DeviceGrant, ...] | None = None
        self._container = b""

    def list_and_watch(self, snapshot: Snapshot) -> bytes:
        """The encoded ListAndWatchResponse for a snapshot."""
        key = (snapshot.version, self._plugin.resource.upper_limit)
        if key != self._list_key:
            units = self._plugin.units(snapshot)
            old = self._units
            self._units = {u: old.get(u) or _encode_unit(u) for u in units}
            self._list = b"".join(self._units[u] for u in units)
            self._list_key = key
        return self._list

    def allocate(self, grants: list[tuple[DeviceGrant, ...]]) -> bytes:
        """The encoded AllocateResponse: one container response per grant."""
        return b"".join(self._framed_container(g) for g in grants)

    def _framed_container(self, grant: tuple[DeviceGrant, ...]) -> bytes:
        if grant is not self._grant:
            old = self._specs
            self._specs = {g: old.get(g) or _encode_spec(g) for g in grant}
            body = b"".join(self._specs[g] for g in grant)
            self._container = _CONTAINER_RESPONSES + encode_varint(len(body)) + body
            self._grant = grant
        return self._container


def _encode_unit(unit: Unit) -> bytes:
    device = Device(id=unit.id, health=HEALTHY if unit.healthy else UNHEALTHY)
    return bytes(ListAndWatchResponse(devices=[device]))


def _encode_spec(grant: DeviceGrant) -> bytes:
    spec = DeviceSpec(
        container_path=grant.container_path,
        host_path=grant.host_path,
        permissions=grant.permissions,
    )
    return bytes(ContainerAllocateResponse(devices=[spec]))
