"""One resource as served: its settings, its inventory, and its answers.

Plain Trio and plain data. The gRPC service (rpc/plugin_service.py) asks
this object for everything; answers are computed once per inventory version
and reused by every stream and every Allocate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from powerdev.config import ResourceConfig
from powerdev.devices.inventory import Inventory, Snapshot
from powerdev.devices.model import Device
from powerdev.resources import allocation, cdi
from powerdev.resources.allocation import CdiGrant, DeviceGrant, Unit
from powerdev.resources.cdi import SpecWriter
from powerdev.resources.ownership import Ledger
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
        key = (snapshot.version, self.resource.upper_limit, self.resource.allocation)
        if key != self._units_key:
            self._units = allocation.units(
                snapshot.devices, self.resource.upper_limit, self.resource.allocation
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
            allocation.check_request(ids, self._units_by_id)
        if self.resource.allocation == "each":
            return [self._chosen(snapshot, ids) for ids in requests]
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
