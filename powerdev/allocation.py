"""What the kubelet is told: advertised units, Allocate answers, preferences.

Plain functions over plain data. Every grant carries every healthy device of
the resource, as the seed does: the resource is a ticket to the devices, and
its units count how many containers may hold one at once.

- upper-limit 0 (the seed's default): one unit per device, with the device's
  ID and health, so capacity equals the device count as with the seed.
- upper-limit N: N units `share-1` .. `share-N`, Healthy while the resource
  has at least one healthy device. The kubelet's own accounting then allows
  at most N containers at once, and a unit comes back when its pod ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from powerdev.devices.model import Device


@dataclass(frozen=True, slots=True)
class Unit:
    id: str
    healthy: bool


@dataclass(frozen=True, slots=True)
class DeviceGrant:
    host_path: str
    container_path: str
    permissions: str


@dataclass(frozen=True, slots=True)
class CdiGrant:
    """A container's answer in CDI mode: fully qualified CDI device names."""

    names: tuple[str, ...]


class AllocationRefused(ValueError):
    """A request the plugin must refuse; str() says which ID and why."""


def units(devices: Sequence[Device], upper_limit: int) -> tuple[Unit, ...]:
    if upper_limit <= 0:
        return tuple(Unit(d.id, d.healthy) for d in devices)
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
                f"device ID {unit_id!r} is Unhealthy: its device node is gone from the host"
            )


def grant(devices: Sequence[Device], permissions: str) -> tuple[DeviceGrant, ...]:
    """Every healthy device, at the same path in the container, with the permissions."""
    return tuple(DeviceGrant(d.path, d.path, permissions) for d in devices if d.healthy)


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
