"""The ledger's rulings as plain data: rivals by kind and numbers, disks and
partitions, and waits that only an answer asked after them can end."""

from __future__ import annotations

from powerdev.config import ResourceConfig
from powerdev.devices.model import Device
from powerdev.resources.ownership import Ledger

A = ResourceConfig(name="example.com/a", allocation="each")
B = ResourceConfig(name="example.com/b", socket="b.sock", allocation="each")


def dev(path: str, minor: int, id: str | None = None, **fields: object) -> Device:
    return Device(id or path.removeprefix("/dev/"), path, "b", 8, minor, **fields)


def test_one_device_under_two_names_in_two_resources_goes_to_neither():
    ledger = Ledger()
    node, link = dev("/dev/sdb", 16), dev("/dev/mapper/x", 16)
    ledger.change(A.name, (), [node])
    assert ledger.rule(A, node, listed=False) == node
    ledger.change(B.name, (), [link])
    assert ledger.rule(B, link, listed=False) is None
    assert ledger.rule(A, node, listed=True) == Device("sdb", "/dev/sdb", "b", 8, 16, False)
    ledger.detach(B.name)
    assert ledger.rule(A, node, listed=True) == node
    # a character device with the same numbers is another device
    ledger.change(B.name, (), [Device("c", "/dev/c", "c", 8, 16)])
    assert ledger.rule(A, node, listed=True) == node


def test_a_disk_and_its_partition_in_two_resources_overlap():
    ledger = Ledger()
    disk, part = dev("/dev/sdb", 16, has_partitions=True), dev("/dev/sdb1", 17, whole_disk=(8, 16))
    ledger.change(A.name, (), [disk])
    ledger.change(B.name, (), [part])
    assert ledger.rivals(B.name, part) == ["example.com/a lists its whole disk /dev/sdb"]
    assert ledger.rivals(A.name, disk) == ["example.com/b lists its partition /dev/sdb1"]
    ledger.change(B.name, [part], ())
    assert ledger.rivals(A.name, disk) == []


def test_a_wait_ends_only_on_an_answer_asked_after_it_began():
    ledger = Ledger()
    old, new = dev("/dev/sdb", 16, id="wwn.old"), dev("/dev/sdb", 16, id="wwn.new")
    ledger.change(A.name, (), [old])
    ledger.granted(A.name, "wwn.old", [old])
    ledger.change(A.name, [old], [new])
    assert not ledger.rule(A, new, listed=True).healthy
    ledger.answered({}, asked=0)  # put before the wait began: proves nothing
    assert not ledger.rule(A, new, listed=True).healthy
    ledger.answered({A.name: {"wwn.old"}}, asked=1)  # still held
    assert not ledger.rule(A, new, listed=True).healthy
    ledger.answered({A.name: {"wwn.other"}}, asked=1)
    assert ledger.rule(A, new, listed=True) == new


def test_all_mode_waits_while_any_unit_of_the_old_resource_is_held():
    shared = ResourceConfig(name="example.com/a")
    ledger = Ledger()
    device = dev("/dev/sdb", 16)
    ledger.granted(shared.name, None, [device])
    assert ledger.rule(shared, device, listed=True) == device  # the same holder
    assert not ledger.rule(B, device, listed=False).healthy
    ledger.answered({shared.name: {"share-2"}}, asked=1)
    assert not ledger.rule(B, device, listed=False).healthy
    ledger.answered({}, asked=1)
    assert ledger.rule(B, device, listed=False) == device


def test_a_device_stays_listed_while_any_of_its_names_is():
    ledger = Ledger()
    node, link, other = dev("/dev/sdb", 16), dev("/dev/mapper/x", 16), dev("/dev/by-id/y", 16)
    ledger.change(A.name, (), [node, link, other])
    for gone in (node, other):  # the first name goes first, then another
        ledger.change(A.name, [gone], ())
        ledger.change(B.name, (), [Device("z", "/dev/z", "b", 8, 16)])
        assert ledger.rivals(B.name, link) == ["example.com/a lists it too"]
        ledger.detach(B.name)
    ledger.change(A.name, [link], ())
    ledger.change(B.name, (), [link])
    assert ledger.rivals(B.name, link) == []


def test_a_device_a_claim_holds_waits_under_the_device_plugin_api_until_unprepared():
    """A reload switched "api" from "dra" to "device-plugin": the claim's device
    is Unhealthy there until the claim is unprepared, whatever PodResources says."""
    dra, plugin_api, both = (
        ResourceConfig(name=A.name, allocation="each", api=api)
        for api in ("dra", "device-plugin", "both")
    )
    ledger = Ledger()
    device = dev("/dev/sdb", 16)
    ledger.change(A.name, (), [device])
    ledger.claimed(A.name, "sdb", [device.key])
    assert ledger.rule(dra, device, listed=True) == device  # its own holder
    assert ledger.rule(both, device, listed=True) == device
    assert not ledger.rule(plugin_api, device, listed=True).healthy
    assert not ledger.asks_kubelet()  # nothing for the kubelet's PodResources to say
    ledger.answered({}, asked=1)
    assert not ledger.rule(plugin_api, device, listed=True).healthy
    ledger.unclaimed(A.name, "sdb", [device.key])
    assert ledger.rule(plugin_api, device, listed=True) == device


def test_a_device_a_pod_got_through_allocate_waits_under_dra_until_no_pod_holds_it():
    dra = ResourceConfig(name=A.name, allocation="each", api="dra")
    ledger = Ledger()
    device = dev("/dev/sdb", 16)
    ledger.change(A.name, (), [device])
    ledger.granted(A.name, "sdb", [device])
    assert not ledger.rule(dra, device, listed=True).healthy
    assert ledger.asks_kubelet()
    ledger.answered({A.name: {"sdb"}}, asked=1)
    assert not ledger.rule(dra, device, listed=True).healthy
    ledger.answered({}, asked=1)
    assert ledger.rule(dra, device, listed=True) == device


def test_a_claim_known_late_makes_every_resource_rule_again_its_own_too():
    """At start the checkpoint is read after the trackers first ruled."""
    ledger = Ledger()
    asked: dict[str, set] = {"example.com/a": set(), "example.com/b": set()}
    for name, keys in asked.items():
        ledger.attach(name, keys.update)
    device = dev("/dev/sdb", 16)
    ledger.change(B.name, (), [device])
    ledger.claimed(B.name, "sdb", [device.key])
    assert asked == {"example.com/a": {device.key}, "example.com/b": {device.key}}
