"""The kubelet's PodResources API (v1 List): which device IDs of which
resource some pod still holds, as the kubelet counts them. Asked before a
CDI spec forgets a device a container may still be started with.

The reply lists every pod on the node (about 120 KB for 2,000 pods): it is
received as bytes and decoded by protobuf's C decoder (upb) in a worker
thread, so that the Trio thread never waits on it (betterproto, on the
loop, held it for over 400 ms at 2,000 pods)."""

from __future__ import annotations

from pathlib import Path

import trio
import trio_asyncio
from google.protobuf.message import DecodeError
from grpclib.client import Channel
from grpclib.const import Cardinality
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
from h2.exceptions import H2Error

from powerdev._proto import podresources_pb2 as pb
from powerdev.rpc.door import PassThroughCodec

LIST_TIMEOUT = 10.0  # seconds
LIST = "/v1.PodResourcesLister/List"


# resource name -> device ID -> the pods ("namespace/name") whose
# containers hold it, as the kubelet says
Holding = dict[str, dict[str, set[str]]]


class PodResourcesUnavailable(Exception):
    """The kubelet could not be asked; str() says where and why, in one line."""


class _Undecoded:
    """A message type whose decoding is the bytes as they came (and the door's
    codec sends bytes as they are): the call's messages cross undecoded."""

    @staticmethod
    def FromString(data: bytes) -> bytes:  # the name grpclib calls
        return data


async def held_ids(socket: Path) -> Holding:
    """Resource name -> every device ID that some pod's container holds ->
    those pods."""
    reply = await _list(socket)
    try:
        return await trio.to_thread.run_sync(held_in, reply)
    except DecodeError as err:
        raise PodResourcesUnavailable(
            f"{socket}: the kubelet's reply is not a valid ListPodResourcesResponse: {err}"
        ) from None


def held_in(reply: bytes) -> Holding:
    """Resource name -> device ID -> pods, from an encoded
    ListPodResourcesResponse. DecodeError if it is not one. Pure; runs in a
    worker thread."""
    held: Holding = {}
    for pod in pb.ListPodResourcesResponse.FromString(reply).pod_resources:
        name = f"{pod.namespace}/{pod.name}"
        for container in pod.containers:
            for devices in container.devices:
                ids = held.get(devices.resource_name)
                if ids is None:
                    ids = held[devices.resource_name] = {}
                for device_id in devices.device_ids:
                    pods = ids.get(device_id)
                    if pods is None:
                        ids[device_id] = {name}
                    else:
                        pods.add(name)
    return held


async def _list(socket: Path) -> bytes:
    """The kubelet's encoded ListPodResourcesResponse."""

    async def call() -> bytes | None:
        channel = Channel(path=str(socket), codec=PassThroughCodec())
        try:
            async with channel.request(
                LIST, Cardinality.UNARY_UNARY, _Undecoded, _Undecoded, timeout=LIST_TIMEOUT
            ) as stream:
                # ListPodResourcesRequest has no fields: it encodes as nothing.
                await stream.send_message(b"", end=True)
                return await stream.recv_message()  # type: ignore[no-any-return]
        finally:
            channel.close()

    try:
        reply = await trio_asyncio.aio_as_trio(call)()
    except GRPCError as err:
        raise PodResourcesUnavailable(
            f"{socket}: the kubelet answered {err.status.name}: {err.message or ''}"
        ) from None
    except (
        OSError,
        TimeoutError,
        StreamTerminatedError,
        ProtocolError,
        H2Error,
    ) as err:
        raise PodResourcesUnavailable(f"{socket}: {err or type(err).__name__}") from None
    except AttributeError as err:
        # grpclib's client, on a connection the server dropped at once,
        # fails this way before it notices that the connection is gone.
        raise PodResourcesUnavailable(f"{socket}: the connection was closed ({err})") from None
    if reply is None:
        raise PodResourcesUnavailable(f"{socket}: the kubelet ended the call with no reply")
    return reply
