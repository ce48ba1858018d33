"""The "api": "both" mode against the real thing on both sides: the kubelet's device
manager (dmharness, with its PodResources service) and its DRA manager
(draharness), the kit's scheduler, and `powerdev run` serving one resource
through both APIs. One device, one holder across the two: a device a pod
got through the device plugin API leaves the ResourceSlice until the pod
is gone; the scheduler then gives a claim the other one, which the device
plugin side reports Unhealthy until the claim is unprepared."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import trio

from powerdev.devtools.cdicheck import inject
from powerdev.devtools.devicemanager import DeviceManager
from powerdev.devtools.kit import CDICHECK, DMHARNESS
from powerdev.dra.names import slice_name
from tests.conftest import require_tool
from tests.dra.test_driver import LIMIT, RESOURCE, Node, dra_node, powerdev
from tests.dra.test_harness import RESOURCE_API

TIMEOUT_MS = 10000


@pytest.fixture
def dmharness():
    return require_tool(DMHARNESS)


@pytest.fixture
def cdicheck():
    return require_tool(CDICHECK)


def path_of(dev: Path) -> dict[str, str]:
    """Unit ID ("char-<major>-<minor>": these nodes have no identity) -> path."""
    numbers = {name: os.stat(dev / name).st_rdev for name in ("dra0", "dra1")}
    return {f"char-{os.major(n)}-{os.minor(n)}": f"/dev/{name}" for name, n in numbers.items()}


def device_paths(slice_: dict) -> list[str]:
    return sorted(d["attributes"]["path"]["string"] for d in slice_["spec"]["devices"])


@dataclass
class Sides:
    """The kubelet's device manager and the DRA node of one test."""

    dm: DeviceManager
    node: Node

    async def kubelet_shows(self, capacity: int, allocatable: int) -> None:
        reply = await self.dm.call("wait", capacity, allocatable, TIMEOUT_MS)
        assert reply["ok"], f"the kubelet shows {reply}"

    async def claim_ends(self, name: str) -> None:
        """Its pod has Succeeded, and the kubelet unprepares the claim."""
        await self.node.api.merge_patch(
            f"/api/v1/namespaces/{self.node.namespace}/pods/{name}/status",
            {"status": {"phase": "Succeeded"}},
        )
        await self.node.harness.unprepare(self.node.namespace, name)


@contextlib.asynccontextmanager
async def both_sides(
    api, control_plane, draharness, dmharness, tmp_path: Path, *options: str, **node_options: Any
) -> AsyncIterator[Sides]:
    """The device manager on the plugin directory (serving PodResources), and
    a DRA node whose config serves two devices with "api": "both"
    (`node_options`: dra_node's resource, driver and device_class)."""
    plugin_dir = tmp_path / "device-plugins"
    plugin_dir.mkdir()
    (tmp_path / "cdi").mkdir()  # the host's /var/run/cdi
    sockets = ("--pod-resources-socket", str(tmp_path / "pod-resources" / "kubelet.sock"))
    resource = node_options.get("resource", RESOURCE)
    async with DeviceManager.running(dmharness, tmp_path / "kubelet.log", resource) as dm:
        await dm.call("start", plugin_dir)
        async with dra_node(
            api,
            control_plane,
            draharness,
            tmp_path,
            ("dra0", "dra1"),
            both=True,
            options=(*sockets, *options),
            **node_options,
        ) as node:
            yield Sides(dm, node)


async def test_one_device_one_holder_across_the_device_plugin_api_and_dra(
    api, control_plane, draharness, dmharness, cdicheck, tmp_path
):
    with trio.fail_after(LIMIT):
        async with (
            both_sides(
                api,
                control_plane,
                draharness,
                dmharness,
                tmp_path,
                "--cdi-recheck-interval",
                "0.05",
            ) as sides,
            powerdev(sides.node),
        ):
            dm, node = sides.dm, sides.node
            slices = f"{RESOURCE_API}/resourceslices"
            name = slice_name(node.name, node.driver, RESOURCE, 0)

            async def slice_holds(*paths: str) -> None:
                await api.wait_for(slices, name, lambda s: device_paths(s) == list(paths))

            # Both sides offer both devices once the kubelet has said no pod holds any.
            await sides.kubelet_shows(2, 2)
            await slice_holds("/dev/dra0", "/dev/dra1")

            # A pod gets one through the device plugin API: it leaves the slice.
            admitted = await dm.call("admit", "p1", 1)
            assert admitted["admitted"], admitted
            (unit,) = admitted["device_ids"]
            held = path_of(tmp_path / "dev")[unit]
            (free,) = {"/dev/dra0", "/dev/dra1"} - {held}
            await slice_holds(free)

            # The scheduler can give a claim only the other; prepared, it is
            # Unhealthy for the device plugin side (capacity 2, allocatable 1).
            claim = await node.pod_with_claim("c1")
            assert claim["status"]["allocation"]["devices"]["results"]
            prepared = await node.harness.prepare(node.namespace, "c1")
            resolved = inject(cdicheck, [node.cdi], prepared["c0"])
            assert resolved["ok"], resolved
            assert [d["path"] for d in resolved["linuxDevices"]] == [free]
            await sides.kubelet_shows(2, 1)
            refused = await dm.call("admit", "p2", 1)  # nothing healthy is free
            assert not refused["admitted"], refused

            # p1 ends: the kubelet lists it no more, and its device returns to DRA.
            await dm.call("delpod", "p1")
            await slice_holds("/dev/dra0", "/dev/dra1")

            # The claim's pod ends: unprepared, its device is healthy again.
            await sides.claim_ends("c1")
            await sides.kubelet_shows(2, 2)


async def test_a_restart_onto_the_device_plugin_api_keeps_a_claims_device_until_unprepared(
    api, control_plane, draharness, dmharness, tmp_path
):
    """A claim prepared under "both"; powerdev restarts with the resource on
    the device plugin API alone. The checkpoint starts the driver anyway, so
    the claim's device is Unhealthy for the kubelet's device manager from the
    start, and the kubelet can still unprepare the claim, which frees it."""
    with trio.fail_after(LIMIT):
        async with both_sides(api, control_plane, draharness, dmharness, tmp_path) as sides:
            node = sides.node
            async with powerdev(node):
                await sides.kubelet_shows(2, 2)
                await node.pod_with_claim("c1")
                await node.harness.prepare(node.namespace, "c1")
                await sides.kubelet_shows(2, 1)
            config = tmp_path / "config.json"
            (entry,) = json.loads(config.read_text())["resources"]
            entry["api"] = "device-plugin"
            config.write_text(json.dumps({"resources": [entry]}))
            async with powerdev(node):  # registered: the checkpoint started the driver
                await sides.kubelet_shows(2, 1)
                await sides.claim_ends("c1")
                await sides.kubelet_shows(2, 2)


async def test_a_restart_whose_kubeconfig_cannot_be_used_keeps_a_claims_device_held(
    api, control_plane, draharness, dmharness, tmp_path
):
    """A claim prepared under "both"; powerdev restarts with the resource on
    the device plugin API alone and a kubeconfig that does not parse (a
    token gone, say: with no DRA resource, the start does not refuse it).
    The checkpoint is loaded all the same: the claim's device stays
    Unhealthy for the kubelet's device manager, and the kubelet can
    unprepare the claim without the API server, which frees it."""
    with trio.fail_after(LIMIT):
        async with both_sides(api, control_plane, draharness, dmharness, tmp_path) as sides:
            node = sides.node
            async with powerdev(node):
                await sides.kubelet_shows(2, 2)
                await node.pod_with_claim("c1")
                await node.harness.prepare(node.namespace, "c1")
                await sides.kubelet_shows(2, 1)
            config = tmp_path / "config.json"
            (entry,) = json.loads(config.read_text())["resources"]
            entry["api"] = "device-plugin"
            config.write_text(json.dumps({"resources": [entry]}))
            broken = tmp_path / "broken-kubeconfig"
            broken.write_text("{{ not: yaml")
            given = str(control_plane.kubeconfig)
            command = [str(broken) if arg == given else arg for arg in node.command]
            assert command != node.command
            async with powerdev(replace(node, command=command)):  # registered all the same
                await sides.kubelet_shows(2, 1)
                await sides.claim_ends("c1")
                await sides.kubelet_shows(2, 2)


async def test_a_checkpoint_entry_that_does_not_parse_keeps_its_device_held_and_serves_on(
    api, control_plane, draharness, dmharness, tmp_path
):
    """A claim prepared under "both"; while powerdev is down its checkpoint
    entry loses "devices". powerdev starts all the same and says so; the
    claim's device stays Unhealthy for the kubelet's device manager (held
    from the claim's CDI spec), and the kubelet's unprepare of the claim
    frees it and forgets the entry."""
    with trio.fail_after(LIMIT):
        async with both_sides(api, control_plane, draharness, dmharness, tmp_path) as sides:
            node = sides.node
            async with powerdev(node):
                await sides.kubelet_shows(2, 2)
                await node.pod_with_claim("c1")
                first = await node.harness.prepare(node.namespace, "c1")
                await sides.kubelet_shows(2, 1)
            checkpoint = tmp_path / "plugins" / node.driver / "checkpoint.json"
            data = json.loads(checkpoint.read_text())
            (entry,) = data["claims"].values()
            del entry["devices"]
            checkpoint.write_text(json.dumps(data))
            async with powerdev(node) as proc:  # registered: it did not crash
                await sides.kubelet_shows(2, 1)
                # the kubelet answers from its own checkpoint: no call is made
                assert await node.harness.prepare(node.namespace, "c1") == first
                await sides.claim_ends("c1")
                await sides.kubelet_shows(2, 2)
                assert json.loads(checkpoint.read_text())["claims"] == {}
                assert proc.returncode is None
