"""The "api": "both" mode against the real thing on both sides: the kubelet's device
manager (dmharness, with its PodResources service) and its DRA manager
(draharness), the kit's scheduler, and `powerdev run` serving one resource
through both APIs. One device, one holder across the two: a device a pod
got through the device plugin API leaves the ResourceSlice until the pod
is gone; the scheduler then gives a claim the other one, which the device
plugin side reports Unhealthy until the claim is unprepared."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio

from powerdev.devtools.cdicheck import inject
from powerdev.devtools.devicemanager import DeviceManager
from powerdev.devtools.kit import CDICHECK, DMHARNESS
from powerdev.dra.names import slice_name
from tests.conftest import require_tool
from tests.dra.test_driver import LIMIT, RESOURCE, dra_node, powerdev
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


async def test_one_device_one_holder_across_the_device_plugin_api_and_dra(
    api,
    control_plane,
    draharness,
    dmharness,
    cdicheck,
    tmp_path,
):
    plugin_dir = tmp_path / "device-plugins"
    plugin_dir.mkdir()
    (tmp_path / "cdi").mkdir()  # the host's /var/run/cdi
    options = (
        "--pod-resources-socket",  # the device manager harness serves PodResources here
        str(tmp_path / "pod-resources" / "kubelet.sock"),
        "--cdi-recheck-interval",
        "0.05",
    )
    with trio.fail_after(LIMIT):
        async with (
            DeviceManager.running(dmharness, tmp_path / "kubelet.log", RESOURCE) as dm,
        ):
            await dm.call("start", plugin_dir)
            async with (
                dra_node(
                    api,
                    control_plane,
                    draharness,
                    tmp_path,
                    ("dra0", "dra1"),
                    both=True,
                    options=options,
                ) as node,
                powerdev(node),
            ):
                slices = f"{RESOURCE_API}/resourceslices"
                name = slice_name(node.name, node.driver, RESOURCE, 0)

                async def slice_holds(*paths: str) -> None:
                    await api.wait_for(slices, name, lambda s: device_paths(s) == list(paths))

                async def kubelet_shows(capacity: int, allocatable: int) -> None:
                    reply = await dm.call("wait", capacity, allocatable, TIMEOUT_MS)
                    assert reply["ok"], f"the kubelet shows {reply}"

                # Both sides offer both devices once the kubelet has said no pod holds any.
                await kubelet_shows(2, 2)
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
                await kubelet_shows(2, 1)
                refused = await dm.call("admit", "p2", 1)  # nothing healthy is free
                assert not refused["admitted"], refused

                # p1 ends: the kubelet lists it no more, and its device returns to DRA.
                await dm.call("delpod", "p1")
                await slice_holds("/dev/dra0", "/dev/dra1")

                # The claim's pod ends: unprepared, its device is healthy again.
                await api.merge_patch(
                    f"/api/v1/namespaces/{node.namespace}/pods/c1/status",
                    {"status": {"phase": "Succeeded"}},
                )
                await node.harness.unprepare(node.namespace, "c1")
                await kubelet_shows(2, 2)


async def test_a_restart_onto_the_device_plugin_api_keeps_a_claims_device_until_unprepared(
    api, control_plane, draharness, dmharness, tmp_path
):
    """A claim prepared under "both"; powerdev restarts with the resource on
    the device plugin API alone. The checkpoint starts the driver anyway, so
    the claim's device is Unhealthy for the kubelet's device manager from the
    start, and the kubelet can still unprepare the claim, which frees it."""
    plugin_dir = tmp_path / "device-plugins"
    plugin_dir.mkdir()
    (tmp_path / "cdi").mkdir()
    options = ("--pod-resources-socket", str(tmp_path / "pod-resources" / "kubelet.sock"))
    with trio.fail_after(LIMIT):
        async with DeviceManager.running(dmharness, tmp_path / "kubelet.log", RESOURCE) as dm:
            await dm.call("start", plugin_dir)

            async def kubelet_shows(capacity: int, allocatable: int) -> None:
                reply = await dm.call("wait", capacity, allocatable, TIMEOUT_MS)
                assert reply["ok"], f"the kubelet shows {reply}"

            async with dra_node(
                api,
                control_plane,
                draharness,
                tmp_path,
                ("dra0", "dra1"),
                both=True,
                options=options,
            ) as node:
                async with powerdev(node):
                    await kubelet_shows(2, 2)
                    await node.pod_with_claim("c1")
                    await node.harness.prepare(node.namespace, "c1")
                    await kubelet_shows(2, 1)
                config = tmp_path / "config.json"
                (entry,) = json.loads(config.read_text())["resources"]
                entry["api"] = "device-plugin"
                config.write_text(json.dumps({"resources": [entry]}))
                async with powerdev(node):  # registered: the checkpoint started the driver
                    await kubelet_shows(2, 1)
                    await api.merge_patch(
                        f"/api/v1/namespaces/{node.namespace}/pods/c1/status",
                        {"status": {"phase": "Succeeded"}},
                    )
                    await node.harness.unprepare(node.namespace, "c1")
                    await kubelet_shows(2, 2)
