"""A block device with no medium is not offered (root, real loop devices and
real uevents): a loop device detached with `losetup -d` turns Unhealthy
where it is listed, and Healthy again once a file is attached, and
through DRA leaves its slice and comes back; a loop device made with no
file is never listed. The indexes are this file's
own (430-439), apart from every other test's, and it does not sweep
powerdev.devtools.testing's range (another test may hold those)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from powerdev.devtools.testing import LoopControl
from powerdev.rpc.kubelet_side import PluginCallError
from tests.conftest import config_for, daemon_and_kubelet, needs_root

pytestmark = [
    needs_root,
    pytest.mark.skipif(not os.path.exists("/dev/loop-control"), reason="no /dev/loop-control"),
    pytest.mark.skipif(shutil.which("losetup") is None, reason="no losetup"),
]
LIMIT = 20
FIRST = 430
CONFIG = '{"include-devices": ["/dev/loop43[0-9]"]}'


@contextlib.contextmanager
def loops(backing: Path) -> Iterator[LoopControl]:
    fd = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    control = LoopControl(fd, backing)
    try:
        yield control
    finally:
        for index in sorted(control.made):
            with contextlib.suppress(OSError):
                control.remove(index)
        os.close(fd)


async def test_a_detached_loop_device_is_unhealthy_until_a_file_is_attached_again(tmp_path):
    backing = tmp_path / "backing"
    backing.mkdir()
    with loops(backing) as control, trio.fail_after(LIMIT):
        async with daemon_and_kubelet(
            tmp_path,
            config_for(CONFIG),
            dev_root=Path("/dev"),
            sys_root=Path("/sys"),
            uevents="kernel",
        ) as h:
            control.add(FIRST, medium=True)
            unit = f"loop{FIRST}"  # "all" mode: listed by its name

            def health() -> str | None:
                return h.state().devices.get(unit)

            await h.kubelet.wait_until(lambda k: health() == "Healthy")

            await trio.run_process(["losetup", "-d", f"/dev/loop{FIRST}"])
            await h.kubelet.wait_until(lambda k: health() == "Unhealthy")
            size = trio.Path(f"/sys/block/loop{FIRST}/size")
            assert (await size.read_text()).strip() == "0"
            with pytest.raises(PluginCallError):  # not granted while it has no medium
                await h.kubelet.allocate(h.name, [unit])

            control.attach(FIRST)  # the same file again: the same identity
            await h.kubelet.wait_until(lambda k: health() == "Healthy")

            # One made with no file is never listed: by the time the next
            # one (made after it, with a file) is listed, its events are in.
            control.add(FIRST + 1)
            control.add(FIRST + 2, medium=True)
            later = f"loop{FIRST + 2}"
            await h.kubelet.wait_until(lambda k: h.state().devices.get(later) == "Healthy")
            listed = {d.path for d in h.plugin.inventory.current.devices}
            assert f"/dev/loop{FIRST + 1}" not in listed
            assert len(h.state().devices) == 2


async def test_a_published_loop_device_leaves_its_dra_slice_when_detached_and_comes_back(
    api, control_plane, tmp_path
):
    """The same through DRA, against the kit's API server: a loop device
    detached with `losetup -d` leaves the pool's slice, and is published
    again once a file is attached."""
    from powerdev.dra.names import slice_name
    from tests.dra.test_slices import RESOURCE, SLICES, dra_config, paths, publishing

    backing = tmp_path / "backing"
    backing.mkdir()
    config = dra_config(**{"include-devices": ["/dev/loop43[0-9]"]})
    loop = f"/dev/loop{FIRST}"
    with loops(backing) as control, trio.fail_after(LIMIT * 3):
        control.add(FIRST, medium=True)
        async with publishing(tmp_path, control_plane, Path("/dev"), config, uevents="kernel") as (
            node,
            driver,
        ):
            first = slice_name(node, driver, RESOURCE, 0)
            item = await api.wait_for(SLICES, first, lambda s: paths(s) == [loop])
            (device,) = item["spec"]["devices"]
            assert device["capacity"]["size"]["value"] != "0"
            await trio.run_process(["losetup", "-d", loop])
            await api.wait_for(SLICES, first, lambda s: paths(s) == [])
            control.attach(FIRST)  # the same file again
            await api.wait_for(SLICES, first, lambda s: paths(s) == [loop])
