"""`powerdev run --metrics-address ... --log-format json` as a real process:
its log is one JSON object per line with zoned timestamps and says what it
started with; its port answers probes while bad clients hang on; it stops
with exit 0. And bad addresses stop it at start with one line."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import trio

from powerdev.devtools.fake_kubelet import FakeKubelet
from powerdev.devtools.testing import rss_kib, run_command
from powerdev.ops import oplog, opsserver
from powerdev.rpc import asyncio_door
from tests.conftest import make_dev_tree
from tests.integration.test_opsport import get, http

LIMIT = 30
RESOURCE = "power-dev-plugin/dev"


class Lines:
    """A child's stderr, line by line, as it comes."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self.stream = stream
        self.lines: list[str] = []
        self._new = trio.Event()

    async def read(self) -> None:
        buffer = b""
        while chunk := await self.stream.receive_some(65536):
            buffer += chunk
            *done, buffer = buffer.split(b"\n")
            self.lines.extend(line.decode() for line in done)
            self._new.set()
            self._new = trio.Event()

    async def wait_for(self, pattern: str) -> re.Match:
        seen = 0
        while True:
            for line in self.lines[seen:]:
                if found := re.search(pattern, line):
                    return found
            seen = len(self.lines)
            await self._new.wait()


@dataclass
class Daemon:
    kubelet: FakeKubelet
    proc: trio.Process
    lines: Lines
    port: int


@contextlib.asynccontextmanager
async def daemon_with_port(
    plugin_dir: Path, config: Path, dev: Path, *options: str
) -> AsyncIterator[Daemon]:
    """`powerdev run --metrics-address 127.0.0.1:0` beside the fake kubelet:
    yields once it serves the port and the kubelet has its list; killed on
    the way out if still there."""
    command = run_command(plugin_dir, config, dev, "--metrics-address", "127.0.0.1:0", *options)
    async with asyncio_door(), trio.open_nursery() as nursery:
        kubelet = FakeKubelet(plugin_dir)
        await nursery.start(kubelet.run)
        proc = await trio.lowlevel.open_process(command, stderr=subprocess.PIPE)
        lines = Lines(proc.stderr)
        nursery.start_soon(lines.read)
        try:
            found = await lines.wait_for(r"serving /metrics, /healthz, /readyz on [\d.]+:(\d+)")
            await kubelet.wait_until(
                lambda k: RESOURCE in k.resources and k.resources[RESOURCE].updates
            )
            yield Daemon(kubelet, proc, lines, int(found.group(1)))
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        nursery.cancel_scope.cancel()


async def test_the_daemon_process_logs_json_and_its_port_outlasts_bad_clients(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", ["dm-10", "dm-2", "dm-1"])
    config = tmp_path / "config.json"
    config.write_text('{"include-devices": ["/dev/dm-*"], "permissions": "r"}')
    plugin_dir = tmp_path / "device-plugins"
    with trio.fail_after(LIMIT):
        async with daemon_with_port(plugin_dir, config, dev, "--log-format", "json") as d:
            kubelet, proc, port = d.kubelet, d.proc, d.port
            assert (await get(port, "/readyz"))[0] == 200

            assert (await http(port, b"\x00\xff" * 5000 + b"\r\n\r\n"))[0] in (400, 431)
            big = b"GET /readyz HTTP/1.1\r\nX: " + b"y" * 20_000 + b"\r\n\r\n"
            assert (await http(port, big))[0] == 431
            # Slow clients holding connections: probes still answered at once.
            held = []
            for _ in range(100):
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                await stream.send_all(b"GET /metrics HTTP/1.1\r\n")
                held.append(stream)
            assert (await get(port, "/healthz"))[0] == 200
            grant = await kubelet.allocate(RESOURCE, ["dm-1"])
            assert sorted(d.host_path for d in grant.devices) == [
                "/dev/dm-1",
                "/dev/dm-10",
                "/dev/dm-2",
            ]
            for stream in held:
                await stream.aclose()
            status, _, body = await get(port, "/metrics")
            assert status == 200 and b'powerdev_allocate_calls_total{resource="' in body
            assert proc.returncode is None  # still running

            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0

    records = [json.loads(line) for line in d.lines.lines if line]
    assert records and all(set(r) >= {"time", "level", "logger", "message"} for r in records)
    for record in records:
        assert datetime.fromisoformat(record["time"]).utcoffset() is not None, record["time"]
    messages = [r["message"] for r in records]
    start = messages[0]
    assert start.startswith("powerdev 0.1.0 starting: config ") and "events: " in start, start
    assert f"/metrics, /healthz, /readyz: 127.0.0.1:{port}" in start
    assert any(
        m.startswith(f"{RESOURCE}: socket {plugin_dir}/power-dev.csi.ibm.com-reg.sock; ")
        and "permissions r," in m
        and "include-devices [/dev/dm-*]" in m
        and "upper-limit 0 (one unit per device)" in m
        for m in messages
    ), messages
    assert f"{RESOURCE}: 3 devices: dm-1, dm-2, dm-10" in messages  # natural order


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def closed_by_both_ends(stream: trio.SocketStream) -> None:
    """Our end says it is done, and we wait for the daemon's end to close: it
    sends its FIN only as it closes its socket, so its descriptor is gone
    once we read the end of the stream (no timer, no polling)."""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await stream.send_eof()
        while await stream.receive_some(4096):
            pass
    await trio.aclose_forcefully(stream)


async def test_connections_beyond_the_limit_close_the_oldest_and_descriptors_stay_bounded(
    tmp_path,
):
    """More idle connections than the port keeps: the probe is answered
    within a second all the same, the daemon's descriptors and memory stay
    within the limit's worth, and once the clients go, so do the descriptors."""
    dev = make_dev_tree(tmp_path / "dev", ["dm-0"])
    config = tmp_path / "config.json"
    config.write_text('{"include-devices": ["/dev/dm-*"]}')
    plugin_dir = tmp_path / "device-plugins"
    limit = opsserver.connection_limit()
    clients = limit * 3  # past twice the limit, the oldest go whatever their age
    with trio.fail_after(LIMIT):
        async with daemon_with_port(plugin_dir, config, dev) as d:
            proc, lines, port = d.proc, d.lines, d.port
            assert (await get(port, "/readyz"))[0] == 200
            descriptors, rss = open_descriptors(proc.pid), rss_kib(proc.pid)

            held: list[trio.SocketStream] = []
            try:
                for _ in range(clients):
                    held.append(await trio.open_tcp_stream("127.0.0.1", port))
                with trio.fail_after(1):
                    status, _, body = await get(port, "/healthz")
                assert status == 200, body
                assert open_descriptors(proc.pid) <= descriptors + 2 * limit + 2
                assert rss_kib(proc.pid) - rss < 32 * 1024  # KiB
                # The oldest were closed by the daemon, the newest are kept.
                await held[-1].send_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
                assert (await held[-1].receive_some(100)).startswith(b"HTTP/1.1 200 ")
                assert await held[0].receive_some(100) == b""
            finally:
                for stream in held:
                    await closed_by_both_ends(stream)
            for path in ("/healthz", "/readyz"):
                assert (await get(port, path))[0] == 200
            # Every held connection the daemon had not answered is closed on
            # its side (closed_by_both_ends saw it). Three it had answered may
            # still be closing: it sent their end first, then waits for the
            # client's (the newest held one and the two probes).
            assert open_descriptors(proc.pid) <= descriptors + 3
            assert any("closing the oldest" in line for line in lines.lines), lines.lines
            assert proc.returncode is None
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0


def test_a_bad_or_busy_metrics_address_stops_the_daemon_with_one_line(tmp_path):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "powerdev", "run", "--plugin-dir", str(tmp_path), *args],
            capture_output=True,
            text=True,
            timeout=LIMIT,
            check=False,
        )

    done = run("--metrics-address", "8080")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "argument --metrics-address: '8080' is not HOST:PORT" in done.stderr
    busy = opsserver.listen("127.0.0.1:0")
    with busy:
        address = oplog.bound_address(busy)
        done = run("--metrics-address", address, "--config", str(tmp_path / "none.json"))
    # Not a bad config: the host is not ready for it (exit 1, as any start failure).
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("powerdev: cannot start: --metrics-address: cannot listen on")
    assert f"cannot listen on {address}: Address already in use" in done.stderr
