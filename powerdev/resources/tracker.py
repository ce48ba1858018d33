"""One resource's view of the node's device table: the names its patterns
and properties reach, each ruled on by the one verdict (verdict.py), and
published to its inventory, which pushes the list to every ListAndWatch
stream.

Two ways in. A rescan (at start, every scan-interval with the `time`
strategy, on a reload or when events were lost) globs the resource's
patterns and has the table survey what they name, in a worker thread.
Device events are applied to the table once for the node (the
supervisor), and each tracker follows what changed (follow()): the names
whose device changed and the devices whose facts or family changed. Either
way the cost is what changed, not what the resource holds.

A name that vanishes is removed from the list, and is listed again,
Healthy, when it returns. A name that now reaches a different device
(another major:minor) is Unhealthy: it is not the device the kubelet
handed out under that ID. It turns Healthy again once the original device
is back under that name, or once the name goes away and returns (udev
removes and re-adds a re-created map's links), or after a restart.

In "all" mode every name of one device is one unit, named after the
kernel's node where the resource lists it, else its shortest name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path

import trio

from powerdev.config import ResourceConfig
from powerdev.devices import gomatch, special
from powerdev.devices.condition import Condition
from powerdev.devices.events import DeviceEvent
from powerdev.devices.family import Key
from powerdev.devices.inventory import Inventory
from powerdev.devices.model import Device
from powerdev.devices.table import Changes, DeviceTable, HostFiles
from powerdev.devices.udevdb import UdevDatabase
from powerdev.resources.index import Index
from powerdev.resources.matching import (
    candidates,
    describe,
    literal_only,
    properties_ok,
    shared_id,
    wanted,
    wanted_key,
)
from powerdev.resources.ownership import Ledger, describe_key
from powerdev.resources.verdict import LEFT_OUT, OFFER, OFFERED, Case, Verdict, judge

log = logging.getLogger(__name__)
STEP = 250  # names ruled on in one Trio step of a rescan (about 8 ms)


class Tracker:
    def __init__(
        self,
        resource: ResourceConfig,
        inventory: Inventory,
        dev_root: Path,
        sys_root: Path,
        *,
        table: DeviceTable | None = None,
        host: HostFiles | None = None,
        udev: UdevDatabase | None = None,
        ledger: Ledger | None = None,
        on_survey: Callable[[Changes], None] | None = None,
    ) -> None:
        self.resource = resource  # in force: what the published list was found under
        self._wanted = resource  # what the next rescan looks for (a reload may change it)
        self.inventory = inventory
        self.dev_root = dev_root
        self.sys_root = sys_root
        # the node's table, or (a tracker on its own, in tests) one of its own
        self.table = table or DeviceTable(dev_root, sys_root, udev=udev, host=host)
        self.ledger = ledger
        self._mine: dict[str, Key] = {}  # the names it looks at -> what they reach
        self.found: dict[str, Device] = {}  # the names it lists, as described
        self._by_key = Index()  # key -> its names in found
        # name -> the device first seen there, where another is there now
        # (nearly every name keeps its first device: those are not stored)
        self._first: dict[str, Key] = {}
        self._said: dict[str, Verdict] = {}  # name -> the verdict last logged, when not offered
        # names events redid while rescans publish in steps: one set for each
        # rescan under way (two may overlap), none when no rescan publishes
        self._fresh: list[set[str]] = []
        self._scan_seq = 0  # rescans begun
        self._published_seq = 0  # the latest-begun rescan published
        self.detached = False  # no longer served: publishes nothing more
        # what a survey of its changed for the others (the node's other trackers)
        self._on_survey = on_survey
        if ledger is not None:
            ledger.attach(self)  # until a Plugin speaks for it

    # --- rescans --------------------------------------------------------------

    async def rescan(self, resource: ResourceConfig | None = None) -> bool:
        """Look at everything the resource's patterns reach again; True if
        the published list changed. With `resource` (a reload), look under
        it and put it in force in the same step as the list it found.

        The glob and the table's survey run in a worker thread. Rescans
        may overlap (an event, SIGHUP, the timer, a config change): one
        that began before the last published one is dropped, since it saw
        an older host and maybe an older config. Names that events brought
        while it ran are kept: the table has them, fresher."""
        if resource is not None:
            self._wanted = resource  # every rescan begun from now on looks for it
        using = self._wanted
        self._scan_seq += 1
        began = self._scan_seq
        paths = await trio.to_thread.run_sync(self._glob, using)
        # the names it lists now too: one may be gone, with no event to say so
        candidates = list(dict.fromkeys([*paths, *self._mine]))
        changes = await self.table.survey(candidates)
        if self.detached or began <= self._published_seq:
            self._follow_others(changes)
            return False
        self._published_seq = began
        changed = await self._publish_in_steps(using, candidates)
        await trio.lowlevel.checkpoint()  # the list was put in force in the step before
        self._follow_others(changes)
        return changed

    async def _publish_in_steps(self, using: ResourceConfig, candidates: list[str]) -> bool:
        """Rule on every candidate under `using`, STEP names a Trio step (at
        10,000 devices one step would hold the thread for hundreds of ms),
        then put the settings and the whole list in force at once: no
        Allocate sees the new settings with the old list, or the other way.
        What events redo meanwhile is fresher, and kept."""
        rulings: dict[str, Device | None] = {}
        fresh: set[str] = set()
        self._fresh.append(fresh)
        try:
            for start in range(0, len(candidates), STEP):
                await trio.lowlevel.checkpoint()  # the survey's adoption came before
                chunk = {p: self.table.key_of(p) for p in candidates[start : start + STEP]}
                in_force, self.resource = self.resource, using  # for this step only
                try:
                    rulings.update(self._rulings(chunk))
                finally:
                    self.resource = in_force
        finally:
            self._fresh = [f for f in self._fresh if f is not fresh]
        for path in fresh:
            rulings.pop(path, None)
        gone = [p for p in self.inventory.by_path if p not in self.found and p not in fresh]
        rulings.update(dict.fromkeys(gone))
        self.resource = using
        return self.inventory.update(rulings)

    def _glob(self, resource: ResourceConfig) -> list[str]:
        """In a worker thread: the names the resource's patterns reach now."""
        return [
            p
            for p in dict.fromkeys(candidates(resource, self.dev_root, self.sys_root))
            if not any(gomatch.match(x, p) for x in resource.exclude)
        ]

    def _follow_others(self, changes: Changes) -> None:
        """What a survey changed, for the other resources of the node."""
        if self._on_survey is not None and changes:
            self._on_survey(changes)
        if self.ledger is not None:
            self.ledger.settle()

    # --- events -----------------------------------------------------------------

    def apply(self, events: list[DeviceEvent]) -> bool:
        """A tracker on its own: apply events to its table, then follow them.
        (In the daemon the supervisor applies a batch to the node's table
        once, and every tracker follows.)"""
        changes = apply_events(self.table, events, [self])
        changed = self.follow(changes)
        if self.ledger is not None:
            self.ledger.settle()
        return changed

    def wants(self, path: str, subsystem: str) -> bool:
        """Is this a name the resource (or the settings a rescan is looking
        under) would look at?"""
        return (
            path in self._mine
            or wanted(self.resource, path, subsystem)
            or (self._wanted is not self.resource and wanted(self._wanted, path, subsystem))
        )

    def follow(self, changes: Changes) -> bool:
        """Rule again on what the table's change touched; True if the
        published list changed."""
        if self.detached or not changes:
            return False
        redo: dict[str, Key | None] = {}
        for path in changes.paths:
            key = self.table.key_of(path)
            if path in self._mine or (key is not None and self._wants_key(path, key)):
                redo[path] = key
        for key in changes.keys:
            for path in self._paths_of(key):
                redo[path] = self.table.key_of(path)
        if not redo:
            return False
        changed = self._redo(redo)
        if not changed and self.resource.dra and any(k in self._by_key for k in changes.keys):
            # the same list, but a device's own health (a taint) or its family
            # (the pool's counters, or what it publishes apart) may have
            # changed: its DRA pool is built again (dra/slices.py)
            self.inventory.publish(self.inventory.current.devices, force=True)
        return changed

    def _wants_key(self, path: str, key: Key) -> bool:
        return wanted_key(self.resource, path, key) or (
            self._wanted is not self.resource and wanted_key(self._wanted, path, key)
        )

    def _paths_of(self, key: Key) -> tuple[str, ...]:
        """The names it looks at that reach this device."""
        found = self._by_key.get(key)
        if found:
            return found
        return tuple(p for p in self.table.names(key) if self._mine.get(p) == key)

    # --- the lists ----------------------------------------------------------------

    def _redo(self, paths: dict[str, Key | None], *, replace_all: bool = False) -> bool:
        """Describe these names again, list them in the ledger, and publish
        their verdicts (with replace_all, these are all its names)."""
        if replace_all:
            paths = {**dict.fromkeys(self._mine), **paths}
        for fresh in self._fresh:  # rescans publishing in steps: this is fresher
            fresh.update(paths)
        rulings = self._rulings(paths)
        if replace_all:
            gone = [p for p in self.inventory.by_path if p not in self.found]
            rulings.update(dict.fromkeys(gone))
        return self.inventory.update(rulings)

    def _rulings(self, paths: dict[str, Key | None]) -> dict[str, Device | None]:
        """What these names are advertised as now (their state updated)."""
        reached: dict[str, Key | None] = {}
        touched: set[Key] = set()
        for path, key in paths.items():
            old = self._mine.get(path)
            if old is not None:
                touched.add(old)
            if key is None or not self._wants_key(path, key):
                self._mine.pop(path, None)
                self._first.pop(path, None)
                reached[path] = None
                continue
            if old is not None and old != key:  # another device under the name now
                first = self._first.setdefault(path, old)
                if first == key:  # the first one is back
                    del self._first[path]
            self._mine[path] = key
            touched.add(key)
            reached[path] = key if properties_ok(self.resource, key, self.table) else None
        for path, key in reached.items():
            old = self.found.pop(path, None)
            if old is not None:
                self._by_key.discard(old.key, path)
            if key is None:
                self._said.pop(path, None)
            else:
                self._by_key.add(key, path)
        self._list(touched)
        ids = self._all_mode_ids(touched)
        redo = dict.fromkeys(p for p, k in reached.items() if k is not None)
        for key in ids:  # the other names of a device whose "all"-mode ID may have changed
            redo.update(dict.fromkeys(self._by_key.get(key)))
        rulings: dict[str, Device | None] = {p: None for p, k in reached.items() if k is None}
        for path in redo:
            key = self._mine[path]
            device = describe(self.resource, key, path, self.table, unit=ids.get(key))
            self.found[path] = device
            rulings[path] = self._rule(device)
        return rulings

    def _list(self, keys: Iterable[Key]) -> None:
        """The ledger hears which devices it reaches (host use aside)."""
        if self.ledger is None:
            return
        for key in keys:
            reached = any(
                literal_only(self.resource, p, key, self.table) is None
                and (self.resource.allow_host_used or self.table.facts(key).host_use is None)
                for p in self._by_key.get(key)
            )
            listed = self.ledger.lists(self.resource.name, key)
            if reached and not listed:
                self.ledger.add_listing(self.resource.name, key, min(self._by_key.get(key)))
            elif not reached and listed:
                self.ledger.drop_listing(self.resource.name, key)

    def _all_mode_ids(self, keys: Iterable[Key]) -> dict[Key, str]:
        """ "all" mode: one ID for every name of a device (only devices with
        several names need asking: one name's ID is its own)."""
        if self.resource.allocation == "each":
            return {}
        ids = {}
        for key in keys:
            names = self._by_key.get(key)
            if len(names) > 1:
                ids[key] = shared_id(names, self.table.facts(key).kernel_name)
        return ids

    def _rule(self, device: Device | None) -> Device | None:
        """The device as advertised: as found, Unhealthy, or left out (None)."""
        if device is None:
            return None
        verdict = self.verdict(device)
        path = device.path
        said = self._said.get(path)
        if verdict != said and not (said is None and verdict.offered):
            name = self.resource.name
            if verdict.offered:
                log.info("%s: %s is offered again", name, path)
                self._said.pop(path, None)
            else:
                what = "left out" if verdict.state == LEFT_OUT else "is Unhealthy"
                log.warning("%s: %s %s: %s", name, path, what, verdict.reason)
                self._said[path] = verdict
        if verdict.state == OFFERED:
            return device
        if verdict.state == LEFT_OUT:
            return None
        return sick(device)

    def verdict(
        self, device: Device, *, listed: bool | None = None, health: bool = True
    ) -> Verdict:
        """The one verdict (verdict.py) on one of its names, now. Without
        `health`, as if its own state said nothing (would it be offered but
        for a failure? DRA publishes such a device tainted)."""
        key, path, resource = device.key, device.path, self.resource
        facts = self.table.facts(key)
        failed = facts.condition.failed and health
        first = self._first.get(path, key)
        if (
            first == key
            and facts.literal_only is None
            and (facts.host_use is None or resource.allow_host_used)
            and not (facts.has_partitions and resource.partitions_only)
            and not failed
            and facts.no_medium is None
            and (self.ledger is None or self.ledger.quiet(key, resource.name))
            and special.by_path(key[0], path) is None
        ):
            return OFFER  # the common case: nothing to rule on, at a few lookups
        renumbered = None
        if first != key:
            renumbered = (
                f"it now reaches {describe_key(key)}, not {describe_key(first)}, which the "
                "kubelet was told of under its ID"
            )
        rivals: list[str] = []
        held = None
        if self.ledger is not None:
            rivals = self.ledger.rivals(resource.name, key, path)
            unit = device.id if resource.allocation == "each" else None
            blocked = self.ledger.blocking(key, resource, unit)
            if blocked is not None:
                held = self.ledger.why_held(key, *blocked)
        case = Case(
            literal_only=literal_only(resource, path, key, self.table),
            named_literally=False,
            host_use=facts.host_use,
            allow_host_used=resource.allow_host_used,
            each=resource.partitions_only,
            has_partitions=facts.has_partitions,
            no_medium=facts.no_medium,
            failed=facts.condition.why if failed else None,
            renumbered=renumbered,
            rivals=rivals,
            held=held,
        )
        if listed is None:
            listed = path in self.inventory.by_path
        return judge(case, listed=listed)

    def condition_of(self, device: Device) -> Condition:
        """What the device says of its own health (condition.py)."""
        return self.table.facts(device.key).condition

    def offered_but_for_failure(self, device: Device) -> bool:
        """Would this name be offered if the device had not failed?"""
        return self.verdict(device, health=False).offered

    def left_out(self) -> dict[str, str]:
        """The names it finds and leaves out, with why (as last logged)."""
        return {
            p: v.reason for p, v in self._said.items() if v.state == LEFT_OUT and p in self.found
        }

    # --- what the ledger asks -------------------------------------------------------

    def regate(self, keys: set[Key]) -> None:
        """Rule again on the devices it lists with these keys."""
        if self.detached:
            return
        paths = [p for key in keys for p in self._by_key.get(key)]
        if paths:
            self.inventory.update({p: self._rule(self.found[p]) for p in paths})

    def keys_of(self, unit: str | None) -> list[Key]:
        devices = self.inventory.current.devices
        return sorted({d.key for d in devices if unit is None or d.id == unit})

    def sides_changed(self) -> None:
        """A "both" resource: what each API holds changed; every stream and
        the pool see it."""
        self.inventory.publish(self.inventory.current.devices, force=True)

    def detach(self) -> None:
        """No longer served: nothing it finds from now on is published or listed."""
        self.detached = True
        if self.ledger is not None:
            self.ledger.detach(self.resource.name)


def sick(device: Device) -> Device:
    """The device, Unhealthy (dataclasses.replace costs ten times as much)."""
    return Device(
        device.id,
        device.path,
        device.kind,
        device.major,
        device.minor,
        False,
        device.numa,
        device.identity,
        device.whole_disk,
        device.has_partitions,
        device.facts,
        device.key,
    )


def apply_events(
    table: DeviceTable, events: list[DeviceEvent], trackers: Iterable[Tracker]
) -> Changes:
    """Apply a batch of device events to the node's table, once: look again
    at the names the events give that any resource wants or the table
    knows, and at the names of the devices they number; read sysfs again
    for the devices they touch (for a block device, every device joined to
    it)."""
    trackers = list(trackers)
    paths: set[str] = set()
    block: list[tuple[int, int] | None] = []
    char: list[tuple[int, int]] = []
    for event in events:
        for path in event.paths:
            if table.knows(path) or any(t.wants(path, event.subsystem) for t in trackers):
                paths.add(path)
        if event.number is not None:
            for kind in "bc":
                paths.update(table.names((kind, *event.number)))
        if event.subsystem == "block":
            block.append(event.number)
        elif event.number is not None:
            char.append(event.number)
    with table.one_look():  # the batch's look and events: sysfs read once
        changes = table.look(paths)
        changes |= table.touched(e.number for e in events if e.number is not None)
        if block:
            changes |= table.device_changed("b", block)
        if char:
            changes |= table.device_changed("c", char)
    return changes
