"""Reading the kubelet's PodResources List reply (rpc/podresources.held_in):
a table of replies, encoded as the kubelet encodes them, and what they hold."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError

from powerdev._proto import podresources_pb2 as pb
from powerdev.rpc.podresources import held_in

DEV, GPU = "power-dev-plugin/dev", "example.com/gpu"

# Fields of the kubelet's API that powerdev's .proto leaves out, as the
# kubelet puts them on the wire: ContainerDevices.topology (3, a NUMA node 1),
# ContainerResources.cpu_ids (3, packed: 2 and 5), PodResources has none
# here, so a field number no version uses (9, a varint).
TOPOLOGY = b"\x1a\x04\x0a\x02\x08\x01"
CPU_IDS = b"\x1a\x02\x02\x05"
UNKNOWN = b"\x48\x07"


def reply(pods: list[tuple[str, list[list[tuple[str, list[str]]]]]], extra: bool = False) -> bytes:
    """An encoded ListPodResourcesResponse: pods as (name, containers), each
    container a list of (resource, device IDs); a name is "namespace/name"
    or, in "default", the name alone. With `extra`, every message also
    carries fields the kubelet sends that powerdev does not read."""
    listing = pb.ListPodResourcesResponse()
    for named, containers in pods:
        namespace, _, name = named.rpartition("/")
        pod = listing.pod_resources.add(name=name, namespace=namespace or "default")
        for n, devices in enumerate(containers):
            container = pod.containers.add(name=f"c{n}")
            for resource, ids in devices:
                entry = pb.ContainerDevices(resource_name=resource, device_ids=ids)
                if extra:
                    entry = pb.ContainerDevices.FromString(entry.SerializeToString() + TOPOLOGY)
                container.devices.append(entry)
            if extra:
                container.MergeFromString(CPU_IDS)
        if extra:
            pod.MergeFromString(UNKNOWN)
    return listing.SerializeToString()


CASES = [
    ("no pods", [], {}),
    ("a pod with no containers", [("p", [])], {}),
    ("a container that holds nothing", [("p", [[]])], {}),
    ("one device", [("p", [[(DEV, ["dm-0"])]])], {DEV: {"dm-0": {"default/p"}}}),
    (
        "several pods, containers and resources",
        [
            ("p1", [[(DEV, ["dm-0", "dm-1"])], [(GPU, ["g0"]), (DEV, ["dm-2"])]]),
            ("team/p2", [[], [(DEV, ["dm-1", "dm-3"])]]),
            ("p3", [[(GPU, ["g1"])]]),
        ],
        {
            DEV: {
                "dm-0": {"default/p1"},
                "dm-1": {"default/p1", "team/p2"},
                "dm-2": {"default/p1"},
                "dm-3": {"team/p2"},
            },
            GPU: {"g0": {"default/p1"}, "g1": {"default/p3"}},
        },
    ),
    (
        "two containers of one pod with one device",
        [("p", [[(DEV, ["dm-0"])], [(DEV, ["dm-0"])]])],
        {DEV: {"dm-0": {"default/p"}}},
    ),
    ("a resource with an empty ID list", [("p", [[(DEV, [])]])], {DEV: {}}),
    (
        "two thousand pods",
        [(f"pod{i}", [[(DEV, [f"bench{i}"])]]) for i in range(2000)],
        {DEV: {f"bench{i}": {f"default/pod{i}"} for i in range(2000)}},
    ),
]


@pytest.mark.parametrize(("pods", "held"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.parametrize("extra", [False, True], ids=["plain", "with-fields-not-read"])
def test_a_reply_gives_every_id_each_resource_is_held_by_and_the_pods(pods, held, extra):
    encoded = reply(pods, extra)
    if extra and pods:
        assert encoded.endswith(UNKNOWN)  # the fields powerdev does not read are on the wire
    assert held_in(encoded) == held


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x0a\x05\x0a\x03",  # pod_resources says 5 bytes, 4 follow
        b"\x0a\x04\x0a\x02\xff\xfe",  # a pod's name is not UTF-8
        b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",  # a tag that never ends
    ],
)
def test_a_reply_that_is_not_a_listing_is_a_decode_error(garbage):
    with pytest.raises(DecodeError):
        held_in(garbage)
