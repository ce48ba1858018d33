"""One resource as served: its settings, its inventory, and its answers.

Plain Trio and plain data. The gRPC service (rpc/plugin_service.py) asks
this object for everything; answers are computed once per inventory version
and reused by every stream and every Allocate.

A resource with "api": "both" hands each device to one holder at a time
across the two APIs, as the node-wide ledger says (ownership.py): the
units claims hold are Unhealthy on the device plugin side and refused by
Allocate; the units pods hold through Allocate are left out of what DRA
offers until the kubelet's PodResources API, asked after the grant, says no
pod holds them. Until the kubelet has answered once, DRA is offered
nothing: what pods held before this daemon started is not known yet.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import trio

from powerdev.config import ResourceConfig
from powerdev.devices.inventory import Inventory, Snapshot
from powerdev.devices.model import Device
from powerdev.resources import allocation, cdi
from powerdev.resources.allocation import CdiGrant, Grant, Unit
from powerdev.resources.cdi import SpecWriter
from powerdev.resources.ownership import DEVICE_PLUGIN, DRA, Ledger
from powerdev.resources.tracker import Tracker


class Plugin:
    """What a resource needs is given where it is built: its settings, its
        inventory, and, in the daemon, the tracker that keeps the inventory in
        step with the host, `refresh` (applies every device event the kernel
        has queued, without waiting: Allocate calls it first, so a node removed
        a moment ago is never granted) and `spec` (the CDI spec writer, awaited
        before an Allocate answer is sent so that the file names what the
        answer names). Both are named where a Plugin is built, None included: a
    Plugin without a spec writer cannot answer in CDI mode (it refuses to, so
    that no answer names what no file defines)."""

    def __init__(
        self,
        resource: ResourceConfig,
        inventory: Inventory,
        tracker: Tracker | None = None,
        *,
        refresh: Callable[[], None] | None,
        spec: SpecWriter | None,
        ledger: Ledger | None = None,
    ) -> None:
        self._resource = resource
        self.inventory = inventory
        self.tracker = tracker
        self.spec = spec
        self._refresh = refresh
        self._ledger = ledger if ledger is not None else tracker.ledger if tracker else None
        if self._ledger is not None:
            self._ledger.attach(self)  # the resource's voice in the ledger
        self._units_key: tuple[object, ...] | None = None
        self._units: tuple[Unit, ...] = ()
        self._units_by_id: dict[str, Unit] = {}
        self._grant_key: tuple[int, ResourceConfig] | None = None
        self._grant: Grant | CdiGrant = ()
        self._by_unit: dict[str, allocation.Named] = {}
        self._by_unit_version = -1
        self._recorded = -1  # "all": the inventory version last recorded as granted
        # "each": each unit's NUMA node and its place in natural order, per list
        self._rank_key: object = None
        self._numa_of: dict[str, int | None] = {}
        self._rank: dict[str, int] = {}
        self._one_node = False  # every unit on one NUMA node (or none)

    def refresh(self) -> None:
        """Apply the device events queued now (nothing without a daemon)."""
        if self._refresh is not None:
            self._refresh()

    async def ensure_spec(self) -> None:
        """Make the CDI spec name the current list (nothing without a writer)."""
        if self.spec is not None:
            await self.spec.ensure(self.resource, self.inventory.current)

    @property
    def ledger(self) -> Ledger | None:
        """The node-wide ledger of who holds which device (resources/ownership.py)."""
        return self._ledger

    # --- what the ledger asks of a resource (ownership.View) ----------------------

    def regate(self, keys: set[tuple[str, int, int]]) -> None:
        if self.tracker is not None:
            self.tracker.regate(keys)

    def keys_of(self, unit: str | None) -> list[tuple[str, int, int]]:
        snapshot = self.inventory.current
        if unit is None:
            return sorted({d.key for d in snapshot.devices})
        if self._by_unit_version != snapshot.version:
            self._by_unit = allocation.units_named(snapshot.devices)
            self._by_unit_version = snapshot.version
        return sorted({d.key for d in allocation.named(self._by_unit, unit)})

    def sides_changed(self) -> None:
        """A "both" resource: what each API holds changed; every stream and
        the pool see it."""
        self.inventory.publish(self.inventory.current.devices, force=True)

    @property
    def resource(self) -> ResourceConfig:
        """The settings in force: the tracker's, which switches them in the
        same step as it publishes the list found under them."""
        return self.tracker.resource if self.tracker is not None else self._resource

    async def reconfigure(self, resource: ResourceConfig) -> bool:
        """Rescan under new settings, then put settings and list in force at
        once: no Allocate sees the new settings with the old list (a device
        just excluded still granted) or the other way round."""
        if self.tracker is None:
            self._resource = resource
            return False
        return await self.tracker.rescan(resource)

    def _held_through(self, api: str) -> frozenset[str]:
        """ "both": the units of this resource held through one API."""
        ledger = self.ledger
        if ledger is None or not self.resource.both:
            return frozenset()
        return ledger.held_units(self.resource.name, api)

    def units(self, snapshot: Snapshot | None = None) -> tuple[Unit, ...]:
        """What ListAndWatch advertises for a snapshot (the current one by default)."""
        snapshot = snapshot or self.inventory.current
        key = self._key_of_units(snapshot)
        if key != self._units_key:
            self._keep_units(key, _counted(snapshot, self.resource, key[-1]))
        return self._units

    async def units_soon(self, snapshot: Snapshot) -> tuple[Unit, ...]:
        """The same, counted in a worker thread when not known yet: at 10,000
        devices counting takes tens of milliseconds of the Trio thread."""
        key = self._key_of_units(snapshot)
        if key != self._units_key:
            counted = await trio.to_thread.run_sync(_counted, snapshot, self.resource, key[-1])
            kept = self._units_key
            if kept is None or kept[0] <= snapshot.version:  # never over a newer count
                self._keep_units(key, counted)
            if self.prefers:  # at 10,000 devices the natural sort is 20 ms
                ranked = await trio.to_thread.run_sync(_ranked, counted[0])
                if self._units is counted[0]:  # still the count in force
                    (self._numa_of, self._rank, self._one_node) = ranked
                    self._rank_key = counted[0]
            return counted[0]
        return self._units

    def _key_of_units(self, snapshot: Snapshot) -> tuple[Any, ...]:
        claimed = self._held_through(DRA)
        return (snapshot.version, self.resource.upper_limit, self.resource.allocation, claimed)

    def _keep_units(
        self, key: tuple[Any, ...], counted: tuple[tuple[Unit, ...], dict[str, Unit]]
    ) -> None:
        self._units, self._units_by_id = counted
        self._units_key = key

    async def warm(self) -> None:
        """Count the current list's units and make the "all"-mode grant of
        it in worker threads, ahead of the first pod, so that its Allocate
        finds them made (10,000 grants take about 10 ms of the Trio thread)."""
        snapshot = self.inventory.current
        await self.units_soon(snapshot)
        resource = self.resource
        key = (snapshot.version, resource)
        if resource.allocation == "each" or resource.cdi or key == self._grant_key:
            return
        grant = await trio.to_thread.run_sync(
            allocation.grant, snapshot.devices, resource.permissions
        )
        kept = self._grant_key
        if self.resource is resource and (kept is None or kept[0] < snapshot.version):
            self._grant, self._grant_key = grant, key  # never over a newer one

    def allocate(
        self, requests: Sequence[Sequence[str]], *, refresh: bool = True
    ) -> list[Grant | CdiGrant]:
        """One grant per container request; AllocationRefused names a bad ID.
        A request that names no ID (the answer made ahead, at registration)
        hands nothing out, so the ledger records no grant for it."""
        if refresh:
            self.refresh()
        snapshot = self.inventory.current
        self.units(snapshot)
        for ids in requests:
            if self.resource.both:
                self._refuse_claimed(ids)
            allocation.check_request(ids, self._units_by_id)
        handed_out = any(requests)
        if self.resource.allocation == "each":
            return [self._chosen(snapshot, ids, record=handed_out) for ids in requests]
        if handed_out and self.ledger is not None and self._recorded != snapshot.version:
            # every unit carries every healthy device: held as any unit, once a
            # version (the list's health is the verdict, ledger included)
            healthy = [d.key for d in snapshot.devices if d.healthy]
            self.ledger.granted(self.resource.name, None, healthy)
            self._recorded = snapshot.version
        key = (snapshot.version, self.resource)
        if key != self._grant_key:
            if self.resource.cdi:
                self._need_spec()
                self._grant = CdiGrant(cdi.qualified_names(self.resource, snapshot.devices))
            else:
                self._grant = allocation.grant(snapshot.devices, self.resource.permissions)
            self._grant_key = key
        return [self._grant for _ in requests]

    def _chosen(self, snapshot: Snapshot, ids: Sequence[str], *, record: bool) -> Grant | CdiGrant:
        """ "each": exactly the devices the kubelet chose (every name of each)."""
        if self._by_unit_version != snapshot.version:
            self._by_unit = allocation.units_named(snapshot.devices)
            self._by_unit_version = snapshot.version
        if self.ledger is not None and record:
            for unit_id in dict.fromkeys(ids):
                devices = allocation.named(self._by_unit, unit_id)
                self._refuse_blocked(devices, unit_id)
                self.ledger.granted(self.resource.name, unit_id, [d.key for d in devices])
            if self.resource.both:
                self.ledger.wake()  # its DRA side waits on what pods hold
        if self.resource.cdi:
            self._need_spec()
            devices = tuple(
                d for i in dict.fromkeys(ids) for d in allocation.named(self._by_unit, i)
            )
            return CdiGrant(cdi.qualified_names(self.resource, devices))
        return allocation.grant_chosen(self._by_unit, ids, self.resource.permissions)

    def _refuse_blocked(self, devices: Sequence[Device], unit: str | None) -> None:
        """The ledger is asked at the grant itself, too: a device whose family
        another holder holds is never handed out, whatever the list said."""
        assert self.ledger is not None
        for device in devices:
            blocked = self.ledger.blocking(device.key, self.resource, unit)
            if blocked is not None:
                raise allocation.AllocationRefused(
                    f"device ID {device.id!r} ({device.path}) is not granted: "
                    f"{self.ledger.why_held(device.key, *blocked)}"
                )

    # --- "both": one holder across the two APIs ----------------------------

    def _refuse_claimed(self, ids: Sequence[str]) -> None:
        claimed = self._held_through(DRA)
        for unit_id in ids:
            if unit_id in claimed:
                raise allocation.AllocationRefused(
                    f"device ID {unit_id!r} is held by a ResourceClaim (this resource is "
                    'served through both APIs, "api": "both"): it is Unhealthy here until '
                    "the claim is unprepared"
                )

    def answered(self, requests: Sequence[Sequence[str]]) -> None:
        """Allocate's answer for these grants is on its way (or refused):
        they count from now, so that an ask of the kubelet begun before it
        knew of them cannot free them."""
        if self.ledger is not None and any(requests):
            units = {i for ids in requests for i in ids}
            self.ledger.touch(
                self.resource.name, units if self.resource.allocation == "each" else {None}
            )

    @property
    def held_by_pods(self) -> frozenset[str] | None:
        """ "both": the units Allocate handed out that pods may still hold;
        None while the kubelet has not said (so any unit may be held)."""
        ledger = self.ledger
        if ledger is None:
            return frozenset()
        if not ledger.known:
            return None
        return self._held_through(DEVICE_PLUGIN)

    def offered_to_dra(self, snapshot: Snapshot) -> Sequence[Device]:
        """The devices DRA may publish and prepare: all of them, except, with
        "api": "both", those pods hold through the device plugin API."""
        if not self.resource.both:
            return snapshot.devices
        held = self.held_by_pods
        if held is None:
            return ()
        return tuple(d for d in snapshot.devices if d.id not in held)

    def _need_spec(self) -> None:
        if self.spec is None:
            raise RuntimeError(
                f"{self.resource.name}: CDI names need a spec file: this Plugin was built "
                "without a spec writer"
            )

    @property
    def prefers(self) -> bool:
        """Does GetPreferredAllocation say something the kubelet would not choose?"""
        return self.resource.allocation == "each"

    def preferred(
        self, requests: Sequence[tuple[Sequence[str], Sequence[str], int]]
    ) -> list[list[str]]:
        """GetPreferredAllocation: (available, must_include, size) per container."""
        if self.prefers:
            units = self.units()
            if self._rank_key is not units:
                self._numa_of, self._rank, self._one_node = _ranked(units)
                self._rank_key = units
            return [
                allocation.preferred_on_one_node(
                    avail, must, size, self._numa_of, self._rank, one_node=self._one_node
                )
                for avail, must, size in requests
            ]
        return [allocation.preferred(avail, must, size) for avail, must, size in requests]


def _ranked(units: tuple[Unit, ...]) -> tuple[dict[str, int | None], dict[str, int], bool]:
    """Each unit's NUMA node, its place in the natural order of the list,
    and whether they are all on one node: what GetPreferredAllocation ranks
    by (any thread)."""
    # only the units with a node: get() says None for the others all the
    # same, and most nodes' devices say none (10,000 entries saved)
    numa_of = {u.id: u.numa for u in units if u.numa is not None}
    ordered = allocation.natural_sorted(u.id for u in units)  # one unit an ID
    one_node = len({u.numa for u in units}) <= 1
    return numa_of, {unit_id: i for i, unit_id in enumerate(ordered)}, one_node


def _counted(
    snapshot: Snapshot, resource: ResourceConfig, claimed: frozenset[str]
) -> tuple[tuple[Unit, ...], dict[str, Unit]]:
    """A snapshot's units, and by ID: any thread (they read only what they
    are given, none of it changed after it is made)."""
    units = allocation.units(snapshot.devices, resource.upper_limit, resource.allocation)
    if claimed:
        units = tuple(Unit(u.id, False, u.numa) if u.id in claimed else u for u in units)
    return units, {u.id: u for u in units}
