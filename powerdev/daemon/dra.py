"""The supervisor's neighbour for resources with "api": "dra": the one DRA
driver of the node (its registration and node service, rpc/dra_service.py,
over the claims' logic, dra/claims.py), started the first time a DRA
resource is served, and each DRA resource's pool kept published
(dra/slices.py). The API server client lives until the daemon's root
nursery has ended, so that every pool is deleted on the way out.
lightkube is imported here, and only here, when the first DRA resource
starts."""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from powerdev.daemon.settings import DraSettings
from powerdev.devices.discovery import probe
from powerdev.devices.identity import block_devices_with
from powerdev.devices.table import DeviceTable
from powerdev.dra.names import endpoint
from powerdev.ops import metrics
from powerdev.ops.status import StatusFile
from powerdev.resources.ownership import Ledger
from powerdev.resources.plugin import Plugin
from powerdev.support.backoff import Backoff

if TYPE_CHECKING:
    from powerdev.dra.claims import Claims
    from powerdev.dra.kubeapi import KubeApi  # lightkube: imported when DRA starts
    from powerdev.dra.slices import Pool

log = logging.getLogger(__name__)


class _FrozenFirst:
    """A task status (trio.TaskStatus) that, the first time in the process,
    freezes the garbage collector's objects before it says started: what
    the driver's start imported and read (lightkube with its models, the
    claims, the checkpoint) and the pool it first built live as long as the
    daemon, so no full collection should scan them again (at 10,000 devices
    such collections took 7 to 22 ms, measured, holding every thread), as
    the supervisor freezes what start-up made. Once only: a pool published
    again after a reload is not the daemon's for good, and a frozen object
    that later becomes cyclic garbage is never collected."""

    frozen = False  # for the whole process

    def __init__(self, status: trio.TaskStatus[None]) -> None:
        self._status = status

    def started(self, value: None = None) -> None:
        if not _FrozenFirst.frozen:
            _FrozenFirst.frozen = True
            gc.freeze()
        self._status.started(value)


class _NoClient:
    """The claims' API server while there is no client: each read says why."""

    def __init__(self, problem: str) -> None:
        self.problem = problem

    async def claim(self, namespace: str, name: str) -> None:
        raise ConnectionError(f"no API server client: {self.problem}")


def _read_boot_id(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError as err:
        log.warning("DRA: cannot read this boot's ID from %s (%s)", path, err)
        return None


WATCH_RETRY = (0.1, 10.0)  # first and longest wait before watching the slices again


def status_name(resource: str, both: bool) -> str:
    """A resource's DRA side in the status file: its own name, or, when its
    device plugin side is there too ("api": "both"), "<name> (DRA)"."""
    return f"{resource} (DRA)" if both else resource


class DraDriver:
    def __init__(
        self,
        settings: DraSettings | None,
        cdi_dir: Path,
        plugins: Callable[[], Sequence[Plugin]],
        nursery: trio.Nursery,
        closing: contextlib.AsyncExitStack,
        status: StatusFile | None = None,
        ledger: Ledger | None = None,
        table: DeviceTable | None = None,
    ) -> None:
        self._settings = settings
        self._cdi_dir = cdi_dir
        self._plugins = plugins
        self._nursery = nursery
        self._closing = closing
        self._api: KubeApi | None = None
        self._starting = trio.Lock()
        self._pools: dict[str, Pool] = {}  # by resource name: published now
        self._status = status or StatusFile(None)
        self._ledger = ledger
        self._table = table  # the node's devices: a prepared claim found again by identity
        self._kubelet_knows = False  # the kubelet has registered the driver
        self._claims: Claims | None = None
        self._serving = False  # the node service and registration are served

    def _dra_plugins(self) -> list[Plugin]:
        return [p for p in self._plugins() if p.resource.dra]

    def registered(self) -> None:
        """The kubelet registered the driver: every pool is published again
        (a kubelet that starts deletes its node's ResourceSlices)."""
        self._kubelet_knows = True
        for pool in self._pools.values():
            self._report(pool.resource_name)
            pool.lose()

    def _report(self, name: str) -> None:
        """The resource's state for `powerdev health` and /readyz: waiting
        until the kubelet has registered the driver, then registered, with
        the node service's socket."""
        settings = self._settings
        assert settings is not None
        state = "registered" if self._kubelet_knows else "waiting"
        socket = endpoint(settings.plugins_dir, settings.driver)
        self._status.set(status_name(name, self._both(name)), state, socket)

    def _both(self, name: str) -> bool:
        return any(p.resource.both for p in self._plugins() if p.resource.name == name)

    async def _watch_slices(self, api: KubeApi, settings: DraSettings) -> None:
        """A pool one of whose slices someone else deleted is published again."""
        backoff = Backoff(*WATCH_RETRY)
        again = False
        while True:
            try:
                if again:  # a deletion while nobody watched went unseen: look
                    await self._check_pools(api)
                again = True
                async for name in api.deleted_slices(settings.driver, settings.node_name):
                    backoff.reset()
                    for pool in self._pools.values():
                        if name in pool.names:
                            log.info(
                                "%s: its ResourceSlice %s was deleted: publishing again",
                                pool.resource_name,
                                name,
                            )
                            pool.lose()
            except Exception as err:  # the API server unreachable; the watch ended
                log.warning("DRA: watching the node's ResourceSlices: %s: watching again", err)
            await trio.sleep(backoff.next())

    async def _check_pools(self, api: KubeApi) -> None:
        """Publish again each pool one of whose slices is not there."""
        for pool in list(self._pools.values()):
            found = await api.pool_slices(pool.driver, pool.node, pool.name)
            missing = set(pool.names) - {s["metadata"]["name"] for s in found}
            if missing:
                log.info(
                    "%s: its ResourceSlices %s went while the watch was down: publishing again",
                    pool.resource_name,
                    ", ".join(sorted(missing)),
                )
                pool.lose()

    async def _start(self) -> KubeApi:
        async with self._starting:
            if self._api is not None:
                return self._api
            claims = await self._claims_served()
            from powerdev.dra import kubeapi

            settings = self._settings
            assert settings is not None
            try:
                client = kubeapi.client(settings.kubeconfig)
            except Exception as err:  # a missing token, a kubeconfig that does not parse
                claims.api = _NoClient(f"{type(err).__name__}: {err}")
                raise
            api = kubeapi.KubeApi(client)
            self._closing.push_async_callback(api.aclose)
            claims.api = api
            self._nursery.start_soon(self._watch_slices, api, settings)
            self._api = api
            return api

    async def _claims_served(self) -> Claims:
        """The claims with their checkpoint loaded (so the ledger knows what
        they hold) and the driver's services served, before and whatever
        becomes of the API server's client: the kubelet can unprepare a
        claim, and prepare again one it prepared, without the API server.
        Called under self._starting."""
        from powerdev.dra.claims import Claims
        from powerdev.rpc.dra_service import serve_driver

        settings = self._settings
        assert settings is not None
        if self._claims is None:
            claims = Claims(
                driver=settings.driver,
                node=settings.node_name,
                api=_NoClient("powerdev has not built its API server client yet"),
                plugins=self._dra_plugins,
                cdi_dir=self._cdi_dir,
                state_dir=settings.plugins_dir / settings.driver,
                ledger=self._ledger,
                boot_id=_read_boot_id(settings.boot_id),
            )
            if self._table is not None:
                claims.find = self._find
                claims.key_of = self._key_of
                claims.names_of = self._table.names
            await claims.load()
            metrics.dra_claims_loaded(claims.prepared_count)
            self._claims = claims
        if not self._serving:
            await self._nursery.start(
                serve_driver,
                settings.driver,
                settings.registry_dir,
                settings.plugins_dir,
                self._claims,
                self.registered,
            )
            self._serving = True
        return self._claims

    async def _find(self, identity: str) -> list[tuple[str, int, int]]:
        """The devices that are `identity` ("SOURCE=value") now: those the
        node's table knows, else a walk of sysfs in a worker thread."""
        assert self._table is not None
        source, _, value = identity.partition("=")
        found = list(self._table.with_identity((source, value)))
        if found:
            return found
        table = self._table
        return await trio.to_thread.run_sync(
            block_devices_with, table.sys_root, table.udev, (source, value)
        )

    def _key_of(self, path: str) -> tuple[str, int, int] | None:
        assert self._table is not None
        key = self._table.key_of(path)
        if key is None:
            device = probe(self._table.dev_root, path)
            key = device.key if device is not None else None
        return key

    async def resume(self) -> None:
        """At start, before any resource is served: when the checkpoint holds
        prepared claims, start the driver whatever the config says, so that
        the ledger knows what claims hold before any Allocate, and the
        kubelet can still unprepare them (a reload or a restart took the
        resource off DRA meanwhile)."""
        settings = self._settings
        if settings is None:
            return
        from powerdev.dra.claims import holds_claims

        if not await trio.to_thread.run_sync(holds_claims, settings.plugins_dir / settings.driver):
            return
        log.info("DRA: the checkpoint holds prepared claims: starting driver %s", settings.driver)
        try:
            async with self._starting:
                await self._claims_served()
        except Exception as err:  # the sockets' directories; publish() tries again
            log.error(
                "DRA: the driver cannot serve the kubelet (%s: %s); the claims its checkpoint "
                "holds are %s",
                type(err).__name__,
                err,
                "known (held)" if self._claims is not None else "not known yet",
            )
            return
        try:
            await self._start()
        except Exception as err:  # publish() tries again when a DRA resource is served
            log.error(
                "DRA: the driver has no API server client (%s: %s); the claims its checkpoint "
                "holds are held, and the kubelet can unprepare them; a claim not prepared "
                "before cannot be prepared until it has one",
                type(err).__name__,
                err,
            )

    async def publish(
        self, plugin: Plugin, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Keep the resource's pool published until cancelled; started() once
        first published. Without a node name (a reload added the first DRA
        resource to a daemon started without one) it is not served."""
        from powerdev.dra.slices import Pool, keep_published  # only a DRA resource publishes

        settings = self._settings
        if settings is None:
            log.error(
                '%s: "api": "dra" needs this node\'s name: set NODE_NAME (or --node-name) '
                "and restart powerdev; not served",
                plugin.resource.name,
            )
            task_status.started()
            return
        backoff = Backoff(*WATCH_RETRY)
        while True:
            try:
                api = await self._start()
                break
            except Exception as err:  # the API server's address, a socket, the CDI dir
                log.error(
                    "%s: the DRA driver cannot start (%s: %s): trying again",
                    plugin.resource.name,
                    type(err).__name__,
                    err,
                )
                self._report(plugin.resource.name)
                task_status.started()
                task_status = trio.TASK_STATUS_IGNORED
                await trio.sleep(backoff.next())
        if plugin.resource.cluster:  # its LUNs reported, published by `powerdev luns`
            await self._report_luns(plugin, api, settings, task_status)
            return
        pool = Pool(api, settings.driver, settings.node_name, plugin.resource.name)
        self._pools[plugin.resource.name] = pool
        self._report(plugin.resource.name)
        status = status_name(plugin.resource.name, plugin.resource.both)
        try:
            await keep_published(
                plugin,
                pool,
                problem=partial(self._status.problem, status),
                task_status=_FrozenFirst(task_status),
            )
        finally:
            if self._pools.get(plugin.resource.name) is pool:
                del self._pools[plugin.resource.name]
            if plugin.resource.both:
                self._status.forget(status_name(plugin.resource.name, True))

    async def _report_luns(
        self,
        plugin: Plugin,
        api: KubeApi,
        settings: DraSettings,
        task_status: trio.TaskStatus[None],
    ) -> None:
        """A resource with "scope": "cluster": its LUNs reported until cancelled."""
        from powerdev.dra.lun_api import LunApi
        from powerdev.dra.lun_report import keep_reported

        self._report(plugin.resource.name)
        status = status_name(plugin.resource.name, plugin.resource.both)
        await keep_reported(
            plugin,
            LunApi(api.client),
            namespace=settings.lun_namespace,
            node=settings.node_name,
            driver=settings.driver,
            interval=settings.lun_report_interval,
            problem=partial(self._status.problem, status),
            task_status=task_status,
        )
