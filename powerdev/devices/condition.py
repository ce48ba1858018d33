"""What a device says of its own health, from state the kernel already
publishes in sysfs: no I/O to the device (a multipath map that queues
while it has no path would hang a reader) and no capability.

- A SCSI disk (or a partition of one, or its sg/bsg node): the SCSI
  device's `device/state` (running; blocked or quiesce while the
  transport recovers; offline, transport-offline, deleted: gone).
- An NVMe namespace, controller or generic node: the controller's `state`
  (live; resetting, connecting; deleting, dead). A namespace with native
  multipath counts each path under `multipath/`.
- A device-mapper map: suspended (its I/O waits) is failed. A multipath
  map (dm uuid `mpath-*`) counts its paths, the devices under `slaves/`:
  some not running is degraded, none running is failed. Any other map
  (LVM, dm-crypt) is as bad as the worst device it lies on.
- The NX-GZIP accelerator (PowerVM): the VAS credit pools under
  `/sys/devices/virtual/misc/vas/vas0/gzip`: no free credit in any pool is
  failed (every window open fails with EBUSY), none in the default pool
  but some in QoS's is degraded.

Two levels besides fine: degraded (it works, with less to spare) and
failed (it does not work now). A device with none of these (a loop
device, a tty) is fine, and nothing of it is watched.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field, replace

from powerdev.devices.inuse import BlockTopology

FINE, DEGRADED, FAILED = "fine", "degraded", "failed"
LEVELS = (FINE, DEGRADED, FAILED)
_RANK = {FINE: 0, DEGRADED: 1, FAILED: 2}

# SCSI device states (scsi_sysfs.c) and NVMe controller states (nvme sysfs),
# in one table: the words do not overlap.
STATES = {
    "running": FINE,
    "live": FINE,
    "created": DEGRADED,
    "blocked": DEGRADED,
    "created-blocked": DEGRADED,
    "quiesce": DEGRADED,
    "new": DEGRADED,
    "resetting": DEGRADED,
    "connecting": DEGRADED,
    "offline": FAILED,
    "transport-offline": FAILED,
    "cancel": FAILED,
    "deleted": FAILED,
    "deleting": FAILED,
    "deleting (no IO)": FAILED,
    "dead": FAILED,
}
NX_GZIP = "crypto/nx-gzip"  # the accelerator's kernel name
VAS_GZIP = "devices/virtual/misc/vas/vas0/gzip"  # under /sys
_POOLS = ("default_capabilities", "qos_capabilities")

Key = tuple[str, int, int]


@dataclass(frozen=True, slots=True)
class Condition:
    level: str = FINE
    why: str = ""  # what is wrong, in words that follow "<path>: "
    # its paths (a multipath map's, a native NVMe multipath namespace's),
    # by kernel name, with the state each is in
    paths: tuple[tuple[str, str], ...] = ()
    watched: bool = False  # something in sysfs says how it is: look again later
    # the state files it was read from, with what each said: a recheck reads
    # only these, and looks again in full only when one says something else
    read: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    @property
    def fine(self) -> bool:
        return self.level == FINE

    @property
    def failed(self) -> bool:
        return self.level == FAILED

    def path_counts(self) -> dict[str, int]:
        """How many of its paths are in each state."""
        return dict(Counter(state for _, state in self.paths))

    def describe(self) -> str:
        return self.level if self.fine else f"{self.level}: {self.why}"

    def unchanged(self) -> bool:
        """Does every state file it was read from say what it said?"""
        return all(_read(path) == said for path, said in self.read)


UNWATCHED = Condition()


def condition(topology: BlockTopology, key: Key, kernel_name: str | None) -> Condition:
    """The device's condition now, as sysfs says (read once a topology)."""
    return topology.once(("condition", key), lambda: read_condition(topology, key, kernel_name))


def read_condition(topology: BlockTopology, key: Key, kernel_name: str | None) -> Condition:
    """condition(), read now, for a caller that asks it once a look."""
    return _Look(topology).device(key, kernel_name)


class _Look:
    """One device's condition, read through a topology, with the state files
    it read."""

    def __init__(self, topology: BlockTopology) -> None:
        self.topology = topology
        self.sys = str(topology.sys_root)
        self.read: list[tuple[str, str]] = []

    def state(self, path: str) -> str | None:
        text = _read(path)
        if text is not None:
            self.read.append((path, text))
            return text.strip()
        return None

    def device(self, key: Key, kernel_name: str | None) -> Condition:
        if key[0] == "b":
            name = self.topology.name((key[1], key[2]))
            found = self.block(name, 0) if name is not None else UNWATCHED
        elif kernel_name == NX_GZIP:
            found = self.credits()
        else:
            found = self.char(key)
        if not found.watched:
            return UNWATCHED
        return replace(found, read=tuple(self.read))

    def char(self, key: Key) -> Condition:
        try:
            here = os.path.realpath(f"{self.sys}/dev/char/{key[1]}:{key[2]}", strict=True)
        except (OSError, ValueError):
            return UNWATCHED
        for state_file in (f"{here}/state", f"{here}/device/state"):
            state = self.state(state_file)
            if state is not None:
                return _one_state(state)
        return UNWATCHED

    def block(self, name: str, depth: int) -> Condition:
        disk = self.topology.disk(name)
        if disk is not None and depth < 8:
            found = self.block(disk, depth + 1)
            if found.fine:
                return found
            return Condition(found.level, f"its disk {disk}: {found.why}", found.paths, True)
        here = f"{self.sys}/class/block/{name}"
        if os.path.exists(f"{here}/dm"):
            return self.map(name, here, depth)
        if os.path.exists(f"{here}/multipath"):
            paths = [
                (path, self.state(f"{here}/multipath/{path}/device/state") or UNKNOWN)
                for path in _names(f"{here}/multipath")
            ]
            return _paths(paths)
        state = self.state(f"{here}/device/state")
        if state is not None:
            return _one_state(state)
        return UNWATCHED

    def map(self, name: str, here: str, depth: int) -> Condition:
        if self.state(f"{here}/dm/suspended") == "1":
            return Condition(
                FAILED, "its device-mapper map is suspended: I/O to it waits", (), True
            )
        slaves = self.topology.slaves(name) if depth < 8 else ()
        if (_read(f"{here}/dm/uuid") or "").startswith("mpath-"):
            return _paths([(slave, self.path_state(slave, depth)) for slave in slaves])
        worst = Condition(watched=True)
        for slave in slaves:
            found = self.block(slave, depth + 1)
            if _RANK[found.level] > _RANK[worst.level]:
                worst = Condition(
                    found.level, f"it lies on {slave}: {found.why}", found.paths, True
                )
        return worst

    def path_state(self, name: str, depth: int) -> str:
        """A multipath map's path, in one word: its SCSI or NVMe state, or
        (a map under a map) its level; "unknown" where sysfs says nothing."""
        state = self.state(f"{self.sys}/class/block/{name}/device/state")
        if state is not None:
            return state
        found = self.block(name, depth + 1)
        if not found.watched:
            return UNKNOWN
        return "running" if found.fine else found.level

    def credits(self) -> Condition:
        """NX-GZIP: its credit pools, where sysfs has them (PowerVM)."""
        root = f"{self.sys}/{VAS_GZIP}"
        free: dict[str, tuple[int, int]] = {}
        for pool in _POOLS:
            total = _number(self.state(f"{root}/{pool}/nr_total_credits"))
            used = _number(self.state(f"{root}/{pool}/nr_used_credits"))
            if total is not None and used is not None:
                free[pool.removesuffix("_capabilities")] = (total - used, total)
        if not free:
            return UNWATCHED  # PowerNV, or no VAS: nothing to count
        said = ", ".join(f"{pool} {max(left, 0)} of {n} free" for pool, (left, n) in free.items())
        if all(left <= 0 for left, _ in free.values()):
            return Condition(FAILED, f"no free credit: a window open fails ({said})", (), True)
        if free.get("default", (1, 1))[0] <= 0:
            return Condition(DEGRADED, f"no free credit in the default pool ({said})", (), True)
        return Condition(FINE, "", (), True)


UNKNOWN = "unknown"
SUSPENDED = "its device-mapper map is suspended: I/O to it waits"
_WORKING = {UNKNOWN, DEGRADED}  # path words that still carry I/O, besides fine states


def _paths(paths: list[tuple[str, str]]) -> Condition:
    paths.sort()
    if not paths:
        return Condition(FAILED, "a multipath device with no path", (), True)
    down = [f"{name} {state}" for name, state in paths if not _works(state)]
    if not down:
        return Condition(FINE, "", tuple(paths), True)
    working = len(paths) - len(down)
    what = "no working path" if not working else f"{working} of {len(paths)} paths working"
    level = FAILED if not working else DEGRADED
    return Condition(level, f"{what} ({', '.join(down)})", tuple(paths), True)


def _works(state: str) -> bool:
    return STATES.get(state) == FINE or state in _WORKING


def _one_state(state: str) -> Condition:
    level = STATES.get(state)
    if level is None:
        return Condition(DEGRADED, f"state {state} (not a state powerdev knows)", (), True)
    if level == FINE:
        return Condition(FINE, "", (), True)
    return Condition(level, f"state {state}", (), True)


def _read(path: str) -> str | None:
    """A small sysfs file's text (os calls: a recheck reads thousands)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _names(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []


def _number(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
