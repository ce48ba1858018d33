"""`powerdev bench --dra`: powerdev as a DRA driver against a real
kube-apiserver: etcd and the API server of the conformance kit
(cluster/controlplane.py), started here on 127.0.0.1 in a temp dir, and
stopped at the end.

At each device count N:
- publication, in this process, with the daemon's own code (dra/slices.py
  over dra/kubeapi.py): from an inventory of N devices to every
  ResourceSlice of a new pool accepted by the API server; then one device
  added, and one device degraded (its taint, effect None), each to its
  slice accepted (a device keeps its slice, and a change of one slice is
  that slice written at the same generation). With the slices and the API
  requests each took.
- the real daemon (`powerdev run`, a child process) with N device nodes and
  a resource that says "api": "dra": start to its pool at the API server;
  NodePrepareResources for a claim of one device, on the driver's socket,
  as the kubelet calls it (grpclib, one connection), the claim made here
  with a status.allocation written as the scheduler writes it, so that the
  daemon reads it from the API server; the same claim again (answered from
  the checkpoint); NodeUnprepareResources; the daemon's RSS and its longest
  Trio step.

No kubelet runs: nothing registers the driver or wipes its slices. It
asserts nothing; `--json` writes the figures.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import trio

from powerdev.devices.condition import DEGRADED, Condition
from powerdev.devices.model import Device
from powerdev.devtools import kit
from powerdev.devtools.bench import (
    WAIT_LIMIT,
    Daemon,
    Plan,
    Results,
    add_longest_step,
    machine,
    report,
    rss_mib,
    spread,
)
from powerdev.devtools.testing import NODE_MAJOR, dra_options, make_nodes
from powerdev.dra.names import endpoint, pool_name, slice_name
from powerdev.rpc import asyncio_door
from powerdev.rpc.kubelet_side import DraNodeClient

NEEDED = ("etcd", "kube-apiserver")
RESOURCE = "powerdev.bench/dra"
DRIVER = "dra.bench.powerdev.test"
NAMESPACE = "default"
RESOURCE_API = "/apis/resource.k8s.io/v1"
SLICES = f"{RESOURCE_API}/resourceslices"


def problem() -> str | None:
    """Why `powerdev bench --dra` cannot run here (one line), or None."""
    found = kit.find_all(NEEDED)
    missing = [name for name in NEEDED if name not in found]
    if missing:
        return kit.missing_message(missing)
    try:
        import cryptography  # noqa: F401  (the control plane's certificates)
    except ImportError:
        return "it needs the test extras (cryptography): pip install '.[test]'"
    return None


class CountingApi:
    """The daemon's SliceApi (dra/kubeapi.py), counting the requests made."""

    def __init__(self, api: Any) -> None:
        self._api = api
        self.requests = 0

    async def pool_slices(self, driver: str, node: str, pool: str) -> list[dict[str, Any]]:
        self.requests += 1
        return await self._api.pool_slices(driver, node, pool)  # type: ignore[no-any-return]

    async def apply_slice(self, body: dict[str, Any]) -> None:
        self.requests += 1
        await self._api.apply_slice(body)

    async def delete_slice(self, name: str) -> None:
        self.requests += 1
        await self._api.delete_slice(name)


def inventory(n: int) -> list[Device]:
    """N character devices as the tracker holds a DRA resource's: one unit each."""
    return [
        Device(f"char-{NODE_MAJOR}-{i}", f"/dev/bench{i}", "c", NODE_MAJOR, i) for i in range(n)
    ]


async def measure_publication(
    kubeconfig: Path, n: int, plan: Plan, results: Results, say: Callable[[str], None]
) -> None:
    """A new pool of N devices, published from scratch (a few pools), then
    changes of one device added to the last one."""
    from powerdev.dra import kubeapi
    from powerdev.dra.slices import Built, Pool, Since, build_devices_in_steps

    api = kubeapi.KubeApi(kubeapi.client(kubeconfig))
    try:
        first: list[float] = []
        for k in range(plan.dra_publications):
            counting = CountingApi(api)
            pool = Pool(counting, DRIVER, f"bench-{n}-{k}", RESOURCE)
            devices = inventory(n)
            built: Built = {}  # as the daemon keeps it (keep_published)
            began = time.perf_counter()
            await pool.publish(await build_devices_in_steps(RESOURCE, devices, built=built))
            first.append(time.perf_counter() - began)
        slices, requests = len(pool.names), counting.requests
        results.add(
            "DRA: inventory to every slice of a new pool accepted",
            n,
            slices=slices,
            requests=requests,
            **spread(first),
        )
        changes: list[float] = []
        for i in range(plan.dra_changes):
            devices.append(
                Device(f"char-{NODE_MAJOR}-{n + i}", f"/dev/new{i}", "c", NODE_MAJOR, n + i)
            )
            counting.requests = 0
            began = time.perf_counter()
            await pool.publish(await build_devices_in_steps(RESOURCE, devices, built=built))
            changes.append(time.perf_counter() - began)
        results.add(
            "DRA: one device added, its slice accepted",
            n,
            slices=len(pool.names),
            requests=counting.requests,
            **spread(changes),
        )
        added = counting.requests
        health = _Degraded()
        since: Since = {}
        await pool.publish(
            await build_devices_in_steps(RESOURCE, devices, health, built=built, since=since)
        )
        tainted: list[float] = []
        for i in range(plan.dra_changes):
            health.paths.add(devices[(i * 997) % n].path)  # one slice after another
            counting.requests = 0
            began = time.perf_counter()
            await pool.publish(
                await build_devices_in_steps(RESOURCE, devices, health, built=built, since=since)
            )
            tainted.append(time.perf_counter() - began)
        results.add(
            "DRA: one device degraded (a taint), its slice accepted",
            n,
            slices=len(pool.names),
            requests=counting.requests,
            **spread(tainted),
        )
        say(
            f"  {n} devices: a new pool {spread(first)} ({slices} slices, {requests} requests); "
            f"one device added {spread(changes)} ({added} requests); one degraded "
            f"{spread(tainted)} ({counting.requests} requests)"
        )
    finally:
        await api.aclose()


class _Degraded:
    """A device's health as the tracker says it: degraded for `paths`. Its
    conditions are made once, as the tracker reads each device's from the
    table: the bench must not make 10,000 objects a pass that the daemon
    does not."""

    FINE = Condition()
    DOWN = Condition(DEGRADED, "1 of 2 paths down")

    def __init__(self) -> None:
        self.paths: set[str] = set()

    def condition_of(self, device: Device) -> Condition:
        return self.DOWN if device.path in self.paths else self.FINE

    def offered_but_for_failure(self, device: Device) -> bool:
        return False


def _ref(claim: dict) -> tuple[str, str, str]:
    meta = claim["metadata"]
    return meta["namespace"], meta["name"], meta["uid"]


async def allocated_claim(api: Any, name: str, node: str, device: str) -> dict:
    """A ResourceClaim for one device, allocated as the scheduler allocates
    it (status.allocation: this driver, the node's pool, that device)."""
    claims = f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims"
    request = {"name": "dev", "exactly": {"deviceClassName": "bench"}}
    await api.create(
        claims,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [request]}},
        },
    )
    result = {
        "request": "dev",
        "driver": DRIVER,
        "pool": pool_name(node, RESOURCE),
        "device": device,
    }
    status = {"status": {"allocation": {"devices": {"results": [result]}}}}
    allocated: dict = await api.merge_patch(f"{claims}/{name}/status", status)
    return allocated


async def measure_daemon(
    plane: Any, n: int, plan: Plan, results: Results, say: Callable[[str], None]
) -> None:
    """`powerdev run` with N device nodes in a DRA resource, against the API server."""
    node = f"bench-daemon-{n}"
    with tempfile.TemporaryDirectory(prefix="powerdev-bench-") as tmp:
        root = Path(tmp)
        results.machine["nodes"] = make_nodes(root / "dev", [f"bench{i}" for i in range(n)])
        config = root / "config.json"
        entry = {"name": RESOURCE, "api": "dra", "include-devices": ["/dev/bench*"]}
        config.write_text(json.dumps({"resources": [entry]}))
        plugins = root / "plugins"
        options = dra_options(root, node, plane.kubeconfig, DRIVER)
        daemon = Daemon(root / "device-plugins", config, root / "dev", "off", *options)
        async with plane.api() as api:
            began = time.perf_counter()
            await daemon.start()
            try:
                published = await _pool_published(api, node, daemon)
                start = time.perf_counter() - began
                count = sum(len(s["spec"]["devices"]) for s in published)
                results.add(
                    "DRA: daemon start to its pool at the API server",
                    count,
                    ms=round(start * 1000, 1),
                )
                await _prepare_claims(api, plugins, node, published, count, plan, results, say)
                results.add("DRA: RSS", count, mib=rss_mib(daemon.pid))
                say(
                    f"  {count} devices: the daemon's pool at the API server {start * 1000:.0f} ms "
                    f"after its start; RSS {rss_mib(daemon.pid)} MiB"
                )
            finally:
                await daemon.stop()
        add_longest_step(results, count, daemon, say, "DRA run")


async def _pool_published(api: Any, node: str, daemon: Daemon) -> list[dict]:
    """The daemon's pool, once every slice of its first generation is at the
    API server: the first slice says how many there are (they are written
    a few at a time, in any order)."""
    first = slice_name(node, DRIVER, RESOURCE, 0)
    try:
        with trio.fail_after(WAIT_LIMIT):
            zero = await api.wait_for(SLICES, first)
            pool = zero["spec"]["pool"]
            for index in range(1, pool["resourceSliceCount"]):
                await api.wait_for(
                    SLICES,
                    slice_name(node, DRIVER, RESOURCE, index),
                    lambda s: s["spec"]["pool"]["generation"] == pool["generation"],
                )
    except trio.TooSlowError:
        raise RuntimeError(
            f"bench: the daemon's pool was not published within {WAIT_LIMIT:.0f}s; "
            f"its log ends:\n{daemon.log_tail()}"
        ) from None
    listing = await api.get(SLICES, fieldSelector=f"spec.nodeName={node}")
    return listing["items"]  # type: ignore[no-any-return]


async def _prepare_claims(
    api: Any,
    plugins: Path,
    node: str,
    published: list[dict],
    count: int,
    plan: Plan,
    results: Results,
    say: Callable[[str], None],
) -> None:
    names = sorted(d["name"] for s in published for d in s["spec"]["devices"])
    service = DraNodeClient(endpoint(plugins, DRIVER))
    prepare, again, unprepare = [], [], []
    try:
        for i in range(plan.claims):
            claim = await allocated_claim(api, f"bench-{count}-{i}", node, names[i % len(names)])
            uid = claim["metadata"]["uid"]
            for samples in (prepare, again):
                began = time.perf_counter()
                answer = await service.prepare([_ref(claim)])
                samples.append(time.perf_counter() - began)
                error, ids = answer[uid]
                if error or len(ids) != 1:
                    raise RuntimeError(f"bench: claim {uid} not prepared: {error or ids}")
            began = time.perf_counter()
            error = (await service.unprepare([_ref(claim)]))[uid]
            unprepare.append(time.perf_counter() - began)
            if error:
                raise RuntimeError(f"bench: claim {uid} not unprepared: {error}")
    finally:
        service.close()
    results.add(
        "DRA: NodePrepareResources (1 device, claim read from the API server)",
        count,
        **spread(prepare),
    )
    results.add("DRA: NodePrepareResources again (from the checkpoint)", count, **spread(again))
    results.add("DRA: NodeUnprepareResources", count, **spread(unprepare))
    say(
        f"  {count} devices: NodePrepareResources {spread(prepare)}; again {spread(again)}; "
        f"NodeUnprepareResources {spread(unprepare)}"
    )


@contextlib.asynccontextmanager
async def bench_plane(results: Results, say: Callable[[str], None]) -> AsyncIterator[Any]:
    """The kit's etcd and kube-apiserver in a temp dir, its release and start
    time in the results' machine lines."""
    from powerdev.devtools.cluster import controlplane

    tools = kit.find_all(NEEDED)
    with tempfile.TemporaryDirectory(prefix="powerdev-bench-cp-") as tmp:
        say("starting etcd and kube-apiserver of the conformance kit")
        async with controlplane.running(Path(tmp), tools, controllers=False) as plane:
            async with plane.api() as api:
                release = (await api.get("/version"))["gitVersion"]
            results.machine["api server"] = (
                f"kube-apiserver {release}, up in {plane.start_seconds:.1f} s"
            )
            yield plane


async def run_bench(
    plan: Plan, json_path: Path | None = None, say: Callable[[str], None] = print
) -> Results:
    results = Results(machine=machine())
    async with bench_plane(results, say) as plane, asyncio_door():
        for n in plan.sizes:
            say(f"measuring DRA publication with {n} devices")
            await measure_publication(plane.kubeconfig, n, plan, results, say)
        for n in plan.sizes:
            say(f"measuring the DRA daemon with {n} device nodes")
            await measure_daemon(plane, n, plan, results, say)
    await report(results, json_path, say)
    return results
