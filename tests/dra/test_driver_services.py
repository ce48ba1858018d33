"""The DRA driver's gRPC services (rpc/dra_service.py) over real unix
sockets, called as the kubelet calls them: GetInfo and
NotifyRegistrationStatus on the registration socket, and the node service
in both versions the registration names (the harness's kubelet picks v1,
so v1beta1 is called here), with a per-claim error beside a prepared
claim."""

from __future__ import annotations

import trio
import trio_asyncio
from grpclib.client import Channel

from powerdev._proto.k8s.io.kubelet.pkg.apis.dra import v1, v1beta1
from powerdev._proto.pluginregistration import InfoRequest, RegistrationStatus, RegistrationStub
from powerdev.dra.names import endpoint, registration_socket
from powerdev.rpc import asyncio_door
from powerdev.rpc.dra_service import serve_driver
from tests.unit.test_dra import DEVICES, DRIVER, POOL, FakeClaims, make_claims

LIMIT = 10


async def call(path, make):
    async def run():
        channel = Channel(path=str(path))
        try:
            return await make(channel)
        finally:
            channel.close()

    return await trio_asyncio.aio_as_trio(run)()


async def test_registration_and_both_node_service_versions(tmp_path):
    api = FakeClaims()
    api.allocate("c1", "uid-1", "u1")
    claims = make_claims(tmp_path, api, DEVICES)
    registered = []
    registry, plugins = tmp_path / "plugins_registry", tmp_path / "plugins"
    with trio.fail_after(LIMIT):
        async with asyncio_door(), trio.open_nursery() as nursery:
            await nursery.start(
                serve_driver, DRIVER, registry, plugins, claims, lambda: registered.append(1)
            )
            reg = registration_socket(registry, DRIVER)
            info = await call(reg, lambda ch: RegistrationStub(ch).get_info(InfoRequest()))
            assert (info.type, info.name, info.endpoint) == (
                "DRAPlugin",
                DRIVER,
                str(endpoint(plugins, DRIVER)),
            )
            assert info.supported_versions == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
            status = RegistrationStatus(plugin_registered=True)
            await call(reg, lambda ch: RegistrationStub(ch).notify_registration_status(status))
            assert registered == [1]

            node = endpoint(plugins, DRIVER)
            request = v1beta1.NodePrepareResourcesRequest(
                claims=[
                    v1beta1.Claim(namespace="ns", name="c1", uid="uid-1"),
                    v1beta1.Claim(namespace="ns", name="gone", uid="uid-2"),
                ]
            )
            answer = await call(
                node, lambda ch: v1beta1.DraPluginStub(ch).node_prepare_resources(request)
            )
            (device,) = answer.claims["uid-1"].devices
            assert (device.pool_name, device.device_name, device.request_names) == (
                POOL,
                "u1",
                ["r"],
            )
            assert device.cdi_device_ids == [f"{DRIVER}/claim=uid-1-u1"]
            assert "does not exist" in answer.claims["uid-2"].error

            undo = v1.NodeUnprepareResourcesRequest(
                claims=[v1.Claim(namespace="ns", name="c1", uid="uid-1")]
            )
            answer = await call(
                node, lambda ch: v1.DraPluginStub(ch).node_unprepare_resources(undo)
            )
            assert answer.claims["uid-1"].error == ""
            assert not claims.spec_path("uid-1").exists()
            nursery.cancel_scope.cancel()
