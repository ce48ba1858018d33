"""The design's floor: what any device plugin built on trio, trio-asyncio,
grpclib, betterproto, pyudev and protobuf costs before it does any work of
its own. `powerdev bench` runs it where it runs powerdev against the
kubelet's device manager, so that each of powerdev's figures can be read
against the least the same stack can do:

    python -m powerdev.devtools.floor PLUGIN_DIR DEVICES

It imports the design's packages, serves the device plugin API on a unix
socket in PLUGIN_DIR with answers encoded once at start (a list of DEVICES
Healthy devices, a preferred allocation of one device, an Allocate answer of
one device: nothing decoded, nothing scanned, nothing checked), registers
with the kubelet at PLUGIN_DIR/kubelet.sock, and serves until killed.

The one module outside the asyncio door (powerdev.rpc) that touches grpclib:
importing the door would load powerdev's own modules, and the floor is what
comes before them. It imports nothing of powerdev but the generated code.
"""

from __future__ import annotations

import asyncio
import sys

import betterproto  # noqa: F401  (the design's packages: imported, as any plugin on them would)
import grpclib.client
import grpclib.server
import pyudev  # noqa: F401
import trio
import trio_asyncio
from grpclib.const import Cardinality, Handler
from grpclib.encoding.proto import ProtoCodec

from powerdev._proto import api_pb2 as pb
from powerdev._proto.v1beta1 import DevicePluginOptions, RegisterRequest, RegistrationStub

RESOURCE = "power-dev-plugin/dev"
SOCKET = "floor.sock"
SERVICE = "/v1beta1.DevicePlugin/"


class _Bytes(ProtoCodec):
    """Requests are taken as bytes and never decoded; answers are bytes already."""

    def encode(self, message: object, message_type: object) -> bytes:
        assert isinstance(message, bytes)
        return message

    def decode(self, data: bytes, message_type: object) -> bytes:
        return data


class FixedPlugin:
    """The DevicePlugin service, answering every call with bytes made once."""

    def __init__(self, devices: int) -> None:
        self.options = pb.DevicePluginOptions(
            get_preferred_allocation_available=True
        ).SerializeToString()
        self.listed = pb.ListAndWatchResponse(
            devices=[pb.Device(ID=f"bench{i}", health="Healthy") for i in range(devices)]
        ).SerializeToString()
        self.preferred = pb.PreferredAllocationResponse(
            container_responses=[pb.ContainerPreferredAllocationResponse(deviceIDs=["bench0"])]
        ).SerializeToString()
        path = "/dev/bench0"
        spec = pb.DeviceSpec(container_path=path, host_path=path, permissions="rw")
        self.allocated = pb.AllocateResponse(
            container_responses=[pb.ContainerAllocateResponse(devices=[spec])]
        ).SerializeToString()

    def _answer(self, reply: bytes) -> Handler:
        async def handle(stream: grpclib.server.Stream) -> None:
            await stream.recv_message()
            await stream.send_message(reply)

        return Handler(handle, Cardinality.UNARY_UNARY, None, None)

    async def _list_and_watch(self, stream: grpclib.server.Stream) -> None:
        await stream.recv_message()
        await stream.send_message(self.listed)
        await asyncio.Event().wait()  # the list never changes

    def __mapping__(self) -> dict[str, Handler]:
        return {
            SERVICE + "GetDevicePluginOptions": self._answer(self.options),
            SERVICE + "GetPreferredAllocation": self._answer(self.preferred),
            SERVICE + "Allocate": self._answer(self.allocated),
            SERVICE + "ListAndWatch": Handler(
                self._list_and_watch, Cardinality.UNARY_STREAM, None, None
            ),
        }


async def serve(plugin_dir: str, devices: int) -> None:
    async with trio_asyncio.open_loop():
        server = grpclib.server.Server([FixedPlugin(devices)], codec=_Bytes())
        await trio_asyncio.aio_as_trio(server.start)(path=f"{plugin_dir}/{SOCKET}")

        async def register() -> None:
            channel = grpclib.client.Channel(path=f"{plugin_dir}/kubelet.sock")
            try:
                await RegistrationStub(channel).register(
                    RegisterRequest(
                        version="v1beta1",
                        endpoint=SOCKET,
                        resource_name=RESOURCE,
                        options=DevicePluginOptions(get_preferred_allocation_available=True),
                    )
                )
            finally:
                channel.close()

        try:
            await trio_asyncio.aio_as_trio(register)()
            await trio.sleep_forever()
        finally:
            server.close()


if __name__ == "__main__":
    trio.run(serve, sys.argv[1], int(sys.argv[2]))
