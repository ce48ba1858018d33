"""Config changes at runtime, as a ConfigMap volume makes them (the ..data
symlink swap) and by SIGHUP: a good config is applied and pushed, a bad one
is logged with file, field and fix, and the last good one stays in force."""

import contextlib
import json
import os
import signal
import socket
from pathlib import Path

import trio

from powerdev.config import DEFAULT_RESOURCE_NAME as RESOURCE
from powerdev.devtools.testing import make_nodes
from tests.conftest import wait_for_file
from tests.faults.harness import ConfigMapVolume, kubelet_running, registered, spawn

LIMIT = 60


def grant_permissions(grant):
    return {d.permissions for d in grant.devices}


async def test_configmap_swaps_apply_good_configs_and_keep_the_last_good_one(tmp_path):
    dev = tmp_path / "dev"
    make_nodes(dev / "pool", ["d0", "d1", "d2", "x0", "x1"])
    volume = ConfigMapVolume(tmp_path / "configmap")
    volume.write(**{"include-devices": ["/dev/pool/d*"]})
    with trio.fail_after(LIMIT):
        async with (
            kubelet_running(tmp_path / "device-plugins") as (kubelet, _),
            spawn(tmp_path, volume.path, dev) as daemon,
        ):
            await kubelet.wait_until(registered(1, 3))
            volume.write(**{"include-devices": ["/dev/pool/*"], "permissions": "r"})
            await kubelet.wait_until(lambda k: k.resources[RESOURCE].capacity == 5)
            assert grant_permissions(await kubelet.allocate(RESOURCE, ["pool.x1"])) == {"r"}

            volume.write(**{"include-devices": ["/dev/pool/*"], "permissions": "rwx"})
            text = await wait_for_file(daemon.log, lambda t: "config not applied" in t)
            (line,) = [x for x in text.splitlines() if "config not applied" in x]
            assert str(volume.path) in line and "field 'permissions'" in line
            assert "use one or more of r, w, m" in line
            assert kubelet.resources[RESOURCE].capacity == 5  # the last good config stays
            assert grant_permissions(await kubelet.allocate(RESOURCE, ["pool.x1"])) == {"r"}

            volume.write(**{"include-devices": ["/dev/pool/x*"], "permissions": "rw"})
            await kubelet.wait_until(
                lambda k: set(k.resources[RESOURCE].devices) == {"pool.x0", "pool.x1"}
            )
            grant = await kubelet.allocate(RESOURCE, ["pool.x0"])
            assert len(grant.devices) == 2 and grant_permissions(grant) == {"rw"}
            assert kubelet.registrations == 1  # applied in place, no re-registration

            volume.write(**{"include-devices": ["/dev/pool/d*"]})
            assert await daemon.terminate() == 0  # SIGTERM in the middle of a reload
            assert not daemon.socket.exists()


async def test_sighup_reloads(tmp_path):
    dev = tmp_path / "dev"
    make_nodes(dev / "pool", ["d0", "d1"])
    (tmp_path / "etc").mkdir()
    config = tmp_path / "etc" / "config.json"
    config.write_text(json.dumps({"include-devices": ["/dev/pool/*"]}))
    # A write through a hard link elsewhere is invisible to a directory watch,
    # so only SIGHUP can make the daemon read it.
    (tmp_path / "elsewhere").mkdir()
    alias = tmp_path / "elsewhere" / "same-inode.json"
    os.link(config, alias)
    with trio.fail_after(LIMIT):
        async with (
            kubelet_running(tmp_path / "device-plugins") as (kubelet, _),
            spawn(tmp_path, config, dev) as daemon,
        ):
            await kubelet.wait_until(registered(1, 2))
            with alias.open("r+") as f:
                f.write(json.dumps({"include-devices": ["/dev/pool/d1"]}))
                f.truncate()
            daemon.proc.send_signal(signal.SIGHUP)
            await kubelet.wait_until(lambda k: set(k.resources[RESOURCE].devices) == {"pool.d1"})
            assert "received SIGHUP" in "".join(daemon.lines("SIGHUP"))
            assert await daemon.terminate() == 0


async def test_a_resource_removed_while_it_still_waits_to_serve_takes_nothing_down(tmp_path):
    # resources[1]'s socket is held by another server (an old plugin in a
    # migration), so it waits to serve; the reload that removes it meanwhile
    # must leave the daemon and resources[0] as they are.
    dev = tmp_path / "dev"
    make_nodes(dev / "pool", ["a0", "a1", "b0"])
    plugin_dir = tmp_path / "device-plugins"
    volume = ConfigMapVolume(tmp_path / "configmap")
    served = {"name": "example.com/a", "include-devices": ["/dev/pool/a*"]}
    held = {"name": "example.com/b", "include-devices": ["/dev/pool/b*"], "socket": "b.sock"}
    volume.write(resources=[served, held])
    with trio.fail_after(LIMIT), socket.socket(socket.AF_UNIX) as other:
        async with kubelet_running(plugin_dir) as (kubelet, _):
            other.bind(str(plugin_dir / "b.sock"))
            other.listen()
            async with spawn(tmp_path, volume.path, dev) as daemon:
                await wait_for_file(daemon.log, lambda t: "another server answers" in t)
                await kubelet.wait_until(
                    lambda k: (
                        "example.com/a" in k.resources and k.resources["example.com/a"].updates
                    )
                )
                volume.write(resources=[served])
                await wait_for_file(
                    daemon.log, lambda t: "example.com/b: gone from the config" in t
                )
                grant = await kubelet.allocate("example.com/a", ["pool.a0"])
                assert len(grant.devices) == 2  # still serving
                assert daemon.proc.returncode is None
                assert daemon.lines("Traceback") == []
                assert await daemon.terminate() == 0


def inotify_instances(pid: int) -> int:
    """The process's inotify descriptors; one closed while we look was not
    one (the daemon's inotify instance lives as long as it does)."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(FileNotFoundError):
            count += os.readlink(fd) == "anon_inode:inotify"
    return count


async def test_the_daemon_holds_one_inotify_instance_whatever_it_watches(tmp_path):
    # Root shares 128 instances with systemd and the kubelet: three resources,
    # their plugin directory, the device directories and the config's
    # directory all go through one.
    dev = tmp_path / "dev"
    make_nodes(dev / "pool", ["a0", "b0", "c0"])
    volume = ConfigMapVolume(tmp_path / "configmap")
    volume.write(
        resources=[
            {"name": f"example.com/{x}", "include-devices": [f"/dev/pool/{x}*"]}
            for x in ("a", "b", "c")
        ]
    )
    with trio.fail_after(LIMIT):
        async with (
            kubelet_running(tmp_path / "device-plugins") as (kubelet, _),
            spawn(tmp_path, volume.path, dev) as daemon,
        ):
            await kubelet.wait_until(lambda k: len(k.resources) == 3)
            assert inotify_instances(daemon.proc.pid) == 1
            volume.write(resources=[{"name": "example.com/d", "include-devices": ["/dev/x/*"]}])
            await kubelet.wait_until(lambda k: "example.com/d" in k.resources)
            assert inotify_instances(daemon.proc.pid) == 1
            assert await daemon.terminate() == 0


async def test_a_reload_that_puts_one_device_in_two_resources_is_refused(tmp_path):
    a, b = "example.com/a", "example.com/b"
    dev = tmp_path / "dev"
    make_nodes(dev, ["a/x", "b/z"])
    (dev / "c").mkdir()
    (dev / "c" / "y").symlink_to(dev / "a" / "x")  # one device, a second name

    def resources(b_patterns: list[str]) -> list[dict[str, object]]:
        return [
            {"name": a, "socket": "a.sock", "include-devices": ["/dev/a/*"]},
            {"name": b, "socket": "b.sock", "include-devices": b_patterns},
        ]

    volume = ConfigMapVolume(tmp_path / "configmap")
    volume.write(resources=resources(["/dev/b/*"]))
    with trio.fail_after(LIMIT):
        async with (
            kubelet_running(tmp_path / "device-plugins") as (kubelet, _),
            spawn(tmp_path, volume.path, dev) as daemon,
        ):
            await kubelet.wait_until(
                lambda k: all(r in k.resources and k.resources[r].capacity == 1 for r in (a, b))
            )
            volume.write(resources=resources(["/dev/b/*", "/dev/c/*"]))
            text = await wait_for_file(daemon.log, lambda t: "config not applied" in t)
            (line,) = [x for x in text.splitlines() if "config not applied" in x]
            assert f"field 'resources[1]': {b} matches /dev/c/y" in line
            assert f"{a} lists it too, as /dev/a/x" in line
            assert kubelet.resources[a].devices == {"a.x": "Healthy"}  # the last good config
            assert list(kubelet.resources[b].devices) == ["b.z"]
