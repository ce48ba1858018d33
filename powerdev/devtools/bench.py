"""`powerdev bench`: the real daemon process against the fake kubelet, over
real sockets, measured the way an admin judges a per-node daemon.

It reports, at each device count: time from process start to the kubelet's
first full list; Allocate latency (each grant carries every device); idle
CPU over a window; RSS (and in "each" mode, once its calls are made); and
the longest time one Trio task step held the
daemon's thread. As root, also at each device count: powerdev's own part of
a block device event on a synthetic host with the host-use rule on, a
mount that touches no listed device (the CPU of reading the host's tables
again) and one of a listed disk (to the list published without it, and back),
and the longest Trio step meanwhile (uevent_bench.py). Once: kubelet restart to
re-registration, and (as root) uevent to ListAndWatch message for real loop
devices.

Where the kubelet's real device manager (dmharness) is on the machine, also
at each device count: the first pod admission right after start, steady
admissions, and kubelet restart to capacity back, as the kubelet times them;
the same admissions with "allocation": "each" (GetPreferredAllocation with
every free ID, then Allocate), and the same for the design's floor (a
plugin on the same libraries that answers with fixed bytes, floor.py),
start to capacity included; and once, the kubelet's PodResources List
with many pods holding a device each, asked as the daemon asks it, with the
longest Trio step meanwhile. It asserts nothing; `--json` writes the
figures. `--dra` measures powerdev as a DRA driver instead (dra_bench.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from powerdev.config import DEFAULT_RESOURCE_NAME as RESOURCE
from powerdev.devices.condition import condition
from powerdev.devices.inuse import BlockTopology
from powerdev.devices.table import read_again
from powerdev.devices.uevents import NetlinkEvents
from powerdev.devtools import stepwatch, uevent_bench
from powerdev.devtools.devicemanager import DeviceManager
from powerdev.devtools.fake_kubelet import FakeKubelet
from powerdev.devtools.kit import DMHARNESS
from powerdev.devtools.testing import (
    FIRST_LOOP,
    LOOP_PATTERN,
    is_root,
    loop_control,
    make_nodes,
    rss_kib,
    run_command,
    stop,
)
from powerdev.ops.oplog import plural
from powerdev.rpc import asyncio_door
from powerdev.rpc.kubelet_side import PluginClient
from powerdev.rpc.podresources import held_ids

STOP_TIMEOUT = 10.0
PROFILE_ENV = "POWERDEV_BENCH_PROFILE"  # PATH: cProfile stats of the device events, PATH-<n>.pstats
WAIT_LIMIT = 60.0  # no single wait in the bench may take longer


async def wait_for(
    kubelet: FakeKubelet, what: str, predicate: Callable[[FakeKubelet], bool]
) -> None:
    try:
        with trio.fail_after(WAIT_LIMIT):
            await kubelet.wait_until(predicate)
    except trio.TooSlowError:
        raise RuntimeError(f"bench: {what} did not happen within {WAIT_LIMIT:.0f}s") from None


@dataclass
class Plan:
    sizes: tuple[int, ...] = (1000, 10000)
    allocations: int = 300
    restarts: int = 50
    uevents: int = 50
    # uevent_bench.py: cycles of a disk added, a disk changed, the disk removed
    event_cycles: int = 50
    idle_seconds: float = 10.0
    admissions: int = 50  # against the real device manager
    kubelet_restarts: int = 10
    pods: int = 2000  # pods holding one device each, for PodResources List
    pod_listings: int = 30
    # `--dra` (dra_bench.py): new pools published, one-device changes, claims prepared
    dra_publications: int = 5
    dra_changes: int = 20
    claims: int = 100
    # `--luns` (lun_bench.py): simulated nodes, the LUNs each sees, changes
    lun_nodes: int = 100
    luns: int = 1000
    lun_changes: int = 20
    health_passes: int = 20  # reads of every multipath map's paths (condition.py)


QUICK = Plan(
    sizes=(100,),
    allocations=20,
    restarts=5,
    uevents=4,
    event_cycles=4,
    idle_seconds=1.0,
    admissions=5,
    kubelet_restarts=2,
    pods=20,
    pod_listings=5,
    dra_publications=2,
    dra_changes=3,
    claims=5,
    lun_nodes=3,
    luns=20,
    lun_changes=4,
    health_passes=3,
)


@dataclass
class Results:
    machine: dict[str, object] = field(default_factory=dict)
    rows: list[dict[str, object]] = field(default_factory=list)

    def add(self, measure: str, devices: int | None, **figures: object) -> None:
        self.rows.append({"measure": measure, "devices": devices, **figures})


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def spread(samples_s: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in samples_s]
    return {
        "p50_ms": round(percentile(ms, 50), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "max_ms": round(max(ms), 2),
        "n": len(ms),
    }


def cpu_ns(pid: int) -> int:
    """CPU time the process has used, in ns (schedstat: exact, not ticks)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def rss_mib(pid: int) -> float:
    kib = rss_kib(pid)
    return float("nan") if kib is None else round(kib / 1024, 1)


class Daemon:
    """`powerdev run` as a child process, in a temp plugin dir, reporting
    its longest Trio step when it exits."""

    def __init__(
        self, plugin_dir: Path, config: Path, dev_root: Path, uevents: str, *options: str
    ) -> None:
        self.steps = plugin_dir.parent / "steps.json"
        self.args = run_command(
            plugin_dir,
            config,
            dev_root,
            "--uevents",
            uevents,
            "--status-file",
            str(plugin_dir.parent / "status"),
            *options,
        )
        self.log = plugin_dir.parent / "powerdev.log"
        self.proc: trio.Process | None = None
        self._steps: dict[str, object] | None = None

    async def start(self) -> None:
        env = {**os.environ, stepwatch.REPORT_ENV: str(self.steps)}
        with self.log.open("a") as log:
            self.proc = await trio.lowlevel.open_process(self.args, env=env, stderr=log)

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(self.log.read_text().splitlines()[-lines:])

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def stop(self) -> None:
        """SIGTERM, and once it has exited, its report of the longest steps
        (read now: the temp dir it is in may go before anyone asks)."""
        assert self.proc is not None
        await stop(self.proc, STOP_TIMEOUT)
        self._steps = stepwatch.read(self.steps)

    def longest_step(self) -> dict[str, object] | None:
        """After stop(): the longest Trio steps the daemon saw."""
        return self._steps


def add_longest_step(
    results: Results, n: int, daemon: Daemon, say: Callable[[str], None], run: str
) -> None:
    report = daemon.longest_step()
    if report is None:
        say(f"  {n} devices: no step report from the daemon")
        return
    steps = report["steps"]
    task = steps[0]["task"] if steps else "-"  # type: ignore[index]
    results.add(f"longest Trio step ({run})", n, ms=report["longest_ms"], task=task, steps=steps)
    say(f"  {n} devices: longest Trio step in the {run} {report['longest_ms']} ms ({task})")


@dataclass
class FakeRun:
    """The daemon against the fake kubelet, with n device nodes, once the
    kubelet has the full list."""

    kubelet: FakeKubelet
    daemon: Daemon
    plugin_dir: Path
    first_list: float  # seconds from process start to the full list at the kubelet
    nodes: str  # how the nodes were made


@contextlib.asynccontextmanager
async def against_fake_kubelet(n: int, **fields: object) -> AsyncIterator[FakeRun]:
    with tempfile.TemporaryDirectory(prefix="powerdev-bench-") as tmp:
        root = Path(tmp)
        how = make_nodes(root / "dev", [f"bench{i}" for i in range(n)])
        config = root / "config.json"
        config.write_text(json.dumps({"include-devices": ["/dev/bench*"], **fields}))
        plugin_dir = root / "device-plugins"
        async with trio.open_nursery() as nursery:
            kubelet = FakeKubelet(plugin_dir)
            await nursery.start(kubelet.run)
            # the kubelet's PodResources too, as on a node: what the daemon
            # holds at start until the kubelet says which pods hold what
            pods = ("--pod-resources-socket", str(kubelet.pod_resources_socket))
            daemon = Daemon(plugin_dir, config, root / "dev", "off", *pods)
            began = time.perf_counter()
            await daemon.start()
            try:
                await wait_for(
                    kubelet,
                    "the first full list",
                    lambda k: RESOURCE in k.resources and k.resources[RESOURCE].capacity == n,
                )
                first = time.perf_counter() - began
                yield FakeRun(kubelet, daemon, plugin_dir, first, how)
            finally:
                await daemon.stop()
            nursery.cancel_scope.cancel()


async def measure_size(
    n: int, plan: Plan, results: Results, say: Callable[[str], None], restarts: bool
) -> None:
    async with against_fake_kubelet(n) as run:
        kubelet = run.kubelet
        results.machine["nodes"] = run.nodes
        results.add("start to first full list", n, ms=round(run.first_list * 1000, 1))
        say(f"  {n} devices: first full list after {run.first_list * 1000:.0f} ms")

        client = PluginClient(run.plugin_dir / kubelet.resources[RESOURCE].endpoint)
        ids = sorted(kubelet.resources[RESOURCE].devices)
        samples = []
        size = 0
        for i in range(plan.allocations):
            t = time.perf_counter()
            size = await client.allocate_bytes([ids[i % len(ids)]])
            samples.append(time.perf_counter() - t)
        client.close()
        results.add("Allocate", n, answer_bytes=size, **spread(samples))
        say(f"  {n} devices: Allocate {spread(samples)} ({size} bytes each)")

        pid = run.daemon.pid
        before = cpu_ns(pid)
        await trio.sleep(plan.idle_seconds)
        idle_ms = (cpu_ns(pid) - before) / 1e6
        results.add(f"idle CPU over {plan.idle_seconds:g} s", n, ms=round(idle_ms, 2))
        rss = rss_mib(pid)
        results.add("RSS", n, mib=rss)
        say(f"  {n} devices: idle CPU {idle_ms:.2f} ms over {plan.idle_seconds:g} s, RSS {rss} MiB")

        if restarts:
            registered, listed = [], []
            for i in range(plan.restarts):
                t = time.perf_counter()
                await kubelet.restart()
                await wait_for(
                    kubelet, "re-registration", lambda k, want=i + 2: k.registrations >= want
                )
                registered.append(time.perf_counter() - t)
                await wait_for(
                    kubelet,
                    "the first list after a restart",
                    lambda k: k.resources[RESOURCE].connected and k.resources[RESOURCE].updates > 0,
                )
                listed.append(time.perf_counter() - t)
            results.add("kubelet restart to re-registration", n, **spread(registered))
            results.add("kubelet restart to first list at the kubelet", n, **spread(listed))
            say(
                f"  kubelet restart to re-registration: {spread(registered)}; "
                f"to the first list: {spread(listed)}"
            )
    add_longest_step(results, n, run.daemon, say, "fake kubelet run")


@dataclass
class RealRun:
    """The daemon against the kubelet's own device manager, with n device
    nodes, once the kubelet counts them all."""

    dm: DeviceManager
    daemon: Daemon
    capacity: float  # seconds from process start to the kubelet's capacity of n
    pod_resources_socket: Path


@contextlib.asynccontextmanager
async def against_device_manager(binary: Path, n: int, **fields: object) -> AsyncIterator[RealRun]:
    with tempfile.TemporaryDirectory(prefix="powerdev-bench-") as tmp:
        root = Path(tmp)
        make_nodes(root / "dev", [f"bench{i}" for i in range(n)])
        config = root / "config.json"
        config.write_text(json.dumps({"include-devices": ["/dev/bench*"], **fields}))
        plugin_dir = root / "device-plugins"
        plugin_dir.mkdir()
        async with DeviceManager.running(binary, root / "kubelet.log") as dm:
            started = await dm.call("start", plugin_dir)
            daemon = Daemon(plugin_dir, config, root / "dev", "off")
            began = time.perf_counter()
            await daemon.start()
            try:
                reply = await dm.call("wait", n, n, int(WAIT_LIMIT * 1000))
                if not reply["ok"]:
                    raise RuntimeError(f"bench: the kubelet never saw {n} devices: {reply}")
                capacity = time.perf_counter() - began
                yield RealRun(dm, daemon, capacity, Path(started["podresources_socket"]))
            finally:
                await daemon.stop()


async def admissions(dm: DeviceManager, count: int) -> tuple[float, list[float]]:
    """The first pod's admission (one device), then `count` more, each after
    the one before it is deleted: (first, steady) in seconds, as the kubelet
    times them."""
    first = await dm.call("admit", "first", 1)
    if not first["admitted"]:
        raise RuntimeError(f"bench: the first pod was refused: {first}")
    steady = []
    for i in range(count):
        await dm.call("delpod", "first" if i == 0 else f"pod{i - 1}")
        reply = await dm.call("admit", f"pod{i}", 1)
        if not reply["admitted"]:
            raise RuntimeError(f"bench: pod{i} was refused: {reply}")
        steady.append(reply["admit_ms"] / 1000)
    return first["admit_ms"] / 1000, steady


async def measure_real_kubelet(
    binary: Path, n: int, plan: Plan, results: Results, say: Callable[[str], None]
) -> None:
    """Against the kubelet's own device manager: admissions and restarts,
    timed by the kubelet itself (admit_ms, capacity_back_ms)."""
    async with against_device_manager(binary, n) as run:
        first, steady = await admissions(run.dm, plan.admissions)
        results.add("real kubelet: start to capacity", n, ms=round(run.capacity * 1000, 1))
        results.add("real kubelet: first admission after start", n, ms=round(first * 1000, 3))
        results.add("real kubelet: steady admission", n, **spread(steady))
        back = []
        for _ in range(plan.kubelet_restarts):
            reply = await run.dm.call("restart", n, int(WAIT_LIMIT * 1000))
            if not reply["capacity_back"]:
                raise RuntimeError(
                    f"bench: capacity did not come back: {reply}; powerdev's log ends:\n"
                    + run.daemon.log_tail()
                )
            back.append(reply["capacity_back_ms"] / 1000)
        results.add("real kubelet: restart to capacity back", n, **spread(back))
        say(
            f"  {n} devices, real kubelet: capacity after {run.capacity * 1000:.0f} ms; "
            f"first admission {first * 1000:.3f} ms; steady {spread(steady)}; "
            f"restart to capacity back {spread(back)}"
        )
    add_longest_step(results, n, run.daemon, say, "real kubelet run")


async def measure_real_kubelet_each(
    binary: Path, n: int, plan: Plan, results: Results, say: Callable[[str], None]
) -> None:
    """ "each" against the kubelet's own device manager: an admission is
    GetPreferredAllocation (every free ID, one wanted), then Allocate of the
    one chosen, timed by the kubelet."""
    async with against_device_manager(binary, n, allocation="each") as run:
        first, steady = await admissions(run.dm, plan.admissions)
        results.add("real kubelet, each: first admission after start", n, ms=round(first * 1000, 3))
        results.add("real kubelet, each: steady admission", n, **spread(steady))
        say(
            f"  {n} devices, real kubelet, each: first admission {first * 1000:.3f} ms; "
            f"steady {spread(steady)}"
        )
    add_longest_step(results, n, run.daemon, say, "real kubelet run, each")


async def measure_floor(
    binary: Path, n: int, plan: Plan, results: Results, say: Callable[[str], None]
) -> None:
    """The design's floor (floor.py) against the kubelet's own device
    manager, measured as powerdev is just before: start to capacity, and
    "each" admissions (GetPreferredAllocation, then Allocate) answered with
    bytes made at start. What the same stack costs before any work of its own."""
    with tempfile.TemporaryDirectory(prefix="powerdev-bench-") as tmp:
        root = Path(tmp)
        plugin_dir = root / "device-plugins"
        plugin_dir.mkdir()
        async with DeviceManager.running(binary, root / "kubelet.log") as dm:
            await dm.call("start", plugin_dir)
            command = [sys.executable, "-m", "powerdev.devtools.floor", str(plugin_dir), str(n)]
            began = time.perf_counter()
            proc = await trio.lowlevel.open_process(command)
            try:
                reply = await dm.call("wait", n, n, int(WAIT_LIMIT * 1000))
                if not reply["ok"]:
                    raise RuntimeError(f"bench: the kubelet never saw the floor's {n} devices")
                capacity = time.perf_counter() - began
                first, steady = await admissions(dm, plan.admissions)
            finally:
                await stop(proc, STOP_TIMEOUT)
    results.add("design floor: start to capacity", n, ms=round(capacity * 1000, 1))
    results.add("design floor, each: steady admission", n, **spread(steady))
    say(
        f"  {n} devices, the design's floor: capacity after {capacity * 1000:.0f} ms; "
        f"each: first admission {first * 1000:.3f} ms; steady {spread(steady)}"
    )


# The kubelet's PodResources service allows 100 calls a second (a burst of
# 10) and refuses the rest; the bench asks at most 50 a second.
POD_LISTING_PACE = 0.02  # seconds


async def measure_pod_resources(
    binary: Path, plan: Plan, results: Results, say: Callable[[str], None]
) -> None:
    """The kubelet's PodResources List with `plan.pods` pods holding one
    device each ("each", so each grant is its one device), asked with
    rpc.podresources.held_ids, in this process, as the daemon asks it:
    each call timed, and the longest Trio step of this process meanwhile
    (the reply's decoding, where it runs on the Trio thread)."""
    pods = plan.pods
    async with against_device_manager(binary, pods, allocation="each") as run:
        for i in range(pods):
            await run.dm.call("allocate", f"pod{i}", 1)
        samples = []
        watch = stepwatch.StepWatch()
        trio.lowlevel.add_instrument(watch)
        try:
            for _ in range(plan.pod_listings):
                await trio.sleep(POD_LISTING_PACE)
                t = time.perf_counter()
                held = await held_ids(run.pod_resources_socket)
                samples.append(time.perf_counter() - t)
                if len(held.get(RESOURCE, ())) != pods:
                    raise RuntimeError(
                        f"bench: PodResources listed {len(held.get(RESOURCE, ()))} of "
                        f"{pods} held devices"
                    )
        finally:
            trio.lowlevel.remove_instrument(watch)
    steps = watch.report()
    name = "PodResources List, one device per pod"
    results.add(name, pods, **spread(samples))
    task = steps["steps"][0]["task"] if steps["steps"] else "-"  # type: ignore[index]
    results.add(
        "longest Trio step (PodResources List)", pods, ms=steps["longest_ms"], task=task, **steps
    )
    say(
        f"  {pods} pods: PodResources List {spread(samples)}; "
        f"longest Trio step {steps['longest_ms']} ms ({task})"
    )


async def measure_each(n: int, plan: Plan, results: Results, say: Callable[[str], None]) -> None:
    """ "each" allocation: a grant carries the chosen devices only, and the
    kubelet asks GetPreferredAllocation first; both timed at the client."""
    async with against_fake_kubelet(n, allocation="each") as run:
        kubelet = run.kubelet
        results.add("each: start to first full list", n, ms=round(run.first_list * 1000, 1))
        client = PluginClient(run.plugin_dir / kubelet.resources[RESOURCE].endpoint)
        ids = sorted(kubelet.resources[RESOURCE].devices)
        allocate, prefer = [], []
        for i in range(plan.allocations):
            t = time.perf_counter()
            await client.allocate_bytes([ids[i % len(ids)], ids[(i + 1) % len(ids)]])
            allocate.append(time.perf_counter() - t)
            t = time.perf_counter()
            await client.preferred(ids, [ids[i % len(ids)]], 4)
            prefer.append(time.perf_counter() - t)
        client.close()
        results.add("each: Allocate (two devices)", n, **spread(allocate))
        results.add("each: GetPreferredAllocation (4 of all)", n, **spread(prefer))
        rss = rss_mib(run.daemon.pid)
        results.add("each: RSS", n, mib=rss)
        say(
            f"  {n} devices, each: first list {run.first_list * 1000:.0f} ms; Allocate "
            f"{spread(allocate)}; GetPreferredAllocation {spread(prefer)}; RSS {rss} MiB"
        )


async def measure_uevents(plan: Plan, results: Results, say: Callable[[str], None]) -> None:
    """From the moment a uevent arrives (on a monitor of our own) to the
    moment the kubelet holds the list it implies."""
    if not (is_root() and Path("/dev/loop-control").exists()):  # noqa: ASYNC240
        say("  uevent to ListAndWatch: skipped (needs root and /dev/loop-control)")
        return
    arrived: dict[tuple[str, str], float] = {}
    noted = trio.Event()

    async def note_uevents(source: NetlinkEvents) -> None:
        nonlocal noted
        while True:
            batch = await source.next_batch()
            now = time.perf_counter()
            for event in batch if isinstance(batch, list) else ():
                for path in event.paths:
                    arrived[(event.action, Path(path).name)] = now
            noted.set()
            noted = trio.Event()

    async def since_arrival(key: tuple[str, str]) -> float:
        """Seconds from the uevent's arrival on our monitor to now. Our
        monitor may read it after the daemon has published (both get the
        same multicast): then it waits for the arrival, and counts 0."""
        listed = time.perf_counter()
        while key not in arrived:
            await noted.wait()
        return max(0.0, listed - arrived[key])

    with (
        tempfile.TemporaryDirectory(prefix="powerdev-bench-") as tmp,
        loop_control() as loops,
        NetlinkEvents("kernel") as source,
    ):
        root = Path(tmp)
        config = root / "config.json"
        config.write_text(json.dumps({"include-devices": [LOOP_PATTERN]}))
        plugin_dir = root / "device-plugins"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(note_uevents, source)
            kubelet = FakeKubelet(plugin_dir)
            await nursery.start(kubelet.run)
            daemon = Daemon(plugin_dir, config, Path("/dev"), "kernel")
            await daemon.start()
            try:
                await wait_for(
                    kubelet,
                    "registration",
                    lambda k: RESOURCE in k.resources and k.resources[RESOURCE].updates > 0,
                )
                samples: dict[str, list[float]] = {"add": [], "remove": []}
                for i in range(plan.uevents // 2):
                    index = FIRST_LOOP + i % 100
                    name = f"loop{index}"
                    # offered once it has a medium: from the "change" that says so
                    arrived.pop(("change", name), None)
                    loops.add(index, medium=True)
                    await wait_for(
                        kubelet,
                        f"{name} in the list",
                        lambda k, n=name: n in k.resources[RESOURCE].devices,
                    )
                    samples["add"].append(await since_arrival(("change", name)))
                    # LOOP_CTL_REMOVE blocks for ~40 ms in the kernel; its uevent
                    # comes during that time, so run it beside the daemon.
                    async with trio.open_nursery() as removing:
                        removing.start_soon(trio.to_thread.run_sync, loops.remove, index)
                        await wait_for(
                            kubelet,
                            f"{name} gone from the list",
                            lambda k, n=name: n not in k.resources[RESOURCE].devices,
                        )
                        samples["remove"].append(await since_arrival(("remove", name)))
                for action, values in samples.items():
                    results.add(f"uevent to ListAndWatch ({action})", None, **spread(values))
                both = spread(samples["add"] + samples["remove"])
                results.add("uevent to ListAndWatch (all)", None, **both)
                say(f"  uevent to ListAndWatch: {both}")
            finally:
                await daemon.stop()
            nursery.cancel_scope.cancel()


async def measure_device_events(
    n: int, plan: Plan, results: Results, say: Callable[[str], None]
) -> None:
    """powerdev's own part of a device event (uevent_bench.py, a child
    process), with this process as its kubelet."""
    if not is_root():
        say("  device events: skipped (needs root: the host's block nodes are made with mknod)")
        return
    with tempfile.TemporaryDirectory(prefix="powerdev-bench-") as tmp:
        root = Path(tmp)
        plugin_dir = root / "device-plugins"
        log = root / "powerdev.log"
        command = [
            *(sys.executable, "-m", "powerdev.devtools.uevent_bench", "--root", str(root / "host")),
            *("--plugin-dir", str(plugin_dir), "--devices", str(n)),
            *("--cycles", str(plan.event_cycles)),
        ]
        profile = os.environ.get(PROFILE_ENV)
        if profile:
            command += ["--profile", f"{profile}-{n}.pstats"]
        async with trio.open_nursery() as nursery:
            kubelet = FakeKubelet(plugin_dir)
            await nursery.start(kubelet.run)
            with log.open("a") as stderr:
                child = await trio.lowlevel.open_process(
                    command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr
                )
            try:
                assert child.stdout is not None and child.stdin is not None
                lines = uevent_bench.JsonLines(child.stdout, child.stdin)
                report, at_kubelet = await kubelet_for(kubelet, lines)
            except (EOFError, trio.TooSlowError, RuntimeError) as err:
                tail = "\n".join(log.read_text().splitlines()[-15:])
                raise RuntimeError(
                    f"bench: device events at {n}: {err}; its log ends:\n{tail}"
                ) from None
            finally:
                with trio.move_on_after(STOP_TIMEOUT):
                    await child.wait()
                if child.returncode is None:
                    child.kill()
                    await child.wait()
            nursery.cancel_scope.cancel()
    published = report["add"] + report["remove"]
    name = "device event to published list"
    results.add(f"{name} (add and remove)", n, **spread(published))
    results.add(f"{name} (add)", n, **spread(report["add"]))
    results.add(f"{name} (remove)", n, **spread(report["remove"]))
    results.add("device event that changes nothing, to applied", n, **spread(report["change"]))
    results.add("device or mount event to the list at the fake kubelet", n, **spread(at_kubelet))
    mounts = report["mount elsewhere"]
    results.add("mount that touches no listed device: host tables read (CPU)", n, **spread(mounts))
    mounted = report["mount"]
    results.add("mount of a listed disk, to published list (Unhealthy)", n, **spread(mounted))
    results.add("unmount of a listed disk, to published list", n, **spread(report["unmount"]))
    steps = report["steps"]
    task = steps["steps"][0]["task"] if steps["steps"] else "-"
    results.add("longest Trio step (device events)", n, ms=steps["longest_ms"], task=task, **steps)
    say(
        f"  {n} devices ({report['listed']} listed): to published {spread(published)}; "
        f"change {spread(report['change'])}; at the kubelet {spread(at_kubelet)}; "
        f"mount elsewhere (CPU) {spread(mounts)}; mount {spread(report['mount'])}; "
        f"unmount {spread(report['unmount'])}; "
        f"longest Trio step {steps['longest_ms']} ms ({task})"
    )


async def kubelet_for(
    kubelet: FakeKubelet, lines: uevent_bench.JsonLines
) -> tuple[dict[str, Any], list[float]]:
    """Answer the child's waits until it reports: (its report, seconds from
    each event's hand-over to the list at this kubelet)."""
    at_kubelet: list[float] = []
    first = 0  # lists the kubelet had when the child began
    while True:
        with trio.fail_after(WAIT_LIMIT):
            message = await lines.read()
        if "result" in message:
            return message["result"], at_kubelet  # type: ignore[return-value]
        wait: dict[str, Any] = message["wait"]  # type: ignore[assignment]
        if "devices" in wait:
            await wait_for(kubelet, "the first full list", partial(_has_count, wait["devices"]))
            first = kubelet.resources[RESOURCE].updates
        else:
            what = f"the list after {wait['id']} {'came' if wait['present'] else 'went'}"
            if wait["present"] and not wait.get("healthy", True):
                what = f"the list with {wait['id']} Unhealthy"
            await wait_for(kubelet, what, partial(_has_list, first, wait))
            at_kubelet.append(time.monotonic() - wait["taken"])
        await lines.write({"ok": True})


def _has_count(count: int, kubelet: FakeKubelet) -> bool:
    state = kubelet.resources.get(RESOURCE)
    return state is not None and state.connected and state.capacity == count


def _has_list(first: int, wait: dict[str, Any], kubelet: FakeKubelet) -> bool:
    """The kubelet has every list published since the first, and the last one
    has the device or not as it should."""
    state = kubelet.resources[RESOURCE]
    health = state.devices.get(wait["id"])
    if wait["present"]:
        listed = health == ("Healthy" if wait.get("healthy", True) else "Unhealthy")
    else:
        listed = health is None
    return state.updates >= first + wait["publications"] and listed


def table(results: Results) -> str:
    lines = ["| measure | devices | result |", "| --- | --- | --- |"]
    for row in results.rows:
        figures = {k: v for k, v in row.items() if k not in ("measure", "devices")}
        if "p50_ms" in figures:
            text = (
                f"p50 {figures['p50_ms']} ms, p99 {figures['p99_ms']} ms "
                f"(max {figures['max_ms']} ms, n={figures['n']})"
            )
        elif "mib" in figures:
            text = f"{figures['mib']} MiB"
        elif "task" in figures:
            text = f"{figures['ms']} ms ({figures['task']})"
        else:
            text = f"{figures['ms']} ms"
        if "requests" in figures:
            slices, requests = figures["slices"], figures["requests"]
            text += f"; {plural(slices, 'slice')}, {plural(requests, 'request')}"
        shown = {"p50_ms", "p99_ms", "max_ms", "n", "mib", "ms", "task", "steps", "requests"}
        if "requests" in figures:
            shown.add("slices")
        for key, value in figures.items():  # any other figure (`--luns`'s), as it is
            if key not in shown:
                text += f"; {key.replace('_', ' ')} {value}"
        lines.append(f"| {row['measure']} | {row['devices'] or '-'} | {text} |")
    return "\n".join(lines)


def machine() -> dict[str, object]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "root": is_root(),
    }


async def report(results: Results, json_path: Path | None, say: Callable[[str], None]) -> None:
    """The machine, the table, and the figures in `json_path` if given."""
    say("")
    say(f"machine: {results.machine}")
    say(table(results))
    if json_path is not None:
        text = json.dumps({"machine": results.machine, "rows": results.rows}, indent=2)
        await trio.Path(json_path).write_text(text)
        say(f"wrote {json_path}")


def multipath_sysfs(root: Path, maps: int) -> list[tuple[str, int, int]]:
    """A sysfs tree of `maps` multipath maps, each over two SCSI paths, as
    the kernel lays it out; the maps' keys."""
    block = root / "class" / "block"
    block.mkdir(parents=True)
    keys = []
    for i in range(maps):
        for leg in (0, 1):
            device = root / "devices" / "host0" / f"0:0:{i}:{leg}"
            disk = device / "block" / f"sd{i}x{leg}"
            disk.mkdir(parents=True)
            (device / "state").write_text("running\n")
            (disk / "device").symlink_to(device)
            (block / disk.name).symlink_to(disk)
        mpath = root / "devices" / "virtual" / "block" / f"dm-{i}"
        (mpath / "dm").mkdir(parents=True)
        (mpath / "dm" / "uuid").write_text(f"mpath-3600a{i:08x}\n")
        (mpath / "dm" / "suspended").write_text("0\n")
        (mpath / "slaves").mkdir()
        for leg in (0, 1):
            (mpath / "slaves" / f"sd{i}x{leg}").symlink_to(block / f"sd{i}x{leg}")
        (block / mpath.name).symlink_to(mpath)
        (root / "dev" / "block").mkdir(parents=True, exist_ok=True)
        (root / "dev" / "block" / f"253:{i}").symlink_to(mpath)
        keys.append(("b", 253, i))
    return keys


async def measure_health(n: int, plan: Plan, results: Results, say: Callable[[str], None]) -> None:
    """One recheck of what devices say of their health (--health-interval):
    its worker thread's read of every multipath map's paths, from a tree of
    n maps over 2n SCSI paths."""
    with tempfile.TemporaryDirectory(prefix="powerdev-bench-") as tmp:
        root = Path(tmp) / "sys"
        keys = multipath_sysfs(root, n)
        topology = BlockTopology(root)
        watched = [(key, None, condition(topology, key, None)) for key in keys]
        assert all(c.path_counts() == {"running": 2} for _, _, c in watched)
        samples, changed = [], []
        for i in range(plan.health_passes):
            began = time.perf_counter()
            assert not await trio.to_thread.run_sync(read_again, root, Path(tmp), watched)
            samples.append(time.perf_counter() - began)
            # one path of one map goes offline: that map is read again in full
            state = root / "devices" / "host0" / f"0:0:{i % n}:1" / "state"
            state.write_text("offline\n")
            began = time.perf_counter()
            found = await trio.to_thread.run_sync(read_again, root, Path(tmp), watched)
            changed.append(time.perf_counter() - began)
            assert len(found) == 1 and next(iter(found.values())).level == "degraded"
            state.write_text("running\n")
    figures, one = spread(samples), spread(changed)
    results.add("health recheck, nothing changed (worker thread)", n, **figures)
    results.add("health recheck, one path offline (worker thread)", n, **one)
    say(f"  {n} multipath maps (2 paths each): a recheck {figures}; one path offline {one}")


async def run_bench(
    plan: Plan, json_path: Path | None = None, say: Callable[[str], None] = print
) -> Results:
    results = Results(machine=machine())
    async with asyncio_door():
        for i, n in enumerate(plan.sizes):
            say(f"measuring with {n} device nodes")
            await measure_size(n, plan, results, say, restarts=i == 0)
        for n in plan.sizes:
            say(f'measuring "each" allocation with {n} device nodes')
            await measure_each(n, plan, results, say)
        for n in plan.sizes:
            say(f"measuring device events with {n} block nodes (host-use rule on)")
            await measure_device_events(n, plan, results, say)
        for n in plan.sizes:
            say(f"measuring the health recheck with {n} multipath maps")
            await measure_health(n, plan, results, say)
        say("measuring uevents with real loop devices")
        await measure_uevents(plan, results, say)
        binary = DMHARNESS.find()
        if binary is None:
            say("  real kubelet: skipped (no dmharness; set $POWERDEV_DMHARNESS)")
        for n in plan.sizes if binary is not None else ():
            say(f"measuring against the kubelet's device manager with {n} device nodes")
            await measure_real_kubelet(binary, n, plan, results, say)
        for n in plan.sizes if binary is not None else ():
            say(f'measuring "each" against the kubelet\'s device manager with {n} device nodes')
            await measure_real_kubelet_each(binary, n, plan, results, say)
            say(f"measuring the design's floor against the kubelet's device manager, {n} devices")
            await measure_floor(binary, n, plan, results, say)
        if binary is not None:
            say(f"measuring PodResources List with {plan.pods} pods")
            await measure_pod_resources(binary, plan, results, say)
    await report(results, json_path, say)
    return results
