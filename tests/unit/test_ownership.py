"""The ledger as plain data: who lists each device (one resource per device
and per family), who holds it (one holder per family, across names, units,
resources and the two APIs), and holds that only an answer of the kubelet
asked after the grant settled can end. On a mock clock where time matters."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from powerdev.config import ResourceConfig
from powerdev.devices.table import DeviceTable
from powerdev.resources.ownership import DRA, GRANT_SETTLES, Holder, Ledger
from tests.unit.test_inuse import sysfs

A = ResourceConfig(name="example.com/a", allocation="each")
B = ResourceConfig(name="example.com/b", socket="b.sock", allocation="each")
SDB, SDB1, SDB2 = ("b", 8, 16), ("b", 8, 17), ("b", 8, 18)


@pytest.fixture
def clock():
    return trio.testing.MockClock(autojump_threshold=0)


def disks(tmp_path) -> DeviceTable:
    """sdb with two partitions, and sdc, a disk of its own."""
    root = sysfs(
        tmp_path / "sys",
        {
            "sdb": {"dev": "8:16", "parts": {"sdb1": {"dev": "8:17"}, "sdb2": {"dev": "8:18"}}},
            "sdc": {"dev": "8:32"},
        },
    )
    return DeviceTable(tmp_path / "dev", root)


def blocked(ledger: Ledger, key, resource: ResourceConfig, unit: str | None):
    found = ledger.blocking(key, resource, unit)
    return found[1] if found is not None else None


def test_one_device_under_two_names_in_two_resources_goes_to_neither():
    ledger = Ledger()
    key = ("c", 1, 3)
    ledger.add_listing(A.name, key, "/dev/sdb")
    assert ledger.rivals(A.name, key) == []
    ledger.add_listing(B.name, key, "/dev/mapper/x")
    assert ledger.rivals(A.name, key, "/dev/sdb") == [
        "example.com/b lists it too, as /dev/mapper/x"
    ]
    assert ledger.rivals(B.name, key) == ["example.com/a lists it too"]
    ledger.detach(B.name)
    assert ledger.rivals(A.name, key) == []
    ledger.add_listing(B.name, ("b", 1, 3), "/dev/c")  # a block device, same numbers: another
    assert ledger.rivals(A.name, key) == []


def test_a_disk_and_its_partition_in_two_resources_overlap(tmp_path):
    ledger = Ledger(disks(tmp_path))
    ledger.add_listing(A.name, SDB, "/dev/sdb")
    ledger.add_listing(B.name, SDB1, "/dev/sdb1")
    assert ledger.rivals(B.name, SDB1) == ["example.com/a lists its whole disk /dev/sdb"]
    assert ledger.rivals(A.name, SDB) == ["example.com/b lists its partition /dev/sdb1"]
    assert ledger.rivals(B.name, SDB2) == ["example.com/a lists its whole disk /dev/sdb"]
    ledger.drop_listing(B.name, SDB1)
    assert ledger.rivals(A.name, SDB) == []


async def test_a_held_disk_holds_every_partition_new_ones_included_and_not_the_other_way(tmp_path):
    table = disks(tmp_path)
    ledger = Ledger(table)
    ledger.granted(A.name, "disk", [SDB])
    assert blocked(ledger, SDB1, A, "part1") == Holder(A.name, "disk")
    assert blocked(ledger, SDB2, B, "part2") == Holder(A.name, "disk")
    assert blocked(ledger, SDB, A, "disk") is None  # its own holder
    assert blocked(ledger, ("b", 8, 32), A, "sdc") is None  # another disk
    # a partition held: its disk is not free; its sibling is (they share no block)
    other = Ledger(table)
    other.granted(A.name, "part1", [SDB1])
    assert blocked(other, SDB, A, "disk") == Holder(A.name, "part1")
    assert blocked(other, SDB2, A, "part2") is None


async def test_a_hold_ends_only_on_an_answer_asked_after_the_grant_settled(clock):
    ledger = Ledger()
    key = ("b", 8, 16)
    ledger.granted(A.name, "wwn.old", [key])
    assert blocked(ledger, key, A, "wwn.new") == Holder(A.name, "wwn.old")
    ledger.answered({}, trio.current_time())  # the kubelet may not have recorded it yet
    assert blocked(ledger, key, A, "wwn.new") is not None
    await trio.sleep(GRANT_SETTLES * 2)
    ledger.answered({A.name: {"wwn.old": {"default/old"}}}, trio.current_time())  # still held
    assert blocked(ledger, key, A, "wwn.new") is not None
    ledger.answered({A.name: {"wwn.other": {"default/other"}}}, trio.current_time())
    assert blocked(ledger, key, A, "wwn.new") is None


async def test_all_mode_waits_while_any_unit_of_the_old_resource_is_held(clock):
    shared = ResourceConfig(name="example.com/a")
    ledger = Ledger()
    key = ("b", 8, 16)
    ledger.granted(shared.name, None, [key])
    assert blocked(ledger, key, shared, None) is None  # the same holder
    assert blocked(ledger, key, B, "sdb") is not None
    await trio.sleep(GRANT_SETTLES * 2)
    ledger.answered({shared.name: {"share-2": {"default/two"}}}, trio.current_time())
    assert blocked(ledger, key, B, "sdb") is not None
    ledger.answered({}, trio.current_time())
    assert blocked(ledger, key, B, "sdb") is None


async def test_a_device_a_claim_holds_waits_under_the_device_plugin_api_until_unprepared():
    """A reload switched "api" from "dra" to "device-plugin": the claim's device
    is Unhealthy there until the claim is unprepared, whatever PodResources says."""
    dra, plugin_api, both = (
        ResourceConfig(name=A.name, allocation="each", api=api)
        for api in ("dra", "device-plugin", "both")
    )
    ledger = Ledger()
    key = ("b", 8, 16)
    ledger.claimed(A.name, "sdb", [key], "uid-1")
    assert blocked(ledger, key, dra, "sdb") is None  # its own holder
    assert blocked(ledger, key, both, "sdb") is None  # one holder; held_units() splits sides
    assert blocked(ledger, key, plugin_api, "sdb") == Holder(A.name, "sdb", DRA, "uid-1")
    assert ledger.held_units(A.name, DRA) == {"sdb"}
    assert not ledger.asks_kubelet()  # nothing for the kubelet's PodResources to say
    ledger.answered({}, 1e9)
    assert blocked(ledger, key, plugin_api, "sdb") is not None
    # another claim on the same unit is refused at prepare
    assert ledger.blocking(key, dra, "sdb", claim="uid-2") is not None
    assert ledger.blocking(key, dra, "sdb", claim="uid-1") is None
    ledger.unclaimed("uid-1")
    assert blocked(ledger, key, plugin_api, "sdb") is None
    assert ledger.held_units(A.name, DRA) == frozenset()


async def test_a_device_a_pod_got_through_allocate_waits_under_dra_until_no_pod_holds_it(clock):
    dra = ResourceConfig(name=A.name, allocation="each", api="dra")
    ledger = Ledger()
    key = ("b", 8, 16)
    ledger.granted(A.name, "sdb", [key])
    assert blocked(ledger, key, dra, "sdb") is not None
    ledger.why_held(key, key, Holder(A.name, "sdb"))  # what the verdict says registers a wait
    assert ledger.asks_kubelet()
    await trio.sleep(GRANT_SETTLES * 2)
    ledger.answered({A.name: {"sdb": {"default/app"}}}, trio.current_time())
    assert blocked(ledger, key, dra, "sdb") is not None
    ledger.answered({}, trio.current_time())
    assert blocked(ledger, key, dra, "sdb") is None
    assert not ledger.asks_kubelet()


async def test_a_device_that_waits_names_the_pods_the_kubelet_says_hold_its_unit(clock, tmp_path):
    """The ledger keeps which pods hold each device plugin unit, as the
    kubelet last said; what waits for the unit names them, and rules again
    when they change."""
    ledger = Ledger(disks(tmp_path))
    regated: set = set()

    class View:
        resource = B

        def regate(self, keys: set) -> None:
            regated.update(keys)

        def keys_of(self, unit):
            return []

        def sides_changed(self) -> None:
            pass

    ledger.attach(View())
    ledger.granted(A.name, "sdb", [SDB])
    holder = Holder(A.name, "sdb")
    assert ledger.pods_of(holder) == ()  # the kubelet has not said
    kin, found = ledger.blocking(SDB1, B, "sdb1")
    assert "by pod" not in ledger.why_held(SDB1, kin, found)
    await trio.sleep(GRANT_SETTLES * 2)
    regated.clear()
    ledger.answered({A.name: {"sdb": {"team/db-0"}, "sdc": {"team/other"}}}, trio.current_time())
    assert ledger.pods_of(holder) == ("team/db-0",)
    assert SDB1 in regated  # its partition waits for the unit: it rules again, naming the pod
    said = ledger.why_held(SDB1, kin, found)
    assert said.startswith(
        "its whole disk block 8:16 is held as unit sdb of example.com/a (through the device plugin "
        "API) by pod team/db-0, and until the kubelet says no pod holds it"
    ), said
    regated.clear()
    ledger.answered({A.name: {"sdb": {"team/db-0"}}}, trio.current_time())
    assert not regated  # the same pods: nothing to rule on again
    many = {f"team/db-{i}" for i in range(5)}
    ledger.answered({A.name: {"sdb": many}}, trio.current_time())
    assert "by pods team/db-0, team/db-1, team/db-2 and 2 more, and" in ledger.why_held(
        SDB1, kin, found
    )
    ledger.answered({}, trio.current_time())
    assert ledger.blocking(SDB1, B, "sdb1") is None
    assert ledger.pods_of(holder) == ()


async def test_all_mode_a_holder_is_every_pod_that_holds_any_unit(clock):
    shared = ResourceConfig(name="example.com/a")
    ledger = Ledger()
    ledger.granted(shared.name, None, [SDB])
    await trio.sleep(GRANT_SETTLES * 2)
    ledger.answered(
        {shared.name: {"share-1": {"b/p"}, "share-2": {"a/p", "b/p"}}}, trio.current_time()
    )
    assert ledger.pods_of(Holder(shared.name, None)) == ("a/p", "b/p")


async def test_what_pods_held_at_start_counts_as_held_until_the_kubelet_says():
    ledger = Ledger()
    key = ("b", 8, 16)
    ledger.provisional(A.name, "wwn.old", [key])
    assert ledger.asks_kubelet()  # asked at once, and again until it answers
    assert blocked(ledger, key, A, "wwn.new") == Holder(A.name, "wwn.old")
    assert blocked(ledger, key, A, "wwn.old") is None
    ledger.answered({}, 0.0)  # any answer: a provisional hold needs no settling
    assert blocked(ledger, key, A, "wwn.new") is None
    assert not ledger.asks_kubelet()


async def test_a_claim_known_late_makes_every_resource_rule_again_its_own_too():
    """At start the checkpoint is read after the trackers first ruled."""
    ledger = Ledger()
    asked: dict[str, set] = {}

    class View:
        def __init__(self, resource: ResourceConfig) -> None:
            self.resource = resource
            asked[resource.name] = set()

        def regate(self, keys: set) -> None:
            asked[self.resource.name].update(keys)

        def keys_of(self, unit):
            return []

        def sides_changed(self) -> None:
            pass

    for resource in (A, B):
        ledger.attach(View(resource))
    key = ("b", 8, 16)
    ledger.add_listing(B.name, key, "/dev/sdb")
    ledger.settle()
    asked = {k: set() for k in asked}
    ledger.claimed(B.name, "sdb", [key], "uid-1")
    assert asked == {A.name: {key}, B.name: {key}}
