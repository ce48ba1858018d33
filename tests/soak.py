"""A soak of the real daemon process, for a developer (not a test):

    .venv/bin/python -m tests.soak --minutes 10

`powerdev run` serves 200 device nodes to the fake kubelet for the given
time while, all at once: the kubelet restarts every few seconds, device
nodes come and go, the ConfigMap is rewritten every few seconds (as the
kubelet writes a ConfigMap volume), and strangers hold idle, slow and
garbage connections on the metrics port while /healthz is probed every
second. It prints the daemon's descriptors and RSS every 15 s and the slope
over the last half, and exits 1 if a registration was lost, a probe failed
or took over a second, a log line is an ERROR or a traceback, SIGTERM did
not end it with 0, or descriptors grew over the last half.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import trio

from powerdev.config import DEFAULT_RESOURCE_NAME as RESOURCE
from powerdev.devtools.fake_kubelet import FakeKubelet
from powerdev.devtools.testing import make_nodes, rss_kib, run_command
from powerdev.rpc import asyncio_door
from tests.conftest import wait_for_file
from tests.faults.harness import ConfigMapVolume

DEVICES = 200
PROBE_LIMIT = 1.0  # seconds a probe may take
REGISTER_LIMIT = 10.0  # seconds a restart may take to be registered again
SAMPLE_EVERY = 15.0


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0


class Soak:
    def __init__(self, root: Path, seconds: float) -> None:
        self.root = root
        self.seconds = seconds
        self.problems: list[str] = []
        self.samples: list[tuple[float, int, int]] = []  # (minutes, fds, RSS KiB)
        self.counts = {"restarts": 0, "hotplugs": 0, "config edits": 0, "probes": 0}
        self.probe_worst = 0.0

    async def run(self) -> int:
        dev = self.root / "dev"
        make_nodes(dev / "pool", [f"d{i}" for i in range(DEVICES)])
        volume = ConfigMapVolume(self.root / "configmap")
        volume.write(**{"include-devices": ["/dev/pool/*"]})
        plugin_dir = self.root / "device-plugins"
        log = self.root / "daemon.log"
        command = run_command(plugin_dir, volume.path, dev, "--metrics-address", "127.0.0.1:0")
        async with asyncio_door(), trio.open_nursery() as nursery:
            kubelet = FakeKubelet(plugin_dir)
            await nursery.start(kubelet.run)
            with log.open("w") as stderr:
                daemon = await trio.lowlevel.open_process(command, stderr=stderr)
            try:
                port = await self._port(log)
                await self._registered(kubelet, 1)
                began = time.monotonic()
                with trio.move_on_after(self.seconds):
                    async with trio.open_nursery() as load:
                        load.start_soon(self._restarts, kubelet)
                        load.start_soon(self._hotplug, dev / "pool")
                        load.start_soon(self._config_edits, volume)
                        load.start_soon(self._strangers, port)
                        load.start_soon(self._probes, port)
                        load.start_soon(self._samples, daemon.pid, began)
                daemon.send_signal(15)
                with trio.move_on_after(10):
                    code = await daemon.wait()
                if daemon.returncode is None:
                    self.problems.append("SIGTERM did not end the daemon in 10 s")
                elif code != 0:
                    self.problems.append(f"SIGTERM: exit {code}")
            finally:
                if daemon.returncode is None:
                    daemon.kill()
                    with trio.CancelScope(shield=True):
                        await daemon.wait()
                nursery.cancel_scope.cancel()
        return self._report(log)

    async def _port(self, log: Path) -> int:
        pattern = re.compile(r"serving /metrics, /healthz, /readyz on [\d.]+:(\d+)")
        with trio.fail_after(30):
            text = await wait_for_file(log, lambda t: pattern.search(t) is not None)
        found = pattern.search(text)
        assert found is not None
        return int(found.group(1))

    async def _registered(self, kubelet: FakeKubelet, count: int) -> None:
        def ok(k: FakeKubelet) -> bool:
            state = k.resources.get(RESOURCE)
            return k.registrations >= count and state is not None and state.updates > 0

        with trio.move_on_after(REGISTER_LIMIT) as late:
            await kubelet.wait_until(ok)
        if late.cancelled_caught:
            self.problems.append(f"registration {count} did not come within {REGISTER_LIMIT} s")

    async def _restarts(self, kubelet: FakeKubelet) -> None:
        while True:
            await trio.sleep(3)
            await kubelet.restart()
            self.counts["restarts"] += 1
            await self._registered(kubelet, kubelet.registrations + 1)

    async def _hotplug(self, pool: Path) -> None:
        n = 0
        present: set[str] = set()
        while True:
            await trio.sleep(0.5)
            name = f"hot{n % 20}"
            if name in present:
                (pool / name).unlink()
                present.discard(name)
            else:
                make_nodes(pool, [name])
                present.add(name)
            n += 1
            self.counts["hotplugs"] += 1

    async def _config_edits(self, volume: ConfigMapVolume) -> None:
        n = 0
        while True:
            await trio.sleep(3)
            perms = ("rw", "r", "rwm")[n % 3]
            volume.write(**{"include-devices": ["/dev/pool/*"], "permissions": perms})
            n += 1
            self.counts["config edits"] += 1

    async def _strangers(self, port: int) -> None:
        """200 idle connections (opened anew every 5 s), 20 that send a byte a
        second, garbage every 5 s."""
        held: list[trio.SocketStream] = []

        async def idle() -> None:  # the server ends idle ones after a while: open anew
            for stream in held:
                await stream.aclose()
            held.clear()
            for _ in range(200):
                stream = await _quietly(trio.open_tcp_stream, "127.0.0.1", port)
                if stream is not None:
                    held.append(stream)

        async with trio.open_nursery() as nursery:
            await idle()

            async def slow() -> None:
                with trio.move_on_after(self.seconds):
                    stream = await trio.open_tcp_stream("127.0.0.1", port)
                    for byte in b"GET /metrics HTTP/1.1\r\nX: " + b"y" * 100_000:
                        await stream.send_all(bytes([byte]))
                        await trio.sleep(1)

            for _ in range(20):
                nursery.start_soon(_quietly, slow)
            while True:
                await trio.sleep(5)
                await _quietly(_garbage, port)
                await idle()

    async def _probes(self, port: int) -> None:
        while True:
            await trio.sleep(1)
            began = time.monotonic()
            with trio.move_on_after(PROBE_LIMIT) as late:
                status = await _quietly(_get_status, port, "/healthz")
            took = time.monotonic() - began
            self.probe_worst = max(self.probe_worst, took)
            self.counts["probes"] += 1
            if late.cancelled_caught:
                self.problems.append(f"a probe took over {PROBE_LIMIT} s")
            elif status != 200:
                self.problems.append(f"a probe answered {status}")

    async def _samples(self, pid: int, began: float) -> None:
        while True:
            minutes = (time.monotonic() - began) / 60
            self.samples.append((minutes, fds(pid), rss_kib(pid) or 0))
            print(f"{minutes:5.1f} min: fds {self.samples[-1][1]}, RSS {self.samples[-1][2]} KiB")
            await trio.sleep(SAMPLE_EVERY)

    def _report(self, log: Path) -> int:
        lines = log.read_text().splitlines()
        noisy = [x for x in lines if " ERROR " in x or "Traceback" in x]
        self.problems.extend(f"log: {x}" for x in noisy[:5])
        half = [s for s in self.samples if s[0] >= self.samples[-1][0] / 2]
        if len(half) >= 3:
            fd_slope = slope([(m, f) for m, f, _ in half])
            rss_slope = slope([(m, r) for m, _, r in half])
            print(
                f"last {self.samples[-1][0] - half[0][0]:.1f} min: fds slope {fd_slope:+.2f}/min, "
                f"RSS slope {rss_slope:+.1f} KiB/min ({half[0][2]} -> {half[-1][2]} KiB)"
            )
            # The 200 idle strangers are closed and opened anew every 5 s, so a
            # sample may catch a few in between: growth is more than that.
            if half[-1][1] > half[0][1] + 10:
                self.problems.append(f"descriptors grew: {half[0][1]} -> {half[-1][1]}")
        print(
            ", ".join(f"{v} {k}" for k, v in self.counts.items())
            + f"; slowest probe {self.probe_worst * 1000:.1f} ms"
        )
        print(json.dumps({"samples": self.samples, "problems": self.problems}))
        for problem in self.problems:
            print("PROBLEM:", problem)
        return 1 if self.problems else 0


async def _quietly(fn, *args):  # type: ignore[no-untyped-def]
    """A stranger's connection may be refused or cut: that is the point."""
    try:
        return await fn(*args)
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
        return None


async def _garbage(port: int) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    with trio.move_on_after(2):
        await stream.send_all(b"\x00\xff" * 4096 + b"\r\n\r\n")
        await stream.receive_some(65536)
    await stream.aclose()


async def _get_status(port: int, path: str) -> int | str | None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        await stream.send_all(
            f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
        )
        reply = b""
        while b"\r\n" not in reply:
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            reply += chunk
        while True:  # the whole answer: its body says why, when it is not 200
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            reply += chunk
        if not reply.startswith(b"HTTP/"):
            return None
        status = int(reply.split()[1])
        body = reply.partition(b"\r\n\r\n")[2][:300]
        return status if status == 200 else f"{status}: {body!r}"
    finally:
        await stream.aclose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="soak-", dir="/tmp") as root:
        return trio.run(Soak(Path(root), args.minutes * 60).run)


if __name__ == "__main__":
    sys.exit(main())
