"""What a device is, apart from its name and number: its identity.

A kernel name (dm-3, sdb, loop7) and a device number change across reboots,
rescans and re-attachments; a multipath map's DM UUID, a disk's WWN or serial
number and a loop device's backing file do not. This module reads them from a
sysfs tree and, when given, udev's database (devices/udevdb.py), and
turns an identity into a device ID for the kubelet. It also reads the
properties a config may match on, the NUMA node the kernel reports, and a
block device's size, vendor and model.
Everything is a plain function of the directories passed in; nothing raises
on a missing or unreadable file.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

from powerdev.devices.model import BlockFacts
from powerdev.devices.udevdb import UdevDatabase

Number = tuple[int, int]  # major, minor

MAX_ID_LENGTH = 63
_HASH_LENGTH = 12
_KINDS = {"b": "block", "block": "block", "c": "char", "char": "char"}
_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9._-]")
# The first part of a device ID, by identity source. The sysfs and udev forms
# of a WWN or serial differ in format, so they are kept apart.
_ID_PREFIXES = {
    "DM_UUID": "dm-uuid",
    "WWID": "wwid",
    "ID_WWN": "wwn",
    "SERIAL": "sys-serial",
    "ID_SERIAL": "serial",
    "LOOP_BACKING_FILE": "loop-file",
}


def _kind_dir(kind: str) -> str:
    try:
        return _KINDS[kind]
    except KeyError:
        raise ValueError(f"device kind {kind!r} is not one of b, c, block, char") from None


def _read_bytes(path: Path | str) -> bytes | None:
    """A file's bytes; None if absent or unreadable. (os.open and os.read, not
    pathlib or io: a device event reads a few dozen of these.)"""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 65536)
        if data:
            chunks = [data]
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
            if len(chunks) > 1:
                data = b"".join(chunks)
        return data
    except OSError:
        return None
    finally:
        os.close(fd)


def _text_of(data: bytes | None) -> str | None:
    if data is None:
        return None
    text = data.decode("utf-8", "surrogateescape").strip()
    return text or None


def _read(path: Path | str) -> str | None:
    """A sysfs or udev file's text, stripped; None if absent, unreadable or empty."""
    return _text_of(_read_bytes(path))


def _exists(path: str) -> bool:
    try:
        os.stat(path)
    except OSError:
        return False
    return True


def _key_values(text: str | None) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep and key:
            found[key] = value
    return found


def sysfs_dir(sys_root: Path, kind: str, number: Number) -> Path | None:
    """The device's directory: sys_root/dev/{block|char}/MAJ:MIN resolved
    (a link into sys_root/devices/...); None if absent."""
    link = sys_root / "dev" / _kind_dir(kind) / f"{number[0]}:{number[1]}"
    try:
        where = link.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    return where if where.is_dir() else None


def _device_link(sys_root: Path, kind: str, number: Number) -> str | None:
    """sys_root/dev/{block|char}/MAJ:MIN as a string, unresolved, if it leads
    to a directory (sysfs_dir()'s test, one stat). Files under it are read
    through the link; its parent directory is "<link>/..", which the
    kernel takes from where the link leads."""
    link = f"{os.fspath(sys_root)}/dev/{_kind_dir(kind)}/{number[0]}:{number[1]}"
    try:
        st = os.stat(link)
    except OSError:
        return None
    return link if stat.S_ISDIR(st.st_mode) else None


def _udev_properties(udev: UdevDatabase | None, kind: str, number: Number) -> dict[str, str]:
    """What udev knows of the device (udevdb.py); nothing without udev."""
    if udev is None:
        return {}
    return udev.properties(_kind_dir(kind)[0], number)


def _sysfs_properties(where: str) -> dict[str, str]:
    found = _key_values(_read(f"{where}/uevent"))
    try:
        found["SUBSYSTEM"] = os.path.basename(os.readlink(f"{where}/subsystem"))
    except OSError:
        pass
    for key, name in (("DM_NAME", "name"), ("DM_UUID", "uuid")):
        value = _read(f"{where}/dm/{name}")
        if value is not None:
            found[key] = value
    return found


def properties(
    sys_root: Path, udev: UdevDatabase | None, kind: str, number: Number
) -> dict[str, str]:
    """Properties as udev records them, for matching.

    From sysfs: the device's uevent file (MAJOR, MINOR, DEVNAME, DEVTYPE,
    PARTN...), SUBSYSTEM from its `subsystem` link, and for dm devices DM_NAME
    and DM_UUID from dm/name and dm/uuid. Then, when udev is given, every
    property udev's database holds for the device, which wins over sysfs.
    Absent or unreadable files leave their properties out.
    """
    found: dict[str, str] = {}
    where = _device_link(sys_root, kind, number)
    if where is not None:
        found.update(_sysfs_properties(where))
    found.update(_udev_properties(udev, kind, number))
    return found


def _number_of(where: Path | str) -> Number | None:
    major, sep, minor = (_read(f"{os.fspath(where)}/dev") or "").partition(":")
    if not sep or not major.isdigit() or not minor.isdigit():
        return None
    return int(major), int(minor)


def _whole_identity(where: str, udev: Callable[[], dict[str, str]]) -> tuple[str, str] | None:
    """The identity of a whole device (not a partition), sysfs before udev
    within each kind: sysfs is there from the kernel's add event on, while
    udev's database is written a moment later, and a device's ID must not
    change when it appears. Each candidate is read only if those before it
    are absent; udev's properties are asked for once, when first needed."""
    known: list[dict[str, str]] = []

    def from_udev(*names: str) -> str | None:
        if not known:
            known.append(udev())
        for name in names:
            value = known[0].get(name)
            if value:
                return value
        return None

    candidates: tuple[tuple[str, Callable[[], str | None]], ...] = (
        ("DM_UUID", lambda: _read(f"{where}/dm/uuid")),
        ("DM_UUID", lambda: from_udev("DM_UUID")),
        # SCSI reports the WWID on the SCSI device, NVMe on the namespace's disk.
        ("WWID", lambda: _read(f"{where}/wwid") or _read(f"{where}/device/wwid")),
        ("ID_WWN", lambda: from_udev("ID_WWN_WITH_EXTENSION", "ID_WWN")),
        # virtio-blk reports a serial on the disk, NVMe on the controller.
        ("SERIAL", lambda: _read(f"{where}/serial") or _read(f"{where}/device/serial")),
        ("ID_SERIAL", lambda: from_udev("ID_SERIAL")),
        ("LOOP_BACKING_FILE", lambda: _read(f"{where}/loop/backing_file")),
    )
    for source, read in candidates:
        value = read()
        if value and value.strip():
            return source, value.strip()
    return None


def identity(
    sys_root: Path, udev: UdevDatabase | None, kind: str, number: Number
) -> tuple[str, str] | None:
    """What the block device is, as (source, value), or None.

    In order: DM_UUID (sysfs dm/uuid, then udev), the WWN (sysfs `wwid` of
    the disk or its SCSI device as "WWID", then udev's ID_WWN), the serial
    (sysfs `serial` of the disk or its device as "SERIAL", then udev's
    ID_SERIAL), and a loop device's backing file ("LOOP_BACKING_FILE").
    A partition is its disk's identity plus "-part<PARTN>". Character
    devices have no identity; empty values count as absent.
    """
    if _kind_dir(kind) != "block":
        return None
    where = _device_link(sys_root, kind, number)
    if where is None:
        return None
    return _identity_at(where, _read_bytes(f"{where}/uevent"), udev, kind, number)


def _identity_at(
    where: str, uevent_data: bytes | None, udev: UdevDatabase | None, kind: str, number: Number
) -> tuple[str, str] | None:
    """identity(), given the device's directory (_device_link) and its uevent's bytes."""
    uevent = _key_values(_text_of(uevent_data))
    if uevent.get("DEVTYPE") == "partition" or _exists(f"{where}/partition"):
        partn = uevent.get("PARTN") or _read(f"{where}/partition")
        parent = f"{where}/.."
        parent_number = _number_of(parent)
        if not partn or parent_number is None:
            return None
        whole = _whole_identity(parent, lambda: _udev_properties(udev, kind, parent_number))
        if whole is None:
            return None
        return whole[0], f"{whole[1]}-part{partn}"
    return _whole_identity(where, lambda: _udev_properties(udev, kind, number))


def block_sysfs(
    sys_root: Path, udev: UdevDatabase | None, number: Number
) -> tuple[tuple[str, str] | None, str | None]:
    """identity() and kernel_name() of a block device, its uevent read once."""
    where = _device_link(sys_root, "b", number)
    if where is None:
        return None, None  # no directory there: no uevent file either
    data = _read_bytes(f"{where}/uevent")
    return _identity_at(where, data, udev, "b", number), _devname_in(data)


def identity_id(source: str, value: str) -> str:
    """A device ID from an identity: at most 63 characters of [A-Za-z0-9._-].

    ("DM_UUID", "mpath-3600a...") -> "dm-uuid.mpath-3600a...". A value used
    as it is keeps the ID readable; one that had to be changed (a path's "/"
    become ".", other characters become "_") could meet another value changed
    the same way, so its ID ends with "-" and 12 hex digits of a sha256 of
    source and value, as does an ID cut to fit 63 characters.
    """
    prefix = _ID_PREFIXES.get(source) or _NOT_ALLOWED.sub("-", source.lower()) or "id"
    shown = _NOT_ALLOWED.sub("_", value.lstrip("/").replace("/", "."))
    readable = f"{prefix}.{shown}"
    if shown == value and len(readable) <= MAX_ID_LENGTH:
        return readable
    whole = f"{source}\0{value}".encode("utf-8", "surrogateescape")
    digest = hashlib.sha256(whole).hexdigest()[:_HASH_LENGTH]
    head = readable[: MAX_ID_LENGTH - _HASH_LENGTH - 1]
    return f"{head}-{digest}"


def numa_node(
    sys_root: Path, kind: str, number: Number, seen: dict[str, int | None] | None = None
) -> int | None:
    """The NUMA node the kernel reports for the device: the first `numa_node`
    file found from the device's sysfs directory up through its parents (a
    disk's is on its PCI controller), within sys_root/devices. None when the
    value is -1 (unknown), absent or unreadable. (os.path, not pathlib: a
    rescan asks this for every device, and pathlib made it the scan's cost.)
    `seen` keeps each directory's answer for the next device asked with it
    (a disk's partitions, the disks of one controller: one look at sysfs)."""
    link = os.path.join(sys_root, "dev", _kind_dir(kind), f"{number[0]}:{number[1]}")
    try:  # one readlink: the kernel's links there point straight into devices/
        where = os.path.normpath(os.path.join(os.path.dirname(link), os.readlink(link)))
    except OSError:
        return None
    top, virtual = _devices_dirs(os.fspath(sys_root))
    if where.startswith(virtual):
        return None  # loop, dm, mem...: no device of any NUMA node
    if seen is None:
        seen = {}
    walked = []
    node = None
    while where.startswith(top):
        if where in seen:
            node = seen[where]
            break
        walked.append(where)
        found = _numa_here(where)
        if found is not _ABSENT:
            node = found  # type: ignore[assignment]
            break
        where = os.path.dirname(where)
    for each in walked:
        seen[each] = node
    return node


@functools.lru_cache(maxsize=8)
def _devices_dirs(sys_root: str) -> tuple[str, str]:
    """sys_root/devices/ and sys_root/devices/virtual/, normalised, as prefixes."""
    top = os.path.normpath(os.path.join(sys_root, "devices"))
    return top + os.sep, os.path.join(top, "virtual") + os.sep


_ABSENT = object()  # no numa_node file in a directory: its parent's answer


def _numa_here(where: str) -> int | object | None:
    """The node a directory's numa_node file gives (None: unknown or
    unreadable), or _ABSENT when it has none."""
    try:
        fd = os.open(f"{where}/numa_node", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return _ABSENT
    except OSError:
        return None
    try:
        data = b""
        while chunk := os.read(fd, 4096):
            data += chunk
    except OSError:
        return None
    finally:
        os.close(fd)
    text = data.decode().strip()  # not valid text: raises, as it always has
    try:
        node = int(text)
    except ValueError:
        return None
    return node if node >= 0 else None


SECTOR = 512  # sysfs gives a block device's size in 512-byte sectors, whatever its own
# The buses whose devices say in sysfs, as text, who made them and what
# they are: SCSI (SAS, FC, iSCSI, SATA through libata, USB storage: the
# INQUIRY strings) and NVMe (the controller's or subsystem's model; NVMe
# has no vendor string). virtio's `vendor` is a PCI vendor number: left out.
_DESCRIBED_BY = frozenset({"scsi", "nvme", "nvme-subsystem"})
_MULTIPATH = re.compile(r"(part\d+-)?mpath-")  # a multipath map's DM UUID, or its partition's
_SLAVE_DEPTH = 2  # a multipath map's partition -> the map -> a path


def block_facts(sys_root: Path, number: Number) -> BlockFacts | None:
    """A block device's size (sysfs `size` x 512), and its vendor and model:
    those of its SCSI or NVMe device (sysfs `device/vendor`,
    `device/model`); a partition's are its disk's, a multipath map's those
    of its first path (slaves/). None when sysfs does not know it. A value
    that is empty or not printable ASCII is left out."""
    where = sysfs_dir(sys_root, "b", number)
    if where is None:
        return None
    sectors = _read(where / "size")
    size = int(sectors) * SECTOR if sectors is not None and sectors.isdigit() else None
    vendor, model = _vendor_model(where, _SLAVE_DEPTH)
    return BlockFacts(size, vendor, model)


def no_medium(sys_root: Path, number: Number) -> str | None:
    """Why a block device has nothing to read or write, or None: its sysfs
    `size` is 0 (a loop device with no file attached or detached with
    `losetup -d`, a drive with no disc, a device-mapper map with no table).
    A device whose size cannot be read is taken to have a medium."""
    where = sysfs_dir(sys_root, "b", number)
    if where is None or (_read(where / "size") or "").strip() != "0":
        return None
    return "it has no medium (its size in sysfs is 0: no file attached to a loop device, no disc)"


def _vendor_model(where: Path, depth: int) -> tuple[str | None, str | None]:
    if (where / "partition").exists():
        where = where.parent
    device = where / "device"
    try:
        bus = os.path.basename(os.readlink(device / "subsystem"))
    except OSError:
        bus = None
    if bus in _DESCRIBED_BY:
        return _text(device / "vendor"), _text(device / "model")
    if depth > 0 and _MULTIPATH.match(_read(where / "dm" / "uuid") or ""):
        try:
            paths = sorted(os.listdir(where / "slaves"))
        except OSError:
            return None, None
        if paths:
            return _vendor_model((where / "slaves" / paths[0]).resolve(), depth - 1)
    return None, None


def _text(path: Path) -> str | None:
    value = _read(path)
    return value if value is not None and value.isascii() and value.isprintable() else None


def devname(sys_dir: Path) -> str | None:
    """DEVNAME from a sysfs directory's uevent file: the node's name under /dev."""
    return _key_values(_read(sys_dir / "uevent")).get("DEVNAME") or None


def kernel_name(sys_root: Path, kind: str, number: Number) -> str | None:
    """The node's name under /dev as the kernel gives it, if sysfs has it.
    (Plain strings: a look asks it of every device.)"""
    uevent = f"{os.fspath(sys_root)}/dev/{_kind_dir(kind)}/{number[0]}:{number[1]}/uevent"
    return _devname_in(_read_bytes(uevent))


def _devname_in(data: bytes | None) -> str | None:
    """DEVNAME from a uevent file's bytes (its first 4096)."""
    if data is None:
        return None
    text = data[:4096].decode("utf-8", "surrogateescape")
    for line in text.splitlines():
        if line.startswith("DEVNAME="):
            return line[len("DEVNAME=") :].strip() or None
    return None


def block_devices_with(
    sys_root: Path, udev: UdevDatabase | None, wanted: tuple[str, str]
) -> list[tuple[str, int, int]]:
    """Every block device sysfs lists whose identity is `wanted`: a walk of
    /sys/class/block, for a device no look has found (slow: a worker thread)."""
    found = []
    block = sys_root / "class" / "block"
    try:
        names = sorted(os.listdir(block))
    except OSError:
        return []
    for name in names:
        number = _number_of(block / name)
        if number is not None and identity(sys_root, udev, "b", number) == wanted:
            found.append(("b", *number))
    return found
