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
from dataclasses import dataclass

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


UNWATCHED = Condition()


def condition(topology: BlockTopology, key: Key, kernel_name: str | None) -> Condition:
    """The device's condition now, as sysfs says (read once a topology)."""
    return topology.once(("condition", key), lambda: _condition(topology, key, kernel_name))


def _condition(topology: BlockTopology, key: Key, kernel_name: str | None) -> Condition:
    if key[0] == "b":
        name = topology.name((key[1], key[2]))
        return _block(topology, name, 0) if name is not None else UNWATCHED
    if kernel_name == NX_GZIP:
        return _credits(topology)
    here = _char_dir(topology, key)
    if here is None:
        return UNWATCHED
    for state_file in (f"{here}/state", f"{here}/device/state"):
        state = _read(state_file)
        if state is not None:
            return _one_state(state.strip())
    return UNWATCHED


def _block(topology: BlockTopology, name: str, depth: int) -> Condition:
    disk = topology.disk(name)
    if disk is not None and depth < 8:
        found = _block(topology, disk, depth + 1)
        if found.fine:
            return found
        return Condition(found.level, f"its disk {disk}: {found.why}", found.paths, True)
    here = f"{topology.sys_root}/class/block/{name}"
    if os.path.exists(f"{here}/dm"):
        return _map(topology, name, here, depth)
    if os.path.exists(f"{here}/multipath"):
        paths = [
            (path, (_read(f"{here}/multipath/{path}/device/state") or "").strip())
            for path in _names(f"{here}/multipath")
        ]
        return _paths(paths)
    state = _read(f"{here}/device/state")
    if state is not None:
        return _one_state(state.strip())
    return UNWATCHED


def _map(topology: BlockTopology, name: str, here: str, depth: int) -> Condition:
    if (_read(f"{here}/dm/suspended") or "").strip() == "1":
        return Condition(FAILED, "its device-mapper map is suspended: I/O to it waits", (), True)
    slaves = topology.slaves(name) if depth < 8 else ()
    if (_read(f"{here}/dm/uuid") or "").startswith("mpath-"):
        return _paths([(slave, _path_state(topology, slave, depth)) for slave in slaves])
    worst = Condition(watched=True)
    for slave in slaves:
        found = _block(topology, slave, depth + 1)
        if _RANK[found.level] > _RANK[worst.level]:
            worst = Condition(found.level, f"it lies on {slave}: {found.why}", found.paths, True)
    return worst


def _path_state(topology: BlockTopology, name: str, depth: int) -> str:
    """A multipath map's path, in one word: its SCSI or NVMe state, or
    (a map under a map) its level; "unknown" where sysfs says nothing."""
    state = _read(f"{topology.sys_root}/class/block/{name}/device/state")
    if state is not None:
        return state.strip()
    found = _block(topology, name, depth + 1)
    if not found.watched:
        return UNKNOWN
    return "running" if found.fine else found.level


UNKNOWN = "unknown"
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


def _char_dir(topology: BlockTopology, key: Key) -> str | None:
    link = f"{topology.sys_root}/dev/char/{key[1]}:{key[2]}"
    try:
        return os.path.realpath(link, strict=True)
    except (OSError, ValueError):
        return None


def _credits(topology: BlockTopology) -> Condition:
    """NX-GZIP: its credit pools, where sysfs has them (PowerVM)."""
    root = f"{topology.sys_root}/{VAS_GZIP}"
    free: dict[str, tuple[int, int]] = {}
    for pool in _POOLS:
        total, used = (
            _number(f"{root}/{pool}/nr_total_credits"),
            _number(f"{root}/{pool}/nr_used_credits"),
        )
        if total is not None and used is not None:
            free[pool.removesuffix("_capabilities")] = (total - used, total)
    if not free:
        return UNWATCHED  # PowerNV, or no VAS: nothing to count
    said = ", ".join(
        f"{pool} {max(left, 0)} of {total} free" for pool, (left, total) in free.items()
    )
    if all(left <= 0 for left, _ in free.values()):
        return Condition(FAILED, f"no free credit: a window open fails ({said})", (), True)
    if free.get("default", (1, 1))[0] <= 0:
        return Condition(DEGRADED, f"no free credit in the default pool ({said})", (), True)
    return Condition(FINE, "", (), True)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _names(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []


def _number(path: str) -> int | None:
    text = _read(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
