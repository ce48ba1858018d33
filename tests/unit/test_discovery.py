"""Device matching and discovery over temp trees (links to /dev/null are real
character devices, so no root is needed here, but for block nodes)."""

import os
import stat
from pathlib import Path

import pytest

from powerdev.config import ResourceConfig
from powerdev.devices.discovery import block_candidates, matches, probe
from powerdev.devices.model import device_id
from powerdev.resources.matching import discover
from tests.conftest import make_dev_tree, needs_root


@pytest.mark.parametrize(
    ("pattern", "path", "hit"),
    [
        ("/dev/dm-*", "/dev/dm-0", True),
        ("/dev/dm-*", "/dev/dm-12", True),
        ("/dev/mapper/*", "/dev/mapper/mpatha", True),
        ("/dev/*", "/dev/mapper/mpatha", False),  # `*` never crosses a "/" (Go filepath.Match)
        ("/dev/sd?", "/dev/sda", True),
        ("/dev/sd?", "/dev/sda1", False),
        ("/dev/sd[a-c]1", "/dev/sdb1", True),
        ("/dev/sd[^a]", "/dev/sda", False),  # Go negates with '^' ...
        ("/dev/sd[!a]", "/dev/sda", True),  # ... and '!' is just a character
        ("/dev/crypto/nx-gzip", "/dev/crypto/nx-gzip", True),
        ("/dev/loop*", "/dev/loop-control", True),
    ],
)
def test_matches_like_go(pattern, path, hit):
    assert matches(pattern, path) is hit


@pytest.mark.parametrize(
    ("path", "ident"),
    [
        ("/dev/sda1", "sda1"),
        ("/dev/mapper/mpatha", "mapper.mpatha"),
        ("/dev/crypto/nx-gzip", "crypto.nx-gzip"),
    ],
)
def test_ids_come_from_the_path(path, ident):
    assert device_id(path) == ident


def test_long_ids_stay_within_63_characters_and_distinct():
    a = device_id("/dev/disk/by-id/" + "x" * 80 + "a")
    b = device_id("/dev/disk/by-id/" + "x" * 80 + "b")
    assert len(a) == len(b) == 63 and a != b
    assert device_id("/dev/disk/by-id/" + "x" * 80 + "a") == a


def test_only_character_and_block_nodes_count(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", ["good"])
    (dev / "regular").write_text("not a device")
    (dev / "directory").mkdir()
    os.mkfifo(dev / "fifo")
    (dev / "link-to-regular").symlink_to(dev / "regular")
    (dev / "dangling").symlink_to(dev / "nowhere")
    resource = ResourceConfig(include=("/dev/*",))
    assert [d.path for d in discover(resource, dev, tmp_path / "sys")] == ["/dev/good"]
    assert probe(dev, "/dev/fifo") is None


def test_include_exclude_and_nx_gzip(tmp_path):
    dev = make_dev_tree(
        tmp_path / "dev",
        ["dm-0", "dm-1", "mapper/mpatha", "mapper/control", "sda", "crypto/nx-gzip"],
        target="/dev/null",
    )
    resource = ResourceConfig(
        include=("/dev/dm-*", "/dev/mapper/*"),
        exclude=("/dev/mapper/control", "/dev/dm-1"),
        nx_gzip=True,
    )
    found = discover(resource, dev, tmp_path / "sys")
    assert [d.path for d in found] == ["/dev/crypto/nx-gzip", "/dev/dm-0", "/dev/mapper/mpatha"]
    assert [d.id for d in found] == ["crypto.nx-gzip", "dm-0", "mapper.mpatha"]
    assert all(d.kind == "c" and (d.major, d.minor) == (1, 3) for d in found)


def test_nx_gzip_is_skipped_when_absent_and_can_be_excluded(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", ["crypto/nx-gzip"])
    assert discover(ResourceConfig(nx_gzip=True), tmp_path / "empty", tmp_path / "sys") == ()
    excluded = ResourceConfig(nx_gzip=True, exclude=("/dev/crypto/*",))
    assert discover(excluded, dev, tmp_path / "sys") == ()


def test_host_paths_are_reported_when_dev_is_mounted_elsewhere(tmp_path):
    host_dev = make_dev_tree(tmp_path / "host" / "dev", ["dm-3"])
    found = discover(ResourceConfig(include=("/dev/dm-*",)), host_dev, tmp_path / "sys")
    assert [(d.id, d.path) for d in found] == [("dm-3", "/dev/dm-3")]


def _sys_block(root: Path, entries: dict[str, str | None]) -> Path:
    for name, devname in entries.items():
        entry = root / "class" / "block" / name
        entry.mkdir(parents=True)
        if devname is not None:
            (entry / "uevent").write_text(f"MAJOR=8\nMINOR=0\nDEVNAME={devname}\nDEVTYPE=disk\n")
    return root


def test_block_discovery_lists_disks_partitions_and_dm_but_not_ram_or_loop(tmp_path):
    sys_root = _sys_block(
        tmp_path / "sys",
        {
            "sda": "sda",
            "sda1": "sda1",
            "dm-0": "dm-0",
            "nvme0n1": None,
            "loop0": "loop0",
            "ram0": "ram0",
            "zram0": "zram0",
        },
    )
    assert block_candidates(sys_root) == ["/dev/dm-0", "/dev/nvme0n1", "/dev/sda", "/dev/sda1"]
    assert block_candidates(tmp_path / "no-sys") == []


@needs_root
def test_block_discovery_keeps_only_existing_block_nodes_minus_excludes(tmp_path):
    sys_root = _sys_block(
        tmp_path / "sys", {"sda": "sda", "sdb": "sdb", "sdc": "sdc", "sdd": "sdd"}
    )
    dev = tmp_path / "dev"
    dev.mkdir()
    for minor, name in enumerate(["sda", "sdb"]):  # sdc has no node
        os.mknod(dev / name, stat.S_IFBLK | 0o600, os.makedev(8, minor * 16))
    (dev / "sdd").symlink_to("/dev/null")  # a character node where a disk should be
    found = discover(ResourceConfig(exclude=("/dev/sdb",)), dev, sys_root)
    assert [d.path for d in found] == ["/dev/sda"]
