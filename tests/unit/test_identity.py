"""Device identities, properties and NUMA nodes over temp sysfs trees and udev
database directories shaped like the kernel's and udev's."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from powerdev.devices.identity import identity, identity_id, numa_node, properties, sysfs_dir
from powerdev.devices.udevdb import Pyudev
from tests.conftest import DirectoryUdev

PCI = "pci0000:00/0000:00:1f.2"
SCSI_DEV = f"{PCI}/host0/target0:0:0/0:0:0:0"
SDA = f"{SCSI_DEV}/block/sda"
NVME = "pci0000:00/0000:00:1d.0/0000:3c:00.0/nvme/nvme0"
VDA = "pci0000:00/0000:00:02.0/virtio1/block/vda"
ALLOWED = re.compile(r"[A-Za-z0-9._-]{1,63}")


class FakeSys:
    """A sysfs tree under root: devices/<path> directories with dev, uevent
    and a subsystem link, and dev/{block,char}/M:m links to them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "devices").mkdir(parents=True, exist_ok=True)

    def device(
        self,
        path: str,
        number: tuple[int, int],
        kind: str = "block",
        uevent: dict[str, str] | None = None,
        files: dict[str, str] | None = None,
    ) -> Path:
        where = self.root / "devices" / path
        where.mkdir(parents=True, exist_ok=True)
        major, minor = number
        (where / "dev").write_text(f"{major}:{minor}\n")
        fields = {"MAJOR": str(major), "MINOR": str(minor), "DEVNAME": where.name}
        fields.update(uevent or {})
        (where / "uevent").write_text("".join(f"{k}={v}\n" for k, v in fields.items()))
        subsystem = self.root / "class" / kind
        subsystem.mkdir(parents=True, exist_ok=True)
        (where / "subsystem").symlink_to(os.path.relpath(subsystem, where))
        for name, text in (files or {}).items():
            self.file(path + "/" + name, text)
        links = self.root / "dev" / kind
        links.mkdir(parents=True, exist_ok=True)
        (links / f"{major}:{minor}").symlink_to(os.path.relpath(where, links))
        return where

    def file(self, path: str, text: str) -> Path:
        where = self.root / "devices" / path
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_text(text)
        return where

    def link(self, path: str, target: str) -> None:
        (self.root / "devices" / path).symlink_to(target)


def scsi_disk(tree: FakeSys, wwid: str | None = "naa.5000c500a1b2c3d4\n") -> Path:
    """sda on a SCSI host on a PCI controller, with a `device` link to its SCSI
    device (which has the wwid) and a partition sda1."""
    tree.file(f"{PCI}/numa_node", "1\n")
    if wwid is not None:
        tree.file(f"{SCSI_DEV}/wwid", wwid)
    disk = tree.device(SDA, (8, 0), uevent={"DEVTYPE": "disk"})
    tree.link(f"{SDA}/device", "../../../0:0:0:0")
    tree.device(f"{SDA}/sda1", (8, 1), uevent={"DEVTYPE": "partition", "PARTN": "1"})
    (disk / "sda1" / "partition").write_text("1\n")
    return disk


def udev_db(root: Path, entries: dict[str, list[str]]) -> DirectoryUdev:
    root.mkdir(parents=True, exist_ok=True)
    for name, lines in entries.items():
        (root / name).write_text("".join(line + "\n" for line in lines))
    return DirectoryUdev(root)


@pytest.fixture
def tree(tmp_path):
    return FakeSys(tmp_path / "sys")


# --- sysfs_dir -----------------------------------------------------------------


def test_sysfs_dir_resolves_the_dev_link(tree):
    scsi_disk(tree)
    assert sysfs_dir(tree.root, "b", (8, 0)) == (tree.root / "devices" / SDA).resolve()
    assert sysfs_dir(tree.root, "block", (8, 1)) == (tree.root / "devices" / SDA / "sda1").resolve()
    assert sysfs_dir(tree.root, "b", (8, 16)) is None
    assert sysfs_dir(tree.root, "c", (8, 0)) is None  # a char device is looked up apart
    assert sysfs_dir(tree.root / "nowhere", "b", (8, 0)) is None


def test_a_dangling_dev_link_is_absent(tree):
    links = tree.root / "dev" / "block"
    links.mkdir(parents=True)
    (links / "8:0").symlink_to("../../devices/gone/sda")
    assert sysfs_dir(tree.root, "b", (8, 0)) is None
    assert identity(tree.root, None, "b", (8, 0)) is None
    assert properties(tree.root, None, "b", (8, 0)) == {}


def test_an_unknown_kind_is_a_programming_error(tree):
    with pytest.raises(ValueError, match="device kind 'x'"):
        sysfs_dir(tree.root, "x", (8, 0))


# --- identity: each source ------------------------------------------------------


def test_a_multipath_map_is_its_dm_uuid(tree):
    tree.device(
        "virtual/block/dm-0",
        (253, 0),
        files={"dm/uuid": "mpath-3600a098038303053453f463045727a57\n", "dm/name": "mpatha\n"},
    )
    assert identity(tree.root, None, "b", (253, 0)) == (
        "DM_UUID",
        "mpath-3600a098038303053453f463045727a57",
    )


def test_a_scsi_disk_is_its_wwid(tree):
    scsi_disk(tree)
    assert identity(tree.root, None, "b", (8, 0)) == ("WWID", "naa.5000c500a1b2c3d4")


def test_an_nvme_namespace_is_the_wwid_on_its_disk(tree):
    # NVMe reports the WWID on the namespace; the controller's serial is shared
    # by its namespaces and so comes later.
    ns = f"{NVME}/nvme0n1"
    tree.file(f"{NVME}/serial", "S4EWNX0R123456\n")
    tree.device(ns, (259, 0), files={"wwid": "eui.0025388b91b2c3d4\n"})
    tree.link(f"{ns}/device", "../../nvme0")
    assert identity(tree.root, None, "b", (259, 0)) == ("WWID", "eui.0025388b91b2c3d4")


def test_a_virtio_disk_is_its_serial(tree):
    tree.device(VDA, (254, 0), files={"serial": "disk-serial-42\n"})
    assert identity(tree.root, None, "b", (254, 0)) == ("SERIAL", "disk-serial-42")


def test_a_serial_on_the_device_counts(tree):
    tree.file(f"{NVME}/serial", "S4EWNX0R123456   \n")
    tree.device(f"{NVME}/nvme0n1", (259, 0))
    tree.link(f"{NVME}/nvme0n1/device", "../../nvme0")
    assert identity(tree.root, None, "b", (259, 0)) == ("SERIAL", "S4EWNX0R123456")


def test_a_loop_device_is_its_backing_file(tree):
    tree.device("virtual/block/loop0", (7, 0), files={"loop/backing_file": "/var/lib/x.img\n"})
    assert identity(tree.root, None, "b", (7, 0)) == ("LOOP_BACKING_FILE", "/var/lib/x.img")


def test_an_unbound_loop_device_has_no_identity(tree):
    tree.device("virtual/block/loop1", (7, 1))
    assert identity(tree.root, None, "b", (7, 1)) is None


UDEV_CASES = [
    # (udev lines of b8:16, expected identity of a bare disk)
    (["E:DM_UUID=LVM-abc123"], ("DM_UUID", "LVM-abc123")),
    (["E:ID_WWN=0x5000c500a1b2c3d4"], ("ID_WWN", "0x5000c500a1b2c3d4")),
    (
        ["E:ID_WWN=0x6005076", "E:ID_WWN_WITH_EXTENSION=0x60050768c17e1234"],
        ("ID_WWN", "0x60050768c17e1234"),
    ),
    (["E:ID_SERIAL=ST1000_Z1D2E3F4"], ("ID_SERIAL", "ST1000_Z1D2E3F4")),
    (
        ["E:ID_SERIAL=ST1000_Z1D2E3F4", "E:ID_WWN=0x5000c500a1b2c3d4"],
        ("ID_WWN", "0x5000c500a1b2c3d4"),
    ),
    (["S:disk/by-id/wwn-0x5000c500a1b2c3d4", "I:123456"], None),  # only E: lines count
    (["E:ID_SERIAL=", "E:ID_WWN="], None),  # empty values are absent
    (["E:ID_SERIAL=   "], None),
    ([], None),
]


@pytest.mark.parametrize(("lines", "expected"), UDEV_CASES)
def test_identity_from_udev(tree, tmp_path, lines, expected):
    tree.device("pci0000:00/0000:00:1f.2/host1/target1:0:0/1:0:0:0/block/sdb", (8, 16))
    data = udev_db(tmp_path / "udev", {"b8:16": lines})
    assert identity(tree.root, data, "b", (8, 16)) == expected
    assert identity(tree.root, None, "b", (8, 16)) is None  # without udev: nothing


# --- identity: the order of preference ------------------------------------------

ALL_SOURCES = {
    "dm": ("dm/uuid", "mpath-3600a0980383030"),
    "wwid": ("wwid", "naa.600a0980383030"),
    "id_wwn": (None, "0x600a0980383030"),
    "serial": ("serial", "SER123"),
    "id_serial": (None, "NETAPP_LUN_SER123"),
    "loop": ("loop/backing_file", "/srv/disk.img"),
}
ORDER = [
    ("dm", "DM_UUID"),
    ("wwid", "WWID"),
    ("id_wwn", "ID_WWN"),
    ("serial", "SERIAL"),
    ("id_serial", "ID_SERIAL"),
    ("loop", "LOOP_BACKING_FILE"),
]


@pytest.mark.parametrize("dropped", range(len(ORDER) + 1))
def test_sources_in_order_of_preference(tree, tmp_path, dropped):
    """With every source there, the first wins; drop it and the next wins."""
    left = dict(ORDER[dropped:])
    files = {ALL_SOURCES[k][0]: ALL_SOURCES[k][1] + "\n" for k in left if ALL_SOURCES[k][0]}
    tree.device("virtual/block/dm-7", (253, 7), files=files)
    lines = []
    if "id_wwn" in left:
        lines.append(f"E:ID_WWN={ALL_SOURCES['id_wwn'][1]}")
    if "id_serial" in left:
        lines.append(f"E:ID_SERIAL={ALL_SOURCES['id_serial'][1]}")
    data = udev_db(tmp_path / "udev", {"b253:7": lines})
    expected = (ORDER[dropped][1], ALL_SOURCES[ORDER[dropped][0]][1]) if left else None
    assert identity(tree.root, data, "b", (253, 7)) == expected


def test_sysfs_wins_over_udev_within_a_kind(tree, tmp_path):
    # udev's database is written after the kernel's add event: an ID taken from
    # sysfs does not change when it appears.
    scsi_disk(tree)
    data = udev_db(tmp_path / "udev", {"b8:0": ["E:ID_WWN=0x5000c500a1b2c3d4"]})
    assert identity(tree.root, data, "b", (8, 0)) == ("WWID", "naa.5000c500a1b2c3d4")


def test_dm_uuid_from_udev_when_sysfs_has_none(tree, tmp_path):
    tree.device("virtual/block/dm-2", (253, 2), files={"dm/uuid": "\n", "dm/name": "x\n"})
    assert identity(tree.root, None, "b", (253, 2)) is None  # empty dm/uuid: no UUID set
    data = udev_db(tmp_path / "udev", {"b253:2": ["E:DM_UUID=CRYPT-LUKS2-abc-x"]})
    assert identity(tree.root, data, "b", (253, 2)) == ("DM_UUID", "CRYPT-LUKS2-abc-x")


# --- identity: partitions ---------------------------------------------------------


def test_a_partition_is_its_disks_identity_and_number(tree):
    scsi_disk(tree)
    assert identity(tree.root, None, "b", (8, 1)) == ("WWID", "naa.5000c500a1b2c3d4-part1")


def test_a_partition_uses_its_disks_udev_record_not_its_own(tree, tmp_path):
    # udev copies the disk's ID_SERIAL onto each partition: used as it is, every
    # partition would share the disk's ID.
    scsi_disk(tree, wwid=None)
    data = udev_db(
        tmp_path / "udev",
        {"b8:0": ["E:ID_SERIAL=DISK_A"], "b8:1": ["E:ID_SERIAL=DISK_A", "E:PARTN=1"]},
    )
    assert identity(tree.root, data, "b", (8, 0)) == ("ID_SERIAL", "DISK_A")
    assert identity(tree.root, data, "b", (8, 1)) == ("ID_SERIAL", "DISK_A-part1")


def test_a_partition_of_a_disk_without_identity_has_none(tree):
    scsi_disk(tree, wwid=None)
    assert identity(tree.root, None, "b", (8, 1)) is None


def test_a_loop_partition(tree):
    tree.device("virtual/block/loop3", (7, 3), files={"loop/backing_file": "/img/a.img\n"})
    tree.device(
        "virtual/block/loop3/loop3p2",
        (259, 5),
        uevent={"DEVTYPE": "partition", "PARTN": "2"},
        files={"partition": "2\n"},
    )
    assert identity(tree.root, None, "b", (259, 5)) == ("LOOP_BACKING_FILE", "/img/a.img-part2")


def test_partn_from_the_partition_file_when_uevent_lacks_it(tree):
    scsi_disk(tree)
    tree.device(f"{SDA}/sda3", (8, 3), files={"partition": "3\n"})
    assert identity(tree.root, None, "b", (8, 3)) == ("WWID", "naa.5000c500a1b2c3d4-part3")


# --- identity: what is never an identity ------------------------------------------


def test_character_devices_have_no_identity(tree, tmp_path):
    tree.device("virtual/mem/null", (1, 3), kind="char", files={"serial": "X1\n"})
    data = udev_db(tmp_path / "udev", {"c1:3": ["E:ID_SERIAL=X1"]})
    assert identity(tree.root, data, "c", (1, 3)) is None
    assert identity(tree.root, data, "char", (1, 3)) is None


def test_a_device_missing_from_sysfs_has_no_identity(tree, tmp_path):
    data = udev_db(tmp_path / "udev", {"b8:32": ["E:ID_SERIAL=X1"]})
    assert identity(tree.root, data, "b", (8, 32)) is None


@pytest.mark.parametrize("bad", ["directory", "dangling", "blank"])
def test_an_unreadable_or_blank_source_is_skipped(tree, bad):
    disk = scsi_disk(tree, wwid=None)
    wwid = tree.root / "devices" / SCSI_DEV / "wwid"
    if bad == "directory":
        wwid.mkdir()
    elif bad == "dangling":
        wwid.symlink_to("nowhere")
    else:
        wwid.write_text(" \n\t\n")
    (disk / "serial").write_text("SER9\n")
    assert identity(tree.root, None, "b", (8, 0)) == ("SERIAL", "SER9")


def test_a_device_udev_does_not_know_has_no_udev_identity(tree, tmp_path):
    scsi_disk(tree, wwid=None)
    assert identity(tree.root, udev_db(tmp_path / "udev", {}), "b", (8, 0)) is None
    assert Pyudev().properties("b", (4095, 1048575)) == {}  # no such device here


# --- properties ---------------------------------------------------------------------


def test_properties_from_sysfs(tree):
    scsi_disk(tree)
    tree.device(
        "virtual/block/dm-0",
        (253, 0),
        uevent={"DEVTYPE": "disk", "DISKSEQ": "12"},
        files={"dm/uuid": "mpath-3600a09803830\n", "dm/name": "mpatha\n"},
    )
    assert properties(tree.root, None, "b", (253, 0)) == {
        "MAJOR": "253",
        "MINOR": "0",
        "DEVNAME": "dm-0",
        "DEVTYPE": "disk",
        "DISKSEQ": "12",
        "SUBSYSTEM": "block",
        "DM_NAME": "mpatha",
        "DM_UUID": "mpath-3600a09803830",
    }
    assert properties(tree.root, None, "b", (8, 1)) == {
        "MAJOR": "8",
        "MINOR": "1",
        "DEVNAME": "sda1",
        "DEVTYPE": "partition",
        "PARTN": "1",
        "SUBSYSTEM": "block",
    }


def test_udev_wins_over_sysfs_and_only_e_lines_count(tree, tmp_path):
    tree.device("virtual/block/dm-1", (253, 1), files={"dm/uuid": "\n", "dm/name": "old\n"})
    data = udev_db(
        tmp_path / "udev",
        {
            "b253:1": [
                "S:mapper/new",
                "S:disk/by-id/dm-name-new",
                "L:10",
                "E:DM_NAME=new",
                "E:DM_UUID=LVM-xyz",
                "E:ID_FS_TYPE=xfs",
                "E:WITH_EQUALS=a=b",
                "E:",
                "E:NOEQUALS",
                "G:systemd",
            ]
        },
    )
    found = properties(tree.root, data, "b", (253, 1))
    assert found["DM_NAME"] == "new"
    assert found["DM_UUID"] == "LVM-xyz"  # sysfs had an empty one: left out, udev's counts
    assert found["ID_FS_TYPE"] == "xfs"
    assert found["WITH_EQUALS"] == "a=b"
    assert found["SUBSYSTEM"] == "block"
    assert "NOEQUALS" not in found and "" not in found
    assert not any(key.startswith(("S:", "L:", "G:")) for key in found)


def test_udev_files_are_named_by_kind_and_number(tree, tmp_path):
    tree.device("virtual/mem/null", (1, 3), kind="char")
    data = udev_db(tmp_path / "udev", {"c1:3": ["E:FROM=char"], "b1:3": ["E:FROM=block"]})
    assert properties(tree.root, data, "c", (1, 3))["FROM"] == "char"
    assert properties(tree.root, data, "c", (1, 3))["SUBSYSTEM"] == "char"
    assert properties(tree.root, data, "b", (1, 3)) == {"FROM": "block"}  # not in sysfs


def test_properties_never_raise(tree, tmp_path):
    where = tree.device("virtual/block/loop9", (7, 9))
    (where / "uevent").unlink()
    (where / "uevent").mkdir()  # unreadable
    (where / "subsystem").unlink()
    assert properties(tree.root, None, "b", (7, 9)) == {}
    assert properties(tree.root, None, "b", (7, 99)) == {}


# --- identity_id ---------------------------------------------------------------------


def digest(source: str, value: str) -> str:
    return hashlib.sha256(f"{source}\0{value}".encode()).hexdigest()[:12]


@pytest.mark.parametrize(
    ("source", "value", "expected"),
    [
        (
            "DM_UUID",
            "mpath-3600a098038303053453f463045727a57",
            "dm-uuid.mpath-3600a098038303053453f463045727a57",
        ),
        ("ID_WWN", "0x5000c500a1b2c3d4", "wwn.0x5000c500a1b2c3d4"),
        ("WWID", "naa.5000c500a1b2c3d4", "wwid.naa.5000c500a1b2c3d4"),
        ("WWID", "naa.5000c500a1b2c3d4-part1", "wwid.naa.5000c500a1b2c3d4-part1"),
        ("ID_SERIAL", "ST1000_Z1D2E3F4", "serial.ST1000_Z1D2E3F4"),
        ("SERIAL", "SER123", "sys-serial.SER123"),
        ("NEW_SOURCE", "v1", "new_source.v1"),
    ],
)
def test_readable_ids(source, value, expected):
    assert identity_id(source, value) == expected


@pytest.mark.parametrize(
    ("source", "value", "head"),
    [
        ("LOOP_BACKING_FILE", "/var/lib/x.img", "loop-file.var.lib.x.img"),
        ("LOOP_BACKING_FILE", "/var/lib.x/img", "loop-file.var.lib.x.img"),
        ("SERIAL", "QM00001 disk", "sys-serial.QM00001_disk"),
        ("SERIAL", "QM00001_disk", None),  # used as it is: no hash
        ("ID_SERIAL", "a:b", "serial.a_b"),
        ("ID_SERIAL", "caf\u00e9", "serial.caf_"),
    ],
)
def test_changed_values_end_with_a_hash(source, value, head):
    got = identity_id(source, value)
    if head is None:
        assert not got.endswith(digest(source, value))
    else:
        assert got == f"{head}-{digest(source, value)}"


def test_the_same_path_with_slash_or_dot_gets_two_ids():
    assert identity_id("LOOP_BACKING_FILE", "/var/lib/x.img") != identity_id(
        "LOOP_BACKING_FILE", "/var/lib.x/img"
    )


def test_long_values_keep_a_head_and_a_hash():
    value = "mpath-" + "3600a0980383030534" * 5
    got = identity_id("DM_UUID", value)
    assert len(got) == 63
    assert got == f"dm-uuid.{value}"[:50] + "-" + digest("DM_UUID", value)
    other = identity_id("DM_UUID", value[:-1] + "5")
    assert other[:50] == got[:50] and other != got  # same head, told apart by the hash


def test_ids_are_the_same_on_every_machine():
    # A recorded value: a change to the scheme renames every device a cluster has.
    assert (
        identity_id("LOOP_BACKING_FILE", "/var/lib/x.img") == "loop-file.var.lib.x.img-49543e4ae6bb"
    )


sources = st.sampled_from(
    ["DM_UUID", "WWID", "ID_WWN", "SERIAL", "ID_SERIAL", "LOOP_BACKING_FILE", "OTHER"]
)
values = st.one_of(
    st.text(min_size=1, max_size=120),
    st.text(alphabet="abc./-_ ", min_size=1, max_size=80),
    st.from_regex(r"/[a-z./]{1,100}", fullmatch=True),
)


@given(sources, values)
def test_ids_are_short_and_plain(source, value):
    got = identity_id(source, value)
    assert ALLOWED.fullmatch(got), got
    assert identity_id(source, value) == got


@given(st.lists(st.tuples(sources, values), min_size=2, max_size=30, unique=True))
def test_different_identities_get_different_ids(identities):
    ids = [identity_id(source, value) for source, value in identities]
    assert len(set(ids)) == len(ids)


# --- numa_node -------------------------------------------------------------------------


def test_a_disks_numa_node_is_its_controllers(tree):
    scsi_disk(tree)
    assert numa_node(tree.root, "b", (8, 0)) == 1
    assert numa_node(tree.root, "b", (8, 1)) == 1  # the partition: up through its disk


def test_the_nearest_numa_node_wins(tree):
    scsi_disk(tree)
    tree.file(f"{SCSI_DEV}/numa_node", "0\n")
    assert numa_node(tree.root, "b", (8, 0)) == 0


@pytest.mark.parametrize("text", ["-1\n", "", "x\n"])
def test_unknown_numa_node(tree, text):
    scsi_disk(tree)
    tree.file(f"{PCI}/numa_node", text)
    assert numa_node(tree.root, "b", (8, 0)) is None


def test_no_numa_node_for_virtual_or_missing_devices(tree):
    tree.device("virtual/block/loop0", (7, 0))
    (tree.root / "numa_node").write_text("0\n")  # above tree/devices: never read
    (tree.root / "devices" / "numa_node").write_text("0\n")
    assert numa_node(tree.root, "b", (7, 0)) is None
    assert numa_node(tree.root, "b", (7, 1)) is None


def test_an_unreadable_numa_node_is_none(tree):
    scsi_disk(tree)
    where = tree.root / "devices" / PCI / "numa_node"
    where.unlink()
    where.mkdir()
    assert numa_node(tree.root, "b", (8, 0)) is None


def test_devices_asked_together_share_what_their_directories_answer(tree):
    scsi_disk(tree)
    tree.file(f"{SCSI_DEV}/numa_node", "-1\n")  # the nearest: unknown, for both
    tree.file("pci0000:00/0000:00:05.0/numa_node", "3\n")
    tree.device("pci0000:00/0000:00:05.0/crypto/nx-gzip", (245, 0), kind="char")
    tree.device("virtual/block/loop0", (7, 0))
    asked = [("b", (8, 1)), ("b", (8, 0)), ("c", (245, 0)), ("b", (7, 0)), ("b", (8, 9))]
    seen: dict[str, int | None] = {}
    together = [numa_node(tree.root, kind, number, seen) for kind, number in asked]
    assert together == [numa_node(tree.root, kind, number) for kind, number in asked]
    assert together == [None, None, 3, None, None]
    (tree.root / "devices" / SCSI_DEV / "numa_node").unlink()  # now the controller's, 1
    assert numa_node(tree.root, "b", (8, 0), seen) is None  # what this look saw
    assert numa_node(tree.root, "b", (8, 0), {}) == 1


def test_char_devices_have_numa_nodes_too(tree):
    tree.file("pci0000:00/0000:00:05.0/numa_node", "3\n")
    tree.device("pci0000:00/0000:00:05.0/crypto/nx-gzip", (245, 0), kind="char")
    assert numa_node(tree.root, "c", (245, 0)) == 3
