"""A node reboot, on the real node: every container and process stopped,
/run and the CDI specs wiped, and the two loop devices attached again in
the other order, so that the device numbers of the claim's device now
belong to the other file. The pod of the prepared claim restarts and
finds its own data (powerdev follows the device by its identity, here the
loop device's backing file), and never writes the device that now has the
old numbers."""

from __future__ import annotations

import contextlib
import secrets

import pytest
import trio

from powerdev.devtools import testing
from powerdev.devtools.cluster.nodepods import RESOURCE_API, busybox_pod
from powerdev.devtools.testing import is_root
from tests.node.conftest import LIMIT, powerdev
from tests.node.test_real_pods import GROUP, request

pytestmark = pytest.mark.skipif(not is_root(), reason="needs root: a real node and loop devices")

DRIVER = "dra.powerdev.io"
RESOURCE = "powerdev.test/reboot"


def keep_or_write(mark: str) -> str:
    """Prints what its device holds (`found: ...`), writes `mark` there if it
    is not that already, and then only waits: a pod that restarts says
    whether it found its own data."""
    return (
        "DEV=$(echo /dev/loop3*); "
        f"OLD=$(dd if=$DEV bs={len(mark)} count=1 2>/dev/null | od -An -c | tr -d ' \\n'); "
        "echo found: $OLD on $DEV; "
        f"[ \"$OLD\" = '{mark}' ] || printf '%s' '{mark}' | dd of=$DEV conv=fsync 2>/dev/null "
        "|| exit 3; echo ready; exec sleep 1000000"
    )


def _restarted(pod: dict) -> bool:
    """Its container started again after the reboot."""
    statuses = pod["status"].get("containerStatuses") or [{}]
    return statuses[0].get("restartCount", 0) >= 1 and "running" in statuses[0].get("state", {})


@contextlib.contextmanager
def attached(pairs: list[tuple[str, object]]):
    with contextlib.ExitStack() as stack:
        for node, backing in pairs:
            stack.enter_context(testing.bound(node, backing))
        yield


async def test_after_a_reboot_the_restarted_pod_of_a_claim_finds_its_own_data(
    real_node, node_api, namespace, tmp_path
):
    entry = {
        "name": RESOURCE,
        "api": "dra",
        "include-devices": ["/dev/loop30[01]"],
        "device-gid": GROUP,
        "device-mode": "0660",
    }
    files = [tmp_path / "a.img", tmp_path / "b.img"]
    for file in files:
        file.write_bytes(bytes(1 << 20))
    mark = f"m{secrets.token_hex(4)}"
    claims = f"{RESOURCE_API}/namespaces/{namespace.name}/resourceclaims"
    class_name = await namespace.device_class(RESOURCE, DRIVER)
    pod = busybox_pod(
        "keeper",
        keep_or_write(mark),
        claims=[{"name": "dev", "resourceClaimName": "held"}],
        groups=(GROUP,),
    )
    pod["spec"]["restartPolicy"] = "Always"
    with trio.fail_after(5 * LIMIT), testing.loop_control() as control:
        nodes = [f"/dev/{control.add(testing.FIRST_LOOP + k)}" for k in range(2)]
        with attached(list(zip(nodes, files, strict=True))):
            async with powerdev(real_node, tmp_path, [entry]):
                await node_api.create(
                    claims, {"metadata": {"name": "held"}, "spec": request(class_name)}
                )
                await node_api.create(namespace.pods, pod)
                first = await namespace.wait_log("keeper", lambda t: "ready" in t)
                assert "found: \\0" in first, first  # an empty device: it wrote the mark
                (held,) = [f for f in files if f.read_bytes()[: len(mark)] == mark.encode()]
                other = next(f for f in files if f != held)
            await real_node.call(real_node.shut_down)
        # Attached again the other way round: the old numbers are the other file's.
        with attached(list(zip(nodes, reversed(files), strict=True))):
            # started before the node's parts, as a DaemonSet's pod may be
            async with powerdev(real_node, tmp_path, [entry], registered=False):
                await real_node.call(real_node.boot)
                restarted = await node_api.wait_for(namespace.pods, "keeper", _restarted)
                attempt = restarted["status"]["containerStatuses"][0]["restartCount"]
                log = await namespace.wait_log("keeper", lambda t: "found:" in t, attempt)
    assert f"found: {mark} on" in log, log
    assert other.read_bytes() == bytes(1 << 20)  # the device with the old numbers: untouched
    assert held.read_bytes()[: len(mark)] == mark.encode()
