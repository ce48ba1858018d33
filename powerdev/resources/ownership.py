"""One device, one holder: which resource lists each device, and which unit
last granted it, across every resource of the node.

Trackers find devices by path, one resource each (resources/tracker.py). The
ledger sees them by what they are, kind and numbers, so every name of one
device is one key, and rules on each before a tracker advertises it:

- Overlap. A device that two resources list, or a block device one resource
  lists while another lists its whole disk or one of its partitions, goes
  to neither: left out where it was not advertised, Unhealthy where it was.
  At start and on reload the same finding is a config error
  (find_overlap()), so at run time it comes only from a change on the host
  (a new link, a new partition table).
- Ownership. The ledger remembers, for each device, the unit an Allocate
  answer last handed it out as: (resource, unit ID) in "each" mode, and
  (resource, any unit) in "all" mode, where every grant carries every
  device. A device that comes back as another unit (a LUN unmapped while held and
  another one mapped at its numbers, a device a reload moved to another
  resource, a new identity) is Unhealthy until the kubelet's PodResources
  API, asked after the change, says no pod holds the old unit: a container
  that held it keeps its cgroup rule for those numbers. While the kubelet
  cannot be asked, it waits: the safe side. The memory is the daemon's
  own: at start it holds what the kubelet says pods hold then.
- Across the two APIs. A device prepared for a ResourceClaim is owned by
  (resource, unit, DRA): a resource that lists it through the other API (a
  reload that changed "api", or moved the device) holds it Unhealthy until
  the claim is unprepared, which the PodResources API does not say. And a
  device a pod got through Allocate waits, under a resource that now hands
  it out through DRA, until the kubelet says no pod holds it. A resource
  with "api": "both" owns its units through either API (the Plugin keeps
  the two sides apart: resources/plugin.py).

Plain data on the Trio thread; the one wait (for the kubelet) is
Ledger.follow_pods(), run in the supervisor's nursery.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import trio

from powerdev.config import Config, ConfigError, ResourceConfig
from powerdev.devices.model import Device
from powerdev.devices.udevdb import UdevDatabase
from powerdev.resources.index import Index
from powerdev.resources.matching import discover

log = logging.getLogger(__name__)

Key = tuple[str, int, int]  # kind, major, minor


def describe_key(key: Key) -> str:
    return f"{'block' if key[0] == 'b' else 'char'} {key[1]}:{key[2]}"


DEVICE_PLUGIN, DRA = "device-plugin", "dra"  # through which API a holder got it


@dataclass(frozen=True, slots=True)
class Holder:
    resource: str
    unit: str | None  # None: any unit of the resource ("all" mode)
    api: str = DEVICE_PLUGIN

    def __str__(self) -> str:
        through = "a ResourceClaim" if self.api == DRA else "the device plugin API"
        if self.unit is None:
            return f"any unit of {self.resource} (through {through})"
        return f"unit {self.unit} of {self.resource} (through {through})"

    def serves(self, resource: ResourceConfig, unit: str | None) -> bool:
        """Is this the holder `resource` would grant the unit as?"""
        same_api = self.api == resource.api or resource.both
        return self.resource == resource.name and self.unit == unit and same_api


@dataclass(slots=True)
class _Wait:
    old: Holder
    since: int  # the ask count when the wait began: only a later answer ends it


Regate = Callable[[set[Key]], None]


class Ledger:
    def __init__(self) -> None:
        self._listers = Index()  # key -> the resources listing it
        self._paths = Index()  # (key, resource) -> its paths, where more than one
        self._names: dict[Key, str] = {}  # a path of each listed key, for messages
        self._disk_of: dict[Key, Key] = {}  # listed partition -> its whole disk
        self._parts_of: dict[Key, set[Key]] = {}  # whole disk -> its listed partitions
        self._owners: dict[Key, Holder] = {}
        self.waiting: dict[Key, _Wait] = {}
        self._asks = 0  # PodResources asks begun
        # keys whose rulings may have changed -> the resource whose own
        # change it was (it has ruled on it since; the others must), if any
        self._dirty: dict[Key, str | None] = {}
        self._trackers: dict[str, Regate] = {}
        self._said: dict[tuple[str, str], str] = {}  # (resource, path) -> what was logged
        self._wake = trio.Event()

    # --- who lists what ---------------------------------------------------

    def attach(self, resource: str, regate: Regate) -> None:
        """A resource's tracker: told to rule again on the keys others changed."""
        self._trackers[resource] = regate

    def detach(self, resource: str) -> None:
        """A resource no longer served: its listings go, its ownerships stay."""
        self._trackers.pop(resource, None)
        for key in self._listers.keys():
            if self._listers.discard(key, resource):
                self._paths.forget((key, resource))
                self._mark(key, resource)
                if key not in self._listers:
                    self._drop(key)
        self._said = {k: v for k, v in self._said.items() if k[0] != resource}
        self.settle()

    def change(self, resource: str, gone: Iterable[Device], came: Iterable[Device]) -> None:
        """A tracker's found list changed: `gone` devices left it, `came` joined."""
        for device in gone:
            key = device.key
            if self._paths.discard((key, resource), device.path):
                continue  # another name of it is still listed
            others = self._paths.get((key, resource))
            if others:  # so is the first name's stand-in
                self._paths.discard((key, resource), others[0])
                continue
            if self._listers.discard(key, resource):
                self._mark(key, resource)
                if key not in self._listers:
                    self._drop(key)
        for device in came:
            key = device.key
            if device.whole_disk is not None:
                disk: Key = ("b", *device.whole_disk)
                self._disk_of[key] = disk
                self._parts_of.setdefault(disk, set()).add(key)
            if self._listers.add(key, resource):
                self._names.setdefault(key, device.path)
                self._mark(key, resource)
            else:
                self._paths.add((key, resource), device.path)

    def _drop(self, key: Key) -> None:
        self._names.pop(key, None)
        disk = self._disk_of.pop(key, None)
        if disk is not None:
            parts = self._parts_of.get(disk)
            if parts is not None:
                parts.discard(key)
                if not parts:
                    del self._parts_of[disk]

    def _mark(self, key: Key, by: str | None = None) -> None:
        """Rulings on this key and on its disk's and partitions' may change.
        `by`: the resource whose listing changed, which rules on these keys
        itself right after; every other resource must rule again."""
        for each in (key, self._disk_of.get(key), *self._parts_of.get(key, ())):
            if each is not None:
                self._dirty[each] = by

    def name_of(self, key: Key) -> str | None:
        return self._names.get(key)

    def rivals(self, resource: str, device: Device) -> list[str]:
        """The other resources that list this device or overlapping blocks, as phrases."""
        found = [
            f"{other} lists it too" for other in self._listers.get(device.key) if other != resource
        ]
        if device.whole_disk is not None:
            disk: Key = ("b", *device.whole_disk)
            found += [
                f"{other} lists its whole disk {self._names.get(disk, describe_key(disk))}"
                for other in self._listers.get(disk)
                if other != resource
            ]
        for part in sorted(self._parts_of.get(device.key, ())):
            found += [
                f"{other} lists its partition {self._names.get(part, describe_key(part))}"
                for other in self._listers.get(part)
                if other != resource
            ]
        return found

    # --- the ruling -------------------------------------------------------

    def rule(self, resource: ResourceConfig, device: Device, *, listed: bool) -> Device | None:
        """The device as `resource` may advertise it: as found, Unhealthy,
        or None (left out). `listed`: it is advertised now."""
        key = device.key
        if (
            not self._listers.several(key)
            and key not in self._disk_of
            and key not in self._parts_of
            and key not in self._owners
            and not self._said
        ):
            return device  # the common case: nothing to rule on
        rivals = self.rivals(resource.name, device)
        if rivals:
            self._say(
                resource.name,
                device.path,
                f"{device.path} ({describe_key(device.key)}) is not offered by "
                f"{resource.name}: {'; '.join(rivals)}. A device belongs to one resource only",
            )
            return replace(device, healthy=False) if listed else None
        unit = device.id if resource.allocation == "each" else None
        owner = self._owners.get(device.key)
        if owner is not None and not owner.serves(resource, unit):
            wait = self.waiting.get(device.key)
            if wait is None or wait.old != owner:
                self.waiting[device.key] = _Wait(owner, self._asks)
                if owner.api != DRA:
                    self._wake.set()
            until = (
                "until that claim is unprepared"
                if owner.api == DRA
                else "until the kubelet says no pod holds that"
            )
            mine = "any unit" if unit is None else f"unit {unit}"
            self._say(
                resource.name,
                device.path,
                f"{device.path} ({describe_key(device.key)}) waits in {resource.name} as "
                f"{mine}: it was granted as {owner}, and {until}, a pod may still reach it",
            )
            return replace(device, healthy=False)
        self.waiting.pop(device.key, None)
        if self._said.pop((resource.name, device.path), None) is not None:
            log.info("%s: %s is offered again", resource.name, device.path)
        return device

    def granted(self, resource: str, unit: str | None, devices: Iterable[Device]) -> None:
        """An Allocate answer handed these devices out as `unit` of `resource`
        (None: "all" mode, where every unit carries them all)."""
        holder = Holder(resource, unit)
        for device in devices:
            self._owners[device.key] = holder

    def claimed(self, resource: str, unit: str, keys: Iterable[Key]) -> None:
        """A claim was prepared with this unit of `resource` (these device numbers)."""
        holder = Holder(resource, unit, DRA)
        for key in keys:
            if self._owners.get(key) != holder:
                self._owners[key] = holder
                self._mark(key)  # every resource rules again: its own ruled before
        self.settle()

    def unclaimed(self, resource: str, unit: str, keys: Iterable[Key]) -> None:
        """That claim is unprepared: whoever waited for the device waits no more."""
        holder = Holder(resource, unit, DRA)
        for key in keys:
            if self._owners.get(key) == holder:
                del self._owners[key]
                wait = self.waiting.get(key)
                if wait is not None and wait.old == holder:
                    log.info(
                        "%s: %s is unprepared",
                        self._names.get(key, describe_key(key)),
                        holder,
                    )
                    del self.waiting[key]
                self._mark(key)
        self.settle()

    def _say(self, resource: str, path: str, text: str) -> None:
        if self._said.get((resource, path)) != text:
            self._said[(resource, path)] = text
            log.warning("%s", text)

    def forget(self, resource: str, path: str) -> None:
        """The resource no longer finds this path: what was said of it is done."""
        self._said.pop((resource, path), None)

    def settle(self) -> None:
        """Have every tracker rule again on the keys whose rulings may have changed."""
        while self._dirty:
            dirty, self._dirty = self._dirty, {}
            for name, regate in list(self._trackers.items()):
                keys = {key for key, excused in dirty.items() if excused != name}
                if keys:
                    regate(keys)

    # --- waiting for the kubelet -----------------------------------------

    def answered(self, held: dict[str, set[str]], asked: int) -> None:
        """What pods hold, per the kubelet, in an answer to ask number `asked`:
        end the waits that began before it and whose old unit no pod holds."""
        for key, wait in list(self.waiting.items()):
            if wait.since >= asked or wait.old.api == DRA:
                continue  # began after the question was put (the answer may predate
                # it), or a claim holds it: the kubelet's PodResources cannot say
            ids = held.get(wait.old.resource, set())
            still = bool(ids) if wait.old.unit is None else wait.old.unit in ids
            if not still:
                log.info(
                    "%s: the kubelet says no pod holds %s any more",
                    self._names.get(key, describe_key(key)),
                    wait.old,
                )
                del self.waiting[key]
                if self._owners.get(key) == wait.old:
                    del self._owners[key]
                self._mark(key)
        self.settle()

    async def follow_pods(
        self, ask: Callable[[], Awaitable[dict[str, set[str]] | None]], interval: float
    ) -> None:
        """While a device waits, ask the kubelet what pods hold: at once,
        then every `interval` seconds."""
        while True:
            if not self.asks_kubelet():
                await self._wake.wait()
            self._wake = trio.Event()
            self._asks += 1
            asked = self._asks
            held = await ask()
            if held is not None:
                self.answered(held, asked)
            if self.asks_kubelet():
                with trio.move_on_after(interval):
                    await self._wake.wait()

    def asks_kubelet(self) -> bool:
        """Does a device wait for what the kubelet's PodResources can say?"""
        return any(w.old.api != DRA for w in self.waiting.values())


# --- at start and reload -------------------------------------------------------


OVERLAP_FIX = (
    "a device belongs to one resource only: narrow include-devices, add "
    "exclude-devices, or tell them apart with match-properties"
)


def check_devices(
    config: Config, dev_root: Path, sys_root: Path, udev: UdevDatabase | None = None
) -> None:
    """ConfigError if two resources of the config would list one device
    (find_overlap); run at start, on reload and by `powerdev scan`."""
    clash = find_overlap(config.resources, dev_root, sys_root, udev)
    if clash is not None:
        index, what = clash
        raise ConfigError(config.source, f"resources[{index}]", what, OVERLAP_FIX)


def find_overlap(
    resources: Sequence[ResourceConfig],
    dev_root: Path,
    sys_root: Path,
    udev: UdevDatabase | None = None,
) -> tuple[int, str] | None:
    """The first device two resources would both list (by kind and numbers,
    whatever the names), or a block device one lists while another lists its
    whole disk or a partition of it: (index of the later resource, what
    clashes). None if there is none. Devices the host uses count too: the
    host may let go of them."""
    if len(resources) < 2:
        return None  # one resource cannot overlap itself: no look needed
    ledger = Ledger()
    for i, resource in enumerate(resources):
        found = discover(resource, dev_root, sys_root, udev)
        for device in found:
            rivals = ledger.rivals(resource.name, device)
            if rivals:
                also = ledger.name_of(device.key)
                named = f", as {also}" if also not in (None, device.path) else ""
                return i, (
                    f"{resource.name} matches {device.path} ({describe_key(device.key)}) "
                    f"and {'; '.join(rivals)}{named}"
                )
        ledger.change(resource.name, (), found)
    return None
