"""The health of prepared devices, as the kubelet's own DRA manager sees
it: `powerdev run` serves the DRA health stream (v1alpha1
NodeWatchResources) on its DRA socket, the harness's kubelet opens it when
it registers the driver (the ResourceHealthStatus feature gate is on by
default at v1.36), and its health cache is what the pod's
`allocatedResourcesStatus` is made of (the harness's `health` and
`waithealth`). A prepared device that disappears is reported Unhealthy for
the pod's container and leaves the slice; when it comes back it is
Healthy again and published again. A prepared block device (a loop
device bound to a 1 MiB file, chosen by the real scheduler through a CEL
selector on its `size` capacity) that the host starts using is Unhealthy,
and Healthy when the host lets go of it. The stream itself, over a real
socket: the whole list at once, then each change, to every stream."""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path

import pytest
import trio
import trio_asyncio
from grpclib.client import Channel

from powerdev._proto.k8s.io.kubelet.pkg.apis.dra import v1
from powerdev._proto.v1alpha1 import DraResourceHealthStub, HealthStatus, NodeWatchResourcesRequest
from powerdev.devtools.testing import bound, is_root, loop_control
from powerdev.dra.claims import ClaimRef
from powerdev.dra.names import endpoint, slice_name
from powerdev.rpc import asyncio_door
from powerdev.rpc.dra_service import serve_driver
from tests.dra.test_driver import LIMIT, RESOURCE, Node, dra_node, powerdev
from tests.dra.test_driver_services import call
from tests.dra.test_harness import RESOURCE_API
from tests.unit.test_dra import DEVICES, DRIVER, POOL, FakeClaims, dev, make_claims

SLICES = f"{RESOURCE_API}/resourceslices"
WAIT_MS = 15_000


async def claim_on(node: Node, name: str, path: str | None = None, cel: str = "") -> dict:
    """A claim for the device at `path` (a CEL selector on its path
    attribute) or that `cel` selects, a pod using it in container c0,
    bound: the claim."""
    cel = cel or f'device.attributes["{node.driver}"].path == "{path}"'
    return await node.pod_with_claim(name, cel=cel)


async def wait_health(node: Node, pod: str, health: str) -> dict[str, list[dict]]:
    """Until the kubelet's DRA manager reports every device the pod holds
    as `health`: container name -> its AllocatedResourcesStatus."""
    answer = await node.harness.call("waithealth", f"{node.namespace}/{pod}", health, WAIT_MS)
    return answer["containers"]  # type: ignore[no-any-return]


def published(item: dict) -> list[str]:
    return sorted(d["attributes"]["path"]["string"] for d in item["spec"]["devices"])


@pytest.mark.skipif(not is_root(), reason="needs root: distinct nodes (mknod)")
async def test_a_prepared_device_that_goes_is_unhealthy_for_the_pod_and_healthy_when_back(
    api, control_plane, draharness, tmp_path
):
    with trio.fail_after(LIMIT):
        async with (
            dra_node(api, control_plane, draharness, tmp_path, ("dra0", "dra1")) as node,
            powerdev(node),
        ):
            claim = await claim_on(node, "p1", "/dev/dra0")
            uid = claim["metadata"]["uid"]
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            cdi_id = f"{node.driver}/claim={uid}-{result['device']}"
            assert await node.harness.prepare(node.namespace, "p1") == {"c0": [cdi_id]}
            healthy = {
                "c0": [
                    {
                        "name": "claim:dev",
                        "resources": [{"resourceID": cdi_id, "health": "Healthy"}],
                    }
                ]
            }
            assert await wait_health(node, "p1", "Healthy") == healthy

            # The node goes: Unhealthy for c0, with why, and out of the slice.
            node_path = tmp_path / "dev" / "dra0"
            number = node_path.stat().st_rdev
            node_path.unlink()
            (status,) = (await wait_health(node, "p1", "Unhealthy"))["c0"]
            (resource,) = status["resources"]
            assert resource["resourceID"] == cdi_id
            assert "gone: /dev/dra0 no longer on the host" in resource["message"]
            first = slice_name(node.name, node.driver, RESOURCE, 0)
            await api.wait_for(SLICES, first, lambda s: published(s) == ["/dev/dra1"])
            # The manager asked the kubelet to write the pod's status again.
            updates = (await node.harness.call("updates"))["updates"]
            assert any(claim_pod_uid(claim, node) in u["pods"] for u in updates)

            # Back, the same device under the same name: Healthy, published.
            os.mknod(node_path, stat.S_IFCHR | 0o600, number)
            assert await wait_health(node, "p1", "Healthy") == healthy
            await api.wait_for(SLICES, first, lambda s: "/dev/dra0" in published(s))


LOOP = 380  # a loop device of our own (powerdev.devtools.testing: 300-399)


def mount_table(path: Path, extra: str = "") -> Path:
    """A host mount table for powerdev: this process's, and `extra` lines."""
    path.write_text(Path("/proc/self/mountinfo").read_text() + extra)
    return path


@pytest.mark.skipif(not is_root(), reason="needs root: a loop device, mknod")
async def test_a_prepared_block_device_the_host_starts_using_is_unhealthy_until_let_go(
    api, control_plane, draharness, tmp_path
):
    backing = tmp_path / "backing"
    backing.write_bytes(b"\0" * (1 << 20))
    mountinfo = mount_table(tmp_path / "mountinfo")
    with trio.fail_after(LIMIT), loop_control() as loops:
        loops.add(LOOP)
        with bound(f"/dev/loop{LOOP}", backing):
            number = os.stat(f"/dev/loop{LOOP}").st_rdev
            async with dra_node(api, control_plane, draharness, tmp_path) as node:
                os.mknod(tmp_path / "dev" / "dralun", stat.S_IFBLK | 0o600, number)
                node.command = [*node.command, "--host-mountinfo", str(mountinfo)]
                async with powerdev(node) as proc:
                    attributes = f'device.attributes["{node.driver}"]'
                    size = f'device.capacity["{node.driver}"].size'
                    cel = f'{attributes}.kind == "block" && {size}.compareTo(quantity("1Mi")) == 0'
                    claim = await claim_on(node, "p1", cel=cel)
                    (result,) = claim["status"]["allocation"]["devices"]["results"]
                    first = slice_name(node.name, node.driver, RESOURCE, 0)
                    item = await api.get(f"{SLICES}/{first}")
                    (chosen,) = [
                        d for d in item["spec"]["devices"] if d["name"] == result["device"]
                    ]
                    assert chosen["attributes"]["path"] == {"string": "/dev/dralun"}
                    assert chosen["capacity"] == {"size": {"value": str(1 << 20)}}
                    await node.harness.prepare(node.namespace, "p1")
                    await wait_health(node, "p1", "Healthy")

                    # The host mounts it (as its mount table says), and
                    # powerdev looks again (SIGHUP: a rescan).
                    major, minor = os.major(number), os.minor(number)
                    line = f"999 1 {major}:{minor} / /mnt/host rw - ext4 /dev/loop{LOOP} rw\n"
                    mount_table(mountinfo, line)
                    proc.send_signal(signal.SIGHUP)
                    (status,) = (await wait_health(node, "p1", "Unhealthy"))["c0"]
                    (resource,) = status["resources"]
                    said = resource["message"]
                    assert "/dev/dralun: the host uses it: mounted at /mnt/host" in said, said
                    await api.wait_for(SLICES, first, lambda s: "/dev/dralun" not in published(s))

                    # Let go: Healthy, and published again.
                    mount_table(mountinfo)
                    proc.send_signal(signal.SIGHUP)
                    await wait_health(node, "p1", "Healthy")
                    await api.wait_for(SLICES, first, lambda s: "/dev/dralun" in published(s))


def claim_pod_uid(claim: dict, node: Node) -> str:
    (reserved,) = claim["status"]["reservedFor"]
    return reserved["uid"]  # type: ignore[no-any-return]


async def watch(path, send: trio.MemorySendChannel, count: int) -> None:
    """The first `count` messages of a NodeWatchResources stream, into
    `send`; then the stream is left (never cancelled mid-read)."""

    async def run():
        channel = Channel(path=str(path))
        try:
            stub = DraResourceHealthStub(channel)
            got = 0
            async for message in stub.node_watch_resources(NodeWatchResourcesRequest()):
                await trio_asyncio.trio_as_aio(send.send)(message)
                got += 1
                if got == count:
                    break
        finally:
            channel.close()

    await trio_asyncio.aio_as_trio(run)()


async def test_the_health_stream_sends_the_whole_list_at_once_then_each_change(tmp_path):
    api = FakeClaims()
    api.allocate("c1", "uid-1", "u1")
    claims = make_claims(tmp_path, api, DEVICES)
    await claims.prepare(ClaimRef("ns", "c1", "uid-1"))
    (plugin,) = claims.plugins()
    registry, plugins = tmp_path / "plugins_registry", tmp_path / "plugins"
    with trio.fail_after(10):
        async with asyncio_door(), trio.open_nursery() as nursery:
            await nursery.start(serve_driver, DRIVER, registry, plugins, claims, lambda: None)
            socket = endpoint(plugins, DRIVER)
            # Each stream reads its three messages and leaves, before the
            # server closes.
            async with trio.open_nursery() as watching:
                streams = []
                for _ in range(2):  # two streams, each with its own messages
                    send, receive = trio.open_memory_channel(0)
                    watching.start_soon(watch, socket, send, 3)
                    streams.append(receive)
                for receive in streams:
                    ((device,),) = [(await receive.receive()).devices]
                    assert (device.device.pool_name, device.device.device_name) == (POOL, "u1")
                    assert device.health == HealthStatus.HEALTHY
                    assert device.health_check_timeout_seconds == 30
                    assert device.last_updated_time > 0
                # A change that leaves the list as it was sends nothing; the removal does.
                plugin.inventory.update({"/dev/sdx": dev("/dev/sdx", 99, unit="u9")})
                plugin.inventory.update({"/dev/sdb": None})
                for receive in streams:
                    (gone,) = (await receive.receive()).devices
                    assert gone.health == HealthStatus.UNHEALTHY
                    assert "/dev/sdb no longer on the host" in gone.message
                # Unprepared (as the kubelet does it): the next list is empty.
                undo = v1.NodeUnprepareResourcesRequest(
                    claims=[v1.Claim(namespace="ns", name="c1", uid="uid-1")]
                )
                answer = await call(
                    socket, lambda ch: v1.DraPluginStub(ch).node_unprepare_resources(undo)
                )
                assert answer.claims["uid-1"].error == ""
                assert [(await r.receive()).devices for r in streams] == [[], []]
            nursery.cancel_scope.cancel()
