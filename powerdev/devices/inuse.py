"""Keep the host's own disks out: which devices the host uses, and why.

The rule. A block device is host-used when

- it is used directly: a filesystem on it is mounted (the host's mount
  table; sysfs /sys/fs/<type>/<device> when that cannot be read), it is an
  XFS external log or realtime device named by a mount, an external jbd2
  (ext4) journal in use, or active swap; and, while a swap FILE is active,
  when it holds a filesystem sysfs shows alive that the mount table does not
  (a lazily unmounted filesystem a swap file keeps busy);
- or a chain of these relations joins it to such a device: a partition
  and its whole disk (both ways, so every neighbour of a mounted partition
  is used, kpartx partition maps of a multipath disk included), a device
  and what it is stacked on (sysfs `slaves/`, a loop device's backing
  block device) and what is stacked on it (`holders/`, loop devices over
  it), and the members of one btrfs filesystem;
- or it is held: another block device is stacked on it (dm, md, LVM,
  bcache: `holders/`; a loop device whose backing file is this device),
  and so are its whole disk and every partition of that disk. Being held
  spreads no further: a multipath map or a logical volume is not host-used
  because its own legs are held, nor is a kpartx partition map because it
  holds its disk.

A character device that reaches a disk another way (/dev/sg*, /dev/bsg/*,
the NVMe generic /dev/ng*n*, an NVMe controller's /dev/nvme*) is host-used
when a disk it reaches is.

Each answer carries the reason, one chain of the relations above ("on the
same disk as sda2, which is mounted at /boot"). The device table
(table.py) keeps each device's answer, which the one verdict reads, so the
daemon's log and `powerdev scan` say the same.

Everything is a plain function of a mountinfo text, a /proc/swaps text, the
/proc/fs/jbd2 names and a sysfs tree, whose paths are arguments. One look
(survey) reads the tables once and sysfs only as the questions need it,
each entry at most once: for a device asked about, the group of devices
the relations join it to, plus one listing of the virtual block devices
(for loop backing) and of /sys/fs/btrfs. No walk of /sys: a device event
costs what its own disks and stacks hold.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from powerdev.devices.discovery import to_local
from powerdev.devices.model import HOST_DEV, Device

log = logging.getLogger(__name__)

Number = tuple[int, int]  # major, minor
T = TypeVar("T")
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
    except (OSError, ValueError):
        return None
    if not stat.S_ISBLK(st.st_mode):
        return None
    return os.major(st.st_rdev), os.minor(st.st_rdev)


# Mount options that name another device of the same filesystem.
_OTHER_DEVICES = {"logdev": "the external log", "rtdev": "the realtime device"}


def mounted(mountinfo: str, dev_root: Path) -> dict[Number, str]:
    """Block devices with a mounted filesystem, from a mountinfo text (proc(5)).

    Field 3 is the filesystem's device number; a filesystem with an anonymous
    number (btrfs, say: major 0) is found by its mount source, a /dev path
    looked up under dev_root. XFS names its external log and realtime device
    in the super options (logdev=, rtdev=), looked up the same way.
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
        if len(after) >= 3:
            for option in after[2].split(","):
                key, sep, value = option.partition("=")
                if sep and key in _OTHER_DEVICES:
                    other = node_number(dev_root, unescape(value))
                    if other is not None:
                        found.setdefault(
                            other, f"{_OTHER_DEVICES[key]} of the {after[0]} filesystem {where}"
                        )
    return found


# Filesystems that list each mounted device in sysfs, by kernel name; the
# other entries there are the driver's own. btrfs lists <uuid>/devices/<name>.
_SYSFS_FS = {"ext4": {"features"}, "xfs": {"stats", "extra"}, "f2fs": {"features", "tuning"}}


def live_filesystems(sys_root: Path) -> dict[str, str]:
    """Block device name -> filesystem type, for every ext2/3/4, xfs, f2fs and
    btrfs filesystem the kernel has alive (/sys/fs/<type>/<device>): mounted
    in any namespace, or unmounted lazily and still busy."""
    names: dict[str, str] = {}
    fs_root = sys_root / "fs"
    for fs_type, own in _SYSFS_FS.items():
        for name in _entries(fs_root / fs_type):
            if name not in own:
                names.setdefault(name, fs_type)
    for fs_id in _entries(fs_root / "btrfs"):
        for name in _entries(fs_root / "btrfs" / fs_id / "devices"):
            names.setdefault(name, "btrfs")
    return names


def live_devices(sys_root: Path) -> dict[Number, str]:
    """live_filesystems() by device number."""
    found: dict[Number, str] = {}
    for name, fs_type in live_filesystems(sys_root).items():
        number = _read_number(sys_root / "class" / "block" / name / "dev")
        if number is not None:
            found.setdefault(number, fs_type)
    return found


def sysfs_mounted(sys_root: Path) -> dict[Number, str]:
    """Block devices under a mounted ext2/3/4, xfs, f2fs or btrfs filesystem,
    from sysfs alone. It sees every mount in every namespace and needs
    neither the host's mount table nor any label but sysfs's, so it still
    works where reading the host's mountinfo is denied."""
    return {
        number: "in a mounted btrfs filesystem"
        if fs_type == "btrfs"
        else f"a mounted {fs_type} filesystem"
        for number, fs_type in live_devices(sys_root).items()
    }


def _swap_lines(swaps: str) -> Iterable[tuple[str, str]]:
    for line in swaps.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 2:
            yield unescape(fields[0]), fields[1]


def swapping(swaps: str, dev_root: Path) -> dict[Number, str]:
    """Block devices that are active swap, from a /proc/swaps text."""
    found: dict[Number, str] = {}
    for path, kind in _swap_lines(swaps):
        if kind == "partition":
            number = node_number(dev_root, path)
            if number is not None:
                found.setdefault(number, "active swap")
    return found


def swap_files(swaps: str) -> list[str]:
    """The active swap files, as /proc/swaps names them: a path in the host's
    namespace, or relative to a detached mount once lazily unmounted."""
    return [path for path, kind in _swap_lines(swaps) if kind == "file"]


def journal_entries(jbd2: Path | None) -> list[str]:
    """The entries of /proc/fs/jbd2, one per jbd2 journal in use (ext4's,
    ocfs2's): "<device>-<inode>" for a journal inside a filesystem, and
    "<device>" for an external journal, a block device of its own. So an
    entry that is a block device's name is an external journal."""
    return _entries(jbd2) if jbd2 is not None else []


def read_text(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        return path.read_text(errors="replace")
    except OSError as err:
        log.warning("cannot read %s (%s): devices in use there are not recognised", path, err)
        return ""


def _entries(directory: Path | str) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except OSError:
        return []


def _read(path: Path | str) -> str | None:
    try:
        with open(path, errors="replace") as f:
            return f.read(4096)  # sysfs attributes are a page at most
    except (OSError, ValueError):
        return None


def _read_number(path: Path | str) -> Number | None:
    text = _read(path)
    return parse_number(text) if text is not None else None


def _exists(path: str) -> bool:
    try:
        os.stat(path)
    except (OSError, ValueError):
        return False
    return True


def _link(path: Path | str) -> str | None:
    try:
        return os.readlink(path)
    except (OSError, ValueError):
        return None


def _last_name(link: str) -> str:
    """Path(link).name, without making a Path of it where the link is plain."""
    name = link.rpartition("/")[2]
    return name if name and name != "." else Path(link).name


_UNKNOWN = object()  # not in a topology's memo yet


# --- the block topology, read on demand ------------------------------------

_DM_PARTITION = re.compile(r"part\d+-")  # kpartx: DM_UUID part<N>-<uuid of the disk map>
_NVME_DISK = re.compile(r"nvme(\d+)(?:c(\d+))?n(\d+)")
_NVME_GENERIC = re.compile(r"ng(\d+)n(\d+)")
_ALIAS_CLASSES = ("scsi_generic", "bsg", "nvme-generic", "nvme")


class BlockTopology:
    """The host's block devices as sysfs shows them, by kernel name. Each
    sysfs entry is read the first time it is needed and never again, so one
    topology is one consistent-enough look; make a new one per screening."""

    def __init__(self, sys_root: Path, dev_root: Path | None = None) -> None:
        self.sys_root = sys_root
        self.dev_root = dev_root  # for loop backing files; None: /dev/<kernel name> only
        self._sys = str(sys_root)
        self._block = f"{self._sys}/class/block"
        self._memo: dict[tuple[str, object], object] = {}
        self._loops: dict[str, list[str]] | None = None  # backing name -> loop names
        self._backing: dict[str, str] = {}  # loop name -> backing name
        self._btrfs: dict[str, tuple[str, ...]] | None = None  # member -> members

    def _once(self, key: tuple[str, object], compute: Callable[[], T]) -> T:
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def once(self, key: tuple[str, object], compute: Callable[[], T]) -> T:
        """compute(), the first time this look asks `key` (a name of the
        caller's, not one of the topology's own): what else sysfs says of a
        device, read once a look like the topology's entries."""
        return self._once(("else", key), compute)

    def _dir(self, name: str) -> str:
        """/sys/class/block/<name>, as a string: paths here are built by the
        thousand, and pathlib objects cost more than the system calls."""
        return f"{self._block}/{name}"

    # The few questions every device asks look in the memo themselves: a
    # closure a question costs more than the answer, once it is known.

    def _is_partition(self, name: str) -> bool:
        key = ("partition", name)
        found = self._memo.get(key, _UNKNOWN)
        if found is _UNKNOWN:
            found = self._memo[key] = _exists(f"{self._block}/{name}/partition")
        return found  # type: ignore[return-value]

    def name(self, number: Number) -> str | None:
        """The kernel name of the block device with these numbers, if sysfs has it."""
        key = ("name", number)
        found = self._memo.get(key, _UNKNOWN)
        if found is not _UNKNOWN:
            return found  # type: ignore[return-value]
        link = _link(f"{self._sys}/dev/block/{number[0]}:{number[1]}")
        name = _last_name(link) if link else None
        if name is not None and self._memo.get(("number", name)) is None:
            self._memo[("number", name)] = number  # sysfs's own link says so
        self._memo[key] = name
        return name

    def number(self, name: str) -> Number | None:
        key = ("number", name)
        found = self._memo.get(key, _UNKNOWN)
        if found is _UNKNOWN:
            found = self._memo[key] = _read_number(f"{self._block}/{name}/dev")
        return found  # type: ignore[return-value]

    def exists(self, name: str) -> bool:
        key = ("exists", name)
        found = self._memo.get(key, _UNKNOWN)
        if found is _UNKNOWN:
            found = self._memo[key] = _exists(f"{self._block}/{name}")
        return found  # type: ignore[return-value]

    def disk(self, name: str) -> str | None:
        """The whole disk of a partition: a kernel partition's parent, or the
        one device a kpartx partition map is stacked on."""

        def compute() -> str | None:
            if self._is_partition(name):
                link = _link(self._dir(name))
                return os.path.basename(os.path.dirname(link)) if link else None
            if name.startswith("dm-"):
                uuid = _read(f"{self._dir(name)}/dm/uuid") or ""
                slaves = _entries(f"{self._dir(name)}/slaves")
                if _DM_PARTITION.match(uuid) and len(slaves) == 1:
                    return slaves[0]
            return None

        return self._once(("disk", name), compute)

    def parts(self, name: str) -> tuple[str, ...]:
        """The partitions of a disk: kernel partitions and kpartx partition maps."""

        def compute() -> tuple[str, ...]:
            if self._is_partition(name):
                return ()  # a partition has none of its own
            found = [
                entry
                for entry in _entries(self._dir(name))
                if entry.startswith(name) and _exists(f"{self._dir(name)}/{entry}/partition")
            ]
            found += [h for h in self._sysfs_holders(name) if self.disk(h) == name]
            return tuple(found)

        return self._once(("parts", name), compute)

    def _sysfs_holders(self, name: str) -> list[str]:
        return self._once(("holders", name), lambda: _entries(f"{self._dir(name)}/holders"))

    def holders(self, name: str) -> tuple[str, ...]:
        """What is stacked on it: holders/ and loop devices backed by it."""
        return (*self._sysfs_holders(name), *self.loops_over(name))

    def slaves(self, name: str) -> tuple[str, ...]:
        """What it is stacked on: slaves/, or a loop device's backing device."""
        below = self._once(
            ("slaves", name),
            lambda: [] if self._is_partition(name) else _entries(f"{self._dir(name)}/slaves"),
        )
        backing = self._loop_backing().get(name)
        return (*below, backing) if backing else tuple(below)

    def place(self, number: Number) -> tuple[Number | None, bool]:
        """Where a block device sits among the disks: (its whole disk's
        numbers if it is a partition, does it have partitions), kernel
        partitions and kpartx partition maps alike."""
        name = self.name(number)
        if name is None:
            return None, False
        disk = self.disk(name)
        if disk is not None:
            return self.number(disk), False
        return None, bool(self.parts(name))

    def held_by(self, name: str) -> tuple[str, ...]:
        """What holds it, but its own partition maps (a disk is not held by them)."""
        return tuple(h for h in self.holders(name) if self.disk(h) != name)

    def loops_over(self, name: str) -> list[str]:
        """Loop devices whose backing file is this block device."""
        self._loop_backing()
        assert self._loops is not None
        return self._loops.get(name, [])

    def _loop_backing(self) -> dict[str, str]:
        """Loop device -> the block device its backing file is, read once for
        every loop device (they are all virtual block devices)."""
        if self._loops is None:
            self._loops = {}
            virtual = f"{self._sys}/devices/virtual/block"
            for loop in _entries(virtual):
                if not loop.startswith("loop"):
                    continue
                backing = self._backing_device(_read(f"{virtual}/{loop}/loop/backing_file"))
                if backing is not None and backing != loop:
                    self._backing[loop] = backing
                    self._loops.setdefault(backing, []).append(loop)
        return self._backing

    def _backing_device(self, text: str | None) -> str | None:
        """The block device a loop device's backing_file names, if it is one."""
        if not text:
            return None
        path = text.strip().removesuffix(" (deleted)")
        number = node_number(self.dev_root, path) if self.dev_root is not None else None
        if number is not None:
            return self.name(number)
        plain = path.removeprefix(HOST_DEV + "/")
        if path.startswith(HOST_DEV + "/") and "/" not in plain and self.exists(plain):
            return plain  # /dev/<kernel name>, not visible under our dev root
        return None

    def btrfs_members(self, name: str) -> tuple[str, ...]:
        """The other devices of the btrfs filesystem it belongs to."""
        if self._btrfs is None:
            self._btrfs = {}
            fs_root = f"{self._sys}/fs/btrfs"
            for fs_id in _entries(fs_root):
                members = tuple(_entries(f"{fs_root}/{fs_id}/devices"))
                for member in members:
                    self._btrfs[member] = members
        members = self._btrfs.get(name)
        return tuple(m for m in members if m != name) if members else ()

    def aliased_disks(self, number: Number) -> tuple[str, ...]:
        """The block devices a character device reaches: for a SCSI generic
        or bsg node, the disks of its SCSI device; for an NVMe generic node,
        its namespace; for an NVMe controller, every namespace of it."""
        return self._once(("alias", number), lambda: self._aliased_disks(number))

    def _aliased_disks(self, number: Number) -> tuple[str, ...]:
        char = f"{os.fspath(self.sys_root)}/dev/char/{number[0]}:{number[1]}"
        if _link(char) is None:
            return ()  # not in sysfs: the common case for a node of no class, one call
        try:
            here = Path(os.path.realpath(char, strict=True))
        except (OSError, ValueError):
            return ()
        link = _link(here / "subsystem")
        kind = Path(link).name if link else ""
        if kind not in _ALIAS_CLASSES:
            return ()
        if kind in ("scsi_generic", "bsg"):
            names = _entries(here / "device" / "block")
        elif kind == "nvme":
            names = [n for n in _entries(here) if _NVME_DISK.fullmatch(n)]
        else:
            names = self._nvme_namespace(here)
        disks = []
        for name in names:
            head = self._nvme_head(name)
            if self.exists(head):
                disks.append(head)
        return tuple(dict.fromkeys(disks))

    def _nvme_namespace(self, here: Path) -> list[str]:
        """ng<A>n<B>: the disk nvme<A>n<B> beside it (its controller's, or the
        multipath head's in the subsystem) or a path nvme<S>c<A>n<B>."""
        generic = _NVME_GENERIC.fullmatch(here.name)
        if generic is None:
            return []
        owner, head = generic.groups()
        found = []
        for entry in _entries(here / "device"):
            disk = _NVME_DISK.fullmatch(entry)
            if disk is None or disk.group(3) != head:
                continue
            first, controller, _ = disk.groups()
            if (controller or first) == owner:
                found.append(entry)
        if not found and not (here / "device").exists():
            found.append(f"nvme{owner}n{head}")  # by name alone
        return found

    @staticmethod
    def _nvme_head(name: str) -> str:
        """A multipath path nvme<S>c<C>n<N> is hidden (no device number): its
        disk is the head, nvme<S>n<N>. Any other name is itself."""
        disk = _NVME_DISK.fullmatch(name)
        if disk is None or disk.group(2) is None:
            return name
        return f"nvme{disk.group(1)}n{disk.group(3)}"


_NOTHING: frozenset[Number] = frozenset()

# --- the rule ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Why:
    """Why a device is host-used: a phrase that completes "it is ...", and
    the step it came by, so that the next step can say it plainly."""

    text: str
    partition: tuple[str, str] | None = None  # a disk used through its partition: (it, why)
    above: tuple[str, str] | None = None  # used through a device stacked on it: (it, why)

    def of_disk(self, part: str) -> _Why:
        return _Why(f"the whole disk of {part}, which is {self.text}", partition=(part, self.text))

    def of_partition(self, disk: str, part: str) -> _Why:
        if self.partition is not None and self.partition[0] != part:
            neighbour, why = self.partition
            return _Why(f"on the same disk as {neighbour}, which is {why}")
        return _Why(f"a partition of {disk}, which is {self.text}")

    def below(self, holder: str) -> _Why:
        return _Why(f"under {holder}, which is {self.text}", above=(holder, self.text))

    def on_top(self, lower: str, holder: str) -> _Why:
        if self.above is not None and self.above[0] != holder:
            other, why = self.above
            return _Why(f"sharing {lower} with {other}, which is {why}")
        return _Why(f"on top of {lower}, which is {self.text}")

    def member(self, other: str) -> _Why:
        return _Why(f"in a btrfs filesystem with {other}, which is {self.text}")


class HostUse:
    """One look at what the host uses: the direct uses (read once, by the
    guard) and the block topology (read as questions need it). Ask reason()."""

    def __init__(
        self,
        topology: BlockTopology,
        direct: Mapping[Number, str],
        direct_names: Mapping[str, str] | None = None,
    ) -> None:
        self.topology = topology
        self.direct = dict(direct)
        self.direct_names = dict(direct_names or {})
        self._judged: dict[str, dict[str, _Why]] = {}  # name -> the uses in its group
        self._groups: dict[str, list[str]] = {}  # name -> the names of its group
        # table order, for going breadth first from the direct uses in it
        self._rank: dict[Number | str, int] = {
            key: i for i, key in enumerate([*self.direct, *self.direct_names])
        }

    def reason(self, device: Device) -> str | None:
        """Why the host uses this device, or None if it does not."""
        return self.reason_of(device.key)

    def reason_of(self, key: tuple[str, int, int]) -> str | None:
        """reason(), for a device by its kind and numbers."""
        kind, number = key[0], (key[1], key[2])
        if kind == "b":
            return self.block_reason(number)
        if kind == "c":
            for disk in self.topology.aliased_disks(number):
                why = self.name_reason(disk)
                if why is not None:
                    return f"an alias of {disk}, which is {why}"
        return None

    def group(self, device: Device) -> frozenset[Number]:
        """The block devices the rule joins this device to (itself included;
        for a disk alias, its disks' groups): what can change its answer."""
        return self.group_of(device.key)

    def group_of(self, key: tuple[str, int, int]) -> frozenset[Number]:
        """group(), for a device by its kind and numbers."""
        kind, number = key[0], (key[1], key[2])
        if kind == "b":
            return self.joined(number)
        if kind == "c":
            disks = self.topology.aliased_disks(number)
            if not disks:
                return _NOTHING  # the common case: one shared empty set, not one a device
            return frozenset(n for disk in disks for n in self._numbers(self._group_of(disk)))
        return _NOTHING

    def joined(self, number: Number) -> frozenset[Number]:
        """The block devices the rule joins this block device to, itself included."""
        name = self.topology.name(number)
        names = self._group_of(name) if name is not None else []
        return frozenset({number, *self._numbers(names)})

    def _numbers(self, names: Iterable[str]) -> set[Number]:
        return {number for n in names if (number := self.topology.number(n)) is not None}

    def is_alias(self, device: Device) -> bool:
        """A character device that reaches a disk (whether used or not)."""
        return device.kind == "c" and bool(
            self.topology.aliased_disks((device.major, device.minor))
        )

    def block_reason(self, number: Number) -> str | None:
        name = self.topology.name(number)
        if name is None:  # not in sysfs: only what the tables say of it
            return self.direct.get(number)
        return self.name_reason(name)

    def name_reason(self, name: str) -> str | None:
        why = self._connected(name)
        return why.text if why is not None else self._held(name)

    def _connected(self, name: str) -> _Why | None:
        """Why it is connected to a direct use, if it is. Every relation the
        rule follows goes both ways, so the devices connected to a direct
        use are the connected groups of the topology that hold one: find
        the group this device is in (and only that group: a question costs
        what its own disks, stacks and filesystems hold), then go breadth
        first from the direct uses in it, in table order, so each reason is
        a shortest chain. Each group is judged once per survey."""
        if name not in self._judged:
            group = self._group_of(name)
            direct = {n: why for n in group if (why := self._direct_text(n)) is not None}
            used = self._spread(direct)
            for member in group:
                self._judged[member] = used
        return self._judged[name].get(name)

    def _neighbours(self, name: str) -> Iterable[str]:
        topo = self.topology
        disk = topo.disk(name)
        return (
            *((disk,) if disk else ()),
            *topo.parts(name),
            *topo.slaves(name),
            *topo.holders(name),
            *topo.btrfs_members(name),
        )

    def _group_of(self, name: str) -> list[str]:
        if name in self._groups:
            return self._groups[name]
        seen = {name: None}
        queue = deque([name])
        while queue:
            for other in self._neighbours(queue.popleft()):
                if other not in seen:
                    seen[other] = None
                    queue.append(other)
        group = list(seen)
        for member in group:
            self._groups[member] = group
        return group

    def _direct_text(self, name: str) -> str | None:
        number = self.topology.number(name)
        why = self.direct.get(number) if number is not None else None
        return why if why is not None else self.direct_names.get(name)

    def _spread(self, direct: Mapping[str, str]) -> dict[str, _Why]:
        """Breadth first from these direct uses (name -> why), in table order."""

        def rank(name: str) -> int:
            number = self.topology.number(name)
            if number is not None and number in self._rank:
                return self._rank[number]
            return self._rank.get(name, len(self._rank))

        topo = self.topology
        used: dict[str, _Why] = {}
        queue: deque[str] = deque()

        def visit(name: str, why: _Why) -> None:
            if name not in used:
                used[name] = why
                queue.append(name)

        for name in sorted(direct, key=rank):
            visit(name, _Why(direct[name]))
        while queue:
            name = queue.popleft()
            why = used[name]
            disk = topo.disk(name)
            if disk is not None:
                visit(disk, why.of_disk(name))
            for member in topo.parts(name):
                visit(member, why.of_partition(name, member))
            for lower in topo.slaves(name):
                visit(lower, why.below(name))
            for holder in topo.holders(name):
                visit(holder, why.on_top(name, holder))
            for other in topo.btrfs_members(name):
                visit(other, why.member(name))
        return used

    def _held(self, name: str) -> str | None:
        """Held: something is stacked on it, on its whole disk, or on a
        partition of that disk. Nothing else follows from being held."""
        topo = self.topology

        def holders(device: str) -> str | None:
            held = topo.held_by(device)
            return f"held by {', '.join(held)}" if held else None

        why = holders(name)
        if why is not None:
            return why
        disk = topo.disk(name)
        if disk is not None:
            why = holders(disk)
            if why is not None:
                return f"a partition of {disk}, which is {why}"
            for part in topo.parts(disk):
                why = holders(part) if part != name else None
                if why is not None:
                    return f"on the same disk as {part}, which is {why}"
            return None
        for part in topo.parts(name):
            why = holders(part)
            if why is not None:
                return f"the whole disk of {part}, which is {why}"
        return None


def direct_use(
    mountinfo: str | None,
    swaps: str,
    dev_root: Path,
    sys_root: Path,
) -> dict[Number, str]:
    """The devices used directly, by number, from the tables' texts
    (mountinfo None or empty: it could not be read, so sysfs says what is
    mounted instead)."""
    # The mount table when we can read it; sysfs when not. (Not both: a
    # filesystem's sysfs entry outlives its unmount by a moment, and no
    # event would follow to take the device back.)
    found = mounted(mountinfo, dev_root) if mountinfo else sysfs_mounted(sys_root)
    for number, why in swapping(swaps, dev_root).items():
        found.setdefault(number, why)
    files = swap_files(swaps)
    if files:
        # A swap file names a path we may not be able to follow (the host's
        # namespace, or a lazily unmounted filesystem that no path reaches),
        # and it keeps its filesystem alive after an unmount: while one is
        # active, every filesystem sysfs shows alive counts as used.
        while_swap = f"while a swap file is active ({', '.join(files)})"
        for number, fs_type in live_devices(sys_root).items():
            found.setdefault(
                number,
                f"under a live {fs_type} filesystem missing from the mount table, {while_swap}",
            )
    return found
