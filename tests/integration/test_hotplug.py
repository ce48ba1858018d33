"""Device events pushed through the daemon to the kubelet (a fake event source)."""

import trio

from powerdev.devices.events import DeviceEvent
from tests.conftest import ChannelEvents, config_for, daemon_and_kubelet, make_dev_tree, needs_root

LIMIT = 10
CONFIG = '{"include-devices": ["/dev/dm-*"]}'


async def test_an_event_reaches_the_kubelet_without_a_rescan(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", ["dm-0"])
    events = ChannelEvents()
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(
            tmp_path, config_for(CONFIG), dev_root=dev, events=events
        ) as h:
            (dev / "dm-1").symlink_to("/dev/null")
            events.send.send_nowait(DeviceEvent("add", ("/dev/dm-1",), "block", (253, 1)))
            await h.kubelet.wait_until(lambda k: "dm-1" in h.state().devices)
            (dev / "dm-0").unlink()
            events.send.send_nowait(DeviceEvent("remove", ("/dev/dm-0",), "block", (253, 0)))
            await h.kubelet.wait_until(lambda k: "dm-0" not in h.state().devices)
            assert h.state().devices == {"dm-1": "Healthy"}
            assert h.state().updates == 3


@needs_root
async def test_a_storm_gives_few_updates_and_an_exact_list(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", [])
    events = ChannelEvents()
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(
            tmp_path, config_for(CONFIG), dev_root=dev, events=events
        ) as h:
            for i in range(2000):  # 2,000 devices (mknod), each its own unit
                make_dev_tree(dev, [f"dm-{i}"])
                events.send.send_nowait(DeviceEvent("add", (f"/dev/dm-{i}",), "block", None))
            for i in range(0, 2000, 3):
                (dev / f"dm-{i}").unlink()
                events.send.send_nowait(DeviceEvent("remove", (f"/dev/dm-{i}",), "block", None))
            expected = {f"dm-{i}" for i in range(2000) if i % 3}
            await h.kubelet.wait_until(lambda k: set(h.state().devices) == expected)
            assert h.state().updates <= 5  # 3,333 events, a handful of messages


async def test_lost_events_cause_a_rescan(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", ["dm-0"])
    events = ChannelEvents()
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(
            tmp_path, config_for(CONFIG), dev_root=dev, events=events
        ) as h:
            (dev / "dm-4").symlink_to("/dev/null")
            events.send.send_nowait("rescan")
            await h.kubelet.wait_until(lambda k: "dm-4" in h.state().devices)


async def test_a_replaced_device_turns_unhealthy_on_the_kubelet(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", ["dm-0", "dm-1"])
    events = ChannelEvents()
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(
            tmp_path, config_for(CONFIG), dev_root=dev, events=events
        ) as h:
            (dev / "dm-1").unlink()
            (dev / "dm-1").symlink_to("/dev/zero")
            events.send.send_nowait(DeviceEvent("change", ("/dev/dm-1",), "block", None))
            await h.kubelet.wait_until(lambda k: h.state().devices.get("dm-1") == "Unhealthy")
            assert (h.state().capacity, h.state().allocatable) == (2, 1)
            grant = await h.kubelet.allocate(h.name, ["dm-0"])
            assert [d.host_path for d in grant.devices] == ["/dev/dm-0"]


async def test_links_made_and_removed_in_a_watched_directory(tmp_path):
    # udev makes /dev/mapper links after the kernel event; inotify sees them.
    dev = make_dev_tree(tmp_path / "dev", ["dm-0", "dm-1"])
    (dev / "mapper").mkdir()
    (dev / "mapper" / "mpatha").symlink_to("../dm-0")
    config = config_for('{"include-devices": ["/dev/mapper/*"]}')
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config, dev_root=dev) as h:
            assert h.state().devices == {"mapper.mpatha": "Healthy"}
            (dev / "mapper" / ".tmp-link").symlink_to("../dm-1")
            (dev / "mapper" / ".tmp-link").rename(dev / "mapper" / "mpathb")  # as udev does
            await h.kubelet.wait_until(lambda k: "mapper.mpathb" in h.state().devices)
            (dev / "mapper" / "mpatha").unlink()
            await h.kubelet.wait_until(lambda k: "mapper.mpatha" not in h.state().devices)
            assert h.state().devices == {"mapper.mpathb": "Healthy"}
