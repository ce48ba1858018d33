"""The host-disk guard against the real kernel (root): loop devices with a
mounted ext4 filesystem and with active swap are never advertised; once
unmounted and swapped off they come back; a listed device that gets mounted
turns Unhealthy, and the mount table's poll flag is what wakes the daemon."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from powerdev.config import ResourceConfig
from powerdev.devices.hostuse_events import HostUseEvents
from powerdev.devices.inventory import Inventory
from powerdev.devices.table import HostFiles
from powerdev.devtools.testing import FIRST_LOOP, LOOP_PATTERN, LoopControl, bound, loop_control
from powerdev.resources.tracker import Tracker
from tests.conftest import config_for, daemon_and_kubelet, needs_root

TOOLS = ("mkfs.ext4", "mkswap", "swapon", "swapoff", "mount", "umount")
MISSING = [tool for tool in TOOLS if shutil.which(tool) is None]
pytestmark = [
    needs_root,
    pytest.mark.skipif(not os.path.exists("/dev/loop-control"), reason="no /dev/loop-control"),
    pytest.mark.skipif(
        bool(MISSING),
        reason=f"{', '.join(MISSING)} missing: apt-get install e2fsprogs util-linux mount",
    ),
]
MOUNTINFO = Path("/proc/self/mountinfo")
SWAPS = Path("/proc/swaps")
DEV, SYS = Path("/dev"), Path("/sys")
LIMIT = 20


def run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, timeout=60)


def image(path: Path, kind: str) -> Path:
    with path.open("wb") as f:
        f.truncate(16 * 1024 * 1024)
    path.chmod(0o600)  # swapon wants it private
    if kind == "ext4":
        run("mkfs.ext4", "-q", "-F", str(path))
    elif kind == "swap":
        run("mkswap", str(path))
    return path


@contextlib.contextmanager
def attached(loops: LoopControl, index: int, backing: Path) -> Iterator[str]:
    """A loop device made through /dev/loop-control and bound to a file."""
    node = f"/dev/{loops.add(index)}"
    with bound(node, backing):
        yield node


@contextlib.contextmanager
def mounted_at(node: str, where: Path) -> Iterator[None]:
    where.mkdir(exist_ok=True)
    run("mount", "-t", "ext4", node, str(where))
    try:
        yield
    finally:
        run("umount", str(where))


@contextlib.contextmanager
def swap_on(node: str) -> Iterator[None]:
    run("swapon", node)
    try:
        yield
    finally:
        run("swapoff", node)


@contextlib.contextmanager
def three_loops(tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """loop300: ext4, loop301: swap, loop302: ext4 too, all unmounted."""
    with (
        loop_control() as loops,
        attached(loops, FIRST_LOOP, image(tmp_path / "fs.img", "ext4")) as fs,
        attached(loops, FIRST_LOOP + 1, image(tmp_path / "swap.img", "swap")) as swap,
        attached(loops, FIRST_LOOP + 2, image(tmp_path / "free.img", "ext4")) as free,
    ):
        yield fs, swap, free


def guarded_tracker(**fields: object) -> Tracker:
    resource = ResourceConfig(include=(LOOP_PATTERN,), **fields)  # type: ignore[arg-type]
    return Tracker(resource, Inventory(), DEV, SYS, host=HostFiles(MOUNTINFO, SWAPS))


def listed(tracker: Tracker) -> dict[str, bool]:
    return {d.path: d.healthy for d in tracker.inventory.current.devices}


async def test_mounted_and_swap_devices_are_left_out_and_come_back(tmp_path):
    with three_loops(tmp_path) as (fs, swap, free):
        where = tmp_path / "mnt"
        with mounted_at(fs, where), swap_on(swap):
            tracker = guarded_tracker()
            await tracker.rescan()
            assert listed(tracker) == {free: True}
            assert tracker.left_out() == {
                fs: f"the host uses it: mounted at {where}",
                swap: "the host uses it: active swap",
            }
        await tracker.rescan()
        assert listed(tracker) == {fs: True, swap: True, free: True}
        assert tracker.left_out() == {}
        with mounted_at(free, where):
            await tracker.rescan()
            assert listed(tracker) == {fs: True, swap: True, free: False}
        await tracker.rescan()
        assert listed(tracker) == {fs: True, swap: True, free: True}


async def test_allowed_resources_list_devices_in_use(tmp_path):
    with three_loops(tmp_path) as (fs, swap, free):
        with mounted_at(fs, tmp_path / "mnt"), swap_on(swap):
            tracker = guarded_tracker(allow_host_used=True)
            await tracker.rescan()
            assert listed(tracker) == {fs: True, swap: True, free: True}


async def test_the_daemon_follows_mounts_and_swap_without_polling(tmp_path):
    """The daemon's wiring: the node's device table reads the host's use of
    its devices (this process's mount table by default), and the mount and
    swap event source wakes it."""
    config = config_for(f'{{"include-devices": ["{LOOP_PATTERN}"]}}')
    where = tmp_path / "mnt"
    with three_loops(tmp_path) as (fs, swap, free), trio.fail_after(LIMIT):
        ids = {path: path.removeprefix("/dev/") for path in (fs, swap, free)}
        with (
            HostUseEvents(DEV, MOUNTINFO, SWAPS) as events,
            contextlib.ExitStack() as stack,
        ):
            stack.enter_context(mounted_at(fs, where))
            stack.enter_context(swap_on(swap))
            async with daemon_and_kubelet(
                tmp_path, config, dev_root=DEV, sys_root=SYS, events=events
            ) as h:

                def devices():
                    return dict(h.state().devices)

                assert devices() == {ids[free]: "Healthy"}  # never advertised
                await trio.to_thread.run_sync(stack.close)  # umount, swapoff
                await h.kubelet.wait_until(lambda k: len(devices()) == 3)
                assert set(devices().values()) == {"Healthy"}
                await trio.to_thread.run_sync(run, "mount", "-t", "ext4", free, str(where))
                try:
                    await h.kubelet.wait_until(lambda k: devices()[ids[free]] == "Unhealthy")
                finally:
                    await trio.to_thread.run_sync(run, "umount", str(where))
                await h.kubelet.wait_until(lambda k: devices()[ids[free]] == "Healthy")
                await trio.to_thread.run_sync(run, "swapon", swap)
                try:
                    await h.kubelet.wait_until(lambda k: devices()[ids[swap]] == "Unhealthy")
                finally:
                    await trio.to_thread.run_sync(run, "swapoff", swap)
                await h.kubelet.wait_until(lambda k: devices()[ids[swap]] == "Healthy")
