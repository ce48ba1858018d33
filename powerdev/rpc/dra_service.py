"""The kubelet's side of a DRA driver, served: pluginregistration v1 on
<registry dir>/<driver>-reg.sock (GetInfo: a DRAPlugin, its endpoint and
the node service versions; NotifyRegistrationStatus) and the DRA node
service, v1 and v1beta1, with the DRA health stream (v1alpha1
NodeWatchResources: the prepared devices' health, dra/health.py), on
<plugins dir>/<driver>/dra.sock. Thin shells: each call crosses into Trio,
to powerdev.dra.claims or powerdev.dra.health, and the answers are built
here from their plain data.

The node service's requests are decoded by protobuf's own parser (the
generated _pb2 modules), which refuses a wire format that is corrupt (a
length past the end, a field of the wrong wire type); the door's codec
makes that InvalidArgument. betterproto's parser takes such a request as
whatever it could read, or fails inside the handler with a traceback. A
claim reference without a namespace, name or UID gets its own error,
before anything is asked of the API server."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import grpclib.const
import trio
import trio_asyncio
from grpclib.server import Stream

from powerdev._proto import dra_v1_pb2, dra_v1beta1_pb2
from powerdev._proto.k8s.io.kubelet.pkg.apis.dra import v1, v1beta1
from powerdev._proto.pluginregistration import (
    InfoRequest,
    PluginInfo,
    RegistrationBase,
    RegistrationStatus,
    RegistrationStatusResponse,
)
from powerdev._proto.v1alpha1 import (
    DeviceHealth,
    DeviceIdentifier,
    DraResourceHealthBase,
    HealthStatus,
    NodeWatchResourcesRequest,
    NodeWatchResourcesResponse,
)
from powerdev.dra import health
from powerdev.dra.claims import ClaimRef, Claims, PrepareError, UnprepareError
from powerdev.dra.health import HealthWatch, Report
from powerdev.dra.names import endpoint, registration_socket
from powerdev.ops import metrics
from powerdev.rpc.door import send_or_cancel, serve

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")  # the node services, as a registration names them
WATCH_RESOURCES = "/v1alpha1.DRAResourceHealth/NodeWatchResources"
_STATUS = {
    health.HEALTHY: HealthStatus.HEALTHY,
    health.UNHEALTHY: HealthStatus.UNHEALTHY,
    health.UNKNOWN: HealthStatus.UNKNOWN,
}


class _Registration(RegistrationBase):
    def __init__(self, driver: str, endpoint: Path, registered: Callable[[], None]) -> None:
        self._driver = driver
        self._endpoint = endpoint
        self._registered = registered

    async def get_info(self, info_request: InfoRequest) -> PluginInfo:
        return PluginInfo(
            type=PLUGIN_TYPE,
            name=self._driver,
            endpoint=str(self._endpoint),
            supported_versions=list(VERSIONS),
        )

    async def notify_registration_status(
        self, registration_status: RegistrationStatus
    ) -> RegistrationStatusResponse:
        if registration_status.plugin_registered:
            await trio_asyncio.trio_as_aio(_registered)(self._driver, self._registered)
        else:
            await trio_asyncio.trio_as_aio(_refused)(self._driver, registration_status.error)
        return RegistrationStatusResponse()


async def _registered(driver: str, registered: Callable[[], None]) -> None:
    log.info("DRA: the kubelet registered driver %s", driver)
    registered()


async def _refused(driver: str, error: str) -> None:
    log.error("DRA: the kubelet refused driver %s: %s", driver, error)


_STRICT = {v1: dra_v1_pb2, v1beta1: dra_v1beta1_pb2}  # each version's protobuf classes
PREPARE, UNPREPARE = "NodePrepareResources", "NodeUnprepareResources"


def _node_service(api: ModuleType, claims: Claims, watch: HealthWatch) -> object:
    """The node service of one API version (v1 and v1beta1 have the same fields)."""
    strict = _STRICT[api]

    class Node(api.DraPluginBase):  # type: ignore[name-defined,misc]
        def __mapping__(self) -> dict[str, grpclib.const.Handler]:
            """The generated handlers, with each request decoded by protobuf."""
            mapping = super().__mapping__()
            for method in (PREPARE, UNPREPARE):
                (name,) = [n for n in mapping if n.endswith(f".DRAPlugin/{method}")]
                generated = mapping[name]
                mapping[name] = grpclib.const.Handler(
                    generated.func,
                    generated.cardinality,
                    getattr(strict, f"{method}Request"),
                    generated.reply_type,
                )
            return mapping

        async def node_prepare_resources(self, node_prepare_resources_request):  # type: ignore[no-untyped-def]
            refs = [
                ClaimRef(c.namespace, c.name, c.uid) for c in node_prepare_resources_request.claims
            ]
            answers = await trio_asyncio.trio_as_aio(_prepare_all)(claims, refs, watch)
            return api.NodePrepareResourcesResponse(
                claims={
                    uid: api.NodePrepareResourceResponse(error=answer)
                    if isinstance(answer, str)
                    else api.NodePrepareResourceResponse(
                        devices=[
                            api.Device(
                                request_names=list(d.requests),
                                pool_name=d.pool,
                                device_name=d.device,
                                cdi_device_ids=list(d.cdi_ids),
                                **({"share_id": d.share_id} if d.share_id and api is v1 else {}),
                            )
                            for d in answer
                        ]
                    )
                    for uid, answer in answers.items()
                }
            )

        async def node_unprepare_resources(self, node_unprepare_resources_request):  # type: ignore[no-untyped-def]
            refs = [
                ClaimRef(c.namespace, c.name, c.uid)
                for c in node_unprepare_resources_request.claims
            ]
            answers = await trio_asyncio.trio_as_aio(_unprepare_all)(claims, refs, watch)
            return api.NodeUnprepareResourcesResponse(
                claims={
                    uid: api.NodeUnprepareResourceResponse(error=error)
                    for uid, error in answers.items()
                }
            )

    return Node()


async def _prepare_all(
    claims: Claims, refs: list[ClaimRef], watch: HealthWatch
) -> dict[str, object]:
    """Each claim side by side; an error (a string) for one that failed."""
    answers: dict[str, object] = {}

    async def one(ref: ClaimRef) -> None:
        began, ok = time.perf_counter(), False
        try:
            answers[ref.uid] = await claims.prepare(ref)
            ok = True
            log.info("DRA: prepared claim %s/%s (%s)", ref.namespace, ref.name, ref.uid)
        except PrepareError as err:
            answers[ref.uid] = str(err)
            log.warning("DRA: claim %s/%s not prepared: %s", ref.namespace, ref.name, err)
        except Exception as err:  # the API server unreachable, a file not written
            answers[ref.uid] = f"cannot prepare claim {ref.namespace}/{ref.name}: {err}"
            log.warning("DRA: claim %s/%s not prepared: %s", ref.namespace, ref.name, err)
        finally:
            metrics.dra_claim_done("prepare", began, ok, claims.prepared_count)

    try:
        async with trio.open_nursery() as nursery:
            for ref in refs:
                nursery.start_soon(one, ref)
    finally:
        watch.claims_changed()
    return answers


async def _unprepare_all(
    claims: Claims, refs: list[ClaimRef], watch: HealthWatch
) -> dict[str, str]:
    answers: dict[str, str] = {}
    try:
        for ref in refs:
            began, ok = time.perf_counter(), False
            try:
                await claims.unprepare(ref)
                answers[ref.uid] = ""
                ok = True
                log.info("DRA: unprepared claim %s/%s (%s)", ref.namespace, ref.name, ref.uid)
            except UnprepareError as err:  # the checkpoint or the spec not written: it stays
                answers[ref.uid] = str(err)
                log.warning("DRA: claim %s/%s not unprepared: %s", ref.namespace, ref.name, err)
            except Exception as err:  # anything else: this claim's error, the others go on
                answers[ref.uid] = f"cannot unprepare claim {ref.namespace}/{ref.name}: {err}"
                log.warning("DRA: claim %s/%s not unprepared: %s", ref.namespace, ref.name, err)
            finally:
                metrics.dra_claim_done("unprepare", began, ok, claims.prepared_count)
    finally:
        watch.claims_changed()
    return answers


class _Health(DraResourceHealthBase):
    """NodeWatchResources: the whole list at once, then whenever it changes,
    and again every health.RESEND seconds. Every stream waits on its own
    (the report it sent last): nothing is shared or queued between them,
    and the handler holds nothing that needs closing (the generated
    handler would iterate an async generator it never closes)."""

    def __init__(self, watch: HealthWatch) -> None:
        self._watch = watch

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        mapping = super().__mapping__()
        generated = mapping[WATCH_RESOURCES]
        mapping[WATCH_RESOURCES] = grpclib.const.Handler(
            self._watch_resources,
            generated.cardinality,
            generated.request_type,
            generated.reply_type,
        )
        return mapping

    async def _watch_resources(
        self, stream: Stream[NodeWatchResourcesRequest, NodeWatchResourcesResponse]
    ) -> None:
        await stream.recv_message()
        next_report = trio_asyncio.trio_as_aio(self._watch.next_report)
        sent: Report | None = None
        while True:
            report = await next_report(sent)
            await send_or_cancel(stream, health_response(report))
            sent = report


def health_response(report: Report, now: float | None = None) -> NodeWatchResourcesResponse:
    """A report as the kubelet reads it."""
    when = int(time.time() if now is None else now)
    return NodeWatchResourcesResponse(
        devices=[
            DeviceHealth(
                device=DeviceIdentifier(pool_name=d.pool, device_name=d.device),
                health=_STATUS[d.health],
                last_updated_time=when,
                health_check_timeout_seconds=health.HEALTH_TIMEOUT,
                message=d.message,
            )
            for d in report.devices
        ]
    )


async def serve_driver(
    driver: str,
    registry_dir: Path,
    plugins_dir: Path,
    claims: Claims,
    registered: Callable[[], None],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the node service and the health stream, then the registration
    socket (so whatever the kubelet finds is already served), until cancelled."""
    node_socket = endpoint(plugins_dir, driver)
    os.makedirs(node_socket.parent, exist_ok=True)
    os.makedirs(registry_dir, exist_ok=True)
    async with trio.open_nursery() as nursery:
        watch = HealthWatch(claims.prepared_devices, claims.plugins, claims.node)
        services = [
            _node_service(v1, claims, watch),
            _node_service(v1beta1, claims, watch),
            _Health(watch),
        ]
        await nursery.start(serve, node_socket, services)
        registration = _Registration(driver, node_socket, registered)
        await nursery.start(serve, registration_socket(registry_dir, driver), [registration])
        log.info(
            "DRA: driver %s serves %s, registered through %s", driver, node_socket, registry_dir
        )
        task_status.started()
