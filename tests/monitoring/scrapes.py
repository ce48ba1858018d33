"""What a real powerdev's /metrics says in each state an alert is about,
scraped from `powerdev run` (a child process) beside the fake kubelet, on a
--sys-root tree whose multipath paths and SCSI disk go offline and come
back: fine, degraded, failed, an Allocate refused, a config change
rejected, the kubelet gone, and a node with no matching device.

Each scrape is kept as plain samples: (name, labels) -> value. The alert
tests (test_alerts.py) turn them into promtool series."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio
from prometheus_client.parser import text_string_to_metric_families

from powerdev.devtools.fake_kubelet import FakeKubelet
from powerdev.devtools.testing import run_command
from powerdev.rpc import asyncio_door
from powerdev.rpc.kubelet_side import PluginCallError
from tests.integration.test_opsport import get
from tests.integration.test_opsport_process import Lines
from tests.unit.test_condition import san, scsi
from tests.unit.test_family import nodes

LIMIT = 60  # seconds for the whole run; each wait is on a log line or the kubelet
RESOURCE = "power-dev-plugin/dev"
CONFIG = '{"include-devices": ["/dev/mapper/*", "/dev/sdq"], "permissions": "rw"}'
NOTHING = '{"include-devices": ["/dev/no-san-disk-*"], "permissions": "rw"}'

Sample = tuple[str, tuple[tuple[str, str], ...]]


def samples(text: str) -> dict[Sample, float]:
    """A scrape's samples, but the client library's `_created` stamps."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


@dataclass
class Scrapes:
    """Each state's scrape, by name, in the order they were taken."""

    states: dict[str, dict[Sample, float]] = field(default_factory=dict)
    logs: list[list[str]] = field(default_factory=list)  # each daemon's, as it comes
    step: str = "start"  # the state being reached


@dataclass
class _Run:
    kubelet: FakeKubelet
    lines: Lines
    port: int
    proc: trio.Process
    stop_kubelet: Callable[[], None]

    async def scrape(self) -> dict[Sample, float]:
        status, _, body = await get(self.port, "/metrics")
        assert status == 200, status
        return samples(body.decode())


@contextlib.asynccontextmanager
async def _daemon(
    root: Path, config_text: str, name: str, logs: list[list[str]]
) -> AsyncIterator[_Run]:
    """`powerdev run` on the tree under root, with its own fake kubelet,
    until the kubelet has its list."""
    work = root / name
    work.mkdir()
    config = work / "config.json"
    config.write_text(config_text)
    plugin_dir = work / "device-plugins"
    async with trio.open_nursery() as nursery:
        kubelet = FakeKubelet(plugin_dir)
        kubelet_scope = trio.CancelScope()

        async def serve_kubelet(task_status: trio.TaskStatus[None]) -> None:
            with kubelet_scope:
                await kubelet.run(task_status=task_status)

        await nursery.start(serve_kubelet)
        command = run_command(
            plugin_dir, config, root / "dev",
            "--sys-root", str(root / "sys"),
            "--health-interval", "0.05",
            "--metrics-address", "127.0.0.1:0",
            "--pod-resources-socket", str(kubelet.pod_resources_socket),
            "--status-file", str(work / "status.json"),
            "--cdi-spec-dir", str(work / "cdi"),
            "--uevents", "off",
        )  # fmt: skip
        proc = await trio.lowlevel.open_process(command, stderr=subprocess.PIPE)
        lines = Lines(proc.stderr)
        logs.append(lines.lines)  # kept for a failure's message
        nursery.start_soon(lines.read)
        try:
            port = await lines.wait_for(r"serving /metrics, /healthz, /readyz on [\d.]+:(\d+)")
            await kubelet.wait_until(
                lambda k: RESOURCE in k.resources and k.resources[RESOURCE].updates
            )
            yield _Run(kubelet, lines, int(port.group(1)), proc, kubelet_scope.cancel)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            nursery.cancel_scope.cancel()


async def take(root: Path) -> Scrapes:
    """Every state's scrape, in one run of the daemon (and a second, with a
    config that matches nothing on the node)."""
    states = san(root / "sys", kpartx=False)
    states["sdq"] = scsi(root / "sys", "sdq", "65:0", 5)
    nodes(root / "dev", {"mapper/mpatha": (253, 3), "sdq": (65, 0)})
    found = Scrapes()
    try:
        with trio.fail_after(LIMIT):
            await _take(root, states, found)
    except trio.TooSlowError:
        tail = "\n".join(found.logs[-1][-20:] if found.logs else ["(no daemon started)"])
        raise AssertionError(
            f"the daemon never reached {found.step!r}; its log ends:\n{tail}"
        ) from None
    return found


async def _take(root: Path, states: dict[str, Path], found: Scrapes) -> None:
    async with asyncio_door():
        async with _daemon(root, CONFIG, "san", found.logs) as run:
            found.states["fine"] = await run.scrape()

            found.step = "degraded"
            states["sde"].write_text("offline\n")
            await run.lines.wait_for(r"dm-3 \(/dev/mapper/mpatha\) is degraded")
            found.states["degraded"] = await run.scrape()

            found.step = "failed"
            states["sdd"].write_text("transport-offline\n")
            states["sdq"].write_text("offline\n")
            await run.kubelet.wait_until(
                lambda k: set(k.resources[RESOURCE].devices.values()) == {"Unhealthy"}
            )
            found.states["failed"] = await run.scrape()

            found.step = "recovered"
            for state in states.values():
                state.write_text("running\n")
            await run.kubelet.wait_until(
                lambda k: set(k.resources[RESOURCE].devices.values()) == {"Healthy"}
            )
            found.states["recovered"] = await run.scrape()

            found.step = "refused"
            try:
                await run.kubelet.allocate(RESOURCE, ["no-such-device"])
            except PluginCallError:
                pass
            else:
                raise AssertionError("an unknown ID was granted")
            found.states["refused"] = await run.scrape()

            found.step = "rejected"
            (root / "san" / "config.json").write_text('{"include-devices": 7}')
            await run.lines.wait_for(r"config not applied, the last good one stays in force")
            found.states["rejected"] = await run.scrape()

            found.step = "unregistered"
            run.stop_kubelet()
            await run.lines.wait_for(r"waiting for the kubelet|the kubelet does not answer")
            found.states["unregistered"] = await run.scrape()

        found.step = "empty"
        async with _daemon(root, NOTHING, "empty", found.logs) as run:
            found.states["empty"] = await run.scrape()
