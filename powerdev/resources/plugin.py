"""One resource as served: its settings, its inventory, and its answers.

Plain Trio and plain data. The gRPC service (rpc/plugin_service.py) asks
this object for everything; answers are computed once per inventory version
and reused by every stream and every Allocate.

A resource with "api": "both" hands each device to one holder at a time
across the two APIs. The Plugin keeps both sides' holds: the units prepared
for ResourceClaims (told by dra/claims.py) are Unhealthy on the device
plugin side and refused by Allocate; the units Allocate handed out are left
out of what DRA offers until the kubelet's PodResources API, asked after the
grant, says no pod holds them (daemon/pods.py asks). Until the kubelet has
answered once, DRA is offered nothing: what pods held before this daemon
started is not known yet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import trio

from powerdev.config import ResourceConfig
from powerdev.devices.inventory import Inventory, Snapshot
from powerdev.devices.model import Device
from powerdev.resources import allocation, cdi
from powerdev.resources.allocation import CdiGrant, DeviceGrant, Unit
from powerdev.resources.cdi import SpecWriter
from powerdev.resources.ownership import Ledger
from powerdev.resources.tracker import Tracker

# Seconds from an Allocate answer to the kubelet's PodResources surely
# listing the grant (it records it as it reads the answer).
GRANT_SETTLES = 1.0


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
    ) -> None:
        self._resource = resource
        self.inventory = inventory
        self.tracker = tracker
        self.spec = spec
        self._refresh = refresh
        self._units_key: tuple[object, ...] | None = None
        self._units: tuple[Unit, ...] = ()
        self._units_by_id: dict[str, Unit] = {}
        self._grant_key: tuple[int, ResourceConfig] | None = None
        self._grant: tuple[DeviceGrant, ...] | CdiGrant = ()
        self._by_unit: dict[str, list[Device]] = {}
        self._by_unit_version = -1
        # "both": the units claims hold; the units Allocate handed out (-> when),
        # and whether the kubelet has said yet what pods hold.
        self._claimed: frozenset[str] = frozenset()
        self._dp_held: dict[str, float] = {}
        self._dp_known = False
        self._dp_granted = trio.Event()

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
        return self.tracker.ledger if self.tracker is not None else None

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

    def units(self, snapshot: Snapshot | None = None) -> tuple[Unit, ...]:
        """What ListAndWatch advertises for a snapshot (the current one by default)."""
        snapshot = snapshot or self.inventory.current
        key = (snapshot.version, self.resource.upper_limit, self.resource.allocation, self._claimed)
        if key != self._units_key:
            self._units = allocation.units(
                snapshot.devices, self.resource.upper_limit, self.resource.allocation
            )
            if self._claimed and self.resource.both:
                self._units = tuple(
                    Unit(u.id, False, u.numa) if u.id in self._claimed else u for u in self._units
                )
            self._units_by_id = {u.id: u for u in self._units}
            self._units_key = key
        return self._units

    def allocate(
        self, requests: Sequence[Sequence[str]], *, refresh: bool = True
    ) -> list[tuple[DeviceGrant, ...] | CdiGrant]:
        """One grant per container request; AllocationRefused names a bad ID."""
        if refresh:
            self.refresh()
        snapshot = self.inventory.current
        self.units(snapshot)
        for ids in requests:
            if self.resource.both:
                self._refuse_claimed(ids)
            allocation.check_request(ids, self._units_by_id)
        if self.resource.allocation == "each":
            grants = [self._chosen(snapshot, ids) for ids in requests]
            if self.resource.both:
                self._granted_to_pods(i for ids in requests for i in ids)
            return grants
        key = (snapshot.version, self.resource)
        if key != self._grant_key:
            if self.ledger is not None:  # every unit carries every healthy device
                self.ledger.granted(
                    self.resource.name, None, (d for d in snapshot.devices if d.healthy)
                )
            if self.resource.cdi:
                self._need_spec()
                self._grant = CdiGrant(cdi.qualified_names(self.resource, snapshot.devices))
            else:
                self._grant = allocation.grant(snapshot.devices, self.resource.permissions)
            self._grant_key = key
        return [self._grant for _ in requests]

    def _chosen(self, snapshot: Snapshot, ids: Sequence[str]) -> tuple[DeviceGrant, ...] | CdiGrant:
        """ "each": exactly the devices the kubelet chose (every name of each)."""
        if self._by_unit_version != snapshot.version:
            self._by_unit = allocation.by_unit(snapshot.devices)
            self._by_unit_version = snapshot.version
        if self.ledger is not None:
            for unit_id in dict.fromkeys(ids):
                self.ledger.granted(self.resource.name, unit_id, self._by_unit.get(unit_id, ()))
        if self.resource.cdi:
            self._need_spec()
            devices = tuple(d for i in dict.fromkeys(ids) for d in self._by_unit.get(i, ()))
            return CdiGrant(cdi.qualified_names(self.resource, devices))
        return allocation.grant_chosen(self._by_unit, ids, self.resource.permissions)

    # --- "both": one holder across the two APIs ----------------------------

    def _refuse_claimed(self, ids: Sequence[str]) -> None:
        for unit_id in ids:
            if unit_id in self._claimed:
                raise allocation.AllocationRefused(
                    f"device ID {unit_id!r} is held by a ResourceClaim (this resource is "
                    'served through both APIs, "api": "both"): it is Unhealthy here until '
                    "the claim is unprepared"
                )

    def _granted_to_pods(self, ids: Iterable[str]) -> None:
        now = trio.current_time()
        fresh = False
        for unit_id in dict.fromkeys(ids):
            fresh |= unit_id not in self._dp_held
            self._dp_held[unit_id] = now
        self._dp_granted.set()
        self._dp_granted = trio.Event()
        if fresh and self._dp_known:
            self._changed()

    def answered(self, requests: Sequence[Sequence[str]]) -> None:
        """Allocate's answer for these grants is on its way (or refused): with
        "api": "both", they count from now, so that an ask of the kubelet
        begun before it knew of them cannot free them."""
        if self.resource.both:
            now = trio.current_time()
            for unit_id in (i for ids in requests for i in ids):
                if unit_id in self._dp_held:
                    self._dp_held[unit_id] = now

    def claimed(self, units: Iterable[str]) -> None:
        """The units prepared for claims now (dra/claims.py says, on every change)."""
        claimed = frozenset(units)
        if claimed != self._claimed:
            self._claimed = claimed
            if self.resource.both:
                self._changed()

    def pods_hold(self, held: set[str], asked_at: float) -> None:
        """The kubelet's answer, to an ask begun at `asked_at`: the unit IDs
        of this resource pods hold. A unit Allocate handed out before the ask
        and not held now is offered to DRA again."""
        # A unit handed out a moment before the ask may not be in the answer yet.
        settled = asked_at - GRANT_SETTLES
        gone = [u for u, when in self._dp_held.items() if when < settled and u not in held]
        for unit_id in gone:
            del self._dp_held[unit_id]
        for unit_id in held:
            self._dp_held.setdefault(unit_id, asked_at)
        if gone or not self._dp_known:
            self._dp_known = True
            self._changed()

    @property
    def held_by_pods(self) -> frozenset[str] | None:
        """The units Allocate handed out that pods may still hold; None while
        the kubelet has not said (so any unit may be held)."""
        return frozenset(self._dp_held) if self._dp_known else None

    async def wait_granted(self) -> None:
        """Until Allocate next hands out a unit."""
        await self._dp_granted.wait()

    def offered_to_dra(self, snapshot: Snapshot) -> Sequence[Device]:
        """The devices DRA may publish and prepare: all of them, except, with
        "api": "both", those pods hold through the device plugin API."""
        if not self.resource.both:
            return snapshot.devices
        if not self._dp_known:
            return ()
        return tuple(d for d in snapshot.devices if d.id not in self._dp_held)

    def _changed(self) -> None:
        """What either side advertises changed: every stream and the pool follow."""
        self.inventory.publish(self.inventory.current.devices, force=True)

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
            numa_of = {u.id: u.numa for u in self.units()}
            return [
                allocation.preferred_on_one_node(avail, must, size, numa_of)
                for avail, must, size in requests
            ]
        return [allocation.preferred(avail, must, size) for avail, must, size in requests]
