"""The API server away for a while, with powerdev as a DRA driver: `powerdev
run` (a real process) and the kubelet's DRA manager (draharness) on a
control plane of this test's own (the session's is shared: its API server
must never stop), whose kube-apiserver crashes (SIGKILL) while etcd keeps
the cluster's data, and starts again on its port.

While it is down, devices come and go, and the kubelet's question is asked
of the node service: a claim prepared before is answered from the
checkpoint, a claim never prepared gets an error of its own and the daemon
goes on serving. The kubelet cannot ask then (it reads the pod and the
claim from the API server first: the harness answers "get pod ...:
connection refused"), so the node service is called on its socket as the
kubelet calls it. Once the API server is back: the pool is published
again, once, with the devices there are now (the slice's
metadata.generation, which the API server counts up at each change of its
spec, says how many times it was written; the daemon's log says which
generations it published), the claim prepared before still resolves
through the CDI library, and the new claim prepares."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from powerdev._proto.k8s.io.kubelet.pkg.apis.dra import v1
from powerdev.devtools.cdicheck import inject
from powerdev.devtools.cluster import controlplane
from powerdev.devtools.cluster.client import Api
from powerdev.devtools.kit import CDICHECK
from powerdev.devtools.testing import dra_options, is_root, make_nodes, run_command, stop
from powerdev.dra.names import endpoint, pool_name, slice_name
from powerdev.rpc import asyncio_door
from tests.conftest import require_tool, wait_for_file
from tests.controlplane_fixtures import NEEDED, require_tools
from tests.dra.test_driver import RESOURCE, Node, dra_node
from tests.dra.test_driver_services import call
from tests.dra.test_harness import RESOURCE_API, dirs
from tests.integration.test_opsport import get

pytestmark = pytest.mark.skipif(not is_root(), reason="needs root: distinct nodes (mknod)")

LIMIT = 120  # seconds: a control plane of its own starts, and its API server once more
SLICES = f"{RESOURCE_API}/resourceslices"
PUBLISHED = re.compile(r"published \d+ DRA devices in pool \S+ \(generation (\d+)\)")


@pytest.fixture
def cdicheck() -> Path:
    return require_tool(CDICHECK)


def paths(item: dict) -> list[str]:
    return sorted(d["attributes"]["path"]["string"] for d in item["spec"]["devices"])


def with_port(node: Node) -> Node:
    """The node's `powerdev run` with its metrics and probe port on a free port."""
    return dataclasses.replace(node, command=[*node.command, "--metrics-address", "127.0.0.1:0"])


async def ops_port(log: Path) -> int:
    pattern = re.compile(r"serving /metrics, /healthz, /readyz on [\d.]+:(\d+)")
    text = await wait_for_file(log, lambda text: pattern.search(text) is not None)
    found = pattern.search(text)
    assert found is not None
    return int(found.group(1))


def failed_publications(answer: tuple[int, dict[str, str], bytes]) -> float:
    """powerdev_dra_publications_total{result="failed"}, summed over resources."""
    total = 0.0
    for line in answer[2].decode().splitlines():
        if line.startswith("powerdev_dra_publications_total{") and 'result="failed"' in line:
            total += float(line.rpartition(" ")[2])
    return total


def published(log: str) -> list[int]:
    """The generations the daemon says it published, in order."""
    return [int(g) for g in PUBLISHED.findall(log)]


@contextlib.asynccontextmanager
async def running(command: list[str], log: Path) -> AsyncIterator[trio.Process]:
    """`powerdev run`, its log in `log`; SIGTERM on the way out."""
    with log.open("ab") as stderr:
        proc = await trio.lowlevel.open_process(command, stderr=stderr)
    try:
        yield proc
    finally:
        await stop(proc)


@contextlib.asynccontextmanager
async def daemon(node: Node, log: Path) -> AsyncIterator[trio.Process]:
    """`powerdev run` once the kubelet has registered it (and so asked it to
    publish its pool again)."""
    async with running(node.command, log) as proc:
        await node.harness.wait_driver(node.driver)
        await wait_for_file(log, lambda text: "the kubelet registered driver" in text)
        yield proc


@contextlib.asynccontextmanager
async def outage(plane: controlplane.ControlPlane) -> AsyncIterator[None]:
    """kube-apiserver crashed (SIGKILL: every connection cut without an
    answer) while the block runs, etcd kept; started again on its port
    after the block, even a failed one, so that what follows can clean up."""
    await plane.stop_apiserver(kill=True)
    try:
        yield
    finally:
        with trio.CancelScope(shield=True):
            await plane.start_apiserver()


async def node_prepare(node: Node, *claims: dict) -> dict[str, v1.NodePrepareResourceResponse]:
    """NodePrepareResources (v1) on the driver's socket, as the kubelet calls it."""
    request = v1.NodePrepareResourcesRequest(
        claims=[
            v1.Claim(
                namespace=c["metadata"]["namespace"],
                name=c["metadata"]["name"],
                uid=c["metadata"]["uid"],
            )
            for c in claims
        ]
    )
    _, plugins, _ = dirs(node.cdi.parent)
    socket = endpoint(plugins, node.driver)
    answer = await call(socket, lambda ch: v1.DraPluginStub(ch).node_prepare_resources(request))
    return dict(answer.claims)


async def node_slices(api: Api, node: str) -> list[dict]:
    """Every ResourceSlice of the node."""
    listing = await api.get(SLICES, fieldSelector=f"spec.nodeName={node}")
    return listing["items"]


def device_paths(item: dict) -> dict[str, str]:
    """A slice's device names -> their paths."""
    return {d["name"]: d["attributes"]["path"]["string"] for d in item["spec"]["devices"]}


async def test_an_api_server_outage_loses_nothing_prepared_and_publishes_the_pool_once_after(
    draharness, cdicheck, tmp_path
):
    tools = require_tools(NEEDED)
    dev = tmp_path / "dev"
    log = tmp_path / "powerdev.log"
    with trio.fail_after(LIMIT):
        async with (
            controlplane.running(tmp_path / "cp", tools) as plane,
            plane.api() as api,
            dra_node(api, plane, draharness, tmp_path, ("dra0", "dra1")) as node,
            asyncio_door(),
            daemon(with_port(node), log) as proc,
        ):
            port = await ops_port(log)
            # A device made once the kubelet has asked for a publication:
            # the one that shows it is the last that anything asked for.
            make_nodes(dev, ["dra2"])
            first = slice_name(node.name, node.driver, RESOURCE, 0)
            three = ["/dev/dra0", "/dev/dra1", "/dev/dra2"]
            before = await api.wait_for(SLICES, first, lambda s: paths(s) == three)
            generation = before["spec"]["pool"]["generation"]
            # the log line of that publication: of its three devices (one
            # slice written alone keeps the generation an earlier one had)
            said = f"published 3 DRA devices in pool {pool_name(node.name, RESOURCE)} "
            text = await wait_for_file(log, lambda t: f"{said}(generation {generation})" in t)
            publications = published(text)
            assert publications[-1] == generation
            assert (await get(port, "/readyz"))[0] == 200  # published: nothing to say
            names = device_paths(before)
            # p1 prepared; p2 allocated and reserved for its pod by the
            # scheduler, never prepared.
            p1 = await node.pod_with_claim("p1")
            ids = (await node.harness.prepare(node.namespace, "p1"))["c0"]
            assert inject(cdicheck, [node.cdi], ids)["ok"]
            p2 = await node.pod_with_claim("p2")
            taken = {
                names[r["device"]]
                for c in (p1, p2)
                for r in c["status"]["allocation"]["devices"]["results"]
            }
            (spare,) = set(three) - taken

            async with outage(plane):
                # Devices change while nobody can publish: one made, one gone.
                make_nodes(dev, ["dra3"])
                await wait_for_file(log, lambda text: "added dra3;" in text)
                (dev / Path(spare).name).unlink()
                await wait_for_file(log, lambda text: f"removed {Path(spare).name};" in text)
                # Not ready while its pool cannot be published, and why; the
                # failed tries counted (the problem is set before it is logged).
                await wait_for_file(log, lambda text: "cannot publish its ResourceSlices" in text)
                status, _, body = await get(port, "/readyz")
                assert status == 503
                assert b"its ResourceSlices cannot be published" in body
                assert failed_publications(await get(port, "/metrics")) >= 1
                # The kubelet's question, on the driver's socket: the claim
                # prepared before is answered from the checkpoint; the new
                # one, which cannot be read, gets its own error, and no spec.
                answers = await node_prepare(node, p1, p2)
                first_answer = answers[p1["metadata"]["uid"]]
                assert first_answer.error == ""
                assert [i for d in first_answer.devices for i in d.cdi_device_ids] == ids
                error = answers[p2["metadata"]["uid"]].error
                assert f"ResourceClaim {node.namespace}/p2 cannot be read from the API" in error
                assert answers[p2["metadata"]["uid"]].devices == []
                assert not (node.cdi / f"{node.driver}-{p2['metadata']['uid']}.json").exists()
                assert proc.returncode is None
                again = await node_prepare(node, p1)  # still serving, after the error
                assert again[p1["metadata"]["uid"]].error == ""
            now = sorted({*three, "/dev/dra3"} - {spare})
            after = await api.wait_for(SLICES, first, lambda s: paths(s) == now)
            # One pool, in one slice, the same object written once more.
            (only,) = await node_slices(api, node.name)
            assert only["metadata"]["name"] == first
            assert only["metadata"]["uid"] == before["metadata"]["uid"]
            assert after["metadata"]["generation"] == before["metadata"]["generation"] + 1
            pool = after["spec"]["pool"]
            assert pool["name"] == pool_name(node.name, RESOURCE)
            assert pool["resourceSliceCount"] == 1
            # a write that failed may have been applied: the pool is written
            # anew, at a later generation
            assert pool["generation"] > generation
            assert len({d["name"] for d in after["spec"]["devices"]}) == len(now)
            text = await wait_for_file(log, lambda t: len(published(t)) > len(publications))
            assert published(text)[len(publications) :] == [pool["generation"]]
            assert (await get(port, "/readyz"))[0] == 200  # ready again once published

            # What was prepared still resolves; the new claim prepares now.
            resolved = inject(cdicheck, [node.cdi], ids)
            assert resolved["ok"], resolved
            ids2 = (await node.harness.prepare(node.namespace, "p2"))["c0"]
            resolved = inject(cdicheck, [node.cdi], ids2)
            assert resolved["ok"], resolved
            assert {d["path"] for d in resolved["linuxDevices"]} <= taken

            # The next change is the next write: nothing was published in
            # between (its one slice again, at the same pool generation).
            make_nodes(dev, ["dra4"])
            latest = await api.wait_for(SLICES, first, lambda s: "/dev/dra4" in paths(s))
            assert latest["metadata"]["generation"] == after["metadata"]["generation"] + 1
            assert latest["spec"]["pool"]["generation"] == pool["generation"]
            text = await wait_for_file(log, lambda t: len(published(t)) > len(publications) + 1)
            assert published(text)[len(publications) :] == [pool["generation"]] * 2
            assert plane.failures() == []


async def test_a_pool_that_shrinks_to_one_slice_meanwhile_loses_its_second_slice_after(tmp_path):
    """57 devices, two slices (56 and 1); the second slice's one device goes
    while the API server is away: once it is back, one slice of 56, written
    once more, and the second slice deleted. No kubelet: nothing else asks for a
    publication."""
    tools = require_tools(("etcd", "kube-apiserver"))
    dev = tmp_path / "dev"
    make_nodes(dev, [f"dra{i}" for i in range(57)])
    config = tmp_path / "config.json"
    entry = {"name": RESOURCE, "api": "dra", "include-devices": ["/dev/dra*"]}
    config.write_text(json.dumps({"resources": [entry]}))
    node, driver = "dra-shrink", "dra-shrink.powerdev.test"  # a control plane of its own
    log = tmp_path / "powerdev.log"
    with trio.fail_after(LIMIT):
        async with (
            controlplane.running(tmp_path / "cp", tools, controllers=False) as plane,
            plane.api() as api,
        ):
            command = run_command(
                tmp_path / "device-plugins",
                config,
                dev,
                *("--uevents", "off", *dra_options(tmp_path, node, plane.kubeconfig, driver)),
            )
            first, second = (slice_name(node, driver, RESOURCE, i) for i in (0, 1))
            async with running(command, log):
                two = await api.wait_for(
                    SLICES, second, lambda s: s["spec"]["pool"]["resourceSliceCount"] == 2
                )
                generation = two["spec"]["pool"]["generation"]
                # slices are written side by side: the first may come second
                before = await api.wait_for(
                    SLICES, first, lambda s: s["spec"]["pool"]["generation"] == generation
                )
                text = await wait_for_file(log, lambda t: generation in published(t))
                assert published(text) == [generation]

                # the device the second slice holds goes (a device keeps its
                # slice: the last by name, whatever its path)
                (gone,) = paths(two)
                async with outage(plane):
                    (dev / Path(gone).name).unlink()
                    await wait_for_file(log, lambda text: f"removed {Path(gone).name};" in text)

                await api.wait_gone(SLICES, second)
                (after,) = await node_slices(api, node)
                assert after["metadata"]["name"] == first
                assert after["metadata"]["uid"] == before["metadata"]["uid"]
                assert after["metadata"]["generation"] == before["metadata"]["generation"] + 1
                pool = after["spec"]["pool"]
                assert pool["resourceSliceCount"] == 1 and pool["generation"] > generation
                assert paths(after) == sorted({f"/dev/dra{i}" for i in range(57)} - {gone})
                assert len({d["name"] for d in after["spec"]["devices"]}) == 56
                text = await wait_for_file(log, lambda t: len(published(t)) > 1)
                assert published(text) == [generation, pool["generation"]]
            assert plane.failures() == []
