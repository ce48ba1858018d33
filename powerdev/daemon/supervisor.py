"""The one supervisor: the root nursery, device event sources, and signals.

run() opens the event sources (netlink uevents and inotify on the device
directories), scans every resource, and supervises in one nursery: a
follower per source, the `time` strategy's rescans, the config reloader
(reload.py), and one re-registration loop per resource (registrar.py).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import signal
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Protocol

import trio

from powerdev.config import Config, ResourceConfig
from powerdev.daemon.registrar import serve_resource
from powerdev.daemon.reload import Reloader
from powerdev.daemon.settings import Settings
from powerdev.devices.dirwatch import DirEvents, watch_levels
from powerdev.devices.discovery import NX_GZIP
from powerdev.devices.events import DeviceEvent
from powerdev.devices.hostuse_events import HostUseEvents
from powerdev.devices.inuse import HostUseGuard
from powerdev.devices.inventory import Inventory
from powerdev.devices.uevents import RESCAN, NetlinkEvents, choose_source
from powerdev.ops import metrics, oplog, opsserver
from powerdev.ops.status import StatusFile
from powerdev.resources import allocation
from powerdev.resources.cdi import SpecWriteError, SpecWriter
from powerdev.resources.matching import start_warnings, why_nothing
from powerdev.resources.ownership import Ledger
from powerdev.resources.plugin import Plugin
from powerdev.resources.tracker import Tracker
from powerdev.rpc import asyncio_door
from powerdev.rpc.podresources import PodResourcesUnavailable, held_ids
from powerdev.support.inotify import Inotify

log = logging.getLogger(__name__)
SWAPS = Path("/proc/swaps")  # swap is not namespaced: a pod's file lists the host's


class EventSource(Protocol):
    source: str  # its label in the metrics: kernel, udev, inotify, host_use, other

    async def next_batch(self) -> list[DeviceEvent] | str: ...

    def ready_batch(self) -> list[DeviceEvent] | str: ...


_device_log = oplog.DeviceLog()


def _log_devices(plugin: Plugin) -> None:
    devices = plugin.inventory.current.devices
    change = _device_log.change(plugin.resource.name, devices)
    if not devices:
        assert plugin.tracker is not None
        tracker = plugin.tracker
        why = why_nothing(plugin.resource, tracker.dev_root, tracker.sys_root)
        log.warning("%s: advertises no device: %s", plugin.resource.name, why)
    elif change is not None:
        log.info("%s: %s", plugin.resource.name, change)


async def scan(plugin: Plugin) -> None:
    """Discover the resource's devices now and publish them if they changed."""
    assert plugin.tracker is not None
    if await plugin.tracker.rescan():
        _log_devices(plugin)


def _levels(plugins: Iterable[Plugin]) -> list[str]:
    patterns: list[str] = []
    for plugin in plugins:
        patterns.extend(plugin.resource.include)
        if plugin.resource.nx_gzip:
            patterns.append(NX_GZIP)
    return watch_levels(patterns)


async def run(
    settings: Settings,
    config: Config,
    *,
    events: EventSource | None = None,
    task_status: trio.TaskStatus[list[Plugin]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve every resource of `config` until cancelled. Device events come
    from `events`, or from a netlink monitor chosen by settings.uevents and
    inotify on the device directories. With settings.config_path, config
    changes (inotify, SIGHUP) are applied as they come, resources added and
    removed included. started() with the running resources once each is
    serving (so not while the kubelet is absent)."""
    kind = "caller" if events is not None else choose_source(settings.uevents)
    oplog.log_start(settings, config, kind)
    for warning in config.warnings:
        log.warning("%s", warning)
    with contextlib.ExitStack() as stack:
        inotify = stack.enter_context(Inotify())  # the daemon's one instance
        dirs = None
        if events is not None:
            sources = [events]
        else:
            dirs = stack.enter_context(DirEvents(settings.dev_root, [], inotify))
            host_use = stack.enter_context(
                HostUseEvents(
                    settings.dev_root, settings.mountinfo, SWAPS, sys_root=settings.sys_root
                )
            )
            sources = [dirs, host_use, *_open_netlink(settings.uevents, stack)]
        async with asyncio_door(), trio.open_nursery() as nursery:
            running = Running(settings, nursery, sources, dirs, inotify)
            stack.enter_context(metrics.serving(running.plugins, running.status))
            metrics.config_loaded()
            # The sources are live before the first scan: nothing falls between them.
            # Start-up makes many objects that live as long as the daemon. No
            # collection runs while it makes them (one would scan them all on
            # the Trio thread: 20 to 30 ms at 10,000 devices, measured), and
            # then they are frozen (a cheap move, no collection), so that no
            # later collection scans them again (the first full one used to
            # land on the first pod's Allocate, tens of ms, measured).
            collecting = gc.isenabled()
            gc.disable()
            try:
                plugins = [await running.prepare(resource) for resource in config.resources]
                gc.freeze()
            finally:
                if collecting:
                    gc.enable()
            if dirs is not None:
                log.info("watching %s for device nodes and links", ", ".join(dirs.watched))
            if settings.metrics_socket is not None:
                await nursery.start(
                    opsserver.serve, settings.metrics_socket, running.plugins, running.status
                )
            # Before any device event is applied: what pods hold now is owned.
            await running.seed_owners()
            for source in sources:
                nursery.start_soon(_follow, source, running.plugins, nursery)
            nursery.start_soon(
                running.ledger.follow_pods, running.held_ids, settings.cdi_recheck_interval
            )
            if settings.config_path is not None:
                reloader = Reloader(settings, running, loaded=config.raw, inotify=inotify)
                await nursery.start(reloader.run)
            async with trio.open_nursery() as starting:  # side by side: one may wait long
                for plugin in plugins:
                    starting.start_soon(partial(running.start, plugin, wait=True))
            task_status.started(running.plugins)


class Running:
    """The resources being served now, each in its own cancel scope, so that a
    reload can add one (scan, serve, register), remove one (its server stops
    and its socket goes) or change one, and leave the others alone."""

    def __init__(
        self,
        settings: Settings,
        nursery: trio.Nursery,
        sources: list[EventSource],
        dirs: DirEvents | None,
        inotify: Inotify | None = None,
    ) -> None:
        self.settings = settings
        self._inotify = inotify
        self.plugins: list[Plugin] = []  # shared with every follower of device events
        self._nursery = nursery
        self._sources = sources
        self._dirs = dirs
        self.status = StatusFile(settings.status_file)
        self._scopes: dict[str, trio.CancelScope] = {}
        # One writer per CDI spec file, kept while the file may name a held
        # device: a resource removed and added again gets the same one back.
        self._writers: dict[str, SpecWriter] = {}
        self._retiring: dict[str, trio.CancelScope] = {}
        self._applied = trio.Event()
        self._unheld: str | None = None  # why the kubelet could not say what pods hold
        self.ledger = Ledger()  # one device, one holder, across the resources

    async def prepare(self, resource: ResourceConfig) -> Plugin:
        """A resource's plugin, scanned and followed, not yet served."""
        settings = self.settings
        inventory = Inventory()
        tracker = Tracker(
            resource,
            inventory,
            settings.dev_root,
            settings.sys_root,
            guard=HostUseGuard(settings.dev_root, settings.sys_root, settings.mountinfo, SWAPS),
            udev=settings.udev,
            ledger=self.ledger,
        )
        spec = self._spec_writer(resource.name)
        plugin = Plugin(resource, inventory, tracker, refresh=self.refresh, spec=spec)
        for line in start_warnings(resource, settings.dev_root):
            log.warning("%s", line)
        self.plugins.append(plugin)
        # Its scope exists from now on, so a reload that removes it before
        # it serves (the kubelet not up yet) cancels it all the same.
        self._scopes[resource.name] = trio.CancelScope()
        self._watch()
        metrics.rescan(resource.name, "start")
        try:
            await scan(plugin)
        except Exception:
            # Not added after all (a reload says "not applied"): nothing of
            # it stays, and a spec it took back from retiring retires again.
            self._drop(plugin, coming_back=False)
            raise
        if not plugin.inventory.current.devices:
            _log_devices(plugin)
        return plugin

    async def start(self, plugin: Plugin, *, wait: bool) -> None:
        """Serve and register it; with wait, return once it is serving.
        One removed by a reload meanwhile is not served."""
        if plugin not in self.plugins:
            return
        if wait:
            await self._nursery.start(self._serve, plugin)
        else:
            self._nursery.start_soon(self._serve, plugin)

    async def add(self, resource: ResourceConfig) -> None:
        log.info("%s: a new resource in the config: serving it", resource.name)
        await self.start(await self.prepare(resource), wait=False)

    def remove(self, plugin: Plugin, *, coming_back: bool = False) -> None:
        """Stop serving it. Its CDI spec stays with its writer: for the same
        resource served anew (`coming_back`: a new socket), or until no pod
        holds what it names."""
        name = plugin.resource.name
        log.info("%s: gone from the config: stopping it and removing its socket", name)
        self._drop(plugin, coming_back=coming_back)
        self.status.forget(name)

    def _drop(self, plugin: Plugin, *, coming_back: bool) -> None:
        name = plugin.resource.name
        self.plugins.remove(plugin)
        self.ledger.detach(name)
        scope = self._scopes.pop(name, None)
        if scope is not None:
            scope.cancel()
        writer = self._writers.get(name)
        if writer is not None and not coming_back:
            self._retiring[name] = scope = trio.CancelScope()
            self._nursery.start_soon(self._retire_spec, writer, plugin.resource, scope)
        self._watch()

    async def rescan(self, plugin: Plugin) -> None:
        await scan(plugin)

    async def reconfigure(self, plugin: Plugin, resource: ResourceConfig) -> None:
        """New settings for a served resource, in force with the list found under them."""
        if await plugin.reconfigure(resource):
            _log_devices(plugin)

    def changed(self) -> None:
        """A config was applied: watch what the patterns name now; wake the
        rescan timers, whose interval may have changed."""
        self._watch()
        self._applied.set()
        self._applied = trio.Event()

    def refresh(self) -> None:
        """Apply every device event queued now, without waiting (Allocate does this first)."""
        for source in self._sources:
            batch = source.ready_batch()
            if batch:
                metrics.events_received(source.source, batch)
                _apply(batch, self.plugins, self._nursery)

    def _spec_writer(self, name: str) -> SpecWriter:
        """The resource's CDI spec writer: the one it had, if it is back in
        the config before its old spec went, else a new one."""
        retiring = self._retiring.pop(name, None)
        if retiring is not None:
            retiring.cancel()
        writer = self._writers.get(name)
        if writer is None:
            writer = SpecWriter(self.settings.cdi_spec_dir, name, self.held_ids)
            self._writers[name] = writer
        return writer

    async def _retire_spec(
        self, writer: SpecWriter, resource: ResourceConfig, scope: trio.CancelScope
    ) -> None:
        """A resource gone from the config: its spec shrinks to what pods
        still hold, asked every cdi_recheck_interval, and goes when that is
        nothing; unless the resource comes back first (scope cancelled)."""
        with scope:
            while True:
                try:
                    await writer.recheck(resource, None)
                except SpecWriteError as err:
                    log.error("%s: %s", resource.name, err)
                if not writer.keeps:
                    break
                await trio.sleep(self.settings.cdi_recheck_interval)
        if self._retiring.get(resource.name) is scope:  # done, and not taken back
            del self._retiring[resource.name]
            del self._writers[resource.name]

    async def held_ids(self) -> dict[str, set[str]] | None:
        """Resource name -> device IDs pods hold, from the kubelet; None when
        it cannot be asked (said once, and once again when it answers)."""
        socket = self.settings.pod_resources_socket
        if socket is None:
            return None
        try:
            held = await held_ids(socket)
        except Exception as err:  # whatever the kubelet or grpclib does, "cannot say" is safe
            if not isinstance(err, PodResourcesUnavailable):
                err = PodResourcesUnavailable(f"{socket}: {type(err).__name__}: {err}")
            if self._unheld is None:
                log.warning(
                    "cannot ask the kubelet which devices pods hold (%s): CDI specs keep "
                    "every device they named, and a device granted as one unit and back "
                    "as another stays Unhealthy, until it answers",
                    err,
                )
            self._unheld = str(err)
            return None
        if self._unheld is not None:
            log.info("the kubelet's PodResources API answers again")
            self._unheld = None
        return held

    async def seed_owners(self) -> None:
        """What pods held before this daemon started is what the kubelet
        says now: those units' devices are owned as if granted here, so a
        device that changes while held waits. Asked once, at start, before
        device events are applied (at most the PodResources timeout)."""
        socket = self.settings.pod_resources_socket
        held = None
        if socket is not None and not await trio.Path(socket).exists():
            log.info(
                "no PodResources socket at %s (yet): a device that changes while a pod "
                "holds it waits until the kubelet can be asked",
                socket,
            )
        else:
            held = await self.held_ids()
        if held is not None:
            for plugin in self.plugins:
                ids = held.get(plugin.resource.name, set())
                if not ids:
                    continue
                devices = plugin.inventory.current.devices
                if plugin.resource.allocation != "each":
                    self.ledger.granted(plugin.resource.name, None, devices)
                    continue
                by_unit = allocation.by_unit(devices)
                for unit in ids:
                    self.ledger.granted(plugin.resource.name, unit, by_unit.get(unit, ()))

    def _watch(self) -> None:
        if self._dirs is not None:
            self._dirs.watch(_levels(self.plugins))

    async def _serve(
        self, plugin: Plugin, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        writer = plugin.spec
        assert writer is not None  # prepare() gives every plugin of the daemon one
        scope = self._scopes.get(plugin.resource.name)
        if scope is None or plugin not in self.plugins:
            task_status.started()
            return  # removed before it was served
        with scope:
            async with trio.open_nursery() as resource:
                resource.start_soon(_keep_spec, writer, plugin, self.settings.cdi_recheck_interval)
                resource.start_soon(_rescan_every, plugin, lambda: self._applied)
                await resource.start(
                    partial(
                        serve_resource,
                        self.settings.plugin_dir,
                        plugin,
                        self.status,
                        inotify=self._inotify,
                    )
                )
                task_status.started()
                task_status = trio.TASK_STATUS_IGNORED
        # Here only when a reload removed it (its scope cancelled), perhaps
        # before it ever served (no kubelet yet, or its socket still held by
        # another plugin): whoever waits for it to serve waits no more.
        task_status.started()


def _open_netlink(wanted: str, stack: contextlib.ExitStack) -> list[EventSource]:
    """The netlink monitor chosen by settings.uevents, or none. No subsystem
    filter: include patterns may name any character device, and may change."""
    if wanted == "off":
        return []
    kind = choose_source(wanted)
    try:
        source = stack.enter_context(NetlinkEvents(kind))
    except OSError as err:
        log.warning("no device events (%s uevents: %s): devices change only on rescans", kind, err)
        return []
    log.info("following %s device events", kind)
    return [source]


def _apply(batch: list[DeviceEvent] | str, plugins: list[Plugin], nursery: trio.Nursery) -> None:
    """Apply one batch to every resource; a RESCAN batch starts rescans."""
    for plugin in plugins:
        assert plugin.tracker is not None
        if batch == RESCAN:
            metrics.rescan(plugin.resource.name, "event")
            nursery.start_soon(scan, plugin)
        elif plugin.tracker.apply(batch):  # type: ignore[arg-type]
            _log_devices(plugin)


async def _keep_spec(writer: SpecWriter, plugin: Plugin, interval: float) -> None:
    """The CDI spec follows every change of the resource's list (a changed
    config publishes anew too); while it keeps devices only because pods may
    hold them, the kubelet is asked again every `interval` seconds. The file
    stays when the daemon stops: the next one reads it back."""
    seen = 0
    while True:
        snapshot = None
        with trio.move_on_after(interval if writer.keeps else math.inf):
            snapshot = await plugin.inventory.wait_newer(seen)
        try:
            if snapshot is None:
                await writer.recheck(plugin.resource, plugin.inventory.current)
            else:
                seen = snapshot.version
                await writer.ensure(plugin.resource, snapshot)
        except SpecWriteError as err:
            log.error("%s: %s; Allocate will try again", plugin.resource.name, err)


async def _follow(events: EventSource, plugins: list[Plugin], nursery: trio.Nursery) -> None:
    """Apply each batch of device events to every resource, at once."""
    while True:
        batch = await events.next_batch()
        metrics.events_received(events.source, batch)
        _apply(batch, plugins, nursery)


async def _rescan_every(plugin: Plugin, applied: Callable[[], trio.Event]) -> None:
    """discovery-strategy "time": a full rescan every scan-interval, as a
    safety net. Picks up a changed strategy or interval when a config applies."""
    while True:
        resource = plugin.resource
        with trio.move_on_after(
            resource.scan_interval if resource.strategy == "time" else math.inf
        ) as waited:
            await applied().wait()
        if waited.cancelled_caught:
            metrics.rescan(plugin.resource.name, "interval")
            await scan(plugin)


async def run_until_signalled(main: Callable[[], Awaitable[object]]) -> None:
    """Run main until it ends, or until SIGTERM or SIGINT, then unwind cleanly."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                async for signum in signals:
                    log.info("received %s: stopping", signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(stop_on_signal)
            await main()
            nursery.cancel_scope.cancel()
