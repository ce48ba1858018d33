"""One device, one truth, case by case: a disk's character alias is the
disk to ownership; every name of one device is one unit in "all" mode too;
a resource a reload removed while its rescan ran leaves nothing behind; the
answer made ahead at registration grants nothing; DRA never prepares a
partition of a prepared disk, nor the disk of a prepared partition."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest
import trio

from powerdev.config import ResourceConfig
from powerdev.devices.inventory import Inventory
from powerdev.devices.model import Device
from powerdev.devices.table import DeviceTable
from powerdev.dra.claims import ClaimRef, Claims, PrepareError
from powerdev.dra.names import pool_name
from powerdev.resources.ownership import Ledger, find_overlap
from powerdev.resources.plugin import Plugin
from powerdev.resources.tracker import Tracker
from tests.conftest import make_dev_tree, needs_root
from tests.unit.test_both import Api
from tests.unit.test_inuse import alias_tree, sysfs


def listed(tracker: Tracker) -> dict[str, bool]:
    return {d.path: d.healthy for d in tracker.inventory.current.devices}


def alias_nodes(dev: Path) -> None:
    """sdx1 (a partition of sdx) and sg0, sdx's SCSI generic node."""
    dev.mkdir(parents=True)
    os.mknod(dev / "sdx1", stat.S_IFBLK | 0o600, os.makedev(8, 241))
    os.mknod(dev / "sg0", stat.S_IFCHR | 0o600, os.makedev(21, 0))


@needs_root
async def test_a_disks_alias_is_the_disk_to_ownership(tmp_path):
    sys_root = alias_tree(tmp_path / "sys")
    dev = tmp_path / "dev"
    alias_nodes(dev)
    table = DeviceTable(dev, sys_root)
    ledger = Ledger(table)
    each = ResourceConfig(include=("/dev/sdx1", "/dev/sg0"), allocation="each")
    tracker = Tracker(each, Inventory(), dev, sys_root, table=table, ledger=ledger)
    plugin = Plugin(each, tracker.inventory, tracker, refresh=None, spec=None)
    await tracker.rescan()
    assert listed(tracker) == {"/dev/sdx1": True, "/dev/sg0": True}
    units = {d.path: d.id for d in plugin.inventory.current.devices}
    plugin.allocate([[units["/dev/sdx1"]]])  # a pod holds the partition ...
    # ... and raw SCSI commands through sg0 reach its blocks: not granted
    assert listed(tracker) == {"/dev/sdx1": True, "/dev/sg0": False}
    # two resources, one each: a config error at start ...
    a = ResourceConfig(name="example.com/a", include=("/dev/sg0",))
    b = ResourceConfig(name="example.com/b", socket="b.sock", include=("/dev/sdx1",))
    assert find_overlap([a, b], dev, sys_root) == (
        1,
        "example.com/b matches /dev/sdx1 (block 8:241) and example.com/a lists /dev/sg0, "
        "which it lies on",
    )


@needs_root
async def test_two_resources_that_come_to_reach_one_family_at_run_time_get_neither(tmp_path):
    sys_root = alias_tree(tmp_path / "sys")
    dev = tmp_path / "dev"
    alias_nodes(dev)
    table = DeviceTable(dev, sys_root)
    ledger = Ledger(table)
    a = ResourceConfig(name="example.com/a", include=("/dev/sg0",))
    b = ResourceConfig(name="example.com/b", socket="b.sock", include=("/dev/sdx1",))
    ta = Tracker(a, Inventory(), dev, sys_root, table=table, ledger=ledger)
    tb = Tracker(b, Inventory(), dev, sys_root, table=table, ledger=ledger)
    await ta.rescan()
    assert listed(ta) == {"/dev/sg0": True}
    await tb.rescan()
    ta.follow(table.device_changed("c", [(21, 0)]))  # nothing changed but b's listing
    ledger.settle()
    assert listed(ta) == {"/dev/sg0": False}  # listed before: Unhealthy
    assert listed(tb) == {}  # never offered


async def test_every_name_of_one_device_is_one_unit_in_all_mode(tmp_path):
    """The shipped config: /dev/dm-* and /dev/mapper/*, where each LUN has
    both names. Capacity counts LUNs, not names."""
    dev = make_dev_tree(tmp_path / "dev", ["dm-0", "mapper/mpatha"], target="/dev/null")
    (dev / "dm-1").symlink_to("/dev/zero")
    (dev / "mapper" / "mpathb").symlink_to("../dm-1")
    resource = ResourceConfig(include=("/dev/dm-*", "/dev/mapper/*"))
    plugin = Plugin(
        resource,
        (inventory := Inventory()),
        Tracker(resource, inventory, dev, tmp_path / "sys"),
        refresh=None,
        spec=None,
    )
    assert plugin.tracker is not None
    await plugin.tracker.rescan()
    assert [u.id for u in plugin.units()] == ["dm-0", "dm-1"]
    (grant,) = plugin.allocate([["dm-1"]])
    assert sorted(g.host_path for g in grant) == [
        "/dev/dm-0",
        "/dev/dm-1",
        "/dev/mapper/mpatha",
        "/dev/mapper/mpathb",
    ]


async def test_a_resource_removed_while_its_rescan_runs_leaves_no_listing(tmp_path):
    """A reload that re-creates a resource (a new socket): the old tracker's
    rescan, still in its thread, must not list its devices in the ledger
    once the old resource is gone, or the device goes to neither."""
    dev = make_dev_tree(tmp_path / "dev", ["dm-0"])
    table = DeviceTable(dev, tmp_path / "sys")
    ledger = Ledger(table)
    resource = ResourceConfig(include=("/dev/dm-*",))
    old = Tracker(resource, Inventory(), dev, tmp_path / "sys", table=table, ledger=ledger)
    release, entered = threading.Event(), threading.Event()
    real = old._glob

    def held(config):
        entered.set()
        release.wait(10)
        return real(config)

    old._glob = held  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(old.rescan)
        await trio.to_thread.run_sync(entered.wait, 10)
        old.detach()
        new = Tracker(resource, Inventory(), dev, tmp_path / "sys", table=table, ledger=ledger)
        await new.rescan()
        release.set()
    assert listed(new) == {"/dev/dm-0": True}
    assert listed(old) == {}
    key = table.key_of("/dev/dm-0")
    assert key is not None and ledger.rivals("another", key) == [f"{resource.name} lists it too"]


async def test_the_answer_made_ahead_at_registration_grants_nothing(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", ["dm-0"])
    table = DeviceTable(dev, tmp_path / "sys")
    ledger = Ledger(table)
    resource = ResourceConfig(include=("/dev/dm-*",))
    tracker = Tracker(resource, Inventory(), dev, tmp_path / "sys", table=table, ledger=ledger)
    plugin = Plugin(resource, tracker.inventory, tracker, refresh=None, spec=None)
    await tracker.rescan()
    plugin.allocate([[]], refresh=False)  # the warm-up: no container, no ID
    key = table.key_of("/dev/dm-0")
    assert ledger.holder_of(key) is None
    plugin.allocate([["dm-0"]], refresh=False)
    assert ledger.holder_of(key) is not None


DRIVER, NODE, RESOURCE = "dra.powerdev.io", "n1", "example.com/lun"


@pytest.mark.parametrize(("first", "second"), [("disk", "part2"), ("part1", "disk")])
async def test_dra_never_prepares_what_overlaps_a_prepared_device(tmp_path, first, second):
    root = sysfs(
        tmp_path / "sys",
        {"sdb": {"dev": "8:16", "parts": {"sdb1": {"dev": "8:17"}, "sdb2": {"dev": "8:18"}}}},
    )
    ledger = Ledger(DeviceTable(tmp_path / "dev", root))
    devices = [
        Device("disk", "/dev/sdb", "b", 8, 16),
        Device("part1", "/dev/sdb1", "b", 8, 17),
        Device("part2", "/dev/sdb2", "b", 8, 18),
    ]
    resource = ResourceConfig(name=RESOURCE, api="dra", allocation="each")
    plugin = Plugin(resource, Inventory(devices), refresh=None, spec=None, ledger=ledger)
    api = Api()
    api.claims = {}
    pool = pool_name(NODE, RESOURCE)
    claims = Claims(
        DRIVER, NODE, api, lambda: [plugin], tmp_path / "cdi", tmp_path / "state", ledger
    )

    def claim(name: str, uid: str, unit: str) -> ClaimRef:
        result = {"request": "r", "driver": DRIVER, "pool": pool, "device": unit}
        api.claims[("ns", name)] = {
            "metadata": {"uid": uid},
            "status": {"allocation": {"devices": {"results": [result]}}},
        }
        return ClaimRef("ns", name, uid)

    held = claim("c1", "uid-1", first)
    await claims.prepare(held)
    with pytest.raises(PrepareError, match="still prepared for ResourceClaim ns/c1"):
        await claims.prepare(claim("c2", "uid-2", second))
    if first == "part1":  # a sibling partition shares no block: prepared
        sibling = claim("c3", "uid-3", "part2")
        await claims.prepare(sibling)
        await claims.unprepare(sibling)
    await claims.unprepare(held)
    await claims.prepare(claim("c2", "uid-2", second))


async def test_a_device_a_claim_held_is_offered_again_once_the_claim_is_unprepared(tmp_path):
    """A reload (or a restart) put a claim's resource on the device plugin API:
    Unhealthy while the claim holds it, Healthy again at its unprepare."""
    dev = make_dev_tree(tmp_path / "dev", ["dm-0"])
    table = DeviceTable(dev, tmp_path / "sys")
    ledger = Ledger(table)
    resource = ResourceConfig(include=("/dev/dm-*",), allocation="each")
    tracker = Tracker(resource, Inventory(), dev, tmp_path / "sys", table=table, ledger=ledger)
    Plugin(resource, tracker.inventory, tracker, refresh=None, spec=None)
    await tracker.rescan()
    (device,) = tracker.inventory.current.devices
    ledger.claimed(resource.name, device.id, [device.key], "uid-1")
    assert listed(tracker) == {"/dev/dm-0": False}
    ledger.unclaimed("uid-1")
    assert listed(tracker) == {"/dev/dm-0": True}
