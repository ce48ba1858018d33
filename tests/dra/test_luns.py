"""A SAN LUN that two nodes see is one device in the cluster: two simulated
nodes (a Node object, a draharness as its kubelet and a `powerdev run` each,
every one with a device tree of its own in which the same multipath LUN,
one WWID over two SCSI paths, is a map of other numbers) report it, and one
`powerdev luns` publishes it once, in the cluster pool, its nodeSelector
naming both. The kit's real scheduler gives it to one claim and binds the
pod to one of the two nodes; that node's powerdev prepares the claim with
its own device (the kit's CDI library resolves it to that node's numbers);
a second claim for it waits. Both paths of the LUN fail on the other node:
that node leaves the selection, and comes back with its paths."""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from powerdev.devtools.cdicheck import inject
from powerdev.devtools.cluster.client import Api, container, pod
from powerdev.devtools.draharness import DRAHarness
from powerdev.devtools.kit import CDICHECK
from powerdev.devtools.testing import dra_options, is_root, run_command, stop, wait_for_file
from powerdev.dra.luns import cluster_pool_name, cluster_slice_name, report_name
from tests.conftest import require_tool
from tests.dra.test_harness import RESOURCE_API, TAINT, dirs
from tests.unit.test_condition import scsi
from tests.unit.test_family import nodes
from tests.unit.test_inuse import add_device

pytestmark = pytest.mark.skipif(not is_root(), reason="needs root: block nodes (mknod)")

RESOURCE = "powerdev.test/lun"
WWID = "3600a098038303053453f463045727a"
SLICES = f"{RESOURCE_API}/resourceslices"
LIMIT = 90
GID, MODE = 6, 0o660


def lun_tree(sys_root: Path, minor: int, blocks: int = 2048) -> dict[str, Path]:
    """The LUN as a node's sysfs has it: a multipath map dm-<minor> (253:<minor>)
    with DM UUID mpath-<WWID>, `blocks` of 512 bytes (1 MiB), over two
    running SCSI paths, sdd and sde; their state files."""
    dm = f"dm-{minor}"
    states = {
        "sdd": scsi(sys_root, "sdd", "8:48", 0, holders=[dm]),
        "sde": scsi(sys_root, "sde", "8:64", 1, holders=[dm]),
    }
    add_device(
        sys_root, "virtual/block", dm, f"253:{minor}", slaves=["sdd", "sde"], uuid=f"mpath-{WWID}"
    )
    (sys_root / f"devices/virtual/block/{dm}/dm/suspended").write_text("0\n")
    (sys_root / f"devices/virtual/block/{dm}/size").write_text(f"{blocks}\n")
    for disk in (sys_root / "class" / "block").iterdir():
        major, number = (disk / "dev").read_text().split(":")
        (disk / "uevent").write_text(
            f"MAJOR={major}\nMINOR={number.strip()}\nDEVNAME={disk.name}\n"
        )
    return states


@dataclass
class LunNode:
    name: str
    harness: DRAHarness
    cdi: Path
    minor: int
    states: dict[str, Path]
    command: list[str]
    proc: trio.Process

    async def kill(self) -> None:
        """Its powerdev SIGKILLed: no way out, its report stays as it was."""
        self.proc.kill()
        await self.proc.wait()

    async def start(self) -> None:
        """Its powerdev started again, on the same directories."""
        self.proc = await trio.lowlevel.open_process(self.command)


@contextlib.asynccontextmanager
async def lun_node(
    api: Api,
    plane,
    draharness: Path,
    root: Path,
    *,
    driver: str,
    namespace: str,
    minor: int,
    blocks: int = 2048,
    interval: float | None = None,
    fields: dict | None = None,
) -> AsyncIterator[LunNode]:
    """A Ready Node (tainted for this test's pods only), the harness as its
    kubelet, and `powerdev run` with the LUN at /dev/mapper/mpatha
    (253:<minor>, `blocks` long) in a resource with "scope": "cluster"
    (and `fields`), reporting at least every `interval` seconds (the
    default: 10)."""
    name = f"lun-{secrets.token_hex(3)}"
    await api.create_node(name, taints=[{"key": TAINT, "value": namespace, "effect": "NoSchedule"}])
    states = lun_tree(root / "sys", minor, blocks)
    nodes(root / "dev", {"mapper/mpatha": (253, minor)})
    config = root / "config.json"
    entry = {
        "name": RESOURCE,
        "api": "dra",
        "scope": "cluster",
        "include-devices": ["/dev/mapper/*"],
        "device-gid": GID,
        "device-mode": f"{MODE:04o}",
        **(fields or {}),
    }
    config.write_text(json.dumps({"resources": [entry]}))
    registry, plugins, state = dirs(root)
    command = run_command(
        root / "device-plugins",
        config,
        root / "dev",
        *("--sys-root", str(root / "sys"), "--uevents", "off", "--health-interval", "0.05"),
        *("--lun-namespace", namespace),
        *(("--lun-report-interval", str(interval)) if interval is not None else ()),
        *dra_options(root, name, plane.kubeconfig, driver),
    )
    async with DRAHarness.running(
        draharness, root / "draharness.log", node_name=name, kubeconfig=plane.kubeconfig
    ) as harness:
        await harness.start(registry, plugins, state)
        await harness.wait_wipe(1)
        node = LunNode(name, harness, root / "cdi", minor, states, command, None)  # type: ignore[arg-type]
        await node.start()
        try:
            await harness.wait_driver(driver)
            yield node
        finally:
            await stop(node.proc)


@contextlib.asynccontextmanager
async def luns_controller(
    plane,
    namespace: str,
    driver: str,
    *options: str,
    identity: str = "luns-0",
    log: Path | None = None,
) -> AsyncIterator[trio.Process]:
    """`powerdev luns` as `identity`, its log to `log` (else inherited)."""
    command = [
        *run_command(Path("/"), Path("/"), Path("/"))[:3],
        "luns",
        *("--kubeconfig", str(plane.kubeconfig), "--namespace", namespace),
        *("--dra-driver", driver, "--identity", identity),
        *options,
    ]
    with contextlib.ExitStack() as files:
        stderr = files.enter_context(log.open("ab")) if log is not None else None
        proc = await trio.lowlevel.open_process(command, stderr=stderr)
        try:
            yield proc
        finally:
            await stop(proc)


def selected(item: dict) -> dict[str, list[str]]:
    """Each device of a cluster slice -> the nodes its nodeSelector names."""
    found = {}
    for device in item["spec"].get("devices", []):  # none: left out by the server
        (term,) = device["nodeSelector"]["nodeSelectorTerms"]
        (field,) = term["matchExpressions"]
        assert (field["key"], field["operator"]) == ("kubernetes.io/hostname", "In")
        found[device["name"]] = sorted(field["values"])
    return found


async def claim_and_pod(
    api: Api, namespace: str, name: str, device_class: str, on: str | None = None
) -> None:
    """A claim for one device of the class, and a pod using it (on node
    `on`, by its hostname label, else where the scheduler puts it)."""
    claims = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims"
    exactly = {"deviceClassName": device_class, "count": 1}
    await api.create(
        claims,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "dev", "exactly": exactly}]}},
        },
    )
    body = pod(
        name,
        container("c0", {"claims": [{"name": "dev"}]}),
        resourceClaims=[{"name": "dev", "resourceClaimName": name}],
        tolerations=[{"key": TAINT, "operator": "Equal", "value": namespace}],
        **({"nodeSelector": {"kubernetes.io/hostname": on}} if on else {}),
    )
    await api.create_pod(namespace, body)


async def lun_class(api: Api, name: str, driver: str) -> None:
    """A DeviceClass of the resource's devices of that driver."""
    cel = f'device.driver == "{driver}" && device.attributes["{driver}"].resource == "{RESOURCE}"'
    await api.create(
        f"{RESOURCE_API}/deviceclasses",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": cel}}]},
        },
    )


def unschedulable(p: dict) -> bool:
    return any(
        c["type"] == "PodScheduled"
        and c["status"] == "False"
        and c.get("reason") == "Unschedulable"
        for c in p.get("status", {}).get("conditions", [])
    )


async def test_a_lun_two_nodes_see_is_one_device_one_claim_at_a_time_on_a_node_that_reaches_it(
    api, control_plane, draharness, tmp_path
):
    cdicheck = require_tool(CDICHECK)
    namespace = f"luns-{secrets.token_hex(3)}"
    driver = f"{namespace}.powerdev.test"
    await api.create_namespace(namespace)
    await lun_class(api, namespace, driver)
    first = cluster_slice_name(driver, RESOURCE, 0)
    with trio.fail_after(LIMIT):
        async with (
            lun_node(
                api, control_plane, draharness, tmp_path / "a",
                driver=driver, namespace=namespace, minor=3,
            ) as a,
            lun_node(
                api, control_plane, draharness, tmp_path / "b",
                driver=driver, namespace=namespace, minor=7,
            ) as b,
            luns_controller(control_plane, namespace, driver),
        ):  # fmt: skip
            both = sorted([a.name, b.name])
            # Published once, for the cluster, naming both nodes.
            item = await api.wait_for(SLICES, first, lambda s: list(selected(s).values()) == [both])
            spec = item["spec"]
            assert spec["perDeviceNodeSelection"] is True and "nodeName" not in spec
            assert spec["pool"]["name"] == cluster_pool_name(RESOURCE)
            assert spec["pool"]["resourceSliceCount"] == 1
            (device,) = spec["devices"]
            assert device["attributes"]["wwid"] == {"string": WWID}
            assert device["capacity"] == {"size": {"value": str(2048 * 512)}}
            assert device["bindsToNode"] is True
            listing = await api.get(SLICES)
            mine = [s for s in listing["items"] if s["spec"]["driver"] == driver]
            assert len(mine) == 1  # no node publishes a pool of its own

            # A claim gets it; its pod is bound to one of the two nodes.
            await claim_and_pod(api, namespace, "p1", namespace)
            pods = f"/api/v1/namespaces/{namespace}/pods"
            bound = await api.wait_for(pods, "p1", lambda p: bool(p["spec"].get("nodeName")))
            holder = {a.name: a, b.name: b}[bound["spec"]["nodeName"]]
            other = b if holder is a else a
            claim = await api.get(f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/p1")
            allocation = claim["status"]["allocation"]
            (result,) = allocation["devices"]["results"]
            assert (result["pool"], result["device"]) == (
                cluster_pool_name(RESOURCE),
                device["name"],
            )
            (term,) = allocation["nodeSelector"]["nodeSelectorTerms"]
            assert term["matchFields"][0]["values"] == [holder.name]  # bindsToNode

            # Its node prepares it with its own device: the LUN's numbers there.
            prepared = await holder.harness.prepare(namespace, "p1")
            resolved = inject(cdicheck, [holder.cdi], prepared["c0"])
            assert resolved["ok"], resolved
            numbers = sorted((d["type"], d["major"], d["minor"]) for d in resolved["linuxDevices"])
            assert numbers == [("b", 253, holder.minor)]

            # A second claim for it waits while the first holds it.
            await claim_and_pod(api, namespace, "p2", namespace)
            waiting = await api.wait_for(pods, "p2", unschedulable)
            assert not waiting["spec"].get("nodeName")
            second = await api.get(f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/p2")
            assert not second.get("status", {}).get("allocation")

            # Both paths fail on the other node: it leaves the selection.
            for state in other.states.values():
                state.write_text("transport-offline\n")
            await api.wait_for(
                SLICES, first, lambda s: list(selected(s).values()) == [[holder.name]]
            )
            # Back: it is named again.
            for state in other.states.values():
                state.write_text("running\n")
            await api.wait_for(SLICES, first, lambda s: list(selected(s).values()) == [both])
            # The holder itself leaves the selection (its Node NotReady): the
            # pool no longer names it, and its prepared claim is kept.
            await api.merge_patch(f"/api/v1/nodes/{holder.name}/status", ready("Unknown"))
            await api.wait_for(
                SLICES, first, lambda s: list(selected(s).values()) == [[other.name]]
            )
            # The holder's claim was prepared throughout, whatever the pool did.
            again = await holder.harness.prepare(namespace, "p1")
            assert again == prepared
            await api.merge_patch(f"/api/v1/nodes/{holder.name}/status", ready("True"))
            await api.wait_for(SLICES, first, lambda s: list(selected(s).values()) == [both])


LEASE = "powerdev-luns"
LEASE_SECONDS = 4.0  # its retry a fifth of it; an expiry two thirds at least


def held_by(identity: str):
    return lambda lease: lease["spec"].get("holderIdentity") == identity


async def test_the_leader_changes_hands_and_the_pool_stays_as_it_was_written_once(
    api, control_plane, draharness, tmp_path
):
    """Two replicas of `powerdev luns`: the first leads and publishes. It is
    SIGKILLed, its Lease left held: the second takes over once the Lease
    has gone unrenewed for its duration, finds the pool right and writes
    nothing; a path change after that is its to publish, once (one slice,
    at the same generation). Then a third replica, and the second SIGTERMed: it lets the Lease
    go, and the third takes over at once."""
    namespace = f"luns-{secrets.token_hex(3)}"
    driver = f"{namespace}.powerdev.test"
    await api.create_namespace(namespace)
    first = cluster_slice_name(driver, RESOURCE, 0)
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    logs = {i: tmp_path / f"luns-{i}.log" for i in range(3)}
    options = ("--lease-duration", str(LEASE_SECONDS))

    def controller(i: int):
        return luns_controller(
            control_plane, namespace, driver, *options, identity=f"luns-{i}", log=logs[i]
        )

    async def running(i: int) -> None:  # its elector is about to try the Lease
        await wait_for_file(logs[i], lambda text: f"luns: luns-{i} for driver" in text)

    async def took_up(i: int) -> str:  # its first pass as the leader
        text = await wait_for_file(logs[i], lambda text: "luns: took up" in text)
        (line,) = [line for line in text.splitlines() if "luns: took up" in line]
        return line

    with trio.fail_after(LIMIT):
        async with (
            lun_node(
                api, control_plane, draharness, tmp_path / "a",
                driver=driver, namespace=namespace, minor=3,
            ) as a,
            lun_node(
                api, control_plane, draharness, tmp_path / "b",
                driver=driver, namespace=namespace, minor=7,
            ) as b,
            controller(0) as zero,
        ):  # fmt: skip
            both = sorted([a.name, b.name])
            await api.wait_for(leases, LEASE, held_by("luns-0"))
            published = await api.wait_for(
                SLICES, first, lambda s: list(selected(s).values()) == [both]
            )
            generation = published["spec"]["pool"]["generation"]
            async with controller(1) as one:
                await running(1)
                lease = await api.get(f"{leases}/{LEASE}")
                assert lease["spec"]["holderIdentity"] == "luns-0"  # it waits its turn
                # SIGKILL: no way out, the Lease stays held until it expires.
                zero.kill()
                await zero.wait()
                killed = trio.current_time()
                with trio.fail_after(LEASE_SECONDS * 2):
                    await api.wait_for(leases, LEASE, held_by("luns-1"))
                # Not before the holder's last renewal (at most a third of the
                # duration before the kill) had aged a whole duration.
                assert trio.current_time() - killed >= LEASE_SECONDS * 2 / 3 - 0.1
                assert (await took_up(1)).endswith(": 0 slices written")
                kept = await api.get(f"{SLICES}/{first}")
                assert kept["metadata"]["resourceVersion"] == published["metadata"][
                    "resourceVersion"
                ]  # fmt: skip
                # A change after the takeover: the new leader publishes it, once.
                for state in b.states.values():
                    state.write_text("transport-offline\n")
                changed = await api.wait_for(
                    SLICES, first, lambda s: list(selected(s).values()) == [[a.name]]
                )
                # one slice changed: written alone, the generation kept (the
                # pool stays whole meanwhile)
                assert changed["spec"]["pool"]["generation"] == generation
                wrote = f"(generation {generation}, 1 of 1 slices written)"
                text = await wait_for_file(logs[1], lambda text: wrote in text)
                assert text.count(" published ") == 1  # by the new leader, once
                assert logs[0].read_text().count(" published ") == 1  # its first, alone

                # SIGTERM: the leader lets the Lease go, the next takes it at once.
                async with controller(2):
                    await running(2)
                    await api.wait_for(leases, LEASE, held_by("luns-1"))
                    one.terminate()
                    with trio.fail_after(LEASE_SECONDS / 2):  # an expiry: 2/3 of it at least
                        await api.wait_for(leases, LEASE, held_by("luns-2"))
                    assert "let the Lease powerdev-luns go" in logs[1].read_text()
                    assert (await took_up(2)).endswith(": 0 slices written")
                    for state in b.states.values():
                        state.write_text("running\n")
                    back = await api.wait_for(
                        SLICES, first, lambda s: list(selected(s).values()) == [both]
                    )
                    assert back["spec"]["pool"]["generation"] == generation
                    # its log line comes after the API server's answer, which the watch may beat
                    text = await wait_for_file(logs[2], lambda text: " published " in text)
                    assert text.count(" published ") == 1
                    await one.wait()


TTL = 3.0
INTERVAL = 0.5


async def test_a_node_whose_powerdev_is_killed_leaves_every_selection_after_the_ttl_and_comes_back(
    api, control_plane, draharness, tmp_path
):
    """A's powerdev SIGKILLed: its report stays as it was (nothing deletes
    it), and once it has gone --report-ttl unchanged A leaves the LUN's
    selection, B (whose heartbeat goes on) staying; A's powerdev started
    again: A is named again."""
    namespace = f"luns-{secrets.token_hex(3)}"
    driver = f"{namespace}.powerdev.test"
    await api.create_namespace(namespace)
    first = cluster_slice_name(driver, RESOURCE, 0)
    configmaps = f"/api/v1/namespaces/{namespace}/configmaps"
    with trio.fail_after(LIMIT):
        async with (
            lun_node(
                api, control_plane, draharness, tmp_path / "a",
                driver=driver, namespace=namespace, minor=3, interval=INTERVAL,
            ) as a,
            lun_node(
                api, control_plane, draharness, tmp_path / "b",
                driver=driver, namespace=namespace, minor=7, interval=INTERVAL,
            ) as b,
            luns_controller(control_plane, namespace, driver, "--report-ttl", str(TTL)),
        ):  # fmt: skip
            both = sorted([a.name, b.name])
            await api.wait_for(SLICES, first, lambda s: list(selected(s).values()) == [both])
            report = report_name(a.name, driver, RESOURCE)
            await api.wait_for(configmaps, report)
            await a.kill()
            killed = trio.current_time()
            left = await api.get(f"{configmaps}/{report}")
            with trio.fail_after(TTL * 2):
                await api.wait_for(
                    SLICES, first, lambda s: list(selected(s).values()) == [[b.name]]
                )
            # Not before the report had gone a whole ttl unchanged: its last
            # heartbeat was at most an interval before the kill.
            assert trio.current_time() - killed >= TTL - INTERVAL - 0.1
            kept = await api.get(f"{configmaps}/{report}")
            assert kept["metadata"]["resourceVersion"] == left["metadata"]["resourceVersion"]
            assert kept["data"] == left["data"]
            assert json.loads(kept["data"]["luns"])[0]["paths"] == 2  # as A last saw it
            await a.start()
            await api.wait_for(SLICES, first, lambda s: list(selected(s).values()) == [both])


async def test_a_node_that_sees_the_lun_with_another_size_is_said_and_left_out(
    api, control_plane, draharness, tmp_path
):
    """A and B see the LUN as 1 MiB, C (the same WWID) as 2 MiB: the
    controller says so in its log, naming C, and publishes the LUN for A and
    B only, at their size."""
    namespace = f"luns-{secrets.token_hex(3)}"
    driver = f"{namespace}.powerdev.test"
    await api.create_namespace(namespace)
    first = cluster_slice_name(driver, RESOURCE, 0)
    log = tmp_path / "luns.log"
    with trio.fail_after(LIMIT):
        async with (
            lun_node(
                api, control_plane, draharness, tmp_path / "a",
                driver=driver, namespace=namespace, minor=3,
            ) as a,
            lun_node(
                api, control_plane, draharness, tmp_path / "b",
                driver=driver, namespace=namespace, minor=7,
            ) as b,
            lun_node(
                api, control_plane, draharness, tmp_path / "c",
                driver=driver, namespace=namespace, minor=9, blocks=4096,
            ) as c,
            luns_controller(control_plane, namespace, driver, log=log),
        ):  # fmt: skip
            said = await wait_for_file(log, lambda text: f"node {c.name} sees" in text)
            (line,) = [line for line in said.splitlines() if f"node {c.name} sees" in line]
            assert f"size {4096 * 512}" in line and f"size {2048 * 512}" in line
            assert "ERROR" in line and f"node {c.name} is left out" in line
            # Said in the pass that publishes: the pool it writes names A and B
            # (an earlier pass, before C reported, might have named fewer).
            with trio.fail_after(10):
                item = await api.wait_for(
                    SLICES,
                    first,
                    lambda s: list(selected(s).values()) == [sorted([a.name, b.name])],
                )
            (device,) = item["spec"]["devices"]
            assert device["capacity"] == {"size": {"value": str(2048 * 512)}}


async def test_a_node_restarted_after_going_silent_comes_back_at_once_whatever_it_last_wrote(
    api, control_plane, draharness, tmp_path
):
    """A's powerdev writes its report once (a heartbeat a minute), goes
    silent past --report-ttl and leaves; killed and started again, its
    first report says the same LUNs as the last one: A is named again at
    once, not a heartbeat later (a restart that wrote the very same report
    changed nothing at the API server, so the controller saw nothing)."""
    namespace = f"luns-{secrets.token_hex(3)}"
    driver = f"{namespace}.powerdev.test"
    await api.create_namespace(namespace)
    first = cluster_slice_name(driver, RESOURCE, 0)
    with trio.fail_after(LIMIT):
        async with (
            lun_node(
                api, control_plane, draharness, tmp_path / "a",
                driver=driver, namespace=namespace, minor=3, interval=60,
            ) as a,
            luns_controller(control_plane, namespace, driver, "--report-ttl", "1"),
        ):  # fmt: skip
            await api.wait_for(SLICES, first, lambda s: list(selected(s).values()) == [[a.name]])
            await api.wait_for(SLICES, first, lambda s: not s["spec"].get("devices"))  # silent
            await a.kill()
            await a.start()
            with trio.fail_after(15):  # its next heartbeat: 60 s
                await api.wait_for(
                    SLICES, first, lambda s: list(selected(s).values()) == [[a.name]]
                )


async def test_a_shared_lun_goes_to_claims_on_two_nodes_and_to_two_claims_on_one(
    api, control_plane, draharness, tmp_path
):
    """With "shared": true on both nodes the LUN may be allocated more than
    once: two claims, pinned to A and B, both get it, and each node
    prepares its own device; a third claim beside the first on A is
    prepared too (the claims hold it together). The first let go, the
    third's stays as it was."""
    cdicheck = require_tool(CDICHECK)
    namespace = f"luns-{secrets.token_hex(3)}"
    driver = f"{namespace}.powerdev.test"
    await api.create_namespace(namespace)
    await lun_class(api, namespace, driver)
    first = cluster_slice_name(driver, RESOURCE, 0)
    shared = {"shared": True}
    claims = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims"
    pods = f"/api/v1/namespaces/{namespace}/pods"
    with trio.fail_after(LIMIT):
        async with (
            lun_node(
                api, control_plane, draharness, tmp_path / "a",
                driver=driver, namespace=namespace, minor=3, fields=shared,
            ) as a,
            lun_node(
                api, control_plane, draharness, tmp_path / "b",
                driver=driver, namespace=namespace, minor=7, fields=shared,
            ) as b,
            luns_controller(control_plane, namespace, driver),
        ):  # fmt: skip
            both = sorted([a.name, b.name])
            item = await api.wait_for(SLICES, first, lambda s: list(selected(s).values()) == [both])
            (device,) = item["spec"]["devices"]
            assert device["allowMultipleAllocations"] is True
            # a claim that asks for no part of the size takes none of it
            size = {"value": str(2048 * 512), "requestPolicy": {"default": "0"}}
            assert device["capacity"] == {"size": size}

            for name, node in (("on-a", a), ("on-b", b), ("beside", a)):
                await claim_and_pod(api, namespace, name, namespace, on=node.name)
                bound = await api.wait_for(pods, name, lambda p: bool(p["spec"].get("nodeName")))
                assert bound["spec"]["nodeName"] == node.name
                claim = await api.get(f"{claims}/{name}")
                (result,) = claim["status"]["allocation"]["devices"]["results"]
                assert result["device"] == device["name"]
                assert result.get("shareID")  # one share of the device each

            prepared = {}
            for name, node in (("on-a", a), ("on-b", b), ("beside", a)):
                prepared[name] = await node.harness.prepare(namespace, name)
                resolved = inject(cdicheck, [node.cdi], prepared[name]["c0"])
                assert resolved["ok"], resolved
                numbers = [(d["type"], d["major"], d["minor"]) for d in resolved["linuxDevices"]]
                assert numbers == [("b", 253, node.minor)]

            await a.harness.unprepare(namespace, "on-a")
            assert await a.harness.prepare(namespace, "beside") == prepared["beside"]


def ready(status: str) -> dict:
    """A Node status whose Ready condition says `status`."""
    condition = {"type": "Ready", "status": status, "reason": "Test", "message": "set by the test"}
    return {"status": {"conditions": [condition]}}


async def test_a_node_that_goes_not_ready_leaves_the_selection_though_its_powerdev_reports(
    api, control_plane, draharness, tmp_path
):
    """A's kubelet gone (its Ready condition Unknown, as the node lifecycle
    controller sets it) while its powerdev still writes its report: A leaves
    the LUN's selection at once, not after the ttl, and is named again
    once Ready."""
    namespace = f"luns-{secrets.token_hex(3)}"
    driver = f"{namespace}.powerdev.test"
    await api.create_namespace(namespace)
    first = cluster_slice_name(driver, RESOURCE, 0)
    with trio.fail_after(LIMIT):
        async with (
            lun_node(
                api, control_plane, draharness, tmp_path / "a",
                driver=driver, namespace=namespace, minor=3,
            ) as a,
            lun_node(
                api, control_plane, draharness, tmp_path / "b",
                driver=driver, namespace=namespace, minor=7,
            ) as b,
            luns_controller(control_plane, namespace, driver, "--report-ttl", "3600"),
        ):  # fmt: skip
            both = sorted([a.name, b.name])
            await api.wait_for(SLICES, first, lambda s: list(selected(s).values()) == [both])
            await api.merge_patch(f"/api/v1/nodes/{a.name}/status", ready("Unknown"))
            await api.wait_for(SLICES, first, lambda s: list(selected(s).values()) == [[b.name]])
            await api.merge_patch(f"/api/v1/nodes/{a.name}/status", ready("True"))
            await api.wait_for(SLICES, first, lambda s: list(selected(s).values()) == [both])
