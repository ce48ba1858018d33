"""Only character and block device nodes are ever advertised or granted,
and the plugin's socket is the kubelet's (root's) alone."""

import os
import socket

import trio

from powerdev.devices.events import DeviceEvent
from tests.conftest import ChannelEvents, config_for, daemon_and_kubelet, make_dev_tree

LIMIT = 10
EVERYTHING = config_for('{"include-devices": ["/dev/pool/*"]}')


def fill_with_non_devices(pool):
    (pool / "regular").write_text("a file a pattern matches")
    (pool / "directory").mkdir()
    os.mkfifo(pool / "fifo")
    (pool / "link-to-regular").symlink_to("regular")
    (pool / "link-to-directory").symlink_to("directory")
    (pool / "dangling").symlink_to("nowhere")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(pool / "socket"))
    sock.close()


async def test_non_devices_are_never_advertised_nor_granted(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", ["pool/real"])
    fill_with_non_devices(dev / "pool")
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, EVERYTHING, dev_root=dev) as h:
            assert h.state().devices == {"pool.real": "Healthy"}
            grant = await h.kubelet.allocate(h.name, ["pool.real"])
            assert [d.host_path for d in grant.devices] == ["/dev/pool/real"]


async def test_non_devices_that_appear_later_are_ignored(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", ["pool/real"])
    events = ChannelEvents()
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, EVERYTHING, dev_root=dev, events=events) as h:
            fill_with_non_devices(dev / "pool")
            (dev / "pool" / "late").symlink_to("/dev/null")
            names = [
                "regular",
                "directory",
                "fifo",
                "link-to-regular",
                "link-to-directory",
                "dangling",
                "socket",
                "late",
            ]
            events.send.send_nowait(
                DeviceEvent("add", tuple(f"/dev/pool/{n}" for n in names), "block", None)
            )
            await h.kubelet.wait_until(lambda k: "pool.late" in h.state().devices)
            assert set(h.state().devices) == {"pool.real", "pool.late"}


async def test_the_socket_is_closed_to_group_and_others(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", ["pool/real"])
    old = os.umask(0o022)  # whatever the caller's umask, the socket is 0600
    try:
        with trio.fail_after(LIMIT):
            async with daemon_and_kubelet(tmp_path, EVERYTHING, dev_root=dev) as h:
                mode = os.stat(h.settings.plugin_dir / h.plugin.resource.socket).st_mode
                assert mode & 0o077 == 0
    finally:
        os.umask(old)
