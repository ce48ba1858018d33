"""Real kernel devices and real uevents (root): loop devices added and removed
through /dev/loop-control reach the fake kubelet's ListAndWatch. Each is
bound to a file as it is made: a loop device with no medium is not
offered."""

import os
from pathlib import Path

import pytest
import trio

from powerdev.devtools.testing import FIRST_LOOP as FIRST
from powerdev.devtools.testing import loop_control
from tests.conftest import config_for, daemon_and_kubelet, needs_root

pytestmark = [
    needs_root,
    pytest.mark.skipif(not os.path.exists("/dev/loop-control"), reason="no /dev/loop-control"),
]
LIMIT = 20
CONFIG = '{"include-devices": ["/dev/loop3[0-9][0-9]"]}'


async def test_loop_devices_appear_and_vanish_one_at_a_time(tmp_path):
    with loop_control() as loops, trio.fail_after(LIMIT):
        async with daemon_and_kubelet(
            tmp_path,
            config_for(CONFIG),
            dev_root=Path("/dev"),
            sys_root=Path("/sys"),
            uevents="kernel",
        ) as h:
            assert h.state().devices == {}
            for index in range(FIRST, FIRST + 5):
                name = loops.add(index, medium=True)
                await h.kubelet.wait_until(lambda k, n=name: n in h.state().devices)
            for index in range(FIRST, FIRST + 5):
                loops.remove(index)
                await h.kubelet.wait_until(lambda k, n=f"loop{index}": n not in h.state().devices)
            assert h.state().devices == {}


async def test_a_storm_of_loop_devices_ends_exact(tmp_path):
    # The ioctls run in a worker thread, so the daemon handles events while
    # the storm goes on, as it would on a host.
    with loop_control() as loops, trio.fail_after(LIMIT):
        async with daemon_and_kubelet(
            tmp_path,
            config_for(CONFIG),
            dev_root=Path("/dev"),
            sys_root=Path("/sys"),
            uevents="kernel",
        ) as h:
            indexes = range(FIRST, FIRST + 100)
            await trio.to_thread.run_sync(lambda: [loops.add(i, medium=True) for i in indexes])
            every = {f"loop{i}" for i in indexes}
            await h.kubelet.wait_until(lambda k: set(h.state().devices) == every)
            await trio.to_thread.run_sync(lambda: [loops.remove(i) for i in indexes[::2]])
            odd = {f"loop{i}" for i in indexes[1::2]}
            await h.kubelet.wait_until(lambda k: set(h.state().devices) == odd)
            assert all(health == "Healthy" for health in h.state().devices.values())
            await trio.to_thread.run_sync(lambda: [loops.remove(i) for i in indexes[1::2]])
            await h.kubelet.wait_until(lambda k: h.state().devices == {})


async def test_powerdev_local_shows_a_hotplug_by_name(tmp_path):
    from powerdev.devtools.local import run_local
    from powerdev.rpc import asyncio_door

    lines: list[str] = []
    seen = trio.Event()

    def out(line: str) -> None:
        lines.append(line)
        if f"loop{FIRST + 7}" in line and line.startswith("kubelet: ListAndWatch update"):
            seen.set()

    with loop_control() as loops, trio.fail_after(LIMIT):
        async with asyncio_door(), trio.open_nursery() as nursery:
            await nursery.start(
                lambda task_status: run_local(out=out, uevents="kernel", task_status=task_status)
            )
            assert any("sample" in x or "a pod asking" in x or "no healthy" in x for x in lines)
            loops.add(FIRST + 7, medium=True)
            await seen.wait()
            nursery.cancel_scope.cancel()
