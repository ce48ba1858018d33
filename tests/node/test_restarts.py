"""What happens to running pods and their devices on the real node when
the node's parts stop: the kubelet restarted under them; powerdev
SIGKILLed and started again, with a claim prepared; the pod deleted, and
its claim unprepared. One pod holds two loop devices, one through the device
plugin API (DeviceSpecs) and one through a DRA claim, and writes both five
times a second; after each disruption it is still writing."""

from __future__ import annotations

import json
import secrets
import time
from datetime import UTC, datetime
from functools import partial

import pytest
import trio

from powerdev.devtools.cluster.node import ready_heartbeat
from powerdev.devtools.cluster.nodepods import (
    RESOURCE_API,
    busybox_pod,
    keep_writing,
    loop_devices,
    write_and_read,
)
from powerdev.devtools.testing import is_root
from tests.conftest import wait_for_file, wait_gone
from tests.node.conftest import LIMIT, allocatable, powerdev, written
from tests.node.test_real_pods import GROUP, request

pytestmark = pytest.mark.skipif(not is_root(), reason="needs root: a real node and loop devices")

DRIVER = "dra.powerdev.io"
PLUGIN = "powerdev.test/restarts"
PLANTED = "2001-01-01T00:00:00Z"  # a Ready heartbeat no kubelet of this run wrote
DRA = "powerdev.test/restarts-dra"


def registered_since(resource: str, since: float, text: str) -> bool:
    """Whether powerdev's status file says `resource` was registered after `since`."""
    try:
        state = json.loads(text)["resources"][resource]
    except (ValueError, KeyError):
        return False
    return state["state"] == "registered" and state["since"] > since


def resources() -> list[dict]:
    """The first loop device (loop300) for the device plugin, the second
    (loop301) for DRA."""
    return [
        {"name": PLUGIN, "socket": "restarts.sock", "include-devices": ["/dev/loop300"]},
        {
            "name": DRA,
            "api": "dra",
            "include-devices": ["/dev/loop301"],
            "device-gid": GROUP,
            "device-mode": "0660",
        },
    ]


async def test_a_running_pod_keeps_its_devices_through_restarts_and_its_claim_goes_with_it(
    real_node, node_api, namespace, tmp_path
):
    claims = f"{RESOURCE_API}/namespaces/{namespace.name}/resourceclaims"
    class_name = await namespace.device_class(DRA, DRIVER)
    with trio.fail_after(4 * LIMIT), loop_devices(tmp_path, 2) as loops:
        async with powerdev(real_node, tmp_path, resources()) as first:
            await allocatable(node_api, real_node, PLUGIN, 1)
            claim = await node_api.create(
                claims, {"metadata": {"name": "held"}, "spec": request(class_name)}
            )
            spec = real_node.cdi_dir / f"{DRIVER}-{claim['metadata']['uid']}.json"
            pod = busybox_pod(
                "runner",
                keep_writing("/dev/loop30[01]"),
                resources={"limits": {PLUGIN: "1"}},
                claims=[{"name": "dev", "resourceClaimName": "held"}],
                groups=(GROUP,),
            )
            await node_api.create(namespace.pods, pod)
            await namespace.running("runner")
            seen = await namespace.count_passes("runner", 0)
            assert "/dev/loop301" in await wait_for_file(spec, lambda t: "loop301" in t)

            restarted = time.time()
            await real_node.call(real_node.restart_kubelet)
            seen = await namespace.count_passes("runner", seen)
            # powerdev registered again with the new kubelet
            await wait_for_file(
                tmp_path / "status.json", partial(registered_since, PLUGIN, restarted)
            )

            first.kill()  # SIGKILL: no cleanup at all
            await first.wait()
        async with powerdev(real_node, tmp_path, resources()):
            seen = await namespace.count_passes("runner", seen)
            status = json.loads(spec.read_text())  # still there, still the same device
            assert "/dev/loop301" in json.dumps(status)

            await namespace.delete_pod("runner")
            await wait_gone(spec)  # unprepared: nothing holds the claim
            for _, backing in loops:
                assert int(backing.read_bytes()[:8]) >= seen

            # The device plugin's device is free again: a new pod gets it.
            text = f"again-{secrets.token_hex(3)}"
            phase, log = await namespace.run_pod(
                busybox_pod(
                    "again",
                    write_and_read("/dev/loop300", text),
                    resources={"limits": {PLUGIN: "1"}},
                )
            )
            assert (phase, f"read: {text}") == ("Succeeded", log.strip()), log
            assert written(loops[0][1], text) == text


async def test_a_restarted_kubelet_makes_the_node_ready_by_its_own_report(real_node, node_api):
    """A kubelet's start returns once that kubelet has reported the Node
    Ready, never on the condition an earlier one left: here the kubelet is
    stopped and the Node's Ready condition is replaced by one it could have
    left (True, an old heartbeat, a reason of the test's) before the start."""
    path = f"/api/v1/nodes/{real_node.name}"
    with trio.fail_after(LIMIT):
        await real_node.call(real_node.stop_kubelet)
        node = await node_api.get(path)
        conditions = node["status"]["conditions"]
        for c in conditions:
            if c["type"] == "Ready":
                c.update(status="True", reason="LeftByTheTest", lastHeartbeatTime=PLANTED)
        await node_api.merge_patch(f"{path}/status", {"status": {"conditions": conditions}})
        await real_node.call(real_node.start_kubelet)
        node = await node_api.get(path)
    (ready,) = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert (ready["status"], ready["reason"]) == ("True", "KubeletReady"), ready
    started = datetime.fromtimestamp(int(real_node.kubelet_started), UTC)
    assert real_node.ready_heartbeat is not None
    assert real_node.ready_heartbeat >= started, (real_node.ready_heartbeat, started)
    assert ready_heartbeat(node) >= real_node.ready_heartbeat
