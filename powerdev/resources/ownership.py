"""One ledger of every holder: which resources list each device, and who
holds it, across every resource of the node and both APIs.

The device table (devices/table.py) knows each device by what it is (kind
and numbers) and its family: the devices that share its blocks. The ledger
keeps, per device:

- Who lists it: the resources whose patterns reach it, under any name. A
  device that two resources list, or whose family another resource lists
  (a disk and its partition, a disk and its sg alias), goes to neither
  (verdict.py). At start and on reload the same finding is a config error
  (find_overlap()), so at run time it comes only from a change on the host.
- Who holds it, one holder a device: a unit of a resource through the
  device plugin API (Allocate handed it out: in "each" mode the unit, in
  "all" mode any unit, since every grant carries every device), or a
  ResourceClaim through DRA (its UID; a claim with admin access is no holder).
  Inside one family there is never more than one holder: while a device is
  held, the other devices of its family (its partitions, new ones
  included; its aliases; its disk) are Unhealthy under any other holder,
  and NodePrepareResources refuses them.

A unit handed out through the device plugin API is held until the kubelet's
PodResources API, asked after the grant settled, lists no pod holding it
(while it lists some, the ledger keeps their names: a device that waits
for the unit says which pods it waits for);
the ledger asks while something waits for a holder to let go, every recheck
interval (follow_pods). What pods held before this daemon started is what
the kubelet says then; until it has answered once, every device a resource
lists through the device plugin API at start counts as held by the unit it
was listed as (provisional), so a device that changes meanwhile waits: the
safe side. The kubelet is asked again until it answers. A claim holds its
devices until it is unprepared, which PodResources does not say.

A resource with "api": "both" serves one holder across its two sides: a
unit a claim holds is Unhealthy on its device plugin side, and a unit pods
hold is not offered to DRA (held_units()).

Plain data on the Trio thread; the one wait (for the kubelet) is
Ledger.follow_pods(), run in the supervisor's nursery.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import trio

from powerdev.config import Config, ConfigError, ResourceConfig
from powerdev.devices.table import DeviceTable, describe_key
from powerdev.devices.udevdb import UdevDatabase
from powerdev.resources.index import Index
from powerdev.resources.matching import candidates, reaches

log = logging.getLogger(__name__)

Key = tuple[str, int, int]  # kind, major, minor
DEVICE_PLUGIN, DRA = "device-plugin", "dra"  # through which API a holder got it
# The claim of the one holder that every claim of a shared LUN's unit is
# ("shared": true): they hold it together, and nothing else does meanwhile.
SHARED_CLAIMS = "*"
# What the kubelet's PodResources says: resource name -> device ID -> the
# pods ("namespace/name") that hold it.
PodsSay = Mapping[str, Mapping[str, Collection[str]]]
# Pods named in a message before "and N more".
PODS_NAMED = 3
# Seconds from an Allocate answer to the kubelet's PodResources surely
# listing the grant (it records it as it reads the answer).
GRANT_SETTLES = 1.0
COMPACT_AFTER = 1000  # holders released by one answer that make the ledger's tables compact


@dataclass(frozen=True, slots=True)
class Holder:
    resource: str
    unit: str | None  # None: any unit of the resource ("all" mode)
    api: str = DEVICE_PLUGIN
    claim: str | None = None  # the ResourceClaim's UID (DRA)

    def __str__(self) -> str:
        if self.api == DRA:
            if self.claim == SHARED_CLAIMS:
                through = "the ResourceClaims that share it"
            elif self.claim:
                through = f"ResourceClaim {self.claim}"
            else:
                through = "a ResourceClaim"
        else:
            through = "the device plugin API"
        if self.unit is None:
            return f"any unit of {self.resource} (through {through})"
        return f"unit {self.unit} of {self.resource} (through {through})"

    def serves(self, resource: ResourceConfig, unit: str | None) -> bool:
        """Is this the holder `resource` would grant the unit as? (A "both"
        resource's two sides are one holder here; held_units() splits them.)"""
        same_api = self.api == resource.api or resource.both
        return self.resource == resource.name and self.unit == unit and same_api


class View(Protocol):
    """What the ledger asks of a resource's tracker."""

    @property
    def resource(self) -> ResourceConfig: ...

    def regate(self, keys: set[Key]) -> None:
        """Rule again on the devices it finds with these keys."""

    def keys_of(self, unit: str | None) -> list[Key]:
        """Its devices of this unit (None: every device it lists)."""

    def sides_changed(self) -> None:
        """What either API of a "both" resource holds changed."""


class Ledger:
    def __init__(self, table: DeviceTable | None = None) -> None:
        self.table = table
        self._listers = Index()  # key -> the resources that list it
        self._named: dict[tuple[Key, str], str] = {}  # (key, resource) -> a name it lists it by
        self._holds: dict[Key, Holder] = {}
        self._by_holder = Index()  # holder -> its keys
        self._at: dict[Holder, float] = {}  # when a holder last got its devices (trio time)
        self._provisional: set[Holder] = set()  # holders from start, until the kubelet says
        self._pods: dict[Holder, tuple[str, ...]] = {}  # device plugin holders -> their pods
        self._units: dict[tuple[str, str], dict[str, int]] = {}  # (resource, api) -> unit -> keys
        self._waits: dict[Holder, float] = {}  # holders something waits for -> since
        # keys whose rulings may have changed -> the one resource that has ruled
        # on them since (its own listing: it rules right after), or None
        self._dirty: dict[Key, str | None] = {}
        self._sides: set[str] = set()  # resources whose held units changed
        self._views: dict[str, View] = {}
        self._wake = trio.Event()
        self.known = False  # the kubelet has said once what pods hold

    # --- who lists what ---------------------------------------------------

    def attach(self, view: View) -> None:
        self._views[view.resource.name] = view

    def detach(self, resource: str) -> None:
        """A resource no longer served: its listings go, its holds stay."""
        self._views.pop(resource, None)
        for key in self._listers.keys():
            if self._listers.discard(key, resource):
                self._named.pop((key, resource), None)
                self._mark(key)
        self.settle()

    def add_listing(self, resource: str, key: Key, path: str) -> None:
        """The resource lists this device (under `path`, among its names);
        it rules on it itself right after, the others must again."""
        first = self.table.names(key) if self.table is not None else ()
        if not first or first[0] != path:  # kept only where a message needs it
            self._named[(key, resource)] = path
        if self._listers.add(key, resource):
            self._mark(key, resource)

    def lists(self, resource: str, key: Key) -> bool:
        return resource in self._listers.get(key)

    def drop_listing(self, resource: str, key: Key) -> None:
        self._named.pop((key, resource), None)
        if self._listers.discard(key, resource):
            self._mark(key, resource)

    def _family(self, key: Key) -> frozenset[Key]:
        return self.table.overlapping(key) if self.table is not None else frozenset()

    def _mark(self, key: Key, by: str | None = None) -> None:
        """Rulings on this device and its family may change (`by`: the
        resource whose own change it was, which rules on them itself)."""
        for each in (key, *self._family(key)):
            self._dirty[each] = by if self._dirty.get(each, by) == by else None

    def _dirty_all(self, keys: Iterable[Key]) -> None:
        for key in keys:
            self._dirty[key] = None

    def name_of(self, key: Key, resource: str | None = None) -> str:
        """A name of the device: the one `resource` lists it by, if it does."""
        named = self._named.get((key, resource)) if resource is not None else None
        if named is not None:
            return named
        names = self.table.names(key) if self.table is not None else ()
        return names[0] if names else describe_key(key)

    def rivals(self, resource: str, key: Key, path: str | None = None) -> list[str]:
        """The other resources that list this device or its family, as phrases."""
        found = []
        for other in sorted(self._listers.get(key)):
            if other != resource:
                name = self.name_of(key, other)
                named = f", as {name}" if path is not None and name != path else ""
                found.append(f"{other} lists it too{named}")
        for kin in sorted(self._family(key)):
            for other in sorted(self._listers.get(kin)):
                if other != resource:
                    found.append(f"{other} lists {self._relation(key, kin, other)}")
        return found

    def _relation(self, key: Key, kin: Key, lister: str | None = None) -> str:
        name = self.name_of(kin, lister)
        how = self.table.relation(key, kin) if self.table is not None else "same"
        return {
            "disk": f"its whole disk {name}",
            "partition": f"its partition {name}",
            "below": f"{name}, which it lies on",
            "above": f"{name}, which lies on it",
        }.get(how, f"{name}, the same storage")

    # --- who holds what ---------------------------------------------------

    def _hold(self, key: Key, holder: Holder, at: float, *, provisional: bool = False) -> None:
        self._at[holder] = max(self._at.get(holder, at), at)
        if not provisional:
            self._provisional.discard(holder)  # a grant made here: no longer a guess
        old = self._holds.get(key)
        if old == holder:
            return
        if old is not None:
            self._unhold(key, old)
        self._holds[key] = holder
        self._by_holder.add(holder, key)
        self._count(holder, +1)
        # its family may be blocked now; itself only if someone else lists it
        self._dirty_all(self._family(key))
        if old is not None or any(r != holder.resource for r in self._listers.get(key)):
            self._dirty[key] = None

    def _unhold(self, key: Key, holder: Holder) -> None:
        if self._by_holder.discard(holder, key) and holder not in self._by_holder:
            self._forget_holder(holder)
        self._count(holder, -1)

    def _forget_holder(self, holder: Holder) -> None:
        """It holds nothing any more: nothing of it stays."""
        self._by_holder.forget(holder)
        self._at.pop(holder, None)
        self._waits.pop(holder, None)
        self._provisional.discard(holder)
        self._pods.pop(holder, None)

    def _release(self, key: Key) -> None:
        old = self._holds.pop(key, None)
        if old is not None:
            waited = old in self._waits
            self._unhold(key, old)
            # its family may be free now; itself only where its ruling can
            # change: someone else lists it, waited for this holder, or a
            # claim held it (which the device plugin side of its own resource
            # counts as another holder)
            self._dirty_all(self._family(key))
            if waited or old.api == DRA or any(r != old.resource for r in self._listers.get(key)):
                self._dirty[key] = None

    def _compact(self) -> None:
        """Many holders went at once (the first answer after start frees the
        holds of every "each" unit no pod holds): Python's dicts and sets
        keep the room they grew to, about 150 bytes a device at 10,000, so
        those that hold an entry a holder or a held device are made again at
        the size they need now."""
        self._holds = dict(self._holds)
        self._at = dict(self._at)
        self._provisional = set(self._provisional)
        self._pods = dict(self._pods)
        self._units = {k: dict(v) for k, v in self._units.items()}
        self._by_holder.compact()

    def _release_all(self, holder: Holder, keys: list[Key]) -> None:
        """_release() for many devices of one holder, at a few dict
        operations each (every provisional hold goes at the first answer)."""
        if not keys:
            return
        waited = holder in self._waits or holder.api == DRA
        holds, listers, dirty = self._holds, self._listers, self._dirty
        for key in keys:
            del holds[key]
            family = self._family(key)
            if family:
                self._dirty_all(family)
            if waited or listers.several(key) or listers.get(key) not in ((), (holder.resource,)):
                dirty[key] = None
        if holder in self._by_holder:
            for key in keys:
                self._by_holder.discard(holder, key)
            if holder not in self._by_holder:
                self._forget_holder(holder)
        if holder.unit is not None:
            for _ in keys:
                self._count(holder, -1)

    def _count(self, holder: Holder, step: int) -> None:
        if holder.unit is None:
            return
        units = self._units.setdefault((holder.resource, holder.api), {})
        count = units.get(holder.unit, 0) + step
        if count > 0:
            units[holder.unit] = count
        else:
            units.pop(holder.unit, None)
        if (count > 0) == (step > 0) and count in (0, 1):  # the unit came or went
            self._sides.add(holder.resource)

    def holder_of(self, key: Key) -> Holder | None:
        return self._holds.get(key)

    def pods_of(self, holder: Holder) -> tuple[str, ...]:
        """The pods the kubelet last said hold this device plugin holder's
        devices (sorted "namespace/name"); () when it has not said."""
        return self._pods.get(holder, ())

    def held_units(self, resource: str, api: str) -> frozenset[str]:
        """The units of a resource held through one API."""
        return frozenset(self._units.get((resource, api), ()))

    def granted(self, resource: str, unit: str | None, keys: Iterable[Key]) -> None:
        """An Allocate answer handed these devices out as `unit` of
        `resource` (None: "all" mode, where every unit carries them all)."""
        holder = Holder(resource, unit)
        now = trio.current_time()
        for key in keys:
            self._hold(key, holder, now)
        self.settle()

    def touch(self, resource: str, units: Iterable[str | None]) -> None:
        """Allocate's answer for these units is on its way: they count from now."""
        now = trio.current_time()
        for unit in units:
            holder = Holder(resource, unit)
            if holder in self._at:
                self._at[holder] = now

    def provisional(self, resource: str, unit: str | None, keys: Iterable[Key]) -> None:
        """At start: held as this unit until the kubelet says otherwise."""
        now = trio.current_time()
        holder = Holder(resource, unit)  # one object for all its devices
        fresh = holder not in self._by_holder
        for key in keys:
            if key not in self._holds:
                self._hold(key, holder, now, provisional=True)
        if fresh and holder in self._by_holder:
            self._provisional.add(holder)

    def claimed(self, resource: str, unit: str, keys: Iterable[Key], claim: str) -> None:
        """A claim was prepared with this unit of `resource`."""
        holder = Holder(resource, unit, DRA, claim)
        now = trio.current_time()
        for key in keys:
            self._hold(key, holder, now)
            self._dirty[key] = None  # its own resource's other side rules again too
        self.settle()

    def unclaimed(self, claim: str, unit: tuple[str, str] | None = None) -> None:
        """That claim is unprepared: its devices are free (`unit`: only
        those it holds as this (resource, unit))."""
        for holder in [
            h
            for h in self._by_holder.keys()
            if h.claim == claim and (unit is None or (h.resource, h.unit) == unit)
        ]:
            for key in sorted(self._by_holder.get(holder)):
                log.info("%s: %s is unprepared", self.name_of(key), holder)
                self._release(key)
        self.settle()

    def quiet(self, key: Key, resource: str) -> bool:
        """Nothing to rule on for this device: no other lister, no holder, no
        family (the common case, asked first)."""
        if key in self._holds or self._listers.several(key):
            return False
        if self._listers.get(key) not in ((), (resource,)):
            return False
        return not self._family(key)

    def blocking(
        self, key: Key, resource: ResourceConfig, unit: str | None, *, claim: str | None = None
    ) -> tuple[Key, Holder] | None:
        """The device of this one's family (itself included) that a holder
        other than (resource, unit) holds, and that holder. With `claim`
        (NodePrepareResources), another claim on the same unit and pods
        holding it through the device plugin API count too."""
        for kin in (key, *sorted(self._family(key))):
            holder = self._holds.get(kin)
            if holder is None:
                continue
            if claim is None:
                if holder.serves(resource, unit):
                    continue
            elif (
                holder.resource == resource.name
                and holder.unit == unit
                and holder.api == DRA
                and holder.claim in (None, claim)
            ):
                continue
            return kin, holder
        return None

    def why_held(self, key: Key, kin: Key, holder: Holder) -> str:
        """Why a device waits for a holder of its family; registers the wait
        (the kubelet is asked while something waits for a device plugin unit)."""
        if holder.api == DRA:
            until = "until that claim is unprepared"
        else:
            until = "until the kubelet says no pod holds it"
            if holder not in self._waits:
                self._waits[holder] = trio.current_time()
                self._wake.set()
        what = "it" if kin == key else self._relation(key, kin)
        by = self._by_pods(holder)
        return f"{what} is held as {holder}{by}, and {until}, a pod may still reach it"

    def _by_pods(self, holder: Holder) -> str:
        pods = self._pods.get(holder, ())
        if not pods:
            return ""
        named = ", ".join(pods[:PODS_NAMED])
        more = f" and {len(pods) - PODS_NAMED} more" if len(pods) > PODS_NAMED else ""
        return f" by pod{'s' if len(pods) > 1 else ''} {named}{more}"

    # --- settling -----------------------------------------------------------

    def settle(self) -> None:
        """Have every tracker rule again on the devices whose rulings may
        have changed; a "both" resource hears that its sides changed."""
        rounds = 0
        while self._dirty or self._sides:
            rounds += 1
            if rounds > 100:  # rulings converge; this only guards against a bug
                log.error(
                    "the ledger did not settle after 100 rounds: %d devices", len(self._dirty)
                )
                self._dirty.clear()
                self._sides.clear()
                return
            dirty, self._dirty = self._dirty, {}
            sides, self._sides = self._sides, set()
            for view in list(self._views.values()):
                name = view.resource.name
                keys = {key for key, excused in dirty.items() if excused != name}
                if keys:
                    view.regate(keys)
                # a unit held or let go is news to a "both" resource's other
                # side only: to one served through one API, a whole list or
                # pool sent again at every Allocate, prepare and unprepare
                if name in sides and view.resource.both:
                    view.sides_changed()

    # --- what pods hold, as the kubelet says ---------------------------------

    def answered(self, held: PodsSay, asked_at: float) -> None:
        """The kubelet's answer to an ask begun at `asked_at`: the device IDs
        each resource's pods hold, and which pods. A device plugin unit no
        pod holds, whose grant had settled by then, is free; one the kubelet
        lists and the ledger does not hold (a pod from before, a lagging
        answer) is held. Each holder keeps the pods the kubelet named."""
        settled = asked_at - GRANT_SETTLES
        released = 0
        for holder in self._by_holder.keys():
            if holder.api == DRA:
                continue  # a claim: the kubelet's PodResources cannot say
            ids = held.get(holder.resource, {})
            still = bool(ids) if holder.unit is None else holder.unit in ids
            guessed = holder in self._provisional
            self._provisional.discard(holder)  # the kubelet has said
            if still:
                pods = _pods_holding(ids, holder.unit)
                if self._pods.get(holder) != pods:
                    self._pods[holder] = pods
                    if holder in self._waits:  # what waits for it names them
                        for key in self._by_holder.get(holder):
                            self._mark(key)
                continue
            self._pods.pop(holder, None)  # none, as the kubelet says
            if not guessed and self._at.get(holder, 0.0) >= settled:
                continue  # granted too late for this answer to say
            free = list(self._by_holder.get(holder))
            if free and holder in self._waits:
                log.info(
                    "%s: the kubelet says no pod holds %s any more",
                    ", ".join(self.name_of(k) for k in sorted(free)[:5]),
                    holder,
                )
            self._release_all(holder, free)
            released += 1
        if released >= COMPACT_AFTER:
            self._compact()
        for name, ids in held.items():
            view = self._views.get(name)
            if view is None or not ids:
                continue
            units = ids if view.resource.allocation == "each" else {None}
            for unit in sorted(units, key=str):
                holder = Holder(name, unit)
                if holder in self._by_holder:
                    continue  # held already (the common case: granted here)
                for key in view.keys_of(unit):
                    if key not in self._holds:
                        self._hold(key, holder, asked_at)
                if holder in self._by_holder:
                    self._pods[holder] = _pods_holding(ids, unit)
        self.known = True
        self.settle()

    def asks_kubelet(self) -> bool:
        """Is something waiting for what the kubelet's PodResources can say?
        (What pods held at start, until it has said; a holder something
        waits for; a unit a "both" resource's DRA side waits for.)"""
        if self._waits or (not self.known and self._provisional):
            return True
        return any(
            units
            and api == DEVICE_PLUGIN
            and (view := self._views.get(name)) is not None
            and view.resource.both
            for (name, api), units in self._units.items()
        )

    def wake(self) -> None:
        """Ask the kubelet at once (a "both" unit was handed out)."""
        self._wake.set()

    async def follow_pods(
        self, ask: Callable[[], Awaitable[dict[str, set[str]] | None]], interval: float
    ) -> None:
        """While something waits, ask the kubelet what pods hold: at once,
        then every `interval` seconds."""
        while True:
            if not self.asks_kubelet():
                await self._wake.wait()
            self._wake = trio.Event()
            asked_at = trio.current_time()
            held = await ask()
            if held is not None:
                self.answered(held, asked_at)
            if self.asks_kubelet():
                with trio.move_on_after(interval):
                    await self._wake.wait()


def _pods_holding(ids: Mapping[str, Collection[str]], unit: str | None) -> tuple[str, ...]:
    """The pods holding a unit (None: any unit, "all" mode), sorted."""
    if unit is not None:
        return tuple(sorted(ids.get(unit, ())))
    return tuple(sorted({pod for pods in ids.values() for pod in pods}))


# --- at start and reload -------------------------------------------------------


OVERLAP_FIX = (
    "a device belongs to one resource only: narrow include-devices, add "
    "exclude-devices, or tell them apart with match-properties"
)


def check_devices(
    config: Config, dev_root: Path, sys_root: Path, udev: UdevDatabase | None = None
) -> None:
    """ConfigError if two resources of the config would list one device or
    one family (find_overlap); run at start, on reload and by `powerdev scan`."""
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
    """The first device two resources would both reach (by kind and numbers,
    whatever the names), or one whose family another reaches (a disk and its
    partition, a disk and its alias): (index of the later resource, what
    clashes). None if there is none. Devices the host uses count too: the
    host may let go of them."""
    if len(resources) < 2:
        return None  # one resource cannot overlap itself: no look needed
    table = DeviceTable(dev_root, sys_root, udev=udev)
    looked = [list(dict.fromkeys(candidates(r, dev_root, sys_root))) for r in resources]
    table.look(p for paths in looked for p in paths)
    ledger = Ledger(table)
    for i, (resource, paths) in enumerate(zip(resources, looked, strict=True)):
        reached: dict[Key, str] = {}
        for path in sorted(paths):
            key = table.key_of(path)
            if key is None or not reaches(resource, path, key, table):
                continue
            reached.setdefault(key, path)
            rivals = ledger.rivals(resource.name, key, path)
            if rivals:
                return i, (
                    f"{resource.name} matches {path} ({describe_key(key)}) and {'; '.join(rivals)}"
                )
        for key, path in reached.items():
            ledger.add_listing(resource.name, key, path)
    return None
