"""Devices of one pool that share blocks, as shared counters (resources/families.py):
for any nesting of disks, partitions, aliases and stacked devices, a set
of devices fits the counters exactly when no two of them overlap; where
counters cannot say it, the devices published do not overlap and every
one left out overlaps one that is published. And the pool: counters in
slices of their own, and an API server that drops them."""

from __future__ import annotations

from itertools import combinations

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from powerdev.config import ResourceConfig
from powerdev.devices.condition import DEGRADED, Condition
from powerdev.devices.inventory import Inventory
from powerdev.devices.model import Device
from powerdev.dra.kubeapi import refuses_none_effect
from powerdev.dra.slices import Pool, TaintEffectRefused, keep_published, uses_counters
from powerdev.resources import families
from powerdev.resources.plugin import Plugin
from tests.conftest import needs_root


class Storage:
    """A made-up host: storage nodes in a forest (a partition on its disk,
    a loop device on a partition), each node reached by one or more device
    numbers (a disk and its alias, two loops on one file); and controllers,
    character devices that are the same storage as each of several nodes
    (an NVMe controller and its namespaces)."""

    def __init__(
        self,
        parents: list[int | None],
        names_per_node: list[int],
        controllers: tuple[frozenset[int], ...] = (),
    ) -> None:
        self.parents = parents
        self.node_of: dict[tuple, int] = {}
        minor = 0
        for node, count in enumerate(names_per_node):
            for _ in range(count):
                self.node_of[("b", 7, minor)] = node
                minor += 1
        self.reaches = {("c", 10, i): nodes for i, nodes in enumerate(controllers)}

    def under(self, node: int) -> set[int]:
        """What the node lies on, all the way down."""
        found = set()
        parent = self.parents[node]
        while parent is not None:
            found.add(parent)
            parent = self.parents[parent]
        return found

    def nodes(self, key: tuple) -> set[int]:
        return set(self.reaches[key]) if key in self.reaches else {self.node_of[key]}

    def overlap(self, a: tuple, b: tuple) -> bool:
        return any(
            x == y or x in self.under(y) or y in self.under(x)
            for x in self.nodes(a)
            for y in self.nodes(b)
        )

    @property
    def keys(self) -> list[tuple]:
        return [*self.node_of, *self.reaches]

    def overlapping(self, key: tuple) -> frozenset:
        return frozenset(k for k in self.keys if k != key and self.overlap(key, k))

    def relation(self, key: tuple, other: tuple) -> str:
        if key in self.reaches or other in self.reaches:
            return "same"  # as the device table says of a controller
        x, y = self.node_of[key], self.node_of[other]
        if x == y:
            return "same"
        return "below" if y in self.under(x) else "above"


@st.composite
def storages(draw):
    count = draw(st.integers(1, 7))
    parents: list[int | None] = [None]
    for node in range(1, count):
        parents.append(draw(st.one_of(st.none(), st.integers(0, node - 1))))
    names = [draw(st.integers(1, 2)) for _ in range(count)]
    controllers = draw(
        st.lists(st.frozensets(st.integers(0, count - 1), min_size=1, max_size=3), max_size=2)
    )
    return Storage(parents, names, tuple(controllers))


def members(storage: Storage) -> dict[str, tuple]:
    return {f"{key[0]}{key[2]}": key for key in storage.keys}


def fits(found: families.Families, chosen: tuple[str, ...]) -> bool:
    """Would the scheduler allocate these devices together, by their counters?"""
    capacity = {
        (s["name"], c): int(v["value"])
        for s in found.counter_sets
        for c, v in s["counters"].items()
    }
    used = dict.fromkeys(capacity, 0)
    for name in chosen:
        for consumption in found.consumes.get(name, ()):
            for counter, amount in consumption["counters"].items():
                used[(consumption["counterSet"], counter)] += int(amount["value"])
    return all(used[k] <= capacity[k] for k in capacity)


@settings(max_examples=400, deadline=None)
@given(storages())
def test_devices_fit_their_counters_together_exactly_when_none_of_them_overlap(storage):
    """Published devices (those not left out) fit the counters together
    exactly when no two overlap; every device left out overlaps one that
    is published; a forest without controllers is never left out."""
    named = members(storage)
    found = families.plan(named, storage.overlapping, storage.relation)
    if not storage.reaches:
        assert not found.left_out  # a forest always nests
    for consumption in found.consumes.values():
        assert len(consumption) == 1 and len(consumption[0]["counters"]) <= 32
    kept = sorted(n for n in named if n not in found.left_out)
    for size in range(2, min(len(kept), 4) + 1):
        for chosen in combinations(kept, size):
            apart = all(not storage.overlap(named[a], named[b]) for a, b in combinations(chosen, 2))
            assert fits(found, chosen) == apart, chosen
    for name in found.left_out:
        assert name not in found.consumes
        assert any(storage.overlap(named[name], named[k]) for k in kept)
    overlapping = {n for n, k in named.items() if storage.overlapping(k)} - set(found.left_out)
    assert set(found.consumes) <= overlapping  # a device that overlaps nothing counts nothing


@settings(max_examples=200, deadline=None)
@given(storages())
def test_without_counters_what_is_published_does_not_overlap_and_all_else_overlaps_it(storage):
    named = members(storage)
    found = families.plan(named, storage.overlapping, storage.relation, counters=False)
    assert not found.counter_sets and not found.consumes
    kept = [n for n in named if n not in found.left_out]
    for a, b in combinations(kept, 2):
        assert not storage.overlap(named[a], named[b])
    for name, why in found.left_out.items():
        assert any(storage.overlap(named[name], named[k]) for k in kept)
        assert why.endswith(families.NO_COUNTERS)


def test_a_disk_and_its_partitions_keep_one_counter_and_apart_the_partitions_stay():
    disk = Storage([None, 0, 0, 0], [1, 1, 1, 1])  # b0 the disk; b1-b3 its partitions
    found = families.plan(members(disk), disk.overlapping, disk.relation)
    (counter_set,) = found.counter_sets
    assert counter_set == {"name": "family-b0", "counters": {"c0": {"value": "3"}}}
    assert found.consumes["b0"][0]["counters"] == {"c0": {"value": "3"}}
    assert found.consumes["b2"][0]["counters"] == {"c0": {"value": "1"}}
    apart = families.plan(members(disk), disk.overlapping, disk.relation, counters=False)
    assert set(apart.left_out) == {"b0"}  # the partitions are the units, as in "each" mode


def test_an_nvme_controller_and_two_namespaces_do_not_nest_and_the_namespaces_stay():
    """The controller is the same storage as each namespace, which do not
    overlap each other: no class holds all three, and the two namespaces,
    apart, are both published."""
    host = Storage([None, None], [1, 1], (frozenset({0, 1}),))
    found = families.plan(members(host), host.overlapping, host.relation)
    assert not found.counter_sets
    assert found.left_out == {"c0": f"it shares blocks with b0, and {families.NOT_NESTED}"}


def test_a_logical_volume_over_two_disks_does_not_nest_and_is_published_apart():
    keys = {"lv": ("b", 253, 0), "sda": ("b", 8, 0), "sdb": ("b", 8, 16)}
    on = {keys["lv"]: {keys["sda"], keys["sdb"]}}

    def overlapping(key):
        if key == keys["lv"]:
            return frozenset(on[key])
        return frozenset({keys["lv"]})

    def relation(key, other):
        return "below" if key == keys["lv"] else "above"

    found = families.plan(keys, overlapping, relation)
    assert not found.counter_sets
    assert found.left_out == {
        "sda": f"it shares blocks with lv, and {families.NOT_NESTED}",
        "sdb": f"it shares blocks with lv, and {families.NOT_NESTED}",
    }


def test_a_family_of_more_than_32_counters_is_published_apart():
    # 34 devices, each on the one before, each with an alias: 34 counters
    chain = Storage([None, *range(33)], [2] * 34)
    found = families.plan(members(chain), chain.overlapping, chain.relation)
    assert not found.counter_sets
    assert all(why.endswith(families.TOO_MANY) for why in found.left_out.values())
    assert len(found.left_out) == 67  # one device of the 68 is published


# --- the pool -------------------------------------------------------------

DRIVER, NODE, RESOURCE = "dra.powerdev.io", "n1", "example.com/disk"


class Table:
    """The device table's family answers for a disk (7:0) and its partition (7:1)."""

    disk, part = ("b", 7, 0), ("b", 7, 1)

    def overlapping(self, key):
        return frozenset({self.part if key == self.disk else self.disk})

    def relation(self, key, other):
        return "partition" if key == self.disk else "disk"


class Tracker:
    """What keep_published asks of a resource's tracker."""

    def __init__(self, resource):
        self.resource = resource
        self.table = Table()
        self.ledger = None

    def condition_of(self, device):
        return Condition()

    def offered_but_for_failure(self, device):
        return False


class Slices:
    """An API server that keeps what it is given, or with `drops` drops the
    counters as one whose DRAPartitionableDevices gate is off."""

    def __init__(self, drops=False):
        self.drops = drops
        self.slices: dict[str, dict] = {}
        self.consuming = 0  # writes of devices that consume counters
        self.applied = trio.Event()

    async def pool_slices(self, driver, node, pool):
        return [s for s in self.slices.values() if s["spec"]["pool"]["name"] == pool]

    async def apply_slice(self, body):
        self.consuming += any("consumesCounters" in d for d in body["spec"].get("devices", ()))
        kept = {**body, "spec": dict(body["spec"])}
        if self.drops:
            kept["spec"].pop("sharedCounters", None)
            kept["spec"]["devices"] = [
                {k: v for k, v in d.items() if k != "consumesCounters"}
                for d in kept["spec"].get("devices", ())
            ]
        self.slices[body["metadata"]["name"]] = kept
        self.applied.set()
        self.applied = trio.Event()
        return uses_counters(kept)

    async def delete_slice(self, name):
        self.slices.pop(name, None)

    def devices(self) -> list[str]:
        return sorted(d["name"] for s in self.slices.values() for d in s["spec"].get("devices", ()))


def disk_plugin(whole_disks: bool = True) -> Plugin:
    resource = ResourceConfig(name=RESOURCE, api="dra", allocation="each", whole_disks=whole_disks)
    inventory = Inventory(
        [
            Device("loop9", "/dev/loop9", "b", 7, 0, has_partitions=True),
            Device("loop9p1", "/dev/loop9p1", "b", 7, 1, whole_disk=(7, 0)),
        ]
    )
    plugin = Plugin(resource, inventory, refresh=None, spec=None)
    plugin.tracker = Tracker(resource)  # type: ignore[assignment]
    return plugin


async def test_a_pool_publishes_its_counters_in_a_slice_of_their_own(autojump_clock):
    api = Slices()
    pool = Pool(api, DRIVER, NODE, RESOURCE)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(keep_published, disk_plugin(), pool)
            devices, counters = sorted(
                api.slices.values(), key=lambda s: "devices" not in s["spec"]
            )
            assert [d["name"] for d in devices["spec"]["devices"]] == ["loop9", "loop9p1"]
            assert all(
                uses_counters({"spec": {"devices": [d]}}) for d in devices["spec"]["devices"]
            )
            assert counters["spec"]["sharedCounters"] == [
                {"name": "family-loop9", "counters": {"c0": {"value": "1"}}}
            ]
            assert "devices" not in counters["spec"]
            assert {s["spec"]["pool"]["resourceSliceCount"] for s in api.slices.values()} == {2}
            assert not pool.counters_dropped
            nursery.cancel_scope.cancel()


async def test_an_api_server_that_drops_counters_gets_the_partitions_alone(autojump_clock, caplog):
    api = Slices(drops=True)
    pool = Pool(api, DRIVER, NODE, RESOURCE)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(keep_published, disk_plugin(), pool)
            while api.devices() != ["loop9p1"]:
                await api.applied.wait()
            assert pool.counters_dropped
            assert not any(uses_counters(s) for s in api.slices.values())
            assert api.consuming == 0  # the counters were tried first: no device went without
            assert len(api.slices) == 1  # the counter slice is gone
            nursery.cancel_scope.cancel()
    assert caplog.text.count("keeps no shared counters") == 1
    assert "loop9 is not published: it shares blocks with loop9p1" in caplog.text


async def test_without_whole_disks_devices_that_share_blocks_are_published_apart(
    autojump_clock, caplog
):
    api = Slices()
    pool = Pool(api, DRIVER, NODE, RESOURCE)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(keep_published, disk_plugin(whole_disks=False), pool)
            assert api.devices() == ["loop9p1"]
            assert len(api.slices) == 1 and not any(uses_counters(s) for s in api.slices.values())
            nursery.cancel_scope.cancel()
    assert f"loop9 is not published: it shares blocks with loop9p1, and {families.APART}" in (
        caplog.text
    )


@needs_root
@pytest.mark.parametrize("whole_disks", [False, True])
def test_scan_says_which_devices_of_a_dra_pool_are_left_out_apart(tmp_path, whole_disks):
    """A partition and its disk's SCSI generic alias in one "dra" resource
    (a sysfs tree): apart, `powerdev scan` says the alias is left out, and
    why; counted, both are advertised."""
    from powerdev.ops import scan
    from tests.conftest import config_for
    from tests.unit.test_family import nodes
    from tests.unit.test_inuse import alias_tree

    sys_root = alias_tree(tmp_path / "sys")
    dev = tmp_path / "dev"
    nodes(dev, {"sdx1": (8, 241)})
    nodes(dev, {"sg0": (21, 0)}, kind="c")
    fields = '"api": "dra", "include-devices": ["/dev/sdx1", "/dev/sg0"]'
    if whole_disks:
        fields += ', "whole-disks": true'
    (report,) = scan.scan(config_for("{" + fields + "}"), dev, sys_root, None, None)
    advertised = [d.path for d in report.advertised]
    if whole_disks:
        assert advertised == ["/dev/sdx1", "/dev/sg0"] and not report.left_out
    else:
        assert advertised == ["/dev/sdx1"]
        assert report.left_out == [
            ("/dev/sg0", f"DRA: it shares blocks with /dev/sdx1, and {families.APART}")
        ]


class Degraded(Tracker):
    """Every device degraded (some of its paths down)."""

    def condition_of(self, device):
        return Condition(DEGRADED, "1 of 2 paths down")


class RefusesNone(Slices):
    """An API server of Kubernetes 1.34 with DRADeviceTaints on: it knows
    no taint effect None and refuses the whole slice."""

    async def apply_slice(self, body):
        for device in body["spec"].get("devices", ()):
            if any(t["effect"] == "None" for t in device.get("taints", ())):
                raise TaintEffectRefused("spec.devices[0].taints[0].effect: ...")
        return await super().apply_slice(body)


async def test_an_api_server_that_refuses_the_effect_none_gets_degraded_devices_untainted(
    autojump_clock, caplog
):
    """A 1.34 API server refuses a slice with a degraded (effect None)
    device in it: the pool is published at once without that taint, never
    left unpublished, and it is said once."""
    plugin = disk_plugin(whole_disks=False)
    plugin.tracker = Degraded(plugin.resource)  # type: ignore[assignment]
    api = RefusesNone()
    pool = Pool(api, DRIVER, NODE, RESOURCE)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(keep_published, plugin, pool)
            assert api.devices() == ["loop9p1"]
            (published,) = api.slices.values()
            assert "taints" not in published["spec"]["devices"][0]
            assert pool.none_refused
            nursery.cancel_scope.cancel()
    assert caplog.text.count("knows no taint effect None") == 1
    assert "cannot publish" not in caplog.text  # no backoff, no retry loop


def test_the_refusal_of_the_effect_none_is_known_by_its_status():
    """The Status a 1.34 API server answers a slice with a None taint with
    (its validation's NotSupported on the taint's effect); another
    refusal is not taken for it."""
    from lightkube.core.exceptions import ApiError

    def refusal(message: str, code: int = 422) -> ApiError:
        status = {"kind": "Status", "status": "Failure", "code": code, "message": message}
        return ApiError(status=status)

    said = (
        'ResourceSlice.resource.k8s.io "n1-example.com-disk-0" is invalid: '
        'spec.devices[3].taints[0].effect: Unsupported value: "None": supported values: '
        '"NoExecute", "NoSchedule"'
    )
    assert refuses_none_effect(refusal(said))
    assert not refuses_none_effect(refusal(said, code=403))
    other = said.replace('"None"', '"Sometimes"')
    assert not refuses_none_effect(refusal(other))


def test_only_the_effect_none_is_dropped_a_failed_device_keeps_its_noschedule():
    from powerdev.dra.slices import without_informational_taints

    degraded = {"name": "a", "taints": [{"key": "k", "value": "degraded", "effect": "None"}]}
    failed = {"name": "b", "taints": [{"key": "k", "value": "failed", "effect": "NoSchedule"}]}
    assert without_informational_taints([degraded, failed, {"name": "c"}]) == [
        {"name": "a"},
        failed,
        {"name": "c"},
    ]
    assert "taints" in degraded  # the built devices are not changed


async def test_a_refused_taint_costs_no_rewrite_of_the_pool():
    """The slice refused for its None taint was not applied: the pool on the
    server is as it was, which is what the change without the taint is, so
    nothing more is written (not a new generation on every slice)."""
    from powerdev.dra.slices import without_informational_taints

    api = RefusesNone()
    pool = Pool(api, DRIVER, NODE, RESOURCE)
    devices = [{"name": f"u{i:03}"} for i in range(300)]
    await pool.publish(devices)
    generation = pool.generation
    degraded = [dict(d) for d in devices]
    degraded[5]["taints"] = [{"key": "k", "value": "degraded", "effect": "None"}]
    with pytest.raises(TaintEffectRefused):
        await pool.publish(degraded)
    assert await pool.publish(without_informational_taints(degraded)) == 0
    assert pool.generation == generation
