"""Applying a changed config.json to the running resources.

The file is read again on inotify events in its directory (a ConfigMap's
`..data` swap included) and on SIGHUP; it is acted on once per new content.
A bad file is logged (file, field, fix) and the last good config stays in
force. SIGHUP also rescans every resource, even when the file is unchanged.

One field is not applied while running: lowering `upper-limit`, or
switching between 0 (one unit per device) and N (shares). The kubelet has
checkpointed the unit IDs that running pods hold, and a new set of IDs
would not count them, so more pods than the limit could hold the resource.
Raising N keeps every old ID and is applied at once.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Protocol

import trio

from powerdev.config import (
    Config,
    ConfigError,
    ResourceConfig,
    decode_config,
    parse_config,
    read_config_bytes,
    socket_path_problem,
)
from powerdev.config.watch import ConfigWatch
from powerdev.ops import metrics, oplog
from powerdev.resources.ownership import check_devices
from powerdev.resources.plugin import Plugin
from powerdev.support.inotify import Inotify

if TYPE_CHECKING:
    from powerdev.daemon.settings import Settings

log = logging.getLogger(__name__)


class Resources(Protocol):
    """What the supervisor offers a reload (app.Running)."""

    plugins: list[Plugin]

    async def rescan(self, plugin: Plugin) -> None: ...

    async def reconfigure(self, plugin: Plugin, resource: ResourceConfig) -> None: ...

    async def add(self, resource: ResourceConfig) -> None: ...

    def remove(self, plugin: Plugin, *, coming_back: bool = False) -> None: ...

    def changed(self) -> None: ...


class Reloader:
    def __init__(
        self,
        settings: Settings,
        running: Resources,
        *,
        loaded: bytes | None = None,
        inotify: Inotify | None = None,
    ) -> None:
        assert settings.config_path is not None
        self._inotify = inotify
        self.config_path = settings.config_path
        self.settings = settings
        self.running = running
        self._last_seen: bytes | None = loaded  # what the running config was read from
        self._lock = trio.Lock()  # SIGHUP and inotify may both ask at once: one at a time

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with (
            ConfigWatch(self.config_path, self._inotify) as watch,
            trio.open_signal_receiver(signal.SIGHUP) as hangups,
        ):
            task_status.started()
            async with trio.open_nursery() as nursery:

                async def on_hangup() -> None:
                    async for _ in hangups:
                        log.info(
                            "received SIGHUP: reading %s again and rescanning devices",
                            self.config_path,
                        )
                        await self.reload()
                        for plugin in list(self.running.plugins):
                            metrics.rescan(plugin.resource.name, "sighup")
                            await self.running.rescan(plugin)

                nursery.start_soon(on_hangup)
                while True:
                    await watch.wait_for_change()
                    await self.reload()

    async def reload(self) -> bool:
        """Read the config again and apply what changed; False if it was bad."""
        async with self._lock:
            return await self._reload()

    async def _reload(self) -> bool:
        try:
            config = await self._checked_config()
        except _Refused as refused:
            log.log(refused.level, "%s", refused)
            metrics.config_rejected()
            return False
        if config is None:
            return True  # the same bytes as last time: nothing to do
        for warning in config.warnings:
            log.warning("%s", warning)
        await self._apply_config(config)
        self.running.changed()
        metrics.config_applied()
        return True

    async def _checked_config(self) -> Config | None:
        """The file's config, checked as at start; None if the file has not
        changed; _Refused, saying why, if it must not be applied."""
        path = self.config_path
        try:
            seen: bytes | None = read_config_bytes(path)
        except FileNotFoundError:
            seen = None
        except (OSError, ConfigError) as err:
            self._last_seen = None
            raise _Refused.keeping(f"{path}: cannot be read ({err})") from None
        if seen == self._last_seen:
            return None
        self._last_seen = seen
        if seen is None:
            raise _Refused.keeping(f"{path} is gone")
        if not seen.strip():
            # Empty at start means IBM's plugin's defaults; empty now is a file
            # caught in the middle of a write, or emptied by mistake.
            raise _Refused.keeping(f"{path} is empty")
        try:
            config = parse_config(
                decode_config(seen, str(path)),
                source=str(path),
                resource_name=self.settings.resource_name,
                socket_name=self.settings.socket_name,
            )
        except ConfigError as err:
            raise _Refused.bad(str(err)) from None
        except Exception as err:  # a hole in validation must never end the daemon
            raise _Refused.bad(f"{path}: {type(err).__name__}: {err}") from None
        for resource in config.resources:
            problem = socket_path_problem(self.settings.plugin_dir, resource.socket)
            if problem:
                raise _Refused.bad(f"{path}: {problem}; use shorter socket names")
        settings = self.settings
        try:
            await trio.to_thread.run_sync(
                partial(check_devices, config, settings.dev_root, settings.sys_root, settings.udev)
            )
        except ConfigError as err:
            raise _Refused.bad(str(err)) from None
        return config

    async def _apply_config(self, config: Config) -> None:
        """Resource by resource: gone ones stop, new ones start, changed
        ones change; one that fails is said and the others go on."""
        wanted = {r.name: r for r in config.resources}
        for plugin in list(self.running.plugins):
            resource = wanted.get(plugin.resource.name)
            if resource is None or (resource.socket, resource.api) != (
                plugin.resource.socket,
                plugin.resource.api,
            ):
                # A new socket, or the other API: served anew below, with the
                # same CDI spec.
                self.running.remove(plugin, coming_back=resource is not None)
        serving = {p.resource.name: p for p in self.running.plugins}
        for name, resource in wanted.items():
            plugin = serving.get(name)
            try:
                if plugin is None:
                    await self.running.add(resource)
                    continue
                resource = _keep_unit_model(plugin.resource, resource, str(self.config_path))
                if resource != plugin.resource:
                    await self._apply(plugin, resource)
            except Exception as err:  # say, a device path the kernel refuses to stat
                log.error("%s: not applied: %s: %s", name, type(err).__name__, err)

    async def _apply(self, plugin: Plugin, resource: ResourceConfig) -> None:
        old = plugin.resource
        log.info("%s: config applied: %s", resource.name, oplog.describe_changes(old, resource))
        metrics.rescan(resource.name, "config")
        await self.running.reconfigure(plugin, resource)
        # What is advertised or granted for the same devices may have changed
        # (units, permissions, CDI): a new version, for every follower.
        plugin.inventory.publish(plugin.inventory.current.devices, force=True)


class _Refused(Exception):
    """A config that is not applied, and what the log says (the last good
    one stays in force): a file gone, empty or unreadable is a warning, a
    bad one an error."""

    def __init__(self, level: int, message: str) -> None:
        super().__init__(message)
        self.level = level

    @classmethod
    def keeping(cls, why: str) -> _Refused:
        return cls(logging.WARNING, f"{why}; the last good config stays in force")

    @classmethod
    def bad(cls, why: str) -> _Refused:
        return cls(logging.ERROR, f"config not applied, the last good one stays in force: {why}")


def _keep_unit_model(old: ResourceConfig, new: ResourceConfig, source: str) -> ResourceConfig:
    """The new resource, with upper-limit and allocation kept when changing
    them would change unit IDs that running pods may hold (see above)."""
    if new.allocation != old.allocation:
        log.warning(
            "%s: %s: field 'allocation' %r -> %r is not applied while powerdev runs: it "
            "changes every unit ID, and pods may hold the current ones; restart powerdev "
            "to apply it, best when no pod holds the resource",
            source,
            old.name,
            old.allocation,
            new.allocation,
        )
        new = replace(new, allocation=old.allocation)
    if new.upper_limit == old.upper_limit or 0 < old.upper_limit < new.upper_limit:
        return new
    log.warning(
        "%s: field 'upper-limit' %d -> %d is not applied while powerdev runs: pods may "
        "hold the current unit IDs, and the kubelet would not count them against new ones; "
        "restart powerdev to apply it, best when no pod holds %s",
        source,
        old.upper_limit,
        new.upper_limit,
        old.name,
    )
    return replace(new, upper_limit=old.upper_limit)
