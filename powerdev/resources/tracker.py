"""Keep one resource's device list in step with the host.

Two ways in: a full rescan (at start, every scan-interval with the `time`
strategy, or when events were lost), and device events, which re-probe only
the paths they name. Either way the result is published to the inventory,
which pushes it to every ListAndWatch stream.

Health follows identity. A node that vanishes is removed from the list, and
is listed again, Healthy, when it returns. A name that now points at a
different device (another major:minor) is Unhealthy: it is not the device the
kubelet handed out under that ID. It turns Healthy again once the original
device is back under that name, or once the name goes away and returns
(udev removes and re-adds a re-created map's links), or after a restart.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from powerdev.config import ResourceConfig
from powerdev.devices.discovery import control_allowed, probe
from powerdev.devices.events import DeviceEvent
from powerdev.devices.inuse import HostUseGuard, recheck_paths
from powerdev.devices.inventory import Inventory
from powerdev.devices.model import Device
from powerdev.devices.udevdb import UdevDatabase
from powerdev.resources.index import Index
from powerdev.resources.matching import describe, discover, wanted, wanted_device

if TYPE_CHECKING:
    from powerdev.resources.ownership import Ledger

log = logging.getLogger(__name__)
EACH_DISK_WITH_PARTITIONS = (
    'a disk with partitions: in "each" mode its partitions are the units, '
    "so that two pods never share blocks"
)


class Tracker:
    def __init__(
        self,
        resource: ResourceConfig,
        inventory: Inventory,
        dev_root: Path,
        sys_root: Path,
        *,
        guard: HostUseGuard | None = None,
        udev: UdevDatabase | None = None,
        ledger: Ledger | None = None,
    ) -> None:
        self.resource = resource  # in force: what the published list was found under
        self._wanted = resource  # what the next rescan looks for (a reload may change it)
        self.inventory = inventory
        self.dev_root = dev_root
        self.sys_root = sys_root
        self._identity: dict[str, tuple[int, int]] = {}  # path -> numbers first seen there
        self.udev = udev  # udev's database, for properties and identities
        self._unmatched: dict[tuple[int, int], set[str]] = {}  # left out for properties
        self._scans = 0  # rescans running now
        self._scan_seq = 0  # rescans begun
        self._published_seq = 0  # the latest-begun rescan published
        self._during_scan: set[str] = set()  # paths events named while a rescan ran
        # Keeps devices the host uses out, unless the resource allows them
        # (None: no such screen).
        self.guard = guard
        # What it finds (screened for host use) before the node-wide ledger
        # rules on each device (ownership.py); the inventory holds the rulings.
        self.found: dict[str, Device] = dict(inventory.by_path)
        self._found_by_key = Index()  # key -> the paths found for it
        self._kept_back: dict[str, str] = {}  # path -> why, for paths left out here
        for device in inventory.by_path.values():
            self._identity[device.path] = (device.major, device.minor)
            self._found_by_key.add(device.key, device.path)
        self.ledger = ledger
        if ledger is not None:
            ledger.attach(resource.name, self.regate)

    async def rescan(self, resource: ResourceConfig | None = None) -> bool:
        """Discover everything again; True if the published list changed.
        With `resource` (a reload), discover under it and put it in force in
        the same step as the list it found.

        The scan (thousands of stat calls, and the host-use screen's reads of
        sysfs) runs in a worker thread. Events that arrive meanwhile are
        applied at once, and their paths probed again after the scan is
        published, since the scan may predate them. Rescans may overlap (an
        event, SIGHUP, the timer, a config change): one that began before
        the last published one is dropped, since it saw an older host and
        maybe an older config."""
        if resource is not None:
            self._wanted = resource  # every rescan begun from now on looks for it
        using = self._wanted
        self._scans += 1
        self._scan_seq += 1
        began = self._scan_seq
        try:
            found, unmatched = await trio.to_thread.run_sync(
                self._discover, using, dict(self.found)
            )
        finally:
            self._scans -= 1
        changed = False
        if began > self._published_seq:
            self._published_seq = began
            self.resource = using
            self._unmatched = {}
            for device in unmatched:
                self._unmatched.setdefault((device.major, device.minor), set()).add(device.path)
            changed = self._publish_scan(found)
        if self._during_scan and not self._scans:
            again, self._during_scan = self._during_scan, set()
            changed |= self._probe(again)
        return changed

    def _discover(
        self, resource: ResourceConfig, listed: dict[str, Device]
    ) -> tuple[tuple[Device, ...], list[Device]]:
        """In a worker thread: what the host has for this resource now, and
        the nodes left out for their udev properties."""
        unmatched: list[Device] = []
        found = discover(resource, self.dev_root, self.sys_root, self.udev, unmatched)
        if self.guard is not None:
            found = tuple(self.guard.screen(found, listed, allow=resource.allow_host_used))
        return found, unmatched

    def _publish_scan(self, found: tuple[Device, ...]) -> bool:
        present = {d.path for d in found}
        for path in list(self._identity):
            if path not in present:
                del self._identity[path]
        judged = [self._judge(d) for d in found]
        self._set_found({d.path: d for d in judged}, replace_all=True)
        ruled = [r for d in judged if (r := self._rule(d)) is not None]
        changed = self.inventory.publish(ruled)
        if self.ledger is not None:
            self.ledger.settle()
        return changed

    def _set_found(self, changes: dict[str, Device | None], *, replace_all: bool = False) -> None:
        """Record what was found at these paths (None: nothing), and tell the ledger."""
        found, by_key = self.found, self._found_by_key
        if replace_all and found:
            changes = {**dict.fromkeys(found), **changes}
        gone, came = [], []
        for path, device in changes.items():
            old = found.get(path)
            if old is not None:
                if (
                    device is not None
                    and old.key == device.key
                    and old.whole_disk == device.whole_disk
                ):
                    found[path] = device  # the same device, in the same place
                    continue
                gone.append(old)
                by_key.discard(old.key, path)
            if device is None:
                found.pop(path, None)
                self._kept_back.pop(path, None)
                if self.ledger is not None:
                    self.ledger.forget(self.resource.name, path)
                continue
            found[path] = device
            came.append(device)
            by_key.add(device.key, path)
        if self.ledger is not None and (gone or came):
            self.ledger.change(self.resource.name, gone, came)

    def _rule(self, device: Device) -> Device | None:
        """The device as advertised: as found, Unhealthy, or left out (None)."""
        listed = device.path in self.inventory.by_path
        if self.resource.allocation == "each" and device.has_partitions:
            why = f"{self.resource.name}: {device.path} is not offered: {EACH_DISK_WITH_PARTITIONS}"
            if self._kept_back.get(device.path) != why:
                self._kept_back[device.path] = why
                log.warning("%s", why)
            return replace(device, healthy=False) if listed else None
        if self._kept_back.pop(device.path, None) is not None:
            log.info("%s: %s is offered again", self.resource.name, device.path)
        if self.ledger is None:
            return device
        return self.ledger.rule(self.resource, device, listed=listed)

    def regate(self, keys: set[tuple[str, int, int]]) -> None:
        """Rule again on the devices found with these keys (the ledger asks)."""
        paths = [p for key in keys for p in self._found_by_key.get(key)]
        if not paths:
            return
        self.inventory.update({p: self._rule(self.found[p]) for p in paths})

    def apply(self, events: list[DeviceEvent]) -> bool:
        """Re-probe the paths these events name; True if the published list
        changed. Costs what the events touch, not what the resource holds.
        A listed path is always probed again: it may be gone, whatever the event."""
        listed = self.found
        paths: set[str] = set()
        for event in events:
            paths.update(
                p for p in event.paths if p in listed or wanted(self.resource, p, event.subsystem)
            )
            if event.number is not None:  # links we list to a node that changed
                for kind in "bc":
                    paths.update(self._found_by_key.get((kind, *event.number)))
                # and names left out for their udev properties, which may now match
                paths.update(self._unmatched.get(event.number, ()))
        paths.update(
            recheck_paths(self.guard, self.found, ((e.subsystem, e.number) for e in events))
        )
        if self._scans:
            # A rescan under new settings may predate a path that only they
            # want: probe it again once that rescan is published.
            later = {
                p
                for e in events
                for p in e.paths
                if self._wanted is not self.resource and wanted(self._wanted, p, e.subsystem)
            }
            self._during_scan |= paths | later
        if not paths:
            return False
        return self._probe(paths)

    def _probe(self, paths: set[str]) -> bool:
        changes: dict[str, Device | None] = {}
        for path in paths:
            probed = probe(self.dev_root, path)
            device = None
            if probed is not None and wanted_device(self.resource, probed):
                device = describe(self.resource, probed, self.sys_root, self.udev)
                unmatched = self._unmatched.setdefault((probed.major, probed.minor), set())
                if device is None:
                    unmatched.add(path)  # its properties do not match, yet
                else:
                    unmatched.discard(path)
            if device is None:
                self._identity.pop(path, None)
            else:
                device = self._judge(device)
            changes[path] = device
        changes = self._screen(changes)
        self._set_found(changes)
        changed = self.inventory.update(
            {p: self._rule(d) if d is not None else None for p, d in changes.items()}
        )
        if self.ledger is not None:
            self.ledger.settle()
        return changed

    def _screen(self, probed: dict[str, Device | None]) -> dict[str, Device | None]:
        """Control nodes not named literally, and devices the host uses, stay out."""
        kept = {
            path: device
            if device is None or control_allowed(device, self.resource.include, self.sys_root)
            else None
            for path, device in probed.items()
        }
        if self.guard is not None:
            listed = self.found
            kept = self.guard.screen_changes(kept, listed, allow=self.resource.allow_host_used)
        for path, device in probed.items():
            if device is not None and kept[path] is None:  # not listed after all
                self._identity.pop(path, None)
        return kept

    def _judge(self, device: Device) -> Device:
        first = self._identity.setdefault(device.path, (device.major, device.minor))
        return device if first == (device.major, device.minor) else replace(device, healthy=False)
