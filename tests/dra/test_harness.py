"""The conformance kit's DRA harness (the kubelet's own DRA manager and
plugin manager, conformance/draharness) against a tiny DRA driver written
here (tiny_driver.py) and the kit's real control plane: registration
through plugins_registry/, a claim allocated by the real scheduler,
prepared and unprepared through the driver, and the checkpoint that
outlives a kubelet restart. These are the groundwork for powerdev's own DRA
driver (issue 21): what the real kubelet does, shown on a driver of a few
lines."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import trio

from powerdev.devtools.cluster.client import Api, ApiError, container, pod
from powerdev.devtools.cluster.controlplane import ControlPlane
from powerdev.devtools.draharness import DRAHarness
from powerdev.rpc import asyncio_door
from tests.dra.tiny_driver import SERVICE, TinyDriver

RESOURCE_API = "/apis/resource.k8s.io/v1"
CDI_ID = "powerdev.test/dra=dev-0"
TAINT = "powerdev.test/dra-node"  # keeps every other test's pods off these nodes


def dirs(root: Path) -> tuple[Path, Path, Path]:
    return root / "plugins_registry", root / "plugins", root / "state"


async def test_the_harness_starts_with_no_drivers_and_an_empty_checkpoint(draharness, tmp_path):
    with trio.fail_after(20):
        async with DRAHarness.running(draharness, tmp_path / "h.log", node_name="n") as harness:
            assert await harness.drivers() == []
            started = await harness.start(*dirs(tmp_path))
            assert started["registry_dir"] == str(tmp_path / "plugins_registry")
            assert (tmp_path / "plugins_registry").is_dir()
            assert await harness.drivers() == []
            checkpoint = await harness.checkpoint()
            assert checkpoint["path"] == str(tmp_path / "state" / "dra_manager_state")
            assert checkpoint["data"]["kind"] == "DRACheckpoint"
            assert not checkpoint["data"]["ClaimInfoStateList"]
            answer = await harness.send("start", *dirs(tmp_path))
            assert "started already" in answer["error"]
            answer = await harness.send("prepare", "default/nobody")
            assert "-kubeconfig" in answer["error"]


async def test_a_driver_is_found_registered_told_and_let_go(draharness, tmp_path):
    registry, plugins, state = dirs(tmp_path)
    driver = TinyDriver("tiny.dra.powerdev.test", registry, plugins, CDI_ID)
    with trio.fail_after(30):
        async with (
            DRAHarness.running(draharness, tmp_path / "h.log", node_name="n") as harness,
            asyncio_door(),
            trio.open_nursery() as nursery,
        ):
            await harness.start(registry, plugins, state)
            scope = trio.CancelScope()

            async def serve_driver(task_status=trio.TASK_STATUS_IGNORED):
                with scope:
                    await driver.run(task_status=task_status)

            await nursery.start(serve_driver)
            (found,) = await harness.wait_driver(driver.name)
            assert found["name"] == driver.name
            assert found["endpoint"] == str(driver.endpoint)
            assert found["versions"] == [SERVICE]
            assert found["under_plugins_dir"] is True
            await driver.wait_until(lambda d: d.of("status"))
            (status,) = driver.of("status")
            assert status.plugin_registered is True
            assert status.error == ""
            # The driver goes (its sockets removed): the plugin manager sees
            # the registration socket deleted and deregisters it.
            scope.cancel()
            await harness.wait_gone(driver.name)
            assert await harness.drivers() == []
            calls = [e["call"] for e in (await harness.call("events"))["events"]]
            assert calls == ["validate", "register", "deregister"]


@dataclass
class DRANode:
    """A Node with one DRA driver's pool on it, its kubelet (the harness)
    and the driver; a namespace and a DeviceClass of their own."""

    name: str
    api: Api
    harness: DRAHarness
    driver: TinyDriver
    device_class: str

    @property
    def namespace(self) -> str:
        return self.name

    async def pod_with_claim(self, name: str) -> dict:
        """A ResourceClaim for one device of the class and a pod that uses
        it in container c0, once the scheduler has bound the pod (and so
        allocated and reserved the claim)."""
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {
                "devices": {
                    "requests": [{"name": "dev", "exactly": {"deviceClassName": self.device_class}}]
                }
            },
        }
        await self.api.create(f"{RESOURCE_API}/namespaces/{self.namespace}/resourceclaims", claim)
        c0 = container("c0", {"claims": [{"name": "dev"}]})
        body = pod(
            name,
            c0,
            resourceClaims=[{"name": "dev", "resourceClaimName": name}],
            tolerations=[{"key": TAINT, "operator": "Equal", "value": self.name}],
        )
        await self.api.create_pod(self.namespace, body)
        pods = f"/api/v1/namespaces/{self.namespace}/pods"
        return await self.api.wait_for(pods, name, lambda p: p["spec"].get("nodeName") == self.name)

    async def claim(self, name: str) -> dict:
        claims = f"{RESOURCE_API}/namespaces/{self.namespace}/resourceclaims"
        return await self.api.get(f"{claims}/{name}")

    async def end_pod(self, name: str) -> None:
        """No kubelet runs it: the test ends it (the claim is then released)."""
        await self.api.merge_patch(
            f"/api/v1/namespaces/{self.namespace}/pods/{name}/status",
            {"status": {"phase": "Succeeded"}},
        )


@contextlib.asynccontextmanager
async def dra_node(
    api: Api, plane: ControlPlane, draharness: Path, tmp_path: Path
) -> AsyncIterator[DRANode]:
    """The Node (Ready, without the not-ready taint, with a taint of ours),
    a namespace with its default ServiceAccount, the harness as the node's
    kubelet (its start-up wipe of the node's ResourceSlices done), the
    driver registered, a DeviceClass for the driver's devices and the
    node's ResourceSlice with one device. The slice and the class are
    deleted on the way out."""
    name = f"dra-{secrets.token_hex(3)}"
    driver_name = f"{name}.powerdev.test"
    await api.create_node(name, taints=[{"key": TAINT, "value": name, "effect": "NoSchedule"}])
    await api.create_namespace(name)
    registry, plugins, state = dirs(tmp_path)
    driver = TinyDriver(driver_name, registry, plugins, CDI_ID, pool=name)
    log = tmp_path / "draharness.log"
    async with (
        DRAHarness.running(draharness, log, node_name=name, kubeconfig=plane.kubeconfig) as harness,
        asyncio_door(),
        trio.open_nursery() as nursery,
    ):
        await harness.start(registry, plugins, state)
        # A starting kubelet deletes its node's ResourceSlices: a slice made
        # before that would be gone.
        (wipe,) = await harness.wait_wipe(1)
        assert wipe["field_selector"] == f"spec.nodeName={name}"
        await nursery.start(driver.run)
        await harness.wait_driver(driver_name)
        device_class = f"{name}-class"
        selector = {"cel": {"expression": f'device.driver == "{driver_name}"'}}
        await api.create(
            f"{RESOURCE_API}/deviceclasses",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": device_class},
                "spec": {"selectors": [selector]},
            },
        )
        await api.create(
            f"{RESOURCE_API}/resourceslices",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{name}-slice"},
                "spec": {
                    "driver": driver_name,
                    "nodeName": name,
                    "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": "dev-0"}],
                },
            },
        )
        try:
            yield DRANode(name, api, harness, driver, device_class)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                for made in (f"resourceslices/{name}-slice", f"deviceclasses/{device_class}"):
                    with contextlib.suppress(ApiError):  # 404: a kubelet start wiped the slice
                        await api.delete(f"{RESOURCE_API}/{made}")
            nursery.cancel_scope.cancel()


async def test_a_scheduled_claim_is_prepared_and_unprepared_through_the_driver(
    api, control_plane, draharness, tmp_path
):
    with trio.fail_after(60):
        async with dra_node(api, control_plane, draharness, tmp_path) as node:
            bound = await node.pod_with_claim("p1")
            claim = await node.claim("p1")
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            assert (result["driver"], result["pool"], result["device"]) == (
                node.driver.name,
                node.name,
                "dev-0",
            )
            assert [r["uid"] for r in claim["status"]["reservedFor"]] == [bound["metadata"]["uid"]]

            assert await node.harness.prepare(node.namespace, "p1") == {"c0": [CDI_ID]}
            (asked,) = node.driver.of("prepare")
            assert [(c.namespace, c.name, c.uid) for c in asked] == [
                (node.namespace, "p1", claim["metadata"]["uid"])
            ]
            assert await node.harness.resources(node.namespace, "p1") == {"c0": [CDI_ID]}
            (held,) = (await node.harness.checkpoint())["data"]["ClaimInfoStateList"]
            assert held["ClaimUID"] == claim["metadata"]["uid"]
            assert held["PodUIDs"] == {bound["metadata"]["uid"]: {}}
            # The tiny driver serves no health stream (DRAResourceHealth): Unknown.
            health = await node.harness.call("health", f"{node.namespace}/p1")
            assert health["containers"] == {
                "c0": [
                    {
                        "name": "claim:dev",
                        "resources": [{"resourceID": CDI_ID, "health": "Unknown"}],
                    }
                ]
            }

            await node.end_pod("p1")
            await node.harness.unprepare(node.namespace, "p1")
            (let_go,) = node.driver.of("unprepare")
            assert [c.uid for c in let_go] == [claim["metadata"]["uid"]]
            assert not (await node.harness.checkpoint())["data"]["ClaimInfoStateList"]


async def test_after_a_kubelet_restart_a_prepared_claim_still_resolves(
    api, control_plane, draharness, tmp_path
):
    """What a kubelet restart does to a driver, shown at the kit's release:
    the node's ResourceSlices are deleted (the driver must publish them
    again); the checkpoint gives the new manager the claim's CDI IDs at
    once; the next prepare asks the driver again (the "prepared" mark is not
    in the checkpoint), so a driver must answer the same for a claim it
    already prepared, from its own checkpoint and with its CDI spec still
    (or again) on disk."""
    with trio.fail_after(60):
        async with dra_node(api, control_plane, draharness, tmp_path) as node:
            await node.pod_with_claim("p1")
            assert await node.harness.prepare(node.namespace, "p1") == {"c0": [CDI_ID]}
            await node.harness.restart()
            assert await node.harness.resources(node.namespace, "p1") == {"c0": [CDI_ID]}
            (wipe,) = await node.harness.wait_wipe(1)
            assert wipe["field_selector"] == f"spec.nodeName={node.name}"
            slices = await api.get(
                f"{RESOURCE_API}/resourceslices", fieldSelector=f"spec.nodeName={node.name}"
            )
            assert slices["items"] == []
            await node.harness.wait_driver(node.driver.name)
            assert len(node.driver.of("get_info")) == 2  # found anew by the new plugin manager
            # What the driver answers is the claim's own ID and nothing else.
            # (v1.36.3 appends that answer to the IDs restored from the
            # checkpoint, kubernetes#140471, fixed upstream after this
            # release: the same name may come twice, which a runtime
            # resolves once. Neither count is asserted here.)
            again = await node.harness.prepare(node.namespace, "p1")
            assert again.keys() == {"c0"} and set(again["c0"]) == {CDI_ID}
            assert len(node.driver.of("prepare")) == 2
            await node.end_pod("p1")
            await node.harness.unprepare(node.namespace, "p1")
            assert len(node.driver.of("unprepare")) == 1
