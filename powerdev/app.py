"""The one supervisor: the root nursery, signals, and the re-registration loop.

For each resource, a loop runs one *registration* per pass: wait for
kubelet.sock, serve on a fresh socket, Register (retried with backoff), then
wait until the kubelet restarts (inotify: our socket deleted, kubelet.sock
created again) or the kubelet's ListAndWatch stream ends. Then the
registration's nursery is cancelled, which stops the old server and removes
its socket before the next pass registers again.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

import trio

from powerdev.config import Config, ConfigError, ResourceConfig, decode_config, parse_config
from powerdev.configwatch import ConfigWatch
from powerdev.devices.inventory import Inventory
from powerdev.devices.linkdirs import LinkDirEvents, link_dirs
from powerdev.devices.tracker import DeviceEvent, Tracker
from powerdev.devices.uevents import RESCAN, NetlinkEvents, choose_source
from powerdev.kubelet.paths import DEFAULT_PLUGIN_DIR
from powerdev.kubelet.watch import DirectoryGone, PluginDirWatch
from powerdev.plugin import Plugin
from powerdev.rpc import Answers, PluginService, RegisterError, asyncio_door, register, serve
from powerdev.status import StatusFile

log = logging.getLogger(__name__)

REGISTER_BACKOFF = (0.05, 5.0)  # first and longest wait between Register attempts
STREAM_END_BACKOFF = (0.1, 5.0)  # before Register, after repeated quick stream ends
STABLE_AFTER = 10.0  # a registration that lived this long resets the stream-end backoff
STREAM_ENDED = "the kubelet's ListAndWatch stream ended"


@dataclass(frozen=True)
class Settings:
    plugin_dir: Path = Path(DEFAULT_PLUGIN_DIR)
    dev_root: Path = Path("/dev")
    sys_root: Path = Path("/sys")
    uevents: str = "auto"  # "auto", "udev", "kernel", or "off" (rescans only)
    status_file: Path | None = None  # for `powerdev health`
    config_path: Path | None = None  # watched and reloaded when set


class EventSource(Protocol):
    async def next_batch(self) -> list[DeviceEvent] | str: ...


def _log_devices(plugin: Plugin) -> None:
    devices = plugin.inventory.current.devices
    unhealthy = [d.path for d in devices if not d.healthy]
    log.info(
        "%s: %d devices: %s%s",
        plugin.resource.name,
        len(devices),
        _summary([d.path for d in devices]),
        f"; Unhealthy (another device now under the name): {_summary(unhealthy)}"
        if unhealthy
        else "",
    )


def scan(plugin: Plugin) -> None:
    """Discover the resource's devices now and publish them if they changed."""
    assert plugin.tracker is not None
    if plugin.tracker.rescan():
        _log_devices(plugin)


async def run(
    settings: Settings,
    config: Config,
    *,
    events: EventSource | None = None,
    task_status: trio.TaskStatus[list[Plugin]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve every resource of `config` until cancelled. Device events come
    from `events`, or from a netlink monitor chosen by settings.uevents, and
    from the link directories the patterns name. With settings.config_path,
    config changes (inotify, SIGHUP) are applied as they come. started()
    once every resource is serving (so not while the kubelet is absent)."""
    for warning in config.warnings:
        log.warning("%s", warning)
    status = StatusFile(settings.status_file)
    plugins = []
    for resource in config.resources:
        inventory = Inventory()
        tracker = Tracker(resource, inventory, settings.dev_root, settings.sys_root)
        plugins.append(Plugin(resource, inventory, tracker))
    with contextlib.ExitStack() as stack:
        links = None
        if events is not None:
            sources = [events]
        else:
            links = stack.enter_context(LinkDirEvents(settings.dev_root, []))
            sources = [links, *_open_netlink(settings.uevents, stack)]
        reloader = Reloader(settings, plugins, links)
        reloader.watch_links()
        # The sources are live before the first scan: nothing falls between them.
        for plugin in plugins:
            scan(plugin)
        async with asyncio_door(), trio.open_nursery() as nursery:
            for source in sources:
                nursery.start_soon(_follow, source, plugins)
            for plugin in plugins:
                nursery.start_soon(_rescan_every, plugin, reloader)
            if settings.config_path is not None:
                await nursery.start(reloader.run)
            for plugin in plugins:
                await nursery.start(serve_resource, settings, plugin, status)
            task_status.started(plugins)


class Reloader:
    """Applies a changed config.json to the running resources. A bad file is
    logged (file, field, fix) and the last good config stays in force."""

    def __init__(
        self, settings: Settings, plugins: list[Plugin], links: LinkDirEvents | None
    ) -> None:
        self.settings = settings
        self.plugins = plugins
        self.links = links
        self._changed = trio.Event()
        self._last_seen: bytes | None = None

    async def wait_applied(self) -> None:
        await self._changed.wait()

    def watch_links(self) -> None:
        if self.links is not None:
            added = self.links.watch(link_dirs(p for x in self.plugins for p in x.resource.include))
            if added:
                log.info("watching %s for links", ", ".join(added))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        assert self.settings.config_path is not None
        with (
            ConfigWatch(self.settings.config_path) as watch,
            trio.open_signal_receiver(signal.SIGHUP) as hangups,
        ):
            task_status.started()
            async with trio.open_nursery() as nursery:

                async def on_hangup() -> None:
                    async for _ in hangups:
                        log.info("received SIGHUP: reading %s again", self.settings.config_path)
                        self.reload()

                nursery.start_soon(on_hangup)
                while True:
                    await watch.wait_for_change()
                    self.reload()

    def reload(self) -> bool:
        """Read the config again and apply what changed; False if it was bad.
        Acts once per new content: a ConfigMap swap arrives as several events."""
        path = self.settings.config_path
        assert path is not None
        try:
            seen: bytes | None = path.read_bytes()
        except FileNotFoundError:
            seen = None
        except OSError as err:
            seen = f"unreadable: {err}".encode()
        if seen == self._last_seen:
            return True
        self._last_seen = seen
        if seen is None:
            log.warning("%s is gone; the last good config stays in force", path)
            return False
        first = self.plugins[0].resource
        try:
            config = parse_config(
                decode_config(seen, str(path)),
                source=str(path),
                resource_name=first.name,
                socket_name=first.socket,
            )
        except ConfigError as err:
            log.error("config not applied, the last good one stays in force: %s", err)
            return False
        for warning in config.warnings:
            log.warning("%s", warning)
        for plugin, resource in zip(self.plugins, config.resources, strict=True):
            if resource != plugin.resource:
                _apply(plugin, resource)
                self._changed.set()
                self._changed = trio.Event()
        self.watch_links()
        return True


def _apply(plugin: Plugin, resource: ResourceConfig) -> None:
    old = plugin.resource
    changes = ", ".join(
        f"{name} {getattr(old, name)!r} -> {getattr(resource, name)!r}"
        for name in resource.__dataclass_fields__
        if getattr(old, name) != getattr(resource, name)
    )
    log.info("%s: config applied: %s", resource.name, changes)
    plugin.resource = resource
    assert plugin.tracker is not None
    plugin.tracker.resource = resource
    if plugin.tracker.rescan():
        _log_devices(plugin)
    elif resource.upper_limit != old.upper_limit:
        plugin.inventory.publish(plugin.inventory.current.devices, force=True)


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


async def _follow(events: EventSource, plugins: list[Plugin]) -> None:
    """Apply each batch of device events to every resource, at once."""
    while True:
        batch = await events.next_batch()
        for plugin in plugins:
            assert plugin.tracker is not None
            changed = plugin.tracker.rescan() if batch == RESCAN else plugin.tracker.apply(batch)
            if changed:
                _log_devices(plugin)


async def serve_resource(
    settings: Settings,
    plugin: Plugin,
    status: StatusFile | None = None,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The re-registration loop for one resource; started() when first serving."""
    status = status or StatusFile(None)
    socket_path = settings.plugin_dir / plugin.resource.socket

    def report(state: str) -> None:
        status.set(plugin.resource.name, state, socket_path)

    def serving() -> None:
        nonlocal task_status
        task_status.started()
        task_status = trio.TASK_STATUS_IGNORED

    failures = 0
    while True:
        try:
            with PluginDirWatch(settings.plugin_dir, plugin.resource.socket) as watch:
                await _registrations(plugin, watch, socket_path, serving, report)
        except* DirectoryGone as group:
            log.warning("%s: %s; watching it again", plugin.resource.name, group.exceptions[0])
        except* OSError as group:
            # A socket or directory that a kubelet changed under our feet:
            # never a reason to exit, which would cost a pod restart.
            failures += 1
            delay = min(REGISTER_BACKOFF[1], REGISTER_BACKOFF[0] * 2 ** min(failures, 10))
            log.error(
                "%s: %s; trying again in %.2fs", plugin.resource.name, group.exceptions[0], delay
            )
            await trio.sleep(delay)


async def _registrations(
    plugin: Plugin,
    watch: PluginDirWatch,
    socket_path: Path,
    serving: Callable[[], None],
    report: Callable[[str], None],
) -> None:
    """One registration per pass: serve, Register, wait for a reason to redo it."""
    resource = plugin.resource
    answers = Answers(plugin)  # encoded replies, kept across registrations
    quick_ends = 0  # registrations in a row whose stream the kubelet ended quickly
    while True:
        if not watch.kubelet_socket.exists():
            log.info("waiting for the kubelet: %s does not exist yet", watch.kubelet_socket)
            report("waiting")
        if socket_answers(socket_path):
            # Never take a socket from a live server (a second powerdev, say,
            # in a rolling update): wait until it is gone, then serve.
            log.error(
                "%s: another server answers on %s; waiting until it goes away",
                resource.name,
                socket_path,
            )
            report("waiting")
            reason = await watch.wait_for_restart()
            log.info("%s: %s; serving", resource.name, reason)
            continue
        socket_path.unlink(missing_ok=True)  # noqa: ASYNC240 (one local directory entry)
        new_kubelet = await watch.wait_for_kubelet()
        service = PluginService(plugin, answers)
        began = trio.current_time()
        # A kubelet that keeps ending our stream (say, another plugin took the
        # resource) gets Register with backoff; a kubelet that started anew, at once.
        delay = 0.0 if new_kubelet else _stream_end_delay(quick_ends)
        async with trio.open_nursery() as registration:
            await registration.start(serve, socket_path, [service])
            log.info("%s: serving on %s", resource.name, socket_path)
            serving()
            report("serving")

            registration.start_soon(
                _register_until_done, watch.kubelet_socket, resource, delay, report
            )
            registration.start_soon(_warm_allocate, service, answers, plugin)

            reason = await _first_of(watch.wait_for_restart, partial(_stream_end, service))
            registration.cancel_scope.cancel()
        log.info("%s: %s; serving and registering again", resource.name, reason)
        quick = trio.current_time() - began < STABLE_AFTER
        quick_ends = quick_ends + 1 if reason == STREAM_ENDED and quick and not new_kubelet else 0


def socket_answers(path: Path) -> bool:
    """Does a server accept connections on this unix socket right now?"""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    try:
        probe.connect(str(path))
    except BlockingIOError:
        return True  # alive, with a full backlog
    except OSError:
        return False  # no file, not a socket, or nobody listening (a stale file)
    else:
        return True
    finally:
        probe.close()


async def _warm_allocate(service: PluginService, answers: Answers, plugin: Plugin) -> None:
    """Once the kubelet has its first list, encode Allocate's answer, so that
    the first pod's admission does not pay for it."""
    await service.kubelet_list_sent.wait()
    answers.allocate(plugin.allocate([[]]))


async def _stream_end(service: PluginService) -> str:
    await service.kubelet_stream_ended.wait()
    return STREAM_ENDED


def _stream_end_delay(quick_ends: int) -> float:
    """No wait after one quick stream end; then doubling, up to a bound."""
    first, longest = STREAM_END_BACKOFF
    return 0.0 if quick_ends < 2 else min(longest, first * 2 ** (quick_ends - 2))


async def _register_until_done(
    kubelet_socket: Path,
    resource: ResourceConfig,
    first_delay: float = 0.0,
    report: Callable[[str], None] = lambda state: None,
) -> None:
    """Register, retrying with backoff; each change of outcome is logged once."""
    await trio.sleep(first_delay)
    delay, longest = REGISTER_BACKOFF
    last_error = None
    while True:
        try:
            await register(kubelet_socket, resource.socket, resource.name)
        except RegisterError as err:
            if str(err) != last_error:
                log.warning(
                    "%s: Register failed: %s (retrying with backoff up to %.0fs)",
                    resource.name,
                    err,
                    longest,
                )
                last_error = str(err)
            await trio.sleep(delay)
            delay = min(longest, delay * 2)
            continue
        log.info("%s: registered with the kubelet", resource.name)
        report("registered")
        return


async def _first_of(*waiters: Callable[[], Awaitable[str]]) -> str:
    """Run the waiters together; return what the first to finish returns."""
    results: list[str] = []
    async with trio.open_nursery() as nursery:

        async def one(waiter: Callable[[], Awaitable[str]]) -> None:
            results.append(await waiter())
            nursery.cancel_scope.cancel()

        for waiter in waiters:
            nursery.start_soon(one, waiter)
    return results[0]


async def _rescan_every(plugin: Plugin, reloader: Reloader) -> None:
    """discovery-strategy "time": a full rescan every scan-interval, as a
    safety net. Picks up a changed strategy or interval when a config applies."""
    while True:
        with trio.move_on_after(
            plugin.resource.scan_interval if plugin.resource.strategy == "time" else math.inf
        ) as waited:
            await reloader.wait_applied()
        if waited.cancelled_caught:
            scan(plugin)


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


def _summary(names: list[str], most: int = 8) -> str:
    shown = ", ".join(names[:most])
    return shown + (f", ... and {len(names) - most} more" if len(names) > most else "")
