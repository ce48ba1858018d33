"""GetPreferredAllocation and Allocate as the kubelet calls them, over a real
socket, with "allocation": "each": the requests are decoded by upb, the
answers are the bytes betterproto would have sent, and a malformed request
is INVALID_ARGUMENT with a message that says why."""

from __future__ import annotations

import pytest
import trio

from powerdev._proto import v1beta1 as bp
from powerdev.rpc.kubelet_side import PluginCallError
from powerdev.rpc.plugin_service import MAX_PREFERRED_IDS
from tests.conftest import config_for, daemon_and_kubelet, make_dev_tree

LIMIT = 20
NAMES = [f"dm-{i}" for i in range(12)]
EACH = '{"include-devices": ["/dev/dm-*"], "allocation": "each"}'


def preferred_request(*containers: tuple[list[str], list[str], int]) -> bytes:
    """A PreferredAllocationRequest as the kubelet encodes it."""
    return bytes(
        bp.PreferredAllocationRequest(
            container_requests=[
                bp.ContainerPreferredAllocationRequest(
                    available_device_i_ds=available,
                    must_include_device_i_ds=must,
                    allocation_size=size,
                )
                for available, must, size in containers
            ]
        )
    )


def preferred_reply(*chosen: list[str]) -> bytes:
    """The PreferredAllocationResponse betterproto encodes for these choices."""
    return bytes(
        bp.PreferredAllocationResponse(
            container_responses=[
                bp.ContainerPreferredAllocationResponse(device_i_ds=ids) for ids in chosen
            ]
        )
    )


SHUFFLED = [NAMES[i] for i in (7, 3, 11, 0, 5, 9, 1, 10, 2, 8, 4, 6)]
PREFERRED_CASES = [
    ("one container", [(SHUFFLED, [], 3)], [["dm-0", "dm-1", "dm-2"]]),
    ("must-include first", [(SHUFFLED, ["dm-9"], 2)], [["dm-9", "dm-0"]]),
    ("size 0", [(SHUFFLED, [], 0)], [[]]),
    ("nothing available", [([], [], 4)], [[]]),
    ("more than there is", [(["dm-4", "dm-10"], [], 5)], [["dm-4", "dm-10"]]),
    (
        "two containers",
        [(SHUFFLED, ["dm-5"], 2), (["dm-11", "dm-2"], [], 1)],
        [["dm-5", "dm-0"], ["dm-2"]],
    ),
    ("no containers", [], []),
]


async def test_preferred_answers_are_the_bytes_betterproto_sent(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", NAMES)
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config_for(EACH), dev_root=dev) as h:
            assert h.state().options == (False, True)  # the kubelet will ask
            client = h.kubelet.client(h.name)
            for what, containers, chosen in PREFERRED_CASES:
                answer = await client.raw("GetPreferredAllocation", preferred_request(*containers))
                assert answer == preferred_reply(*chosen), what
            # The kubelet's own call: every free ID, one wanted.
            assert await client.preferred(SHUFFLED, [], 1) == ["dm-0"]


@pytest.mark.parametrize(
    ("payload", "said"),
    [
        (b"\x0a\x05\x0a", "the request is not a valid PreferredAllocationRequest message"),
        (b"\x0a\x04\x0a\x02\xff\xfe", "the request is not a valid PreferredAllocationRequest"),
        (
            preferred_request((NAMES, [], -1)),
            f"allocation_size -1 is outside 0..{MAX_PREFERRED_IDS}",
        ),
        (
            preferred_request((NAMES, [], MAX_PREFERRED_IDS + 1)),
            f"allocation_size {MAX_PREFERRED_IDS + 1} is outside 0..{MAX_PREFERRED_IDS}",
        ),
        (
            preferred_request((NAMES, [], 1), (NAMES, [], 2**31 - 1)),
            f"allocation_size {2**31 - 1} is outside",
        ),
    ],
    ids=["truncated", "not-utf-8", "negative-size", "size-over-bound", "second-container"],
)
async def test_a_malformed_preferred_request_is_invalid_argument(tmp_path, payload, said):
    dev = make_dev_tree(tmp_path / "dev", NAMES)
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config_for(EACH), dev_root=dev) as h:
            client = h.kubelet.client(h.name)
            with pytest.raises(PluginCallError) as err:
                await client.raw("GetPreferredAllocation", payload)
            assert err.value.status == "INVALID_ARGUMENT"
            assert said in err.value.message
            assert await client.preferred(NAMES, [], 1) == ["dm-0"]  # still serving
            assert h.state().connected


async def test_a_field_of_the_wrong_wire_type_is_skipped_as_protobuf_does(tmp_path):
    """container_requests sent as a number: protobuf (upb, as Go's) keeps it
    as an unknown field, so the request asks for nothing."""
    dev = make_dev_tree(tmp_path / "dev", NAMES)
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config_for(EACH), dev_root=dev) as h:
            client = h.kubelet.client(h.name)
            assert await client.raw("GetPreferredAllocation", b"\x08\x05") == b""
            assert await client.raw("GetPreferredAllocation", b"\x0a\x02\x08\x01") == (
                preferred_reply([])
            )


# Links to real character devices: each name has its own major:minor, with
# or without root, so each is a unit of its own: "char-MAJOR-MINOR".
LINKED = {"dm-0": "null", "dm-1": "zero", "dm-2": "full", "dm-3": "random"}
UNIT = {"dm-0": "char-1-3", "dm-1": "char-1-5", "dm-2": "char-1-7", "dm-3": "char-1-8"}


async def test_allocate_grants_the_chosen_devices_and_refuses_garbage(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    for name, target in LINKED.items():
        (dev / name).symlink_to(f"/dev/{target}")
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config_for(EACH), dev_root=dev) as h:
            assert sorted(h.state().devices) == sorted(UNIT.values())
            asked = [[UNIT["dm-3"]], [UNIT["dm-2"], UNIT["dm-0"]]]
            grants = await h.kubelet.allocate_containers(h.name, asked)
            assert [[d.host_path for d in g.devices] for g in grants] == [
                ["/dev/dm-3"],
                ["/dev/dm-2", "/dev/dm-0"],
            ]
            client = h.kubelet.client(h.name)
            for payload, said in (
                (b"\x0a\x05\x0a", "the request is not a valid AllocateRequest message"),
                (b"\x0a\x04\x0a\x02\xff\xfe", "the request is not a valid AllocateRequest"),
                (
                    bytes(
                        bp.AllocateRequest(
                            container_requests=[bp.ContainerAllocateRequest(devices_ids=["sdx"])]
                        )
                    ),
                    "unknown device ID 'sdx'",
                ),
            ):
                with pytest.raises(PluginCallError) as err:
                    await client.raw("Allocate", payload)
                assert err.value.status == "INVALID_ARGUMENT"
                assert said in err.value.message
            grant = await h.kubelet.allocate(h.name, [UNIT["dm-1"]])  # still serving
            assert [d.host_path for d in grant.devices] == ["/dev/dm-1"]
