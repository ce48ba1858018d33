"""The kubelet's PodResources API (v1 List): which device IDs of which
resource some pod still holds, as the kubelet counts them. Asked before a
CDI spec forgets a device a container may still be started with."""

from __future__ import annotations

from pathlib import Path

import trio_asyncio
from grpclib.client import Channel
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
from h2.exceptions import H2Error

from powerdev._proto.v1 import ListPodResourcesRequest, PodResourcesListerStub

LIST_TIMEOUT = 10.0  # seconds


class PodResourcesUnavailable(Exception):
    """The kubelet could not be asked; str() says where and why, in one line."""


async def held_ids(socket: Path) -> dict[str, set[str]]:
    """Resource name -> every device ID that some pod's container holds."""

    async def call() -> dict[str, set[str]]:
        channel = Channel(path=str(socket))
        try:
            reply = await PodResourcesListerStub(channel).list(
                ListPodResourcesRequest(), timeout=LIST_TIMEOUT
            )
        finally:
            channel.close()
        held: dict[str, set[str]] = {}
        for pod in reply.pod_resources:
            for container in pod.containers:
                for devices in container.devices:
                    held.setdefault(devices.resource_name, set()).update(devices.device_ids)
        return held

    try:
        return await trio_asyncio.aio_as_trio(call)()
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
