"""Health from the device itself, under a running daemon: a --sys-root tree
whose multipath paths go offline one by one and come back, with no device
event (the daemon's recheck finds it), as the fake kubelet and /metrics
see it; and a device that has failed before the daemon starts."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import pytest
import trio
from prometheus_client import generate_latest

from powerdev.ops import metrics
from powerdev.rpc.kubelet_side import PluginCallError
from tests.conftest import config_for, daemon_and_kubelet, needs_root
from tests.unit.test_condition import san, scsi
from tests.unit.test_family import nodes

LIMIT = 10  # seconds; every wait is on an event, this only bounds a hang
CONFIG = (
    '{"include-devices": ["/dev/mapper/*", "/dev/sdq"], "permissions": "rw", "allocation": "each"}'
)
RECHECK = 0.05  # seconds: the test waits on what the kubelet is told, not on time


def series(name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """One metric's samples, as a scrape of the daemon's registry gives them."""
    found = {}
    for family in metrics.REGISTRY.collect():
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def condition_counts() -> dict[str, float]:
    return {dict(k)["condition"]: v for k, v in series("powerdev_device_condition").items()}


class Said(logging.Handler):
    """The daemon's log lines, as they come: a test waits for one."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self._more = trio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        self._more.set()  # the table logs on the Trio thread
        self._more = trio.Event()

    async def wait_for(self, text: str) -> str:
        while not (found := [line for line in self.lines if text in line]):
            await self._more.wait()
        return found[-1]


@contextlib.contextmanager
def said(logger: str) -> Iterator[Said]:
    handler = Said()
    log = logging.getLogger(logger)
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def ids(h) -> tuple[str, str]:
    """The IDs of /dev/mapper/mpatha and /dev/sdq ("each" mode: by identity)."""
    by_path = {d.path: d.id for d in h.plugin.inventory.current.devices}
    return by_path["/dev/mapper/mpatha"], by_path["/dev/sdq"]


@pytest.fixture
def host(tmp_path):
    sys_root = tmp_path / "sys"
    states = san(sys_root, kpartx=False)
    states["sdq"] = scsi(sys_root, "sdq", "65:0", 5)  # a disk nothing lies on
    nodes(tmp_path / "dev", {"mapper/mpatha": (253, 3), "sdq": (65, 0)})
    return sys_root, states


@needs_root
async def test_paths_going_offline_one_by_one_and_coming_back(tmp_path, host):
    sys_root, states = host
    with trio.fail_after(LIMIT), said("powerdev.devices.table") as log:
        async with daemon_and_kubelet(
            tmp_path,
            config_for(CONFIG),
            dev_root=tmp_path / "dev",
            sys_root=sys_root,
            health_interval=RECHECK,
        ) as h:
            mpatha, sdq = ids(h)
            assert h.state().devices == {mpatha: "Healthy", sdq: "Healthy"}
            assert condition_counts() == {"fine": 2, "degraded": 0, "failed": 0}
            paths = {dict(k)["state"]: v for k, v in series("powerdev_device_paths").items()}
            assert paths == {"running": 2}

            states["sde"].write_text("offline\n")  # degraded: still offered
            line = await log.wait_for("is degraded")
            assert line == (
                "dm-3 (/dev/mapper/mpatha) is degraded: 1 of 2 paths working (sde offline) "
                "(it was fine)"
            )
            assert condition_counts() == {"fine": 1, "degraded": 1, "failed": 0}
            assert h.state().devices[mpatha] == "Healthy"
            assert {dict(k)["state"]: v for k, v in series("powerdev_device_paths").items()} == {
                "running": 1,
                "offline": 1,
            }
            grant = await h.kubelet.allocate(h.name, [mpatha])
            assert [d.host_path for d in grant.devices] == ["/dev/mapper/mpatha"]

            states["sdd"].write_text("transport-offline\n")  # failed: Unhealthy
            await h.kubelet.wait_until(lambda k: k.resources[h.name].devices[mpatha] == "Unhealthy")
            assert h.state().allocatable == 1
            assert condition_counts() == {"fine": 1, "degraded": 0, "failed": 1}
            with pytest.raises(PluginCallError):
                await h.kubelet.allocate(h.name, [mpatha])

            for state in states.values():
                state.write_text("running\n")
            await h.kubelet.wait_until(lambda k: k.resources[h.name].devices[mpatha] == "Healthy")
            assert condition_counts() == {"fine": 2, "degraded": 0, "failed": 0}
            assert sum("dm-3" in line for line in log.lines) == 3  # each change said once


@needs_root
async def test_a_device_failed_at_start_is_listed_unhealthy(tmp_path, host):
    sys_root, states = host
    states["sdq"].write_text("offline\n")
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(
            tmp_path, config_for(CONFIG), dev_root=tmp_path / "dev", sys_root=sys_root
        ) as h:
            mpatha, sdq = ids(h)
            assert h.state().devices == {mpatha: "Healthy", sdq: "Unhealthy"}
            assert (h.state().capacity, h.state().allocatable) == (2, 1)
            body = generate_latest(metrics.REGISTRY).decode()
            failed = 'powerdev_device_condition{condition="failed",resource="power-dev-plugin/dev"}'
            assert f"{failed} 1.0" in body
