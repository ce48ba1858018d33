"""Device nodes on the host, by path: what a path is (probe), which paths
patterns match, the host's block devices, and the control nodes that must
never be granted by a wildcard. No config here: resources/matching.py asks
these for each resource.

Patterns are host paths ("/dev/dm-*") matched as Go's filepath.Match does:
`*` never crosses a "/". The host's /dev may be mounted elsewhere
(`dev_root`, e.g. /host/dev); reported paths are always host paths.
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from powerdev.devices import gomatch, identity
from powerdev.devices.model import HOST_DEV, Device, device_id

NX_GZIP = "/dev/crypto/nx-gzip"
# Memory-backed block devices that are never SAN or local disks. Loop devices
# are left out of block discovery too; include them with a pattern.
_VIRTUAL_BLOCK_PREFIXES = ("ram", "loop", "zram")
_MAX_LINKS = 40  # as the kernel's own bound on links followed in one lookup


def matches(pattern: str, host_path: str) -> bool:
    """Go's filepath.Match (patterns were checked when the config was read)."""
    return gomatch.match(pattern, host_path)


def matches_any(patterns: Iterable[str], host_path: str) -> bool:
    return any(matches(p, host_path) for p in patterns)


def to_local(dev_root: Path, host_path: str) -> Path:
    """Where a host path is visible to us, given the host /dev is at dev_root."""
    rel = host_path.removeprefix(HOST_DEV).lstrip("/")
    return dev_root / rel if rel else dev_root


@functools.lru_cache(maxsize=8)
def _roots(dev_root: str) -> tuple[str, tuple[str, ...]]:
    """The dev root, normalised, and where a proc filesystem may be reached
    from: /proc, and the proc beside a host /dev mounted elsewhere
    (/host/proc beside /host/dev)."""
    root = os.path.normpath(dev_root)
    beside = os.path.join(os.path.dirname(root), "proc")
    return root, ("/proc", beside) if beside != "/proc" else ("/proc",)


def _in_proc(path: str, procs: tuple[str, ...]) -> bool:
    return any(path == proc or path.startswith(proc + "/") for proc in procs)


Dirs = dict[str, str | None]  # a directory -> its real path (None: in a proc filesystem)


def node_stat(
    dev_root: Path, host_path: str, dirs: Dirs | None = None
) -> tuple[str, os.stat_result] | None:
    """Where the node a host path names is visible to us, and its stat:
    links followed (a relative one from its own directory, an absolute one
    from the root), but never through a proc filesystem: /dev/stdin ->
    /proc/self/fd/0, /dev/fd -> /proc/self/fd and /dev/core -> /proc/kcore
    name what the process looking holds, not a device of the host. None
    when the path is not there, goes through /proc or loops. `dirs` keeps
    the directories resolved so far (one look at many paths: one lstat a
    path, plus one a link)."""
    root, procs = _roots(os.fspath(dev_root))
    rel = host_path.removeprefix(HOST_DEV).strip("/")
    local = f"{root}/{rel}" if rel else root
    known = dirs if dirs is not None else {}
    for _ in range(_MAX_LINKS):
        parent, _, name = local.rpartition("/")
        parent = parent or "/"
        real_parent = known.get(parent, "")
        if real_parent == "":
            real_parent = os.path.realpath(parent)
            real_parent = None if _in_proc(real_parent, procs) else real_parent
            known[parent] = real_parent
        if real_parent is None:
            return None
        here = f"{real_parent.rstrip('/')}/{name}" if name else real_parent
        try:
            st = os.lstat(here)
        except OSError:
            return None
        if not stat.S_ISLNK(st.st_mode):
            return here, st
        try:
            target = os.readlink(here)
        except OSError:
            return None
        local = os.path.normpath(os.path.join(real_parent, target))
        if _in_proc(local, procs):
            return None
    return None


def local_node(dev_root: Path, host_path: str) -> str | None:
    """node_stat()'s place alone."""
    found = node_stat(dev_root, host_path)
    return found[0] if found is not None else None


def probe(dev_root: Path, host_path: str, dirs: Dirs | None = None) -> Device | None:
    """The device at host_path if it is a character or block node (links
    followed, never through /proc: node_stat)."""
    key = node_key(dev_root, host_path, dirs)
    if key is None:
        return None
    return Device(device_id(host_path), host_path, *key, key=key)


def node_key(
    dev_root: Path, host_path: str, dirs: Dirs | None = None
) -> tuple[str, int, int] | None:
    """What probe() finds, as the device table keys it: kind and numbers,
    and nothing made that a look at many paths would throw away."""
    found = node_stat(dev_root, host_path, dirs)
    if found is None:
        return None
    mode, rdev = found[1].st_mode, found[1].st_rdev
    if stat.S_ISBLK(mode):
        return ("b", os.major(rdev), os.minor(rdev))
    if stat.S_ISCHR(mode):
        return ("c", os.major(rdev), os.minor(rdev))
    return None  # regular file, directory, FIFO, socket: never a device


def is_virtual_block(name: str) -> bool:
    return name.startswith(_VIRTUAL_BLOCK_PREFIXES)


def block_candidates(sys_root: Path) -> list[str]:
    """Host paths of the block devices the kernel lists: disks, partitions, dm-*."""
    class_block = sys_root / "class" / "block"
    try:
        names = sorted(os.listdir(class_block))
    except OSError:
        return []
    paths = []
    for name in names:
        if is_virtual_block(name):
            continue
        paths.append(f"{HOST_DEV}/{identity.devname(class_block / name) or name}")
    return paths


def include_candidates(dev_root: Path, patterns: Iterable[str]) -> list[str]:
    """Host paths under dev_root that match any include pattern (Go's Glob)."""
    found: list[str] = []
    for pattern in patterns:
        rel = pattern.removeprefix(HOST_DEV)
        if rel.startswith("/"):  # the config refuses patterns outside /dev
            found.extend(f"{HOST_DEV}{p}" for p in gomatch.glob(dev_root, rel))
    return found


def missing_directories(patterns: Iterable[str], dev_root: Path) -> list[tuple[str, Path]]:
    """(pattern, directory) for each pattern whose fixed directory part does
    not exist under dev_root: it can match nothing until that directory appears."""
    missing = []
    for pattern in patterns:
        elements = pattern.removeprefix(HOST_DEV).strip("/").split("/")[:-1]
        fixed = []
        for element in elements:
            if gomatch.has_magic(element):
                break
            fixed.append(element)
        where = dev_root.joinpath(*fixed)
        if not where.is_dir():
            missing.append((pattern, where))
    return missing


def control_allowed(device: Device, include: Iterable[str], sys_root: Path) -> bool:
    """May this node be granted under these patterns? A control node or a
    kernel interface only when a pattern names it literally (special.py)."""
    from powerdev.devices import special

    why = special.why_literal_only(device.kind, device.major, device.minor, device.path, sys_root)
    return why is None or special.named_literally(device.path, include)
