"""`powerdev local`: the daemon and a fake kubelet in one Trio nursery, in a
temp directory, printing what the kubelet sees. No cluster needed."""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import trio

from powerdev.config import DEFAULT_RESOURCE_NAME, DEFAULT_SOCKET_NAME, load_config
from powerdev.daemon import supervisor
from powerdev.daemon.settings import Settings
from powerdev.devtools.fake_kubelet import Event, FakeKubelet
from powerdev.rpc import asyncio_door

# Finds real devices on an ordinary Linux machine, loop devices included, so
# that `losetup -f some.img` (or LOOP_CTL_ADD) shows a hotplug at once.
DEMO_CONFIG = {
    "permissions": "rw",
    "include-devices": [
        "/dev/loop[0-9]*",
        "/dev/sd*",
        "/dev/vd*",
        "/dev/nvme*",
        "/dev/dm-*",
        "/dev/mapper/*",
    ],
    "exclude-devices": ["/dev/mapper/control"],
}


def describe(event: Event, kubelet: FakeKubelet, most: int = 12) -> str:
    """One line of what the kubelet saw, as an operator would want it."""
    if event.kind == "update":
        state = kubelet.resources[event.resource]
        names = [i for i, _ in event.devices]
        shown = ", ".join(names[:most]) + (
            f", ... (+{len(names) - most})" if len(names) > most else ""
        )
        unhealthy = [i for i, h in event.devices if h != "Healthy"]
        sick = f"; unhealthy: {', '.join(unhealthy)}" if unhealthy else ""
        return (
            f"kubelet: ListAndWatch update #{state.updates} for {event.resource}: "
            f"capacity {state.capacity}, allocatable {state.allocatable} "
            f"[{shown or 'no devices'}]{sick}"
        )
    if event.kind == "registered":
        return f"kubelet: registered {event.resource} at endpoint {event.detail}"
    if event.kind == "ended":
        return f"kubelet: ListAndWatch ended unexpectedly for {event.resource}: {event.detail}"
    if event.kind == "refused":
        return f"kubelet: refused Register for {event.resource}: {event.detail}"
    return f"kubelet: {event.kind} {event.resource} {event.detail}".rstrip()


async def run_local(
    *,
    config_path: Path | None = None,
    resource_name: str = DEFAULT_RESOURCE_NAME,
    socket_name: str = DEFAULT_SOCKET_NAME,
    dev_root: Path = Path("/dev"),
    sys_root: Path = Path("/sys"),
    uevents: str = "auto",
    out: Callable[[str], None] | None = None,
    task_status: trio.TaskStatus[FakeKubelet] = trio.TASK_STATUS_IGNORED,
) -> None:
    say = out or (lambda line: print(line, file=sys.stdout, flush=True))
    with tempfile.TemporaryDirectory(prefix="powerdev-local-") as tmp:
        plugin_dir = Path(tmp) / "device-plugins"
        if config_path is None:
            config_path = Path(tmp) / "config.json"
            config_path.write_text(json.dumps(DEMO_CONFIG, indent=2))
        config = load_config(config_path, resource_name=resource_name, socket_name=socket_name)
        say(f"powerdev local: plugin dir {plugin_dir}, config {config_path}")
        say(f"powerdev local: config {json.dumps(json.loads(config_path.read_text() or '{}'))}")

        kubelet: FakeKubelet
        kubelet = FakeKubelet(plugin_dir, on_event=lambda e: say(describe(e, kubelet)))
        settings = Settings(
            plugin_dir=plugin_dir,
            dev_root=dev_root,
            sys_root=sys_root,
            uevents=uevents,
            config_path=config_path,
            resource_name=resource_name,
            socket_name=socket_name,
        )
        async with asyncio_door(), trio.open_nursery() as nursery:
            await nursery.start(kubelet.run)
            await nursery.start(supervisor.run, settings, config)
            names = [r.name for r in config.resources]
            await kubelet.wait_until(
                lambda k: all(n in k.resources and k.resources[n].updates > 0 for n in names)
            )
            for name in names:
                await _sample_allocate(kubelet, name, say)
            say("powerdev local: watching for changes; press Ctrl-C to stop")
            task_status.started(kubelet)


async def _sample_allocate(kubelet: FakeKubelet, resource: str, say: Callable[[str], None]) -> None:
    healthy = kubelet.resources[resource].healthy_ids()
    if not healthy:
        say(f"powerdev local: no healthy {resource} units, so no sample Allocate")
        return
    grant = await kubelet.allocate(resource, healthy[:1])
    say(
        f"powerdev local: a pod asking for {resource}: 1 gets unit {healthy[0]} and "
        f"{len(grant.devices)} device node{'' if len(grant.devices) == 1 else 's'}:"
    )
    for spec in grant.devices[:12]:
        say(f"  {spec.host_path} -> {spec.container_path} ({spec.permissions})")
    if len(grant.devices) > 12:
        say(f"  ... and {len(grant.devices) - 12} more")
