"""Replies encoded by protobuf (upb), and joined per container, are byte for
byte what betterproto's full encoding of the same message gives."""

from powerdev._proto.v1beta1 import (
    AllocateResponse,
    ContainerAllocateResponse,
    Device,
    DeviceSpec,
    ListAndWatchResponse,
    NumaNode,
    TopologyInfo,
)
from powerdev.config import ResourceConfig
from powerdev.devices.inventory import Inventory
from powerdev.devices.model import Device as Node
from powerdev.resources.allocation import Unit
from powerdev.resources.plugin import Plugin
from powerdev.rpc import answers as answers_module
from powerdev.rpc.answers import Answers

NODES = tuple(Node(f"dm-{i}", f"/dev/dm-{i}", "b", 253, i, healthy=i % 4 != 3) for i in range(50))


def full_list(plugin):
    return bytes(
        ListAndWatchResponse(
            devices=[
                Device(
                    id=u.id,
                    health="Healthy" if u.healthy else "Unhealthy",
                    topology=None if u.numa is None else TopologyInfo([NumaNode(u.numa)]),
                )
                for u in plugin.units()
            ]
        )
    )


async def test_list_matches_a_full_encoding_across_changes():
    plugin = Plugin(ResourceConfig(), Inventory(NODES), refresh=None, spec=None)
    answers = Answers(plugin)
    assert await answers.list_and_watch(plugin.inventory.current) == full_list(plugin)
    plugin.inventory.publish((*NODES[10:], Node("sdx", "/dev/sdx", "b", 8, 0)))
    assert await answers.list_and_watch(plugin.inventory.current) == full_list(plugin)
    plugin.inventory.publish(())
    assert await answers.list_and_watch(plugin.inventory.current) == b"" == full_list(plugin)


async def test_a_list_after_one_change_encodes_one_entry(monkeypatch):
    """Entries are kept per unit: the list after one device changed encodes
    that device's entry alone, and is still the full encoding, byte for byte."""
    nodes = [Node(n.id, n.path, "b", 253, n.minor, numa=n.minor % 2) for n in NODES]
    plugin = Plugin(ResourceConfig(), Inventory(nodes), refresh=None, spec=None)
    answers = Answers(plugin)
    encoded = []
    real = answers_module.encode_list
    monkeypatch.setattr(answers_module, "encode_list", lambda u: encoded.append(u) or real(u))
    assert await answers.list_and_watch(plugin.inventory.current) == full_list(plugin)
    assert len(encoded) == len(nodes)
    encoded.clear()
    sick = Node("dm-7", "/dev/dm-7", "b", 253, 7, healthy=False, numa=1)
    plugin.inventory.update({"/dev/dm-7": sick, "/dev/dm-8": None})
    assert await answers.list_and_watch(plugin.inventory.current) == full_list(plugin)
    assert [u for (u,) in encoded] == [Unit("dm-7", False, 1)]


async def test_upper_limit_list():
    plugin = Plugin(ResourceConfig(upper_limit=3), Inventory(NODES), refresh=None, spec=None)
    assert await Answers(plugin).list_and_watch(plugin.inventory.current) == full_list(plugin)


async def test_allocate_matches_a_full_encoding_for_several_containers():
    plugin = Plugin(ResourceConfig(permissions="rwm"), Inventory(NODES), refresh=None, spec=None)
    answers = Answers(plugin)
    grants = plugin.allocate([["dm-0"], ["dm-1"], ["dm-2"]])
    container = ContainerAllocateResponse(
        devices=[
            DeviceSpec(container_path=n.path, host_path=n.path, permissions="rwm")
            for n in sorted(NODES, key=lambda n: n.path)  # the inventory lists by path
            if n.healthy
        ]
    )
    expected = bytes(AllocateResponse(container_responses=[container] * 3))
    assert await answers.allocate(grants) == expected
    decoded = AllocateResponse().parse(await answers.allocate(grants))
    assert len(decoded.container_responses) == 3
    assert decoded.container_responses[2].devices[0].host_path == "/dev/dm-0"


async def test_an_empty_grant_is_one_empty_container():
    plugin = Plugin(ResourceConfig(), Inventory(()), refresh=None, spec=None)
    answers = Answers(plugin)
    assert await answers.allocate(plugin.allocate([[]])) == bytes(
        AllocateResponse(container_responses=[ContainerAllocateResponse()])
    )
