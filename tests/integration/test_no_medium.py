"""A block device with no medium (sysfs `size` 0) is not offered, over a made
/dev (block nodes made with mknod: root) and a made --sys-root tree: the
daemon lists it Unhealthy once its size drops to 0 and Healthy once it
is back, and `powerdev scan` leaves one out with the reason, through each
API (the device plugin API, DRA, both: one verdict for all)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import trio

from powerdev.devices.events import DeviceEvent
from tests.conftest import ChannelEvents, config_for, daemon_and_kubelet, needs_root
from tests.unit.test_identity import FakeSys

pytestmark = needs_root
LIMIT = 10
MAJOR = 252  # virtio-blk's; the tree says what it is
REASON = "it has no medium (its size in sysfs is 0"


def tree(tmp_path, sizes: dict[str, str]):
    """/dev/vd<x> block nodes and their sysfs, each with its `size`."""
    dev, sys_tree = tmp_path / "dev", FakeSys(tmp_path / "sys")
    dev.mkdir()
    for minor, (name, size) in enumerate(sizes.items()):
        number = (MAJOR, 16 * minor)
        os.mknod(dev / name, stat.S_IFBLK | 0o600, os.makedev(*number))
        sys_tree.device(
            f"virtual/block/{name}", number, uevent={"DEVTYPE": "disk"}, files={"size": size}
        )
    return dev, tmp_path / "sys"


async def test_the_daemon_lists_a_disk_whose_size_drops_to_0_unhealthy_until_it_is_back(
    tmp_path,
):
    dev, sys_root = tree(tmp_path, {"vdb": "8\n", "vdc": "0\n"})
    events = ChannelEvents()
    size = sys_root / "devices" / "virtual" / "block" / "vdb" / "size"
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(
            tmp_path,
            config_for('{"include-devices": ["/dev/vd*"]}'),
            dev_root=dev,
            sys_root=sys_root,
            events=events,
        ) as h:
            assert h.state().devices == {"vdb": "Healthy"}  # vdc: no medium, left out
            size.write_text("0\n")  # detached: the kernel says "change"
            events.send.send_nowait(DeviceEvent("change", ("/dev/vdb",), "block", (MAJOR, 0)))
            await h.kubelet.wait_until(lambda k: h.state().devices == {"vdb": "Unhealthy"})
            size.write_text("8\n")
            events.send.send_nowait(DeviceEvent("change", ("/dev/vdb",), "block", (MAJOR, 0)))
            await h.kubelet.wait_until(lambda k: h.state().devices == {"vdb": "Healthy"})


def test_scan_leaves_a_disk_with_no_medium_out_through_every_api(tmp_path):
    sizes = {"vdb": "8\n", "vdc": "0\n", "vdd": "8\n", "vde": "0\n", "vdf": "0\n"}
    dev, sys_root = tree(tmp_path, sizes)
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "resources": [
                    {"name": "a.io/dp", "include-devices": ["/dev/vdb", "/dev/vdc"]},
                    {"name": "a.io/dra", "api": "dra", "include-devices": ["/dev/vdd", "/dev/vde"]},
                    {"name": "a.io/both", "api": "both", "include-devices": ["/dev/vdf"]},
                ]
            }
        )
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "powerdev",
            "scan",
            "--config",
            str(config),
            "--dev-root",
            str(dev),
            "--sys-root",
            str(sys_root),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    dp, dra, both = json.loads(done.stdout)
    assert [d["path"] for d in dp["advertised"]] == ["/dev/vdb"]
    ((path, why),) = [(x["path"], x["reason"]) for x in dp["left_out"]]
    assert path == "/dev/vdc" and why.startswith(REASON)
    assert [d["path"] for d in dra["advertised"]] == ["/dev/vdd"]
    ((path, why),) = [(x["path"], x["reason"]) for x in dra["left_out"]]
    assert path == "/dev/vde" and why.startswith(REASON)
    assert both["advertised"] == []
    ((path, why),) = [(x["path"], x["reason"]) for x in both["left_out"]]
    assert path == "/dev/vdf" and why.startswith(REASON)
