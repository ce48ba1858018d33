"""The node's device table: every device a look has found, by what it is.

One for the node, shared by every resource and both APIs, keyed by kind
and numbers: a device, not a name. For each device it knows every name a
look found for it (the node, /dev/mapper and /dev/disk/by-* links, any
link) and what sysfs and the host say of it (Facts): the kernel's name,
its identity, NUMA node and place among the disks, whether only a literal
pattern may grant it (special.py), whether the host uses it and why
(inuse.py), and its family (family.py). It knows nothing of configs or
resources: whoever asks names the paths to look at.

A look costs what it looks at. A few paths (device events) are looked at
on the Trio thread (look); many (a rescan) in a worker thread, as plain
data (survey), adopted on the Trio thread (adopt). A block event reads
again only the devices joined to the event's device; a change of the
host's mount table or swap only the devices joined to one whose use
changed. Each returns what changed (Changes): the paths that now name
another device (or none), and the devices whose facts, or whose family
seen from the other side, changed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TypeVar

import trio

from powerdev.devices import identity, special
from powerdev.devices.condition import UNWATCHED, Condition, condition, read_condition
from powerdev.devices.discovery import Dirs, node_key
from powerdev.devices.family import NO_FAMILY, Family, Key, family
from powerdev.devices.inuse import (
    BlockTopology,
    HostUse,
    direct_use,
    journal_entries,
    read_text,
)
from powerdev.devices.model import BlockFacts
from powerdev.devices.udevdb import UdevDatabase

log = logging.getLogger(__name__)
T = TypeVar("T")
ADOPT_STEP = 1000  # names a survey adopts in one Trio step (about 7 ms)

Number = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Facts:
    """What sysfs and the host say of one device."""

    kernel_name: str | None = None  # its name under /dev as the kernel gives it
    identity: tuple[str, str] | None = None  # (source, value): identity.identity()
    numa: int | None = None
    whole_disk: Number | None = None  # a partition's disk
    has_partitions: bool = False
    literal_only: str | None = None  # why only a literal pattern may grant it
    host_use: str | None = None  # why the host uses it; None: it does not
    family: Family = NO_FAMILY
    # the block devices whose change can change host_use (for invalidation)
    host_group: frozenset[Number] = frozenset()
    condition: Condition = UNWATCHED  # what it says of its own health (condition.py)
    no_medium: str | None = None  # why a block device has nothing to read or write

    @property
    def identity_text(self) -> str | None:
        return f"{self.identity[0]}={self.identity[1]}" if self.identity else None


@dataclass
class Changes:
    """What a look changed: paths that name another device now (or none),
    and devices whose facts or family changed."""

    paths: set[str] = field(default_factory=set)
    keys: set[Key] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.paths or self.keys)

    def __ior__(self, other: Changes) -> Changes:
        self.paths |= other.paths
        self.keys |= other.keys
        return self


@dataclass
class HostTables:
    """The host's tables as read at one moment: the devices used directly
    (mounts, swap) and the external journals in use, by name."""

    direct: dict[Number, str] = field(default_factory=dict)
    journals: dict[str, str] = field(default_factory=dict)


@dataclass
class Survey:
    """A look at many paths, made in a worker thread: what each path is,
    the facts of each device found, and the host's tables it used."""

    paths: dict[str, Key | None]
    facts: dict[Key, Facts]
    tables: HostTables | None


@dataclass(frozen=True)
class HostFiles:
    """Where the host's use of its devices is read (None: not screened)."""

    mountinfo: Path | None
    swaps: Path | None
    jbd2: Path | None = None

    def read(self, dev_root: Path, sys_root: Path) -> HostTables:
        table = read_text(self.mountinfo) if self.mountinfo is not None else None
        direct = direct_use(table, read_text(self.swaps), dev_root, sys_root)
        jbd2 = self.jbd2
        if jbd2 is None and self.swaps is not None:
            jbd2 = self.swaps.parent / "fs" / "jbd2"  # /proc/fs/jbd2 beside /proc/swaps
        journals = {
            name: "the external journal (jbd2) of a mounted filesystem"
            for name in journal_entries(jbd2)
        }
        return HostTables(direct, journals)


class DeviceTable:
    def __init__(
        self,
        dev_root: Path,
        sys_root: Path,
        *,
        udev: UdevDatabase | None = None,
        host: HostFiles | None = None,
    ) -> None:
        self.dev_root = dev_root
        self.sys_root = sys_root
        self.udev = udev
        self.host = host  # None: the host's use is not looked at
        self._at: dict[str, Key] = {}  # path -> the device it names
        # key -> its one name, or a set of them (nearly every device has one:
        # a bare string is 200 bytes a device less than a set)
        self._names: dict[Key, str | set[str]] = {}
        self._facts: dict[Key, Facts] = {}
        self._by_identity: dict[tuple[str, str], set[Key]] = {}
        self._reverse: dict[Key, set[Key]] = {}  # key -> the keys whose family holds it
        self._joined: dict[Number, set[Key]] = {}  # block number -> keys it can change
        self._properties: dict[Key, dict[str, str]] = {}
        self._block_facts: dict[Key, BlockFacts | None] = {}
        self._tables: HostTables | None = None
        # While surveys run, what each path and device last changed at, so
        # that a survey begun before a change does not undo it.
        self._surveys = 0
        self._gen = 0
        self._since: dict[object, int] = {}
        self._batch: BlockTopology | None = None  # one_look()'s, while it lasts

    # --- asking ---------------------------------------------------------------

    def knows(self, path: str) -> bool:
        return path in self._at

    def key_of(self, path: str) -> Key | None:
        return self._at.get(path)

    def names(self, key: Key) -> tuple[str, ...]:
        names = self._names.get(key)
        if names is None:
            return ()
        return (names,) if isinstance(names, str) else tuple(sorted(names))

    def keys(self) -> list[Key]:
        return list(self._names)

    def facts(self, key: Key) -> Facts:
        """What sysfs and the host say of the device (kept while a look names it)."""
        found = self._facts.get(key)
        if found is None:
            found = self._observe({key}, self._topology(), self._host_use())[key]
            if key in self._names:
                self._set_facts(key, found)
        return found

    def overlapping(self, key: Key) -> frozenset[Key]:
        """Every device that shares a block with this one, either side's
        knowledge counted (an alias knows its disk; the disk learns it here)."""
        facts = self._facts.get(key) or self.facts(key)
        back = self._reverse.get(key)
        return facts.family.overlapping | back if back else facts.family.overlapping

    def relation(self, key: Key, other: Key) -> str:
        """How `other` overlaps `key`: "it" (the same device), "disk" (its
        whole disk), "partition" (one of its partitions), "below" (what it
        lies on), "above" (what lies on it) or "same" (the same storage
        under other numbers)."""
        if other == key:
            return "it"
        mine, theirs = self.facts(key), self.facts(other)
        if other[0] == "b" and mine.whole_disk == other[1:]:
            return "disk"
        if key[0] == "b" and theirs.whole_disk == key[1:]:
            return "partition"
        if other in mine.family.below or key in theirs.family.above:
            return "below"
        if other in mine.family.above or key in theirs.family.below:
            return "above"
        return "same"

    def properties(self, key: Key) -> dict[str, str]:
        """Its properties as udev records them (identity.properties), read once
        until an event for the device."""
        found = self._properties.get(key)
        if found is None:
            found = identity.properties(self.sys_root, self.udev, key[0], key[1:])
            self._properties[key] = found
        return found

    def block_facts(self, key: Key) -> BlockFacts | None:
        """A block device's size, vendor and model (DRA publishes them)."""
        if key[0] != "b":
            return None
        if key not in self._block_facts:
            self._block_facts[key] = identity.block_facts(self.sys_root, key[1:])
        return self._block_facts[key]

    def with_identity(self, value: tuple[str, str]) -> tuple[Key, ...]:
        return tuple(sorted(self._by_identity.get(value, ())))

    # --- looking ----------------------------------------------------------------

    def look(self, paths: Iterable[str]) -> Changes:
        """Look at these paths now, on this thread: what each names, and the
        facts of each device newly named."""
        self._gen += 1
        found = {}
        dirs: Dirs = {}
        for path in paths:
            found[path] = node_key(self.dev_root, path, dirs)
        return self._merge(found, None)

    async def survey(self, paths: Iterable[str]) -> Changes:
        """Look at many paths, in a worker thread, and adopt what was found.
        A path or device that changed meanwhile (an event) keeps what the
        later look found."""
        paths = list(paths)
        plan = self.survey_plan()
        with self._looking_aside():
            found = await trio.to_thread.run_sync(plan.survey, paths)
            changes = Changes()
            items = list(found.paths.items())
            for start in range(0, len(items), ADOPT_STEP):  # a Trio step each
                if start:
                    await trio.lowlevel.checkpoint()
                part = dict(items[start : start + ADOPT_STEP])
                facts = {k: found.facts[k] for k in set(part.values()) if k in found.facts}
                tables = found.tables if not start else None
                changes |= self.adopt(Survey(part, facts, tables), since=plan.gen)
            return changes

    @contextmanager
    def _looking_aside(self) -> Iterator[None]:
        """While a look in a worker thread runs (a survey, a recheck): what
        each path and device last changed at is kept, so that adopting it
        does not undo a later look."""
        self._surveys += 1
        try:
            yield
        finally:
            self._surveys -= 1
            if not self._surveys:
                self._since.clear()

    def survey_plan(self) -> SurveyPlan:
        """What a survey in a worker thread needs, copied now."""
        self._gen += 1
        return SurveyPlan(
            self._gen,
            self.dev_root,
            self.sys_root,
            self.udev,
            self.host,
            {k: set(v) for k, v in self._by_identity.items()},
            {k: f.identity for k, f in self._facts.items() if f.identity is not None},
        )

    def adopt(self, survey: Survey, *, since: int | None = None) -> Changes:
        """A survey's findings, on the Trio thread; with `since` (its plan's
        generation), less what changed after its plan was made."""
        paths, facts = survey.paths, survey.facts
        if since is not None and self._since:
            paths = {p: k for p, k in paths.items() if self._since.get(p, 0) <= since}
            facts = {k: f for k, f in facts.items() if self._since.get(k, 0) <= since}
        if survey.tables is not None:
            self._tables = survey.tables
        for key in facts:  # a full look reads udev's view again too
            self._properties.pop(key, None)
            self._block_facts.pop(key, None)
        changes = self._merge(paths, facts)
        changes.keys.update(k for k in facts if k in self._names)
        return changes

    def _touch(self, item: object) -> None:
        if self._surveys:
            self._since[item] = self._gen

    def _merge(self, found: dict[str, Key | None], facts: dict[Key, Facts] | None) -> Changes:
        changes = Changes()
        new_keys: set[Key] = set()
        for path, key in found.items():
            old = self._at.get(path)
            if old == key:
                continue
            self._touch(path)
            changes.paths.add(path)
            if old is not None and self._drop_name(old, path):
                self._forget(old, changes)
            if key is None:
                self._at.pop(path, None)
            else:
                self._at[path] = key
                if self._add_name(key, path):
                    new_keys.add(key)
        if facts is not None:
            for key, fact in facts.items():
                if key in self._names and self._facts.get(key) != fact:
                    self._set_facts(key, fact, changes)
        missing = {k for k in new_keys if k not in self._facts}
        if missing:
            topology = self._topology()
            observed = self._observe(missing, topology, self._host_use())
            for key, fact in observed.items():
                self._set_facts(key, fact, changes)
            # a new device changes what its family knows of itself (a new
            # partition makes its disk one with partitions), even where no
            # event for the family came (a node seen by inotify alone)
            kin = {k for key in missing for k in self.overlapping(key) if k in self._names}
            if kin - missing:
                self._again(kin - missing, changes, topology)
        return changes

    def _add_name(self, key: Key, path: str) -> bool:
        """True if the device had no name before."""
        names = self._names.get(key)
        if names is None:
            self._names[key] = path
            return True
        if isinstance(names, str):
            if names != path:
                self._names[key] = {names, path}
        else:
            names.add(path)
        return False

    def _drop_name(self, key: Key, path: str) -> bool:
        """True if the device has no name left."""
        names = self._names.get(key)
        if names is None:
            return False
        if isinstance(names, str):
            return names == path
        names.discard(path)
        if len(names) == 1:
            self._names[key] = next(iter(names))
        return False

    def _forget(self, key: Key, changes: Changes) -> None:
        """No look finds a name for the device any more."""
        self._touch(key)
        del self._names[key]
        self._properties.pop(key, None)
        self._block_facts.pop(key, None)
        old = self._facts.pop(key, None)
        if old is not None:
            self._unlink(key, old, changes)
        changes.keys.add(key)

    def _set_facts(self, key: Key, facts: Facts, changes: Changes | None = None) -> None:
        old = self._facts.get(key)
        if old == facts:
            return
        self._touch(key)
        was = old.condition if old is not None else UNWATCHED
        if (was.level, was.why) != (facts.condition.level, facts.condition.why):
            self._say_condition(key, facts, was)
        before = old.family.overlapping if old is not None else frozenset()
        if old is not None:
            self._unlink(key, old)
        self._facts[key] = facts
        if facts.identity is not None:
            self._by_identity.setdefault(facts.identity, set()).add(key)
        for other in facts.family.overlapping:
            self._reverse.setdefault(other, set()).add(key)
        for number in self._joins(key, facts):
            self._joined.setdefault(number, set()).add(key)
        if changes is not None:
            changes.keys.add(key)
            # the devices that joined or left its family see it from their side
            changes.keys.update(k for k in before ^ facts.family.overlapping if k in self._names)

    def _say_condition(self, key: Key, facts: Facts, was: Condition) -> None:
        """A device's condition changed: said once, with its names."""
        now = facts.condition
        name = facts.kernel_name or describe_key(key)
        names = ", ".join(self.names(key))
        if now.fine:
            log.info("%s (%s) is fine again (it was %s)", name, names, was.describe())
        else:
            log.warning("%s (%s) is %s (it was %s)", name, names, now.describe(), was.describe())

    def _unlink(self, key: Key, old: Facts, changes: Changes | None = None) -> None:
        if old.identity is not None:
            same = self._by_identity.get(old.identity)
            if same is not None:
                same.discard(key)
                if not same:
                    del self._by_identity[old.identity]
        for other in old.family.overlapping:
            back = self._reverse.get(other)
            if back is not None:
                back.discard(key)
                if not back:
                    del self._reverse[other]
            if changes is not None and other in self._names:
                changes.keys.add(other)
        for number in self._joins(key, old):
            keys = self._joined.get(number)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._joined[number]

    @staticmethod
    def _joins(key: Key, facts: Facts) -> set[Number]:
        """The block numbers whose change can change these facts."""
        numbers = set(facts.host_group)
        numbers.update(k[1:] for k in facts.family.overlapping if k[0] == "b")
        if key[0] == "b":
            numbers.add(key[1:])
        return numbers

    # --- events -------------------------------------------------------------------

    def touched(self, numbers: Iterable[Number]) -> Changes:
        """Events named these devices: what udev says of them (properties)
        is read again when next asked, and they count as changed, of
        either kind (an event's subsystem does not always say which)."""
        changes = Changes()
        for number in numbers:
            for kind in "bc":
                key = (kind, *number)
                self._properties.pop(key, None)
                if key in self._names:
                    changes.keys.add(key)
        return changes

    def device_changed(self, kind: str, numbers: Iterable[Number | None]) -> Changes:
        """Events for these devices: what sysfs says of them, and (block) of
        every device joined to them, is read again. A block event without a
        number reads every block device again."""
        numbers = list(numbers)
        changes = Changes()
        if kind != "b":
            keys = {(kind, *n) for n in numbers if n is not None}
            for key in keys:
                self._properties.pop(key, None)
            keys = {k for k in keys if k in self._names}
            # an alias came or went: its disk's family, seen from here
            keys |= {o for k in keys for o in self.overlapping(k)}
            return self._again(keys & self._names.keys(), changes)
        if None in numbers:
            keys = {k for k in self._names if k[0] == "b" or self._facts_of_alias(k)}
        else:
            for number in numbers:
                assert number is not None
                self._properties.pop(("b", *number), None)
                self._block_facts.pop(("b", *number), None)
            # one look at sysfs for both: who is joined, and what they are
            topology = self._topology()
            keys = self.joined_to([n for n in numbers if n is not None], topology)
            return self._again(keys, changes, topology)
        return self._again(keys, changes)

    def joined_to(
        self, numbers: Iterable[Number], topology: BlockTopology | None = None
    ) -> set[Key]:
        """The devices a block event on these devices reads again: those
        whose facts last named one of them, and those joined to one now (a
        new partition joins its disk, a new holder what is under it)."""
        use = HostUse(topology if topology is not None else self._topology(), {})
        keys: set[Key] = set()
        for number in numbers:
            key = ("b", *number)
            keys.add(key)
            keys |= self._reverse.get(key, set())
            keys |= self._joined.get(number, set())
            for member in use.joined(number):
                keys |= self._joined.get(member, set())
                keys.add(("b", *member))
        return keys & self._names.keys()

    def _facts_of_alias(self, key: Key) -> bool:
        facts = self._facts.get(key)
        return key[0] == "c" and facts is not None and bool(facts.family.same)

    def host_tables_changed(self) -> Changes:
        """The host mounted, unmounted or swapped: read its tables again and
        look again at the devices joined to one whose use changed."""
        if self.host is None:
            return Changes()
        old = self._tables
        new = self.host.read(self.dev_root, self.sys_root)
        self._tables = new
        if old is None:
            return self._again(set(self._names), Changes())
        numbers = {
            n
            for n in old.direct.keys() | new.direct.keys()
            if old.direct.get(n) != new.direct.get(n)
        }
        names = {
            n
            for n in old.journals.keys() | new.journals.keys()
            if old.journals.get(n) != new.journals.get(n)
        }
        if names:
            topology = self._topology()
            numbers |= {number for n in names if (number := topology.number(n)) is not None}
        keys: set[Key] = set()
        for number in numbers:
            keys |= self._joined.get(number, set())
        return self._again(keys & self._names.keys(), Changes())

    def _again(
        self, keys: set[Key], changes: Changes, topology: BlockTopology | None = None
    ) -> Changes:
        if not keys:
            return changes
        self._gen += 1
        if topology is None:
            topology = self._topology()
        observed = self._observe(keys, topology, self._host_use())
        for key, fact in observed.items():
            self._touch(key)  # looked at now: a slower look begun before does not undo it
            if self._facts.get(key) != fact:
                self._set_facts(key, fact, changes)
        return changes

    def watched(self) -> list[tuple[Key, str | None, Condition]]:
        """The devices whose condition sysfs says, with their kernel names
        and their condition as last read."""
        return [
            (key, facts.kernel_name, facts.condition)
            for key, facts in self._facts.items()
            if facts.condition.watched and key in self._names
        ]

    async def recheck(self) -> Changes:
        """Read the condition of every watched device again, in a worker
        thread (some of what it reads changes without an event: a SCSI
        device set offline, credits used). A device that changed meanwhile
        keeps what its later look found."""
        watched = self.watched()
        if not watched:
            return Changes()
        self._gen += 1
        since = self._gen
        changes = Changes()
        with self._looking_aside():
            found = await trio.to_thread.run_sync(read_again, self.sys_root, self.dev_root, watched)
            for key, now in found.items():
                facts = self._facts.get(key)
                if facts is None or facts.condition == now or self._since.get(key, 0) > since:
                    continue
                self._set_facts(key, replace(facts, condition=now), changes)
        return changes

    @contextmanager
    def one_look(self) -> Iterator[None]:
        """Within, every look and event reads sysfs through one topology: a
        batch of device events, applied at once (and with no await between),
        reads each sysfs entry once, though its look at the paths and its
        events for the devices ask the same device again."""
        if self._batch is not None:
            yield
            return
        self._batch = BlockTopology(self.sys_root, self.dev_root)
        try:
            yield
        finally:
            self._batch = None

    # --- the facts ------------------------------------------------------------

    def _topology(self) -> BlockTopology:
        if self._batch is not None:
            return self._batch
        return BlockTopology(self.sys_root, self.dev_root)

    def _host_use(self) -> HostTables | None:
        if self.host is None:
            return None
        if self._tables is None:
            self._tables = self.host.read(self.dev_root, self.sys_root)
        return self._tables

    def _observe(
        self, keys: set[Key], topology: BlockTopology, tables: HostTables | None
    ) -> dict[Key, Facts]:
        return observe(
            keys, topology, tables, self.sys_root, self.udev, self._by_identity, self._identity_of
        )

    def _identity_of(self, key: Key) -> tuple[str, str] | None:
        facts = self._facts.get(key)
        return facts.identity if facts is not None else None


def read_again(
    sys_root: Path, dev_root: Path, devices: Iterable[tuple[Key, str | None, Condition]]
) -> dict[Key, Condition]:
    """In a worker thread: the condition of each device whose state files
    say something else now, read again in full, through one topology."""
    topology = None
    found = {}
    for key, kernel, was in devices:
        if was.unchanged():
            continue
        if topology is None:
            topology = BlockTopology(sys_root, dev_root)
        found[key] = condition(topology, key, kernel)
    return found


def describe_key(key: Key) -> str:
    return f"{'block' if key[0] == 'b' else 'char'} {key[1]}:{key[2]}"


@dataclass
class SurveyPlan:
    """A copy of what a survey reads of the table, made on the Trio thread."""

    gen: int
    dev_root: Path
    sys_root: Path
    udev: UdevDatabase | None
    host: HostFiles | None
    by_identity: dict[tuple[str, str], set[Key]]
    identities: dict[Key, tuple[str, str]]

    def survey(self, paths: Iterable[str]) -> Survey:
        """In a worker thread: what each path names, and the facts of every
        device found (the host's tables read afresh)."""
        found: dict[str, Key | None] = {}
        dirs: Dirs = {}
        for path in paths:
            if path in found:
                continue
            found[path] = node_key(self.dev_root, path, dirs)
        tables = self.host.read(self.dev_root, self.sys_root) if self.host is not None else None
        keys = {k for k in found.values() if k is not None}
        facts = observe(
            keys,
            BlockTopology(self.sys_root, self.dev_root),
            tables,
            self.sys_root,
            self.udev,
            self.by_identity,
            self.identities.get,
            once_each=True,
        )
        return Survey(found, facts, tables)


def observe(
    keys: set[Key],
    topology: BlockTopology,
    tables: HostTables | None,
    sys_root: Path,
    udev: UdevDatabase | None,
    by_identity: Mapping[tuple[str, str], set[Key]],
    identity_of: Callable[[Key], tuple[str, str] | None],
    *,
    once_each: bool = False,
) -> dict[Key, Facts]:
    """The facts of these devices, from one topology and one reading of the
    host's tables (None: host use not looked at). `by_identity` and
    `identity_of` say what other devices are known to be; the identities
    of these are read first, so that devices looked at together find each
    other by identity. `once_each`: no device of these is observed again
    with this topology (a survey), so what only that device asks is not
    kept in it for the rest of the look."""
    identities: dict[Key, tuple[str, str] | None] = {}
    batch: dict[tuple[str, str], set[Key]] = {}
    kernel_names: dict[Key, str | None] = {}  # a block device's, from the uevent read for it
    for key in keys:
        if key[0] == "b":
            found, kernel_names[key] = topology.once(
                ("sysfs", key), partial(identity.block_sysfs, sys_root, udev, key[1:])
            )
        else:
            found = None
        identities[key] = found
        if found is not None:
            batch.setdefault(found, set()).add(key)

    def same_identity(key: Key) -> Iterable[Key]:
        value = identities[key] if key in identities else identity_of(key)
        if value is None:
            return ()
        known = {k for k in by_identity.get(value, ()) if k not in identities}
        return known | batch.get(value, set())

    use = HostUse(topology, tables.direct, tables.journals) if tables is not None else None
    # each directory's NUMA node, for every device of this look
    numa_dirs: dict[str, int | None] = topology.once(("numa dirs", None), dict)
    result = {}

    # What only this device asks (its kernel name, NUMA node, kernel
    # interface, condition) is kept in the topology, so that a batch that
    # observes a device twice reads sysfs once; except in a survey, which
    # observes each once: there 10,000 devices' worth of entries (about
    # 0.8 KiB a device) outlived the objects the look keeps, leaving the
    # allocator's pools half empty for good.
    def own(name: str, key: Key, read: Callable[[], T]) -> T:
        return read() if once_each else topology.once((name, key), read)

    for key in keys:
        kind, number = key[0], (key[1], key[2])
        whole_disk, has_partitions = topology.place(number) if kind == "b" else (None, False)
        if kind != "b":
            kernel_names[key] = own(
                "kernel name", key, partial(identity.kernel_name, sys_root, kind, number)
            )
        result[key] = Facts(
            kernel_name=kernel_names[key],
            identity=identities[key],
            numa=own("numa", key, partial(identity.numa_node, sys_root, kind, number, numa_dirs)),
            whole_disk=whole_disk,
            has_partitions=has_partitions,
            literal_only=own("literal", key, partial(special.by_number, kind, *number, sys_root))
            if kind == "c"  # a block device's answer needs no sysfs
            else special.by_number(kind, *number, sys_root),
            host_use=use.reason_of(key) if use is not None else None,
            family=family(topology, key, same_identity),
            host_group=use.group_of(key) if use is not None else frozenset(),
            condition=own(
                "condition", key, partial(read_condition, topology, key, kernel_names[key])
            ),
            no_medium=topology.once(("medium", key), partial(identity.no_medium, sys_root, number))
            if kind == "b"
            else None,
        )
    return result
