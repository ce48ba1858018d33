"""The plugin's one call to the kubelet: Register."""

from __future__ import annotations

from pathlib import Path

import trio_asyncio
from grpclib.client import Channel
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
from h2.exceptions import H2Error

from powerdev._proto.v1beta1 import DevicePluginOptions, RegisterRequest, RegistrationStub

API_VERSION = "v1beta1"
REGISTER_TIMEOUT = 30.0  # the kubelet dials us for up to 10 s before it answers


class RegisterError(Exception):
    """Register did not succeed; str() says why, in one line."""


class KubeletUnreachable(RegisterError):
    """Nobody answered on kubelet.sock: the kubelet is stopping or restarting."""


async def register(
    kubelet_socket: Path,
    endpoint: str,
    resource_name: str,
    options: DevicePluginOptions | None = None,
) -> None:
    """Register `resource_name`, served at `endpoint` (a file name), with the kubelet."""

    async def call() -> None:
        channel = Channel(path=str(kubelet_socket))
        try:
            await RegistrationStub(channel).register(
                RegisterRequest(
                    version=API_VERSION,
                    endpoint=endpoint,
                    resource_name=resource_name,
                    options=options or DevicePluginOptions(),
                ),
                timeout=REGISTER_TIMEOUT,
            )
        finally:
            channel.close()

    try:
        await trio_asyncio.aio_as_trio(call)()
    except GRPCError as err:
        raise RegisterError(f"the kubelet refused: {err.message or err.status.name}") from None
    except (ConnectionError, FileNotFoundError) as err:
        raise KubeletUnreachable(f"{kubelet_socket}: {err.strerror or err}") from None
    except StreamTerminatedError as err:  # it went away in the middle of our call
        raise KubeletUnreachable(f"{kubelet_socket}: {err or 'connection lost'}") from None
    except (TimeoutError, OSError, ProtocolError, H2Error) as err:
        # Any transport or HTTP/2 failure: a reason to try again, never to exit.
        raise RegisterError(
            f"cannot reach the kubelet at {kubelet_socket}: {err or type(err).__name__}"
        ) from None
    except Exception as err:  # anything else grpclib may raise: still only a failed try
        raise RegisterError(
            f"Register to {kubelet_socket} failed: {type(err).__name__}: {err}"
        ) from None
