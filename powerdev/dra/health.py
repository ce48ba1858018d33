"""The health of the devices that prepared claims hold, for the kubelet's
DRA health stream (v1alpha1 NodeWatchResources, served by
rpc/dra_service.py), which puts it into the status of the pods that hold
them (`allocatedResourcesStatus`).

A prepared device is Healthy while its resource's inventory lists it as
the device it was prepared as (one of its nodes at the same host path with
the same kind and numbers) and every such node is healthy; Unhealthy when
it is gone (none of its nodes is there as that device) or listed but
unhealthy (the host uses it, another resource holds it, its name points at
another device); Unknown when its resource is no longer served (a reload
took it out of the config). assess() is pure and costs a dict lookup per
node of a prepared device, whatever the inventory holds.

Fan-out by version, as ListAndWatch does: each stream keeps the report it
sent last and waits (next_report) for one that differs, woken by a change
of an inventory that holds a prepared device or by a claim prepared or
unprepared (claims_changed). It sends the whole list anyway every RESEND
seconds: the kubelet takes a device's health as Unknown once
HEALTH_TIMEOUT seconds have passed since it last heard of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import trio

from powerdev.devices.inventory import Inventory
from powerdev.devices.model import Device
from powerdev.dra.luns import pool_of
from powerdev.resources.plugin import Plugin

log = logging.getLogger(__name__)

HEALTHY, UNHEALTHY, UNKNOWN = "Healthy", "Unhealthy", "Unknown"
HEALTH_TIMEOUT = 30  # seconds the kubelet trusts a report (sent as health_check_timeout_seconds)
RESEND = 10.0  # seconds between whole reports when nothing changed: a third of the timeout

# One node of a prepared device as the claim's CDI spec names it:
# (host path, kind "b" or "c", major, minor).
Node = tuple[str, str, int, int]
# What Claims.prepared_devices() gives: (pool, device name, its nodes).
PreparedDevice = tuple[str, str, tuple[Node, ...]]


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    pool: str
    device: str
    health: str  # HEALTHY, UNHEALTHY or UNKNOWN
    message: str = ""  # why, when not Healthy


def assess(pool: str, device: str, nodes: Sequence[Node], plugin: Plugin | None) -> DeviceHealth:
    """The health of one prepared device, from its resource's inventory now."""
    if plugin is None:
        why = "its resource is no longer served through DRA here"
        return DeviceHealth(pool, device, UNKNOWN, why)
    if not nodes:
        why = "it was not found again when powerdev started (its identity is gone, or it has none)"
        return DeviceHealth(pool, device, UNHEALTHY, f"gone: {why}")
    listed = plugin.inventory.by_path
    ours = []
    elsewhere = []
    for path, kind, major, minor in nodes:
        found = listed.get(path)
        if found is not None and found.key == (kind, major, minor):
            ours.append(found)
        elif found is not None:
            elsewhere.append(f"{path} is now another device ({found.major}:{found.minor})")
    if not ours:
        names = ", ".join(n[0] for n in nodes) or "it has no node"
        why = "; ".join(elsewhere) or f"{names} no longer on the host"
        return DeviceHealth(pool, device, UNHEALTHY, f"gone: {why}")
    sick = [d for d in ours if not d.healthy]
    if sick:
        return DeviceHealth(pool, device, UNHEALTHY, "; ".join(_why(plugin, d) for d in sick))
    return DeviceHealth(pool, device, HEALTHY)


def _why(plugin: Plugin, device: Device) -> str:
    """Why one of its nodes is not usable now: the one verdict's reason."""
    tracker = plugin.tracker
    reason = tracker.verdict(device).reason if tracker is not None else ""
    if reason:
        return f"{device.path}: {reason}"
    return (
        f"{device.path} not usable now: used by the host, held by another resource, "
        "failed, or not the device it was"
    )


def assess_all(
    prepared: Iterable[PreparedDevice], pools: Mapping[str, Plugin]
) -> tuple[DeviceHealth, ...]:
    """Every prepared device once (a device two claims name is one), sorted."""
    seen: dict[tuple[str, str], DeviceHealth] = {}
    for pool, device, nodes in prepared:
        if (pool, device) not in seen:
            seen[pool, device] = assess(pool, device, nodes, pools.get(pool))
    return tuple(seen[key] for key in sorted(seen))


@dataclass(frozen=True)
class Report:
    """One whole list, and what it was read from (to wait for news of)."""

    devices: tuple[DeviceHealth, ...]
    inventories: tuple[tuple[Inventory, int], ...] = field(default=(), compare=False)
    claims: trio.Event = field(default_factory=trio.Event, compare=False)


class HealthWatch:
    """The prepared devices' health, for any number of streams.

    `prepared` lists every device of every prepared claim (Claims.prepared_devices),
    `plugins` the DRA resources served now; `node` names this node's pools."""

    def __init__(
        self,
        prepared: Callable[[], Iterable[PreparedDevice]],
        plugins: Callable[[], Sequence[Plugin]],
        node: str,
        *,
        resend: float = RESEND,
    ) -> None:
        self._prepared = prepared
        self._plugins = plugins
        self._node = node
        self._resend = resend
        self._claims = trio.Event()
        self._said: dict[tuple[str, str], str] = {}  # (pool, device) -> health last logged

    def claims_changed(self) -> None:
        """A claim was prepared or unprepared: every stream looks again."""
        self._claims.set()
        self._claims = trio.Event()

    def report(self) -> Report:
        claims = self._claims
        pools = {pool_of(self._node, p.resource): p for p in self._plugins()}
        devices = assess_all(self._prepared(), pools)
        held = {d.pool for d in devices}
        inventories = tuple(
            (p.inventory, p.inventory.current.version) for name, p in pools.items() if name in held
        )
        self._log(devices)
        return Report(devices, inventories, claims)

    async def next_report(self, sent: Report | None) -> Report:
        """The report to send after `sent`: at once when nothing was sent
        yet; else once the list differs from it, or after `resend` seconds."""
        if sent is None:
            return self.report()
        last = sent
        with trio.move_on_after(self._resend):
            while True:
                await _news_since(last)
                last = self.report()
                if last.devices != sent.devices:
                    return last
        return self.report()

    def _log(self, devices: tuple[DeviceHealth, ...]) -> None:
        """Say each change of a prepared device's health once, whichever
        stream saw it first."""
        now = {(d.pool, d.device): d for d in devices}
        for key, device in now.items():
            before = self._said.get(key)
            if device.health != HEALTHY and before != device.health:
                log.warning(
                    "DRA: prepared device %s of pool %s is %s: %s",
                    device.device,
                    device.pool,
                    device.health,
                    device.message,
                )
            elif device.health == HEALTHY and before not in (None, HEALTHY):
                log.info("DRA: prepared device %s of pool %s is Healthy again", *key[::-1])
        self._said = {key: d.health for key, d in now.items()}


async def _news_since(report: Report) -> None:
    """Until an inventory the report read has a newer version, or a claim
    was prepared or unprepared since."""
    async with trio.open_nursery() as nursery:

        async def inventory(watched: Inventory, version: int) -> None:
            await watched.wait_newer(version)
            nursery.cancel_scope.cancel()

        async def claims() -> None:
            await report.claims.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(claims)
        for watched, version in report.inventories:
            nursery.start_soon(inventory, watched, version)
