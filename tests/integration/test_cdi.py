"""CDI mode end to end: the daemon writes specs that the real CDI library
(conformance/cdicheck, the code containerd and CRI-O use) loads, and the
names Allocate returns resolve into exactly the expected device nodes."""

import json
import os
import stat
import subprocess

import pytest
import trio

from powerdev.kubelet.cdicheck import inject, validate
from powerdev.kubelet.kit import CDICHECK
from powerdev.testing import make_nodes
from tests.conftest import IS_ROOT, config_for, daemon_and_kubelet, make_dev_tree, require_tool

LIMIT = 30
CONFIG = (
    '{"include-devices": ["/dev/dm-*", "/dev/mapper/*"], "cdi": true, '
    '"permissions": "rw", "device-uid": 0, "device-gid": 6, "device-mode": "0660"}'
)
SPEC = "power-dev-plugin-dev.json"


@pytest.fixture
def cdicheck():
    return require_tool(CDICHECK)


def nodes_of(resolved):
    return sorted(
        (d["path"], d["type"], d["major"], d["minor"], d["uid"], d["gid"], d["fileMode"])
        for d in resolved["linuxDevices"]
    )


async def test_allocate_names_cdi_devices_that_resolve_to_the_nodes(tmp_path, cdicheck):
    dev = make_dev_tree(tmp_path / "dev", ["dm-0", "dm-1", "mapper/mpatha"])
    specs = tmp_path / "cdi"
    specs.mkdir()
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(
            tmp_path, config_for(CONFIG), dev_root=dev, cdi_spec_dir=specs
        ) as h:
            grant = await h.kubelet.allocate(h.name, ["dm-0"])
            assert grant.devices == ()  # CDI names instead of DeviceSpecs
            assert grant.cdi_devices == (
                "power-dev-plugin/dev=dm-0",
                "power-dev-plugin/dev=dm-1",
                "power-dev-plugin/dev=mapper.mpatha",
            )
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
            make_dev_tree(dev, ["dm-7"])
            await h.kubelet.wait_until(lambda k: "dm-7" in h.state().devices)
            grant = await h.kubelet.allocate(h.name, ["dm-7"])
            assert "power-dev-plugin/dev=dm-7" in grant.cdi_devices
            assert inject(cdicheck, [specs], list(grant.cdi_devices))["ok"]
            os.unlink(dev / "dm-1")
            grant = await h.kubelet.allocate(h.name, ["dm-0"])
            assert "power-dev-plugin/dev=dm-1" not in grant.cdi_devices
            gone = inject(cdicheck, [specs], ["power-dev-plugin/dev=dm-1"])
            assert not gone["ok"] and gone["unresolved"] == ["power-dev-plugin/dev=dm-1"]
        assert not (specs / SPEC).exists()  # the resource stopped: its spec went with it


@pytest.mark.skipif(not IS_ROOT, reason="needs root: mknod, and running as other users")
async def test_the_resolved_node_opens_for_its_group_and_no_one_else(tmp_path, cdicheck):
    dev = tmp_path / "dev"
    make_nodes(dev, ["dm-0"])
    specs = tmp_path / "cdi"
    specs.mkdir()
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


async def test_turning_cdi_off_by_reload_removes_the_spec_and_answers_devicespecs(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", ["dm-0"])
    specs = tmp_path / "cdi"
    specs.mkdir()
    (tmp_path / "etc").mkdir()
    config_file = tmp_path / "etc" / "config.json"
    config_file.write_text(CONFIG)
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(
            tmp_path, config_for(CONFIG), dev_root=dev, cdi_spec_dir=specs, config_path=config_file
        ) as h:
            await h.kubelet.allocate(h.name, ["dm-0"])
            assert (specs / SPEC).exists()
            before = h.state().updates
            config_file.write_text(json.dumps({"include-devices": ["/dev/dm-*"]}))
            await h.kubelet.wait_until(lambda k: h.state().updates > before)  # applied
            grant = await h.kubelet.allocate(h.name, ["dm-0"])
            assert grant.cdi_devices == () and [d.host_path for d in grant.devices] == ["/dev/dm-0"]
            assert not (specs / SPEC).exists()
