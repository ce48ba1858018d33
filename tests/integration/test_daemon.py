"""The daemon against the fake kubelet, in-process, over real unix sockets."""

import os
import shutil
import stat

import pytest
import trio
import trio.lowlevel

from powerdev.daemon import supervisor
from powerdev.daemon.settings import Settings
from powerdev.devtools.fake_kubelet import FakeKubelet
from powerdev.kubelet.paths import KUBELET_SOCKET
from powerdev.rpc import asyncio_door
from powerdev.rpc.kubelet_side import PluginCallError, PluginClient
from powerdev.support.probe import socket_answers
from tests.conftest import config_for, daemon_and_kubelet, host_safe, make_dev_tree, wait_for_file

LIMIT = 10  # seconds; every wait below is on an event, this only bounds a hang

INCLUDE = '{"include-devices": ["/dev/dm-*", "/dev/mapper/*"], "permissions": "rw"}'


@pytest.fixture
def dev(tmp_path):
    return make_dev_tree(tmp_path / "dev", ["dm-0", "dm-1", "mapper/mpatha", "sda"])


async def test_registers_and_lists_every_device(tmp_path, dev):
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config_for(INCLUDE), dev_root=dev) as h:
            state = h.state()
            assert state.endpoint == "power-dev.csi.ibm.com-reg.sock"
            assert state.options == (False, False)
            assert state.devices == {
                "dm-0": "Healthy",
                "dm-1": "Healthy",
                "mapper.mpatha": "Healthy",
            }
            assert (state.capacity, state.allocatable) == (3, 3)
            sock = h.settings.plugin_dir / state.endpoint
            assert stat.S_ISSOCK(os.stat(sock).st_mode)


@pytest.mark.parametrize(
    ("allocation", "options"), [("all", (False, False)), ("each", (False, True))]
)
async def test_register_sends_the_options_that_the_options_call_answers(
    tmp_path, dev, allocation, options
):
    config = config_for(f'{{"include-devices": ["/dev/dm-*"], "allocation": "{allocation}"}}')
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config, dev_root=dev) as h:
            assert h.state().options == options  # GetDevicePluginOptions
            assert h.state().register_options == options  # RegisterRequest.options


async def test_a_change_reaches_the_kubelet_as_a_whole_list(tmp_path, dev):
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config_for(INCLUDE), dev_root=dev) as h:
            (dev / "dm-7").symlink_to("/dev/null")
            (dev / "dm-0").unlink()
            await supervisor.scan(h.plugin)
            await h.kubelet.wait_until(lambda k: "dm-7" in h.state().devices)
            assert sorted(h.state().devices) == ["dm-1", "dm-7", "mapper.mpatha"]
            assert h.state().updates == 2


async def test_allocate_grants_every_device_with_the_configured_permissions(tmp_path, dev):
    config = config_for('{"include-devices": ["/dev/dm-*"], "permissions": "MR"}')
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config, dev_root=dev) as h:
            grant = await h.kubelet.allocate(h.name, ["dm-1"])
            assert [(d.host_path, d.container_path, d.permissions) for d in grant.devices] == [
                ("/dev/dm-0", "/dev/dm-0", "rm"),
                ("/dev/dm-1", "/dev/dm-1", "rm"),
            ]
            assert (grant.envs, grant.mounts, grant.annotations) == ({}, (), {})
            several = await h.kubelet.allocate_containers(h.name, [["dm-0"], ["dm-1"], ["dm-0"]])
            assert len(several) == 3 and all(g == grant for g in several)


async def test_bad_ids_get_invalid_argument_and_the_daemon_keeps_serving(tmp_path, dev):
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config_for(INCLUDE), dev_root=dev) as h:
            for ids in (["no-such-disk"], ["dm-0", "sdx"], ["\x00\uffff" * 3]):
                with pytest.raises(PluginCallError) as err:
                    await h.kubelet.allocate(h.name, ids)
                assert err.value.status == "INVALID_ARGUMENT"
                assert "unknown device ID" in err.value.message
            assert "'no-such-disk'" in str(
                await _refusal(h.kubelet.allocate(h.name, ["no-such-disk"]))
            )
            grant = await h.kubelet.allocate(h.name, ["dm-0"])
            assert len(grant.devices) == 3
            assert h.state().connected


async def _refusal(call):
    try:
        await call
    except PluginCallError as err:
        return err
    raise AssertionError("the call was not refused")


async def test_two_streams_both_get_every_update(tmp_path, dev):
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config_for(INCLUDE), dev_root=dev) as h:
            seen: list[list[str]] = []
            arrived = trio.Event()

            def on_update(devices):
                nonlocal arrived
                seen.append(sorted(i for i, _ in devices))
                arrived.set()
                arrived = trio.Event()

            other = PluginClient(h.settings.plugin_dir / h.plugin.resource.socket)
            h.nursery.start_soon(other.watch, on_update)
            await arrived.wait()  # the second stream's first list comes at once
            (dev / "dm-9").symlink_to("/dev/null")  # seen by the watch on dev/
            await arrived.wait()
            await h.kubelet.wait_until(lambda k: "dm-9" in h.state().devices)
            assert seen[1] == sorted(h.state().devices) == ["dm-0", "dm-1", "dm-9", "mapper.mpatha"]
            other.close()


async def test_survives_several_kubelet_restarts(tmp_path, dev):
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config_for(INCLUDE), dev_root=dev) as h:
            for n in range(2, 7):
                await h.kubelet.restart()
                await h.wait_registered(n)
                assert h.state().capacity == 3
                assert len((await h.kubelet.allocate(h.name, ["dm-0"])).devices) == 3
            assert h.kubelet.restarts == 5


async def test_registers_again_when_the_kubelets_stream_ends(tmp_path, dev):
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config_for(INCLUDE), dev_root=dev) as h:
            h.kubelet.end_stream(h.name)
            await h.kubelet.wait_until(lambda k: h.state().ended_reason is not None)
            assert h.state().allocatable == 0  # as the real kubelet: unhealthy until re-registered
            await h.wait_registered(2)
            assert h.state().allocatable == 3


async def test_serves_again_when_its_socket_is_deleted(tmp_path, dev):
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config_for(INCLUDE), dev_root=dev) as h:
            (h.settings.plugin_dir / h.plugin.resource.socket).unlink()
            await h.wait_registered(2)
            assert (h.settings.plugin_dir / h.plugin.resource.socket).exists()


async def test_waits_for_an_absent_kubelet(tmp_path, dev):
    plugin_dir = tmp_path / "device-plugins"
    status = tmp_path / "status.json"
    settings = Settings(
        plugin_dir=plugin_dir,
        dev_root=dev,
        sys_root=tmp_path / "sys",
        status_file=status,
        **host_safe(tmp_path),
    )
    with trio.fail_after(LIMIT):
        async with asyncio_door(), trio.open_nursery() as nursery:
            nursery.start_soon(supervisor.run, settings, config_for(INCLUDE))
            await wait_for_file(status, lambda text: '"waiting"' in text)
            assert not (plugin_dir / KUBELET_SOCKET).exists()
            assert list(plugin_dir.iterdir()) == []  # nothing served before the kubelet is up
            kubelet = FakeKubelet(plugin_dir)
            await nursery.start(kubelet.run)
            await kubelet.wait_until(
                lambda k: k.registrations == 1 and k.resources["power-dev-plugin/dev"].updates == 1
            )
            assert kubelet.resources["power-dev-plugin/dev"].capacity == 3
            nursery.cancel_scope.cancel()


async def test_upper_limit_advertises_shares(tmp_path, dev):
    config = config_for('{"include-devices": ["/dev/dm-*"], "upper-limit": 4}')
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config, dev_root=dev) as h:
            assert sorted(h.state().devices) == ["share-1", "share-2", "share-3", "share-4"]
            assert h.state().allocatable == 4
            grant = await h.kubelet.allocate(h.name, ["share-3"])
            assert [d.host_path for d in grant.devices] == ["/dev/dm-0", "/dev/dm-1"]


async def test_stopping_removes_the_socket(tmp_path, dev):
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config_for(INCLUDE), dev_root=dev) as h:
            sock = h.settings.plugin_dir / h.plugin.resource.socket
            assert sock.exists()
        assert not sock.exists()


async def test_a_removed_plugin_dir_is_watched_again(tmp_path, dev):
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config_for(INCLUDE), dev_root=dev) as h:
            # Moved away in one atomic step, then removed: the daemon may put a
            # socket back at any moment, and a recursive delete would race it.
            gone = tmp_path / "removed-plugin-dir"
            h.settings.plugin_dir.rename(gone)
            await trio.to_thread.run_sync(shutil.rmtree, gone)
            await h.kubelet.restart()  # a kubelet makes the directory again as it starts
            await h.wait_registered(2)
            assert (h.settings.plugin_dir / h.plugin.resource.socket).exists()


async def test_a_refused_register_is_retried_and_logged_once(tmp_path, dev, caplog):
    plugin_dir = tmp_path / "device-plugins"
    settings = Settings(
        plugin_dir=plugin_dir, dev_root=dev, sys_root=tmp_path / "sys", **host_safe(tmp_path)
    )
    with trio.fail_after(LIMIT):
        async with asyncio_door(), trio.open_nursery() as nursery:
            kubelet = FakeKubelet(plugin_dir)
            kubelet.refuse_next = 3
            await nursery.start(kubelet.run)
            nursery.start_soon(supervisor.run, settings, config_for(INCLUDE))
            await kubelet.wait_until(lambda k: k.registrations == 1)
            assert len(kubelet.refusals) == 3
            failures = [r for r in caplog.records if "Register failed" in r.getMessage()]
            assert len(failures) == 1  # the same failure three times is logged once
            assert "the device manager is not ready" in failures[0].getMessage()
            nursery.cancel_scope.cancel()


async def test_preferred_allocation_answers_though_not_advertised(tmp_path, dev):
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config_for(INCLUDE), dev_root=dev) as h:
            client = h.kubelet.client(h.name)
            assert h.state().options == (False, False)
            assert await client.preferred(["dm-0", "dm-1", "mapper.mpatha"], ["dm-1"], 2) == [
                "dm-1",
                "dm-0",
            ]
            with pytest.raises(PluginCallError) as err:
                await client.preferred(["dm-0"], [], -1)
            assert err.value.status == "INVALID_ARGUMENT"


async def test_a_socket_deleted_the_moment_it_is_bound_is_served_again(
    tmp_path, dev, monkeypatch, caplog
):
    # A kubelet that starts up deletes every socket; it can hit ours between
    # bind and our first look at it. The daemon must shrug and serve again.
    import powerdev.rpc.door as door

    hits = []

    def a_kubelet_sweeps(path):
        if path.name.endswith(".csi.ibm.com-reg.sock") and not hits:
            hits.append(path)
            os.unlink(path)

    monkeypatch.setattr(door, "after_bind", a_kubelet_sweeps)
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config_for(INCLUDE), dev_root=dev) as h:
            assert hits  # the sweep happened, and yet:
            assert h.state().capacity == 3
            assert (h.settings.plugin_dir / h.plugin.resource.socket).exists()
        assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []


async def test_a_failure_between_bind_and_serve_leaves_no_server(tmp_path, monkeypatch):
    import powerdev.rpc.door as door

    def cannot_chmod(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(door, "after_bind", cannot_chmod)
    path = tmp_path / "s.sock"
    with trio.fail_after(LIMIT):
        async with asyncio_door():
            with pytest.raises(PermissionError):
                await door.serve(path, [])
    assert not socket_answers(path)  # closed: nothing listens


@pytest.mark.parametrize(
    ("config", "why"),
    [
        ('{"include-devices": ["/dev/dm-*"]}', "nothing under"),
        ('{"include-devices": ["/dev/sd*"], "exclude-devices": ["/dev/sd?"]}', "exclude-devices"),
        (
            '{"include-devices": ["/dev/file*"]}',
            "1 path matches, but it is not a character or block device node",
        ),
    ],
)
async def test_a_resource_with_no_device_says_why(tmp_path, config, why, caplog):
    dev = make_dev_tree(tmp_path / "dev", ["sda", "sdb"])
    (dev / "file1").write_text("not a device")
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config_for(config), dev_root=dev) as h:
            assert h.state().capacity == 0
    (line,) = [r.getMessage() for r in caplog.records if "advertises no device" in r.getMessage()]
    assert why in line


async def test_a_pattern_into_a_missing_directory_is_warned_about_and_followed(tmp_path, caplog):
    dev = make_dev_tree(tmp_path / "dev", ["dm-0"])
    config = config_for('{"include-devices": ["/dev/dm-*", "/dev/mapper/*"]}')
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config, dev_root=dev) as h:
            (warning,) = [
                r.getMessage() for r in caplog.records if "can match nothing" in r.getMessage()
            ]
            assert "'/dev/mapper/*'" in warning and str(dev / "mapper") in warning
            make_dev_tree(dev, ["mapper/mpatha"])  # the directory appears: followed
            await h.kubelet.wait_until(lambda k: "mapper.mpatha" in h.state().devices)


async def test_the_fake_kubelets_restart_returns_once_the_new_kubelet_serves(tmp_path, dev):
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config_for(INCLUDE), dev_root=dev) as h:
            assert h.kubelet.generation == 1
            await h.kubelet.restart()
            assert h.kubelet.generation == 2  # not "soon": now
            assert socket_answers(h.settings.plugin_dir / KUBELET_SOCKET)
            await h.wait_registered(2)  # nothing in flight when the test ends


async def test_a_second_register_replaces_the_endpoint_and_leaves_the_old_stream(tmp_path, dev):
    # As the real device manager: the old client is replaced, not cut; its
    # stream ends when its plugin ends it, and touches only the old state.
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config_for(INCLUDE), dev_root=dev) as h:
            old = h.state()
            # What the kubelet's Registration service does with a second Register:
            await h.kubelet.register("v1beta1", h.plugin.resource.socket, h.name)
            await h.kubelet.wait_until(
                lambda k: k.registrations == 2 and k.resources[h.name] is not old
            )
            assert old.connected  # the old stream was not cut by the kubelet
            await h.kubelet.wait_until(lambda k: h.state().updates > 0)
            assert h.state().connected and h.state().allocatable == 3


async def test_an_unknown_field_is_warned_about_once(tmp_path, dev, caplog):
    from powerdev.config import load_config

    (tmp_path / "etc").mkdir()
    path = tmp_path / "etc" / "config.json"
    path.write_text('{"include-devices": ["/dev/dm-*"], "debug": true}')
    config = load_config(path)
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config, dev_root=dev, config_path=path) as h:
            path.touch()  # an event in the directory: read again, same content
            os.utime(path)
            await h.kubelet.wait_until(lambda k: h.state().capacity == 2)
    warnings = [r for r in caplog.records if "'debug' is not known" in r.getMessage()]
    assert len(warnings) == 1


async def test_a_resource_removed_before_it_serves_is_never_served(tmp_path, dev):
    """The kubelet is not up yet, so serving waits; a reload removes the
    resource meanwhile: it must not be served when the kubelet comes."""
    settings = Settings(
        plugin_dir=tmp_path / "device-plugins",
        dev_root=dev,
        sys_root=tmp_path / "sys",
        **host_safe(tmp_path),
    )
    with trio.fail_after(LIMIT):
        async with asyncio_door(), trio.open_nursery() as nursery:
            running = supervisor.Running(settings, nursery, [], None)
            plugin = await running.prepare(config_for(INCLUDE).resources[0])
            running.remove(plugin)
            await running.start(plugin, wait=True)  # returns at once: nothing to serve
            assert not settings.plugin_dir.exists() or not list(settings.plugin_dir.iterdir())
            nursery.cancel_scope.cancel()


async def test_a_missing_plugin_directory_is_named_as_missing(tmp_path, dev, caplog):
    plugin_dir = tmp_path / "not-yet" / "device-plugins"
    status = tmp_path / "status"
    settings = Settings(
        plugin_dir=plugin_dir,
        dev_root=dev,
        sys_root=tmp_path / "sys",
        status_file=status,
        **host_safe(tmp_path),
    )
    with trio.fail_after(LIMIT):
        async with asyncio_door(), trio.open_nursery() as nursery:
            nursery.start_soon(supervisor.run, settings, config_for(INCLUDE))
            await wait_for_file(status, lambda text: '"waiting"' in text)
            said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
            assert any(
                f"the plugin directory {plugin_dir} did not exist" in line
                and "--plugin-dir" in line
                for line in said
            ), said
            nursery.cancel_scope.cancel()


async def test_a_resource_whose_first_scan_fails_leaves_nothing_behind(tmp_path, dev, monkeypatch):
    """A reload's new resource that cannot be scanned is not added: it is in
    no list, holds no scope, and its spec writer retires."""
    settings = Settings(
        plugin_dir=tmp_path / "device-plugins",
        dev_root=dev,
        sys_root=tmp_path / "sys",
        **host_safe(tmp_path),
    )

    async def refused(plugin) -> None:
        raise OSError("the kernel refused to stat a node")

    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            running = supervisor.Running(settings, nursery, [], None)
            monkeypatch.setattr(supervisor, "scan", refused)
            resource = config_for(INCLUDE, name="a.io/broken").resources[0]
            with pytest.raises(OSError, match="refused"):
                await running.prepare(resource)
            assert running.plugins == []
            assert "a.io/broken" not in running._scopes
            assert running.specs.retiring("a.io/broken")  # its spec writer retires
            nursery.cancel_scope.cancel()
