"""`powerdev bench --node`: the kit's real node (cluster/node.py) measured.

- nothing to Node Ready: the control plane, containerd, the images and the
  kubelet started from nothing, until the Node is Ready; and the node's own
  part of it, from containerd's start;
- a pod's start with a device against one without: the time from the pod's
  creation to its end (Succeeded), for a pod that only opens its device
  (`head -c 1`), through DeviceSpecs, CDI and DRA (a ResourceClaimTemplate),
  and for the same pod with no device; the difference is the share of the
  device's path: the scheduler, the kubelet's device manager or DRA manager,
  powerdev's Allocate or NodePrepareResources, the runtime's device setup.

Each pod is made, waited for, and deleted (until gone) before the next, so
every one starts on a quiet node. Needs root, the kit with its node parts
(bash conformance/build) and the host packages (bash conformance/host-tools).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

import trio

from powerdev.devtools import kit, testing
from powerdev.devtools.bench import percentile
from powerdev.devtools.cluster import node
from powerdev.devtools.cluster.client import Api
from powerdev.devtools.cluster.node import Node
from powerdev.devtools.cluster.nodepods import (
    RESOURCE_API,
    all_registered,
    busybox_pod,
    device_class,
    loop_devices,
    powerdev_command,
)

ROUNDS = 7  # pods of each kind
PATHS = {  # kind: (resource, its config entry's own fields)
    "DeviceSpecs": ("powerdev.bench/specs", {"socket": "bench-specs.sock"}),
    "CDI": (
        "powerdev.bench/cdi",
        {"socket": "bench-cdi.sock", "cdi": True, "device-uid": 1000, "device-mode": "0600"},
    ),
    "DRA": ("powerdev.bench/dra", {"api": "dra", "device-uid": 1000, "device-mode": "0600"}),
}


def problem() -> str | None:
    """Why the node bench cannot run here, or None."""
    needed = (*kit.CONTROL_PLANE, "kubectl", *kit.NODE)
    found = kit.find_all(needed)
    missing = [name for name in needed if name not in found]
    if missing:
        return kit.missing_message(missing)
    return node.missing_parts()


def _config(loops: list[str]) -> dict:
    resources = []
    for (resource, fields), device in zip(PATHS.values(), loops, strict=True):
        resources.append({"name": resource, "include-devices": [device], **fields})
    return {"resources": resources}


async def _pod_seconds(api: Api, namespace: str, body: dict) -> float:
    """From the pod's creation to its end; then it is deleted, until gone."""
    pods = f"/api/v1/namespaces/{namespace}/pods"
    name = body["metadata"]["name"]
    began = trio.current_time()
    await api.create(pods, body)
    done = await api.wait_for(
        pods, name, lambda p: p["status"].get("phase") in ("Succeeded", "Failed")
    )
    took = trio.current_time() - began
    if done["status"]["phase"] != "Succeeded":
        raise RuntimeError(f"pod {name} failed: {done['status']}")
    await api.delete(f"{pods}/{name}")
    await api.wait_gone(pods, name)
    return took


async def _measure(running: Node, tmp: Path, rounds: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"no device": [], **{kind: [] for kind in PATHS}}
    with loop_devices(tmp, len(PATHS)) as made:
        loops = [device for device, _ in made]
        config, status = tmp / "config.json", tmp / "status.json"
        config.write_text(json.dumps(_config(loops)))
        command = powerdev_command(running, config, "--status-file", str(status))
        async with running.plane.api() as api, trio.open_nursery() as nursery:
            with (tmp / "powerdev.log").open("ab") as log:
                proc = await trio.lowlevel.open_process(
                    command, stdin=subprocess.DEVNULL, stdout=log, stderr=log
                )
            nursery.start_soon(proc.wait)
            try:
                await testing.wait_for_file(status, partial(all_registered, len(PATHS)))
                await api.create(
                    f"{RESOURCE_API}/deviceclasses", device_class("bench-dra", PATHS["DRA"][0])
                )
                await api.create_namespace("bench")
                for resource, _ in PATHS.values():
                    await api.wait_for(
                        "/api/v1/nodes",
                        running.name,
                        lambda n, r=resource: (
                            r in ("powerdev.bench/dra",)
                            or n["status"].get("allocatable", {}).get(r) == "1"
                        ),
                    )
                await api.create(
                    f"{RESOURCE_API}/namespaces/bench/resourceclaimtemplates",
                    {
                        "metadata": {"name": "dev"},
                        "spec": {"spec": {"devices": {"requests": [
                            {"name": "dev", "exactly": {"deviceClassName": "bench-dra"}}
                        ]}}},
                    },
                )  # fmt: skip
                script = "head -c 1 /dev/loop3* >/dev/null"
                for round_ in range(rounds):
                    bodies = {
                        "no device": busybox_pod(f"plain-{round_}", "true"),
                        "DeviceSpecs": busybox_pod(
                            f"specs-{round_}",
                            script,
                            resources={"limits": {PATHS["DeviceSpecs"][0]: "1"}},
                        ),
                        "CDI": busybox_pod(
                            f"cdi-{round_}", script, resources={"limits": {PATHS["CDI"][0]: "1"}}
                        ),
                        "DRA": busybox_pod(
                            f"dra-{round_}",
                            script,
                            claims=[{"name": "dev", "resourceClaimTemplateName": "dev"}],
                        ),
                    }
                    for kind, body in bodies.items():
                        samples[kind].append(await _pod_seconds(api, "bench", body))
            finally:
                await testing.stop(proc)
                nursery.cancel_scope.cancel()
    return samples


def _table(start: float, node_part: float, samples: dict[str, list[float]]) -> str:
    plain = percentile(samples["no device"], 50)
    lines = [
        f"nothing to Node Ready: {start:.2f} s (the node's parts: {node_part:.2f} s)",
        f"pod start to end, {len(samples['no device'])} pods each (ms):",
        f"  {'path':<12} {'p50':>8} {'min':>8} {'max':>8} {'share p50':>10}",
    ]
    for kind, values in samples.items():
        p50 = percentile(values, 50)
        share = "" if kind == "no device" else f"{(p50 - plain) * 1000:10.0f}"
        lines.append(
            f"  {kind:<12} {p50 * 1000:8.0f} {min(values) * 1000:8.0f} "
            f"{max(values) * 1000:8.0f} {share:>10}"
        )
    return "\n".join(lines)


async def run_bench(json_path: Path | None, rounds: int = ROUNDS) -> None:
    tools = kit.find_all((*kit.CONTROL_PLANE, "kubectl", *kit.NODE))
    root = Path(tempfile.mkdtemp(prefix="pd-bench-node-", dir="/tmp"))
    async with trio.open_nursery() as nursery:
        running: Node = await nursery.start(partial(node.run, root / "node", tools))
        samples = await _measure(running, root, rounds)
        nursery.cancel_scope.cancel()
    print(_table(running.start_seconds, running.node_seconds, samples))
    if json_path is not None:
        figures = {
            "node_ready_s": running.start_seconds,
            "node_parts_s": running.node_seconds,
            "pod_seconds": samples,
        }
        await trio.Path(json_path).write_text(json.dumps(figures, indent=2) + "\n")
    await trio.to_thread.run_sync(partial(shutil.rmtree, root, ignore_errors=True))


if __name__ == "__main__":
    if why := problem():
        sys.exit(why)
    trio.run(run_bench, None)
