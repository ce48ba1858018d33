"""Per-device IDs that survive renumbering, with real loop devices (root):
a resource in "each" mode names a loop device by its backing file, so the
kubelet sees the same ID when the file comes back under another number."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from tests.conftest import config_for, daemon_and_kubelet, needs_root
from tests.kernel.test_identity_loop import attached, loop_control, new_loop

pytestmark = [
    needs_root,
    pytest.mark.skipif(not os.path.exists("/dev/loop-control"), reason="no /dev/loop-control"),
]
CONFIG = '{"include-devices": ["/dev/loop38[0-9]"], "allocation": "each"}'


def id_at(h, path: str) -> str | None:
    return next((d.id for d in h.plugin.inventory.current.devices if d.path == path), None)


async def test_an_id_survives_detach_and_attach_under_another_number(tmp_path):
    backing = tmp_path / "lun.img"
    backing.write_bytes(b"\0" * 1024 * 1024)
    nodes = tmp_path / "nodes"
    nodes.mkdir()
    with trio.fail_after(30), loop_control() as control:
        async with daemon_and_kubelet(
            tmp_path,
            config_for(CONFIG),
            dev_root=Path("/dev"),
            sys_root=Path("/sys"),
            uevents="kernel",
        ) as h:
            with new_loop(control) as first:
                path = f"/dev/loop{first}"
                with attached(first, backing, nodes):
                    await h.kubelet.wait_until(
                        lambda k: (id_at(h, path) or "").startswith("loop-file.")
                    )
                    lun = id_at(h, path)
                    assert lun in h.state().devices
            await h.kubelet.wait_until(lambda k: lun not in h.state().devices)
            # The same file comes back under another number (the old one is
            # taken by an empty loop device, listed under its path's ID).
            with new_loop(control) as placeholder, new_loop(control) as other:
                assert other != first
                del placeholder
                with attached(other, backing, nodes):
                    await h.kubelet.wait_until(lambda k: lun in h.state().devices)
                    assert id_at(h, f"/dev/loop{other}") == lun
                    grant = await h.kubelet.allocate(h.name, [lun])
                    assert [d.host_path for d in grant.devices] == [f"/dev/loop{other}"]
