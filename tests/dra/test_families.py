"""A disk and its partitions through DRA, end to end (root): a real loop disk
with a GPT table, a "dra" resource that lists the disk and its partitions.
By default its partitions are the devices, and the disk is left out, as in
"each" mode. With "whole-disks", the disk is published too: the kit's API
server takes the pool's shared counters and the real scheduler honours
them. A claim gets a partition; a claim for the whole
disk then waits, Unschedulable, while the other partition still goes to a
third claim; once the partition's claim is gone, the disk's claim is
allocated. The scheduler never gives overlapping blocks to two claims."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

import pytest
import trio

from powerdev.dra.names import counter_slice_name, slice_name
from tests.conftest import require_command
from tests.dra.test_driver import LIMIT, RESOURCE, dra_node, powerdev
from tests.dra.test_harness import RESOURCE_API
from tests.kernel.test_host_use_topology import gpt_image, loop_devices

pytestmark = pytest.mark.skipif(
    not os.path.exists("/dev/loop-control"), reason="no /dev/loop-control"
)
FIRST = 416  # inside test_host_use_topology's range, one test at a time


def unschedulable(pod: dict) -> bool:
    return any(
        c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
        for c in pod["status"].get("conditions", [])
    )


async def pod_for(node, name: str, path: str) -> None:
    """A claim for the device at `path` and a pod using it (not waited for)."""
    await node.api.create(
        f"{RESOURCE_API}/namespaces/{node.namespace}/resourceclaims",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": node.claim_spec(cel=f'device.attributes["{node.driver}"].path == "{path}"'),
        },
    )
    await node.pod_using(name, {"resourceClaimName": name})


@contextlib.asynccontextmanager
async def partitioned(api, control_plane, draharness, tmp_path, **fields) -> AsyncIterator:
    """A DRA node whose resource lists a GPT loop disk with two partitions
    (`fields`: more of the resource's config), and powerdev serving it:
    (the node, the disk's path)."""
    require_command("partx", "util-linux")
    with loop_devices() as loops:
        disk = loops.attach(FIRST, gpt_image(tmp_path / "disk.img"), partitions=True)
        async with (
            dra_node(
                api,
                control_plane,
                draharness,
                tmp_path,
                options=("--sys-root", "/sys"),
                host_devices=(f"{disk}*",),
                fields=fields,
            ) as node,
            powerdev(node),
        ):
            yield node, disk


async def test_the_scheduler_never_allocates_a_disk_and_its_partition_to_two_claims(
    api, control_plane, draharness, tmp_path
):
    with trio.fail_after(LIMIT):
        async with partitioned(
            api, control_plane, draharness, tmp_path, **{"whole-disks": True}
        ) as (node, disk):
            slices = f"{RESOURCE_API}/resourceslices"
            where = (node.name, node.driver, RESOURCE, 0)
            # the pool's counters and devices, as the API server kept them
            counters = await api.wait_for(slices, counter_slice_name(*where))
            (family,) = counters["spec"]["sharedCounters"]
            assert list(family["counters"].values()) == [{"value": "2"}]  # two partitions
            devices = await api.wait_for(slices, slice_name(*where))
            consumed = {
                d["attributes"]["path"]["string"]: d["consumesCounters"][0]["counters"]
                for d in devices["spec"]["devices"]
            }
            assert {path: list(c.values()) for path, c in consumed.items()} == {
                disk: [{"value": "2"}],
                f"{disk}p1": [{"value": "1"}],
                f"{disk}p2": [{"value": "1"}],
            }

            pods = f"/api/v1/namespaces/{node.namespace}/pods"
            claims = f"{RESOURCE_API}/namespaces/{node.namespace}/resourceclaims"
            await pod_for(node, "part", f"{disk}p1")
            await node.bound("part")
            await pod_for(node, "whole", disk)
            waiting = await api.wait_for(pods, "whole", unschedulable)
            assert "nodeName" not in waiting["spec"]
            await pod_for(node, "neighbour", f"{disk}p2")  # the other partition still goes
            await node.bound("neighbour")

            for name in ("part", "neighbour"):  # the partitions' claims go: the disk is free
                await api.delete(f"{pods}/{name}?gracePeriodSeconds=0")
                await api.delete(f"{claims}/{name}")
            await node.bound("whole")


async def test_by_default_a_partitioned_disks_partitions_are_its_dra_devices(
    api, control_plane, draharness, tmp_path
):
    """Without "whole-disks": the partitions alone, no counters, and a claim
    for all the resource's devices gets both partitions."""
    with trio.fail_after(LIMIT):
        async with partitioned(api, control_plane, draharness, tmp_path) as (node, disk):
            where = (node.name, node.driver, RESOURCE, 0)
            devices = await api.wait_for(f"{RESOURCE_API}/resourceslices", slice_name(*where))
            published = devices["spec"]["devices"]
            paths = sorted(d["attributes"]["path"]["string"] for d in published)
            assert paths == [f"{disk}p1", f"{disk}p2"]
            assert not any("consumesCounters" in d for d in published)
            assert devices["spec"]["pool"]["resourceSliceCount"] == 1  # no counter slice
            spec = node.claim_spec()
            del spec["devices"]["requests"][0]["exactly"]["count"]
            spec["devices"]["requests"][0]["exactly"]["allocationMode"] = "All"
            claims = f"{RESOURCE_API}/namespaces/{node.namespace}/resourceclaims"
            body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim"}
            await api.create(claims, {**body, "metadata": {"name": "all"}, "spec": spec})
            await node.pod_using("all", {"resourceClaimName": "all"})
            await node.bound("all")
            claim = await api.get(f"{claims}/all")
            assert len(claim["status"]["allocation"]["devices"]["results"]) == 2
