"""`powerdev bench --luns`: LUNs seen by several nodes ("scope": "cluster")
against the conformance kit's etcd and kube-apiserver (started here, as
`--dra` does), with `powerdev luns` as a child process.

- **A path change on a node** (root: block nodes): one real node, a
  `powerdev run` with a fake sysfs in which one multipath LUN runs over two
  SCSI paths, and one node simulated by a report the bench writes, both
  seeing the LUN. Both paths of the real node go offline, then come back;
  from the state files written to the node's report changed, and to the
  cluster pool's slice naming the nodes it must. With the API writes each
  change made: the node's report, and the slices whose resourceVersion
  moved.
- **At scale**: N Nodes and their N reports written by the bench (no
  daemon), every node seeing every one of L LUNs. From the start of
  `powerdev luns` to the whole pool at the API server; then changes of one
  LUN on one node (its last path lost, then back): from the report written
  to the pool's slice that holds the LUN selecting the nodes it must; the controller's CPU
  time per change (schedstat) and its RSS; the slices written. And, in
  this process, one pass of the controller's pure work on a report event
  (the report parsed, every report merged, the pool's slices built): its
  time and its peak allocation (tracemalloc).

It asserts nothing; `--json` writes the figures.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio

from powerdev.devtools.bench import (
    WAIT_LIMIT,
    Plan,
    Results,
    cpu_ns,
    machine,
    report,
    rss_mib,
    spread,
)
from powerdev.devtools.dra_bench import SLICES, bench_plane
from powerdev.devtools.testing import dra_options, is_root, run_command, stop
from powerdev.dra.luns import (
    Sighting,
    cluster_slice_name,
    cluster_slices,
    merge,
    parse_report,
    report_body,
    report_name,
)

RESOURCE = "powerdev.bench/lun"
DRIVER = "luns.bench.powerdev.test"
NAMESPACE = "default"
CONFIGMAPS = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
HEALTH_INTERVAL = 0.05  # the real node's path reads (its default: 5 s)
WWID = "3600a098038303053453f46304572{:04x}"
SIZE = 1 << 30


def problem() -> str | None:
    from powerdev.devtools.dra_bench import problem as dra_problem

    return dra_problem()


def selection(body: dict[str, Any]) -> dict[str, list[str]]:
    """Each device of a cluster slice -> the hostnames its selector names."""
    return {
        d["name"]: sorted(
            d["nodeSelector"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]
        )
        for d in body["spec"]["devices"]
    }


def _missing(pool: list[dict[str, Any]], found: list[Sighting], names: list[str]) -> list[Sighting]:
    """The LUNs the pool does not yet select on all the nodes."""
    now = {name: nodes for body in pool for name, nodes in selection(body).items()}
    return [lun for lun in found if now.get(lun.device) != names]


def sightings(count: int) -> list[Sighting]:
    return [
        Sighting(f"lun-{i:04d}", f"DM_UUID=mpath-{WWID.format(i)}", 2, SIZE, "IBM", "2145")
        for i in range(count)
    ]


@contextlib.asynccontextmanager
async def controller(plane: Any, log: Path, ttl: float = 3600.0) -> AsyncIterator[trio.Process]:
    command = [
        *run_command(Path("/"), Path("/"), Path("/"))[:3],
        "luns",
        *("--kubeconfig", str(plane.kubeconfig), "--namespace", NAMESPACE),
        *("--dra-driver", DRIVER, "--identity", "bench", "--report-ttl", str(ttl)),
    ]
    with log.open("ab") as out:
        proc = await trio.lowlevel.open_process(command, stderr=out)
    try:
        yield proc
    finally:
        await stop(proc)


async def pool_at(api: Any, generation: int = 0) -> list[dict[str, Any]]:
    """Every slice of the cluster pool once all carry one generation (at
    least `generation`): the first slice says how many there are."""
    first = cluster_slice_name(DRIVER, RESOURCE, 0)
    while True:
        zero = await api.wait_for(SLICES, first, partial(_at_least, generation))
        pool = zero["spec"]["pool"]
        found = [zero]
        for i in range(1, pool["resourceSliceCount"]):
            name = cluster_slice_name(DRIVER, RESOURCE, i)
            found.append(await api.wait_for(SLICES, name, partial(_at_least, pool["generation"])))
        if {s["spec"]["pool"]["generation"] for s in found} == {pool["generation"]}:
            return found
        generation = max(s["spec"]["pool"]["generation"] for s in found)


async def lun_seen(
    api: Any, pool: list[dict[str, Any]], device: str, nodes: list[str]
) -> tuple[list[dict[str, Any]], float]:
    """The whole pool once `device` is selected on exactly `nodes`, and
    when it was (perf_counter). A LUN keeps its slice, and a change of one
    slice is written at the same generation: so the slice that holds it is
    watched, until it selects the nodes (the pool is whole then; it is
    read after) or carries a newer generation (whole once every slice has
    it; the device is then looked for where it is now)."""
    at = time.perf_counter()
    while True:
        generation = pool[0]["spec"]["pool"]["generation"]
        holder, selected = _holder(pool, device)
        if selected == nodes:
            return pool, at
        body = await api.wait_for(SLICES, holder, partial(_moved, generation, device, nodes))
        at = time.perf_counter()
        pool = await pool_at(api, body["spec"]["pool"]["generation"])
        if body["spec"]["pool"]["generation"] != generation:
            at = time.perf_counter()


def _holder(pool: list[dict[str, Any]], device: str) -> tuple[str, list[str] | None]:
    """The slice that holds `device`, and the hostnames it names there (the
    first slice and None when no slice holds it); in the timed path, so
    it reads the one device, not every selection."""
    for body in pool:
        for found in body["spec"].get("devices", ()):
            if found["name"] == device:
                term = found["nodeSelector"]["nodeSelectorTerms"][0]
                return body["metadata"]["name"], sorted(term["matchExpressions"][0]["values"])
    return pool[0]["metadata"]["name"], None


def _moved(generation: int, device: str, nodes: list[str], body: dict[str, Any]) -> bool:
    """Has the slice a newer generation, or `device` selected on `nodes`?"""
    return body["spec"]["pool"]["generation"] > generation or selection(body).get(device) == nodes


def _at_least(generation: int, body: dict[str, Any]) -> bool:
    return body["spec"]["pool"]["generation"] >= generation  # type: ignore[no-any-return]


def versions(slices: list[dict[str, Any]]) -> dict[str, str]:
    return {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in slices}


# --- at scale: N simulated nodes, L LUNs -------------------------------------------


async def measure_scale(
    plane: Any, nodes: int, luns: int, changes: int, results: Results, say: Callable[[str], None]
) -> None:
    from powerdev.devtools.cluster.client import ApiError

    names = [f"bench-lun-{k:03d}" for k in range(nodes)]
    found = sightings(luns)
    async with plane.api() as api:
        for name in names:
            with contextlib.suppress(ApiError):  # made by an earlier size
                await api.create_node(name)
        bodies = {}
        for heartbeat, name in enumerate(names):
            bodies[name] = report_body(NAMESPACE, name, DRIVER, RESOURCE, found, heartbeat)
            await apply(api, bodies[name])
        with tempfile.TemporaryDirectory(prefix="powerdev-bench-luns-") as tmp:
            began = time.perf_counter()
            async with controller(plane, Path(tmp) / "luns.log") as proc:
                with trio.fail_after(WAIT_LIMIT):
                    pool = await pool_at(api)
                    while missing := _missing(pool, found, names):
                        pool, _ = await lun_seen(api, pool, missing[0].device, names)
                start = time.perf_counter() - began
                rss_start = rss_mib(proc.pid)
                results.add(
                    "LUNs: controller start to the whole cluster pool",
                    luns,
                    nodes=nodes,
                    slices=len(pool),
                    ms=round(start * 1000, 1),
                    rss_mib=rss_start,
                )
                samples, cpu, writes = [], [], []
                for i in range(changes):
                    node = names[i // 2 % nodes]
                    lost = i % 2 == 0  # its last path lost, then back
                    gone = found[i // 2 % luns].device
                    now = [s for s in found if not (lost and s.device == gone)]
                    body = report_body(NAMESPACE, node, DRIVER, RESOURCE, now, 1_000_000 + i)
                    want = names if not lost else [n for n in names if n != node]
                    before, used = versions(pool), cpu_ns(proc.pid)
                    began = time.perf_counter()
                    await apply(api, body)
                    with trio.fail_after(WAIT_LIMIT):
                        pool, seen_at = await lun_seen(api, pool, gone, want)
                    samples.append(seen_at - began)
                    cpu.append((cpu_ns(proc.pid) - used) / 1e9)
                    after = versions(pool)
                    writes.append(
                        sum(1 for n, v in after.items() if before.get(n) != v)
                        + len(set(before) - set(after))
                    )
                # Heartbeats: every node's report written again, its LUNs the
                # same; then one change, so that the controller is known to
                # have read them all (it reads the watch in order).
                used, beats = cpu_ns(proc.pid), 0
                for k, node in enumerate(names):
                    body = dict(bodies[node], data=dict(bodies[node]["data"]))
                    body["data"]["heartbeat"] = str(2_000_000 + k)
                    await apply(api, body)
                    beats += 1
                gone = found[0].device
                body = report_body(
                    NAMESPACE, names[0], DRIVER, RESOURCE,
                    [s for s in found if s.device != gone], 3_000_000,
                )  # fmt: skip
                await apply(api, body)
                with trio.fail_after(WAIT_LIMIT):
                    pool, _ = await lun_seen(api, pool, gone, names[1:])
                change = sorted(cpu)[len(cpu) // 2]
                per_beat = max(0.0, (cpu_ns(proc.pid) - used) / 1e9 - change) / beats
                rss = rss_mib(proc.pid)
        results.add(
            "LUNs: one LUN lost or back on one node, report to the whole pool",
            luns,
            nodes=nodes,
            slices=len(pool),
            slice_writes=max(writes),
            **spread(samples),
        )
        results.add("LUNs: the controller's CPU per change", luns, nodes=nodes, **spread(cpu))
        results.add("LUNs: the controller's RSS after the changes", luns, nodes=nodes, mib=rss)
        results.add(
            "LUNs: a heartbeat (a report written again, its LUNs the same): the controller's CPU",
            luns,
            nodes=nodes,
            heartbeats=beats,
            ms=round(per_beat * 1000, 2),
        )
        say(
            f"  {nodes} nodes, {luns} LUNs: the whole pool {start * 1000:.0f} ms after the "
            f"controller's start ({len(pool)} slices, RSS {rss_start} MiB); a change "
            f"{spread(samples)}, CPU {spread(cpu)}, 1 report + {max(writes)} slices written; "
            f"RSS {rss} MiB after {changes} changes; a heartbeat {per_beat * 1000:.2f} ms of CPU"
        )
        one_pass(bodies, names, results, say, nodes, luns)


def one_pass(
    bodies: dict[str, dict[str, Any]],
    names: list[str],
    results: Results,
    say: Callable[[str], None],
    nodes: int,
    luns: int,
) -> None:
    """The controller's pure work on one report event, in this process: the
    report parsed, every report merged, the pool's slices built."""
    reports = {name: parse_report(body) for name, body in bodies.items()}
    hostnames = {name: name for name in names}
    changed = bodies[names[0]]
    samples = []
    for _ in range(5):
        began = time.perf_counter()
        reports[names[0]] = parse_report(changed)
        devices, _ = merge(RESOURCE, reports.values(), hostnames)
        cluster_slices(DRIVER, RESOURCE, devices, 2)
        samples.append(time.perf_counter() - began)
    tracemalloc.start()
    reports[names[0]] = parse_report(changed)
    devices, _ = merge(RESOURCE, reports.values(), hostnames)
    cluster_slices(DRIVER, RESOURCE, devices, 2)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    figures = spread(samples)
    results.add(
        "LUNs: one pass (a report parsed, all merged, the slices built), in process",
        luns,
        nodes=nodes,
        peak_mib=round(peak / (1 << 20), 1),
        **figures,
    )
    say(f"  one pass in process {figures}, peak allocation {peak / (1 << 20):.1f} MiB")


async def apply(api: Any, body: dict[str, Any]) -> None:
    """A report written as a node writes it (server-side apply)."""
    name = body["metadata"]["name"]
    await api.request(
        "PATCH",
        f"{CONFIGMAPS}/{name}",
        body,
        params={"fieldManager": "bench", "force": "true"},
        content_type="application/apply-patch+yaml",
    )


# --- a path change on a real node --------------------------------------------------


def lun_sysfs(root: Path, minor: int, wwid: str, blocks: int) -> list[Path]:
    """A node's sysfs with one multipath LUN, dm-<minor> (253:<minor>) with DM
    UUID mpath-<wwid>, `blocks` of 512 bytes, over two running SCSI paths
    (sdd 8:48, sde 8:64); /dev/mapper/mpatha its node. The state file both
    paths read (the second path's is a link to the first's)."""
    sys_root = root / "sys"
    block = sys_root / "class" / "block"
    block.mkdir(parents=True)
    links = sys_root / "dev" / "block"
    links.mkdir(parents=True)
    dm = f"dm-{minor}"

    def device(where: Path, name: str, dev: str, **spec: Any) -> Path:
        directory = where / name
        directory.mkdir(parents=True)
        os.symlink(os.path.relpath(block.parent, directory), directory / "subsystem")
        major, number = dev.split(":")
        (directory / "dev").write_text(dev + "\n")
        (directory / "uevent").write_text(f"MAJOR={major}\nMINOR={number}\nDEVNAME={name}\n")
        os.symlink(os.path.relpath(directory, links), links / dev)
        os.symlink(os.path.relpath(directory, block), block / name)
        for sub in ("holders", "slaves"):
            (directory / sub).mkdir()
            for other in spec.get(sub, ()):
                (directory / sub / other).symlink_to(block / other)
        return directory

    states: list[Path] = []
    for lun, (name, dev) in enumerate((("sdd", "8:48"), ("sde", "8:64"))):
        scsi = sys_root / "devices" / f"pci0000:00/host1/target1:0:{lun}/1:0:{lun}:0"
        scsi.mkdir(parents=True)
        if states:  # both paths go in one write, as when the fabric goes
            (scsi / "state").symlink_to(states[0])
        else:
            (scsi / "state").write_text("running\n")
            states.append(scsi / "state")
        disk = device(scsi / "block", name, dev, holders=[dm])
        os.symlink(os.path.relpath(scsi, disk), disk / "device")
    mapped = device(sys_root / "devices" / "virtual" / "block", dm, f"253:{minor}")
    for other in ("sdd", "sde"):
        (mapped / "slaves" / other).symlink_to(block / other)
    (mapped / "dm").mkdir()
    (mapped / "dm" / "uuid").write_text(f"mpath-{wwid}\n")
    (mapped / "dm" / "suspended").write_text("0\n")
    (mapped / "size").write_text(f"{blocks}\n")
    node = root / "dev" / "mapper" / "mpatha"
    node.parent.mkdir(parents=True)
    os.mknod(node, stat.S_IFBLK | 0o600, os.makedev(253, minor))
    return states


def _reports_it(it: bool, body: dict[str, Any]) -> bool:
    return bool(json.loads(body["data"]["luns"])) == it


async def measure_path_change(
    plane: Any, changes: int, results: Results, say: Callable[[str], None]
) -> None:
    if not is_root():
        say("  a path change on a real node: skipped (needs root: block nodes)")
        return
    node, other = "bench-lun-real", "bench-lun-simulated"
    wwid = WWID.format(0xFFFF)
    async with plane.api() as api:
        for name in (node, other):
            await api.create_node(name)
        with tempfile.TemporaryDirectory(prefix="powerdev-bench-lun-") as tmp:
            root = Path(tmp)
            states = lun_sysfs(root, 3, wwid, 2048)
            config = root / "config.json"
            entry = {
                "name": RESOURCE,
                "api": "dra",
                "scope": "cluster",
                "include-devices": ["/dev/mapper/*"],
            }
            config.write_text(json.dumps({"resources": [entry]}))
            command = run_command(
                root / "device-plugins",
                config,
                root / "dev",
                *("--sys-root", str(root / "sys"), "--uevents", "off"),
                *("--health-interval", str(HEALTH_INTERVAL), "--lun-namespace", NAMESPACE),
                *("--lun-report-interval", "300"),  # its longest: no heartbeat among the writes
                *dra_options(root, node, plane.kubeconfig, DRIVER),
            )
            with (root / "powerdev.log").open("ab") as out:
                daemon = await trio.lowlevel.open_process(command, stderr=out)
            try:
                async with controller(plane, root / "luns.log"):
                    mine = report_name(node, DRIVER, RESOURCE)
                    with trio.fail_after(WAIT_LIMIT):
                        first = await api.wait_for(
                            CONFIGMAPS, mine, lambda r: r["data"]["luns"] != "[]"
                        )
                    (seen,) = parse_report(first).luns
                    twin = Sighting(
                        seen.device, seen.identity, 2, seen.size, seen.vendor, seen.model
                    )
                    await apply(api, report_body(NAMESPACE, other, DRIVER, RESOURCE, [twin], 1))
                    both = [sorted([node, other])]
                    with trio.fail_after(WAIT_LIMIT):
                        pool, _ = await lun_seen(api, await pool_at(api), seen.device, both[0])
                    to_report, to_pool, writes = [], [], []
                    for i in range(changes):
                        lost = i % 2 == 0
                        want = [[other]] if lost else both
                        mark = await api.get(f"{CONFIGMAPS}/{mine}")
                        before = versions(pool)
                        began = time.perf_counter()
                        for state in states:  # in one step: never read half-written
                            new = state.with_name("state.new")
                            new.write_text("transport-offline\n" if lost else "running\n")
                            new.replace(state)
                        with trio.fail_after(WAIT_LIMIT):
                            changed = await api.wait_for(
                                CONFIGMAPS, mine, partial(_reports_it, not lost)
                            )
                            to_report.append(time.perf_counter() - began)
                            pool, seen_at = await lun_seen(api, pool, seen.device, want[0])
                        to_pool.append(seen_at - began)
                        heartbeats = int(changed["data"]["heartbeat"]) - int(
                            mark["data"]["heartbeat"]
                        )
                        after = versions(pool)
                        writes.append(
                            (heartbeats, sum(1 for n, v in after.items() if before.get(n) != v))
                        )
            finally:
                await stop(daemon)
    results.add(
        "LUNs: both paths of a LUN lost or back on a node, to its report written",
        1,
        health_interval_s=HEALTH_INTERVAL,
        **spread(to_report),
    )
    results.add(
        "LUNs: the same, to the cluster pool updated",
        1,
        health_interval_s=HEALTH_INTERVAL,
        report_writes=max(w[0] for w in writes),
        slice_writes=max(w[1] for w in writes),
        **spread(to_pool),
    )
    say(
        f"  a path change on a node: its report {spread(to_report)}, the cluster pool "
        f"{spread(to_pool)} (--health-interval {HEALTH_INTERVAL}); writes per change "
        f"(report, slices): {sorted(set(writes))}"
    )


async def run_bench(
    plan: Plan, json_path: Path | None = None, say: Callable[[str], None] = print
) -> Results:
    results = Results(machine=machine())
    async with bench_plane(results, say) as plane:
        say("measuring a path change on a node, to the cluster pool")
        await measure_path_change(plane, plan.lun_changes, results, say)
        await clear(plane)
        say(f"measuring {plan.lun_nodes} simulated nodes and {plan.luns} LUNs")
        await measure_scale(plane, plan.lun_nodes, plan.luns, plan.lun_changes, results, say)
    await report(results, json_path, say)
    return results


async def clear(plane: Any) -> None:
    """The reports and the pool of one measure gone before the next."""
    async with plane.api() as api:
        for item in (await api.get(CONFIGMAPS))["items"]:
            if "powerdev.io/lun-report" in (item["metadata"].get("labels") or {}):
                await api.delete(f"{CONFIGMAPS}/{item['metadata']['name']}")
        for item in (await api.get(SLICES, fieldSelector=f"spec.driver={DRIVER}"))["items"]:
            await api.delete(f"{SLICES}/{item['metadata']['name']}")
