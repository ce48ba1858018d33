"""A disk and its partitions through DRA on the kit's real node (the kubelet
v1.36.3, containerd and runc), with a claim that lists alternatives
(firstAvailable, GA in 1.36):

- a pod's claim gets partition 1 of a real loop disk with a GPT table; the
  pod writes and reads it;
- a claim that prefers the whole disk and else takes a partition gets
  partition 2 (the scheduler cannot give the disk: its counters are in
  use), and its container, which names the request and not the
  alternative, writes and reads it;
- a pod whose claim asks for the whole disk stays Pending meanwhile;
- once the partitions' pods and claims are gone, it runs and writes the
  disk.

Every pod runs as in test_real_pods.py: UID 1000, every capability
dropped, no privilege escalation, a read-only root, RuntimeDefault seccomp,
in device-gid's group."""

from __future__ import annotations

import pytest
import trio

from powerdev.devtools.cluster.nodepods import DRIVER, RESOURCE_API, busybox_pod
from powerdev.devtools.testing import is_root
from tests.conftest import require_command
from tests.kernel.test_host_use_topology import gpt_image, loop_devices
from tests.node.conftest import LIMIT, powerdev
from tests.node.test_dra_unchanged import GROUP, claim_on, mark, said

pytestmark = pytest.mark.skipif(not is_root(), reason="needs root: a real node and loop devices")

RESOURCE = "powerdev.test/disk"
FIRST = 416  # inside test_host_use_topology's range, one test at a time


def write_read_and_stay_on(device: str, text: str) -> str:
    """Writes `text` at the start of `device`, synced, reads it back and
    prints it, then stays until the pod is deleted."""
    return (
        f"DEV={device}; "
        f"printf '%s' '{text}' | dd of=$DEV conv=fsync 2>/tmp/dd.err "
        "|| { cat /tmp/dd.err; exit 3; }; "
        f"echo read: $(dd if=$DEV bs={len(text)} count=1 2>/dev/null); "
        "exec sleep 3600"
    )


def on_host(device: str, length: int) -> str:
    with open(device, "rb") as node:
        return node.read(length).decode(errors="replace")


def first_available(class_name: str, disk: str, partition: str) -> dict:
    """One request "dev": the whole disk if the scheduler can, else `partition`."""

    def at(name: str, path: str) -> dict:
        cel = f'device.attributes["{DRIVER}"].path == "{path}"'
        return {
            "name": name,
            "deviceClassName": class_name,
            "selectors": [{"cel": {"expression": cel}}],
        }

    return {
        "devices": {
            "requests": [
                {"name": "dev", "firstAvailable": [at("whole", disk), at("part", partition)]}
            ]
        }
    }


async def test_partitions_and_their_disk_go_to_claims_that_never_overlap(
    real_node, node_api, namespace, tmp_path
):
    require_command("partx", "util-linux")
    claims = f"{RESOURCE_API}/namespaces/{namespace.name}/resourceclaims"
    class_name = await namespace.device_class(RESOURCE)
    with trio.fail_after(4 * LIMIT), loop_devices() as loops:
        disk = loops.attach(FIRST, gpt_image(tmp_path / "disk.img"), partitions=True)
        first, second = f"{disk}p1", f"{disk}p2"
        entry = {
            "name": RESOURCE,
            "api": "dra",
            "include-devices": [f"{disk}*"],
            "device-gid": GROUP,
            "device-mode": "0660",
            "whole-disks": True,
        }
        async with powerdev(real_node, tmp_path, [entry]):
            texts = {name: mark() for name in ("part", "choice", "whole")}

            async def start(name: str, spec: dict, device: str) -> None:
                await node_api.create(claims, {"metadata": {"name": name}, "spec": spec})
                await node_api.create(
                    namespace.pods,
                    busybox_pod(name, write_read_and_stay_on(device, texts[name]),
                                claims=[{"name": "dev", "resourceClaimName": name}],
                                groups=(GROUP,)),
                )  # fmt: skip

            async def wrote(name: str, device: str) -> None:
                await namespace.running(name)
                log = await namespace.wait_log(name, said)
                assert f"read: {texts[name]}" in log, log
                assert on_host(device, len(texts[name])) == texts[name]

            await start("part", claim_on(class_name, first), first)
            await wrote("part", first)
            await start("choice", first_available(class_name, disk, second), second)
            await wrote("choice", second)
            choice = await node_api.get(f"{claims}/choice")
            (result,) = choice["status"]["allocation"]["devices"]["results"]
            assert result["request"] == "dev/part"  # the disk could not be had

            await start("whole", claim_on(class_name, disk), disk)
            waiting = await namespace.until(
                "whole",
                lambda p: any(
                    c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                    for c in p["status"].get("conditions", [])
                ),
                "wait for the disk",
            )
            assert "nodeName" not in waiting["spec"]

            for name in ("part", "choice"):
                await namespace.delete_pod(name)
                await node_api.delete(f"{claims}/{name}")
                await node_api.wait_gone(claims, name)
            await wrote("whole", disk)
