"""The DevicePlugin gRPC service: a thin shell around powerdev.plugin.Plugin."""

from __future__ import annotations

import grpclib.const
import trio
import trio_asyncio
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from powerdev._proto.v1beta1 import (
    AllocateRequest,
    AllocateResponse,
    ContainerPreferredAllocationResponse,
    DevicePluginBase,
    DevicePluginOptions,
    Empty,
    ListAndWatchResponse,
    PreferredAllocationRequest,
    PreferredAllocationResponse,
    PreStartContainerRequest,
    PreStartContainerResponse,
)
from powerdev.allocation import AllocationRefused
from powerdev.plugin import Plugin
from powerdev.rpc.answers import Answers

LIST_AND_WATCH = "/v1beta1.DevicePlugin/ListAndWatch"
MAX_PREFERRED_IDS = 100_000  # a bound on work for one GetPreferredAllocation


class PluginService(DevicePluginBase):
    """One per served socket. `kubelet_stream_ended` is set when the first
    ListAndWatch stream on this socket (the kubelet's, opened as it handles
    our Register) ends: the kubelet will not dial again, so we must register
    again."""

    def __init__(self, plugin: Plugin, answers: Answers | None = None) -> None:
        self._plugin = plugin
        self._answers = answers or Answers(plugin)
        self.kubelet_stream_ended = trio.Event()
        self.kubelet_list_sent = trio.Event()
        self.streams_opened = 0

    async def get_device_plugin_options(self, empty: Empty) -> DevicePluginOptions:
        return DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=False
        )

    async def allocate(self, allocate_request: AllocateRequest) -> AllocateResponse:
        try:
            grants = self._plugin.allocate(
                [c.devices_i_ds for c in allocate_request.container_requests]
            )
        except AllocationRefused as err:
            raise GRPCError(Status.INVALID_ARGUMENT, str(err)) from None
        # Already encoded: the door's codec sends bytes as they are.
        return self._answers.allocate(grants)  # type: ignore[return-value]

    async def get_preferred_allocation(
        self, preferred_allocation_request: PreferredAllocationRequest
    ) -> PreferredAllocationResponse:
        requests = preferred_allocation_request.container_requests
        for req in requests:
            if req.allocation_size < 0 or req.allocation_size > MAX_PREFERRED_IDS:
                raise GRPCError(
                    Status.INVALID_ARGUMENT,
                    f"allocation_size {req.allocation_size} is outside 0..{MAX_PREFERRED_IDS}",
                )
        answers = self._plugin.preferred(
            [
                (r.available_device_i_ds, r.must_include_device_i_ds, r.allocation_size)
                for r in requests
            ]
        )
        return PreferredAllocationResponse(
            container_responses=[
                ContainerPreferredAllocationResponse(device_i_ds=ids) for ids in answers
            ]
        )

    async def pre_start_container(
        self, pre_start_container_request: PreStartContainerRequest
    ) -> PreStartContainerResponse:
        return PreStartContainerResponse()

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        # The generated handler iterates an async generator that it never
        # closes; ours works on the stream itself and cleans up in `finally`.
        mapping = super().__mapping__()
        generated = mapping[LIST_AND_WATCH]
        mapping[LIST_AND_WATCH] = grpclib.const.Handler(
            self._list_and_watch,
            generated.cardinality,
            generated.request_type,
            generated.reply_type,
        )
        return mapping

    async def _list_and_watch(self, stream: Stream[Empty, ListAndWatchResponse]) -> None:
        await stream.recv_message()
        self.streams_opened += 1
        from_kubelet = self.streams_opened == 1
        wait_newer = trio_asyncio.trio_as_aio(self._plugin.inventory.wait_newer)
        try:
            sent = 0
            while True:
                snapshot = await wait_newer(sent)
                await stream.send_message(self._answers.list_and_watch(snapshot))
                sent = snapshot.version
                if from_kubelet:
                    self.kubelet_list_sent.set()
        finally:
            if from_kubelet:
                self.kubelet_stream_ended.set()
