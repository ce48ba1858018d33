"""What a DRA resource publishes, and keeping it published.

One pool per (node, resource), "<node>/<resource name>", in as many
ResourceSlices as it takes, at most 64 devices each (the API's limit for
a slice with a taint or counters, which any device may come to have),
every slice with the pool's generation and slice count. A device keeps
its slice across changes (placement.place), so a change of one device is
one slice written at the same generation; a change to more slices is a
new generation on every slice (Pool). A device is one unit of "each" mode (every name of one
device), named from its unit ID (names.py). Its attributes, for CEL
selectors: resource, kind (block/char), path, major, minor, wwid or serial
when its identity gives one, numaNode when known, vendor and model when
a block device's SCSI or NVMe device says (devices/identity.py,
block_facts). Strings over 64 characters (the API's limit) are left out.
A block device's capacity: its size in bytes, as a quantity.

A device's own health (devices/condition.py) is a taint on it, with the
key dra.powerdev.io/condition: a degraded one (some paths down) is
published with value "degraded" and effect None, for people and tools to
see; a failed one (no path, offline, dead), which would be offered but
for its failure, with value "failed" and effect NoSchedule, so that the
scheduler allocates it to no claim that does not tolerate it (and
NodePrepareResources still refuses it while it has failed). NoExecute is
left to admins' DeviceTaintRules. Other Unhealthy units are
not published; host-used devices never reach the inventory (the tracker
screens them). build_devices() and build_slices() are pure;
keep_published() follows the resource's inventory and deletes the pool on
the way out.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any, Protocol, TypeVar

import trio
import trio.lowlevel

from powerdev.devices.condition import DEGRADED, FAILED, FINE, Condition
from powerdev.devices.family import Key
from powerdev.devices.model import Device
from powerdev.dra.names import (
    byte_quantity,
    counter_slice_name,
    device_name,
    pool_name,
    slice_name,
)
from powerdev.dra.placement import chunks, place
from powerdev.ops import metrics
from powerdev.resources import families
from powerdev.resources.allocation import by_unit
from powerdev.resources.plugin import Plugin
from powerdev.support.backoff import Backoff

log = logging.getLogger(__name__)
T = TypeVar("T")

CONDITION_TAINT = "dra.powerdev.io/condition"
# A device's condition -> the effect of its taint (a fine device has none).
TAINT_EFFECTS = {DEGRADED: "None", FAILED: "NoSchedule"}
MAX_STRING = 64  # a string attribute's longest value
RETRY = (0.1, 10.0)  # first and longest wait before publishing again after an API error
DELETE_TIMEOUT = 5.0  # on the way out, for deleting the pool
# Slices written at once: a new generation rewrites every slice of the pool
# (each carries it), so a large pool is many requests, and a remote API
# server's round trips add up one after the other.
APPLY_AT_ONCE = 4
# A pool of this many devices or more is planned in a worker thread (about
# 2 ms of work at 1,000 devices, 20 ms at 10,000).
PLAN_IN_A_THREAD = 1000
# An identity's source (devices/identity.py) -> the attribute it gives.
_IDENTITY_ATTRIBUTES = {
    "WWID": "wwid",
    "ID_WWN": "wwid",
    "SERIAL": "serial",
    "ID_SERIAL": "serial",
}


# Values many devices have alike ({"string": "block"}, their resource, their
# major, vendor, model, NUMA node, size) are one dict for all of them: at
# 10,000 devices some 5 MiB less. Nothing changes a device once built.
_ALIKE: dict[tuple[str, object], dict[str, Any]] = {}
_ALIKE_MOST = 4096  # different values kept, before starting again


def _alike(kind: str, value: object) -> dict[str, Any]:
    key = (kind, value)
    found = _ALIKE.get(key)
    if found is None:
        if len(_ALIKE) >= _ALIKE_MOST:
            _ALIKE.clear()
        found = _ALIKE[key] = {kind: value}
    return found


def _capacity(size: int) -> dict[str, Any]:
    """{"size": {"value": "<bytes>"}}, one dict for every device of that size."""
    key = ("capacity", size)
    found = _ALIKE.get(key)
    if found is None:
        value = _alike("value", byte_quantity(size))
        found = _ALIKE[key] = {"size": value}
    return found


def _attributes(
    resource_name: str, names: Sequence[Device], said: Said | None
) -> dict[str, dict[str, Any]]:
    first = names[0]  # every name of a unit is the same device: kind, numbers, identity
    attributes: dict[str, dict[str, Any]] = {
        "resource": _alike("string", resource_name),
        "kind": _alike("string", "block" if first.kind == "b" else "char"),
        "path": {"string": first.path},
        "major": _alike("int", first.major),
        "minor": {"int": first.minor},
    }
    if first.identity:
        source, _, value = first.identity.partition("=")
        attribute = _IDENTITY_ATTRIBUTES.get(source)
        if attribute and value:
            attributes[attribute] = {"string": value}
    if first.numa is not None:
        attributes["numaNode"] = _alike("int", first.numa)
    if first.facts is not None:
        for key, text in (("vendor", first.facts.vendor), ("model", first.facts.model)):
            if text:
                attributes[key] = _alike("string", text)
    too_long = [k for k, v in attributes.items() if len(str(v.get("string", ""))) > MAX_STRING]
    for key in too_long:
        if said is not None:
            _say_left_out(said, resource_name, first.path, key)
        del attributes[key]
    return attributes


# What was said of attributes left out: (resource, path, attribute).
Said = set[tuple[str, str, str]]


def _say_left_out(said: Said, resource_name: str, path: str, attribute: str) -> None:
    """Said once for each device and attribute (the API server would
    refuse the whole slice for one string over its limit)."""
    if (resource_name, path, attribute) in said:
        return
    said.add((resource_name, path, attribute))
    log.warning(
        "%s: %s is published without its %s attribute: longer than the %d characters "
        "the API allows",
        resource_name,
        path[:200],
        attribute,
        MAX_STRING,
    )


def _counter_set_name(first_unit: str) -> str:
    return device_name(f"family-{first_unit}")


def _by_name(found: families.Families) -> families.Families:
    """The plan's units by their names in the pool."""
    return families.Families(
        found.counter_sets,
        {device_name(unit): c for unit, c in found.consumes.items()},
        {device_name(unit): why for unit, why in found.left_out.items()},
    )


def _say_dropped(pool: Pool, resource_name: str, told: bool) -> bool:
    """Said once: the API server drops counters. True once said."""
    if pool.counters_dropped and not told:
        log.error(
            "%s: the API server keeps no shared counters (its DRAPartitionableDevices gate "
            "is off; on by default since Kubernetes 1.36): devices that share blocks are "
            "published apart, the smallest first, until powerdev restarts",
            resource_name,
        )
        return True
    return told


def _say_apart(said: Said, resource_name: str, found: families.Families) -> None:
    """Each device a family leaves out, said once for each reason."""
    for device, why in sorted(found.left_out.items()):
        if (resource_name, device, why) not in said:
            said.add((resource_name, device, why))
            log.warning("%s: DRA device %s is not published: %s", resource_name, device, why)


class Health(Protocol):
    """What the pool asks of the resource's tracker about a device's own
    health (resources/tracker.py gives it)."""

    def condition_of(self, device: Device) -> Condition: ...

    def offered_but_for_failure(self, device: Device) -> bool: ...


def build_devices(
    resource_name: str,
    devices: Sequence[Device],
    health: Health | None = None,
    said: Said | None = None,
) -> list[dict[str, Any]]:
    """The pool's devices: one per healthy unit, and one per unit that has
    failed and is otherwise offered (tainted), sorted by name. Without
    `health`, no taints and no failed units. An attribute left out is
    logged once where `said` keeps what was said."""
    units = by_unit(devices).items()
    return sorted(_published(resource_name, units, health, said), key=lambda d: d["name"])


# unit ID -> (its names, its condition, what was published for them: a
# device, or None)
Built = dict[str, tuple[tuple[Device, ...], str, "dict[str, Any] | None"]]
# device name -> (the condition its taint says, since when: RFC 3339), for
# the tainted devices of a pool: a taint keeps its timeAdded through every
# write of its slice until the condition changes, and across a restart
# (read back from the slices the last run left: taints_in())
Since = dict[str, tuple[str, str]]


def taints_in(found: Iterable[dict[str, Any]]) -> Since:
    """What the pool's slices on the server say of each device's condition
    taint, and since when."""
    since: Since = {}
    for body in found:
        for device in body.get("spec", {}).get("devices") or ():
            for taint in device.get("taints") or ():
                if taint.get("key") == CONDITION_TAINT and taint.get("timeAdded"):
                    since[device["name"]] = (taint.get("value", ""), taint["timeAdded"])
    return since


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def build_devices_in_steps(
    resource_name: str,
    devices: Sequence[Device],
    health: Health | None = None,
    said: Said | None = None,
    step: int = 500,
    built: Built | None = None,
    since: Since | None = None,
    family: Callable[[Key], frozenset[Key]] | None = None,
    members: dict[str, Key] | None = None,
) -> list[dict[str, Any]]:
    """build_devices(), letting other tasks run every `step` units: a pool of
    10,000 devices is some 100 ms of work, too long for one Trio step. With
    `built` (what the last call built, updated here), a unit whose names
    and condition are the same objects as then is not built again: a
    change of one device costs one device's work and a pass over the
    rest. With `since` (updated here too), each taint says since when its
    unit is in its condition (timeAdded), not when its slice was written.
    With `family` (the device table's overlapping()) and `members` (filled
    here), the published units that overlap some device: unit ID -> key."""
    units = list(by_unit(devices).items())
    published: list[dict[str, Any]] = []
    fresh: Built = {}
    still: Since = {}
    for start in range(0, len(units), step):
        part = units[start : start + step]
        done = len(published)
        published += _published(resource_name, part, health, said, built, fresh, since, still)
        if family is not None and members is not None:
            names = {device["name"] for device in published[done:]}
            for unit_id, unit in part:
                key = unit[0].key
                if family(key) and device_name(unit_id) in names:
                    members[unit_id] = key
        await trio.lowlevel.checkpoint()
    if built is not None:
        built.clear()
        built.update(fresh)
    if since is not None:
        since.clear()
        since.update(still)
    return sorted(published, key=lambda d: d["name"])


def _published(
    resource_name: str,
    units: Iterable[tuple[str, tuple[Device, ...]]],
    health: Health | None,
    said: Said | None,
    built: Built | None = None,
    fresh: Built | None = None,
    since: Since | None = None,
    still: Since | None = None,
) -> list[dict[str, Any]]:
    published = []
    for unit_id, names in units:
        level = health.condition_of(names[0]).level if health is not None else FINE
        added = None
        if since is not None and still is not None and level in TAINT_EFFECTS:
            name = device_name(unit_id)
            was = since.get(name)
            still[name] = was if was is not None and was[0] == level else (level, _now())
            added = still[name][1]
        if built is not None and fresh is not None:
            kept = tuple(names)
            before = built.get(unit_id)
            if before is not None and before[1] == level and before[0] == kept:
                if before[2] is not None:
                    published.append(before[2])
                fresh[unit_id] = before
                continue
        device = _one(resource_name, unit_id, names, level, health, said, added)
        if device is not None:
            published.append(device)
        if fresh is not None and level != FAILED:  # a failed one's fate follows its holders
            fresh[unit_id] = (tuple(names), level, device)
    return published


def _one(
    resource_name: str,
    unit_id: str,
    names: tuple[Device, ...],
    level: str,
    health: Health | None,
    said: Said | None,
    added: str | None = None,
) -> dict[str, Any] | None:
    """What the pool publishes for one unit, or None; a taint's timeAdded
    is `added` where given (else the API server stamps each write)."""
    if not all(d.healthy for d in names):
        if level != FAILED or health is None:
            return None
        if not all(d.healthy or health.offered_but_for_failure(d) for d in names):
            return None
    ordered = sorted(names, key=lambda d: (len(d.path), d.path))
    device: dict[str, Any] = {
        "name": device_name(unit_id),
        "attributes": _attributes(resource_name, ordered, said),
    }
    facts = ordered[0].facts
    if facts is not None and facts.size is not None:
        device["capacity"] = _capacity(facts.size)
    effect = TAINT_EFFECTS.get(level)
    if effect is not None:
        taint = {"key": CONDITION_TAINT, "value": level, "effect": effect}
        if added is not None:
            taint["timeAdded"] = added
        device["taints"] = [taint]
    return device


def with_families(devices: list[dict[str, Any]], found: families.Families) -> list[dict[str, Any]]:
    """The devices as published with their families: each that shares
    blocks consumes its family's counters, those left out are gone. The
    devices themselves are not changed (built() keeps them)."""
    if not found.consumes and not found.left_out:
        return devices
    out = []
    for device in devices:
        name = device["name"]
        if name in found.left_out:
            continue
        consumes = found.consumes.get(name)
        out.append(device if consumes is None else {**device, "consumesCounters": consumes})
    return out


def build_slices(
    driver: str, node: str, resource_name: str, devices: list[dict[str, Any]], generation: int
) -> list[dict[str, Any]]:
    """The pool's ResourceSlices at a generation, the devices in order, as a
    new pool packs them (at least one slice, even empty)."""
    packed = chunks(devices)
    return [
        _slice_body(driver, node, resource_name, i, chunk, generation, len(packed))
        for i, chunk in enumerate(packed)
    ]


def _slice_body(
    driver: str,
    node: str,
    resource_name: str,
    index: int,
    devices: list[dict[str, Any]],
    generation: int,
    count: int,
    counter_sets: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A slice of devices, or with `counter_sets` one of counters (the API
    allows one or the other in a slice)."""
    if counter_sets is None:
        name, content = slice_name(node, driver, resource_name, index), {"devices": devices}
    else:
        name = counter_slice_name(node, driver, resource_name, index)
        content = {"sharedCounters": counter_sets}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "powerdev"}},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {
                "name": pool_name(node, resource_name),
                "generation": generation,
                "resourceSliceCount": count,
            },
            **content,
        },
    }


def uses_counters(body: dict[str, Any]) -> bool:
    spec = body.get("spec") or {}
    return bool(spec.get("sharedCounters")) or any(
        d.get("consumesCounters") for d in spec.get("devices") or ()
    )


@dataclass(frozen=True)
class _Plan:
    """What one publication writes: computed in a worker thread."""

    slots: dict[str, int]
    count: int  # slices of devices
    generation: int
    changed: list[dict[str, Any]]  # the bodies to write
    kept: set[str]  # the pool's slice names


class TaintEffectRefused(Exception):
    """The API server refused a slice for a taint's effect `None`: one of
    Kubernetes 1.34 with the alpha DRADeviceTaints gate on knows only
    NoSchedule and NoExecute (the effect came in 1.35)."""


def without_informational_taints(devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The devices with no taint of effect None (a degraded device then
    goes out untainted, as it would to an API server without taints)."""
    out = []
    for device in devices:
        taints = device.get("taints")
        if taints and any(t["effect"] == "None" for t in taints):
            kept = [t for t in taints if t["effect"] != "None"]
            device = {k: v for k, v in device.items() if k != "taints"}
            if kept:
                device["taints"] = kept
        out.append(device)
    return out


class SliceApi(Protocol):
    """What publishing needs of the API server (kubeapi.py gives it)."""

    async def pool_slices(self, driver: str, node: str, pool: str) -> list[dict[str, Any]]: ...

    async def apply_slice(self, body: dict[str, Any]) -> bool | None:
        """Create or update the slice; whether the API server kept counters
        in it (None, where it is not known)."""

    async def delete_slice(self, name: str) -> None: ...


@dataclass
class Pool:
    """One resource's pool on this node, as published.

    A device keeps its slice from one generation to the next (place()), so
    that a change of one device changes one slice: that slice is then
    written alone, at the same generation, and the pool stays complete
    meanwhile (the 1.36 resource slice controller's rule: a pool whose
    slices all carry one generation is whole, whichever of them was
    updated last). A change that touches more than one slice, adds a
    slice or changes their count is a new generation, written to every
    slice. A pool's shared counters (families.py) are slices of their own,
    after its devices'. An API server that drops them (its gate off) is
    remembered in counters_dropped."""

    api: SliceApi
    driver: str
    node: str
    resource_name: str
    generation: int = 0
    names: tuple[str, ...] = ()  # the slices published now
    _stale: set[str] = field(default_factory=set)  # no longer needed, not yet deleted
    _lost: trio.Event = field(default_factory=trio.Event)
    _slots: dict[str, int] = field(default_factory=dict)  # device name -> its slice
    _count: int = 0  # slices of devices in the pool, as last placed
    _written: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> body on the server
    _written_at: int = 0  # the generation _written holds bodies of
    _epoch: int = 0  # lose()s so far: a write answered after one is not trusted
    counters_dropped: bool = False  # the API server kept no counter we wrote
    none_refused: bool = False  # the API server refused a taint's effect None
    _recalled: bool = False  # what an earlier run left is known

    def lose(self) -> None:
        """Someone else deleted a slice of ours (a starting kubelet wipes its
        node's slices), or the kubelet registered us again: publish anew."""
        self._epoch += 1  # writes in flight now say nothing of what is there
        self._written.clear()  # every slice is written again, at a new generation
        self._lost.set()
        self._lost = trio.Event()

    @property
    def lost(self) -> trio.Event:
        return self._lost

    async def publish(
        self, devices: list[dict[str, Any]], counter_sets: Sequence[dict[str, Any]] = ()
    ) -> int:
        """These devices and counter sets, in as few writes as it takes: one
        slice changed is one write at the same generation, more is a new
        generation on every slice. Slices no longer needed go. Returns the
        slices written."""
        epoch = self._epoch
        if not self._recalled:
            await self.recall()
        written = dict(self._written) if self._written_at == self.generation else {}
        if len(devices) < PLAN_IN_A_THREAD:
            plan = self._plan(devices, counter_sets, written)
        else:  # at 10,000 devices some 20 ms of work: off the Trio thread
            plan = await trio.to_thread.run_sync(self._plan, devices, counter_sets, written)
        self._slots, self._count, self.generation = plan.slots, plan.count, plan.generation
        changed, kept = plan.changed, plan.kept
        if plan.generation != self._written_at:
            self._written.clear()
            self._written_at = plan.generation
        # known as ours before they are written: a deletion of one is a loss,
        # and one a failed attempt wrote goes once no longer needed
        self.names = tuple(sorted({*self.names, *kept}))
        # Counters first: an API server that drops them (its gate off) is
        # known before any device that would consume them is written.
        counting = [b for b in changed if "sharedCounters" in b["spec"]]
        await _each_at_most(APPLY_AT_ONCE, partial(self._apply, epoch), counting)
        if counting and self.counters_dropped:
            return len(counting)  # published again without counters (keep_published)
        rest = [b for b in changed if "sharedCounters" not in b["spec"]]
        await _each_at_most(APPLY_AT_ONCE, partial(self._apply, epoch), rest)
        # Forgotten before they go, so that the watch of the node's slices
        # (daemon/dra.py) does not take our own deletions for a loss.
        self._stale.update(n for n in self.names if n not in kept)
        self.names = tuple(sorted(kept))
        for name in sorted(self._stale - kept):
            await self.api.delete_slice(name)
            self._stale.discard(name)
        return len(changed)

    async def recall(self) -> list[dict[str, Any]]:
        """The pool's slices an earlier run left (once, before the first
        publication): the generation goes on from theirs."""
        found = await self.api.pool_slices(self.driver, self.node, self.name)
        self.generation = max((s["spec"]["pool"]["generation"] for s in found), default=0)
        self.names = tuple(s["metadata"]["name"] for s in found)
        self._written.clear()
        self._recalled = True
        return found

    def _plan(
        self,
        devices: list[dict[str, Any]],
        counter_sets: Sequence[dict[str, Any]],
        written: dict[str, dict[str, Any]],
    ) -> _Plan:
        """The slots, and the slices to write (one at the same generation,
        or all at the next), given what the server has (`written`). Reads
        the pool, which only publish() changes."""
        slots, count = place(self._slots, self._count, devices)
        groups: list[list[dict[str, Any]]] = [[] for _ in range(count)]
        for device in devices:
            groups[slots[device["name"]]].append(device)
        step = families.MAX_SETS_PER_SLICE
        sets = [list(counter_sets[i : i + step]) for i in range(0, len(counter_sets), step)]
        total = count + len(sets)

        def bodies(generation: int) -> list[dict[str, Any]]:
            where = (self.driver, self.node, self.resource_name)
            return [
                *(_slice_body(*where, i, g, generation, total) for i, g in enumerate(groups)),
                *(_slice_body(*where, i, [], generation, total, c) for i, c in enumerate(sets)),
            ]

        generation = self.generation
        now = bodies(generation)
        changed = [b for b in now if written.get(b["metadata"]["name"]) != b]
        if len(changed) > 1 or len(written) != total:
            generation += 1
            now = bodies(generation)
            changed = now
        return _Plan(slots, count, generation, changed, {b["metadata"]["name"] for b in now})

    async def _apply(self, epoch: int, body: dict[str, Any]) -> None:
        """One slice written; known as written only once the API server said
        so, and only if the pool was not lost meanwhile (a write that fails
        may have been applied: its slice is then written anew)."""
        name = body["metadata"]["name"]
        before = self._written.pop(name, None)
        try:
            kept = await self.api.apply_slice(body)
        except TaintEffectRefused:  # refused as a whole: what was there still is
            self.none_refused = True
            if before is not None and self._epoch == epoch:
                self._written[name] = before
            raise
        if kept is False and uses_counters(body):
            self.counters_dropped = True
        if self._epoch == epoch:
            self._written[name] = body

    async def delete(self) -> None:
        """Every slice of the pool, whoever published it."""
        found = await self.api.pool_slices(self.driver, self.node, self.name)
        for name in {*self.names, *self._stale, *(s["metadata"]["name"] for s in found)}:
            await self.api.delete_slice(name)
        self.names = ()
        self._stale.clear()
        self._written.clear()

    @property
    def name(self) -> str:
        """The pool's name: "<node>/<resource name>"."""
        return pool_name(self.node, self.resource_name)


async def keep_published(
    plugin: Plugin,
    pool: Pool,
    *,
    problem: Callable[[str | None], None] = lambda _: None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Publish the resource's pool, again on every inventory change and
    whenever the pool is lost (Pool.lose); started() once first published
    (or first tried). `problem` hears why a publication failed, and None
    once one succeeds. On the way out, the pool is deleted."""
    name = plugin.resource.name
    backoff = Backoff(*RETRY)
    metrics.dra_served(name)
    seen = -1
    published: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None
    said: Said = set()
    built: Built = {}
    since: Since = {}
    table = getattr(plugin.tracker, "table", None)  # the node's device table
    members: dict[str, Key] = {}
    told = False  # that the API server drops counters
    none_told = False  # that it refuses the effect None
    try:
        with contextlib.suppress(Exception):  # else publish() lists again, and says why
            since.update(taints_in(await pool.recall()))  # a taint's time, across a restart
        while True:
            snapshot = plugin.inventory.current
            seen = snapshot.version
            wake = pool.lost  # before any await: a loss while building is not missed
            members.clear()
            devices = await build_devices_in_steps(
                name,
                plugin.offered_to_dra(snapshot),
                plugin.tracker,
                said,
                built=built,
                since=since,
                family=table.overlapping if table is not None else None,
                members=members,
            )
            found = families.Families()
            if members and table is not None:
                counted = plugin.resource.whole_disks and not pool.counters_dropped
                apart = families.NO_COUNTERS if pool.counters_dropped else families.APART
                found = _by_name(
                    families.plan(
                        members,
                        table.overlapping,
                        table.relation,
                        counters=counted,
                        apart=apart,
                        shown=device_name,
                        label=_counter_set_name,
                    )
                )
                _say_apart(said, name, found)
            devices = with_families(devices, found)
            if pool.none_refused:
                devices = without_informational_taints(devices)
            if (devices, found.counter_sets) != published:
                try:
                    written = await pool.publish(devices, found.counter_sets)
                except Exception as err:  # the API server: unreachable, refusing
                    if isinstance(err, TaintEffectRefused) and not none_told:
                        none_told = True
                        log.error(
                            "%s: the API server knows no taint effect None (Kubernetes 1.34 "
                            "with DRADeviceTaints on; the effect came in 1.35): degraded "
                            "devices are published without their taint until powerdev restarts",
                            name,
                        )
                        published = None
                        continue  # published again at once, without those taints
                    told = _say_dropped(pool, name, told)
                    published = None  # tried again whatever the inventory does meanwhile
                    metrics.dra_publish_failed(name)
                    problem(f"its ResourceSlices cannot be published ({err}): trying again")
                    log.warning(
                        "%s: cannot publish its ResourceSlices (%s): trying again", name, err
                    )
                    task_status.started()
                    task_status = trio.TASK_STATUS_IGNORED
                    await trio.sleep(backoff.next())
                    continue
                backoff.reset()
                published = devices, found.counter_sets
                told = _say_dropped(pool, name, told)
                if found.counter_sets and pool.counters_dropped:
                    continue  # published again at once, without counters
                problem(None)
                metrics.dra_published(name, written, len(pool.names))
                log.info(
                    "%s: published %d DRA devices in pool %s (generation %d)",
                    name,
                    len(devices),
                    pool.name,
                    pool.generation,
                )
            task_status.started()
            task_status = trio.TASK_STATUS_IGNORED
            if await _newer_or(plugin, seen, wake):
                published = None  # lost: publish again
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(DELETE_TIMEOUT) as waited:
            try:
                await pool.delete()
                metrics.dra_pool_gone(name)
            except Exception as err:
                log.warning("%s: cannot delete its ResourceSlices (%s)", name, err)
        if waited.cancelled_caught:
            log.warning("%s: its ResourceSlices were not deleted within %gs", name, DELETE_TIMEOUT)


async def _newer_or(plugin: Plugin, seen: int, wake: trio.Event) -> bool:
    """Wait for an inventory newer than `seen` or for `wake`; True for wake."""
    woken = False
    async with trio.open_nursery() as nursery:

        async def newer() -> None:
            await plugin.inventory.wait_newer(seen)
            nursery.cancel_scope.cancel()

        async def woke() -> None:
            nonlocal woken
            await wake.wait()
            woken = True
            nursery.cancel_scope.cancel()

        nursery.start_soon(newer)
        nursery.start_soon(woke)
    return woken


async def _each_at_most(
    limit: int, call: Callable[[T], Awaitable[None]], items: Sequence[T]
) -> None:
    """call(item) for every item, `limit` at a time; the first error is
    raised as itself once the calls under way have ended."""
    errors: list[Exception] = []
    limiter = trio.CapacityLimiter(limit)

    async def one(item: T) -> None:
        async with limiter:
            if errors:
                return
            try:
                await call(item)
            except Exception as err:
                errors.append(err)

    async with trio.open_nursery() as nursery:
        for item in items:
            nursery.start_soon(one, item)
    if errors:
        raise errors[0]
