"""The real node's fixtures (powerdev/devtools/cluster/node.py): one node
for the whole session, with a control plane of its own, and what each test
needs to run `powerdev run` on it and pods that use its devices.

Without root, the kit or the host packages the tests skip with one line that
names what is missing; with CI=true they fail instead."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest
import trio

from powerdev.devtools import kit
from powerdev.devtools.cluster import node
from powerdev.devtools.cluster.client import Api, ApiError
from powerdev.devtools.cluster.node import Node
from powerdev.devtools.cluster.nodepods import (
    DRIVER,
    RESOURCE_API,
    all_registered,
    device_class,
    powerdev_command,
)
from powerdev.devtools.testing import stop
from tests import conftest
from tests.conftest import wait_for_file
from tests.controlplane_fixtures import LOOPBACK_NAMES, require_tools

NEEDED = (*kit.CONTROL_PLANE, "kubectl", *kit.NODE)
LIMIT = 90  # seconds: the bound of each step of a test on the node


@pytest.fixture(scope="session")
def real_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """The node, in a directory of pytest's (kept for the last runs, as
    pytest keeps them: its logs say what a failed test's node did)."""
    tools = require_tools(NEEDED)
    why = node.missing_parts()
    if why:
        conftest.require(None, why)
    root = tmp_path_factory.mktemp("node")
    with node.in_thread(root, tools, hosts=LOOPBACK_NAMES) as running:
        yield running
    # The fixture's promise: every process stopped, every directory it made gone.
    assert node.leftovers(root, tools) == []


@pytest.fixture
async def node_api(real_node: Node) -> AsyncIterator[Api]:
    async with real_node.plane.api() as client:
        yield client
    failures = real_node.plane.failures()
    assert not failures, "the control plane lost a process: " + "; ".join(failures)


@dataclass
class Namespace:
    """A test's namespace on the node, and what it asks of its pods."""

    api: Api
    name: str
    node: Node
    classes: list[str] = field(default_factory=list)  # DeviceClasses made for it

    @property
    def pods(self) -> str:
        return f"/api/v1/namespaces/{self.name}/pods"

    async def run_pod(self, body: dict) -> tuple[str, str]:
        """The pod created, once it has ended: its phase and its log."""
        await self.api.create(self.pods, body)
        return await self.ended(body["metadata"]["name"])

    async def ended(self, name: str) -> tuple[str, str]:
        done = await self.until(
            name, lambda p: p["status"].get("phase") in ("Succeeded", "Failed"), "end"
        )
        return done["status"]["phase"], await self.log(name)

    async def log(self, name: str) -> str:
        """The container's log, as `kubectl logs` gets it (the API server
        asks the kubelet)."""
        answer = await self.api.http.get(f"{self.pods}/{name}/log")
        answer.raise_for_status()
        return answer.text

    async def running(self, name: str) -> dict:
        """The pod once Running; a test failure that tells its story if it
        ends first, or is not Running within LIMIT."""
        pod = await self.until(
            name, lambda p: p["status"].get("phase") not in (None, "Pending"), "run"
        )
        if pod["status"]["phase"] != "Running":
            raise AssertionError(
                f"pod {self.name}/{name} went {pod['status']['phase']} instead of Running\n"
                + await pod_story(self.api, self.node, self.name, [name])
            )
        return pod

    async def until(self, name: str, predicate, what: str) -> dict:
        """The pod once predicate(pod) holds, within LIMIT; else a test
        failure with its status, its events and the kubelet's lines."""
        with trio.move_on_after(LIMIT):
            return await self.api.wait_for(self.pods, name, predicate)
        raise AssertionError(
            f"pod {self.name}/{name} did not {what} within {LIMIT} s\n"
            + await pod_story(self.api, self.node, self.name, [name])
        )

    async def wait_log(self, name: str, predicate, attempt: int = 0, container: str = "c0") -> str:
        """The pod's container log once predicate(text) holds: the file the
        runtime writes in the kubelet's podLogsDir for that attempt of the
        container (its restart count), woken by inotify, so that it goes on
        while the kubelet itself restarts."""
        pod = await self.api.get(f"{self.pods}/{name}")
        uid = pod["metadata"]["uid"]
        logs = self.node.root / "pod-logs" / f"{self.name}_{name}_{uid}"
        log = logs / container / f"{attempt}.log"
        log.parent.mkdir(parents=True, exist_ok=True)  # watched before the runtime makes it
        return await wait_for_file(log, predicate)

    async def count_passes(self, name: str, count: int) -> int:
        """Until the pod's log has a line `wrote N` with N above count
        (keep_writing()); returns that N."""
        found: list[int] = []

        def passes(text: str) -> bool:
            for line in text.splitlines():
                words = line.split()[3:]  # after the time, the stream and the tag
                if words[:1] == ["wrote"] and int(words[1]) > count:
                    found.append(int(words[1]))
                    return True
            return False

        await self.wait_log(name, passes)
        return found[0]

    async def device_class(self, resource: str, driver: str = DRIVER) -> str:
        """A DeviceClass for the devices of `resource`, named after the
        namespace; deleted with the namespace by the fixture."""
        return await self.create_device_class(device_class(f"{self.name}-dev", resource, driver))

    async def create_device_class(self, body: dict) -> str:
        """The DeviceClass `body` (a manifest, like deploy/dra's), created;
        deleted with the namespace by the fixture. Its name."""
        await self.api.create(f"{RESOURCE_API}/deviceclasses", body)
        self.classes.append(body["metadata"]["name"])
        return body["metadata"]["name"]

    async def delete_pod(self, name: str) -> None:
        await self.api.delete(f"{self.pods}/{name}")
        await self.api.wait_gone(self.pods, name)


@pytest.fixture
async def namespace(node_api: Api, real_node: Node) -> AsyncIterator[Namespace]:
    name = f"node-{secrets.token_hex(3)}"
    await node_api.create_namespace(name)
    made = Namespace(node_api, name, real_node)
    yield made
    with trio.CancelScope(shield=True), trio.move_on_after(LIMIT):
        for device_class_name in made.classes:
            await node_api.delete(f"{RESOURCE_API}/deviceclasses/{device_class_name}")
        await node_api.delete(f"/api/v1/namespaces/{name}")


@contextlib.asynccontextmanager
async def powerdev(
    real_node: Node, tmp: Path, resources: list[dict], *options: str, registered: bool = True
) -> AsyncIterator[trio.Process]:
    """`powerdev run` with `resources` as its config, its log in tmp; SIGTERM
    on the way out. With `registered`, once the kubelet has registered every
    resource (its status file says so): the kubelet tries a pod whose DRA
    driver it does not know yet again only at its next resync."""
    config = tmp / "config.json"
    config.write_text(json.dumps({"resources": resources}))
    status = tmp / "status.json"
    status.unlink(missing_ok=True)
    with (tmp / "powerdev.log").open("ab") as log:
        proc = await trio.lowlevel.open_process(
            powerdev_command(real_node, config, "--status-file", str(status), *options),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        if registered:
            await wait_for_file(status, partial(all_registered, len(resources)))
        yield proc
    finally:
        await stop(proc)


async def pod_story(api: Api, real_node: Node, namespace: str, names: list[str]) -> str:
    """What a test that waited in vain for pods prints: each pod's phase,
    conditions and container states, its events (the scheduler's and the
    kubelet's), then the kubelet's log lines that name it and its last ones."""
    told = []
    for name in names:
        try:
            pod = await api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        except ApiError as error:
            told.append(f"pod {name}: {error}")
            continue
        status = pod.get("status", {})
        told.append(f"pod {name}: phase {status.get('phase')}, node {pod['spec'].get('nodeName')}")
        for c in status.get("conditions", []):
            told.append(f"  {c['type']}={c['status']} {c.get('reason', '')} {c.get('message', '')}")
        for c in status.get("initContainerStatuses", []) + status.get("containerStatuses", []):
            told.append(f"  container {c['name']}: {json.dumps(c.get('state', {}))}")
        events = await api.get(
            f"/api/v1/namespaces/{namespace}/events", fieldSelector=f"involvedObject.name={name}"
        )
        for e in events["items"]:
            source = e.get("source", {}).get("component") or e.get("reportingComponent", "")
            told.append(
                f"  event {e.get('type')} {e.get('reason')} x{e.get('count', 1)} "
                f"({source}): {e.get('message', '')}"
            )
    lines = real_node.log("kubelet").read_text(errors="replace").splitlines()
    about = [line for line in lines if any(f'"{namespace}/{name}"' in line for name in names)]
    told.append(f"the kubelet's lines about them (last 20 of {len(about)}):")
    told += about[-20:]
    told.append(f"the kubelet's last lines ({real_node.log('kubelet')}):")
    told += lines[-15:]
    return "\n".join(told)


def written(backing: Path, mark: str) -> str:
    """What the host reads at the start of a loop device's file."""
    return backing.read_bytes()[: len(mark)].decode("ascii", "replace")


async def allocatable(api: Api, real_node: Node, resource: str, count: int) -> None:
    """Until the Node says `count` of `resource` are allocatable."""
    await api.wait_for(
        "/api/v1/nodes",
        real_node.name,
        lambda n: n["status"].get("allocatable", {}).get(resource) == str(count),
    )
