"""powerdev's ResourceSlices, published by the real supervisor (in this
process) to the kit's real API server, which validates them: a pool per
node and resource, kept current as device nodes come and go, host-used
devices left out, at most 64 devices a slice, a block device's size (capacity),
vendor and model, and the pool deleted when powerdev stops."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import pytest
import trio

from powerdev.config import parse_config
from powerdev.daemon import supervisor
from powerdev.daemon.settings import DraSettings, Settings
from powerdev.devtools.cluster.controlplane import ControlPlane
from powerdev.devtools.testing import NODE_MAJOR, is_root, make_nodes
from powerdev.dra.names import pool_name, slice_name
from powerdev.ops import metrics
from powerdev.rpc import asyncio_door

pytestmark = pytest.mark.skipif(not is_root(), reason="needs root: distinct nodes (mknod)")

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
RESOURCE = "powerdev.test/dra"
LIMIT = 20


def dra_config(**fields: object) -> str:
    entry = {"name": RESOURCE, "api": "dra", "include-devices": ["/dev/dra*", "/dev/lun*"]}
    return json.dumps({"resources": [{**entry, **fields}]})


@contextlib.asynccontextmanager
async def publishing(
    tmp_path: Path, plane: ControlPlane, dev: Path, config: str, **settings: object
) -> AsyncIterator[tuple[str, str]]:
    """The daemon in-process, DRA only (no kubelet): (node, driver)."""
    node = f"dra-{secrets.token_hex(3)}"
    driver = f"{node}.powerdev.test"
    dra = DraSettings(
        node_name=node,
        driver=driver,
        kubeconfig=plane.kubeconfig,
        plugins_dir=tmp_path / "plugins",
        registry_dir=tmp_path / "plugins_registry",
    )
    full = Settings(
        plugin_dir=tmp_path / "device-plugins",
        dev_root=dev,
        cdi_spec_dir=tmp_path / "cdi",
        pod_resources_socket=None,
        dra=dra,
        **{"sys_root": Path("/sys"), "uevents": "off", **settings},  # type: ignore[arg-type]
    )
    parsed = parse_config(config, source="config.json")
    async with asyncio_door(), trio.open_nursery() as nursery:
        await nursery.start(partial(supervisor.run, full, parsed))
        yield node, driver
        nursery.cancel_scope.cancel()


def mounted_at(path: Path, number: str, source: str) -> Path:
    """A mount table: this process's, and the device `number` mounted."""
    mine = Path("/proc/self/mountinfo").read_text()
    path.write_text(mine + f"999 1 {number} / /mnt/host rw - ext4 {source} rw\n")
    return path


def names(item: dict) -> list[str]:
    return [d["name"] for d in item["spec"]["devices"]]


def paths(item: dict) -> list[str]:
    return sorted(d["attributes"]["path"]["string"] for d in item["spec"].get("devices", []))


async def counted_after(before: float) -> dict[str, float]:
    """publications() once more have succeeded than `before`: the daemon
    (in this Trio run) is let run, its answers read, until it has counted
    one; the test's LIMIT bounds it."""
    while (now := publications())["ok"] <= before:
        await trio.lowlevel.checkpoint()
    return now


def publications() -> dict[str, float]:
    """/metrics: this resource's publications by result, slice writes, slices."""
    sample = metrics.REGISTRY.get_sample_value
    return {
        "ok": sample("powerdev_dra_publications_total", {"resource": RESOURCE, "result": "ok"}),
        "failed": sample(
            "powerdev_dra_publications_total", {"resource": RESOURCE, "result": "failed"}
        ),
        "writes": sample("powerdev_dra_slice_writes_total", {"resource": RESOURCE}),
        "slices": sample("powerdev_dra_slices", {"resource": RESOURCE}),
    }


async def test_a_pool_is_published_kept_current_and_deleted(api, control_plane, tmp_path):
    dev = tmp_path / "dev"
    make_nodes(dev, ["dra0", "dra1"])
    # A block node of a real block device (loop0's numbers), mounted as the
    # host's mount table says: host-used, never published.
    os.mknod(dev / "lun0", stat.S_IFBLK | 0o600, os.makedev(7, 0))
    mountinfo = mounted_at(tmp_path / "mountinfo", "7:0", "/dev/loop0")
    with trio.fail_after(LIMIT):
        async with publishing(
            tmp_path, control_plane, dev, dra_config(), host_mountinfo=mountinfo
        ) as (node, driver):
            first = slice_name(node, driver, RESOURCE, 0)
            item = await api.wait_for(SLICES, first)
            assert paths(item) == ["/dev/dra0", "/dev/dra1"]
            spec = item["spec"]
            assert (spec["driver"], spec["nodeName"]) == (driver, node)
            assert spec["pool"]["name"] == pool_name(node, RESOURCE)
            assert spec["pool"]["resourceSliceCount"] == 1
            generation = spec["pool"]["generation"]
            (attributes,) = [
                d["attributes"]
                for d in spec["devices"]
                if d["attributes"]["path"]["string"] == "/dev/dra0"
            ]
            assert attributes["resource"] == {"string": RESOURCE}
            assert attributes["kind"] == {"string": "char"}
            assert attributes["path"] == {"string": "/dev/dra0"}
            assert attributes["major"] == {"int": NODE_MAJOR}
            assert "int" in attributes["minor"]
            # Hotplug: a node made, then one removed.
            make_nodes(dev, ["dra2"])
            item = await api.wait_for(SLICES, first, lambda s: "/dev/dra2" in paths(s))
            assert paths(item) == ["/dev/dra0", "/dev/dra1", "/dev/dra2"]
            # one slice changed: written alone, at the same generation
            assert item["spec"]["pool"]["generation"] == generation
            counted = publications()
            (dev / "dra0").unlink()
            item = await api.wait_for(SLICES, first, lambda s: "/dev/dra0" not in paths(s))
            assert paths(item) == ["/dev/dra1", "/dev/dra2"]
            # The daemon counts a publication once the API server's answer to
            # its write is back, which may come after the watch showed the
            # slice to the test: each count is read once the daemon has it.
            now = await counted_after(counted["ok"])
            assert now["slices"] == 1
            assert now["writes"] - counted["writes"] == now["ok"] - counted["ok"]  # one each
        # powerdev stopped: its pool is gone.
        await api.wait_gone(SLICES, first)
        assert publications()["slices"] == 0


async def test_a_device_whose_path_is_too_long_for_an_attribute_is_published_without_it(
    api, control_plane, tmp_path, caplog
):
    """A path over the 64 characters an attribute may hold: the device is
    published without its path attribute, the API server takes the pool
    (one device of it never refuses all of them), and it is said once."""
    dev = tmp_path / "dev"
    long = "dra-" + "x" * 70
    make_nodes(dev, ["dra0", long])
    with trio.fail_after(LIMIT):
        async with publishing(tmp_path, control_plane, dev, dra_config()) as (node, driver):
            first = slice_name(node, driver, RESOURCE, 0)
            item = await api.wait_for(SLICES, first, lambda s: len(s["spec"]["devices"]) == 2)
            without = [d for d in item["spec"]["devices"] if "path" not in d["attributes"]]
            assert len(without) == 1 and without[0]["attributes"]["kind"] == {"string": "char"}
            kept = [d["attributes"]["path"] for d in item["spec"]["devices"] if d not in without]
            assert kept == [{"string": "/dev/dra0"}]
    said = [
        r.getMessage() for r in caplog.records if "published without its path" in r.getMessage()
    ]
    assert said == [
        f"{RESOURCE}: /dev/{long} is published without its path attribute: longer than the "
        "64 characters the API allows"
    ]


async def test_200_devices_make_four_slices_of_one_generation(api, control_plane, tmp_path):
    """At most 64 a slice (a taint may come to any device), 56 packed anew."""
    dev = tmp_path / "dev"
    make_nodes(dev, [f"dra{i}" for i in range(200)])
    with trio.fail_after(LIMIT):
        async with publishing(tmp_path, control_plane, dev, dra_config()) as (node, driver):
            found = []
            for i in range(4):
                found.append(
                    await api.wait_for(
                        SLICES,
                        slice_name(node, driver, RESOURCE, i),
                        lambda s: s["spec"]["pool"]["resourceSliceCount"] == 4,
                    )
                )
            assert [len(names(s)) for s in found] == [56, 56, 56, 32]
            assert len({n for s in found for n in names(s)}) == 200
            assert len({s["spec"]["pool"]["generation"] for s in found}) == 1
            pool = await api.get(SLICES, fieldSelector=f"spec.nodeName={node}")
            assert len(pool["items"]) == 4


async def test_a_resource_that_leaves_the_config_takes_its_pool_with_it(
    api, control_plane, tmp_path
):
    dev = tmp_path / "dev"
    make_nodes(dev, ["dra0", "drb0"])
    other = "powerdev.test/drb"
    both = {
        "resources": [
            {"name": RESOURCE, "api": "dra", "include-devices": ["/dev/dra*"]},
            {"name": other, "api": "dra", "include-devices": ["/dev/drb*"]},
        ]
    }
    config = tmp_path / "config.json"
    config.write_text(json.dumps(both))
    with trio.fail_after(LIMIT):
        async with publishing(
            tmp_path, control_plane, dev, config.read_text(), config_path=config
        ) as (node, driver):
            kept = slice_name(node, driver, RESOURCE, 0)
            gone = slice_name(node, driver, other, 0)
            await api.wait_for(SLICES, kept)
            await api.wait_for(SLICES, gone)
            config.write_text(json.dumps({"resources": both["resources"][:1]}))
            await api.wait_gone(SLICES, gone)
            item = await api.get(f"{SLICES}/{kept}")
            assert paths(item) == ["/dev/dra0"]


async def test_a_block_devices_size_vendor_and_model_are_accepted(api, control_plane, tmp_path):
    """Block nodes of a multipath map and an NVMe namespace, over a sysfs
    tree shaped like the kernel's: the API server takes their capacity and
    attributes as published."""
    from tests.unit.test_dra import block_tree

    sys_root = block_tree(tmp_path)
    (sys_root / "devices/virtual/block/dm-3/size").write_text("2097152\n")
    dev = tmp_path / "dev"
    dev.mkdir()
    os.mknod(dev / "lun0", stat.S_IFBLK | 0o600, os.makedev(253, 3))
    os.mknod(dev / "lun1", stat.S_IFBLK | 0o600, os.makedev(259, 0))
    with trio.fail_after(LIMIT):
        async with publishing(tmp_path, control_plane, dev, dra_config(), sys_root=sys_root) as (
            node,
            driver,
        ):
            item = await api.wait_for(SLICES, slice_name(node, driver, RESOURCE, 0))
            found = {d["attributes"]["path"]["string"]: d for d in item["spec"]["devices"]}
            assert sorted(found) == ["/dev/lun0", "/dev/lun1"]
            mpath, nvme = found["/dev/lun0"], found["/dev/lun1"]
            assert mpath["capacity"] == {"size": {"value": "1073741824"}}  # bytes, kept as sent
            assert mpath["attributes"]["vendor"] == {"string": "NETAPP"}
            assert mpath["attributes"]["model"] == {"string": "LUN C-Mode"}
            assert mpath["attributes"]["kind"] == {"string": "block"}
            assert nvme["capacity"] == {"size": {"value": "4096"}}
            assert nvme["attributes"]["model"] == {"string": "Samsung SSD 970 EVO Plus 1TB"}
            assert "vendor" not in nvme["attributes"]


def taints(item: dict, path: str) -> list[dict] | None:
    """The taints of the device with this path, without the time the API
    server stamps on them; None: the device is not in the slice."""
    for device in item["spec"]["devices"]:
        if device["attributes"]["path"]["string"] == path:
            return [
                {k: v for k, v in t.items() if k != "timeAdded"} for t in device.get("taints", [])
            ]
    return None


async def test_a_devices_own_health_is_a_taint_the_api_server_takes(api, control_plane, tmp_path):
    """A multipath map whose paths go offline one by one and come back, with
    no device event (the health recheck finds it): degraded is a None-effect
    taint, failed a NoSchedule one, and both are gone once it recovers."""
    from tests.unit.test_condition import san
    from tests.unit.test_family import nodes

    sys_root = tmp_path / "sys"
    states = san(sys_root, kpartx=False)
    nodes(tmp_path / "dev", {"mapper/mpatha": (253, 3)})
    config = json.dumps(
        {"resources": [{"name": RESOURCE, "api": "dra", "include-devices": ["/dev/mapper/*"]}]}
    )
    mpatha = "/dev/mapper/mpatha"
    with trio.fail_after(LIMIT):
        async with publishing(
            tmp_path,
            control_plane,
            tmp_path / "dev",
            config,
            sys_root=sys_root,
            health_interval=0.05,
        ) as (node, driver):
            first = slice_name(node, driver, RESOURCE, 0)
            item = await api.wait_for(SLICES, first)
            assert taints(item, mpatha) == []
            states["sde"].write_text("offline\n")
            item = await api.wait_for(SLICES, first, lambda s: taints(s, mpatha) != [])
            assert taints(item, mpatha) == [
                {"key": "dra.powerdev.io/condition", "value": "degraded", "effect": "None"}
            ]
            states["sdd"].write_text("transport-offline\n")
            item = await api.wait_for(
                SLICES, first, lambda s: (taints(s, mpatha) or [{}])[0].get("value") == "failed"
            )
            assert taints(item, mpatha) == [
                {"key": "dra.powerdev.io/condition", "value": "failed", "effect": "NoSchedule"}
            ]
            for state in states.values():
                state.write_text("running\n")
            item = await api.wait_for(SLICES, first, lambda s: taints(s, mpatha) == [])


async def test_a_size_is_published_as_the_api_server_spells_it_back(control_plane):
    """Sizes as quantities: what is written reads back the same (the API
    server writes 100000000000 back as "100G"), so a pool read from the
    server compares equal to the one built (a new `powerdev luns` leader
    finds the pool right and writes nothing)."""
    from powerdev.dra.kubeapi import KubeApi, client
    from powerdev.dra.names import byte_quantity
    from powerdev.dra.slices import build_slices

    sizes = [10**11, 1 << 20, 1500, 1000, 1073741824000, 0, 2 * 10**18]
    devices = [
        {"name": f"d{i}", "capacity": {"size": {"value": byte_quantity(n)}}}
        for i, n in enumerate(sizes)
    ]
    node = f"q-{secrets.token_hex(3)}"
    (body,) = build_slices(f"{node}.powerdev.test", node, RESOURCE, devices, 1)
    writer = KubeApi(client(control_plane.kubeconfig))
    try:
        await writer.apply_slice(body)
        (back,) = await writer.pool_slices(
            f"{node}.powerdev.test", node, body["spec"]["pool"]["name"]
        )
        assert back["spec"]["devices"] == devices
        await writer.delete_slice(body["metadata"]["name"])
    finally:
        await writer.aclose()
