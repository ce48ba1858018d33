"""A device's family over sysfs trees laid out as the kernel lays them out:
what lies on it, what it lies on, and the same storage under other numbers
(aliases, identities, members of one stack); and the node's device table,
which keeps families in step with events and sees each relation from both
sides."""

from __future__ import annotations

import os
from pathlib import Path

from powerdev.devices.family import Family, family
from powerdev.devices.inuse import BlockTopology
from powerdev.devices.table import DeviceTable
from tests.unit.test_inuse import alias_tree, sysfs, tree


def b(major: int, minor: int) -> tuple[str, int, int]:
    return ("b", major, minor)


def c(major: int, minor: int) -> tuple[str, int, int]:
    return ("c", major, minor)


def fam(sys_root: Path, key, same_identity=lambda key: ()) -> Family:
    return family(BlockTopology(sys_root), key, same_identity)


def test_a_partition_lies_on_its_disk_and_its_sibling_is_no_family(tmp_path):
    root = tree(tmp_path)
    sdc2 = fam(root, b(8, 34))
    assert sdc2 == Family(below=frozenset({b(8, 32)}))  # sdc; not sdc1, not sdc1's LV
    sdc = fam(root, b(8, 32))
    # its partitions, and the LV on the first one
    assert sdc.above == {b(8, 33), b(8, 34), b(253, 2)} and not sdc.below and not sdc.same


def test_multipath_legs_are_one_lun_and_its_partition_maps_lie_on_all_of_it(tmp_path):
    root = tree(tmp_path)
    leg = fam(root, b(8, 48))  # sdd, a leg of dm-3
    assert leg.same == {b(8, 64)}  # sde, the other path
    assert leg.above == {b(253, 3), b(253, 4), b(253, 5)}
    part = fam(root, b(253, 4))  # dm-4, kpartx partition 1 of dm-3
    assert part.below == {b(253, 3), b(8, 48), b(8, 64)}
    assert b(253, 5) not in part.overlapping  # its sibling shares no block


def test_two_logical_volumes_on_one_pv_are_no_family_but_both_lie_on_it(tmp_path):
    root = tree(tmp_path)
    root_lv, data_lv = fam(root, b(253, 0)), fam(root, b(253, 1))
    assert b(253, 1) not in root_lv.overlapping and b(253, 0) not in data_lv.overlapping
    assert data_lv.below == {b(8, 3), b(8, 0)}  # sda3 and its disk sda


def test_loop_devices_lie_on_their_backing_disk(tmp_path):
    root = tree(tmp_path)
    assert fam(root, b(7, 0)).below == {b(8, 96)}  # loop0 over sdg
    assert fam(root, b(8, 96)).above == {b(7, 0)}


def test_btrfs_members_and_md_members_are_one_filesystem(tmp_path):
    root = tree(tmp_path)
    assert fam(root, b(8, 112)).same == {b(8, 128)}  # sdh, sdi: one btrfs
    md = fam(root, b(9, 0))
    assert md.below == {b(8, 81), b(8, 80)}  # sdf1 and its disk


def test_a_character_alias_is_its_disk(tmp_path):
    root = alias_tree(tmp_path / "sys")
    sg0 = fam(root, c(21, 0))
    assert sg0 == Family(same=frozenset({b(8, 240)}), above=frozenset({b(8, 241)}))
    nvme0 = fam(root, c(240, 0))  # the controller reaches every namespace
    assert nvme0.same == {b(259, 0), b(259, 2)} and nvme0.above == {b(259, 1)}
    assert fam(root, c(238, 3)).same == {b(259, 3)}  # ng2n1 -> the multipath head nvme1n1
    assert fam(root, c(1, 3)) == Family()  # /dev/null reaches no disk


def test_devices_with_one_identity_are_the_same_storage(tmp_path):
    root = sysfs(tmp_path / "sys", {"sdx": {"dev": "8:0"}, "sdy": {"dev": "8:16"}})
    for name in ("sdx", "sdy"):
        (root / "class" / "block" / name / "wwid").write_text("naa.600a0b80\n")
    table = DeviceTable(tmp_path / "dev", root)
    nodes(tmp_path / "dev", {"sdx": (8, 0), "sdy": (8, 16)})
    table.look(["/dev/sdx", "/dev/sdy"])
    assert table.overlapping(b(8, 0)) == {b(8, 16)}
    assert table.overlapping(b(8, 16)) == {b(8, 0)}


def nodes(dev: Path, numbers: dict[str, tuple[int, int]], kind: str = "b") -> None:
    """Device nodes under dev (root: mknod makes any numbers)."""
    import stat

    dev.mkdir(parents=True, exist_ok=True)
    mode = stat.S_IFBLK if kind == "b" else stat.S_IFCHR
    for name, (major, minor) in numbers.items():
        path = dev / name
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(path, mode | 0o600, os.makedev(major, minor))
