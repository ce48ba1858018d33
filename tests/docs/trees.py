"""The made-up hosts the docs' commands run in. Every device node is a link
to a node every Linux machine has (/dev/null 1:3, /dev/zero 1:5, /dev/full
1:7), or, for block devices, made with mknod (root only) at fixed numbers,
so what the commands print is the same on every machine and in every order.
(The tests' own helpers number their nodes from a counter shared by the
process, which would make the samples depend on test order.)"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.docs.markdown import ROOT


def _host(root: Path) -> None:
    """An empty host: /dev, /sys and a mount table with nothing in them."""
    (root / "dev").mkdir(parents=True, exist_ok=True)
    (root / "sys").mkdir(exist_ok=True)
    (root / "mountinfo").touch()


def _links(root: Path, links: dict[str, str]) -> None:
    for name, target in links.items():
        path = root / "dev" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)


def empty(root: Path) -> None:
    _host(root)


def repo(root: Path) -> None:
    """What `kubectl kustomize` reads: a copy, so that its output files land
    in the temp dir."""
    for name in ("deploy", "examples"):
        shutil.copytree(ROOT / name, root / name)


def mapper(root: Path) -> None:
    """Two multipath links, the control node and a stray file."""
    _host(root)
    _links(
        root,
        {"mapper/mpatha": "/dev/null", "mapper/mpathb": "/dev/zero", "mapper/control": "/dev/full"},
    )
    (root / "dev" / "mapper" / "notes.txt").write_text("not a device\n")


def aliases(root: Path) -> None:
    """One device under two names."""
    _host(root)
    _links(
        root,
        {"mapper/mpatha": "/dev/null", "disk/by-id/wwn-0x5000c500a1b2c3d4": "/dev/null"},
    )


def daemonset(root: Path) -> None:
    """The DaemonSet's paths under root, with the mapper devices."""
    mapper(root)
    config = root / "etc" / "power-device-plugin" / "config.json"
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps({"include-devices": ["/dev/dm-*", "/dev/mapper/*"]}))
    (root / "var" / "lib" / "kubelet" / "device-plugins").mkdir(parents=True)


def _block(root: Path, parent: str, name: str, major: int, minor: int, partition: bool) -> None:
    """A block device node, and its sysfs directory as the kernel lays it
    out: partitions inside their disk, /sys/dev/block/M:m and
    /sys/class/block/NAME linking to it."""
    sys = root / "sys"
    directory = sys / "devices" / "virtual" / "block" / parent / name
    directory.mkdir(parents=True)
    classes = sys / "class" / "block"
    classes.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(classes, directory), directory / "subsystem")
    (directory / "dev").write_text(f"{major}:{minor}\n")
    devtype = "partition" if partition else "disk"
    (directory / "uevent").write_text(
        f"MAJOR={major}\nMINOR={minor}\nDEVNAME={name}\nDEVTYPE={devtype}\n"
    )
    for sub in ("holders", "slaves"):
        (directory / sub).mkdir()
    if partition:
        (directory / "partition").write_text(f"{minor % 16}\n")
    numbers = sys / "dev" / "block"
    numbers.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(directory, numbers), numbers / f"{major}:{minor}")
    os.symlink(os.path.relpath(directory, classes), classes / name)
    os.mknod(root / "dev" / name, stat.S_IFBLK | 0o660, os.makedev(major, minor))


def disks(root: Path) -> None:
    """A boot disk sda with /boot on sda2, and a second disk sdb."""
    if os.geteuid() != 0:
        pytest.skip("the disks example needs block device nodes: mknod needs root")
    _host(root)
    _block(root, "", "sda", 8, 0, False)
    _block(root, "sda", "sda1", 8, 1, True)
    _block(root, "sda", "sda2", 8, 2, True)
    _block(root, "", "sdb", 8, 16, False)
    (root / "mountinfo").write_text("29 1 8:2 / /boot rw,relatime shared:2 - xfs /dev/sda2 rw\n")


TREES: dict[str, Callable[[Path], None]] = {
    "empty": empty,
    "repo": repo,
    "mapper": mapper,
    "aliases": aliases,
    "daemonset": daemonset,
    "disks": disks,
}
