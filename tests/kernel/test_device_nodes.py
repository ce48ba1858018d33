"""Real device nodes made with mknod (root): discovered, advertised, granted."""

import os
import stat

import trio

from powerdev.config import ResourceConfig
from powerdev.resources.matching import discover
from tests.conftest import config_for, daemon_and_kubelet, needs_root

pytestmark = needs_root


def mknod(path, kind: str, major: int, minor: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = (stat.S_IFBLK if kind == "b" else stat.S_IFCHR) | 0o600
    os.mknod(path, mode, os.makedev(major, minor))


def test_block_and_character_nodes_are_told_apart(tmp_path):
    dev = tmp_path / "dev"
    mknod(dev / "sdb", "b", 8, 16)
    mknod(dev / "sdb1", "b", 8, 17)
    mknod(dev / "crypto" / "nx-gzip", "c", 245, 0)
    (dev / "mapper").mkdir()
    (dev / "mapper" / "mpatha").symlink_to("../sdb")
    (dev / "sdfile").write_text("a regular file that a pattern matches")
    resource = ResourceConfig(include=("/dev/sd*", "/dev/mapper/*"), nx_gzip=True)
    found = {d.path: (d.kind, d.major, d.minor) for d in discover(resource, dev, tmp_path)}
    assert found == {
        "/dev/sdb": ("b", 8, 16),
        "/dev/sdb1": ("b", 8, 17),
        "/dev/mapper/mpatha": ("b", 8, 16),
        "/dev/crypto/nx-gzip": ("c", 245, 0),
    }


def test_block_discovery_from_sysfs_with_real_nodes(tmp_path):
    dev, sys_root = tmp_path / "dev", tmp_path / "sys"
    for name, minor in (("sdc", 32), ("sdc1", 33), ("dm-4", 4)):
        entry = sys_root / "class" / "block" / name
        entry.mkdir(parents=True)
        (entry / "uevent").write_text(f"DEVNAME={name}\n")
        mknod(dev / name, "b", 253 if name.startswith("dm") else 8, minor)
    found = discover(ResourceConfig(), dev, sys_root)
    assert [(d.id, d.kind) for d in found] == [("dm-4", "b"), ("sdc", "b"), ("sdc1", "b")]


async def test_the_kubelet_gets_real_nodes_with_host_paths(tmp_path):
    dev = tmp_path / "host" / "dev"
    mknod(dev / "dm-0", "b", 253, 0)
    mknod(dev / "dm-1", "b", 253, 1)
    mknod(dev / "crypto" / "nx-gzip", "c", 245, 0)
    config = config_for('{"include-devices": ["/dev/dm-*"], "nx-gzip": true, "permissions": "r"}')
    with trio.fail_after(10):
        async with daemon_and_kubelet(tmp_path, config, dev_root=dev) as h:
            assert sorted(h.state().devices) == ["crypto.nx-gzip", "dm-0", "dm-1"]
            grant = await h.kubelet.allocate(h.name, ["dm-1"])
            assert [(g.host_path, g.container_path, g.permissions) for g in grant.devices] == [
                ("/dev/crypto/nx-gzip", "/dev/crypto/nx-gzip", "r"),
                ("/dev/dm-0", "/dev/dm-0", "r"),
                ("/dev/dm-1", "/dev/dm-1", "r"),
            ]
