"""rpc/podresources.held_ids over a real unix socket: the fake kubelet's
PodResources, a server that answers given bytes, one that refuses, and none."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpclib.const
import pytest
import trio
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from powerdev.devtools.fake_kubelet import FakeKubelet
from powerdev.rpc import asyncio_door
from powerdev.rpc.door import serve
from powerdev.rpc.podresources import LIST, PodResourcesUnavailable, held_ids
from tests.unit.test_rpc_podresources import DEV, GPU, reply

LIMIT = 10


class _Bytes:
    @staticmethod
    def FromString(data: bytes) -> bytes:  # the name grpclib calls
        return data


class _Lister:
    """PodResources List, answered by `answer(stream)`; the door's codec sends
    bytes as they are."""

    def __init__(
        self,
        answer: Callable[[Stream], Awaitable[None]],
        cardinality: Cardinality = Cardinality.UNARY_UNARY,
    ) -> None:
        self._answer = answer
        self._cardinality = cardinality
        self.asked = 0

    async def _list(self, stream: Stream) -> None:
        assert await stream.recv_message() == b""  # ListPodResourcesRequest: no fields
        self.asked += 1
        await self._answer(stream)

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        return {LIST: grpclib.const.Handler(self._list, self._cardinality, _Bytes, _Bytes)}


def answering(payload: bytes) -> _Lister:
    async def answer(stream: Stream) -> None:
        await stream.send_message(payload)

    return _Lister(answer)


async def test_the_fake_kubelets_pods_are_read_resource_by_resource(tmp_path):
    with trio.fail_after(LIMIT):
        async with asyncio_door(), trio.open_nursery() as nursery:
            kubelet = FakeKubelet(tmp_path / "device-plugins")
            await nursery.start(kubelet.run)
            assert await held_ids(kubelet.pod_resources_socket) == {}
            kubelet.pods = {
                "p1": {DEV: ["dm-0", "dm-1"], GPU: ["g0"]},
                "p2": {DEV: ["dm-1", "dm-2"]},
                "p3": {},
            }
            assert await held_ids(kubelet.pod_resources_socket) == {
                DEV: {
                    "dm-0": {"default/p1"},
                    "dm-1": {"default/p1", "default/p2"},
                    "dm-2": {"default/p2"},
                },
                GPU: {"g0": {"default/p1"}},
            }
            assert kubelet.pod_resources_asked == 2
            nursery.cancel_scope.cancel()


async def test_many_pods_with_several_containers_each(tmp_path):
    pods = [
        (f"pod{i}", [[(DEV, [f"dm-{i}"])], [], [(GPU, [f"g{i}", f"g{i + 1}"]), (DEV, ["dm-x"])]])
        for i in range(2000)
    ]
    lister = answering(reply(pods, extra=True))
    socket = tmp_path / "kubelet.sock"
    with trio.fail_after(LIMIT):
        async with asyncio_door(), trio.open_nursery() as nursery:
            await nursery.start(serve, socket, [lister])
            held = await held_ids(socket)
            everyone = {f"default/pod{i}" for i in range(2000)}
            assert held == {
                DEV: {f"dm-{i}": {f"default/pod{i}"} for i in range(2000)} | {"dm-x": everyone},
                GPU: {
                    f"g{i}": {f"default/pod{j}" for j in (i - 1, i) if 0 <= j < 2000}
                    for i in range(2001)
                },
            }
            assert lister.asked == 1
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("payload", "said"),
    [
        (b"\x0a\x05\x0a\x03", "not a valid ListPodResourcesResponse"),
        (b"\x0a\x04\x0a\x02\xff\xfe", "not a valid ListPodResourcesResponse"),
    ],
)
async def test_a_reply_that_is_not_a_listing_is_unavailable(tmp_path, payload, said):
    socket = tmp_path / "kubelet.sock"
    with trio.fail_after(LIMIT):
        async with asyncio_door(), trio.open_nursery() as nursery:
            await nursery.start(serve, socket, [answering(payload)])
            with pytest.raises(PodResourcesUnavailable) as err:
                await held_ids(socket)
            assert str(err.value).startswith(f"{socket}: ") and said in str(err.value)
            assert "\n" not in str(err.value)
            nursery.cancel_scope.cancel()


async def test_a_refusal_names_the_status_and_the_kubelets_message(tmp_path):
    async def refuse(stream: Stream) -> None:
        raise GRPCError(Status.RESOURCE_EXHAUSTED, "rejected by rate limit")

    socket = tmp_path / "kubelet.sock"
    with trio.fail_after(LIMIT):
        async with asyncio_door(), trio.open_nursery() as nursery:
            await nursery.start(serve, socket, [_Lister(refuse)])
            with pytest.raises(PodResourcesUnavailable) as err:
                await held_ids(socket)
            assert str(err.value) == (
                f"{socket}: the kubelet answered RESOURCE_EXHAUSTED: rejected by rate limit"
            )
            nursery.cancel_scope.cancel()


async def test_status_ok_with_no_reply_is_unavailable(tmp_path):
    async def nothing(stream: Stream) -> None:
        pass  # served as a stream, so grpclib ends the call OK with no message

    socket = tmp_path / "kubelet.sock"
    with trio.fail_after(LIMIT):
        async with asyncio_door(), trio.open_nursery() as nursery:
            await nursery.start(serve, socket, [_Lister(nothing, Cardinality.UNARY_STREAM)])
            with pytest.raises(PodResourcesUnavailable) as err:
                await held_ids(socket)
            assert str(err.value) == f"{socket}: the kubelet ended the call with no reply"
            nursery.cancel_scope.cancel()


async def test_no_kubelet_is_unavailable(tmp_path):
    socket = tmp_path / "no-such.sock"
    with trio.fail_after(LIMIT):
        async with asyncio_door():
            with pytest.raises(PodResourcesUnavailable) as err:
                await held_ids(socket)
    assert str(err.value).startswith(f"{socket}: ")
