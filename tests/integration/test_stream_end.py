"""A ListAndWatch push that meets a stream its peer has just closed (a
kubelet restart ends its connection) is a cancellation for grpclib, logged
at INFO, never "Failed to handle cancellation" at ERROR with tracebacks."""

import asyncio
from types import SimpleNamespace

import pytest
import trio
import trio_asyncio
from grpclib.exceptions import StreamTerminatedError
from h2.exceptions import StreamClosedError

from powerdev._proto.v1beta1 import Empty
from powerdev.config import ResourceConfig
from powerdev.devices.inventory import Inventory
from powerdev.devices.model import Device
from powerdev.resources.plugin import Plugin
from powerdev.rpc import PluginService, asyncio_door


class ClosedUnderUs:
    """A server stream whose peer closed it just before our send."""

    def __init__(self, error: Exception) -> None:
        self.peer = SimpleNamespace(_transport=object())
        self.error = error

    async def recv_message(self):
        return Empty()

    async def send_message(self, message):
        raise self.error


@pytest.mark.parametrize(
    "error",
    [StreamClosedError(1), StreamTerminatedError("Connection lost"), ConnectionResetError()],
)
async def test_a_push_onto_a_closed_stream_ends_the_call_as_a_cancellation(error):
    plugin = Plugin(
        ResourceConfig(), Inventory([Device("d0", "/dev/d0", "c", 1, 3)]), refresh=None, spec=None
    )
    service = PluginService(plugin)

    async def list_and_watch() -> None:
        with pytest.raises(asyncio.CancelledError) as ended:
            await service._list_and_watch(ClosedUnderUs(error))
        assert ended.value.__cause__ is error

    with trio.fail_after(10):
        async with asyncio_door():
            await trio_asyncio.aio_as_trio(list_and_watch)()
    assert service.kubelet_stream_ended.is_set() is False  # not the kubelet's stream
