"""What a device says of its own health (devices/condition.py), read from
--sys-root trees laid out as the kernel lays out sysfs: multipath maps and
their SCSI paths, SCSI disks and their sg nodes, NVMe controllers and
namespaces (native multipath too), LVM on a disk, NX-GZIP's credits. And
the table and the verdict that follow it: a failed device is Unhealthy,
listed or not; a degraded one is still offered; a change is logged once."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import trio

from powerdev.devices.condition import DEGRADED, FAILED, FINE, VAS_GZIP, condition
from powerdev.devices.inuse import BlockTopology
from powerdev.devices.table import DeviceTable
from powerdev.resources.verdict import UNHEALTHY, Case, judge
from tests.conftest import needs_root
from tests.unit.test_family import nodes
from tests.unit.test_inuse import add_device

HOST = "pci0000:00/0000:00:01.0/host1"


def scsi(root: Path, name: str, dev: str, lun: int, state: str = "running", **spec) -> Path:
    """A SCSI disk: its SCSI device (with `state`) and the disk in it."""
    device = f"{HOST}/target1:0:{lun}/1:0:{lun}:0"
    (root / "devices" / device).mkdir(parents=True, exist_ok=True)
    (root / "devices" / device / "state").write_text(state + "\n")
    add_device(root, f"{device}/block", name, dev, device=device, **spec)
    return root / "devices" / device / "state"


def san(root: Path, kpartx: bool = True) -> dict[str, Path]:
    """A multipath LUN over two SCSI paths (sdd, sde) with a kpartx
    partition map (dm-4), a plain SCSI disk with a partition and an sg
    node (sdx), and an LVM volume on that partition (dm-9)."""
    states = {
        "sdd": scsi(root, "sdd", "8:48", 0, holders=["dm-3"]),
        "sde": scsi(root, "sde", "8:64", 1, holders=["dm-3"]),
        "sdx": scsi(root, "sdx", "8:240", 2),
    }
    add_device(
        root, "virtual/block", "dm-3", "253:3", slaves=["sdd", "sde"], uuid="mpath-3600a",
        holders=["dm-4"] if kpartx else [],
    )  # fmt: skip
    if kpartx:
        add_device(
            root, "virtual/block", "dm-4", "253:4", slaves=["dm-3"], uuid="part1-mpath-3600a"
        )
    (root / "devices/virtual/block/dm-3/dm/suspended").write_text("0\n")
    sdx = f"{HOST}/target1:0:2/1:0:2:0"
    add_device(root, f"{sdx}/block/sdx", "sdx1", "8:241", partition=True, holders=["dm-9"])
    add_device(root, "virtual/block", "dm-9", "253:9", slaves=["sdx1"], uuid="LVM-pods")
    add_device(root, f"{sdx}/scsi_generic", "sg2", "21:2", "char", subsystem="scsi_generic",
               device=sdx)  # fmt: skip
    for disk in (root / "class" / "block").iterdir():  # the kernel's name, as uevent says
        major, minor = (disk / "dev").read_text().split(":")
        (disk / "uevent").write_text(f"MAJOR={major}\nMINOR={minor.strip()}\nDEVNAME={disk.name}\n")
    return states


def look(root: Path, kind: str, major: int, minor: int, kernel: str | None = None):
    return condition(BlockTopology(root), (kind, major, minor), kernel)


def test_a_multipath_map_counts_its_paths(tmp_path):
    root = tmp_path / "sys"
    states = san(root)
    fine = look(root, "b", 253, 3)
    assert (fine.level, fine.path_counts(), fine.watched) == (FINE, {"running": 2}, True)

    states["sde"].write_text("transport-offline\n")
    one = look(root, "b", 253, 3)
    assert one.level == DEGRADED
    assert one.why == "1 of 2 paths working (sde transport-offline)"
    assert one.path_counts() == {"running": 1, "transport-offline": 1}
    partition = look(root, "b", 253, 4)  # its kpartx partition is as its disk is
    assert (partition.level, partition.why) == (DEGRADED, f"its disk dm-3: {one.why}")

    states["sdd"].write_text("blocked\n")  # recovering: carries no I/O now
    none = look(root, "b", 253, 3)
    assert none.level == FAILED
    assert none.why == "no working path (sdd blocked, sde transport-offline)"

    for state in states.values():
        state.write_text("running\n")
    (root / "devices/virtual/block/dm-3/dm/suspended").write_text("1\n")
    suspended = look(root, "b", 253, 3)
    assert (suspended.level, suspended.why) == (
        FAILED,
        "its device-mapper map is suspended: I/O to it waits",
    )


def test_a_scsi_disk_its_partition_its_sg_node_and_what_lies_on_it(tmp_path):
    root = tmp_path / "sys"
    states = san(root)
    assert look(root, "b", 8, 240).level == FINE
    states["sdx"].write_text("offline\n")
    assert look(root, "b", 8, 240).why == "state offline"
    assert look(root, "b", 8, 241).why == "its disk sdx: state offline"
    sg = look(root, "c", 21, 2)
    assert (sg.level, sg.why) == (FAILED, "state offline")
    lvm = look(root, "b", 253, 9)  # not multipath: as bad as what it lies on
    assert (lvm.level, lvm.why) == (FAILED, "it lies on sdx1: its disk sdx: state offline")
    states["sdx"].write_text("quiesce\n")
    assert look(root, "b", 253, 9).level == DEGRADED
    states["sdx"].write_text("something-new\n")
    odd = look(root, "b", 8, 240)
    assert (odd.level, odd.why) == (DEGRADED, "state something-new (not a state powerdev knows)")


def nvme(root: Path) -> dict[str, Path]:
    """Controller nvme0 with namespace nvme0n1 and its generic node ng0n1; a
    native multipath namespace nvme1n1 over controllers nvme2 and nvme3."""
    states = {}
    for ctrl, dev in (("nvme0", "240:0"), ("nvme2", "240:2"), ("nvme3", "240:3")):
        parent = f"pci0000:00/0000:00:0{ctrl[-1]}.0/nvme"
        add_device(root, parent, ctrl, dev, "char", subsystem="nvme")
        states[ctrl] = root / "devices" / parent / ctrl / "state"
        states[ctrl].write_text("live\n")
    ctrl0 = "pci0000:00/0000:00:00.0/nvme/nvme0"
    add_device(root, ctrl0, "nvme0n1", "259:0", device=ctrl0)
    add_device(root, ctrl0, "ng0n1", "238:0", "char", subsystem="nvme-generic", device=ctrl0)
    head = "virtual/nvme-subsystem/nvme-subsys1"
    add_device(root, head, "nvme1n1", "259:3")
    multipath = root / "devices" / head / "nvme1n1" / "multipath"
    multipath.mkdir()
    for ctrl in ("nvme2", "nvme3"):
        where = f"pci0000:00/0000:00:0{ctrl[-1]}.0/nvme/{ctrl}"
        path = add_device(root, where, f"nvme1c{ctrl[-1]}n1", None, device=where)
        (multipath / path.name).symlink_to(path)
    return states


def test_nvme_controllers_namespaces_and_native_multipath(tmp_path):
    root = tmp_path / "sys"
    states = nvme(root)
    assert look(root, "b", 259, 0).level == FINE
    assert look(root, "b", 259, 3).path_counts() == {"live": 2}
    states["nvme0"].write_text("dead\n")
    for key in (("b", 259, 0), ("c", 238, 0), ("c", 240, 0)):  # namespace, ng node, controller
        found = look(root, *key)
        assert (found.level, found.why) == (FAILED, "state dead"), key
    states["nvme3"].write_text("resetting\n")
    head = look(root, "b", 259, 3)
    assert (head.level, head.why) == (DEGRADED, "1 of 2 paths working (nvme1c3n1 resetting)")
    states["nvme2"].write_text("deleting (no IO)\n")
    assert look(root, "b", 259, 3).level == FAILED


def credits(root: Path, pools: dict[str, tuple[int, int]]) -> None:
    for pool, (total, used) in pools.items():
        where = root / VAS_GZIP / f"{pool}_capabilities"
        where.mkdir(parents=True, exist_ok=True)
        (where / "nr_total_credits").write_text(f"{total}\n")
        (where / "nr_used_credits").write_text(f"{used}\n")


def test_nx_gzip_is_as_good_as_its_credits(tmp_path):
    root = tmp_path / "sys"
    root.mkdir()
    gzip = ("c", 10, 123)
    nothing = condition(BlockTopology(root), gzip, "crypto/nx-gzip")
    assert (nothing.level, nothing.watched) == (FINE, False)  # PowerNV: no pools to read
    credits(root, {"default": (20, 3), "qos": (0, 0)})
    assert condition(BlockTopology(root), gzip, "crypto/nx-gzip").level == FINE
    credits(root, {"default": (20, 20), "qos": (4, 1)})
    some = condition(BlockTopology(root), gzip, "crypto/nx-gzip")
    assert (some.level, some.why) == (
        DEGRADED,
        "no free credit in the default pool (default 0 of 20 free, qos 3 of 4 free)",
    )
    credits(root, {"default": (20, 21), "qos": (4, 4)})
    none = condition(BlockTopology(root), gzip, "crypto/nx-gzip")
    assert (none.level, none.why) == (
        FAILED,
        "no free credit: a window open fails (default 0 of 20 free, qos 0 of 4 free)",
    )


def test_a_device_with_nothing_to_say_is_fine_and_not_watched(tmp_path):
    root = tmp_path / "sys"
    add_device(root, "virtual/block", "loop0", "7:0")
    add_device(root, "virtual/mem", "null", "1:3", "char", subsystem="mem")
    for key in (("b", 7, 0), ("c", 1, 3), ("c", 99, 99)):
        found = look(root, *key)
        assert (found.level, found.watched) == (FINE, False), key


def test_the_verdict_on_a_failed_device():
    failed = Case(failed="no working path (sdd offline, sde offline)")
    for listed in (True, False):  # counted in capacity, granted to nobody
        verdict = judge(failed, listed=listed)
        assert verdict.state == UNHEALTHY
        assert verdict.reason == "it has failed: no working path (sdd offline, sde offline)"
    assert judge(Case(failed="x", has_partitions=True, each=True), listed=False).state == "LeftOut"


@needs_root
async def test_the_table_rechecks_what_changes_without_an_event_and_says_it_once(tmp_path, caplog):
    root = tmp_path / "sys"
    states = san(root)
    dev = tmp_path / "dev"
    nodes(dev, {"dm-3": (253, 3), "mapper/mpatha": (253, 3), "sdx": (8, 240)})
    table = DeviceTable(dev, root)
    table.look(["/dev/dm-3", "/dev/mapper/mpatha", "/dev/sdx"])
    mpatha = ("b", 253, 3)
    assert {key for key, _, _ in table.watched()} == {mpatha, ("b", 8, 240)}
    assert not await table.recheck()  # nothing changed

    caplog.set_level(logging.INFO, logger="powerdev.devices.table")
    states["sdd"].write_text("offline\n")
    changes = await table.recheck()
    assert changes.keys == {mpatha}
    assert table.facts(mpatha).condition.level == DEGRADED
    assert not await table.recheck()  # said once
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "dm-3 (/dev/dm-3, /dev/mapper/mpatha) is degraded: 1 of 2 paths working "
        "(sdd offline) (it was fine)"
    ]
    states["sdd"].write_text("running\n")
    assert (await table.recheck()).keys == {mpatha}
    assert caplog.records[-1].getMessage() == (
        "dm-3 (/dev/dm-3, /dev/mapper/mpatha) is fine again "
        "(it was degraded: 1 of 2 paths working (sdd offline))"
    )


@needs_root
async def test_an_event_during_a_recheck_is_not_undone_by_it(tmp_path, monkeypatch):
    root = tmp_path / "sys"
    states = san(root)
    dev = tmp_path / "dev"
    nodes(dev, {"sdx": (8, 240)})
    table = DeviceTable(dev, root)
    table.look(["/dev/sdx"])
    sdx = ("b", 8, 240)
    from powerdev.devices import table as table_module

    real = table_module.read_again
    reading, go_on = trio.Event(), trio.Event()

    def slow(*args):
        found = real(*args)
        trio.from_thread.run_sync(reading.set)
        trio.from_thread.run(go_on.wait)
        return found

    monkeypatch.setattr(table_module, "read_again", slow)
    states["sdx"].write_text("offline\n")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(table.recheck)
        await reading.wait()  # it read "offline"
        states["sdx"].write_text("running\n")
        table.device_changed("b", [(8, 240)])  # an event, read while the recheck waits
        assert table.facts(sdx).condition.fine
        go_on.set()
    assert table.facts(sdx).condition.fine  # the later look stands


@pytest.mark.parametrize("state", ["offline", "transport-offline", "deleted", "cancel"])
def test_every_state_of_a_gone_scsi_device_is_failed(tmp_path, state):
    root = tmp_path / "sys"
    scsi(root, "sdq", "65:0", 7, state)
    assert look(root, "b", 65, 0).level == FAILED


@needs_root
def test_scan_shows_what_each_device_says_of_itself(tmp_path):
    from powerdev.ops.scan import as_json, as_text, scan
    from tests.conftest import config_for

    root = tmp_path / "sys"
    states = san(root, kpartx=False)
    nodes(tmp_path / "dev", {"mapper/mpatha": (253, 3), "sdx": (8, 240)})
    states["sde"].write_text("offline\n")
    states["sdx"].write_text("offline\n")
    config = config_for('{"include-devices": ["/dev/mapper/*", "/dev/sdx"]}')
    reports = scan(config, tmp_path / "dev", root, None, None)
    text = as_text(reports)
    assert "degraded: 1 of 2 paths working (sde offline)" in text, text
    assert "paths: 1 offline, 1 running" in text or "paths: 1 running, 1 offline" in text, text
    assert "failed: state offline" in text, text
    listed = {d["path"]: d for r in json.loads(as_json(reports)) for d in r["advertised"]}
    assert listed["/dev/sdx"]["healthy"] is False  # listed, and granted to nobody
    assert listed["/dev/sdx"]["condition"] == {"level": "failed", "why": "state offline"}
    assert listed["/dev/mapper/mpatha"]["condition"]["paths"] == {"offline": 1, "running": 1}
