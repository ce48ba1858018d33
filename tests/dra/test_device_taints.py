"""A device's own health as a taint, with the kit's scheduler and the
kubelet's DRA manager (draharness): a multipath map whose paths have all
failed is published with a NoSchedule taint; the scheduler then gives it
to no claim that does not tolerate the taint, and one that tolerates it is
allocated the device but not prepared while it has failed (a pod never
starts on a device with no path); once a path is back (degraded: a None
taint, which the scheduler does not act on), the claim is prepared."""

from __future__ import annotations

import pytest
import trio

from powerdev.devtools.harness import HarnessError
from powerdev.devtools.testing import is_root
from powerdev.dra.names import slice_name
from powerdev.dra.slices import CONDITION_TAINT
from tests.dra.test_driver import RESOURCE, dra_node, powerdev
from tests.dra.test_harness import RESOURCE_API
from tests.unit.test_condition import san
from tests.unit.test_family import nodes

pytestmark = pytest.mark.skipif(not is_root(), reason="needs root: distinct nodes (mknod)")

LIMIT = 90
SLICES = f"{RESOURCE_API}/resourceslices"
MPATHA = "/dev/mapper/mpatha"


def taint_of(item: dict) -> list[dict]:
    (device,) = [d for d in item["spec"]["devices"] if d["attributes"]["path"]["string"] == MPATHA]
    return [{k: v for k, v in t.items() if k != "timeAdded"} for t in device.get("taints", [])]


def unschedulable(p: dict) -> bool:
    return any(
        c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
        for c in p["status"].get("conditions", [])
    )


async def test_a_failed_device_goes_to_no_claim_that_does_not_tolerate_it_and_is_not_prepared(
    api, control_plane, draharness, tmp_path
):
    sys_root = tmp_path / "sys"
    states = san(sys_root, kpartx=False)
    options = ("--sys-root", str(sys_root), "--health-interval", "0.05")
    fields = {"include-devices": ["/dev/mapper/*"]}
    with trio.fail_after(LIMIT):
        async with dra_node(
            api, control_plane, draharness, tmp_path, (), options=options, fields=fields
        ) as node:
            nodes(tmp_path / "dev", {"mapper/mpatha": (253, 3)})
            first = slice_name(node.name, node.driver, RESOURCE, 0)
            async with powerdev(node):
                await api.wait_for(SLICES, first, lambda s: taint_of(s) == [])
                for state in states.values():
                    state.write_text("transport-offline\n")
                failed = {"key": CONDITION_TAINT, "value": "failed", "effect": "NoSchedule"}
                await api.wait_for(SLICES, first, lambda s: taint_of(s) == [failed])

                # A claim that does not tolerate the taint: no node for its pod.
                claims = f"{RESOURCE_API}/namespaces/{node.namespace}/resourceclaims"
                pods = f"/api/v1/namespaces/{node.namespace}/pods"
                plain = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim"}
                await api.create(
                    claims, {**plain, "metadata": {"name": "p1"}, "spec": node.claim_spec()}
                )
                await node.pod_using("p1", {"resourceClaimName": "p1"})
                waiting = await api.wait_for(pods, "p1", unschedulable)
                assert not waiting["spec"].get("nodeName")
                assert not (await api.get(f"{claims}/p1")).get("status", {}).get("allocation")

                # One that tolerates it is allocated the device, and its pod
                # bound; the node does not prepare it while it has failed.
                spec = node.claim_spec()
                spec["devices"]["requests"][0]["exactly"]["tolerations"] = [
                    {"key": CONDITION_TAINT, "operator": "Exists", "effect": "NoSchedule"}
                ]
                await api.create(claims, {**plain, "metadata": {"name": "p2"}, "spec": spec})
                await node.pod_using("p2", {"resourceClaimName": "p2"})
                await node.bound("p2")
                claim = await api.get(f"{claims}/p2")
                (result,) = claim["status"]["allocation"]["devices"]["results"]
                assert result["pool"].endswith(RESOURCE)
                with pytest.raises(HarnessError, match="is not healthy, or is used by the host"):
                    await node.harness.prepare(node.namespace, "p2")

                # A path back: the taint goes, and the claim is prepared.
                states["sdd"].write_text("running\n")
                degraded = {"key": CONDITION_TAINT, "value": "degraded", "effect": "None"}
                await api.wait_for(SLICES, first, lambda s: taint_of(s) == [degraded])
                prepared = await node.harness.prepare(node.namespace, "p2")
                assert prepared["c0"]  # its container gets the device's CDI ID
