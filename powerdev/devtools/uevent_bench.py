"""The device-event path through powerdev, measured in a process of its own.

`powerdev bench` runs this module as a child (`python -m
powerdev.devtools.uevent_bench`) and plays the kubelet for it. What it measures is
powerdev's own part of a device event: from the moment the daemon's event
follower takes a batch of events (supervisor.run's `events`, a source this module
controls) until the list it implies is published to the ListAndWatch
inventory. The end is the moment the inventory's version changes, taken
when that change wakes a task waiting in Inventory.wait_newer (a Trio
instrument's task_scheduled hook), so that other tasks woken by the same
change (the ListAndWatch stream, the CDI spec keeper) are not counted.
The daemon runs here in full (supervisor.run: discovery, the host-use rule, the
gRPC service, registration with the kubelet), so the longest Trio step
while the events are applied is the daemon's; the kubelet (the parent)
decodes each list in another process.

The host is synthetic and real enough for the host-use rule to work on
it: a sysfs tree (--sys-root: class/block links, dev/block/M:m links into
devices/..., dev, uevent and partition files, holders/ and slaves/), a /dev
of block nodes made with mknod, numbered as the sd driver numbers its disks
(so it needs root), and a host mount table. Disk sda carries the host:
sda1 (a PReP partition, unmounted), sda2 (mounted at /boot) and sda3, an
LVM physical volume under dm-0 (mounted at /); every fourth other disk has
two partitions. The resource is IBM's plugin's default: every block device.

Each cycle: a new disk appears (its sysfs entry, then its node, then an
"add" event); a listed disk gets a "change" event that changes nothing
(most change events do not); the new disk goes (its node and sysfs entry,
then a "remove" event). Add and remove are timed to the published list;
the change, which publishes nothing, to the moment the follower asks for
its next batch. Then as many mount cycles: a pod's tmpfs volume is mounted
(the daemon's host-use source reads the host's tables again and finds no
device's use changed: its CPU for that is timed), a listed disk is mounted
and unmounted (each timed to the list published with it Unhealthy, and
Healthy again).

The two processes speak JSON, one object a line (the child's stdout and
stdin): the child says what the kubelet should see next ({"wait": ...}),
and the parent answers once it does, so that each event starts with the
daemon quiet and the kubelet up to date.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import os
import shutil
import stat
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import trio

from powerdev.config import load_config
from powerdev.daemon import supervisor
from powerdev.daemon.settings import Settings
from powerdev.devices.events import DeviceEvent
from powerdev.devices.hostuse_events import HOST_USE, HostUseEvents
from powerdev.devices.inventory import Inventory, Snapshot
from powerdev.devtools import stepwatch
from powerdev.ops import logformat

Number = tuple[int, int]

# The sd driver's majors, in the order it uses them: 16 disks a major, 16
# minors a disk (the disk, then its partitions 1 to 15).
SD_MAJORS = (8, 65, 66, 67, 68, 69, 70, 71, 128, 129, 130, 131, 132, 133, 134, 135)
DM_MAJOR = 253
CONTROLLER = "devices/pci0000:00/0000:00:04.0"  # every disk's, on NUMA node 0
HOST_NODES = ("sda", "sda1", "sda2", "sda3", "dm-0")  # what the host uses
PUBLISH_LIMIT = 60.0  # seconds an event may take to publish before the bench gives up


def sd_name(index: int) -> str:
    """The sd driver's name for its index-th disk: sda .. sdz, sdaa .. sdzz, sdaaa .."""
    letters = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        letters = chr(ord("a") + rest) + letters
    return f"sd{letters}"


def sd_number(index: int) -> Number:
    """The sd driver's numbers for its index-th disk (sd_major, sd_probe)."""
    return SD_MAJORS[(index & 0xF0) >> 4], ((index & 0xF) << 4) | (index & 0xFFF00)


class SyntheticHost:
    """A sysfs tree, a /dev and a mount table under `root`, as a node with
    many SAN disks shows them."""

    def __init__(self, root: Path) -> None:
        self.sys_root = root / "sys"
        self.dev_root = root / "dev"
        self.mountinfo = root / "mountinfo"
        self.mounts: list[str] = []  # mounted since the start, as mountinfo lines
        self.disks = 0  # disks made so far (the next one's index)
        for where in ("class/block", "dev/block", "devices/virtual/block", CONTROLLER):
            (self.sys_root / where).mkdir(parents=True)
        (self.sys_root / CONTROLLER / "numa_node").write_text("0\n")
        (self.dev_root / "mapper").mkdir(parents=True)

    def build(self, nodes: int) -> list[str]:
        """The host's disk and `nodes` block nodes in all (one disk more
        where the host's alone reach that); the names of those not
        host-used, which the daemon should list."""
        self.add_disk(partitions=3)
        self._add_root_volume()
        self._write_mountinfo()
        listed: list[str] = []
        made = len(HOST_NODES)
        while made < nodes or not listed:  # one listed disk at least, for the events
            partitions = 2 if self.disks % 4 == 0 and nodes - made >= 3 else 0
            listed += self.add_disk(partitions)
            made += 1 + partitions
        return listed

    def add_disk(self, partitions: int = 0) -> list[str]:
        """A new SCSI disk with its partitions; their names."""
        index = self.disks
        self.disks += 1
        name = sd_name(index)
        major, minor = sd_number(index)
        scsi = f"{CONTROLLER}/host0/target0:0:{index}/0:0:{index}:0"
        (self.sys_root / scsi).mkdir(parents=True)
        (self.sys_root / scsi / "wwid").write_text(f"naa.6005076{index:025x}\n")
        disk = f"{scsi}/block/{name}"
        self._block_device(disk, name, (major, minor), "disk")
        (self.sys_root / disk / "device").symlink_to(f"../../../0:0:{index}:0")
        names = [name]
        for part in range(1, partitions + 1):
            names.append(f"{name}{part}")
            self._block_device(f"{disk}/{name}{part}", names[-1], (major, minor + part), part)
        return names

    def remove_disk(self, name: str) -> None:
        """The disk and its partitions gone: nodes, links and sysfs entries."""
        where = (self.sys_root / "class" / "block" / name).resolve()
        for each in list(self._devices_under(name)):
            number = (self.sys_root / "class" / "block" / each / "dev").read_text().strip()
            os.unlink(self.dev_root / each)
            os.unlink(self.sys_root / "class" / "block" / each)
            os.unlink(self.sys_root / "dev" / "block" / number)
        shutil.rmtree(where.parents[2])  # its SCSI target; links in it are not followed

    def _devices_under(self, disk: str) -> Iterator[str]:
        yield disk
        here = self.sys_root / "class" / "block" / disk
        for entry in os.listdir(here):
            if entry.startswith(disk) and (here / entry / "partition").exists():
                yield entry

    def _block_device(self, rel: str, name: str, number: Number, part: int | str) -> None:
        """sysfs's entry of a block device at devices/`rel`, its links, and its node.
        `part`: the partition number, or "disk"."""
        where = self.sys_root / rel
        where.mkdir(parents=True)
        major, minor = number
        kind = "disk" if part == "disk" else "partition"
        uevent = f"MAJOR={major}\nMINOR={minor}\nDEVNAME={name}\nDEVTYPE={kind}\n"
        if kind == "partition":
            uevent += f"PARTN={part}\n"
            (where / "partition").write_text(f"{part}\n")
        else:
            (where / "slaves").mkdir()
        (where / "holders").mkdir()
        (where / "dev").write_text(f"{major}:{minor}\n")
        (where / "uevent").write_text(uevent)
        (where / "subsystem").symlink_to(os.path.relpath(self.sys_root / "class/block", where))
        for link in (f"class/block/{name}", f"dev/block/{major}:{minor}"):
            at = self.sys_root / link
            at.symlink_to(os.path.relpath(where, at.parent))
        os.mknod(self.dev_root / name, stat.S_IFBLK | 0o660, os.makedev(major, minor))

    def _add_root_volume(self) -> None:
        """dm-0, an LVM logical volume on sda3, holding the root filesystem."""
        rel = "devices/virtual/block/dm-0"
        self._block_device(rel, "dm-0", (DM_MAJOR, 0), "disk")
        dm = self.sys_root / rel
        (dm / "dm").mkdir()
        (dm / "dm" / "name").write_text("rhel-root\n")
        (dm / "dm" / "uuid").write_text("LVM-" + "x" * 64 + "\n")
        pv = (self.sys_root / "class" / "block" / "sda3").resolve()
        (dm / "slaves" / "sda3").symlink_to(os.path.relpath(pv, dm / "slaves"))
        (pv / "holders" / "dm-0").symlink_to(os.path.relpath(dm, pv / "holders"))
        (self.dev_root / "mapper" / "rhel-root").symlink_to("../dm-0")

    def _write_mountinfo(self) -> None:
        """The host's mount table (proc(5)): / on dm-0, /boot on sda2, and
        the pseudo filesystems and container mounts a node has."""
        lines = [
            "1 0 253:0 / / rw,relatime shared:1 - xfs /dev/mapper/rhel-root rw,seclabel,attr2",
            "22 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:2 - sysfs sysfs rw",
            "23 1 0:22 / /proc rw,nosuid,nodev,noexec,relatime shared:3 - proc proc rw",
            "24 1 0:5 / /dev rw,nosuid shared:4 - devtmpfs devtmpfs rw,size=4096k,mode=755",
            "25 24 0:23 / /dev/shm rw,nosuid,nodev shared:5 - tmpfs tmpfs rw,seclabel",
            "26 1 0:24 / /run rw,nosuid,nodev shared:6 - tmpfs tmpfs rw,seclabel,mode=755",
            "60 1 8:2 / /boot rw,relatime shared:29 - xfs /dev/sda2 rw,seclabel,attr2,noquota",
        ]
        for pod in range(20):  # a node's pods: a root overlay and a secret each
            lines.append(
                f"{100 + 2 * pod} 1 0:{60 + 2 * pod} / /var/lib/containers/storage/overlay/"
                f"{pod:064x}/merged rw,nodev,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u"
            )
            lines.append(
                f"{101 + 2 * pod} 1 0:{61 + 2 * pod} / /var/lib/kubelet/pods/{pod:08x}/volumes/"
                "kubernetes.io~projected/kube-api-access rw,relatime - tmpfs tmpfs rw,size=1g"
            )
        self.mountinfo.write_text("\n".join([*lines, *self.mounts]) + "\n")

    def mount(self, name: str | None) -> None:
        """Mount a disk at /mnt/NAME, or with None, a pod's tmpfs volume."""
        at = 1000 + len(self.mounts)
        if name is None:
            self.mounts.append(
                f"{at} 1 0:{at} / /var/lib/kubelet/pods/{at:08x}/volumes/kubernetes.io~empty-dir/"
                "scratch rw,relatime - tmpfs tmpfs rw,size=1g"
            )
        else:
            major, minor = self.number(name)
            self.mounts.append(
                f"{at} 1 {major}:{minor} / /mnt/{name} rw,relatime - xfs /dev/{name} rw,attr2"
            )
        self._write_mountinfo()

    def unmount_all(self) -> None:
        self.mounts.clear()
        self._write_mountinfo()

    def number(self, name: str) -> Number:
        major, minor = (self.sys_root / "class" / "block" / name / "dev").read_text().split(":")
        return int(major), int(minor)


class HandedEvents:
    """The daemon's event source here: batches the bench hands over, one at
    a time. It notes when the follower takes each batch and when it comes
    back for the next one."""

    source = "other"

    def __init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[list[DeviceEvent] | str](math.inf)
        self.taken = 0.0  # time.monotonic() when the follower took the last batch
        self.back = 0.0  # ... and when it asked for the next one
        self._back = trio.Event()

    def hand(self, batch: list[DeviceEvent] | str) -> trio.Event:
        """Hand a batch over; the Trio event returned is set once the
        follower asks for the next batch."""
        self._back = trio.Event()
        self._send.send_nowait(batch)
        return self._back

    async def next_batch(self) -> list[DeviceEvent] | str:
        self.back = time.monotonic()
        self._back.set()
        batch = await self._receive.receive()
        self.taken = time.monotonic()
        return batch

    def ready_batch(self) -> list[DeviceEvent] | str:
        """What Allocate applies first, without waiting (nothing calls Allocate here)."""
        try:
            batch = self._receive.receive_nowait()
        except trio.WouldBlock:
            return []
        self.taken = time.monotonic()
        return batch


class PublishClock(trio.abc.Instrument):
    """The moment the inventory's version changes: the change wakes the one
    task waiting in Inventory.wait_newer (follow_inventory), and Trio tells
    instruments when a task is woken, before it runs."""

    def __init__(self) -> None:
        self.waiter: trio.lowlevel.Task | None = None
        self.woken: float | None = None

    def task_scheduled(self, task: trio.lowlevel.Task) -> None:
        if task is self.waiter:
            self.woken = time.monotonic()


async def follow_inventory(
    inventory: Inventory,
    clock: PublishClock,
    published: trio.MemorySendChannel[tuple[float, Snapshot]],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Send (when it was published, snapshot) for every new version."""
    clock.waiter = trio.lowlevel.current_task()
    seen = inventory.current.version
    task_status.started()
    while True:
        clock.woken = None
        snapshot = await inventory.wait_newer(seen)
        seen = snapshot.version
        # Not woken: it was published before this task waited (never here,
        # since each event waits for the one before to be published).
        published.send_nowait((clock.woken or time.monotonic(), snapshot))


class JsonLines:
    """JSON objects, one a line, over a pair of Trio streams."""

    def __init__(self, receive: trio.abc.ReceiveStream, send: trio.abc.SendStream) -> None:
        self._receive = receive
        self._send = send
        self._buffer = b""

    async def read(self) -> dict[str, object]:
        while b"\n" not in self._buffer:
            data = await self._receive.receive_some()
            if not data:
                raise EOFError("the other side closed the pipe")
            self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)  # type: ignore[no-any-return]

    async def write(self, message: dict[str, object]) -> None:
        await self._send.send_all(json.dumps(message).encode() + b"\n")

    async def ask(self, message: dict[str, object]) -> dict[str, object]:
        await self.write(message)
        return await self.read()


@dataclass
class Run:
    """One run's moving parts: the host, the daemon's event source and
    inventory, and the line to the kubelet (the parent)."""

    host: SyntheticHost
    events: HandedEvents
    published: trio.MemoryReceiveChannel[tuple[float, Snapshot]]
    parent: JsonLines
    profile: cProfile.Profile | None
    host_use: HostUseEvents  # the daemon's own host-use source, read here as it reads
    publications: int = 0  # lists published since the kubelet had the first

    async def publishing(
        self, event: DeviceEvent | str, name: str, present: bool, healthy: bool = True
    ) -> float:
        """Hand over an event that changes the list (the device comes or goes,
        or, listed, turns Unhealthy or Healthy); seconds until it is
        published. Returns once the kubelet has the list."""
        back = self._hand(event)
        with trio.fail_after(PUBLISH_LIMIT):
            at, snapshot = await self.published.receive()
            await back.wait()
        self._stop_profile()
        took = at - self.events.taken
        found = [d.healthy for d in snapshot.devices if d.path == f"/dev/{name}"]
        if found != ([healthy] if present else []):
            raise RuntimeError(f"bench: the list published after {event} is wrong about {name}")
        self.publications += 1
        wait = {"publications": self.publications, "id": name, "present": present}
        wait.update(healthy=healthy, taken=self.events.taken)
        await self.parent.ask({"wait": wait})
        return took

    async def applied(self, event: DeviceEvent | str) -> float:
        """Hand over an event that changes nothing; seconds until the follower
        asks for its next batch."""
        back = self._hand(event)
        with trio.fail_after(PUBLISH_LIMIT):
            await back.wait()
        self._stop_profile()
        took = self.events.back - self.events.taken
        try:
            self.published.receive_nowait()
        except trio.WouldBlock:
            return took
        raise RuntimeError(f"bench: {event} changed nothing, yet a list was published")

    def _hand(self, event: DeviceEvent | str) -> trio.Event:
        if self.profile is not None:
            self.profile.enable()
        return self.events.hand(event if isinstance(event, str) else [event])

    def _stop_profile(self) -> None:
        if self.profile is not None:
            self.profile.disable()


async def cycle(run: Run, changed: str, samples: dict[str, list[float]]) -> None:
    """A disk comes, a listed disk gets a change event, the new disk goes."""
    host = run.host
    names = await trio.to_thread.run_sync(host.add_disk)
    name = names[0]
    number = host.number(name)
    add = DeviceEvent("add", (f"/dev/{name}",), "block", number)
    samples["add"].append(await run.publishing(add, name, present=True))
    change = DeviceEvent("change", (f"/dev/{changed}",), "block", host.number(changed))
    samples["change"].append(await run.applied(change))
    await trio.to_thread.run_sync(host.remove_disk, name)
    remove = DeviceEvent("remove", (f"/dev/{name}",), "block", number)
    samples["remove"].append(await run.publishing(remove, name, present=False))


async def mount_cycle(run: Run, disk: str, samples: dict[str, list[float]]) -> None:
    """A pod's volume is mounted: the host-use source reads the host's
    tables again, in a worker thread, and finds no device's use changed (its
    CPU is timed; the daemon does nothing more). Then a listed disk is
    mounted, and unmounted: each handed over as the source hands it, timed
    to the list published with it Unhealthy, and Healthy again."""
    host, source = run.host, run.host_use
    await trio.to_thread.run_sync(host.mount, None)
    samples["mount elsewhere"].append(await trio.to_thread.run_sync(_cpu_of, source.in_use))
    await trio.to_thread.run_sync(host.mount, disk)
    # listed, it stays listed, Unhealthy: not taken away from a pod that holds it
    samples["mount"].append(await run.publishing(HOST_USE, disk, present=True, healthy=False))
    await trio.to_thread.run_sync(host.unmount_all)
    samples["unmount"].append(await run.publishing(HOST_USE, disk, present=True))


def _cpu_of(call: Callable[[], object]) -> float:
    """Seconds of this thread's CPU that call takes."""
    start = time.thread_time()
    call()
    return time.thread_time() - start


async def child(args: argparse.Namespace) -> None:
    host = SyntheticHost(args.root)
    listed = await trio.to_thread.run_sync(host.build, args.devices)
    config_path = args.root / "config.json"
    config_path.write_text(json.dumps({"permissions": "rw"}))  # every block device
    settings = Settings(
        plugin_dir=args.plugin_dir,
        dev_root=host.dev_root,
        sys_root=host.sys_root,
        uevents="off",
        host_mountinfo=host.mountinfo,
        pod_resources_socket=None,
    )
    host_use = HostUseEvents(host.dev_root, host.mountinfo, None, sys_root=host.sys_root)
    with host_use:
        await _measured(args, host, listed, settings, config_path, host_use)


async def _measured(
    args: argparse.Namespace,
    host: SyntheticHost,
    listed: list[str],
    settings: Settings,
    config_path: Path,
    host_use: HostUseEvents,
) -> None:
    events = HandedEvents()
    clock = PublishClock()
    trio.lowlevel.add_instrument(clock)
    send, receive = trio.open_memory_channel[tuple[float, Snapshot]](math.inf)
    parent = JsonLines(trio.lowlevel.FdStream(os.dup(0)), trio.lowlevel.FdStream(os.dup(1)))
    async with trio.open_nursery() as nursery:
        plugins = await nursery.start(
            partial(supervisor.run, settings, load_config(config_path), events=events)
        )
        (plugin,) = plugins
        await nursery.start(follow_inventory, plugin.inventory, clock, send)
        await parent.ask({"wait": {"devices": len(listed)}})
        profile = cProfile.Profile() if args.profile else None
        run = Run(host, events, receive, parent, profile, host_use)
        disks = [name for name in listed if not name[-1].isdigit()]
        samples: dict[str, list[float]] = {
            what: [] for what in ("add", "remove", "change", "mount elsewhere", "mount", "unmount")
        }
        watch = stepwatch.StepWatch()
        trio.lowlevel.add_instrument(watch)
        try:
            for i in range(args.cycles):
                await cycle(run, disks[i * 7919 % len(disks)], samples)
            for i in range(args.cycles):
                await mount_cycle(run, disks[i * 104729 % len(disks)], samples)
        finally:
            trio.lowlevel.remove_instrument(watch)
        if run.profile is not None:
            run.profile.dump_stats(args.profile)
        await parent.write({"result": {**samples, "listed": len(listed), "steps": watch.report()}})
        nursery.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m powerdev.devtools.uevent_bench",
        description="the child side of `powerdev bench`'s device-event measure (root only)",
    )
    parser.add_argument("--root", type=Path, required=True, help="where to make the host")
    parser.add_argument("--plugin-dir", type=Path, required=True, help="the kubelet's directory")
    parser.add_argument("--devices", type=int, required=True, help="block nodes in all")
    parser.add_argument("--cycles", type=int, required=True, help="add, change, remove cycles")
    parser.add_argument("--profile", type=Path, default=None, help="write cProfile stats here")
    args = parser.parse_args(argv)
    logformat.configure("warning")
    sys.stdout = sys.stderr  # stdout is the line to the parent; nothing else may write there
    trio.run(child, args)


if __name__ == "__main__":
    main()
