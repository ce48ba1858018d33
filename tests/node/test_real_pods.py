"""Real pods on the kit's real node (the kubelet, containerd and runc) open
the loop devices `powerdev run` hands out, through each of its three paths:
DeviceSpecs, CDI and DRA. Every pod runs as UID 1000 with every capability
dropped, no privilege escalation, a read-only root and the RuntimeDefault
seccomp profile; each writes a mark at the start of its device and reads it
back, and the host reads the mark from the loop device's file.

There is no udev here: /dev/loopN is root's, mode 0600. DeviceSpecs reach
the pod through the runtime's device_ownership_from_security_context (on,
node.OWNERSHIP); CDI and DRA through the owner, group and mode in the spec
powerdev writes. Where the spec names a group, only that group opens it."""

from __future__ import annotations

import secrets
from functools import partial

import pytest
import trio

from powerdev.devtools.cluster.nodepods import (
    RESOURCE_API,
    busybox_pod,
    loop_devices,
    write_and_read,
)
from powerdev.devtools.testing import LOOP_PATTERN, is_root
from tests.node.conftest import LIMIT, allocatable, powerdev, written

pytestmark = pytest.mark.skipif(not is_root(), reason="needs root: a real node and loop devices")

GROUP = 2000  # device-gid: the group that may open the devices
# Prints the owner, group and mode of the pod's device: a pod that has no
# device at all would fail to write too, for another reason.
OWNER = "stat -c 'owner=%u group=%g mode=%a' /dev/loop3*; "


def mark() -> str:
    return f"mark-{secrets.token_hex(4)}"


async def test_device_specs_a_non_root_pod_writes_and_reads_its_device(
    real_node, node_api, namespace, tmp_path
):
    resource = "powerdev.test/specs"
    entry = {"name": resource, "socket": "specs.sock", "include-devices": [LOOP_PATTERN]}
    with trio.fail_after(LIMIT), loop_devices(tmp_path, 1) as [(device, backing)]:
        async with powerdev(real_node, tmp_path, [entry]):
            await allocatable(node_api, real_node, resource, 1)
            text = mark()
            pod = busybox_pod(
                "specs", write_and_read(device, text), resources={"limits": {resource: "1"}}
            )
            phase, log = await namespace.run_pod(pod)
    assert (phase, f"read: {text}") == ("Succeeded", log.strip()), log
    assert written(backing, text) == text


async def test_cdi_the_group_opens_the_device_and_a_pod_outside_it_cannot(
    real_node, node_api, namespace, tmp_path
):
    """ "cdi" with device-gid and device-mode 0660 and no device-uid: the
    node in the container is root's and the group's, so a pod in the group
    writes it and a pod outside it gets EACCES (the runtime's CDI library
    would otherwise make the container's own user its owner)."""
    resource = "powerdev.test/cdi"
    entry = {
        "name": resource,
        "socket": "cdi.sock",
        "include-devices": [LOOP_PATTERN],
        "allocation": "each",
        "cdi": True,
        "device-gid": GROUP,
        "device-mode": "0660",
    }
    with trio.fail_after(LIMIT), loop_devices(tmp_path, 2) as loops:
        async with powerdev(real_node, tmp_path, [entry]):
            await allocatable(node_api, real_node, resource, 2)
            (_inside, inside_file), (_outside, outside_file) = loops
            text = mark()
            limits = {"limits": {resource: "1"}}
            probe = OWNER
            phase, log = await namespace.run_pod(
                busybox_pod("in-group", probe + write_and_read("/dev/loop3*", text),
                            resources=limits, groups=(GROUP,))
            )  # fmt: skip
            assert phase == "Succeeded", log
            assert f"owner=0 group={GROUP} mode=660" in log
            assert f"read: {text}" in log
            other = mark()
            phase, log = await namespace.run_pod(
                busybox_pod("outside", probe + write_and_read("/dev/loop3*", other),
                            resources=limits)
            )  # fmt: skip
            assert phase == "Failed", log
            # It has the device (root's and the group's), and may not open it.
            assert f"owner=0 group={GROUP} mode=660" in log, log
            assert "Permission denied" in log
    writes = [written(inside_file, text), written(outside_file, text)]
    assert text in writes  # the group's pod wrote its device
    assert not any(written(f, other) == other for f in (inside_file, outside_file))


def request(device_class: str, cel: str = "") -> dict:
    exactly: dict = {"deviceClassName": device_class, "count": 1}
    if cel:
        exactly["selectors"] = [{"cel": {"expression": cel}}]
    return {"devices": {"requests": [{"name": "dev", "exactly": exactly}]}}


async def test_dra_a_template_and_a_claim_by_attribute_and_the_group_only(
    real_node, node_api, namespace, tmp_path
):
    """Through DRA: a pod from a ResourceClaimTemplate, and one with a claim
    that selects one device by its path attribute, write and read their
    devices; a pod outside device-gid whose claim is prepared cannot open
    its device."""
    resource = "powerdev.test/dra"
    driver = "dra.powerdev.io"
    entry = {
        "name": resource,
        "api": "dra",
        "include-devices": [LOOP_PATTERN],
        "device-gid": GROUP,
        "device-mode": "0660",
    }
    claims = f"{RESOURCE_API}/namespaces/{namespace.name}/resourceclaims"
    templates = f"{RESOURCE_API}/namespaces/{namespace.name}/resourceclaimtemplates"
    class_name = await namespace.device_class(resource, driver)
    with trio.fail_after(3 * LIMIT), loop_devices(tmp_path, 3) as loops:
        async with powerdev(real_node, tmp_path, [entry]):
            await node_api.create(
                templates,
                {"metadata": {"name": "dev"}, "spec": {"spec": request(class_name)}},
            )
            text = mark()
            phase, log = await namespace.run_pod(
                busybox_pod("from-template", write_and_read("/dev/loop3*", text),
                            claims=[{"name": "dev", "resourceClaimTemplateName": "dev"}],
                            groups=(GROUP,))
            )  # fmt: skip
            assert (phase, f"read: {text}") == ("Succeeded", log.strip()), log
            used = [d for d, f in loops if written(f, text) == text]
            assert len(used) == 1

            chosen, chosen_file = next((d, f) for d, f in loops if d not in used)
            cel = f'device.attributes["{driver}"].path == "{chosen}"'
            await node_api.create(
                claims, {"metadata": {"name": "chosen"}, "spec": request(class_name, cel)}
            )
            other = mark()
            phase, log = await namespace.run_pod(
                busybox_pod("by-path", write_and_read(chosen, other),
                            claims=[{"name": "dev", "resourceClaimName": "chosen"}],
                            groups=(GROUP,))
            )  # fmt: skip
            assert (phase, f"read: {other}") == ("Succeeded", log.strip()), log
            assert written(chosen_file, other) == other

            third = mark()
            phase, log = await namespace.run_pod(
                busybox_pod("outside", OWNER + write_and_read("/dev/loop3*", third),
                            claims=[{"name": "dev", "resourceClaimTemplateName": "dev"}])
            )  # fmt: skip
            assert phase == "Failed", log
            assert f"owner=0 group={GROUP} mode=660" in log, log  # it has the device
            assert "Permission denied" in log
            assert all(written(f, third) != third for _, f in loops)


async def test_without_the_runtimes_ownership_option_a_device_spec_stays_roots(
    real_node, node_api, namespace, tmp_path
):
    """DeviceSpecs carry no owner: the runtime gives the node the host's
    (root's, 0600 here) unless device_ownership_from_security_context is on,
    so a non-root pod cannot open it."""
    resource = "powerdev.test/specs-root"
    entry = {"name": resource, "socket": "specs-root.sock", "include-devices": [LOOP_PATTERN]}
    await real_node.call(partial(real_node.restart_runtime, ownership=False))
    try:
        with trio.fail_after(LIMIT), loop_devices(tmp_path, 1) as [(device, backing)]:
            async with powerdev(real_node, tmp_path, [entry]):
                await allocatable(node_api, real_node, resource, 1)
                text = mark()
                probe = f"stat -c 'owner=%u mode=%a' {device}; "
                phase, log = await namespace.run_pod(
                    busybox_pod("specs-root", probe + write_and_read(device, text),
                                resources={"limits": {resource: "1"}})
                )  # fmt: skip
        assert phase == "Failed", log
        assert "owner=0 mode=600" in log and "Permission denied" in log, log
        assert written(backing, text) != text
    finally:
        await real_node.call(partial(real_node.restart_runtime, ownership=True))


async def test_cdi_with_no_owner_group_or_mode_the_pod_owns_its_node(
    real_node, node_api, namespace, tmp_path
):
    """ "cdi" alone: the spec names no owner, and the runtime's CDI library
    makes the container's user and group the node's owners (CDI's rule),
    whatever the runtime's ownership option says."""
    resource = "powerdev.test/cdi-own"
    entry = {
        "name": resource,
        "socket": "cdi-own.sock",
        "include-devices": [LOOP_PATTERN],
        "cdi": True,
    }
    await real_node.call(partial(real_node.restart_runtime, ownership=False))
    try:
        with trio.fail_after(LIMIT), loop_devices(tmp_path, 1) as [(device, backing)]:
            async with powerdev(real_node, tmp_path, [entry]):
                await allocatable(node_api, real_node, resource, 1)
                text = mark()
                probe = f"stat -c 'owner=%u group=%g mode=%a' {device}; "
                phase, log = await namespace.run_pod(
                    busybox_pod("cdi-own", probe + write_and_read(device, text),
                                resources={"limits": {resource: "1"}})
                )  # fmt: skip
        assert phase == "Succeeded", log
        assert "owner=1000 group=1000 mode=600" in log and f"read: {text}" in log, log
        assert written(backing, text) == text
    finally:
        await real_node.call(partial(real_node.restart_runtime, ownership=True))
