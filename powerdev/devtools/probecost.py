"""What a probe costs: `powerdev health` as an exec probe (a process per
probe) against httpGet on the daemon's own port, and what a /metrics scrape
costs the daemon. Measures, asserts nothing:

    .venv/bin/python -m powerdev.devtools.probecost            # about a minute
    .venv/bin/python -m powerdev.devtools.probecost --quick    # a smoke run

It starts the real daemon (`powerdev run --metrics-address 127.0.0.1:0`, a
separate process) against the fake kubelet, with DEVICES device nodes made
as links to /dev/null in a temp dir. An exec probe's CPU is the child's own
user+system time (wait4), and its memory the child's peak RSS; the kubelet
and the runtime spend more around each exec, which is not counted here. An
httpGet probe's CPU is the daemon's user+system time over many requests,
divided by their number (its idle CPU over the same time is a tick or two).
Last, the issue that made the port what it is: HELD idle connections are
opened and kept, and probes are timed (wall clock, connect to last byte)
while they are; with what the held connections cost the daemon in memory
and descriptors.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import trio

from powerdev.devtools.bytecode import compile_for_bench
from powerdev.devtools.fake_kubelet import FakeKubelet
from powerdev.devtools.testing import rss_kib, run_command
from powerdev.rpc import asyncio_door

RESOURCE = "power-dev-plugin/dev"
# The DaemonSet's probes: liveness every 30 s, readiness every 10 s.
PROBES_PER_MINUTE = 60 / 30 + 60 / 10
TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Plan:
    devices: int = 1000
    execs: int = 20
    gets: int = 3000
    scrapes: int = 300
    held: int = 200  # idle connections held open while probes are timed
    held_probes: int = 50


QUICK = Plan(devices=50, execs=2, gets=50, scrapes=10, held=200, held_probes=5)


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU so far, every thread included."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


# Run from a small helper process: a child's peak RSS includes the memory of
# the process it was forked from, up to its exec, and this one is large.
_SPAWNER = """
import json, os, sys
command, runs = json.loads(sys.argv[1]), int(sys.argv[2])
null = os.open(os.devnull, os.O_WRONLY)
results = []
for _ in range(runs):
    pid = os.fork()
    if pid == 0:
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.execv(command[0], command)
    _, status, usage = os.wait4(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    results.append((usage.ru_utime + usage.ru_stime, usage.ru_maxrss, code))
print(json.dumps(results))
"""


def exec_probes(command: list[str], runs: int) -> list[tuple[float, int, int]]:
    """(CPU seconds, peak RSS KiB, exit code) of each of `runs` runs of `command`."""
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", _SPAWNER, json.dumps(command), str(runs)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return [tuple(r) for r in json.loads(done.stdout)]


async def http_get(port: int, path: str) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: probe\r\n\r\n".encode())
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


async def measure(plan: Plan, say) -> dict[str, object]:
    figures: dict[str, object] = {"devices": plan.devices}
    with tempfile.TemporaryDirectory(prefix="pd-cost-") as tmp:
        root = Path(tmp)
        dev = root / "dev"
        dev.mkdir()
        for i in range(plan.devices):
            (dev / f"dm-{i}").symlink_to("/dev/null")
        config = root / "config.json"
        config.write_text('{"include-devices": ["/dev/dm-*"]}')
        status = root / "status.json"
        plugin_dir = root / "dp"
        command = run_command(
            plugin_dir,
            config,
            dev,
            "--metrics-address",
            "127.0.0.1:0",
            "--status-file",
            str(status),
            "--log-level",
            "info",
        )
        async with asyncio_door(), trio.open_nursery() as nursery:
            kubelet = FakeKubelet(plugin_dir)
            await nursery.start(kubelet.run)
            proc = await trio.lowlevel.open_process(command, stderr=subprocess.PIPE)
            try:
                port = await _port_from_log(proc.stderr)
                nursery.start_soon(_drain, proc.stderr)
                await kubelet.wait_until(
                    lambda k: RESOURCE in k.resources and k.resources[RESOURCE].updates
                )
                await _measure_against(proc.pid, port, status, plan, figures, say)
            finally:
                proc.terminate()
                await proc.wait()
            nursery.cancel_scope.cancel()
    return figures


async def _measure_against(pid, port, status, plan, figures, say) -> None:
    powerdev = str(Path(sys.executable).parent / "powerdev")
    env_status = ["--status-file", str(status)]
    figures["daemon_rss_mib"] = round((rss_kib(pid) or 0) / 1024, 1)

    # exec probes, as the DaemonSet ran them before
    for name, command in (
        ("exec powerdev health", [powerdev, "health", *env_status]),
        ("exec powerdev health --ready", [powerdev, "health", "--ready", *env_status]),
        (
            "exec python importing the gRPC stack (the old probe's imports)",
            [sys.executable, "-c", "import trio, trio_asyncio, grpclib, betterproto"],
        ),
    ):
        runs = await trio.to_thread.run_sync(exec_probes, command, plan.execs)
        assert all(code == 0 for _, _, code in runs), (name, runs)
        cpu = sum(r[0] for r in runs) / len(runs)
        rss = max(r[1] for r in runs) / 1024
        figures[name] = {"cpu_seconds_per_probe": round(cpu, 4), "peak_rss_mib": round(rss, 1)}
        say(f"{name}: {cpu * 1000:.1f} ms CPU per probe, peak RSS {rss:.1f} MiB (n={len(runs)})")

    # the daemon idle, for the baseline
    before, began = cpu_seconds(pid), time.monotonic()
    await trio.sleep(2.0)
    idle = (cpu_seconds(pid) - before) / (time.monotonic() - began)

    # httpGet probes, as the DaemonSet runs them now
    before, began = cpu_seconds(pid), time.monotonic()
    for i in range(plan.gets):
        reply = await http_get(port, "/readyz" if i % 4 else "/healthz")
        assert reply.startswith(b"HTTP/1.1 200 "), reply[:200]
    spent = cpu_seconds(pid) - before - idle * (time.monotonic() - began)
    per_get = max(spent, 0.0) / plan.gets
    figures["httpGet /healthz or /readyz"] = {"daemon_cpu_seconds_per_probe": round(per_get, 6)}
    say(
        f"httpGet /healthz, /readyz: {per_get * 1e6:.0f} µs of daemon CPU per probe (n={plan.gets})"
    )

    before, began = cpu_seconds(pid), time.monotonic()
    size = 0
    for _ in range(plan.scrapes):
        reply = await http_get(port, "/metrics")
        assert reply.startswith(b"HTTP/1.1 200 "), reply[:200]
        size = len(reply)
    spent = cpu_seconds(pid) - before - idle * (time.monotonic() - began)
    per_scrape = max(spent, 0.0) / plan.scrapes
    figures["GET /metrics"] = {"daemon_cpu_seconds_per_scrape": round(per_scrape, 6), "bytes": size}
    say(f"GET /metrics: {per_scrape * 1e3:.2f} ms of daemon CPU per scrape, {size} bytes")
    figures["daemon_idle_cpu_millicores"] = round(idle * 1000, 3)

    exec_avg = (
        (60 / 30) * figures["exec powerdev health"]["cpu_seconds_per_probe"]
        + (60 / 10) * figures["exec powerdev health --ready"]["cpu_seconds_per_probe"]
    ) / 60
    http_avg = PROBES_PER_MINUTE * per_get / 60
    figures["average_millicores_exec_probes"] = round(exec_avg * 1000, 3)
    figures["average_millicores_httpget_probes"] = round(http_avg * 1000, 4)
    say(
        f"average over the DaemonSet's periods (liveness 30 s, readiness 10 s): "
        f"exec {exec_avg * 1000:.2f}m CPU, httpGet {http_avg * 1000:.4f}m CPU; "
        f"daemon idle {idle * 1000:.3f}m; one scrape every 30 s: {per_scrape / 30 * 1000:.3f}m"
    )
    figures["daemon_rss_mib_after"] = round((rss_kib(pid) or 0) / 1024, 1)
    await _probes_while_held(pid, port, plan, figures, say)


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def _probes_while_held(pid, port, plan, figures, say) -> None:
    """Probe wall times while plan.held idle connections are kept open. The
    descriptors added are counted against a baseline that may still hold one
    connection of the steps before, closing: give or take one."""
    rss, descriptors = rss_kib(pid) or 0, _descriptors(pid)
    held: list[trio.SocketStream] = []
    try:
        for _ in range(plan.held):
            held.append(await trio.open_tcp_stream("127.0.0.1", port))
        times = []
        for _ in range(plan.held_probes):
            began = time.monotonic()
            reply = await http_get(port, "/healthz")
            times.append(time.monotonic() - began)
            assert reply.startswith(b"HTTP/1.1 200 "), reply[:200]
        grown = ((rss_kib(pid) or 0) - rss) / 1024
        more = _descriptors(pid) - descriptors
    finally:
        for stream in held:
            await trio.aclose_forcefully(stream)
    times.sort()
    name = f"httpGet /healthz with {plan.held} idle connections held"
    figures[name] = {
        "median_ms": round(times[len(times) // 2] * 1000, 2),
        "max_ms": round(times[-1] * 1000, 2),
        "daemon_rss_growth_mib": round(grown, 2),
        "daemon_descriptors_added": more,
    }
    say(
        f"{name}: median {times[len(times) // 2] * 1000:.1f} ms, max {times[-1] * 1000:.1f} ms "
        f"(n={len(times)}); they cost the daemon {grown:.1f} MiB RSS and {more} descriptors"
    )


async def _port_from_log(stream: trio.abc.ReceiveStream) -> int:
    buffer = b""
    while chunk := await stream.receive_some(65536):
        buffer += chunk
        found = re.search(rb"serving /metrics, /healthz, /readyz on [\d.]+:(\d+)", buffer)
        if found:
            return int(found.group(1))
    raise RuntimeError(f"the daemon never said where it serves: {buffer.decode()[-2000:]}")


async def _drain(stream: trio.abc.ReceiveStream) -> None:
    while await stream.receive_some(65536):
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m powerdev.devtools.probecost", description=__doc__
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run with few samples")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument(
        "--held", type=int, default=None, help="idle connections held while probes are timed"
    )
    args = parser.parse_args(argv)
    compile_for_bench(parser.prog)  # the daemon and the probes load bytecode, as in the image
    plan = QUICK if args.quick else Plan()
    if args.held is not None:
        plan = dataclasses.replace(plan, held=args.held)
    figures = trio.run(measure, plan, print)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
