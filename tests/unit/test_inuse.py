"""The host-use rule over mountinfo texts, /proc/swaps texts and temp sysfs
trees laid out as the kernel lays them out (tables of cases); and the
control-node rule."""

import logging
import os
import shutil
import stat
from pathlib import Path

import pytest

from powerdev.config import ResourceConfig
from powerdev.devices.inuse import (
    BlockTopology,
    HostUse,
    direct_use,
    mounted,
    swap_files,
    swapping,
    sysfs_mounted,
    unescape,
)
from powerdev.devices.inventory import Inventory
from powerdev.devices.model import Device
from powerdev.devices.table import DeviceTable, HostFiles
from powerdev.resources.matching import discover
from powerdev.resources.tracker import Tracker
from tests.conftest import needs_root

MOUNTINFO = """\
22 1 0:21 / /proc rw,relatime - proc proc rw
29 1 253:0 / / rw,relatime shared:1 - xfs /dev/mapper/rhel-root rw
30 29 8:1 / /boot rw,relatime shared:2 - xfs /dev/sda1 rw
31 29 0:45 / /var/lib/my\\040data rw - btrfs /dev/nowhere rw
32 29 8:16 / /mnt/with\\040space rw master:3 - ext4 /dev/sdb rw
33 29 0:50 / /run rw - tmpfs tmpfs rw
"""

SWAPS = """\
Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority
/dev/dm-1                               partition\t8388604\t\t0\t\t-2
/var/swap\\040file                       file\t\t1024\t\t0\t\t-3
"""
NO_SWAPS = "Filename Type Size Used Priority\n"


def add_device(root: Path, where: str, name: str, dev: str | None, kind: str = "block", **spec):
    """One device directory under root/devices/<where>/<name>, as sysfs has
    it: `dev`, `subsystem`, and /sys/dev/<kind>/M:m (and, for block devices,
    /sys/class/block/<name>) linking to it. Block devices have holders/ and
    slaves/ (names), `partition` for partitions, dm/uuid for dm maps,
    loop/backing_file for bound loop devices; `device` links to a parent."""
    directory = root / "devices" / where / name
    directory.mkdir(parents=True)
    subsystem = spec.get("subsystem", "block")
    (root / "class" / subsystem).mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(root / "class" / subsystem, directory), directory / "subsystem")
    if dev is not None:
        (directory / "dev").write_text(dev + "\n")
        links = root / "dev" / kind
        links.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(directory, links), links / dev)
    if subsystem == "block":
        own = root / "class" / "block" / name
        os.symlink(os.path.relpath(directory, own.parent), own)
        for sub in ("holders", "slaves"):
            (directory / sub).mkdir()
            for other in spec.get(sub, ()):
                (directory / sub / other).symlink_to(root / "class" / "block" / other)
    if spec.get("partition"):
        (directory / "partition").write_text("1\n")
    if "uuid" in spec:
        (directory / "dm").mkdir()
        (directory / "dm" / "uuid").write_text(spec["uuid"] + "\n")
    if "backing" in spec:
        (directory / "loop").mkdir()
        (directory / "loop" / "backing_file").write_text(spec["backing"] + "\n")
    if "device" in spec:
        os.symlink(
            os.path.relpath(root / "devices" / spec["device"], directory), directory / "device"
        )
    return directory


def sysfs(root: Path, disks: dict[str, dict]) -> Path:
    """Block devices under root/devices/virtual/block: disks, with their
    partitions ("parts") inside them, as the kernel nests them."""
    for name, spec in disks.items():
        spec = dict(spec)
        parts = spec.pop("parts", {})
        add_device(root, "virtual/block", name, spec.pop("dev"), **spec)
        for part, part_spec in parts.items():
            part_spec = dict(part_spec)
            add_device(
                root,
                f"virtual/block/{name}",
                part,
                part_spec.pop("dev"),
                partition=True,
                **part_spec,
            )
    return root


def btrfs(root: Path, fs_id: str, members: list[str]) -> None:
    devices = root / "fs" / "btrfs" / fs_id / "devices"
    devices.mkdir(parents=True)
    for member in members:
        (devices / member).symlink_to(root / "class" / "block" / member)


TREE = {
    # the boot disk: sda1 is /boot, sda2 a PReP partition, sda3 the root VG's PV
    "sda": {
        "dev": "8:0",
        "parts": {
            "sda1": {"dev": "8:1"},
            "sda2": {"dev": "8:2"},
            "sda3": {"dev": "8:3", "holders": ["dm-0", "dm-1"]},
        },
    },
    "dm-0": {"dev": "253:0", "slaves": ["sda3"], "uuid": "LVM-root"},  # mounted at /
    "dm-1": {"dev": "253:1", "slaves": ["sda3"], "uuid": "LVM-data"},  # an LV nobody mounts
    "sdb": {"dev": "8:16"},  # mounted whole
    # a disk whose first partition is the only PV of a VG nobody mounts
    "sdc": {
        "dev": "8:32",
        "parts": {"sdc1": {"dev": "8:33", "holders": ["dm-2"]}, "sdc2": {"dev": "8:34"}},
    },
    "dm-2": {"dev": "253:2", "slaves": ["sdc1"], "uuid": "LVM-pods"},
    # a multipath map over two legs, partitioned by kpartx, nothing mounted
    "sdd": {"dev": "8:48", "holders": ["dm-3"]},
    "sde": {"dev": "8:64", "holders": ["dm-3"]},
    "dm-3": {
        "dev": "253:3",
        "slaves": ["sdd", "sde"],
        "holders": ["dm-4", "dm-5"],
        "uuid": "mpath-3600a",
    },
    "dm-4": {"dev": "253:4", "slaves": ["dm-3"], "uuid": "part1-mpath-3600a"},
    "dm-5": {"dev": "253:5", "slaves": ["dm-3"], "uuid": "part2-mpath-3600a"},
    # an md member partition
    "sdf": {
        "dev": "8:80",
        "parts": {"sdf1": {"dev": "8:81", "holders": ["md0"]}, "sdf2": {"dev": "8:82"}},
    },
    "md0": {"dev": "9:0", "slaves": ["sdf1"]},
    # loop devices over a free disk, over the mounted sdb, and over a file
    "sdg": {"dev": "8:96"},
    "loop0": {"dev": "7:0", "backing": "/dev/sdg"},
    "loop1": {"dev": "7:1", "backing": "/dev/sdb"},
    "loop2": {"dev": "7:2", "backing": "/var/lib/images/disk.img (deleted)"},
    "loop3": {"dev": "7:3"},  # not bound: no loop/ directory
    # a two-device btrfs, mounted by sdh
    "sdh": {"dev": "8:112"},
    "sdi": {"dev": "8:128"},
    "sdj": {"dev": "8:144"},  # free
}
DIRECT = {**mounted(MOUNTINFO, Path("/nonexistent")), (8, 112): "mounted at /data"}


def tree(tmp_path: Path) -> Path:
    root = sysfs(tmp_path / "sys", TREE)
    btrfs(root, "0b1c-uuid", ["sdh", "sdi"])
    return root


def test_unescape_octal_fields():
    assert unescape("/mnt/with\\040space\\011tab\\134") == "/mnt/with space\ttab\\"


def test_mounted_devices_by_number():
    found = mounted(MOUNTINFO, Path("/nonexistent"))
    assert found == {
        (253, 0): "mounted at /",
        (8, 1): "mounted at /boot",
        (8, 16): "mounted at /mnt/with space",
    }  # anonymous numbers (0:N) never count; an unknown source is not guessed


def test_swap_partitions_count_and_swap_files_are_named(tmp_path):
    # /dev/dm-1 is not a block node under this dev root: nothing to look up
    assert swapping(SWAPS, tmp_path) == {}
    assert swapping(NO_SWAPS, tmp_path) == {}
    assert swap_files(SWAPS) == ["/var/swap file"]
    assert swap_files(NO_SWAPS) == []


@pytest.mark.parametrize(
    ("number", "why"),
    [
        ((253, 0), "mounted at /"),  # the root filesystem on dm
        ((8, 1), "mounted at /boot"),
        ((8, 0), "the whole disk of sda1, which is mounted at /boot"),  # the boot disk
        ((8, 2), "on the same disk as sda1, which is mounted at /boot"),  # its PReP
        ((8, 3), "under dm-0, which is mounted at /"),  # the root VG's PV
        ((253, 1), "sharing sda3 with dm-0, which is mounted at /"),  # another LV there
        ((8, 16), "mounted at /mnt/with space"),
        ((7, 1), "on top of sdb, which is mounted at /mnt/with space"),  # a loop over it
        ((8, 33), "held by dm-2"),  # a PV
        ((8, 32), "the whole disk of sdc1, which is held by dm-2"),
        ((8, 34), "on the same disk as sdc1, which is held by dm-2"),
        ((253, 2), None),  # the LV itself, unmounted
        ((8, 48), "held by dm-3"),  # a multipath leg
        ((253, 3), None),  # the multipath map: held only by its own partition maps
        ((253, 4), None),  # its partitions, unmounted
        ((253, 5), None),
        ((8, 81), "held by md0"),
        ((8, 80), "the whole disk of sdf1, which is held by md0"),
        ((8, 82), "on the same disk as sdf1, which is held by md0"),
        ((9, 0), None),  # the array, unmounted
        ((8, 96), "held by loop0"),  # a loop device's backing device
        ((7, 0), None),
        ((7, 2), None),  # a loop device over a file
        ((7, 3), None),
        ((8, 112), "mounted at /data"),
        ((8, 128), "in a btrfs filesystem with sdh, which is mounted at /data"),
        ((8, 144), None),
        ((9, 9), None),  # nothing in sysfs
    ],
)
def test_the_rule(tmp_path, number, why):
    use = HostUse(BlockTopology(tree(tmp_path), tmp_path / "dev"), DIRECT)
    assert use.block_reason(number) == why


@pytest.mark.parametrize(
    ("number", "why"),
    [
        ((253, 4), "mounted at /srv"),
        ((253, 3), "the whole disk of dm-4, which is mounted at /srv"),
        ((253, 5), "on the same disk as dm-4, which is mounted at /srv"),  # kpartx neighbours
        ((8, 48), "under dm-3, which is the whole disk of dm-4, which is mounted at /srv"),
    ],
)
def test_a_mounted_kpartx_partition_keeps_its_multipath_disk_and_neighbours(tmp_path, number, why):
    use = HostUse(BlockTopology(tree(tmp_path), tmp_path / "dev"), {(253, 4): "mounted at /srv"})
    assert use.block_reason(number) == why


def test_a_topology_reads_each_entry_once_and_only_what_it_needs(tmp_path, monkeypatch):
    from powerdev.devices import inuse

    sys_root = tree(tmp_path)
    touched: list[str] = []

    def spy(real):
        def call(path, *args, **kwargs):
            touched.append(f"{real.__name__} {path}")
            return real(path, *args, **kwargs)

        return call

    monkeypatch.setattr(inuse, "open", spy(open), raising=False)
    for name in ("listdir", "stat", "readlink"):
        monkeypatch.setattr(inuse.os, name, spy(getattr(os, name)))
    use = HostUse(BlockTopology(sys_root, tmp_path / "dev"), {(8, 16): "mounted at /x"})
    for _ in range(3):
        assert use.block_reason((8, 144)) is None
        assert use.block_reason((8, 16)) == "mounted at /x"
        assert use.block_reason((7, 1)) == "on top of sdb, which is mounted at /x"
    assert len(touched) == len(set(touched))  # each entry at most once
    devices = set()
    for entry in touched:
        path = Path(entry.split(" ", 1)[1])
        if not path.is_relative_to(sys_root):
            continue  # /dev/sdg, the node a backing file names
        parts = path.relative_to(sys_root).parts
        if parts[:2] == ("class", "block"):
            devices.add(parts[2])
        elif parts[:3] == ("devices", "virtual", "block") and len(parts) > 3:
            devices.add(parts[3])
    # sdj, sdb and loop1 (asked about); every loop device's backing file, and
    # whether sdg, which one names, exists: no other disk, stack or filesystem
    assert devices == {"sdb", "sdj", "loop0", "loop1", "loop2", "loop3", "sdg"}


def test_unreadable_or_odd_sysfs_entries_are_skipped(tmp_path):
    root = sysfs(tmp_path / "sys", {"sdx": {"dev": "8:0"}, "loop9": {"dev": "7:9", "backing": ""}})
    (root / "class" / "block" / "sdx" / "dev").write_text("garbage\n")
    (root / "dev" / "block" / "8:99").symlink_to("nowhere")
    (root / "class" / "block" / "sdx" / "holders").rmdir()
    (root / "class" / "block" / "sdx" / "holders").write_text("not a directory")
    use = HostUse(BlockTopology(root, tmp_path / "dev"), {(8, 0): "mounted at /"})
    assert use.block_reason((8, 0)) == "mounted at /"
    assert use.block_reason((8, 99)) is None
    assert use.block_reason((7, 9)) is None


# --- character aliases of disks ----------------------------------------------------


def alias_tree(root: Path) -> Path:
    """A SCSI disk with its sg and bsg nodes; an NVMe controller with two
    namespaces and their generic nodes; a multipath NVMe subsystem whose
    head disk is nvme1n1, reached through controller nvme2's hidden path
    nvme1c2n1 and its generic node ng2n1."""
    scsi = "pci0000:00/0000:00:01.0/host0/target0:0:0/0:0:0:0"
    (root / "devices" / scsi).mkdir(parents=True)
    add_device(root, f"{scsi}/block", "sdx", "8:240")
    add_device(root, f"{scsi}/block/sdx", "sdx1", "8:241", partition=True)
    add_device(
        root, f"{scsi}/scsi_generic", "sg0", "21:0", "char", subsystem="scsi_generic", device=scsi
    )
    add_device(root, f"{scsi}/bsg", "0:0:0:0", "248:0", "char", subsystem="bsg", device=scsi)
    ctrl = "pci0000:00/0000:00:02.0/nvme/nvme0"
    add_device(root, "pci0000:00/0000:00:02.0/nvme", "nvme0", "240:0", "char", subsystem="nvme")
    add_device(root, ctrl, "nvme0n1", "259:0")
    add_device(root, f"{ctrl}/nvme0n1", "nvme0n1p1", "259:1", partition=True)
    add_device(root, ctrl, "nvme0n2", "259:2")
    add_device(root, ctrl, "ng0n1", "238:0", "char", subsystem="nvme-generic", device=ctrl)
    add_device(root, ctrl, "ng0n2", "238:1", "char", subsystem="nvme-generic", device=ctrl)
    subsys = "virtual/nvme-subsystem/nvme-subsys1"
    (root / "devices" / subsys).mkdir(parents=True)
    add_device(root, subsys, "nvme1n1", "259:3")
    add_device(root, subsys, "ng1n1", "238:2", "char", subsystem="nvme-generic", device=subsys)
    ctrl2 = "pci0000:00/0000:00:03.0/nvme/nvme2"
    add_device(root, "pci0000:00/0000:00:03.0/nvme", "nvme2", "240:1", "char", subsystem="nvme")
    add_device(root, ctrl2, "nvme1c2n1", None)  # hidden: no device number
    add_device(root, ctrl2, "ng2n1", "238:3", "char", subsystem="nvme-generic", device=ctrl2)
    add_device(root, "virtual/mem", "null", "1:3", "char", subsystem="mem")
    return root


def char(path, major, minor):
    return Device(path.removeprefix("/dev/").replace("/", "."), path, "c", major, minor)


SG0, BSG = char("/dev/sg0", 21, 0), char("/dev/bsg/0:0:0:0", 248, 0)
NVME0, NG0N1, NG0N2 = (
    char("/dev/nvme0", 240, 0),
    char("/dev/ng0n1", 238, 0),
    char("/dev/ng0n2", 238, 1),
)
NVME2, NG1N1, NG2N1 = (
    char("/dev/nvme2", 240, 1),
    char("/dev/ng1n1", 238, 2),
    char("/dev/ng2n1", 238, 3),
)
NULL = char("/dev/null", 1, 3)


@pytest.mark.parametrize(
    ("direct", "device", "why"),
    [
        (
            {(8, 241): "mounted at /boot"},
            SG0,
            "an alias of sdx, which is the whole disk of sdx1, which is mounted at /boot",
        ),
        (
            {(8, 241): "mounted at /boot"},
            BSG,
            "an alias of sdx, which is the whole disk of sdx1, which is mounted at /boot",
        ),
        ({}, SG0, None),
        ({}, BSG, None),
        (
            {(259, 1): "mounted at /var"},
            NG0N1,
            "an alias of nvme0n1, which is the whole disk of nvme0n1p1, which is mounted at /var",
        ),
        ({(259, 1): "mounted at /var"}, NG0N2, None),  # another namespace
        (
            {(259, 1): "mounted at /var"},
            NVME0,  # the controller reaches every namespace
            "an alias of nvme0n1, which is the whole disk of nvme0n1p1, which is mounted at /var",
        ),
        ({(259, 2): "active swap"}, NVME0, "an alias of nvme0n2, which is active swap"),
        ({(259, 3): "mounted at /mp"}, NG1N1, "an alias of nvme1n1, which is mounted at /mp"),
        ({(259, 3): "mounted at /mp"}, NG2N1, "an alias of nvme1n1, which is mounted at /mp"),
        ({(259, 3): "mounted at /mp"}, NVME2, "an alias of nvme1n1, which is mounted at /mp"),
        ({(259, 3): "mounted at /mp"}, NG0N1, None),
        ({(1, 3): "mounted at /"}, NULL, None),  # not an alias class
        ({(8, 241): "mounted at /"}, char("/dev/sg9", 21, 9), None),  # not in sysfs
    ],
)
def test_character_aliases_are_host_used_with_their_disk(tmp_path, direct, device, why):
    use = HostUse(BlockTopology(alias_tree(tmp_path / "sys"), tmp_path / "dev"), direct)
    assert use.reason(device) == why


@needs_root
def test_patterns_that_reach_a_host_disk_through_an_alias_are_screened(tmp_path):
    sys_root = alias_tree(tmp_path / "sys")
    dev = tmp_path / "dev"
    nodes = {
        "sg0": (21, 0),
        "bsg/0:0:0:0": (248, 0),
        "ng0n1": (238, 0),
        "ng0n2": (238, 1),
        "nvme0": (240, 0),
        "ng1n1": (238, 2),
        "ng2n1": (238, 3),
    }
    for name, (major, minor) in nodes.items():
        (dev / name).parent.mkdir(parents=True, exist_ok=True)
        os.mknod(dev / name, stat.S_IFCHR | 0o600, os.makedev(major, minor))
    os.mknod(dev / "sdx1", stat.S_IFBLK | 0o600, os.makedev(8, 241))
    (tmp_path / "mountinfo").write_text("30 29 8:241 / /boot rw - xfs /dev/sdx1 rw\n")
    (tmp_path / "swaps").write_text(NO_SWAPS)
    host = HostFiles(tmp_path / "mountinfo", tmp_path / "swaps")
    table = DeviceTable(dev, sys_root, host=host)
    resource = ResourceConfig(include=("/dev/sg*", "/dev/bsg/*", "/dev/ng*", "/dev/nvme*"))
    paths = [d.path for d in discover(resource, dev, sys_root)]
    table.look(paths)
    used = {p: why for p in paths if (why := table.facts(table.key_of(p)).host_use)}
    assert used == {
        "/dev/sg0": "an alias of sdx, which is the whole disk of sdx1, which is mounted at /boot",
        "/dev/bsg/0:0:0:0": "an alias of sdx, which is the whole disk of sdx1, "
        "which is mounted at /boot",
    }
    # a block event reads again what is joined to its device: the aliases
    # of sdx for its partition sdx1 (gone: a new partition table), not the
    # NVMe devices
    part = sys_root / "class" / "block" / "sdx1"
    shutil.rmtree(part.resolve())
    part.unlink()
    (sys_root / "dev" / "block" / "8:241").unlink()
    changed = table.device_changed("b", [(8, 241)])
    assert changed.keys == {("c", 21, 0), ("c", 248, 0)}
    assert all(table.facts(table.key_of(p)).host_use is None for p in paths)
    # a character event reads only that device again
    assert table.device_changed("c", [(10, 1)]).keys == set()


def block(path, major, minor, healthy=True):
    return Device(path.removeprefix("/dev/").replace("/", "."), path, "b", major, minor, healthy)


def table_for(tmp_path, mountinfo_text=MOUNTINFO, swaps_text=""):
    (tmp_path / "mountinfo").write_text(mountinfo_text)
    (tmp_path / "swaps").write_text(swaps_text or "Filename Type Size Used Priority\n")
    sys_root = sysfs(tmp_path / "sys", TREE)
    host = HostFiles(tmp_path / "mountinfo", tmp_path / "swaps")
    return DeviceTable(tmp_path / "dev", sys_root, host=host)


def host_use(table, *keys):
    return {key: table.facts(key).host_use for key in keys}


def test_devices_in_use_are_known_to_the_table_with_why(tmp_path):
    table = table_for(tmp_path)
    assert host_use(table, ("b", 253, 0), ("b", 253, 4), ("b", 8, 0)) == {
        ("b", 253, 0): "mounted at /",
        ("b", 253, 4): None,
        ("b", 8, 0): "the whole disk of sda1, which is mounted at /boot",
    }


def test_character_devices_that_reach_no_disk_are_not_judged(tmp_path):
    table = table_for(tmp_path)
    assert host_use(table, ("c", 253, 0)) == {("c", 253, 0): None}  # the numbers of dm-0


def test_a_mount_change_reads_again_only_the_devices_joined_to_it(tmp_path):
    table = table_for(tmp_path, mountinfo_text="")
    for key in (("b", 253, 4), ("b", 253, 3), ("b", 8, 144), ("b", 253, 0)):
        table._names[key] = {f"/dev/{key[1]}-{key[2]}"}  # as if a look had named it
        table.facts(key)
    assert host_use(table, ("b", 253, 4)) == {("b", 253, 4): None}
    (tmp_path / "mountinfo").write_text("40 29 253:4 / /srv rw - ext4 /dev/dm-4 rw\n")
    changed = table.host_tables_changed()
    # dm-4 and the multipath disk it is a partition of; not sdj, not the root LV
    assert changed.keys == {("b", 253, 4), ("b", 253, 3)}
    assert table.facts(("b", 253, 4)).host_use == "mounted at /srv"
    (tmp_path / "mountinfo").write_text("")
    assert table.host_tables_changed().keys == {("b", 253, 4), ("b", 253, 3)}
    assert table.facts(("b", 253, 4)).host_use is None
    (tmp_path / "mountinfo").write_text("41 29 0:50 / /run rw - tmpfs tmpfs rw\n")
    assert not table.host_tables_changed()  # a mount of no device: nothing to look at


def test_a_batch_of_events_reads_sysfs_through_one_topology(tmp_path, monkeypatch):
    from powerdev.devices import table as table_module

    table = table_for(tmp_path)
    made: list[BlockTopology] = []

    class Counted(BlockTopology):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(table_module, "BlockTopology", Counted)
    keys = (("b", 8, 32), ("b", 8, 33), ("b", 8, 34), ("b", 253, 2))
    for key in keys:
        table._names[key] = f"/dev/{key[1]}-{key[2]}"  # as if a look had named it
        table.facts(key)
    before = {key: table.facts(key) for key in keys}
    made.clear()
    with table.one_look():
        table.look([])
        assert not table.device_changed("b", [(8, 33)])  # nothing changed
        table.device_changed("b", [(8, 34)])
    assert len(made) == 1
    assert {key: table.facts(key) for key in keys} == before
    # the next batch reads sysfs afresh: sdc2 is gone
    part = tmp_path / "sys" / "class" / "block" / "sdc2"
    shutil.rmtree(part.resolve())
    part.unlink()
    (tmp_path / "sys" / "dev" / "block" / "8:34").unlink()
    with table.one_look():
        changed = table.device_changed("b", [(8, 34)])
    assert len(made) == 2
    assert ("b", 8, 34) in changed.keys
    assert table.facts(("b", 8, 34)).kernel_name is None


def test_a_batch_that_observes_a_new_device_twice_reads_its_own_sysfs_once(tmp_path, monkeypatch):
    """A device a look finds, and its event reads again in the same batch:
    its NUMA node and its condition are read from sysfs once (a survey,
    which observes each device once, keeps nothing of them)."""
    from powerdev.devices import condition as condition_module
    from powerdev.devices import identity

    reads = {"numa": 0, "condition": 0}
    numa, device = identity.numa_node, condition_module._Look.device

    def counted_numa(*args, **kwargs):
        reads["numa"] += 1
        return numa(*args, **kwargs)

    def counted_condition(self, *args, **kwargs):
        reads["condition"] += 1
        return device(self, *args, **kwargs)

    monkeypatch.setattr(identity, "numa_node", counted_numa)
    monkeypatch.setattr(condition_module._Look, "device", counted_condition)
    table = table_for(tmp_path)
    key = ("b", 8, 34)
    with table.one_look():
        table._names[key] = "/dev/sdc2"  # as if the look had named it
        table.facts(key)
        table.device_changed("b", [(8, 34)])
    assert reads == {"numa": 1, "condition": 1}


def test_an_unreadable_mount_table_is_logged_not_fatal(tmp_path, caplog):
    sys_root = sysfs(tmp_path / "sys", TREE)
    table = DeviceTable(tmp_path, sys_root, host=HostFiles(tmp_path / "missing", None))
    with caplog.at_level(logging.WARNING):
        assert table.facts(("b", 8, 48)).host_use == "held by dm-3"  # holders still count
    assert "cannot read" in caplog.text and "missing" in caplog.text


@needs_root
def test_sources_and_swap_partitions_are_looked_up_under_the_dev_root(tmp_path):
    dev = tmp_path / "dev"
    (dev / "mapper").mkdir(parents=True)
    os.mknod(dev / "dm-1", stat.S_IFBLK | 0o600, os.makedev(253, 1))
    os.mknod(dev / "nowhere", stat.S_IFBLK | 0o600, os.makedev(8, 80))
    (dev / "mapper" / "swap").symlink_to("../dm-1")
    assert swapping(SWAPS, dev) == {(253, 1): "active swap"}
    assert swapping(SWAPS.replace("/dev/dm-1", "/dev/mapper/swap"), dev) == {
        (253, 1): "active swap"
    }
    # the btrfs line has an anonymous number; its source names the device
    assert mounted(MOUNTINFO, dev)[(8, 80)] == "mounted at /var/lib/my data"
    # XFS names its external log and realtime device in its super options
    os.mknod(dev / "xlog", stat.S_IFBLK | 0o600, os.makedev(8, 96))
    os.mknod(dev / "xrt", stat.S_IFBLK | 0o600, os.makedev(8, 112))
    xfs = "40 29 8:80 / /x rw - xfs /dev/nowhere rw,logdev=/dev/xlog,rtdev=/dev/xrt,noquota\n"
    assert mounted(xfs, dev) == {
        (8, 80): "mounted at /x",
        (8, 96): "the external log of the xfs filesystem mounted at /x",
        (8, 112): "the realtime device of the xfs filesystem mounted at /x",
    }


def test_mounted_filesystems_are_seen_in_sysfs_alone(tmp_path):
    sys_root = tmp_path / "sys"
    for name, number in {"sda1": "8:1", "dm-2": "253:2", "vdb": "252:16"}.items():
        (sys_root / "class" / "block" / name).mkdir(parents=True)
        (sys_root / "class" / "block" / name / "dev").write_text(number + "\n")
    for entry in ("fs/ext4/features", "fs/ext4/sda1", "fs/xfs/stats", "fs/xfs/dm-2"):
        (sys_root / entry).mkdir(parents=True)
    (sys_root / "fs/btrfs/features").mkdir(parents=True)
    (sys_root / "fs/btrfs/0b1c-uuid/devices").mkdir(parents=True)
    (sys_root / "fs/btrfs/0b1c-uuid/devices/vdb").symlink_to(sys_root / "class/block/vdb")
    assert sysfs_mounted(sys_root) == {
        (8, 1): "a mounted ext4 filesystem",
        (253, 2): "a mounted xfs filesystem",
        (252, 16): "in a mounted btrfs filesystem",
    }
    table = DeviceTable(tmp_path / "dev", sys_root, host=HostFiles(None, None))
    assert table.facts(("b", 253, 2)).host_use == "a mounted xfs filesystem"


def live_ext4(tmp_path: Path) -> Path:
    """A sysfs tree with one live ext4 filesystem, on sdj (8:144)."""
    sys_root = tree(tmp_path)
    (sys_root / "fs" / "ext4" / "features").mkdir(parents=True)
    (sys_root / "fs" / "ext4" / "sdj").mkdir()
    return sys_root


def test_while_a_swap_file_is_active_every_live_filesystem_counts(tmp_path):
    sys_root = live_ext4(tmp_path)
    # no swap file: the mount table alone says what is mounted
    assert (8, 144) not in direct_use(MOUNTINFO, NO_SWAPS, tmp_path / "dev", sys_root)
    found = direct_use(MOUNTINFO, SWAPS, tmp_path / "dev", sys_root)
    assert found[(8, 144)] == (
        "under a live ext4 filesystem missing from the mount table, "
        "while a swap file is active (/var/swap file)"
    )
    assert found[(8, 16)] == "mounted at /mnt/with space"  # the table still says it first


def test_the_table_reads_swap_files_and_external_journals(tmp_path):
    table = table_for(tmp_path, swaps_text=SWAPS)
    (table.sys_root / "fs" / "ext4" / "sdj").mkdir(parents=True)
    jbd2 = tmp_path / "fs" / "jbd2"  # beside the swaps file, as /proc/fs/jbd2 is
    for entry in ("sdi", "sda1-8", "dm-0-8"):
        (jbd2 / entry).mkdir(parents=True)
    found = host_use(table, ("b", 8, 128), ("b", 8, 144), ("b", 253, 4))
    assert found[("b", 8, 128)] == "the external journal (jbd2) of a mounted filesystem"
    assert found[("b", 8, 144)].startswith("under a live ext4 filesystem")
    assert found[("b", 253, 4)] is None


@needs_root
async def test_scan_and_the_daemon_give_the_same_reasons(tmp_path, caplog):
    """One verdict: what `powerdev scan` says of a device and what the
    daemon logs of it are the same words."""
    from powerdev.ops import scan
    from tests.conftest import config_for

    table = table_for(tmp_path)
    dev = tmp_path / "dev"
    dev.mkdir()
    os.mknod(dev / "sda", stat.S_IFBLK | 0o600, os.makedev(8, 0))
    os.mknod(dev / "dm-4", stat.S_IFBLK | 0o600, os.makedev(253, 4))
    (dev / "sg0").symlink_to("/dev/null")  # no disk behind it: advertised
    config = config_for('{"include-devices": ["/dev/sda", "/dev/dm-4", "/dev/sg0"]}')
    host = table.host
    (report,) = scan.scan(config, dev, table.sys_root, None, host)
    assert [d.path for d in report.advertised] == ["/dev/dm-4", "/dev/sg0"]
    (left_out,) = report.left_out
    tracker = Tracker(config.resources[0], Inventory(), dev, table.sys_root, host=host)
    with caplog.at_level(logging.WARNING):
        await tracker.rescan()
    assert f"{left_out[0]} left out: {left_out[1]}" in caplog.text
    assert left_out == (
        "/dev/sda",
        "the host uses it: the whole disk of sda1, which is mounted at /boot",
    )


async def test_a_filesystem_alive_after_its_unmount_is_looked_at_again(tmp_path):
    """While a swap file is active, a filesystem that is alive but in no
    mount table keeps a device out; when it goes (its teardown after an
    unmount ends), nothing flags it, so the event source looks again."""
    import trio

    from powerdev.devices.hostuse_events import HOST_USE, HostUseEvents

    sys_root = live_ext4(tmp_path)  # sdj's ext4 is alive, and not in the table
    (tmp_path / "mountinfo").write_text(MOUNTINFO)
    (tmp_path / "swaps").write_text(SWAPS)
    with (
        HostUseEvents(
            tmp_path / "dev",
            tmp_path / "mountinfo",
            tmp_path / "swaps",
            sys_root=sys_root,
            settle=(0.01, 0.04),
        ) as events,
        trio.fail_after(10),
    ):
        before = events.used
        assert "alive 8:144" in before
        (sys_root / "fs" / "ext4" / "sdj").rmdir()  # the filesystem is gone
        assert await events.next_batch() == HOST_USE
        assert events.used == before - {"alive 8:144"}


def test_no_timer_without_a_swap_file(tmp_path):
    from powerdev.devices.hostuse_events import HostUseEvents

    sys_root = live_ext4(tmp_path)
    (tmp_path / "mountinfo").write_text(MOUNTINFO)
    (tmp_path / "swaps").write_text(NO_SWAPS)
    with HostUseEvents(
        tmp_path / "dev", tmp_path / "mountinfo", tmp_path / "swaps", sys_root=sys_root
    ) as events:
        assert events._lingering == frozenset()  # so the wait has no timeout
        assert events.in_use() == frozenset({(253, 0), (8, 1), (8, 16)})


def test_place_among_the_disks_kernel_and_kpartx_partitions(tmp_path):
    topology = BlockTopology(tree(tmp_path))
    assert topology.place((8, 33)) == ((8, 32), False)  # sdc1, a kernel partition
    assert topology.place((8, 32)) == (None, True)  # sdc has partitions
    assert topology.place((253, 4)) == ((253, 3), False)  # a kpartx map of dm-3
    assert topology.place((253, 3)) == (None, True)  # dm-3, partitioned by kpartx
    assert topology.place((8, 48)) == (None, False)  # sdd: a leg, no partitions
    assert topology.place((8, 999)) == (None, False)  # not in sysfs
