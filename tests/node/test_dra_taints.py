"""A device's own health as a taint, on the kit's real node (the kubelet
v1.36.3, containerd and runc): a multipath map whose paths have all failed
is published with a NoSchedule taint; a pod whose claim does not tolerate
it is never scheduled; one whose claim tolerates it is bound to the node,
where the kubelet asks powerdev to prepare the claim and powerdev refuses
while no path works; once a path is back (degraded: a None taint, which
the scheduler does not act on) the kubelet's next try is prepared and the
container runs with the device's node.

A loop device has no paths to fail, so the map is described by a sysfs
tree of the test's own (`--sys-root`, as tests/dra/test_device_taints.py
does against the DRA harness) and its node made with mknod under a /dev of
the test's own (`--dev-root`); the container checks that it has the block
node and never opens it (this kernel has no device-mapper driver).

The pods run as in test_real_pods.py: UID 1000, every capability dropped,
no privilege escalation, a read-only root, RuntimeDefault seccomp."""

from __future__ import annotations

import pytest
import trio

from powerdev.devtools.cluster.nodepods import DRIVER, RESOURCE_API, busybox_pod
from powerdev.devtools.testing import is_root
from powerdev.dra.names import slice_name
from powerdev.dra.slices import CONDITION_TAINT
from tests.conftest import wait_for_file
from tests.dra.test_device_taints import MPATHA, taint_of, unschedulable
from tests.node.conftest import LIMIT, powerdev
from tests.node.test_dra_unchanged import GROUP, claim_on
from tests.unit.test_condition import san
from tests.unit.test_family import nodes

pytestmark = pytest.mark.skipif(not is_root(), reason="needs root: a real node and mknod")

RESOURCE = "powerdev.test/lun"
SLICES = f"{RESOURCE_API}/resourceslices"
HAS_NODE = f"test -b {MPATHA} && echo 'node: there'; exec sleep 3600"


async def test_a_failed_lun_is_tainted_and_a_tolerating_claim_runs_once_a_path_is_back(
    real_node, node_api, namespace, tmp_path
):
    sys_root, dev = tmp_path / "sys", tmp_path / "dev"
    states = san(sys_root, kpartx=False)
    nodes(dev, {"mapper/mpatha": (253, 3)})
    entry = {
        "name": RESOURCE,
        "api": "dra",
        "include-devices": ["/dev/mapper/*"],
        "device-gid": GROUP,
        "device-mode": "0660",
    }
    options = (
        "--sys-root", str(sys_root),
        "--dev-root", str(dev),
        "--uevents", "off",
        "--health-interval", "0.05",
    )  # fmt: skip
    claims = f"{RESOURCE_API}/namespaces/{namespace.name}/resourceclaims"
    class_name = await namespace.device_class(RESOURCE)
    first = slice_name(real_node.name, DRIVER, RESOURCE, 0)
    log = tmp_path / "powerdev.log"
    with trio.fail_after(4 * LIMIT):
        async with powerdev(real_node, tmp_path, [entry], *options):
            await node_api.wait_for(SLICES, first, lambda s: taint_of(s) == [])
            for state in states.values():
                state.write_text("transport-offline\n")
            failed = {"key": CONDITION_TAINT, "value": "failed", "effect": "NoSchedule"}
            await node_api.wait_for(SLICES, first, lambda s: taint_of(s) == [failed])

            async def start(name: str, tolerates: bool) -> None:
                spec = claim_on(class_name, MPATHA)
                if tolerates:
                    spec["devices"]["requests"][0]["exactly"]["tolerations"] = [
                        {"key": CONDITION_TAINT, "operator": "Exists", "effect": "NoSchedule"}
                    ]
                await node_api.create(claims, {"metadata": {"name": name}, "spec": spec})
                claim = [{"name": "dev", "resourceClaimName": name}]
                pod = busybox_pod(name, HAS_NODE, claims=claim, groups=(GROUP,))
                await node_api.create(namespace.pods, pod)

            # Not tolerated: the scheduler finds no device for it.
            await start("plain", tolerates=False)
            waiting = await namespace.until("plain", unschedulable, "Unschedulable")
            assert not waiting["spec"].get("nodeName")
            # Tolerated: allocated and bound; the kubelet asks, powerdev refuses.
            await start("tolerant", tolerates=True)
            bound = await namespace.until(
                "tolerant", lambda p: p["spec"].get("nodeName") == real_node.name, "bound"
            )
            assert bound["status"].get("phase") == "Pending"
            await wait_for_file(log, lambda text: "is not healthy, or is used by the host" in text)
            refused = await node_api.get(f"{namespace.pods}/tolerant")
            assert refused["status"]["phase"] == "Pending"

            # A path back: degraded, a taint the scheduler ignores; the
            # kubelet's next try is prepared and the container has the node.
            states["sdd"].write_text("running\n")
            degraded = {"key": CONDITION_TAINT, "value": "degraded", "effect": "None"}
            await node_api.wait_for(SLICES, first, lambda s: taint_of(s) == [degraded])
            await namespace.running("tolerant")
            said = await namespace.wait_log("tolerant", lambda text: "node:" in text)
            assert "node: there" in said, said
            still = await node_api.get(f"{namespace.pods}/plain")
            assert not still["spec"].get("nodeName")  # a NoSchedule claim's pod still waits
