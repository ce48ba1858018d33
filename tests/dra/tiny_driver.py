"""A DRA driver of a few lines, for the harness tests: it serves the DRA
node service v1 on PLUGINS_DIR/<name>/dra.sock and answers every claim with
one fixed CDI device ID; then it serves pluginregistration v1 on
REGISTRY_DIR/<name>-reg.sock (GetInfo: type DRAPlugin, its name, that
endpoint, "v1.DRAPlugin"), as a real driver does, in that order, so that
whatever the kubelet finds is already served. It writes down every call it
gets; wait_until() wakes on each, never on a timer.

grpclib and the generated code (powerdev/_proto) through powerdev's asyncio
door; nothing of powerdev's own DRA code, of which there is none yet."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio
import trio_asyncio

from powerdev._proto.k8s.io.kubelet.pkg.apis.dra import v1 as dra
from powerdev._proto.pluginregistration import (
    InfoRequest,
    PluginInfo,
    RegistrationBase,
    RegistrationStatus,
    RegistrationStatusResponse,
)
from powerdev.rpc import serve

SERVICE = "v1.DRAPlugin"  # how a registration names the DRA node service v1


@dataclass
class TinyDriver:
    name: str
    registry_dir: Path
    plugins_dir: Path
    cdi_id: str
    pool: str = "pool"
    device: str = "dev-0"
    calls: list[tuple[str, object]] = field(default_factory=list)
    _changed: trio.Event = field(default_factory=trio.Event)

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / f"{self.name}-reg.sock"

    @property
    def endpoint(self) -> Path:
        return self.plugins_dir / self.name / "dra.sock"

    def of(self, kind: str) -> list:
        """The arguments of every call of one kind, in order."""
        return [value for k, value in self.calls if k == kind]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; started() once both sockets serve."""
        self.endpoint.parent.mkdir(parents=True, exist_ok=True)
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        async with trio.open_nursery() as nursery:
            await nursery.start(serve, self.endpoint, [_Node(self)])
            await nursery.start(serve, self.registration_socket, [_Registration(self)])
            task_status.started()

    async def wait_until(self, predicate: Callable[[TinyDriver], bool]) -> None:
        while not predicate(self):
            await self._changed.wait()

    async def record(self, kind: str, value: object) -> None:
        """Called from the services (asyncio side) through trio_as_aio."""
        self.calls.append((kind, value))
        self._changed.set()
        self._changed = trio.Event()


class _Registration(RegistrationBase):
    def __init__(self, driver: TinyDriver) -> None:
        self._driver = driver

    async def get_info(self, info_request: InfoRequest) -> PluginInfo:
        await trio_asyncio.trio_as_aio(self._driver.record)("get_info", info_request)
        return PluginInfo(
            type="DRAPlugin",
            name=self._driver.name,
            endpoint=str(self._driver.endpoint),
            supported_versions=[SERVICE],
        )

    async def notify_registration_status(
        self, registration_status: RegistrationStatus
    ) -> RegistrationStatusResponse:
        await trio_asyncio.trio_as_aio(self._driver.record)("status", registration_status)
        return RegistrationStatusResponse()


class _Node(dra.DraPluginBase):
    def __init__(self, driver: TinyDriver) -> None:
        self._driver = driver

    async def node_prepare_resources(
        self, node_prepare_resources_request: dra.NodePrepareResourcesRequest
    ) -> dra.NodePrepareResourcesResponse:
        claims = list(node_prepare_resources_request.claims)
        await trio_asyncio.trio_as_aio(self._driver.record)("prepare", claims)
        device = dra.Device(
            pool_name=self._driver.pool,
            device_name=self._driver.device,
            cdi_device_ids=[self._driver.cdi_id],
        )
        return dra.NodePrepareResourcesResponse(
            claims={c.uid: dra.NodePrepareResourceResponse(devices=[device]) for c in claims}
        )

    async def node_unprepare_resources(
        self, node_unprepare_resources_request: dra.NodeUnprepareResourcesRequest
    ) -> dra.NodeUnprepareResourcesResponse:
        claims = list(node_unprepare_resources_request.claims)
        await trio_asyncio.trio_as_aio(self._driver.record)("unprepare", claims)
        return dra.NodeUnprepareResourcesResponse(
            claims={c.uid: dra.NodeUnprepareResourceResponse() for c in claims}
        )
