"""The one supervisor: the root nursery, device event sources, and signals.

run() opens the event sources (netlink uevents and inotify on the device
directories), scans every resource, and supervises in one nursery: a
follower per source, the `time` strategy's rescans, the config reloader
(reload.py), and one re-registration loop per resource (registrar.py).
Its neighbours keep what outlives one resource's registration: the CDI
spec writers (specs.py) and what pods hold, as the kubelet says (pods.py).
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
from powerdev.daemon.dra import DraDriver
from powerdev.daemon.pods import PodsHold, hold_at_start
from powerdev.daemon.registrar import serve_resource
from powerdev.daemon.reload import Reloader
from powerdev.daemon.settings import Settings
from powerdev.daemon.specs import SpecWriters
from powerdev.devices.dirwatch import DirEvents, watch_levels
from powerdev.devices.discovery import NX_GZIP
from powerdev.devices.events import DeviceEvent
from powerdev.devices.hostuse_events import HOST_USE, HostUseEvents
from powerdev.devices.inventory import Inventory
from powerdev.devices.table import Changes, DeviceTable, HostFiles
from powerdev.devices.uevents import RESCAN, NetlinkEvents, choose_source
from powerdev.ops import metrics, oplog, opsserver
from powerdev.ops.status import StatusFile
from powerdev.resources.matching import start_warnings, why_nothing
from powerdev.resources.ownership import Ledger
from powerdev.resources.plugin import Plugin
from powerdev.resources.tracker import Tracker, apply_events
from powerdev.rpc import asyncio_door
from powerdev.support.inotify import Inotify

log = logging.getLogger(__name__)
SWAPS = Path("/proc/swaps")  # swap is not namespaced: a pod's file lists the host's


class EventSource(Protocol):
    source: str  # its label in the metrics: kernel, udev, inotify, host_use, other

    async def next_batch(self) -> list[DeviceEvent] | str: ...

    def ready_batch(self) -> list[DeviceEvent] | str: ...


_device_log = oplog.DeviceLog()
_logged: dict[int, int] = {}  # id of a plugin -> the inventory version last logged
_first_pending: set[int] = set()  # ids of plugins whose first line is being made


def _log_devices(plugin: Plugin) -> None:
    if id(plugin) in _first_pending:
        return  # its first line comes first; what changes meanwhile follows it
    inventory = plugin.inventory
    _logged[id(plugin)] = inventory.version
    listed = inventory.by_path
    change = _device_log.follow(plugin.resource.name, listed, inventory.take_paths_changed())
    if not listed:
        assert plugin.tracker is not None
        tracker = plugin.tracker
        why = why_nothing(plugin.resource, tracker.dev_root, tracker.sys_root)
        log.warning("%s: advertises no device: %s", plugin.resource.name, why)
    elif change is not None:
        log.info("%s: %s", plugin.resource.name, change)


async def _log_first_devices(plugin: Plugin) -> None:
    """_log_devices for a resource's first list: its names put in natural
    order in a worker thread (15 ms of the Trio thread at 10,000 devices)."""
    inventory = plugin.inventory
    listed = inventory.by_path
    if not listed:
        _log_devices(plugin)
        return
    _logged[id(plugin)] = inventory.version
    inventory.take_paths_changed()
    first = _device_log.begin(plugin.resource.name, listed)
    _first_pending.add(id(plugin))
    try:
        line = await trio.to_thread.run_sync(oplog.describe_change, None, first)
        log.info("%s: %s", plugin.resource.name, line)
    finally:
        _first_pending.discard(id(plugin))
    if inventory.version != _logged.get(id(plugin)):
        _log_devices(plugin)  # what changed while the first line was made


async def scan(plugin: Plugin) -> None:
    """Discover the resource's devices now and publish them if they changed."""
    assert plugin.tracker is not None
    if await plugin.tracker.rescan():
        if _device_log.knows(plugin.resource.name):
            _log_devices(plugin)
        else:
            await _log_first_devices(plugin)


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
        async with (
            contextlib.AsyncExitStack() as closing,  # closed once the nursery has ended
            asyncio_door(),
            trio.open_nursery() as nursery,
        ):
            running = Running(settings, nursery, sources, dirs, inotify, closing)
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
            # Before any device event is applied: what is listed now counts as
            # held until the kubelet says what pods hold (it is asked at once;
            # with no PodResources socket configured there is no one to ask).
            # A resource served through DRA alone: what pods got of its devices
            # through the device plugin API before, as the kubelet says now
            # (nothing when it cannot say).
            if running.pods.socket is not None:
                held_now = None
                if any(not p.resource.device_plugin for p in running.plugins):
                    held_now = await running.pods.held_ids()
                await hold_at_start(running.plugins, running.ledger, held_now=held_now)
            await running.dra.resume()  # and what claims hold, before any Allocate
            for source in sources:
                nursery.start_soon(_follow, source, running, nursery)
            if settings.health_interval > 0:
                nursery.start_soon(_recheck_health, running, settings.health_interval)
            nursery.start_soon(
                running.ledger.follow_pods, running.pods.held_ids, settings.cdi_recheck_interval
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
        closing: contextlib.AsyncExitStack | None = None,
    ) -> None:
        self.settings = settings
        self._inotify = inotify
        self.plugins: list[Plugin] = []  # shared with every follower of device events
        self._nursery = nursery
        self._sources = sources
        self._dirs = dirs
        self.status = StatusFile(settings.status_file)
        self._scopes: dict[str, trio.CancelScope] = {}
        self.pods = PodsHold(settings.pod_resources_socket)
        self._applied = trio.Event()
        # the node's devices, and one holder for each, across the resources and APIs
        self.table = DeviceTable(
            settings.dev_root,
            settings.sys_root,
            udev=settings.udev,
            host=HostFiles(settings.mountinfo, SWAPS),
        )
        self.specs = SpecWriters(
            settings.cdi_spec_dir,
            self.pods.held_ids,
            settings.cdi_recheck_interval,
            nursery,
            self.table,
        )
        self.ledger = Ledger(self.table)
        self.dra = DraDriver(
            settings.dra,
            settings.cdi_spec_dir,
            lambda: self.plugins,
            nursery,
            closing or contextlib.AsyncExitStack(),
            self.status,
            self.ledger,
            self.table,
        )

    async def prepare(self, resource: ResourceConfig) -> Plugin:
        """A resource's plugin, scanned and followed, not yet served."""
        settings = self.settings
        inventory = Inventory()
        tracker = Tracker(
            resource,
            inventory,
            settings.dev_root,
            settings.sys_root,
            table=self.table,
            ledger=self.ledger,
            on_survey=partial(self._others_follow, resource.name),
        )
        spec = self.specs.writer(resource.name)
        plugin = Plugin(resource, inventory, tracker, refresh=self.refresh, spec=spec)
        for line in start_warnings(resource, settings.dev_root):
            log.warning("%s", line)
        self.plugins.append(plugin)
        # Its scope exists from now on, so a reload that removes it before
        # it serves (the kubelet not up yet) cancels it all the same.
        self._scopes[resource.name] = trio.CancelScope()
        self._watch()
        metrics.resource_served(resource.name)
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

    def _others_follow(self, name: str, changes: Changes) -> None:
        """A survey for one resource changed the table: the others follow."""
        for plugin in list(self.plugins):
            if plugin.resource.name != name and plugin.tracker is not None:
                if plugin.tracker.follow(changes):
                    _log_devices(plugin)

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
        assert plugin.tracker is not None
        plugin.tracker.detach()  # a rescan of it still running publishes nothing
        scope = self._scopes.pop(name, None)
        if scope is not None:
            scope.cancel()
        if not coming_back:
            self.specs.retire(plugin.resource)
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

    def _watch(self) -> None:
        if self._dirs is not None:
            self._dirs.watch(_levels(self.plugins))

    async def _serve(
        self, plugin: Plugin, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        scope = self._scopes.get(plugin.resource.name)
        if scope is None or plugin not in self.plugins:
            task_status.started()
            return  # removed before it was served
        with scope:
            async with trio.open_nursery() as resource:
                resource.start_soon(_rescan_every, plugin, lambda: self._applied)
                if plugin.resource.dra:  # ResourceSlices and claims
                    await resource.start(self.dra.publish, plugin)
                if plugin.resource.device_plugin:  # its socket and registration
                    resource.start_soon(self.specs.keep, plugin)
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


def _apply(batch: list[DeviceEvent] | str, running: Running, nursery: trio.Nursery) -> None:
    """Apply one batch to the node's device table once, then to every
    resource; a RESCAN batch starts rescans, a HOST_USE one reads the host's
    tables again."""
    plugins = list(running.plugins)
    trackers = [p.tracker for p in plugins if p.tracker is not None]
    if batch == RESCAN:
        for plugin in plugins:
            metrics.rescan(plugin.resource.name, "event")
            nursery.start_soon(scan, plugin)
        return
    if batch == HOST_USE:
        changes = running.table.host_tables_changed()
    else:
        changes = apply_events(running.table, batch, trackers)  # type: ignore[arg-type]
    _spread(changes, running)


def _spread(changes: Changes, running: Running) -> None:
    """What changed in the node's table, to every resource and the ledger."""
    plugins = list(running.plugins)
    for plugin in plugins:
        if plugin.tracker is not None:
            plugin.tracker.follow(changes)
    running.ledger.settle()
    for plugin in plugins:  # whatever changed it: the table, or the ledger's rulings
        if plugin.inventory.version != _logged.get(id(plugin)):
            _log_devices(plugin)


async def _recheck_health(running: Running, interval: float) -> None:
    """Every `interval` seconds, what each device says of its own health,
    read again (condition.py): some of it changes without a device event."""
    while True:
        await trio.sleep(interval)
        changes = await running.table.recheck()
        if changes:
            _spread(changes, running)


async def _follow(events: EventSource, running: Running, nursery: trio.Nursery) -> None:
    """Apply each batch of device events to the node, at once."""
    while True:
        batch = await events.next_batch()
        metrics.events_received(events.source, batch)
        _apply(batch, running, nursery)


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
