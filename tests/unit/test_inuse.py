"""The host-disk guard over mountinfo texts, /proc/swaps texts and temp sysfs
trees; and the control-node rule."""

import logging
import os
import stat
from pathlib import Path

import pytest

from powerdev.config import ResourceConfig
from powerdev.devices.discovery import control_allowed, discover, is_control_node
from powerdev.devices.inuse import (
    HostUseGuard,
    mounted,
    swapping,
    sysfs_mounted,
    unescape,
    use_reason,
)
from powerdev.devices.inventory import Inventory
from powerdev.devices.model import Device
from powerdev.devices.tracker import DeviceEvent, Tracker
from tests.conftest import make_dev_tree, needs_root

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


def sysfs(root: Path, disks: dict[str, dict]) -> Path:
    """A sysfs tree: /sys/dev/block/M:m links to device directories with
    holders/, slaves/, and partitions (directories with a `partition` file)."""
    devices = root / "devices" / "virtual" / "block"
    links = root / "dev" / "block"
    links.mkdir(parents=True, exist_ok=True)

    def make(directory: Path, name: str, spec: dict, partition: bool) -> None:
        directory.mkdir(parents=True)
        (directory / "dev").write_text(spec["dev"] + "\n")
        for sub in ("holders", "slaves"):
            (directory / sub).mkdir()
            for other in spec.get(sub, ()):
                (directory / sub / other).symlink_to(devices / other)
        if partition:
            (directory / "partition").write_text("1\n")
        os.symlink(os.path.relpath(directory, links), links / spec["dev"])
        for part, part_spec in spec.get("parts", {}).items():
            make(directory / part, part, part_spec, True)

    for name, spec in disks.items():
        make(devices / name, name, spec, False)
    return root


TREE = {
    "sda": {"dev": "8:0", "parts": {"sda1": {"dev": "8:1"}, "sda2": {"dev": "8:2"}}},
    "sdb": {"dev": "8:16"},
    "sdc": {"dev": "8:32", "parts": {"sdc1": {"dev": "8:33", "holders": ["dm-0"]}}},
    "sdd": {"dev": "8:48", "holders": ["dm-3"]},
    "sde": {"dev": "8:64", "parts": {"sde1": {"dev": "8:65"}}},
    "dm-0": {"dev": "253:0", "slaves": ["sdc1"]},
    "dm-3": {"dev": "253:3", "slaves": ["sdd"]},
    "dm-4": {"dev": "253:4"},
}


def test_unescape_octal_fields():
    assert unescape("/mnt/with\\040space\\011tab\\134") == "/mnt/with space\ttab\\"


def test_mounted_devices_by_number():
    found = mounted(MOUNTINFO, Path("/nonexistent"))
    assert found == {
        (253, 0): "mounted at /",
        (8, 1): "mounted at /boot",
        (8, 16): "mounted at /mnt/with space",
    }  # anonymous numbers (0:N) never count; an unknown source is not guessed


def test_swap_partitions_count_and_swap_files_do_not(tmp_path):
    # /dev/dm-1 is not a block node under this dev root: nothing to look up
    assert swapping(SWAPS, tmp_path) == {}
    assert swapping("Filename Type Size Used Priority\n", tmp_path) == {}


@pytest.mark.parametrize(
    ("number", "why"),
    [
        ((253, 0), "mounted at /"),  # the root filesystem on dm
        ((8, 1), "mounted at /boot"),
        ((8, 0), "its partition sda1 is in use (mounted at /boot)"),  # the boot disk
        ((8, 2), None),  # a free partition of that disk
        ((8, 33), "held by dm-0"),  # beneath the mounted dm-0
        ((8, 32), "its partition sdc1 is in use (held by dm-0)"),
        ((8, 48), "held by dm-3"),  # a multipath leg
        ((253, 3), None),  # the multipath map itself, unmounted
        ((253, 4), None),
        ((8, 64), None),
        ((9, 9), None),  # nothing in sysfs
    ],
)
def test_use_reason(tmp_path, number, why):
    sys_root = sysfs(tmp_path / "sys", TREE)
    direct = mounted(MOUNTINFO, tmp_path)
    assert use_reason(sys_root, number, direct) == why


def block(path, major, minor, healthy=True):
    return Device(path.removeprefix("/dev/").replace("/", "."), path, "b", major, minor, healthy)


def guard_for(tmp_path, mountinfo_text=MOUNTINFO, swaps_text=""):
    (tmp_path / "mountinfo").write_text(mountinfo_text)
    (tmp_path / "swaps").write_text(swaps_text or "Filename Type Size Used Priority\n")
    sys_root = sysfs(tmp_path / "sys", TREE)
    return HostUseGuard(tmp_path / "dev", sys_root, tmp_path / "mountinfo", tmp_path / "swaps")


def test_devices_in_use_are_left_out_and_logged(tmp_path, caplog):
    guard = guard_for(tmp_path)
    found = [block("/dev/dm-0", 253, 0), block("/dev/dm-4", 253, 4), block("/dev/sda", 8, 0)]
    with caplog.at_level(logging.WARNING):
        kept = guard.screen(found, {}, allow=False)
    assert [d.path for d in kept] == ["/dev/dm-4"]
    assert guard.left_out == {
        "/dev/dm-0": "mounted at /",
        "/dev/sda": "its partition sda1 is in use (mounted at /boot)",
    }
    assert "/dev/dm-0 left out: the host uses it (mounted at /)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        guard.screen(found, {}, allow=False)
    assert caplog.text == ""  # logged once, not on every rescan


def test_a_resource_may_allow_devices_in_use(tmp_path):
    guard = guard_for(tmp_path)
    found = [block("/dev/dm-0", 253, 0), block("/dev/dm-4", 253, 4)]
    assert guard.screen(found, {}, allow=True) == found


def test_character_devices_are_never_judged(tmp_path):
    guard = guard_for(tmp_path)
    nx = Device("crypto.nx-gzip", "/dev/crypto/nx-gzip", "c", 253, 0)  # same numbers as dm-0
    assert guard.screen([nx], {}, allow=False) == [nx]


def test_listed_device_the_host_starts_using_turns_unhealthy_then_back(tmp_path):
    guard = guard_for(tmp_path, mountinfo_text="")
    dm4 = block("/dev/dm-4", 253, 4)
    assert guard.screen([dm4], {}, allow=False) == [dm4]
    (tmp_path / "mountinfo").write_text("40 29 253:4 / /srv rw - ext4 /dev/dm-4 rw\n")
    (sick,) = guard.screen([dm4], {dm4.path: dm4}, allow=False)
    assert sick == block("/dev/dm-4", 253, 4, healthy=False)
    (tmp_path / "mountinfo").write_text("")
    assert guard.screen([dm4], {dm4.path: sick}, allow=False) == [dm4]


def test_a_device_left_out_comes_back_when_the_host_lets_go(tmp_path):
    guard = guard_for(tmp_path)
    sdb = block("/dev/sdb", 8, 16)
    assert guard.screen([sdb], {}, allow=False) == []
    (tmp_path / "mountinfo").write_text("")
    assert guard.screen([sdb], {}, allow=False) == [sdb]
    assert guard.left_out == {}


def test_an_unreadable_mount_table_is_logged_not_fatal(tmp_path, caplog):
    sys_root = sysfs(tmp_path / "sys", TREE)
    guard = HostUseGuard(tmp_path, sys_root, tmp_path / "missing", None)
    with caplog.at_level(logging.WARNING):
        kept = guard.screen([block("/dev/sdd", 8, 48)], {}, allow=False)
    assert kept == []  # holders still count
    assert "cannot read" in caplog.text and "missing" in caplog.text


# --- control nodes -----------------------------------------------------------


def test_wildcards_never_grant_control_nodes(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", ["loop0", "loop1", "loop-control", "mapper/control"])
    wide = ResourceConfig(include=("/dev/loop*", "/dev/mapper/*"))
    assert [d.path for d in discover(wide, dev, tmp_path / "sys")] == ["/dev/loop0", "/dev/loop1"]
    literal = ResourceConfig(include=("/dev/loop*", "/dev/loop-control"))
    assert [d.path for d in discover(literal, dev, tmp_path / "sys")] == [
        "/dev/loop-control",
        "/dev/loop0",
        "/dev/loop1",
    ]


def test_control_nodes_are_known_by_their_kernel_name_too(tmp_path):
    # any name that is the loop-control device (a misc device, by its numbers in sysfs) counts
    sys_root = tmp_path / "sys"
    (sys_root / "devices" / "virtual" / "misc" / "loop-control").mkdir(parents=True)
    (sys_root / "dev" / "char").mkdir(parents=True)
    (sys_root / "dev" / "char" / "10:237").symlink_to("../../devices/virtual/misc/loop-control")
    odd = Device("odd", "/dev/odd", "c", 10, 237)
    assert is_control_node(odd, sys_root)
    assert not control_allowed(odd, ["/dev/o*"], sys_root)
    assert control_allowed(odd, ["/dev/odd"], sys_root)
    assert not is_control_node(Device("odd", "/dev/odd", "b", 10, 237), sys_root)


async def test_events_never_list_a_control_node(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", ["loop0"])
    t = Tracker(ResourceConfig(include=("/dev/loop*",)), Inventory(), dev, tmp_path / "sys")
    await t.rescan()
    (dev / "loop-control").symlink_to("/dev/null")
    (dev / "loop1").symlink_to("/dev/null")
    events = [
        DeviceEvent("add", ("/dev/loop-control",), "misc"),
        DeviceEvent("add", ("/dev/loop1",), "block"),
    ]
    assert t.apply(events) is True
    assert sorted(t.inventory.by_path) == ["/dev/loop0", "/dev/loop1"]


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
    guard = HostUseGuard(tmp_path / "dev", sys_root, None, None)
    assert guard.screen([block("/dev/dm-2", 253, 2)], {}, allow=False) == []
