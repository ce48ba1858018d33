"""powerdev (the real process) against the kubelet's own device manager.

Every test starts `dmharness` (the conformance kit's build of the kubelet's
device manager, at the release conformance/go.mod names) on a temp plugin
directory and `powerdev run` beside it, and checks what the
kubelet itself concludes: capacity, admission, DeviceSpecs, checkpoint.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
from pathlib import Path

import pytest
import trio

from powerdev.devtools.cdicheck import inject
from powerdev.devtools.fake_kubelet import FakeKubelet
from powerdev.devtools.kit import CDICHECK
from powerdev.devtools.testing import is_root, loop_control, make_nodes
from powerdev.rpc import asyncio_door
from powerdev.rpc.kubelet_side import PluginClient
from tests.conftest import host_safe, require_tool, wait_for_file
from tests.kubelet.conftest import daemon, node, write_config

SPEC = "power-dev-plugin-dev.json"

LIMIT = 60
needs_root = pytest.mark.skipif(not is_root(), reason="needs root: mknod, mount, loop devices")


def pool(tmp_path, count=4, **fields):
    dev = tmp_path / "dev"
    make_nodes(dev / "pool", [f"d{i}" for i in range(count)])
    fields.setdefault("include-devices", ["/dev/pool/*"])
    return dev, write_config(tmp_path / "config.json", **fields)


def specs(reply):
    return [(d["host"], d["container"], d["permissions"]) for d in reply["runopts"]["devices"]]


async def test_registration_capacity_and_options(tmp_path, dmharness):
    dev, config = pool(tmp_path)
    with trio.fail_after(LIMIT):
        async with node(tmp_path, dmharness, config, dev) as n:
            await n.wait(4, 4)
            state = (await n.dm.call("state"))["state"]
            assert state["healthy"] == ["pool.d0", "pool.d1", "pool.d2", "pool.d3"]
            assert state["unhealthy"] == [] and state["endpoint_live"]
            options = state["options"] or {}
            assert not options.get("pre_start_required")
            assert not options.get("get_preferred_allocation_available")


async def test_admission_gives_every_device_and_refuses_what_is_not_free(tmp_path, dmharness):
    dev, config = pool(tmp_path, permissions="r")
    with trio.fail_after(LIMIT):
        async with node(tmp_path, dmharness, config, dev) as n:
            await n.wait(4, 4)
            first = await n.dm.call("admit", "p1", 1)
            assert first["admitted"], first
            assert specs(first) == [(f"/dev/pool/d{i}", f"/dev/pool/d{i}", "r") for i in range(4)]
            too_many = await n.dm.call("admit", "p2", 4)  # 3 are free
            assert not too_many["admitted"]
            assert "UnexpectedAdmissionError" in too_many["allocate_handler"]["reason"]
            assert (await n.dm.call("admit", "p3", 3))["admitted"]


async def test_allocations_survive_kubelet_restarts_and_a_killed_kubelet(tmp_path, dmharness):
    dev, config = pool(tmp_path)
    with trio.fail_after(LIMIT):
        async with node(tmp_path, dmharness, config, dev) as n:
            await n.wait(4, 4)
            admitted = await n.dm.call("admit", "p1", 2)
            held = admitted["device_ids"]
            checkpoint = (await n.dm.call("checkpoint"))["checkpoint"]["Data"]
            (entry,) = checkpoint["PodDeviceEntries"]
            assert entry["PodUID"] == "uid-p1" and sorted(entry["DeviceIDs"]["-1"]) == held

            restarted = await n.dm.call("restart", 4, 10000)
            assert restarted["registered"] and restarted["capacity_back"], restarted
            assert (await n.dm.call("devices", "p1"))["device_ids"] == held
            assert (await n.dm.call("runopts", "p1"))["runopts"]["devices"]

            # A kubelet killed outright leaves its socket; a new one starts
            # from the checkpoint, deletes every socket and serves again.
            await n.dm.kill()
            async with n.dm.running(n.binary, tmp_path / "kubelet-2.log") as again:
                await again.call("addpod", "p1", 2)  # the pod manager knows its pods
                await again.call("start", n.plugin_dir)
                reply = await again.call("wait", 4, 4, 10000)
                assert reply["ok"], reply
                assert (await again.call("devices", "p1"))["device_ids"] == held
                assert not (await again.call("admit", "p2", 3))["admitted"]  # 2 are free
                assert (await again.call("admit", "p3", 2))["admitted"]


async def test_many_restarts_each_registered_again(tmp_path, dmharness):
    dev, config = pool(tmp_path, 100)
    registered, back = [], []
    with trio.fail_after(LIMIT):
        async with node(tmp_path, dmharness, config, dev) as n:
            await n.wait(100, 100)
            for _ in range(20):
                reply = await n.dm.call("restart", 100, 10000)
                assert reply["registered"] and reply["capacity_back"], reply
                registered.append(reply["registered_ms"])
                back.append(reply["capacity_back_ms"])
            print(
                f"\n20 kubelet restarts, 100 devices: registered again in "
                f"median {statistics.median(registered):.1f} ms, max {max(registered):.1f} ms; "
                f"capacity back in median {statistics.median(back):.1f} ms, max {max(back):.1f} ms"
            )
            assert len(n.log_lines("registered with the kubelet")) == 21


async def test_the_kubelets_podresources_service_names_the_holder_of_each_device(
    tmp_path, dmharness
):
    dev, config = pool(tmp_path)
    with trio.fail_after(LIMIT):
        async with node(tmp_path, dmharness, config, dev) as n:
            await n.wait(4, 4)
            held = (await n.dm.call("admit", "p1", 3))["device_ids"]
            other = (await n.dm.call("admit", "p2", 1))["device_ids"]
            listed = await n.dm.call("podresources")
            assert listed["socket"] == str(tmp_path / "pod-resources" / "kubelet.sock")
            assert listed["pods"]["default/p1"] == {"power-dev-plugin/dev": held}
            assert listed["pods"]["default/p2"] == {"power-dev-plugin/dev": other}
            assert listed["allocatable"] == {"power-dev-plugin/dev": sorted(held + other)}
            await n.dm.call("delpod", "p1")  # the pod ended: the kubelet lists it no more
            assert "default/p1" not in (await n.dm.call("podresources"))["pods"]
            # and after a kubelet restart, from the checkpoint
            assert (await n.dm.call("restart", 4, 10000))["capacity_back"]
            after = await n.dm.call("podresources")
            assert after["pods"] == {"default/p2": {"power-dev-plugin/dev": other}}


async def test_upper_limit_is_enforced_by_the_kubelet(tmp_path, dmharness):
    dev, config = pool(tmp_path, 2, **{"upper-limit": 3})
    with trio.fail_after(LIMIT):
        async with node(tmp_path, dmharness, config, dev) as n:
            await n.wait(3, 3)
            for pod in ("a", "b", "c"):
                reply = await n.dm.call("admit", pod, 1)
                assert reply["admitted"] and len(specs(reply)) == 2
            assert not (await n.dm.call("admit", "d", 1))["admitted"]
            await n.dm.call("delpod", "a")  # the pod ended: its unit is free again
            assert (await n.dm.call("admit", "d", 1))["admitted"]
            assert not (await n.dm.call("admit", "e", 1))["admitted"]


async def test_sigterm_leaves_the_kubelet_with_no_allocatable_and_no_socket(tmp_path, dmharness):
    dev, config = pool(tmp_path)
    with trio.fail_after(LIMIT):
        async with node(tmp_path, dmharness, config, dev) as n:
            await n.wait(4, 4)
            assert await n.terminate() == 0
            await n.wait(4, 0)  # the kubelet marks the devices unhealthy
            assert not n.socket.exists()
            assert not (await n.dm.call("admit", "p1", 1))["admitted"]


@needs_root
async def test_real_hotplug_changes_allocatable_both_ways(tmp_path, dmharness):
    config = write_config(tmp_path / "config.json", **{"include-devices": ["/dev/loop39[0-9]"]})
    with trio.fail_after(LIMIT), loop_control() as loops:
        async with node(tmp_path, dmharness, config, Path("/dev"), "--uevents", "kernel") as n:
            assert (await n.dm.call("waitlive", 10000))["ok"]
            loops.add(390, medium=True)
            await n.wait(1, 1)
            loops.add(391, medium=True)
            await n.wait(2, 2)
            assert (await n.dm.call("admit", "p1", 1))["admitted"]
            loops.remove(390)
            await n.wait(1, 1)
            assert (await n.dm.call("state"))["state"]["healthy"] == ["loop391"]
            loops.remove(391)
            await n.wait(0, 0)


# --- what the real kubelet showed, fixed ------------------------------------------


async def test_a_node_removed_without_a_kernel_event_is_never_granted(tmp_path, dmharness):
    dev = tmp_path / "dev"
    make_nodes(dev, ["d0", "d1", "d2", "d3"])  # in /dev itself, as dm-* and sd* are
    config = write_config(tmp_path / "config.json", **{"include-devices": ["/dev/d*"]})
    with trio.fail_after(LIMIT):
        async with node(tmp_path, dmharness, config, dev) as n:
            await n.wait(4, 4)
            os.unlink(dev / "d3")  # `rm` in a host /dev: no uevent
            # At once, before the kubelet has even heard of it: not granted.
            reply = await n.dm.call("rawalloc", n.socket.name, "d0")
            assert (reply["grpc_code"], reply["devices"]) == ("OK", 3)
            gone = await n.dm.call("rawalloc", n.socket.name, "d3")
            assert gone["grpc_code"] == "InvalidArgument" and "d3" in gone["grpc_message"]
            await n.wait(3, 3)
            admitted = await n.dm.call("admit", "p1", 1)
            assert [h for h, _, _ in specs(admitted)] == ["/dev/d0", "/dev/d1", "/dev/d2"]


async def test_upper_limit_changes_never_let_more_pods_in_than_the_limit(tmp_path, dmharness):
    dev, config = pool(tmp_path, 2, **{"upper-limit": 3})
    with trio.fail_after(LIMIT):
        async with node(tmp_path, dmharness, config, dev) as n:
            await n.wait(3, 3)
            for pod in ("a", "b", "c"):
                assert (await n.dm.call("admit", pod, 1))["admitted"]
            held = (await n.dm.call("devices", "a"))["device_ids"]
            # Switching to one unit per device (and lowering the limit) would
            # hand out IDs that the holders' checkpointed ones do not count
            # against: not applied while running, and said so.
            for limit in (0, 2):
                write_config(config, **{"include-devices": ["/dev/pool/*"], "upper-limit": limit})
                n.daemon.send_signal(signal.SIGHUP)
                await n.wait_for_log(f"'upper-limit' 3 -> {limit} is not applied")
                assert (await n.dm.call("cap"))["capacity"] == 3
                assert not (await n.dm.call("admit", "d", 1))["admitted"]
            # Raising it keeps every held ID and is applied at once.
            write_config(config, **{"include-devices": ["/dev/pool/*"], "upper-limit": 5})
            n.daemon.send_signal(signal.SIGHUP)
            await n.wait(5, 5)
            assert (await n.dm.call("admit", "d", 1))["admitted"]
            assert (await n.dm.call("admit", "e", 1))["admitted"]
            assert not (await n.dm.call("admit", "f", 1))["admitted"]  # 5 holders
            assert (await n.dm.call("devices", "a"))["device_ids"] == held
            assert (await n.dm.call("runopts", "a"))["runopts"]["devices"]
            await n.dm.call("delpod", "a")
            assert (await n.dm.call("admit", "f", 1))["admitted"]


async def test_kubelet_restarts_are_routine_in_the_log(tmp_path, dmharness):
    dev, config = pool(tmp_path)
    with trio.fail_after(LIMIT):
        async with node(tmp_path, dmharness, config, dev) as n:
            await n.wait(4, 4)
            for down_ms in (0, 100, 300):
                reply = await n.dm.call("restart", 4, 10000, down_ms)
                assert reply["registered"] and reply["capacity_back"], reply
            await n.dm.kill()  # and one that dies: its socket stays, refusing
            async with n.dm.running(n.binary, tmp_path / "kubelet-2.log") as again:
                await again.call("start", n.plugin_dir)
                assert (await again.call("wait", 4, 4, 10000))["ok"]
            assert await n.terminate() == 0
            noisy = [x for x in n.log_lines() if " WARNING " in x or " ERROR " in x]
            assert noisy == []
            said = "\n".join(n.log_lines())
            assert "the kubelet ended our ListAndWatch stream" in said
            assert len(n.log_lines("registered with the kubelet")) == 5


async def test_directories_that_appear_later_or_are_made_again_are_watched(tmp_path, dmharness):
    dev, config = pool(tmp_path, 2, **{"include-devices": ["/dev/pool/*", "/dev/late/*"]})
    with trio.fail_after(LIMIT):
        async with node(tmp_path, dmharness, config, dev) as n:
            await n.wait(2, 2)
            make_nodes(dev / "late", ["x"])  # the directory did not exist at start
            await n.wait(3, 3)
            shutil.rmtree(dev / "late")
            await n.wait(2, 2)
            make_nodes(dev / "late", ["y", "z"])  # made again: a new directory to watch
            await n.wait(4, 4)
            os.unlink(dev / "late" / "y")
            await n.wait(3, 3)
            state = (await n.dm.call("state"))["state"]
            assert state["healthy"] == ["late.z", "pool.d0", "pool.d1"]


@needs_root
async def test_sighup_rescans_even_when_the_config_is_the_same(tmp_path, dmharness):
    dev, config = pool(tmp_path, 2, **{"include-devices": ["/dev/pool/*", "/dev/hidden/*"]})
    (dev / "hidden").mkdir()
    with trio.fail_after(LIMIT):
        async with node(tmp_path, dmharness, config, dev) as n:
            await n.wait(2, 2)
            # Nodes in a filesystem mounted over a watched directory raise no
            # inotify event there: only a rescan can find them.
            await trio.run_process(["mount", "-t", "tmpfs", "none", str(dev / "hidden")])
            try:
                make_nodes(dev / "hidden", ["h0"])
                assert (await n.dm.call("cap"))["capacity"] == 2
                n.daemon.send_signal(signal.SIGHUP)
                await n.wait(3, 3)
            finally:
                with trio.CancelScope(shield=True):
                    await trio.run_process(["umount", str(dev / "hidden")], check=False)


async def test_another_clients_stream_after_the_kubelets_changes_nothing(tmp_path, dmharness):
    dev, config = pool(tmp_path)
    with trio.fail_after(LIMIT):
        async with node(tmp_path, dmharness, config, dev) as n, asyncio_door():
            await n.wait(4, 4)
            other = PluginClient(n.socket)
            seen = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(other.watch, lambda devices: seen.set())
                await seen.wait()
                other.close()  # the other stream ends
            assert (await n.dm.call("rawalloc", n.socket.name, "pool.d0"))["grpc_code"] == "OK"
            assert len(n.log_lines("registered with the kubelet")) == 1
            restarted = await n.dm.call("restart", 4, 10000)  # the kubelet's stream ends
            assert restarted["registered"] and restarted["capacity_back"]
            assert len(n.log_lines("registered with the kubelet")) == 2


async def test_another_clients_stream_before_the_kubelets_is_not_taken_for_it(tmp_path):
    # The real kubelet opens its stream after Register returns; a client
    # that is quicker must not be taken for the kubelet. The fake kubelet
    # lets the test open a stream at exactly that moment.
    from powerdev.daemon import supervisor
    from powerdev.daemon.settings import Settings
    from tests.conftest import config_for, make_dev_tree

    dev = make_dev_tree(tmp_path / "dev", ["dm-0", "dm-1"])
    plugin_dir = tmp_path / "device-plugins"
    settings = Settings(
        plugin_dir=plugin_dir, dev_root=dev, sys_root=tmp_path / "sys", **host_safe(tmp_path)
    )
    with trio.fail_after(LIMIT):
        async with asyncio_door(), trio.open_nursery() as nursery:
            other = PluginClient(plugin_dir / "power-dev.csi.ibm.com-reg.sock")
            first_list = trio.Event()

            async def open_another_stream_first() -> None:
                nursery.start_soon(other.watch, lambda devices: first_list.set())
                await first_list.wait()

            kubelet = FakeKubelet(plugin_dir, before_dial=open_another_stream_first)
            await nursery.start(kubelet.run)
            nursery.start_soon(
                supervisor.run, settings, config_for('{"include-devices": ["/dev/dm-*"]}')
            )
            name = "power-dev-plugin/dev"
            await kubelet.wait_until(lambda k: k.registrations == 1 and k.resources[name].updates)
            kubelet.before_dial = None
            kubelet.end_stream(name)  # the kubelet's stream ends: powerdev must register again
            await kubelet.wait_until(lambda k: k.registrations == 2 and k.resources[name].updates)
            assert kubelet.resources[name].allocatable == 2
            other.close()
            nursery.cancel_scope.cancel()


async def test_the_kubelet_passes_cdi_names_through_to_the_container(tmp_path, dmharness):
    dev, config = pool(tmp_path, 2, cdi=True, **{"device-gid": 6, "device-mode": "0660"})
    specs = tmp_path / "cdi"
    specs.mkdir()
    with trio.fail_after(LIMIT):
        async with node(tmp_path, dmharness, config, dev, "--cdi-spec-dir", str(specs)) as n:
            await n.wait(2, 2)
            admitted = await n.dm.call("admit", "p1", 1)
            assert admitted["admitted"], admitted
            options = admitted["runopts"]
            assert options["devices"] == []  # the runtime makes the nodes from the spec
            assert options["cdi_devices"] == [
                "power-dev-plugin/dev=pool.d0",
                "power-dev-plugin/dev=pool.d1",
            ]
            assert (specs / "power-dev-plugin-dev.json").exists()
            restarted = await n.dm.call("restart", 2, 10000)
            assert restarted["capacity_back"]
            after = await n.dm.call("runopts", "p1")  # from the checkpoint
            assert after["runopts"]["cdi_devices"] == options["cdi_devices"]


async def test_a_cdi_name_a_pod_holds_resolves_across_daemon_restarts_until_the_pod_ends(
    tmp_path, dmharness
):
    cdicheck = require_tool(CDICHECK)
    dev, config = pool(tmp_path, 2, cdi=True)
    specs = tmp_path / "cdi"
    specs.mkdir()
    options = (
        "--cdi-spec-dir",
        str(specs),
        "--pod-resources-socket",  # the harness serves the kubelet's PodResources here
        str(tmp_path / "pod-resources" / "kubelet.sock"),
        "--cdi-recheck-interval",
        "0.05",
    )
    with trio.fail_after(LIMIT):
        async with node(tmp_path, dmharness, config, dev, *options) as n:
            await n.wait(2, 2)
            names = (await n.dm.call("admit", "p1", 1))["runopts"]["cdi_devices"]
            assert names == ["power-dev-plugin/dev=pool.d0", "power-dev-plugin/dev=pool.d1"]
            os.unlink(dev / "pool" / "d1")
            await n.wait(1, 1)
            assert await n.terminate() == 0  # an upgrade: the next daemon starts...
            async with daemon(n, config, dev, *options):
                await n.wait(1, 1)
                # ... and p1's container, restarted, gets the checkpointed names
                again = (await n.dm.call("runopts", "p1"))["runopts"]["cdi_devices"]
                assert again == names and inject(cdicheck, [specs], again)["ok"]
                await n.dm.call("delpod", "p1")  # p1 ended: the kubelet lists it no more
                await wait_for_file(specs / SPEC, lambda text: '"pool.d1"' not in text)
                assert not inject(cdicheck, [specs], names)["ok"]
                assert inject(cdicheck, [specs], names[:1])["ok"]
