"""The real daemon process and the fake kubelet, for the fault suite."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import trio

from powerdev.config import DEFAULT_RESOURCE_NAME as RESOURCE
from powerdev.config import DEFAULT_SOCKET_NAME as SOCKET
from powerdev.devtools.fake_kubelet import FakeKubelet
from powerdev.devtools.testing import rss_kib, run_command
from powerdev.rpc import asyncio_door

STOP_LIMIT = 5.0  # seconds a SIGTERM may take, end to end


@dataclass
class Daemon:
    proc: trio.Process
    plugin_dir: Path
    log: Path

    @property
    def socket(self) -> Path:
        return self.plugin_dir / SOCKET

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def rss_kib(self) -> int:
        kib = rss_kib(self.proc.pid)
        assert kib is not None, "no VmRSS"
        return kib

    def lines(self, text: str) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if text in line]

    async def terminate(self) -> int:
        """SIGTERM; the exit code, which must come within STOP_LIMIT."""
        self.proc.send_signal(signal.SIGTERM)
        with trio.fail_after(STOP_LIMIT):
            return await self.proc.wait()


def write_config(path: Path, **fields: object) -> Path:
    path.write_text(json.dumps(fields))
    return path


@contextlib.asynccontextmanager
async def spawn(
    tmp_path: Path, config: Path, dev_root: Path, name: str = "daemon", *extra: str
) -> AsyncIterator[Daemon]:
    """`powerdev run` as a child process; killed on the way out if still there."""
    plugin_dir = tmp_path / "device-plugins"
    log = tmp_path / f"{name}.log"
    with log.open("w") as stderr:
        proc = await trio.lowlevel.open_process(
            run_command(
                plugin_dir,
                config,
                dev_root,
                "--uevents",
                "off",
                "--status-file",
                str(tmp_path / f"{name}.status"),
                *extra,
            ),
            stderr=stderr,
        )
    daemon = Daemon(proc, plugin_dir, log)
    try:
        yield daemon
    finally:
        if proc.returncode is None:
            proc.kill()
        with trio.CancelScope(shield=True):
            await proc.wait()


@contextlib.asynccontextmanager
async def kubelet_running(plugin_dir: Path) -> AsyncIterator[tuple[FakeKubelet, trio.Nursery]]:
    async with asyncio_door(), trio.open_nursery() as nursery:
        kubelet = FakeKubelet(plugin_dir)
        await nursery.start(kubelet.run)
        yield kubelet, nursery
        nursery.cancel_scope.cancel()


def registered(count: int, capacity: int | None = None):
    """A predicate: `count` registrations, connected, and a list received."""

    def check(k: FakeKubelet) -> bool:
        state = k.resources.get(RESOURCE)
        return (
            k.registrations >= count
            and state is not None
            and state.connected
            and state.updates > 0
            and (capacity is None or state.capacity == capacity)
        )

    return check


class ConfigMapVolume:
    """A directory laid out and updated the way the kubelet does it."""

    def __init__(self, root: Path) -> None:
        root.mkdir()
        self.root = root
        self.generation = 0

    @property
    def path(self) -> Path:
        return self.root / "config.json"

    def write(self, **fields: object) -> None:
        self.generation += 1
        data = self.root / f"..2026_11_29_{self.generation:04d}"
        data.mkdir()
        (data / "config.json").write_text(json.dumps(fields))
        (self.root / "..data_tmp").symlink_to(data.name)
        os.rename(self.root / "..data_tmp", self.root / "..data")  # the atomic swap
        if not self.path.is_symlink():
            self.path.symlink_to("..data/config.json")
        for old in self.root.glob("..2026_*"):
            if old != data:
                (old / "config.json").unlink()
                old.rmdir()
