"""The DevicePlugin gRPC service: a thin shell around powerdev.resources.plugin.Plugin.

The kubelet's requests are decoded by protobuf's C decoder (upb), not by
betterproto: GetPreferredAllocation carries every free device ID (about
9 ms for 1,000 IDs with betterproto, 0.04 ms with upb).
"""

from __future__ import annotations

import grpclib.const
import trio
import trio_asyncio
from google.protobuf.message import Message
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

from powerdev._proto import api_pb2 as pb
from powerdev._proto.v1beta1 import (
    DevicePluginBase,
    DevicePluginOptions,
    Empty,
    ListAndWatchResponse,
    PreStartContainerRequest,
    PreStartContainerResponse,
)
from powerdev.ops import metrics
from powerdev.resources.allocation import AllocationRefused, CdiGrant, Grant
from powerdev.resources.cdi import SpecWriteError
from powerdev.resources.plugin import Plugin
from powerdev.rpc.answers import Answers
from powerdev.rpc.door import send_or_cancel

LIST_AND_WATCH = "/v1beta1.DevicePlugin/ListAndWatch"
OPTIONS = "/v1beta1.DevicePlugin/GetDevicePluginOptions"
PREFERRED = "/v1beta1.DevicePlugin/GetPreferredAllocation"
ALLOCATE = "/v1beta1.DevicePlugin/Allocate"
MAX_PREFERRED_IDS = 100_000  # a bound on work for one GetPreferredAllocation


class PluginService(DevicePluginBase):
    """One per served socket.

    Which ListAndWatch stream is the kubelet's? Not the first one: any client
    may open a stream, before or after the kubelet. The kubelet, while it
    handles our Register, dials us and calls GetDevicePluginOptions, then
    opens ListAndWatch on that same connection (from a goroutine, maybe after
    Register has returned). So a connection that asks for the options while
    our Register is in flight is the kubelet's, and so is every stream on it.
    `kubelet_stream_ended` is set when such a stream ends: the kubelet never
    dials again, so we must register again. Another client's streams come
    and go without effect.
    """

    def __init__(self, plugin: Plugin, answers: Answers | None = None) -> None:
        self._plugin = plugin
        self._answers = answers or Answers(plugin)
        self.kubelet_stream_ended = trio.Event()
        self.kubelet_list_sent = trio.Event()
        self.registering = False  # set by the caller around its Register call
        self._kubelet_connections: set[object] = set()

    def options(self) -> DevicePluginOptions:
        """What GetDevicePluginOptions answers, and what Register sends."""
        return DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=self._plugin.prefers
        )

    async def get_device_plugin_options(self, empty: Empty) -> DevicePluginOptions:
        return self.options()

    async def _options(self, stream: Stream[Empty, DevicePluginOptions]) -> None:
        request = await stream.recv_message()
        if self.registering:
            self._kubelet_connections.add(connection_of(stream))
        await stream.send_message(await self.get_device_plugin_options(request or Empty()))

    async def allocate(self, allocate_request: pb.AllocateRequest | None) -> bytes:
        """The encoded AllocateResponse."""
        began = metrics.allocate_started(self._plugin.resource.name)
        requests = [
            _ids(c, pb.ContainerAllocateRequest, "devices_ids")
            for c in _items(allocate_request, "container_requests")
        ]
        try:
            grants = self._plugin.allocate(requests)
        except AllocationRefused as err:
            metrics.allocate_refused(self._plugin, requests, err, began)
            raise GRPCError(Status.INVALID_ARGUMENT, str(err)) from None
        try:
            encoded = await trio_asyncio.trio_as_aio(self._answer)(grants)
        except SpecWriteError as err:
            metrics.allocate_refused(self._plugin, requests, err, began)
            raise GRPCError(Status.FAILED_PRECONDITION, str(err)) from None
        finally:  # "both": a grant counts from its answer (or its refusal), not its start
            self._plugin.answered(requests)
        metrics.allocate_answered(self._plugin.resource.name, began)
        return encoded  # type: ignore[no-any-return]

    async def _answer(self, grants: list[Grant | CdiGrant]) -> bytes:
        """On the Trio side, in one crossing: the CDI spec made to name the
        current list, then the encoded answer, which the door's codec sends
        as it is."""
        await self._plugin.ensure_spec()
        return await self._answers.allocate(grants)

    async def get_preferred_allocation(
        self, preferred_allocation_request: pb.PreferredAllocationRequest | None
    ) -> bytes:
        """The encoded PreferredAllocationResponse."""
        asked = []
        for req in _items(preferred_allocation_request, "container_requests"):
            kind = pb.ContainerPreferredAllocationRequest
            available = _ids(req, kind, "available_deviceIDs")
            must = _ids(req, kind, "must_include_deviceIDs")
            size = req.allocation_size
            if not isinstance(size, int) or not 0 <= size <= MAX_PREFERRED_IDS:
                raise GRPCError(
                    Status.INVALID_ARGUMENT,
                    f"allocation_size {size!r} is outside 0..{MAX_PREFERRED_IDS}",
                )
            asked.append((available, must, size))
        reply = pb.PreferredAllocationResponse()
        for ids in self._plugin.preferred(asked):
            reply.container_responses.add(deviceIDs=ids)
        return reply.SerializeToString()

    async def pre_start_container(
        self, pre_start_container_request: PreStartContainerRequest
    ) -> PreStartContainerResponse:
        return PreStartContainerResponse()

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        # The generated handler iterates an async generator that it never
        # closes; ours works on the stream itself and cleans up in `finally`.
        # The options call is taken at the stream level too, to see its connection.
        mapping = super().__mapping__()
        for name, handler in ((LIST_AND_WATCH, self._list_and_watch), (OPTIONS, self._options)):
            generated = mapping[name]
            mapping[name] = grpclib.const.Handler(
                handler, generated.cardinality, generated.request_type, generated.reply_type
            )
        # Requests decoded by upb (the door's codec calls the type's FromString
        # and makes a failure INVALID_ARGUMENT); the answers are bytes already.
        for name, handler, request_type in (
            (PREFERRED, self._preferred, pb.PreferredAllocationRequest),
            (ALLOCATE, self._allocate, pb.AllocateRequest),
        ):
            generated = mapping[name]
            mapping[name] = grpclib.const.Handler(
                handler, generated.cardinality, request_type, generated.reply_type
            )
        return mapping

    async def _preferred(self, stream: Stream[pb.PreferredAllocationRequest, bytes]) -> None:
        await stream.send_message(await self.get_preferred_allocation(await stream.recv_message()))

    async def _allocate(self, stream: Stream[pb.AllocateRequest, bytes]) -> None:
        await stream.send_message(await self.allocate(await stream.recv_message()))

    async def _list_and_watch(self, stream: Stream[Empty, ListAndWatchResponse]) -> None:
        await stream.recv_message()
        from_kubelet = connection_of(stream) in self._kubelet_connections
        wait_newer = trio_asyncio.trio_as_aio(self._plugin.inventory.wait_newer)
        encode = trio_asyncio.trio_as_aio(self._answers.list_and_watch)
        try:
            metrics.stream_opened(self._plugin.resource.name, from_kubelet)
            sent = 0
            while True:
                snapshot = await wait_newer(sent)
                await send_or_cancel(stream, await encode(snapshot))
                metrics.list_sent(self._plugin.resource.name)
                sent = snapshot.version
                if from_kubelet:
                    self.kubelet_list_sent.set()
        finally:
            metrics.stream_closed(self._plugin.resource.name, from_kubelet)
            if from_kubelet:
                self.kubelet_stream_ended.set()


def connection_of(stream: Stream) -> object:
    """What identifies a call's HTTP/2 connection: its transport, which every
    stream on one connection shares (grpclib keeps it on the peer object)."""
    return stream.peer._transport  # type: ignore[attr-defined]


def _items(message: object, field: str) -> list:
    """A repeated message field, refused unless it holds messages. (upb gives
    a field nothing but its own type; the check stays, so that a request
    type that lets garbage decode into odd shapes is refused all the same.)"""
    items = _repeated(message, field)
    if not isinstance(items, list) or any(item is None for item in items):
        raise GRPCError(Status.INVALID_ARGUMENT, f"malformed request: bad {field}")
    return items


def _ids(message: object, kind: type, field: str) -> list[str]:
    """A repeated string field of a `kind` message, refused unless the
    message is one. (A decoded `kind` holds nothing but strings there: upb
    refuses a field of another type, and a string that is not UTF-8.)"""
    ids = _repeated(message, field) if isinstance(message, kind) else None
    if not isinstance(ids, list):
        raise GRPCError(Status.INVALID_ARGUMENT, f"malformed request: bad {field}")
    return ids


def _repeated(message: object, field: str) -> object:
    """A repeated field as a list (upb's containers are not lists); None when
    there is no message (a call that sent none) or no such field."""
    if not isinstance(message, Message):
        return None
    return list(getattr(message, field))
