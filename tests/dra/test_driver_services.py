"""The DRA driver's gRPC services (rpc/dra_service.py) over real unix
sockets, called as the kubelet calls them: GetInfo and
NotifyRegistrationStatus on the registration socket, and the node service
in both versions the registration names (the harness's kubelet picks v1,
so v1beta1 is called here), with a per-claim error beside a prepared
claim; requests that do not decode (InvalidArgument, the driver serving
on) and claim references without a namespace or name (refused here)."""

from __future__ import annotations

import logging
import random

import pytest
import trio
import trio_asyncio
from grpclib.client import Channel
from grpclib.const import Cardinality
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError

from powerdev._proto import dra_v1_pb2, dra_v1beta1_pb2
from powerdev._proto.k8s.io.kubelet.pkg.apis.dra import v1, v1beta1
from powerdev._proto.pluginregistration import InfoRequest, RegistrationStatus, RegistrationStub
from powerdev.dra.names import endpoint, registration_socket
from powerdev.ops import metrics
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


def claim_calls() -> dict[tuple[str, str], float]:
    """How many claims /metrics counts prepared and unprepared, by result."""
    found = {}
    for family in metrics.REGISTRY.collect():
        for sample in family.samples:
            if sample.name == "powerdev_dra_claim_duration_seconds_count":
                found[(sample.labels["operation"], sample.labels["result"])] = sample.value
    return found


def prepared_now() -> float:
    return metrics.REGISTRY.get_sample_value("powerdev_dra_claims_prepared")


async def test_registration_and_both_node_service_versions(tmp_path):
    before = claim_calls()
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
            assert prepared_now() == 1

            undo = v1.NodeUnprepareResourcesRequest(
                claims=[v1.Claim(namespace="ns", name="c1", uid="uid-1")]
            )
            answer = await call(
                node, lambda ch: v1.DraPluginStub(ch).node_unprepare_resources(undo)
            )
            assert answer.claims["uid-1"].error == ""
            assert not claims.spec_path("uid-1").exists()
            nursery.cancel_scope.cancel()
    after = claim_calls()
    assert {k: after[k] - before.get(k, 0) for k in after} == {
        ("prepare", "ok"): 1,
        ("prepare", "error"): 1,
        ("unprepare", "ok"): 1,
        ("unprepare", "error"): 0,
    }
    assert prepared_now() == 0


class _Raw(CodecBase):
    """Bytes in, bytes out: the request body sent as it is."""

    __content_subtype__ = "proto"

    def encode(self, message, message_type):
        return bytes(message)

    def decode(self, data, message_type):
        return data


async def raw_call(path, method: str, body: bytes) -> tuple[str, str, bytes | None]:
    """One unary call with this body: (status name, message, reply)."""

    async def run():
        channel = Channel(path=str(path), codec=_Raw())
        try:
            async with channel.request(method, Cardinality.UNARY_UNARY, bytes, bytes) as stream:
                await stream.send_message(body, end=True)
                return "OK", "", await stream.recv_message()
        except GRPCError as err:
            return err.status.name, err.message or "", None
        finally:
            channel.close()

    return await trio_asyncio.aio_as_trio(run)()


def bodies(count: int) -> list[bytes]:
    rnd = random.Random(31)
    return [bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 40))) for _ in range(count)]


@pytest.mark.parametrize("api", [v1, v1beta1], ids=["v1", "v1beta1"])
async def test_a_request_that_does_not_decode_is_refused_and_the_driver_keeps_serving(
    tmp_path, caplog, api
):
    """A corrupt wire format (the last claim's name one byte short: its
    length runs past the end) is InvalidArgument, not a prepare of claim
    "c"; random bodies are answered OK or InvalidArgument, never with an
    application error; then a good request is prepared as ever."""
    fake = FakeClaims()
    fake.allocate("c1", "uid-1", "u1")
    claims = make_claims(tmp_path, fake, DEVICES)
    pb = dra_v1_pb2 if api is v1 else dra_v1beta1_pb2
    package = pb.DESCRIPTOR.package
    good = pb.NodePrepareResourcesRequest(
        claims=[pb.Claim(namespace="ns", name="c1", uid="uid-1")]
    ).SerializeToString()
    caplog.set_level(logging.INFO, logger="grpclib")
    with trio.fail_after(LIMIT):
        async with asyncio_door(), trio.open_nursery() as nursery:
            await nursery.start(
                serve_driver, DRIVER, tmp_path / "reg", tmp_path / "plugins", claims, list
            )
            node = endpoint(tmp_path / "plugins", DRIVER)
            for method in ("NodePrepareResources", "NodeUnprepareResources"):
                path = f"/{package}.DRAPlugin/{method}"
                status, message, _ = await raw_call(node, path, good[:-1])
                assert status == "INVALID_ARGUMENT", (method, status, message)
                assert f"not a valid {method}Request message" in message
                seen = {(await raw_call(node, path, body))[0] for body in bodies(100)}
                assert seen <= {"OK", "INVALID_ARGUMENT"} and "INVALID_ARGUMENT" in seen
            assert fake.reads == 0  # nothing decoded wrongly was asked for
            prepare = f"/{package}.DRAPlugin/NodePrepareResources"
            status, _, reply = await raw_call(node, prepare, good)
            assert status == "OK"
            answer = pb.NodePrepareResourcesResponse.FromString(reply)
            assert list(answer.claims["uid-1"].devices[0].cdi_device_ids) == [
                f"{DRIVER}/claim=uid-1-u1"
            ]
            nursery.cancel_scope.cancel()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]


async def test_a_claim_reference_without_namespace_or_name_is_refused_locally(tmp_path):
    fake = FakeClaims()
    fake.allocate("c1", "uid-1", "u1")
    claims = make_claims(tmp_path, fake, DEVICES)
    with trio.fail_after(LIMIT):
        async with asyncio_door(), trio.open_nursery() as nursery:
            await nursery.start(
                serve_driver, DRIVER, tmp_path / "reg", tmp_path / "plugins", claims, list
            )
            request = v1.NodePrepareResourcesRequest(
                claims=[
                    v1.Claim(namespace="", name="c1", uid="uid-2"),
                    v1.Claim(namespace="ns", name="", uid="uid-3"),
                    v1.Claim(namespace="", name="", uid="uid-4"),
                    v1.Claim(namespace="ns", name="c1", uid="uid-1"),
                ]
            )
            answer = await call(
                endpoint(tmp_path / "plugins", DRIVER),
                lambda ch: v1.DraPluginStub(ch).node_prepare_resources(request),
            )
            nursery.cancel_scope.cancel()
    assert "<none>/c1 (UID uid-2) has an empty namespace:" in answer.claims["uid-2"].error
    assert "ns/<none> (UID uid-3) has an empty name:" in answer.claims["uid-3"].error
    assert "an empty namespace and an empty name" in answer.claims["uid-4"].error
    assert answer.claims["uid-1"].devices  # the good one beside them is prepared
    assert fake.reads == 1  # only for it
