"""The test control plane itself: it runs the release that conformance/go.mod
names, kubectl at the same release talks to it, the scheduler binds a pod to
a Ready node by its extended resources (and leaves one that does not fit),
and the controller manager makes ServiceAccounts, collects garbage by owner
and finishes a namespace's deletion. A control plane of a test's own, of
etcd and the API server only, whose API server stops and starts again on
its port with its data."""

import json
import re

import httpx
import pytest
import trio

from powerdev.devtools import kit
from powerdev.devtools.cluster import controlplane
from powerdev.devtools.cluster.client import NOT_READY_TAINT, container, pod
from tests.controlplane_fixtures import require_tools

LIMIT = 60  # seconds: the bound of each test here
DEVICE = "example.com/dev"


def kit_release() -> str:
    text = (kit.ROOT / "conformance" / "go.mod").read_text()
    (release,) = re.findall(r"^\s*k8s\.io/kubernetes (v\S+)$", text, re.MULTILINE)
    return release


async def test_the_kits_release_serves_and_kubectl_matches(control_plane, api, capsys):
    with trio.fail_after(LIMIT):
        release = kit_release()
        assert (await api.get("/version"))["gitVersion"] == release
        done = await trio.run_process(
            control_plane.kubectl("version", "-o", "json"), capture_stdout=True
        )
        versions = json.loads(done.stdout)
        assert versions["clientVersion"]["gitVersion"] == release
        assert versions["serverVersion"]["gitVersion"] == release
    with capsys.disabled():
        print(
            f"\ncontrol plane {release} up in {control_plane.start_seconds:.1f} s "
            f"at {control_plane.server} (logs: {control_plane.root / 'logs'})"
        )


async def test_a_ready_node_takes_the_pods_that_fit_its_resources(api):
    with trio.fail_after(LIMIT):
        node = await api.create_node("node-a", {DEVICE: "2"})
        assert NOT_READY_TAINT not in [t["key"] for t in node["spec"].get("taints", [])]
        conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert conditions["Ready"] == "True"
        assert node["status"]["allocatable"][DEVICE] == "2"

        await api.create_namespace("scheduling")
        asks = {"limits": {DEVICE: "1"}}
        await api.create_pod("scheduling", pod("fits", container("app", asks)))
        too_many = {"limits": {DEVICE: "3"}}
        await api.create_pod("scheduling", pod("does-not-fit", container("app", too_many)))
        pods = "/api/v1/namespaces/scheduling/pods"
        bound = await api.wait_for(pods, "fits", lambda p: bool(p["spec"].get("nodeName")))
        assert bound["spec"]["nodeName"] == "node-a"

        def unschedulable(p: dict) -> bool:
            return any(
                c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                for c in p["status"].get("conditions", [])
            )

        pending = await api.wait_for(pods, "does-not-fit", unschedulable)
        assert "nodeName" not in pending["spec"]
        (scheduled,) = [c for c in pending["status"]["conditions"] if c["type"] == "PodScheduled"]
        assert f"Insufficient {DEVICE}" in scheduled["message"]


async def test_the_controller_manager_collects_garbage_and_finishes_namespaces(api):
    with trio.fail_after(LIMIT):
        await api.create_namespace("doomed")  # returns once its ServiceAccount is made
        maps = "/api/v1/namespaces/doomed/configmaps"
        owner = await api.create(maps, {"metadata": {"name": "owner"}})
        reference = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": "owner",
            "uid": owner["metadata"]["uid"],
        }
        await api.create(maps, {"metadata": {"name": "owned", "ownerReferences": [reference]}})
        await api.delete(f"{maps}/owner")
        await api.wait_gone(maps, "owned")  # the garbage collector

        await api.delete("/api/v1/namespaces/doomed")
        await api.wait_gone("/api/v1/namespaces", "doomed")  # the namespace controller


async def test_the_api_server_alone_stops_and_starts_again_on_its_port_with_its_data(tmp_path):
    tools = require_tools(("etcd", "kube-apiserver"))
    with trio.fail_after(2 * LIMIT):  # the start is bounded on its own (START_LIMIT)
        async with controlplane.running(tmp_path / "cp", tools, controllers=False) as plane:
            assert [c.name for c in plane.components] == ["etcd", "kube-apiserver"]
            maps = "/api/v1/namespaces/default/configmaps"
            async with plane.api() as api:
                await api.create(maps, {"metadata": {"name": "kept"}})
                etcd = plane.components[0].proc
                await plane.stop_apiserver()
                with pytest.raises(httpx.ConnectError):  # nothing listens on its port
                    await api.get("/readyz")
                await plane.start_apiserver()
                assert (await api.get(f"{maps}/kept"))["metadata"]["name"] == "kept"
            assert plane.components[0].proc is etcd and etcd.returncode is None
            log = plane.log("kube-apiserver").read_text()
            assert log.count("Serving securely on") == 2  # one log, both runs
            assert plane.failures() == []
