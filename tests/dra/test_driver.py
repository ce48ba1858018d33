"""powerdev as a DRA driver, end to end: `powerdev run` (a real process)
with a resource that says "api": "dra", the kit's control plane (the real
scheduler allocates the claim from powerdev's ResourceSlice) and the
kubelet's own DRA manager and plugin manager (draharness). The CDI IDs the
harness gets are resolved by the kit's CDI library (cdicheck) to exactly
the allocated device node, with the configured uid, gid and mode. A daemon
restart keeps what was prepared: its checkpoint answers the claim again,
and a CDI spec that is gone (a reboot empties /var/run/cdi) is written
again at start."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from powerdev.devtools.cdicheck import inject
from powerdev.devtools.cluster.client import Api, container, pod
from powerdev.devtools.draharness import DRAHarness
from powerdev.devtools.kit import CDICHECK
from powerdev.devtools.testing import (
    NODE_MAJOR,
    dra_options,
    is_root,
    make_nodes,
    run_command,
    stop,
)
from powerdev.dra.names import pool_name, slice_name
from tests.conftest import require_tool, wait_for_file
from tests.dra.test_harness import RESOURCE_API, TAINT, dirs

pytestmark = pytest.mark.skipif(not is_root(), reason="needs root: distinct nodes (mknod)")

RESOURCE = "powerdev.test/dra"
LIMIT = 60
UID, GID, MODE = 1000, 2000, 0o640


@pytest.fixture
def cdicheck() -> Path:
    return require_tool(CDICHECK)


@dataclass
class Node:
    name: str
    driver: str
    api: Api
    harness: DRAHarness
    cdi: Path
    command: list[str]

    @property
    def namespace(self) -> str:
        return self.name

    def claim_spec(self, count: int = 1, cel: str = "") -> dict:
        """`count` devices of the resource's class, those `cel` selects if given."""
        exactly: dict = {"deviceClassName": self.name, "count": count}
        if cel:
            exactly["selectors"] = [{"cel": {"expression": cel}}]
        return {"devices": {"requests": [{"name": "dev", "exactly": exactly}]}}

    async def pod_using(self, name: str, source: dict) -> None:
        """A pod whose container c0 uses claim "dev" from `source`."""
        body = pod(
            name,
            container("c0", {"claims": [{"name": "dev"}]}),
            resourceClaims=[{"name": "dev", **source}],
            tolerations=[{"key": TAINT, "operator": "Equal", "value": self.name}],
        )
        await self.api.create_pod(self.namespace, body)

    async def bound(self, name: str) -> dict:
        pods = f"/api/v1/namespaces/{self.namespace}/pods"
        return await self.api.wait_for(pods, name, lambda p: p["spec"].get("nodeName") == self.name)

    async def pod_with_claim(self, name: str, count: int = 1, cel: str = "") -> dict:
        """A claim for devices of the resource's class (claim_spec), and a pod
        using it in container c0; the claim once the scheduler has bound the pod."""
        claims = f"{RESOURCE_API}/namespaces/{self.namespace}/resourceclaims"
        await self.api.create(
            claims,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name},
                "spec": self.claim_spec(count, cel),
            },
        )
        await self.pod_using(name, {"resourceClaimName": name})
        await self.bound(name)
        return await self.api.get(f"{claims}/{name}")


@contextlib.asynccontextmanager
async def powerdev(node: Node, log: Path | None = None) -> AsyncIterator[trio.Process]:
    """`powerdev run`, registered with the harness (its stderr to `log` if
    given); SIGTERM on the way out."""
    stderr = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND) if log is not None else None
    try:
        proc = await trio.lowlevel.open_process(node.command, stderr=stderr)
    finally:
        if stderr is not None:
            os.close(stderr)  # the child has its own
    try:
        await node.harness.wait_driver(node.driver)
        yield proc
    finally:
        await stop(proc)
        if proc.returncode is not None:  # stopped, not killed: its registration
            # socket is gone, and the plugin manager lets it go
            await node.harness.wait_gone(node.driver)


@contextlib.asynccontextmanager
async def dra_node(
    api: Api,
    plane,
    draharness: Path,
    tmp_path: Path,
    devices: tuple[str, ...] = ("dra0",),
    *,
    both: bool = False,
    options: tuple[str, ...] = (),
    host_devices: tuple[str, ...] = (),
    resource: str = RESOURCE,
    driver: str | None = None,
    device_class: dict | None = None,
    fields: dict | None = None,
) -> AsyncIterator[Node]:
    """A Ready Node of our own (tainted for our pods only), its namespace,
    the harness as its kubelet, a DeviceClass for the resource, a device
    tree with one distinct character node, and the config ("api": "dra",
    or with `both` "api": "both" in CDI mode; `options` for `powerdev run`).
    With `host_devices` (patterns), the host's own /dev and those instead.
    `resource` and `driver` name the config's resource and the driver
    (default: one of the node's own); `device_class`, a DeviceClass to make
    instead of the node's own (named after the node); `fields`, more of
    the resource's config."""
    name = f"dra-{secrets.token_hex(3)}"
    driver = driver or f"{name}.powerdev.test"
    await api.create_node(name, taints=[{"key": TAINT, "value": name, "effect": "NoSchedule"}])
    await api.create_namespace(name)
    cel = f'device.driver == "{driver}" && device.attributes["{driver}"].resource == "{resource}"'
    device_class = device_class or {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": cel}}]},
    }
    await api.create(f"{RESOURCE_API}/deviceclasses", device_class)
    dev = Path("/dev") if host_devices else tmp_path / "dev"
    if not host_devices:
        make_nodes(dev, list(devices))
    config = tmp_path / "config.json"
    entry = {
        "name": resource,
        "api": "dra",
        "include-devices": list(host_devices) or ["/dev/dra*"],
        "permissions": "rw",
        "device-uid": UID,
        "device-gid": GID,
        "device-mode": f"{MODE:04o}",
    }
    if both:
        entry.update({"api": "both", "cdi": True})
    entry.update(fields or {})
    config.write_text(json.dumps({"resources": [entry]}))
    registry, plugins, state = dirs(tmp_path)
    cdi = tmp_path / "cdi"
    command = run_command(
        tmp_path / "device-plugins",
        config,
        dev,
        *("--uevents", "off", "--status-file", str(tmp_path / "status.json")),
        *dra_options(tmp_path, name, plane.kubeconfig, driver),
        *options,
    )
    log = tmp_path / "draharness.log"
    try:
        async with DRAHarness.running(
            draharness, log, node_name=name, kubeconfig=plane.kubeconfig
        ) as harness:
            await harness.start(registry, plugins, state)
            await harness.wait_wipe(1)  # a starting kubelet deletes its node's slices
            yield Node(name, driver, api, harness, cdi, command)
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await api.delete(f"{RESOURCE_API}/deviceclasses/{device_class['metadata']['name']}")


def nodes_of(resolved: dict) -> list[tuple]:
    return sorted(
        (d["path"], d["type"], d["major"], d["minor"], d["uid"], d["gid"], d["fileMode"])
        for d in resolved["linuxDevices"]
    )


async def test_a_claim_is_allocated_prepared_resolved_kept_across_a_restart_and_unprepared(
    api, control_plane, draharness, cdicheck, tmp_path
):
    with trio.fail_after(LIMIT):
        async with dra_node(api, control_plane, draharness, tmp_path) as node:
            minor = os.minor(os.stat(tmp_path / "dev" / "dra0").st_rdev)
            async with powerdev(node):
                # `powerdev health --ready` and /readyz: registered by the kubelet.
                status = await wait_for_file(
                    tmp_path / "status.json", lambda text: '"registered"' in text
                )
                assert json.loads(status)["resources"][RESOURCE]["socket"].endswith("/dra.sock")
                claim = await node.pod_with_claim("p1")
                uid = claim["metadata"]["uid"]
                (result,) = claim["status"]["allocation"]["devices"]["results"]
                assert (result["driver"], result["pool"]) == (
                    node.driver,
                    pool_name(node.name, RESOURCE),
                )
                prepared = await node.harness.prepare(node.namespace, "p1")
                cdi_id = f"{node.driver}/claim={uid}-{result['device']}"
                assert prepared == {"c0": [cdi_id]}
                resolved = inject(cdicheck, [node.cdi], prepared["c0"])
                assert resolved["ok"], resolved
                assert nodes_of(resolved) == [
                    (str(Path("/dev/dra0")), "c", NODE_MAJOR, minor, UID, GID, MODE)
                ]
            # Stopped: its slices are gone, the claim's spec stays. A reboot
            # empties /var/run/cdi: the next daemon writes it again at start.
            spec = node.cdi / f"{node.driver}-{uid}.json"
            assert spec.exists()
            spec.unlink()
            async with powerdev(node):
                await wait_for_file(spec, lambda text: cdi_id.split("=")[1] in text)
                assert inject(cdicheck, [node.cdi], [cdi_id])["ok"]
                # A kubelet restart: the node's slices are wiped, the new
                # plugin manager registers powerdev again, which publishes
                # again; the next prepare asks the new daemon, which answers
                # the claim it prepared before its restart.
                await node.harness.restart()
                await node.harness.wait_wipe(1)
                await node.harness.wait_driver(node.driver)
                slices = f"{RESOURCE_API}/resourceslices"
                await node.api.wait_for(slices, slice_name(node.name, node.driver, RESOURCE, 0))
                again = await node.harness.prepare(node.namespace, "p1")
                assert set(again["c0"]) == {cdi_id}
                await api.merge_patch(
                    f"/api/v1/namespaces/{node.namespace}/pods/p1/status",
                    {"status": {"phase": "Succeeded"}},
                )
                await node.harness.unprepare(node.namespace, "p1")
                assert not spec.exists()
                gone = inject(cdicheck, [node.cdi], [cdi_id])
                assert not gone["ok"] and gone["unresolved"] == [cdi_id]


async def test_the_daemon_refuses_what_does_not_decode_and_a_claim_without_a_name_and_serves_on(
    api, control_plane, draharness, tmp_path
):
    """Against the kit's API server, the real daemon's DRA socket: a
    NodePrepareResources body whose last length runs past its end is
    InvalidArgument (never an answer from what was decoded); a claim
    reference with an empty namespace and name is refused in its own answer,
    never asked of the API server as a cluster-wide list; neither ends in a
    traceback, and the next claim is prepared through the kubelet's DRA
    manager as ever."""
    from powerdev._proto import dra_v1_pb2 as pb
    from powerdev.dra.names import endpoint
    from powerdev.rpc import asyncio_door
    from tests.dra.test_driver_services import raw_call

    log = tmp_path / "powerdev.log"
    prepare = f"/{pb.DESCRIPTOR.package}.DRAPlugin/NodePrepareResources"
    with trio.fail_after(LIMIT):
        async with dra_node(api, control_plane, draharness, tmp_path) as node:
            async with powerdev(node, log), asyncio_door():
                socket = endpoint(tmp_path / "plugins", node.driver)
                good = pb.NodePrepareResourcesRequest(
                    claims=[pb.Claim(namespace=node.namespace, name="p1", uid="uid-x")]
                ).SerializeToString()
                status, message, _ = await raw_call(socket, prepare, good[:-1])
                assert status == "INVALID_ARGUMENT", (status, message)
                assert "not a valid NodePrepareResourcesRequest message" in message
                nameless = pb.NodePrepareResourcesRequest(
                    claims=[pb.Claim(namespace="", name="", uid="uid-y")]
                ).SerializeToString()
                status, _, reply = await raw_call(socket, prepare, nameless)
                assert status == "OK"
                error = pb.NodePrepareResourcesResponse.FromString(reply).claims["uid-y"].error
                assert "an empty namespace and an empty name" in error
                await node.pod_with_claim("p1")
                prepared = await node.harness.prepare(node.namespace, "p1")
                assert len(prepared["c0"]) == 1
    text = log.read_text()
    assert "Traceback" not in text and "Application error" not in text, text[-3000:]


async def test_templates_distinct_devices_and_a_claim_for_more_than_there_is(
    api, control_plane, draharness, cdicheck, tmp_path
):
    """Two devices: a claim from a template and a direct claim get one each,
    never the same, and each resolves to its own node; a claim for three
    stays unschedulable."""
    with trio.fail_after(LIMIT):
        async with (
            dra_node(api, control_plane, draharness, tmp_path, ("dra0", "dra1")) as node,
            powerdev(node),
        ):
            await api.create(
                f"{RESOURCE_API}/namespaces/{node.namespace}/resourceclaimtemplates",
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaimTemplate",
                    "metadata": {"name": "one"},
                    "spec": {"spec": node.claim_spec()},
                },
            )
            await node.pod_using("t1", {"resourceClaimTemplateName": "one"})
            await node.bound("t1")
            await node.pod_with_claim("p2")
            resolved = []
            for name in ("t1", "p2"):
                (ids,) = (await node.harness.prepare(node.namespace, name)).values()
                answer = inject(cdicheck, [node.cdi], ids)
                assert answer["ok"], answer
                resolved.extend(d["path"] for d in answer["linuxDevices"])
            assert sorted(resolved) == ["/dev/dra0", "/dev/dra1"]

            await api.create(
                f"{RESOURCE_API}/namespaces/{node.namespace}/resourceclaims",
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": "three"},
                    "spec": node.claim_spec(3),
                },
            )
            await node.pod_using("too-many", {"resourceClaimName": "three"})

            def unschedulable(p: dict) -> bool:
                return any(
                    c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                    for c in p["status"].get("conditions", [])
                )

            pods = f"/api/v1/namespaces/{node.namespace}/pods"
            pending = await api.wait_for(pods, "too-many", unschedulable)
            assert "nodeName" not in pending["spec"]
            (scheduled,) = [
                c for c in pending["status"]["conditions"] if c["type"] == "PodScheduled"
            ]
            assert "cannot allocate all claims" in scheduled["message"]


async def test_a_claim_for_all_of_33_devices_waits_and_the_pool_stays_whole(
    api, control_plane, draharness, tmp_path
):
    """A claim gets at most 32 devices (the API's limit on its results): all
    33 devices are published, a claim for all of them waits, its pod
    Pending, and a claim for 32 of them is allocated."""
    names = tuple(f"dra{i}" for i in range(33))
    with trio.fail_after(LIMIT):
        async with (
            dra_node(api, control_plane, draharness, tmp_path, names) as node,
            powerdev(node),
        ):
            devices = await api.wait_for(
                f"{RESOURCE_API}/resourceslices", slice_name(node.name, node.driver, RESOURCE, 0)
            )
            assert len(devices["spec"]["devices"]) == 33
            claims = f"{RESOURCE_API}/namespaces/{node.namespace}/resourceclaims"
            spec = node.claim_spec()
            del spec["devices"]["requests"][0]["exactly"]["count"]
            spec["devices"]["requests"][0]["exactly"]["allocationMode"] = "All"
            body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim"}
            await api.create(claims, {**body, "metadata": {"name": "all"}, "spec": spec})
            await node.pod_using("all", {"resourceClaimName": "all"})
            pods = f"/api/v1/namespaces/{node.namespace}/pods"

            def refused(p: dict) -> bool:  # a scheduler error, tried again, never bound
                return any(
                    c["type"] == "PodScheduled"
                    and c["status"] == "False"
                    and "number of requested devices 33 exceeds the claim limit of 32"
                    in c.get("message", "")
                    for c in p["status"].get("conditions", [])
                )

            waiting = await api.wait_for(pods, "all", refused)
            assert "nodeName" not in waiting["spec"]
            claim = await node.pod_with_claim("most", count=32)
            assert len(claim["status"]["allocation"]["devices"]["results"]) == 32
