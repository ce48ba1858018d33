"""The real device manager and the real daemon process, side by side."""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from powerdev.config import DEFAULT_SOCKET_NAME as SOCKET
from powerdev.devtools.devicemanager import DeviceManager
from powerdev.devtools.kit import DMHARNESS
from powerdev.devtools.testing import run_command
from tests.conftest import require_tool, wait_for_file

STOP_LIMIT = 5.0  # seconds a SIGTERM may take, end to end


@pytest.fixture
def dmharness() -> Path:
    return require_tool(DMHARNESS)


@dataclass
class Node:
    """A kubelet device manager and powerdev on one plugin directory."""

    tmp_path: Path
    binary: Path
    plugin_dir: Path
    dm: DeviceManager
    daemon: trio.Process | None = None
    daemon_log: Path | None = None

    @property
    def socket(self) -> Path:
        return self.plugin_dir / SOCKET

    def log_lines(self, text: str = "") -> list[str]:
        assert self.daemon_log is not None
        return [x for x in self.daemon_log.read_text().splitlines() if text in x]

    async def wait(self, capacity: int, allocatable: int, timeout_ms: int = 10000) -> dict:
        reply = await self.dm.call("wait", capacity, allocatable, timeout_ms)
        if not reply["ok"]:  # what powerdev said meanwhile, to tell whose the fault is
            said = "\n".join(self.log_lines()[-40:]) if self.daemon_log is not None else ""
            pytest.fail(
                f"the kubelet shows {reply}, not {capacity}/{allocatable}; powerdev's log ends:\n"
                f"{said}"
            )
        return reply

    async def wait_for_log(self, text: str) -> str:
        """The daemon's log, once it has a line with `text` (woken by inotify)."""
        assert self.daemon_log is not None
        return await wait_for_file(self.daemon_log, lambda log: text in log)

    async def terminate(self) -> int:
        assert self.daemon is not None
        self.daemon.send_signal(signal.SIGTERM)
        with trio.fail_after(STOP_LIMIT):
            return await self.daemon.wait()


def write_config(path: Path, **fields: object) -> Path:
    """Written as a ConfigMap update is: a new file renamed over the old."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(fields))
    tmp.rename(path)
    return path


@contextlib.asynccontextmanager
async def node(
    tmp_path: Path, binary: Path, config: Path, dev_root: Path, *options: str
) -> AsyncIterator[Node]:
    """The device manager started on a temp plugin dir, then `powerdev run`."""
    plugin_dir = tmp_path / "device-plugins"
    plugin_dir.mkdir(exist_ok=True)
    async with DeviceManager.running(binary, tmp_path / "kubelet.log") as dm:
        await dm.call("start", plugin_dir)
        state = Node(tmp_path, binary, plugin_dir, dm, daemon_log=tmp_path / "powerdev.log")
        async with daemon(state, config, dev_root, *options):
            yield state


@contextlib.asynccontextmanager
async def daemon(state: Node, config: Path, dev_root: Path, *options: str) -> AsyncIterator[None]:
    assert state.daemon_log is not None
    with state.daemon_log.open("a") as stderr:
        proc = await trio.lowlevel.open_process(
            run_command(
                state.plugin_dir,
                config,
                dev_root,
                "--uevents",
                "off",
                "--status-file",
                str(state.tmp_path / "status.json"),
                *options,
            ),
            stderr=stderr,
        )
    state.daemon = proc
    try:
        yield
    finally:
        if proc.returncode is None:
            proc.kill()
        with trio.CancelScope(shield=True):
            await proc.wait()
