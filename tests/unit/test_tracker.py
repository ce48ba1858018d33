"""Device events to inventory: what is re-probed, what appears, vanishes, sickens."""

import pytest

from powerdev.config import ResourceConfig
from powerdev.devices.dirwatch import INOTIFY, watch_levels
from powerdev.devices.events import DeviceEvent
from powerdev.devices.inventory import Inventory
from powerdev.resources.matching import wanted
from powerdev.resources.tracker import Tracker
from tests.conftest import DirectoryUdev, make_dev_tree


async def tracker(tmp_path, resource, names=()):
    dev = make_dev_tree(tmp_path / "dev", list(names), target="/dev/null")
    t = Tracker(resource, Inventory(), dev, tmp_path / "sys")
    await t.rescan()
    return t, dev


def listed(t):
    return {d.path: d.healthy for d in t.inventory.current.devices}


INCLUDE = ResourceConfig(include=("/dev/dm-*", "/dev/mapper/*"), exclude=("/dev/dm-9",))


@pytest.mark.parametrize(
    ("resource", "path", "subsystem", "hit"),
    [
        (INCLUDE, "/dev/dm-3", "block", True),
        (INCLUDE, "/dev/dm-9", "block", False),  # excluded
        (INCLUDE, "/dev/sda", "block", False),
        (INCLUDE, "/dev/mapper/mpatha", "block", True),
        (ResourceConfig(), "/dev/sdb", "block", True),
        (ResourceConfig(), "/dev/sdb1", "block", True),
        (ResourceConfig(), "/dev/loop3", "block", False),  # left out of block discovery
        (ResourceConfig(), "/dev/ttyS0", "tty", False),
        (ResourceConfig(), "/dev/disk/by-id/x", "block", False),  # links are not block discovery
        (ResourceConfig(nx_gzip=True), "/dev/crypto/nx-gzip", "misc", True),
        (
            ResourceConfig(nx_gzip=True, exclude=("/dev/crypto/*",)),
            "/dev/crypto/nx-gzip",
            "misc",
            False,
        ),
    ],
)
def test_wanted(resource, path, subsystem, hit):
    assert wanted(resource, path, subsystem) is hit


async def test_add_and_remove_events_change_only_what_they_name(tmp_path):
    t, dev = await tracker(tmp_path, INCLUDE, ["dm-0"])
    version = t.inventory.current.version
    (dev / "dm-1").symlink_to("/dev/null")
    (dev / "dm-2").symlink_to("/dev/null")  # no event for it: not looked at
    assert t.apply([DeviceEvent("add", ("/dev/dm-1",), "block", (253, 1))]) is True
    assert listed(t) == {"/dev/dm-0": True, "/dev/dm-1": True}
    assert t.inventory.current.version == version + 1
    (dev / "dm-1").unlink()
    assert t.apply([DeviceEvent("remove", ("/dev/dm-1",), "block", (253, 1))]) is True
    assert listed(t) == {"/dev/dm-0": True}


async def test_events_that_match_nothing_publish_nothing(tmp_path):
    t, _ = await tracker(tmp_path, INCLUDE, ["dm-0", "sda"])
    version = t.inventory.current.version
    assert t.apply([DeviceEvent("change", ("/dev/sda",), "block", (8, 0))]) is False
    assert t.apply([DeviceEvent("change", ("/dev/dm-0",), "block", (1, 3))]) is False  # same node
    assert t.inventory.current.version == version


async def test_a_burst_becomes_one_exact_update(tmp_path):
    t, dev = await tracker(tmp_path, INCLUDE, [])
    events = []
    for i in range(500):
        (dev / f"dm-{i}").symlink_to("/dev/null")
        events.append(DeviceEvent("add", (f"/dev/dm-{i}",), "block", (253, i)))
    for i in range(0, 500, 2):
        (dev / f"dm-{i}").unlink()
        events.append(DeviceEvent("remove", (f"/dev/dm-{i}",), "block", (253, i)))
    version = t.inventory.current.version
    assert t.apply(events) is True
    assert t.inventory.current.version == version + 1
    assert sorted(listed(t)) == sorted(f"/dev/dm-{i}" for i in range(1, 500, 2) if i != 9)


async def test_links_are_followed_by_their_node_number(tmp_path):
    t, dev = await tracker(tmp_path, ResourceConfig(include=("/dev/mapper/*",)), [])
    (dev / "dm-0").symlink_to("/dev/null")
    (dev / "mapper").mkdir()
    (dev / "mapper" / "mpatha").symlink_to("../dm-0")
    # the udev source names the links of a node
    t.apply([DeviceEvent("add", ("/dev/dm-0", "/dev/mapper/mpatha"), "block", (1, 3))])
    assert listed(t) == {"/dev/mapper/mpatha": True}
    # the kernel source names only the node; its number finds the tracked link
    (dev / "dm-0").unlink()
    t.apply([DeviceEvent("remove", ("/dev/dm-0",), "block", (1, 3))])
    assert listed(t) == {}


async def test_another_device_under_the_same_name_is_unhealthy_until_it_goes(tmp_path):
    t, dev = await tracker(tmp_path, INCLUDE, ["dm-0"])
    event = DeviceEvent("change", ("/dev/dm-0",), "block", None)
    (dev / "dm-0").unlink()
    (dev / "dm-0").symlink_to("/dev/zero")  # 1:5 where 1:3 was
    t.apply([event])
    assert listed(t) == {"/dev/dm-0": False}
    assert (await t.rescan()) is False  # a rescan does not launder it
    (dev / "dm-0").unlink()
    (dev / "dm-0").symlink_to("/dev/null")  # the original is back
    t.apply([event])
    assert listed(t) == {"/dev/dm-0": True}
    (dev / "dm-0").unlink()
    (dev / "dm-0").symlink_to("/dev/zero")
    t.apply([event])
    assert listed(t) == {"/dev/dm-0": False}
    (dev / "dm-0").unlink()  # the name goes away ...
    t.apply([event])
    assert listed(t) == {}
    (dev / "dm-0").symlink_to("/dev/zero")  # ... and comes back: a new device, Healthy
    t.apply([event])
    assert listed(t) == {"/dev/dm-0": True}


async def test_rescan_is_exact(tmp_path):
    t, dev = await tracker(tmp_path, INCLUDE, ["dm-0", "dm-1"])
    (dev / "dm-0").unlink()
    (dev / "dm-5").symlink_to("/dev/null")
    assert (await t.rescan()) is True
    assert listed(t) == {"/dev/dm-1": True, "/dev/dm-5": True}


def test_watch_levels_are_dev_and_every_directory_level_of_the_patterns():
    patterns = [
        "/dev/mapper/*",
        "/dev/dm-*",
        "/dev/disk/by-*/x",
        "/dev/disk/by-id/wwn-*",
        "/dev/mapper/mpath?",
    ]
    assert watch_levels(patterns) == [
        "/dev",
        "/dev/disk",
        "/dev/disk/by-*",
        "/dev/disk/by-id",
        "/dev/mapper",
    ]
    assert watch_levels([]) == ["/dev"]  # block discovery: nodes in /dev itself


async def test_a_change_event_rematches_udev_properties(tmp_path):
    """udev rewrites a device's properties (a multipath map gets its UUID);
    the change event names only the node, and the link follows."""
    dev = make_dev_tree(tmp_path / "dev", ["mapper/mpatha"], target="/dev/zero")  # 1:5
    udev = tmp_path / "udev"
    udev.mkdir()
    (udev / "c1:5").write_text("E:DM_UUID=LVM-abc\n")
    resource = ResourceConfig(
        include=("/dev/mapper/*",), match_properties=(("DM_UUID", ("mpath-*",)),)
    )
    t = Tracker(resource, Inventory(), dev, tmp_path / "sys", udev=DirectoryUdev(udev))
    await t.rescan()
    assert listed(t) == {}
    (udev / "c1:5").write_text("E:DM_UUID=mpath-3600a\n")
    assert t.apply([DeviceEvent("change", ("/dev/dm-0",), "block", (1, 5))]) is True
    assert listed(t) == {"/dev/mapper/mpatha": True}
    (udev / "c1:5").write_text("E:DM_UUID=LVM-abc\n")
    assert t.apply([DeviceEvent("change", ("/dev/dm-0",), "block", (1, 5))]) is True
    assert listed(t) == {}


async def test_a_rescan_that_began_earlier_never_overwrites_a_later_one(tmp_path):
    """A config narrowed while a rescan under the old one runs: the old
    rescan's result, arriving last, must not bring the dropped devices back."""
    import threading

    import trio

    t, _ = await tracker(tmp_path, INCLUDE, ["dm-0", "dm-1", "mapper/mpatha"])
    release, entered = threading.Event(), threading.Event()
    real = t._glob

    def slow_first(resource):
        result = real(resource)
        if not entered.is_set():
            entered.set()
            release.wait(10)
        return result

    t._glob = slow_first
    async with trio.open_nursery() as nursery:
        nursery.start_soon(t.rescan)  # under the wide config; held in its thread
        await trio.to_thread.run_sync(entered.wait, 10)
        await t.rescan(ResourceConfig(include=("/dev/dm-0",)))  # the narrow one finishes first
        assert listed(t) == {"/dev/dm-0": True}
        release.set()
    assert listed(t) == {"/dev/dm-0": True}  # the older result was dropped
    assert t.resource.include == ("/dev/dm-0",)


async def test_new_settings_come_into_force_with_the_list_found_under_them(tmp_path):
    """A reload that excludes a device and changes permissions: while its
    rescan runs, an Allocate still sees the old settings with the old list,
    and afterwards the new settings with the new list, never a mix."""
    import threading
    from dataclasses import replace

    import trio

    from powerdev.resources.plugin import Plugin

    t, _ = await tracker(tmp_path, INCLUDE, ["dm-0", "dm-1"])
    plugin = Plugin(t.resource, t.inventory, t, refresh=None, spec=None)
    release, entered = threading.Event(), threading.Event()
    real = t._glob

    def held(resource):
        entered.set()
        release.wait(10)
        return real(resource)

    t._glob = held
    new = replace(INCLUDE, exclude=("/dev/dm-1",), permissions="r")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(plugin.reconfigure, new)
        await trio.to_thread.run_sync(entered.wait, 10)
        assert plugin.resource == INCLUDE
        (grant,) = plugin.allocate([[plugin.units()[0].id]], refresh=False)
        assert [g.host_path for g in grant] == ["/dev/dm-0", "/dev/dm-1"]
        release.set()
    assert plugin.resource == new
    (grant,) = plugin.allocate([[plugin.units()[0].id]], refresh=False)
    assert [(g.host_path, g.permissions) for g in grant] == [("/dev/dm-0", "r")]


async def test_a_path_only_the_new_settings_want_made_during_their_rescan_is_found(tmp_path):
    import threading

    import trio

    t, dev = await tracker(tmp_path, ResourceConfig(include=("/dev/dm-*",)), ["dm-0"])
    release, entered = threading.Event(), threading.Event()
    real = t._glob

    def held(resource):
        found = real(resource)  # sees the host before sdz exists
        entered.set()
        release.wait(10)
        return found

    t._glob = held
    wider = ResourceConfig(include=("/dev/dm-*", "/dev/sd*"))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(t.rescan, wider)
        await trio.to_thread.run_sync(entered.wait, 10)
        make_dev_tree(dev, ["sdz"])
        t.apply([DeviceEvent("add", ("/dev/sdz",), INOTIFY)])  # the old settings ignore it
        release.set()
    assert listed(t) == {"/dev/dm-0": True, "/dev/sdz": True}


async def test_two_rescans_publishing_in_steps_at_once_both_finish(tmp_path, monkeypatch):
    """A rescan on SIGHUP beside one for a config change: both rule in steps
    at once. The first to finish must leave the other its own record of what
    events redid meanwhile (it used to take it, and the second crashed the
    daemon); an event in the middle is fresher than both."""
    import trio

    from powerdev.resources import tracker as tracker_module

    monkeypatch.setattr(tracker_module, "STEP", 1)  # three names: three steps each
    t, dev = await tracker(tmp_path, INCLUDE, ["dm-0", "dm-1", "dm-2"])
    names = list(t._mine)

    async def an_event_between_their_steps():
        await trio.lowlevel.checkpoint()  # both rescans are ruling by now
        (dev / "dm-2").unlink()
        t.apply([DeviceEvent("remove", ("/dev/dm-2",), "block")])

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(t._publish_in_steps, t.resource, names)
            nursery.start_soon(t._publish_in_steps, t.resource, names)
            nursery.start_soon(an_event_between_their_steps)
    assert listed(t) == {"/dev/dm-0": True, "/dev/dm-1": True}
    assert t._fresh == []
