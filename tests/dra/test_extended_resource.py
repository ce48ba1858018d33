"""Pods unchanged: a pod that asks for power-dev-plugin/dev in
resources.limits, as it asks IBM's plugin and powerdev's device plugin,
served through DRA by deploy/dra's DeviceClass (spec.extendedResourceName).
The kit's real scheduler makes the pod's claim and allocates it from
powerdev's pool; the kubelet's own DRA manager (draharness) finds the claim
from the pod's status.extendedResourceClaimStatus and has powerdev prepare
it; the CDI IDs it gives the container resolve, through the kit's CDI
library, to exactly the allocated device node.

And the rule on one node: where the node's status shows the same extended
resource allocatable (a device plugin advertises it; here the status is
patched through the API server, as no kubelet runs), the scheduler serves
the pod through the device plugin there, makes no claim, and leaves the
pool's devices alone; back at 0, the next pod is served through DRA.

And the migration on one node, with the kubelet's device manager
(dmharness) too: a "both" node serves an unchanged pod through the device
plugin API; moved to "dra" (a reload, or a restart of powerdev), it serves
the next one through DRA, and keeps out of its pool the device the first
pod holds until the kubelet's PodResources API no longer lists that pod.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio
import yaml

from powerdev.cli import build_parser
from powerdev.devtools.cdicheck import inject
from powerdev.devtools.cluster.client import Api, container, pod
from powerdev.devtools.kit import CDICHECK
from powerdev.devtools.testing import NODE_MAJOR, is_root
from powerdev.dra.names import pool_name, slice_name
from tests.conftest import require_tool
from tests.dra.test_both import both_sides, device_paths, dmharness, path_of
from tests.dra.test_driver import GID, LIMIT, MODE, UID, Node, dra_node, nodes_of, powerdev
from tests.dra.test_harness import RESOURCE_API, TAINT

__all__ = ["dmharness"]  # a fixture

pytestmark = pytest.mark.skipif(not is_root(), reason="needs root: distinct nodes (mknod)")

DEFAULTS = build_parser().parse_args(["run"])
DRIVER = DEFAULTS.dra_driver  # dra.powerdev.io, as deploy/dra names it
RESOURCE = DEFAULTS.resource_name  # power-dev-plugin/dev: the device plugin's name
SHIPPED_CLASS = Path(__file__).parents[2] / "deploy" / "dra" / "deviceclass.yaml"
# What the scheduler puts on the claim it makes for a pod's extended resources.
EXTENDED_CLAIM = "resource.kubernetes.io/extended-resource-claim"
# A node label the tests set after each change of the node's status: a pod
# that selects it is scheduled only once the scheduler has seen that change.
SEEN = "powerdev.test/status-seen"
SLICES = f"{RESOURCE_API}/resourceslices"


@pytest.fixture
def cdicheck() -> Path:
    return require_tool(CDICHECK)


def shipped_class() -> dict:
    doc = yaml.safe_load(SHIPPED_CLASS.read_text())
    assert doc["spec"]["extendedResourceName"] == RESOURCE
    return doc


async def create_unchanged_pod(node: Node, name: str, seen: str | None = None) -> None:
    """A pod as it was written for the device plugin: power-dev-plugin/dev: 1
    in its container's limits, no claim. Kept to the node (its taint), and
    with `seen`, to the node once the scheduler has seen that mark."""
    spec: dict = {
        "tolerations": [{"key": TAINT, "operator": "Equal", "value": node.name}],
    }
    if seen is not None:
        spec["nodeSelector"] = {SEEN: seen}
    body = pod(name, container("c0", {"limits": {RESOURCE: "1"}}), **spec)
    await node.api.create_pod(node.namespace, body)


async def bound(node: Node, name: str) -> dict:
    pods = f"/api/v1/namespaces/{node.namespace}/pods"
    return await node.api.wait_for(pods, name, lambda p: p["spec"].get("nodeName") == node.name)


async def unchanged_pod(node: Node, name: str, seen: str | None = None) -> dict:
    """create_unchanged_pod(), once the scheduler has bound it."""
    await create_unchanged_pod(node, name, seen)
    return await bound(node, name)


async def node_advertises(api: Api, node: str, allocatable: int, seen: str) -> None:
    """The node's status shows `allocatable` units of the extended resource,
    as a kubelet shows what a device plugin lists healthy; then the mark
    `seen`, which the scheduler sees after the status (one object's events
    come in order)."""
    units = str(allocatable)
    await api.merge_patch(
        f"/api/v1/nodes/{node}/status",
        {"status": {"capacity": {RESOURCE: units}, "allocatable": {RESOURCE: units}}},
    )
    await api.merge_patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {SEEN: seen}}})


async def extended_claim(node: Node, bound: dict) -> dict:
    """The claim the scheduler made for a bound pod, checked (below)."""
    return await checked_extended_claim(node.api, node.namespace, node.name, bound)


async def checked_extended_claim(api: Api, namespace: str, node: str, bound: dict) -> dict:
    """The claim the scheduler made for a pod bound to `node`, from the
    pod's status.extendedResourceClaimStatus: checked to be the
    scheduler's, for this pod, of the shipped class, allocated from
    powerdev's pool on the node and reserved for the pod."""
    status = bound["status"]["extendedResourceClaimStatus"]
    claims = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims"
    claim = await api.get(f"{claims}/{status['resourceClaimName']}")
    meta = claim["metadata"]
    assert meta["name"].startswith(f"{bound['metadata']['name']}-extended-resources-")
    assert meta["annotations"][EXTENDED_CLAIM] == "true"
    (owner,) = meta["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "Pod",
        bound["metadata"]["uid"],
        True,
    )
    (request,) = claim["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == shipped_class()["metadata"]["name"]
    assert request["exactly"]["count"] == 1
    (mapping,) = status["requestMappings"]
    assert mapping == {
        "containerName": "c0",
        "resourceName": RESOURCE,
        "requestName": request["name"],
    }
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"], result["request"]) == (
        DRIVER,
        pool_name(node, RESOURCE),
        request["name"],
    )
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [bound["metadata"]["uid"]]
    return claim


async def claim_names(node: Node) -> list[str]:
    listing = await node.api.get(f"{RESOURCE_API}/namespaces/{node.namespace}/resourceclaims")
    return sorted(c["metadata"]["name"] for c in listing["items"])


async def test_an_unchanged_pod_is_served_through_dra_by_the_shipped_class(
    api, control_plane, draharness, cdicheck, tmp_path
):
    with trio.fail_after(LIMIT):
        async with dra_node(
            api,
            control_plane,
            draharness,
            tmp_path,
            resource=RESOURCE,
            driver=DRIVER,
            device_class=shipped_class(),
        ) as node:
            minor = os.minor(os.stat(tmp_path / "dev" / "dra0").st_rdev)
            async with powerdev(node):
                bound = await unchanged_pod(node, "plain")
                claim = await extended_claim(node, bound)
                uid = claim["metadata"]["uid"]
                (result,) = claim["status"]["allocation"]["devices"]["results"]
                # The kubelet finds the claim from the pod's status alone.
                prepared = await node.harness.prepare(node.namespace, "plain")
                cdi_id = f"{DRIVER}/claim={uid}-{result['device']}"
                assert prepared == {"c0": [cdi_id]}
                resolved = inject(cdicheck, [node.cdi], prepared["c0"])
                assert resolved["ok"], resolved
                assert nodes_of(resolved) == [("/dev/dra0", "c", NODE_MAJOR, minor, UID, GID, MODE)]
                # The pod ends: the kubelet unprepares the claim, its spec goes.
                spec = node.cdi / f"{DRIVER}-{uid}.json"
                assert spec.exists()
                await api.merge_patch(
                    f"/api/v1/namespaces/{node.namespace}/pods/plain/status",
                    {"status": {"phase": "Succeeded"}},
                )
                await node.harness.unprepare(node.namespace, "plain")
                assert not spec.exists()


async def test_where_the_node_advertises_the_resource_the_device_plugin_serves_the_pod(
    api, control_plane, draharness, tmp_path
):
    """Two devices in the pool. No allocatable on the node: the pod gets a
    claim. Allocatable above 0: the next pod gets no claim, though a device
    is free in the pool; while the node's units are too few it does not fit
    at all (the pod served through DRA counts against them, as seen with
    v1.36.3), and with enough it is served through the device plugin.
    Allocatable 0 again (what the kubelet shows once the device plugin's
    devices are all unhealthy, or its stream ended): the third pod gets the
    free device through DRA."""
    with trio.fail_after(LIMIT):
        async with (
            dra_node(
                api,
                control_plane,
                draharness,
                tmp_path,
                ("dra0", "dra1"),
                resource=RESOURCE,
                driver=DRIVER,
                device_class=shipped_class(),
            ) as node,
            powerdev(node),
        ):
            first = await extended_claim(node, await unchanged_pod(node, "first"))
            (taken,) = first["status"]["allocation"]["devices"]["results"]
            pods = f"/api/v1/namespaces/{node.namespace}/pods"

            # 1 allocatable, and the first pod's unit counted against it: no
            # room through the device plugin, and no claim from the pool
            # either, though a device is free there.
            await node_advertises(api, node.name, 1, "plugin")
            await create_unchanged_pod(node, "by-plugin", seen="plugin")
            pending = await api.wait_for(pods, "by-plugin", unschedulable)
            assert "nodeName" not in pending["spec"]
            assert await claim_names(node) == [first["metadata"]["name"]]

            # 2 allocatable: served by the device plugin. Bound, so past
            # PreBind, where the scheduler would have made and named its
            # claim: there is none.
            await node_advertises(api, node.name, 2, "plugin")
            by_plugin = await bound(node, "by-plugin")
            assert "extendedResourceClaimStatus" not in by_plugin["status"]
            assert await claim_names(node) == [first["metadata"]["name"]]

            await node_advertises(api, node.name, 0, "dra")
            by_dra = await unchanged_pod(node, "by-dra", seen="dra")
            last = await extended_claim(node, by_dra)
            (given,) = last["status"]["allocation"]["devices"]["results"]
            assert given["device"] != taken["device"]
            assert await claim_names(node) == sorted(
                [first["metadata"]["name"], last["metadata"]["name"]]
            )


def unschedulable(p: dict) -> bool:
    """The scheduler found the pod no node, for want of units of the resource."""
    return any(
        c["type"] == "PodScheduled"
        and c.get("reason") == "Unschedulable"
        and f"Insufficient {RESOURCE}" in c.get("message", "")
        for c in p["status"].get("conditions", [])
    )


async def test_a_both_node_switched_to_dra_serves_unchanged_pods_through_dra_and_keeps_held_devices(
    api, control_plane, draharness, dmharness, cdicheck, tmp_path
):
    """The migration, on one node: under "both" the node advertises the
    resource and an unchanged pod gets its device through the device plugin
    API (the kubelet's device manager, dmharness). The config becomes "dra"
    (a reload): the device plugin side goes (the kubelet shows 0
    allocatable), the next unchanged pod gets a claim, and the claim gets
    the device the first pod does not hold; that one stays out of the pool
    until the kubelet says no pod holds it."""
    with trio.fail_after(2 * LIMIT):
        async with (
            both_sides(
                api,
                control_plane,
                draharness,
                dmharness,
                tmp_path,
                "--cdi-recheck-interval",
                "0.05",
                resource=RESOURCE,
                driver=DRIVER,
                device_class=shipped_class(),
            ) as sides,
            powerdev(sides.node),
        ):
            dm, node = sides.dm, sides.node
            slice_ = slice_name(node.name, DRIVER, RESOURCE, 0)

            async def pool_holds(*paths: str) -> dict:
                return await api.wait_for(SLICES, slice_, lambda s: device_paths(s) == list(paths))

            await sides.kubelet_shows(2, 2)
            await pool_holds("/dev/dra0", "/dev/dra1")
            await node_advertises(api, node.name, 2, "both")  # what the kubelet shows
            old = await unchanged_pod(node, "old", seen="both")
            assert "extendedResourceClaimStatus" not in old["status"]
            admitted = await dm.call("admit", "old", 1)  # the kubelet admits it
            assert admitted["admitted"], admitted
            (unit,) = admitted["device_ids"]
            held = path_of(tmp_path / "dev")[unit]
            (free,) = {"/dev/dra0", "/dev/dra1"} - {held}
            before = await pool_holds(free)

            config = tmp_path / "config.json"
            (entry,) = json.loads(config.read_text())["resources"]
            entry["api"] = "dra"
            del entry["cdi"]  # "dra" always answers with CDI, and refuses the field
            config.write_text(json.dumps({"resources": [entry]}))
            await sides.kubelet_shows(2, 0)  # its stream ended: nothing allocatable
            # Served anew, through DRA alone: its pool published again (from
            # generation 1), still without the device a pod holds.
            after = await api.wait_for(
                SLICES,
                slice_,
                lambda s: s["spec"]["pool"]["generation"] != before["spec"]["pool"]["generation"],
            )
            assert device_paths(after) == [free]
            await node_advertises(api, node.name, 0, "dra")
            new = await unchanged_pod(node, "new", seen="dra")
            claim = await extended_claim(node, new)
            prepared = await node.harness.prepare(node.namespace, "new")
            resolved = inject(cdicheck, [node.cdi], prepared["c0"])
            assert resolved["ok"], resolved
            assert [d["path"] for d in resolved["linuxDevices"]] == [free]
            assert claim["status"]["allocation"]["devices"]["results"]

            # The old pod ends: its device returns to the pool, for DRA only.
            await dm.call("delpod", "old")
            await pool_holds("/dev/dra0", "/dev/dra1")
            await sides.kubelet_shows(2, 0)


async def test_a_powerdev_restarted_at_dra_keeps_out_of_its_pool_what_pods_hold(
    api, control_plane, draharness, dmharness, tmp_path
):
    """A pod got a device through the device plugin API under "both"; powerdev
    starts again with the resource at "dra". The device stays out of the
    pool until the kubelet (its PodResources API) no longer lists the pod."""
    with trio.fail_after(LIMIT):
        async with both_sides(
            api,
            control_plane,
            draharness,
            dmharness,
            tmp_path,
            "--cdi-recheck-interval",
            "0.05",
            resource=RESOURCE,
            driver=DRIVER,
            device_class=shipped_class(),
        ) as sides:
            dm, node = sides.dm, sides.node
            slice_ = slice_name(node.name, DRIVER, RESOURCE, 0)
            async with powerdev(node):
                await sides.kubelet_shows(2, 2)
                admitted = await dm.call("admit", "old", 1)
                assert admitted["admitted"], admitted
                (unit,) = admitted["device_ids"]
            held = path_of(tmp_path / "dev")[unit]
            (free,) = {"/dev/dra0", "/dev/dra1"} - {held}
            config = tmp_path / "config.json"
            (entry,) = json.loads(config.read_text())["resources"]
            entry["api"] = "dra"
            del entry["cdi"]
            config.write_text(json.dumps({"resources": [entry]}))
            async with powerdev(node):
                # Its first pool with devices: without the one the pod holds.
                first = await api.wait_for(SLICES, slice_, device_paths)
                assert device_paths(first) == [free]
                await dm.call("delpod", "old")
                await api.wait_for(
                    SLICES, slice_, lambda s: device_paths(s) == ["/dev/dra0", "/dev/dra1"]
                )
