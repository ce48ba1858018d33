"""CDI mode end to end: the daemon writes specs that the real CDI library
(conformance/cdicheck, the code containerd and CRI-O use) loads, and the
names Allocate returns resolve into exactly the expected device nodes."""

import json
import os
import stat
import subprocess
from functools import partial

import pytest
import trio
from inotify_simple import flags as iflags

from powerdev.config import load_config
from powerdev.devtools.cdicheck import inject, validate
from powerdev.devtools.kit import CDICHECK
from powerdev.support.inotify import Watcher
from tests.conftest import (
    IS_ROOT,
    config_for,
    daemon_and_kubelet,
    make_dev_tree,
    require_tool,
    wait_for_file,
    wait_gone,
)

LIMIT = 30
CONFIG = (
    '{"include-devices": ["/dev/dm-*", "/dev/mapper/*"], "cdi": true, '
    '"permissions": "rw", "device-uid": 0, "device-gid": 6, "device-mode": "0660"}'
)
SPEC = "power-dev-plugin-dev.json"
QUICK = {"cdi_recheck_interval": 0.01}  # ask the kubelet again at once while a spec keeps devices


@pytest.fixture
def specs(tmp_path):
    """The CDI spec directory the daemon writes to (/var/run/cdi on a node)."""
    path = tmp_path / "cdi"
    path.mkdir()
    return path


@pytest.fixture
def cdicheck():
    return require_tool(CDICHECK)


def nodes_of(resolved):
    return sorted(
        (d["path"], d["type"], d["major"], d["minor"], d["uid"], d["gid"], d["fileMode"])
        for d in resolved["linuxDevices"]
    )


async def test_allocate_names_cdi_devices_that_resolve_to_the_nodes(tmp_path, cdicheck, specs):
    # three names of one device (/dev/null, so that the nodes open): one unit,
    # one CDI device with every name of it
    dev = make_dev_tree(tmp_path / "dev", ["dm-0", "dm-1", "mapper/mpatha"], target="/dev/null")
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(
            tmp_path, config_for(CONFIG), dev_root=dev, cdi_spec_dir=specs, **QUICK
        ) as h:
            assert dict(h.state().devices) == {"dm-0": "Healthy"}
            grant = await h.kubelet.allocate(h.name, ["dm-0"])
            assert grant.devices == ()  # CDI names instead of DeviceSpecs
            assert grant.cdi_devices == ("power-dev-plugin/dev=dm-0",)
            checked = validate(cdicheck, specs)
            assert checked["ok"] and checked["errorCount"] == 0, checked
            assert [s["path"] for s in checked["specs"]] == [str(specs / SPEC)]
            resolved = inject(cdicheck, [specs], list(grant.cdi_devices))
            assert resolved["ok"], resolved["error"]
            assert nodes_of(resolved) == [
                (f"/dev/{n}", "c", 1, 3, 0, 6, 0o660) for n in ("dm-0", "dm-1", "mapper/mpatha")
            ]
            assert {r["access"] for r in resolved["resourceDevices"]} == {"rw"}

            # Hotplug: the spec names a new device before any answer does.
            (dev / "dm-7").symlink_to("/dev/zero")
            await h.kubelet.wait_until(lambda k: "dm-7" in h.state().devices)
            grant = await h.kubelet.allocate(h.name, ["dm-7"])
            assert "power-dev-plugin/dev=dm-7" in grant.cdi_devices
            assert inject(cdicheck, [specs], list(grant.cdi_devices))["ok"]
            os.unlink(dev / "dm-7")
            await h.kubelet.wait_until(lambda k: "dm-7" not in h.state().devices)
            grant = await h.kubelet.allocate(h.name, ["dm-0"])
            assert "power-dev-plugin/dev=dm-7" not in grant.cdi_devices
            # Kept until the kubelet says no pod holds it, then dropped.
            await wait_for_file(specs / SPEC, lambda text: '"dm-7"' not in text)
            gone = inject(cdicheck, [specs], ["power-dev-plugin/dev=dm-7"])
            assert not gone["ok"] and gone["unresolved"] == ["power-dev-plugin/dev=dm-7"]
        # The daemon stopped: the spec stays, for containers that restart meanwhile.
        assert inject(cdicheck, [specs], ["power-dev-plugin/dev=dm-0"])["ok"]


@pytest.mark.skipif(not IS_ROOT, reason="needs root: mknod, and running as other users")
async def test_the_resolved_node_opens_for_its_group_and_no_one_else(tmp_path, cdicheck, specs):
    dev = make_dev_tree(tmp_path / "dev", ["dm-0"], target="/dev/null")  # a node that opens
    config = config_for(CONFIG.replace('"device-gid": 6', '"device-gid": 4242'))
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config, dev_root=dev, cdi_spec_dir=specs) as h:
            grant = await h.kubelet.allocate(h.name, ["dm-0"])
            (node,) = inject(cdicheck, [specs], list(grant.cdi_devices))["linuxDevices"]
    # Made as a runtime makes it, in a "container /dev" of our own.
    container_dev = tmp_path / "container-dev"
    container_dev.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(container_dev, 0o755)
    made = container_dev / "dm-0"
    os.mknod(made, stat.S_IFCHR | node["fileMode"], os.makedev(node["major"], node["minor"]))
    os.chown(made, node["uid"], node["gid"])
    os.chmod(made, node["fileMode"])

    def open_as(groups):
        return subprocess.run(
            ["python3", "-c", f"open({str(made)!r}, 'rb+').close()"],
            user=1000,
            group=1000,
            extra_groups=groups,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    assert open_as([4242]).returncode == 0
    denied = open_as([])
    assert denied.returncode != 0 and "Permission denied" in denied.stderr


async def test_turning_cdi_off_answers_devicespecs_and_the_spec_goes_with_its_last_holder(
    tmp_path, cdicheck, specs
):
    dev = make_dev_tree(tmp_path / "dev", ["dm-0"], target="/dev/null")
    (tmp_path / "etc").mkdir()
    config_file = tmp_path / "etc" / "config.json"
    config_file.write_text(CONFIG)
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(
            tmp_path,
            config_for(CONFIG),
            dev_root=dev,
            cdi_spec_dir=specs,
            config_path=config_file,
            **QUICK,
        ) as h:
            grant = await h.kubelet.allocate(h.name, ["dm-0"])
            h.kubelet.pods = {"p1": {h.name: ["dm-0"]}}  # the kubelet admitted a pod with it
            before = h.state().updates
            config_file.write_text(json.dumps({"include-devices": ["/dev/dm-*"]}))
            await h.kubelet.wait_until(lambda k: h.state().updates > before)  # applied
            off = await h.kubelet.allocate(h.name, ["dm-0"])
            assert off.cdi_devices == () and [d.host_path for d in off.devices] == ["/dev/dm-0"]
            asked = h.kubelet.pod_resources_asked
            await h.kubelet.wait_until(lambda k: k.pod_resources_asked >= asked + 2)
            # p1's container may restart with the names it was given: they resolve
            assert inject(cdicheck, [specs], list(grant.cdi_devices))["ok"]
            h.kubelet.pods = {}  # p1 ended
            await wait_gone(specs / SPEC)


EACH = '{"include-devices": ["/dev/dm-*"], "cdi": true, "allocation": "each"}'


async def test_a_device_a_pod_holds_stays_resolvable_across_daemon_restarts(
    tmp_path, cdicheck, specs
):
    """ "each": the spec keeps exactly the held devices, read back by the next
    daemon, and goes when no pod holds anything."""
    dev = make_dev_tree(tmp_path / "dev", ["dm-0", "dm-1", "dm-2"])
    run = partial(daemon_and_kubelet, tmp_path, config_for(EACH), dev_root=dev, cdi_spec_dir=specs)
    with trio.fail_after(LIMIT):
        async with run(**QUICK) as h:
            ids = sorted(h.state().devices)
            grant = await h.kubelet.allocate(h.name, ids[1:2])
            (held,) = grant.cdi_devices
        for name in ("dm-0", "dm-1"):  # gone while no daemon ran
            os.unlink(dev / name)
        async with run(kubelet_pods={"p1": {h.name: ids[1:2]}}, **QUICK) as h:
            assert sorted(h.state().devices) == ids[2:]
            await wait_for_file(specs / SPEC, lambda text: f'"{ids[0]}"' not in text)
            assert inject(cdicheck, [specs], [held])["ok"]  # p1's container can restart
            h.kubelet.pods = {}  # p1 ended: only dm-2 is left to name
            await wait_for_file(specs / SPEC, lambda text: f'"{ids[1]}"' not in text)
            assert not inject(cdicheck, [specs], [held])["ok"]
            checked = validate(cdicheck, specs)
            assert checked["devices"] == [f"power-dev-plugin/dev={ids[2]}"]


async def test_without_the_kubelets_answer_nothing_named_is_forgotten(tmp_path, cdicheck, specs):
    dev = make_dev_tree(tmp_path / "dev", ["dm-0", "dm-1"])
    # A PodResources socket that takes each connection and drops it: the
    # kubelet cannot say what pods hold.
    broken = trio.socket.socket(trio.socket.AF_UNIX)
    await broken.bind(str(tmp_path / "broken.sock"))
    broken.listen()
    asked = 0
    twice = trio.Event()

    async def drop_every_call():
        nonlocal asked
        while True:
            conn, _ = await broken.accept()
            conn.close()
            asked += 1
            if asked == 2:
                twice.set()

    with trio.fail_after(LIMIT), broken:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drop_every_call)
            async with daemon_and_kubelet(
                tmp_path,
                config_for(CONFIG),
                dev_root=dev,
                cdi_spec_dir=specs,
                pod_resources_socket=tmp_path / "broken.sock",
                **QUICK,
            ) as h:
                grant = await h.kubelet.allocate(h.name, ["dm-0"])
                os.unlink(dev / "dm-1")
                await h.kubelet.wait_until(lambda k: "dm-1" not in h.state().devices)
                await twice.wait()  # asked, refused, and the spec written after that
                assert inject(cdicheck, [specs], list(grant.cdi_devices))["ok"]
            nursery.cancel_scope.cancel()


async def test_a_device_is_dropped_only_on_an_answer_asked_after_it_left(tmp_path, cdicheck, specs):
    """The kubelet said "nothing held" once; later a pod holds a device that
    then leaves: that old answer must not drop it."""
    dev = make_dev_tree(tmp_path / "dev", ["dm-0", "dm-1"])
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(
            tmp_path, config_for(CONFIG), dev_root=dev, cdi_spec_dir=specs, **QUICK
        ) as h:
            await h.kubelet.allocate(h.name, ["dm-0"])
            os.unlink(dev / "dm-1")
            await wait_for_file(specs / SPEC, lambda text: '"dm-1"' not in text)  # nobody held it
            grant = await h.kubelet.allocate(h.name, ["dm-0"])
            h.kubelet.pods = {"p1": {h.name: ["dm-0"]}}
            os.unlink(dev / "dm-0")
            await h.kubelet.wait_until(lambda k: not h.state().devices)
            asked = h.kubelet.pod_resources_asked
            await h.kubelet.wait_until(lambda k: k.pod_resources_asked >= asked + 2)
            assert inject(cdicheck, [specs], list(grant.cdi_devices))["ok"]


async def test_a_resource_served_anew_under_another_socket_keeps_its_spec(
    tmp_path, cdicheck, specs
):
    """A socket rename removes the resource and adds it again under the same
    name: one spec file, and one writer for it, before and after."""
    dev = make_dev_tree(tmp_path / "dev", ["dm-0"])
    (tmp_path / "etc").mkdir()
    config_file = tmp_path / "etc" / "config.json"

    def write(socket):
        resource = {"name": "power-dev-plugin/dev", "socket": socket, **json.loads(CONFIG)}
        config_file.write_text(json.dumps({"resources": [resource]}))

    write("a.sock")
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(
            tmp_path,
            load_config(config_file),
            dev_root=dev,
            cdi_spec_dir=specs,
            config_path=config_file,
            **QUICK,
        ) as h:
            grant = await h.kubelet.allocate(h.name, ["dm-0"])
            with Watcher() as watcher:
                watcher.add(specs, iflags.DELETE)
                write("b.sock")
                await h.kubelet.wait_until(lambda k: k.resources[h.name].endpoint == "b.sock")
                await h.kubelet.wait_until(lambda k: k.resources[h.name].updates > 0)
                assert await h.kubelet.allocate(h.name, ["dm-0"]) == grant
                # never gone in between, when a restarting container could have asked
                assert [e.name for e in watcher.ready()] == []
            assert inject(cdicheck, [specs], list(grant.cdi_devices))["ok"]
