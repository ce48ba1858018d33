"""The kubelet's half of the API, for the fake kubelet: serve Registration
and PodResources, and dial a plugin to call it. Plain data crosses out of
this module."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio_asyncio
from grpclib.client import Channel
from grpclib.const import Cardinality, Status
from grpclib.encoding.base import CodecBase
from grpclib.encoding.proto import ProtoCodec
from grpclib.exceptions import GRPCError, StreamTerminatedError

from powerdev._proto import api_pb2 as pb
from powerdev._proto.v1 import (
    ContainerDevices,
    ContainerResources,
    ListPodResourcesRequest,
    ListPodResourcesResponse,
    PodResources,
    PodResourcesListerBase,
)
from powerdev._proto.v1beta1 import (
    AllocateRequest,
    ContainerAllocateRequest,
    ContainerPreferredAllocationRequest,
    DevicePluginStub,
    Empty,
    ListAndWatchResponse,
    PreferredAllocationRequest,
    RegisterRequest,
    RegistrationBase,
)
from powerdev.resources.allocation import DeviceGrant
from powerdev.rpc.door import serve


class _RawCodec(CodecBase):
    """Bytes in, bytes out: for timing calls without protobuf work on our side."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        return bytes(message)

    def decode(self, data: bytes, message_type: Any) -> Any:
        return data


class _KubeletCodec(ProtoCodec):
    """betterproto's messages, but a ListAndWatch list is decoded by
    protobuf's C decoder, as the real kubelet decodes it in Go: betterproto's
    took 220 ms for a list of 1,000 devices, which the bench's "start to first
    full list" counted after the plugin had sent it."""

    def decode(self, data: bytes, message_type: Any) -> Any:
        if message_type is ListAndWatchResponse:
            return pb.ListAndWatchResponse.FromString(data)
        return super().decode(data, message_type)


class RegisterRefused(Exception):
    """Raised by a registration handler; the caller sees gRPC UNKNOWN and this text."""


class PluginCallError(Exception):
    """A call to a plugin failed; `status` is the gRPC status name or 'UNAVAILABLE'."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True)
class ContainerGrant:
    """What a container gets: ContainerAllocateResponse as plain data."""

    devices: tuple[DeviceGrant, ...]
    envs: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    mounts: tuple[tuple[str, str, bool], ...] = ()
    cdi_devices: tuple[str, ...] = ()


# version, endpoint, resource name, and the request's options as
# (pre_start_required, get_preferred_allocation_available)
OnRegister = Callable[[str, str, str, tuple[bool, bool]], Awaitable[None]]


class _RegistrationService(RegistrationBase):
    def __init__(self, on_register: OnRegister) -> None:
        self._on_register = on_register

    async def register(self, register_request: RegisterRequest) -> Empty:
        try:
            options = register_request.options
            await trio_asyncio.trio_as_aio(self._on_register)(
                register_request.version,
                register_request.endpoint,
                register_request.resource_name,
                (options.pre_start_required, options.get_preferred_allocation_available),
            )
        except RegisterRefused as err:
            raise GRPCError(Status.UNKNOWN, str(err)) from None
        return Empty()


async def serve_registration(
    path: Path,
    on_register: OnRegister,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the Registration service on `path` until cancelled."""
    await serve(path, [_RegistrationService(on_register)], task_status=task_status)


# pod name -> resource name -> device IDs its one container holds
Holders = dict[str, dict[str, list[str]]]


class _PodResourcesService(PodResourcesListerBase):
    def __init__(self, listing: Callable[[], Holders | None]) -> None:
        self._listing = listing

    async def list(
        self, list_pod_resources_request: ListPodResourcesRequest
    ) -> ListPodResourcesResponse:
        pods = self._listing()
        if pods is None:  # a kubelet that cannot answer yet
            raise GRPCError(Status.UNAVAILABLE, "the kubelet is not ready to list pods")
        return ListPodResourcesResponse(
            pod_resources=[
                PodResources(
                    name=pod,
                    namespace="default",
                    containers=[
                        ContainerResources(
                            name="c0",
                            devices=[
                                ContainerDevices(resource_name=r, device_ids=list(ids))
                                for r, ids in held.items()
                            ],
                        )
                    ],
                )
                for pod, held in pods.items()
            ]
        )


async def serve_pod_resources(
    path: Path,
    listing: Callable[[], Holders | None],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve PodResources List on `path` until cancelled: `listing()` is asked
    (from the asyncio side, so it must not block) at each call; None is
    answered UNAVAILABLE."""
    await serve(path, [_PodResourcesService(listing)], task_status=task_status)


class PluginClient:
    """A connection to one plugin's socket, as the kubelet holds it."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self._channel: Channel | None = None
        self._raw_channel: Channel | None = None

    def _stub(self) -> DevicePluginStub:
        if self._channel is None:
            self._channel = Channel(path=str(self.socket_path), codec=_KubeletCodec())
        return DevicePluginStub(self._channel)

    async def _run(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """Run an asyncio call; every failure becomes a PluginCallError."""
        try:
            return await trio_asyncio.aio_as_trio(call)()
        except GRPCError as err:
            raise PluginCallError(err.status.name, err.message or "") from None
        except (TimeoutError, OSError, StreamTerminatedError) as err:
            raise PluginCallError("UNAVAILABLE", str(err) or type(err).__name__) from None
        except AttributeError as err:
            # grpclib's client, asked for a new stream on a connection the
            # server has just dropped, fails this way before it notices.
            raise PluginCallError("UNAVAILABLE", f"the connection was closed ({err})") from None

    async def _call(self, make: Callable[[DevicePluginStub], Awaitable[object]]) -> object:
        async def call() -> object:
            return await make(self._stub())

        return await self._run(call)

    async def options(self, dial_seconds: float = 10.0) -> tuple[bool, bool]:
        """(pre_start_required, get_preferred_allocation_available)."""
        opts = await self._call(
            lambda s: s.get_device_plugin_options(Empty(), timeout=dial_seconds)
        )
        return opts.pre_start_required, opts.get_preferred_allocation_available  # type: ignore[attr-defined]

    async def allocate(self, requests: Sequence[Sequence[str]]) -> list[ContainerGrant]:
        """One ContainerGrant per container request, in order."""
        reply = await self._call(
            lambda s: s.allocate(
                AllocateRequest(
                    container_requests=[
                        ContainerAllocateRequest(devices_ids=list(ids)) for ids in requests
                    ]
                )
            )
        )
        return [
            ContainerGrant(
                devices=tuple(
                    DeviceGrant(d.host_path, d.container_path, d.permissions) for d in r.devices
                ),
                envs=dict(r.envs),
                annotations=dict(r.annotations),
                mounts=tuple((m.container_path, m.host_path, m.read_only) for m in r.mounts),
                cdi_devices=tuple(c.name for c in r.cdi_devices),
            )
            for r in reply.container_responses  # type: ignore[attr-defined]
        ]

    async def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        reply = await self._call(
            lambda s: s.get_preferred_allocation(
                PreferredAllocationRequest(
                    container_requests=[
                        ContainerPreferredAllocationRequest(
                            available_device_i_ds=list(available),
                            must_include_device_i_ds=list(must_include),
                            allocation_size=size,
                        )
                    ]
                )
            )
        )
        return list(reply.container_responses[0].device_i_ds)  # type: ignore[attr-defined]

    async def watch(self, on_update: Callable[[list[tuple[str, str]]], None]) -> str:
        """Run ListAndWatch, calling on_update([(id, health), ...]) for every
        message, until the stream ends; returns why it ended."""

        async def pump() -> str:
            async for reply in self._stub().list_and_watch(Empty()):
                on_update([(d.ID, d.health) for d in reply.devices])  # a pb message
            return "the plugin closed the stream"

        try:
            return await trio_asyncio.aio_as_trio(pump)()
        except GRPCError as err:
            return f"rpc error: {err.status.name}: {err.message}"
        except (OSError, StreamTerminatedError) as err:
            return f"rpc error: UNAVAILABLE: {err or type(err).__name__}"

    async def raw(self, method: str, payload: bytes) -> bytes:
        """Call a unary method with `payload` as the request, as it is, and
        return the reply undecoded: for timing, and for sending garbage."""

        async def call() -> bytes:
            if self._raw_channel is None:
                self._raw_channel = Channel(path=str(self.socket_path), codec=_RawCodec())
            async with self._raw_channel.request(
                f"/v1beta1.DevicePlugin/{method}", Cardinality.UNARY_UNARY, bytes, bytes
            ) as stream:
                await stream.send_message(payload, end=True)
                reply = await stream.recv_message()
            return reply or b""

        return await self._run(call)

    async def allocate_bytes(self, ids: Sequence[str]) -> int:
        """Allocate for one container, returning the size of the raw answer.
        The answer is not decoded, so a benchmark times the plugin, not this
        client's protobuf decoding (the real kubelet decodes in Go)."""
        request = AllocateRequest(
            container_requests=[ContainerAllocateRequest(devices_ids=list(ids))]
        )
        return len(await self.raw("Allocate", bytes(request)))

    async def stall(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Open ListAndWatch and never read from it, until cancelled: a kubelet
        that stopped reading, for fault tests. started() once the stream is open."""
        opened = trio.Event()

        async def call() -> None:
            async with self._stub().channel.request(
                "/v1beta1.DevicePlugin/ListAndWatch",
                Cardinality.UNARY_STREAM,
                Empty,
                ListAndWatchResponse,
            ) as stream:
                await stream.send_message(Empty(), end=True)
                await stream.recv_initial_metadata()
                opened.set()
                await asyncio.Event().wait()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio_asyncio.aio_as_trio(call))
            await opened.wait()
            task_status.started()

    def close(self) -> None:
        for channel in (self._channel, self._raw_channel):
            if channel is not None:
                channel.close()
        self._channel = self._raw_channel = None


class DraNodeClient:
    """A DRA driver's node service (v1), called as the kubelet calls it: one
    grpclib connection to its unix socket. Claims go in as (namespace, name,
    UID); answers come back as plain data: claim UID -> (error, CDI IDs)."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self._channel: Channel | None = None

    def _stub(self) -> Any:
        from powerdev._proto.k8s.io.kubelet.pkg.apis.dra import v1

        if self._channel is None:
            self._channel = Channel(path=str(self.socket))
        return v1.DraPluginStub(self._channel)

    async def prepare(
        self, claims: Sequence[tuple[str, str, str]]
    ) -> dict[str, tuple[str, list[str]]]:
        from powerdev._proto.k8s.io.kubelet.pkg.apis.dra import v1

        request = v1.NodePrepareResourcesRequest(
            claims=[v1.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
        )

        async def call() -> Any:
            return await self._stub().node_prepare_resources(request)

        answer = await trio_asyncio.aio_as_trio(call)()
        return {
            uid: (a.error, [i for d in a.devices for i in d.cdi_device_ids])
            for uid, a in answer.claims.items()
        }

    async def unprepare(self, claims: Sequence[tuple[str, str, str]]) -> dict[str, str]:
        from powerdev._proto.k8s.io.kubelet.pkg.apis.dra import v1

        request = v1.NodeUnprepareResourcesRequest(
            claims=[v1.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]
        )

        async def call() -> Any:
            return await self._stub().node_unprepare_resources(request)

        answer = await trio_asyncio.aio_as_trio(call)()
        return {uid: a.error for uid, a in answer.claims.items()}

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
