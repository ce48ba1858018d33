"""What powerdev offers through DRA, on the kit's real node (the kubelet
v1.36.3, containerd and runc), beyond the claims of test_real_pods.py:

- a pod written for the device plugin (`power-dev-plugin/dev: 1` in its
  limits, no claim) is served through DRA by deploy/dra's DeviceClass as
  shipped (spec.extendedResourceName): the scheduler makes its claim from
  powerdev's pool, the real kubelet has powerdev prepare it, and the
  container writes and reads its loop device; deleting the pod deletes the
  claim and unprepares it, and the device serves the next such pod;
- a claim with admin access reaches the device an ordinary claim's running
  pod holds: its pod reads what the holder wrote and may not write the
  device, whose owner, group and mode would let it: the cgroup rule of its
  CDI spec is `r` (docs/dra.md, "Admin access").

Every pod runs as in test_real_pods.py: UID 1000, every capability
dropped, no privilege escalation, a read-only root, RuntimeDefault seccomp,
in device-gid's group."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator

import pytest
import trio

from powerdev.devtools.cluster.client import Api
from powerdev.devtools.cluster.node import Node
from powerdev.devtools.cluster.nodepods import DRIVER, RESOURCE_API, busybox_pod, loop_devices
from powerdev.devtools.testing import LOOP_PATTERN, is_root, wait_gone
from powerdev.dra.names import pool_name
from tests.dra.test_extended_resource import RESOURCE, checked_extended_claim, shipped_class
from tests.node.conftest import LIMIT, Namespace, powerdev, written

pytestmark = pytest.mark.skipif(not is_root(), reason="needs root: a real node and loop devices")

ADMIN_NAMESPACE_LABEL = "resource.kubernetes.io/admin-access"
# A node label set once the Node shows no allocatable RESOURCE: a pod that
# selects it is scheduled only once the scheduler has seen that status.
SEEN = "powerdev.test/no-device-plugin"
GROUP = 2000  # device-gid: the group that may open the devices
OWNER = "stat -c 'owner=%u group=%g mode=%a' $DEV; "


def mark() -> str:
    return f"mark-{secrets.token_hex(4)}"


def dra_entry(resource: str) -> dict:
    return {
        "name": resource,
        "api": "dra",
        "include-devices": [LOOP_PATTERN],
        "device-gid": GROUP,
        "device-mode": "0660",
    }


def write_read_and_stay(mark: str) -> str:
    """Writes `mark` at the start of the pod's one loop device, synced, reads
    it back and prints it, then stays until the pod is deleted; fails at
    once if it cannot write."""
    return (
        "DEV=$(echo /dev/loop3*); "
        f"printf '%s' '{mark}' | dd of=$DEV conv=fsync 2>/tmp/dd.err "
        "|| { cat /tmp/dd.err; exit 3; }; "
        f"echo read: $(dd if=$DEV bs={len(mark)} count=1 2>/dev/null); "
        "exec sleep 3600"
    )


def said(text: str) -> bool:
    """Whether a script above has read its mark, or failed to write."""
    return "read:" in text or "dd:" in text


@contextlib.asynccontextmanager
async def served_through_dra(api: Api, real_node: Node) -> AsyncIterator[dict]:
    """Once the Node shows no allocatable RESOURCE (0, or none at all: no
    device plugin serves it, as test_daemonset's did before), a label on it
    that the scheduler sees after that status (one object's events come in
    order); yields the nodeSelector of a pod that must not be scheduled
    before. The label goes on the way out."""
    node = await api.wait_for(
        "/api/v1/nodes",
        real_node.name,
        lambda n: n["status"].get("allocatable", {}).get(RESOURCE, "0") == "0",
    )
    seen = node["metadata"]["resourceVersion"]
    await api.merge_patch(f"/api/v1/nodes/{real_node.name}", {"metadata": {"labels": {SEEN: seen}}})
    try:
        yield {SEEN: seen}
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(LIMIT):
            await api.merge_patch(
                f"/api/v1/nodes/{real_node.name}", {"metadata": {"labels": {SEEN: None}}}
            )


def unchanged_pod(name: str, script: str, node_selector: dict) -> dict:
    """A pod as written for the device plugin: RESOURCE in its limits, no claim."""
    pod = busybox_pod(name, script, resources={"limits": {RESOURCE: "1"}}, groups=(GROUP,))
    pod["spec"]["nodeSelector"] = node_selector
    assert "resourceClaims" not in pod["spec"]
    return pod


async def device_path(api: Api, real_node: Node, resource: str, device: str) -> str:
    """The `path` attribute of `device` in the node's pool of `resource`."""
    slices = await api.get(
        f"{RESOURCE_API}/resourceslices", fieldSelector=f"spec.nodeName={real_node.name}"
    )
    pool = pool_name(real_node.name, resource)
    (path,) = [
        d["attributes"]["path"]["string"]
        for s in slices["items"]
        if s["spec"]["driver"] == DRIVER and s["spec"]["pool"]["name"] == pool
        for d in s["spec"]["devices"]
        if d["name"] == device
    ]
    return path


async def extended_claim(namespace: Namespace, pod: dict) -> dict:
    """The claim the scheduler made for a running unchanged pod, checked as
    the control plane test checks it."""
    return await checked_extended_claim(namespace.api, namespace.name, namespace.node.name, pod)


async def run_unchanged(namespace: Namespace, name: str, text: str, selector: dict) -> dict:
    """An unchanged pod that writes and reads `text` on its device, once its
    log says it read it back: the pod, with its status."""
    await namespace.api.create(
        namespace.pods, unchanged_pod(name, write_read_and_stay(text), selector)
    )
    await namespace.running(name)
    log = await namespace.wait_log(name, said)
    assert f"read: {text}" in log, log
    return await namespace.api.get(f"{namespace.pods}/{name}")


async def test_an_unchanged_pod_gets_its_device_through_dra_and_gives_it_back(
    real_node, node_api, namespace, tmp_path
):
    """One loop device in powerdev's pool of power-dev-plugin/dev ("api":
    "dra"), the shipped DeviceClass applied, no device plugin for the
    resource. A pod that asks for power-dev-plugin/dev: 1 in its limits
    writes and reads the device through the claim the scheduler made for
    it, which the kubelet had powerdev prepare (its CDI spec names the
    device). Deleting the pod deletes the claim and unprepares it; a second
    such pod then gets the same device."""
    await namespace.create_device_class(shipped_class())
    claims = f"{RESOURCE_API}/namespaces/{namespace.name}/resourceclaims"
    with trio.fail_after(4 * LIMIT), loop_devices(tmp_path, 1) as [(device, backing)]:
        async with (
            powerdev(real_node, tmp_path, [dra_entry(RESOURCE)]),
            served_through_dra(node_api, real_node) as selector,
        ):
            text = mark()
            pod = await run_unchanged(namespace, "plain", text, selector)
            assert written(backing, text) == text
            claim = await extended_claim(namespace, pod)
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            assert await device_path(node_api, real_node, RESOURCE, result["device"]) == device
            # Prepared by powerdev: the claim's CDI spec names the device node.
            spec = real_node.cdi_dir / f"{DRIVER}-{claim['metadata']['uid']}.json"
            assert f'"{device}"' in spec.read_text()

            await namespace.delete_pod("plain")
            await node_api.wait_gone(claims, claim["metadata"]["name"])
            await wait_gone(spec)  # unprepared

            again = mark()
            pod = await run_unchanged(namespace, "again", again, selector)
            assert written(backing, again) == again
            second = await extended_claim(namespace, pod)
            assert second["metadata"]["uid"] != claim["metadata"]["uid"]
            (result,) = second["status"]["allocation"]["devices"]["results"]
            assert await device_path(node_api, real_node, RESOURCE, result["device"]) == device


def claim_on(class_name: str, path: str, *, admin: bool = False) -> dict:
    """A ResourceClaim for the one device of the class at `path`."""
    exactly: dict = {
        "deviceClassName": class_name,
        "count": 1,
        "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].path == "{path}"'}}],
    }
    if admin:
        exactly["adminAccess"] = True
    return {"devices": {"requests": [{"name": "dev", "exactly": exactly}]}}


def read_then_try_to_write(device: str, length: int, attempt: str) -> str:
    """Prints the device's owner, group and mode, reads `length` bytes at
    its start, then tries to write `attempt` there and says how it went;
    then stays until the pod is deleted (its claim stays allocated)."""
    return (
        f"DEV={device}; {OWNER}"
        f"echo read: $(dd if=$DEV bs={length} count=1 2>/dev/null); "
        f"if printf '%s' '{attempt}' | dd of=$DEV conv=fsync 2>/tmp/dd.err; "
        "then echo wrote; else echo refused: $(cat /tmp/dd.err); fi; "
        "exec sleep 3600"
    )


async def test_admin_access_reads_a_device_a_running_pod_holds_and_cannot_write_it(
    real_node, node_api, namespace, tmp_path
):
    """An ordinary claim's pod holds a loop device, has written it and runs
    on. In the namespace labelled for admin access, a claim with admin
    access to the same device is allocated and prepared while it runs; its
    pod, in the device's group with mode 0660, reads the holder's mark and
    is refused the write (EPERM, the cgroup's answer; EACCES would be the
    mode's). The host still reads the holder's mark, and the holder runs."""
    resource = "powerdev.test/admin"
    claims = f"{RESOURCE_API}/namespaces/{namespace.name}/resourceclaims"
    class_name = await namespace.device_class(resource)
    await node_api.label_namespace(namespace.name, {ADMIN_NAMESPACE_LABEL: "true"})
    with trio.fail_after(3 * LIMIT), loop_devices(tmp_path, 2) as loops:
        (device, backing), _ = loops  # a second, free: admin access must reach the held one
        async with powerdev(real_node, tmp_path, [dra_entry(resource)]):
            held = await node_api.create(
                claims, {"metadata": {"name": "held"}, "spec": claim_on(class_name, device)}
            )
            text = mark()
            await node_api.create(
                namespace.pods,
                busybox_pod("holder", write_read_and_stay(text),
                            claims=[{"name": "dev", "resourceClaimName": "held"}],
                            groups=(GROUP,)),
            )  # fmt: skip
            await namespace.running("holder")
            log = await namespace.wait_log("holder", said)
            assert f"read: {text}" in log, log

            await node_api.create(
                claims,
                {"metadata": {"name": "look"}, "spec": claim_on(class_name, device, admin=True)},
            )
            attempt = mark()
            await node_api.create(
                namespace.pods,
                busybox_pod("admin", read_then_try_to_write(device, len(text), attempt),
                            claims=[{"name": "dev", "resourceClaimName": "look"}],
                            groups=(GROUP,)),
            )  # fmt: skip
            await namespace.running("admin")
            log = await namespace.wait_log("admin", lambda t: "wrote" in t or "refused:" in t)
            assert f"owner=0 group={GROUP} mode=660" in log, log  # the mode would let it write
            assert f"read: {text}" in log, log
            assert "refused:" in log and "Operation not permitted" in log, log
            assert written(backing, text) == text

            look = await node_api.get(f"{claims}/look")
            held = await node_api.get(f"{claims}/{held['metadata']['name']}")
            (seen,) = look["status"]["allocation"]["devices"]["results"]
            (holds,) = held["status"]["allocation"]["devices"]["results"]
            assert seen["adminAccess"] is True and seen["device"] == holds["device"]
            assert held["status"]["reservedFor"]  # the holder's claim stays reserved
            pod = await node_api.get(f"{namespace.pods}/holder")
            assert pod["status"]["phase"] == "Running"
