"""Per-device resources against the kubelet's own device manager: two
resources at once, "each" allocation, IDs across restarts, NUMA topology."""

from __future__ import annotations

import json
import os
from pathlib import Path

import trio

from tests.conftest import wait_gone
from tests.kubelet.conftest import node, write_config

LIMIT = 60
# Real character devices, so that each name has its own major:minor even
# without root: /dev/null 1:3, zero 1:5, full 1:7, random 1:8, urandom 1:9.
TARGETS = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9)}


def host_like(tmp_path: Path, numa: dict[str, int]) -> tuple[Path, Path]:
    """A /dev of links to real nodes, and a /sys where each node sits under a
    PCI device that reports a NUMA node."""
    dev = tmp_path / "dev"
    sys = tmp_path / "sys"
    (dev / "acc").mkdir(parents=True)
    (dev / "lun").mkdir()
    for name in TARGETS:
        (dev / "lun" / name).symlink_to(f"/dev/{name}")
    # 5:0, a device of its own; a terminal, so named exactly (a glob never reaches one)
    (dev / "acc" / "x").symlink_to("/dev/tty")
    (sys / "dev" / "char").mkdir(parents=True)
    for name, (major, minor) in TARGETS.items():
        pci = sys / "devices" / "pci0000:00" / f"0000:00:0{minor}.0"
        node = pci / "mem" / name
        node.mkdir(parents=True)
        (pci / "numa_node").write_text(f"{numa.get(name, -1)}\n")
        (node / "uevent").write_text(f"MAJOR={major}\nMINOR={minor}\nDEVNAME={name}\n")
        link = sys / "dev" / "char" / f"{major}:{minor}"
        link.symlink_to(os.path.relpath(node, link.parent))
    return dev, sys


def two_resources(tmp_path: Path) -> Path:
    return write_config(
        tmp_path / "config.json",
        resources=[
            {
                "name": "power-dev-plugin/dev",
                "include-devices": ["/dev/lun/*"],
                "allocation": "each",
            },
            {"name": "power-dev-plugin/acc", "include-devices": ["/dev/acc/x"], "upper-limit": 2},
        ],
    )


async def test_two_resources_each_allocation_restarts_and_topology(tmp_path, dmharness):
    numa = {"null": 0, "zero": 0, "full": 1, "random": 1}  # urandom: none (-1)
    dev, sys = host_like(tmp_path, numa)
    config = two_resources(tmp_path)
    with trio.fail_after(LIMIT):
        async with node(tmp_path, dmharness, config, dev, "--sys-root", str(sys)) as n:
            await n.wait(5, 5)  # the -resource of the harness: power-dev-plugin/dev
            state = (await n.dm.call("state"))["state"]
            topology = {
                i: [node.get("ID", 0) for node in (t or {}).get("nodes", [])]  # 0 is omitted
                for i, t in state["device_topology"].items()
            }
            # "each": a unit is named by its identity, else the kernel's name for it
            assert topology == {k: [v] for k, v in numa.items()} | {"urandom": []}
            assert state["options"].get("get_preferred_allocation_available") is True

            # "each": two pods get distinct devices, and only theirs
            first = await n.dm.call("admit", "p1", 2)
            second = await n.dm.call("admit", "p2", 2)
            assert first["admitted"] and second["admitted"]
            paths = [sorted(d["host"] for d in r["runopts"]["devices"]) for r in (first, second)]
            assert len(paths[0]) == 2 and len(paths[1]) == 2 and not set(paths[0]) & set(paths[1])
            assert not (await n.dm.call("admit", "p3", 2))["admitted"]  # one left
            # the other resource, side by side: its own capacity (2 shares)
            acc = [await n.dm.call("admit", f"a{i}", 1, "power-dev-plugin/acc") for i in range(3)]
            assert [a["admitted"] for a in acc] == [True, True, False]
            assert [d["host"] for d in acc[0]["runopts"]["devices"]] == ["/dev/acc/x"]

            registered = (await n.dm.call("checkpoint"))["checkpoint"]["Data"]["RegisteredDevices"]
            assert sorted(registered["power-dev-plugin/acc"]) == ["share-1", "share-2"]
            assert sorted(registered["power-dev-plugin/dev"]) == sorted(TARGETS)
            held = {p: (await n.dm.call("devices", p))["device_ids"] for p in ("p1", "p2")}
            restarted = await n.dm.call("restart", 5, 10000)
            assert restarted["capacity_back"], restarted
            for pod, reply in (("p1", first), ("p2", second)):
                assert (await n.dm.call("devices", pod))["device_ids"] == held[pod]
                after = (await n.dm.call("runopts", pod))["runopts"]["devices"]
                assert after == reply["runopts"]["devices"]  # the same physical devices


async def test_preferred_allocation_keeps_a_pod_on_one_numa_node(tmp_path, dmharness):
    # null and full on node 0, zero and random on node 1: a pod asking for 2
    # gets two devices of one node (the kubelet asks us, then takes our choice).
    dev, sys = host_like(tmp_path, {"null": 0, "full": 0, "zero": 1, "random": 1, "urandom": 1})
    config = two_resources(tmp_path)
    with trio.fail_after(LIMIT):
        async with node(tmp_path, dmharness, config, dev, "--sys-root", str(sys)) as n:
            await n.wait(5, 5)
            reply = await n.dm.call("admit", "p1", 2)
            chosen = sorted(Path(d["host"]).name for d in reply["runopts"]["devices"])
            assert chosen in (
                ["full", "null"],
                ["random", "zero"],
                ["random", "urandom"],
                ["urandom", "zero"],
            )


async def test_a_resource_added_and_removed_by_reload(tmp_path, dmharness):
    dev, sys = host_like(tmp_path, {})
    config = write_config(
        tmp_path / "config.json",
        resources=[{"name": "power-dev-plugin/dev", "include-devices": ["/dev/lun/*"]}],
    )
    with trio.fail_after(LIMIT):
        async with node(tmp_path, dmharness, config, dev, "--sys-root", str(sys)) as n:
            await n.wait(5, 5)
            two_resources(tmp_path)
            await n.wait_for_log("power-dev-plugin/acc: registered with the kubelet")
            assert (await n.dm.call("admit", "a1", 1, "power-dev-plugin/acc"))["admitted"]
            acc_socket = n.plugin_dir / "power-dev-plugin-acc.sock"
            assert acc_socket.exists()
            before = await n.dm.call("cap")
            config.write_text(
                json.dumps(
                    {
                        "resources": [
                            {"name": "power-dev-plugin/dev", "include-devices": ["/dev/lun/*"]}
                        ]
                    }
                )
            )
            await n.wait_for_log("power-dev-plugin/acc: gone from the config")
            await wait_gone(acc_socket)  # its server stopped and took its socket along
            assert (await n.dm.call("cap")) | {"t": 0, "cmd": ""} == before | {"t": 0, "cmd": ""}
            assert len(n.log_lines("power-dev-plugin/dev: registered with the kubelet")) == 1, (
                "\n".join(n.log_lines())
            )


async def test_each_a_node_and_its_link_are_one_unit_for_the_kubelet(tmp_path, dmharness):
    # A node without identity (a character device has none) and a link to
    # it: one unit, so the kubelet admits one pod, not two on one device.
    dev = tmp_path / "dev"
    (dev / "lun").mkdir(parents=True)
    (dev / "lun" / "a").symlink_to("/dev/null")
    (dev / "lun" / "b").symlink_to("/dev/null")
    config = write_config(
        tmp_path / "config.json", **{"include-devices": ["/dev/lun/*"], "allocation": "each"}
    )
    with trio.fail_after(LIMIT):
        async with node(tmp_path, dmharness, config, dev) as n:
            await n.wait(1, 1)
            first = await n.dm.call("admit", "p1", 1)
            assert first["admitted"]
            hosts = sorted(d["host"] for d in first["runopts"]["devices"])
            assert hosts == ["/dev/lun/a", "/dev/lun/b"]
            assert not (await n.dm.call("admit", "p2", 1))["admitted"]
