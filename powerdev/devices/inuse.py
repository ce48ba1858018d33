"""Keep the host's own disks out: which block devices the host is using.

A block device is in use by the host when a filesystem on it is mounted
(the host's mount table, or, when it cannot be read, sysfs
/sys/fs/<type>/<device>), when
it is active swap, when another block device holds it (dm, md, LVM, bcache:
sysfs `holders/` is not empty), or when one of its partitions is in use. The
stacking rule covers everything beneath a device in use: a mounted dm-0 holds
the partition under it through `slaves/`, and that partition makes its disk
in use. Everything here is a plain function of a mountinfo text, a
/proc/swaps text and a sysfs tree; the paths are arguments, so tests build
their own trees. The tracker asks HostUseGuard to screen what it lists.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path

from powerdev.devices.discovery import to_local
from powerdev.devices.model import HOST_DEV, Device

log = logging.getLogger(__name__)

Number = tuple[int, int]  # major, minor
_OCTAL = re.compile(r"\\([0-7]{3})")


def unescape(field: str) -> str:
    """The kernel writes space, tab, newline and backslash in these files as \\NNN."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_number(text: str) -> Number | None:
    major, sep, minor = text.strip().partition(":")
    if not sep or not major.isdigit() or not minor.isdigit():
        return None
    return int(major), int(minor)


def node_number(dev_root: Path, host_path: str) -> Number | None:
    """The numbers of the block node at a host path (links followed), if it is one."""
    if not host_path.startswith(HOST_DEV + "/"):
        return None
    try:
        st = os.stat(to_local(dev_root, host_path))
    except OSError:
        return None
    if not stat.S_ISBLK(st.st_mode):
        return None
    return os.major(st.st_rdev), os.minor(st.st_rdev)


def mounted(mountinfo: str, dev_root: Path) -> dict[Number, str]:
    """Block devices with a mounted filesystem, from a mountinfo text (proc(5)).

    Field 3 is the filesystem's device number; a filesystem with an anonymous
    number (btrfs, say: major 0) is found by its mount source, a /dev path
    looked up under dev_root.
    """
    found: dict[Number, str] = {}
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 5 or "-" not in fields[6:]:
            continue
        where = f"mounted at {unescape(fields[4])}"
        number = parse_number(fields[2])
        if number is not None and number[0] != 0:
            found.setdefault(number, where)
        after = fields[fields.index("-", 6) + 1 :]
        if len(after) >= 2:
            source = node_number(dev_root, unescape(after[1]))
            if source is not None:
                found.setdefault(source, where)
    return found


# Filesystems that list each mounted device in sysfs, by kernel name; the
# other entries there are the driver's own. btrfs lists <uuid>/devices/<name>.
_SYSFS_FS = {"ext4": {"features"}, "xfs": {"stats", "extra"}, "f2fs": {"features", "tuning"}}


def sysfs_mounted(sys_root: Path) -> dict[Number, str]:
    """Block devices under a mounted ext2/3/4, xfs, f2fs or btrfs filesystem,
    from sysfs alone (/sys/fs/<type>/<device>). It sees every mount in every
    namespace and needs neither the host's mount table nor any label but
    sysfs's, so it still works where reading the host's mountinfo is denied."""
    names: dict[str, str] = {}
    fs_root = sys_root / "fs"
    for fs_type, own in _SYSFS_FS.items():
        for name in _entries(fs_root / fs_type):
            if name not in own:
                names.setdefault(name, f"a mounted {fs_type} filesystem")
    for fs_id in _entries(fs_root / "btrfs"):
        for name in _entries(fs_root / "btrfs" / fs_id / "devices"):
            names.setdefault(name, "in a mounted btrfs filesystem")
    found: dict[Number, str] = {}
    for name, why in names.items():
        try:
            number = parse_number((sys_root / "class" / "block" / name / "dev").read_text())
        except OSError:
            continue
        if number is not None:
            found.setdefault(number, why)
    return found


def swapping(swaps: str, dev_root: Path) -> dict[Number, str]:
    """Block devices that are active swap, from a /proc/swaps text. Swap
    files live on a mounted filesystem, which mounted() already counts."""
    found: dict[Number, str] = {}
    for line in swaps.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 2 and fields[1] == "partition":
            number = node_number(dev_root, unescape(fields[0]))
            if number is not None:
                found.setdefault(number, "active swap")
    return found


def _sys_dir(sys_root: Path, number: Number) -> Path:
    return sys_root / "dev" / "block" / f"{number[0]}:{number[1]}"


def _entries(directory: Path) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except OSError:
        return []


def use_reason(sys_root: Path, number: Number, direct: Mapping[Number, str]) -> str | None:
    """Why the host uses the block device with this number, or None if it does not."""
    if number in direct:
        return direct[number]
    sys_dir = _sys_dir(sys_root, number)
    holders = _entries(sys_dir / "holders")
    if holders:
        return f"held by {', '.join(holders)}"
    for child in _entries(sys_dir):
        if not (sys_dir / child / "partition").exists():
            continue
        try:
            part = parse_number((sys_dir / child / "dev").read_text())
        except OSError:
            continue
        if part is None:
            continue
        why = direct.get(part)
        if why is None:
            part_holders = _entries(sys_dir / child / "holders")
            why = f"held by {', '.join(part_holders)}" if part_holders else None
        if why is not None:
            return f"its partition {child} is in use ({why})"
    return None


def read_text(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        return path.read_text(errors="replace")
    except OSError as err:
        log.warning("cannot read %s (%s): devices in use there are not recognised", path, err)
        return ""


class HostUseGuard:
    """Screens what a resource would list against what the host is using.

    - a device in use that was not listed is left out (logged once, with why);
    - a listed device that the host starts using stays listed, Unhealthy, so
      it is granted no more; it is Healthy again when the host lets go of it;
    - `allow=True` (a resource that explicitly allows host-used devices)
      turns the screen off.
    """

    def __init__(
        self, dev_root: Path, sys_root: Path, mountinfo: Path | None, swaps: Path | None
    ) -> None:
        self.dev_root = dev_root
        self.sys_root = sys_root
        self.mountinfo = mountinfo
        self.swaps = swaps
        self.left_out: dict[str, str] = {}  # host path -> why, for devices kept out

    def direct_use(self) -> dict[Number, str]:
        """Devices mounted or swapped on right now."""
        table = read_text(self.mountinfo) if self.mountinfo is not None else None
        # The mount table when we can read it; sysfs when not. (Not both: a
        # filesystem's sysfs entry outlives its unmount by a moment, and no
        # event would follow to take the device back.)
        found = mounted(table, self.dev_root) if table else sysfs_mounted(self.sys_root)
        for number, why in swapping(read_text(self.swaps), self.dev_root).items():
            found.setdefault(number, why)
        return found

    def reason(self, device: Device, direct: Mapping[Number, str]) -> str | None:
        if device.kind != "b":
            return None
        return use_reason(self.sys_root, (device.major, device.minor), direct)

    def screen(
        self, devices: Iterable[Device], listed: Mapping[str, Device], *, allow: bool
    ) -> list[Device]:
        """A rescan's devices, screened. `listed` is what was advertised before."""
        changes = self.screen_changes({d.path: d for d in devices}, listed, allow=allow)
        return [d for d in changes.values() if d is not None]

    def screen_changes(
        self, changes: Mapping[str, Device | None], listed: Mapping[str, Device], *, allow: bool
    ) -> dict[str, Device | None]:
        """Re-probed devices (path -> device, None if gone), screened."""
        screened = dict(changes)
        if allow:
            self._forget(self.left_out)
            return screened
        direct = self.direct_use()
        back = []
        for path, device in changes.items():
            why = self.reason(device, direct) if device is not None else None
            if why is None:
                if self.left_out.pop(path, None) is not None and device is not None:
                    back.append(path)
                continue
            if path in listed:
                screened[path] = replace(device, healthy=False)
                if listed[path].healthy:
                    log.warning("%s is now used by the host (%s): Unhealthy", path, why)
            else:
                screened[path] = None
                if self.left_out.get(path) != why:
                    log.warning("%s left out: the host uses it (%s)", path, why)
                self.left_out[path] = why
        for path in back:
            log.info("%s is no longer used by the host: listed again", path)
        return screened

    def _forget(self, paths: Iterable[str]) -> None:
        for path in list(paths):
            self.left_out.pop(path, None)


def recheck_paths(
    guard: HostUseGuard | None, listed: Mapping[str, Device], subsystems: Iterable[str]
) -> set[str]:
    """Paths to probe again after device events: when a block device came,
    went or changed, holders may have changed, so every listed block device
    and every device left out for host use is looked at again."""
    if guard is None or "block" not in set(subsystems):
        return set()
    return {p for p, d in listed.items() if d.kind == "b"} | set(guard.left_out)
