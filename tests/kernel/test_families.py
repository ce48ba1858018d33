"""One holder per family, on real loop devices and real uevents (root),
through the kubelet's own device manager: a held whole disk that gains a
partition table keeps its partitions from every other pod until its pod
ends; two loop devices on one backing file are one device.

Loop devices are loop410-loop414 (inside test_host_use_topology's range,
which these tests share, one at a time). Also `powerdev scan` printing each
device's family and verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from powerdev.config import ResourceConfig
from powerdev.devices.inventory import Inventory
from powerdev.resources.ownership import find_overlap
from powerdev.resources.tracker import Tracker
from tests.conftest import needs_root, require_command, require_tool
from tests.kernel.test_host_use_topology import DEV, SYS, loop_devices, run, sparse
from tests.kubelet.conftest import node, write_config

pytestmark = [
    needs_root,
    pytest.mark.skipif(not os.path.exists("/dev/loop-control"), reason="no /dev/loop-control"),
]
FIRST = 410
LIMIT = 60
MiB = 1024 * 1024
GPT = "label: gpt\nsize=8MiB, type=L\ntype=L\n"


@pytest.fixture
def dmharness() -> Path:
    from powerdev.devtools.kit import DMHARNESS

    return require_tool(DMHARNESS)


async def test_a_held_disk_that_gains_a_partition_table_keeps_its_partitions(tmp_path, dmharness):
    """Pod p1 holds a whole disk; the host writes a partition table on it
    (the kernel reads it at once: real uevents). The partitions overlap
    what p1 writes: no other pod gets one until p1 ends."""
    require_command("sfdisk", "fdisk")
    config = write_config(
        tmp_path / "config.json",
        **{"include-devices": [f"/dev/loop{FIRST}*"], "allocation": "each"},
    )
    options = (
        "--sys-root",
        str(SYS),
        "--uevents",
        "kernel",
        "--pod-resources-socket",  # the harness serves the kubelet's PodResources here
        str(tmp_path / "pod-resources" / "kubelet.sock"),
        "--cdi-recheck-interval",
        "0.05",
    )
    with trio.fail_after(LIMIT), loop_devices() as loops:
        disk = f"/dev/{loops.control.add(FIRST)}"  # partition scanning on, no table yet
        run("losetup", "--partscan", disk, str(sparse(tmp_path / "disk.img", 64 * MiB)))
        loops.bound.append(disk)
        async with node(tmp_path, dmharness, config, DEV, *options) as n:
            await n.wait(1, 1)
            first = await n.dm.call("admit", "p1", 1)
            assert first["admitted"]
            assert [d["host"] for d in first["runopts"]["devices"]] == [disk]
            # sfdisk has the kernel read the table again; partx adds what a
            # kernel without a GPT parser did not
            await trio.to_thread.run_sync(lambda: run("sfdisk", "--quiet", disk, input=GPT))
            await trio.to_thread.run_sync(run, "partx", "--update", disk)
            # the disk and its two partitions are listed; none may be granted
            await n.wait(3, 0)
            second = await n.dm.call("admit", "p2", 1)
            assert not second["admitted"], second
            log = await n.wait_for_log(f"{disk}p1 is Unhealthy")
            assert "held as unit" in log and "its whole disk" in log
            await n.dm.call("delpod", "p1")  # p1 ended: the kubelet lists it no more
            await n.wait(3, 2)  # the partitions; the disk stays out (it has partitions now)
            third = await n.dm.call("admit", "p3", 1)
            assert third["admitted"], third
            (granted,) = [d["host"] for d in third["runopts"]["devices"]]
            assert granted in (f"{disk}p1", f"{disk}p2")


async def test_two_loop_devices_on_one_file_are_one_device(tmp_path):
    backing = sparse(tmp_path / "shared.img", 16 * MiB)
    with trio.fail_after(LIMIT), loop_devices() as loops:
        one = loops.attach(FIRST + 1, backing)
        two = loops.attach(FIRST + 2, backing)
        # "each": one unit, with both nodes (the same data under two numbers)
        each = ResourceConfig(include=(one, two), allocation="each")
        tracker = Tracker(each, Inventory(), DEV, SYS)
        await tracker.rescan()
        units = {d.id for d in tracker.inventory.current.devices}
        assert len(units) == 1 and len(tracker.inventory.current.devices) == 2
        # two resources, one each: a config error, as for one device under two names
        a = ResourceConfig(name="example.com/a", include=(one,))
        b = ResourceConfig(name="example.com/b", socket="b.sock", include=(two,))
        clash = find_overlap([a, b], DEV, SYS)
        assert clash is not None and clash[0] == 1
        assert f"example.com/a lists {one}, the same storage" in clash[1]


def test_scan_prints_each_devices_family_and_verdict(tmp_path):
    """`powerdev scan` on real kernel state: a loop disk with a GPT table
    and two partitions, in "each" mode: each partition offered with its
    family (it lies on the disk), the disk left out with its verdict."""
    require_command("sfdisk", "fdisk")
    config = tmp_path / "config.json"
    config.write_text(f'{{"include-devices": ["/dev/loop{FIRST + 3}*"], "allocation": "each"}}')
    with loop_devices() as loops:
        disk = f"/dev/{loops.control.add(FIRST + 3)}"
        image = sparse(tmp_path / "disk.img", 64 * MiB)
        run("losetup", "--partscan", disk, str(image))
        loops.bound.append(disk)
        run("sfdisk", "--quiet", disk, input=GPT)
        run("partx", "--update", disk)
        name = disk.removeprefix("/dev/")
        command = [sys.executable, "-m", "powerdev", "scan", "--config", str(config)]
        command += ["--dev-root", str(DEV), "--sys-root", str(SYS)]
        done = subprocess.run([*command, "--json"], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        (report,) = json.loads(done.stdout)
        family = {d["path"]: d["family"] for d in report["advertised"]}
        assert family == {
            f"{disk}p1": {"below": [name]},
            f"{disk}p2": {"below": [name]},
        }
        (left,) = [x for x in report["left_out"] if x["path"] == disk]
        assert "partitions" in left["reason"]  # "each": a disk with partitions, as its partitions
        text = subprocess.run(command, capture_output=True, text=True, check=False).stdout
        assert f"    family: lies on {name}" in text
