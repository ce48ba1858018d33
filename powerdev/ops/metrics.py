"""The daemon's Prometheus metrics: one registry, its metric objects, and the
plain functions that the places which count things call, one line each.

Nothing here imports Trio, asyncio or powerdev.rpc, so the gRPC service may
call these functions too. Counters live for the process; what describes the
present (devices, open streams, each resource's state) is read when scraped.
opsserver.py serves the registry over HTTP; oplog.py writes the log lines
that go with some of these counts (Allocate refusals).
"""

from __future__ import annotations

import contextlib
import platform
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import GaugeMetricFamily

from powerdev import __version__
from powerdev.devices.condition import FINE, LEVELS
from powerdev.ops import oplog

if TYPE_CHECKING:
    from powerdev.ops.status import StatusFile
    from powerdev.resources.plugin import Plugin

REGISTRY = CollectorRegistry()
ProcessCollector(registry=REGISTRY)  # CPU seconds, resident memory, open fds, start time
PlatformCollector(registry=REGISTRY)  # python_info

BUILD = Info("powerdev_build", "The running powerdev's version", registry=REGISTRY)
BUILD.info({"version": __version__, "python": platform.python_version()})

REGISTRATIONS = Counter(
    "powerdev_registrations",
    "Registrations accepted by the kubelet, by what made powerdev register "
    "(start, kubelet_restart, stream_end, socket_removed, plugin_dir_removed, error)",
    ["resource", "cause"],
    registry=REGISTRY,
)
REGISTER_FAILURES = Counter(
    "powerdev_register_failures",
    "Register calls that failed: the kubelet did not answer (unreachable) or refused",
    ["resource", "kind"],
    registry=REGISTRY,
)
LIST_MESSAGES = Counter(
    "powerdev_listandwatch_messages",
    "ListAndWatch messages sent, to every client",
    ["resource"],
    registry=REGISTRY,
)
STREAMS = Gauge(
    "powerdev_listandwatch_streams",
    "ListAndWatch streams open now, the kubelet's and any other client's",
    ["resource", "client"],
    registry=REGISTRY,
)
ALLOCATE_CALLS = Counter(
    "powerdev_allocate_calls", "Allocate calls received", ["resource"], registry=REGISTRY
)
ALLOCATE_REFUSALS = Counter(
    "powerdev_allocate_refusals",
    "Allocate calls refused, by reason (unknown_id, unhealthy_id, other)",
    ["resource", "reason"],
    registry=REGISTRY,
)
ALLOCATE_SECONDS = Histogram(
    "powerdev_allocate_duration_seconds",
    "Time to answer an Allocate call (granted or refused)",
    ["resource"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
    registry=REGISTRY,
)
EVENTS = Counter(
    "powerdev_device_events",
    "Device events received, by source (kernel or udev uevents, inotify, host_use)",
    ["source"],
    registry=REGISTRY,
)
EVENT_BATCHES = Counter(
    "powerdev_device_event_batches",
    "Batches of device events applied together (one read of everything ready)",
    ["source"],
    registry=REGISTRY,
)
RESCANS = Counter(
    "powerdev_rescans",
    "Full rescans of a resource's devices, by cause (start, interval, events_lost, sighup, config)",
    ["resource", "cause"],
    registry=REGISTRY,
)
RELOADS = Counter(
    "powerdev_config_reloads",
    "config.json changes acted on: applied, or rejected (the last good config stays)",
    ["result"],
    registry=REGISTRY,
)
LAST_GOOD_CONFIG = Gauge(
    "powerdev_config_last_applied_timestamp_seconds",
    "When the config in force was read (at start, or the last applied reload)",
    registry=REGISTRY,
)
for _result in ("applied", "rejected"):
    RELOADS.labels(_result)
DRA_PUBLICATIONS = Counter(
    "powerdev_dra_publications",
    "Publications of a DRA resource's pool (one slice at the same generation, "
    "or a new generation on every slice), by result (ok, failed: the API server "
    "unreachable or refusing; it is tried again)",
    ["resource", "result"],
    registry=REGISTRY,
)
DRA_SLICE_WRITES = Counter(
    "powerdev_dra_slice_writes",
    "ResourceSlices written by the publications that succeeded",
    ["resource"],
    registry=REGISTRY,
)
DRA_SLICES = Gauge(
    "powerdev_dra_slices",
    "ResourceSlices of the resource's pool, as last published",
    ["resource"],
    registry=REGISTRY,
)
DRA_CLAIM_SECONDS = Histogram(
    "powerdev_dra_claim_duration_seconds",
    "NodePrepareResources and NodeUnprepareResources, per claim, by operation "
    "(prepare, unprepare) and result (ok, error)",
    ["operation", "result"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)
DRA_CLAIMS = Gauge(
    "powerdev_dra_claims_prepared",
    "ResourceClaims prepared on this node now (as the driver's checkpoint holds them)",
    registry=REGISTRY,
)
for _operation in ("prepare", "unprepare"):
    for _result in ("ok", "error"):
        DRA_CLAIM_SECONDS.labels(_operation, _result)
REFUSALS = ("unknown_id", "unhealthy_id", "other")
REGISTER_FAILURE_KINDS = ("unreachable", "refused")
RESCAN_CAUSES = ("start", "interval", "event", "sighup", "config")

STATES = ("waiting", "serving", "registered", "re-registering")
_next_cause: dict[str, str] = {}  # resource -> why its next registration happens
CAUSES = ("start", "kubelet_restart", "stream_end", "socket_removed", "plugin_dir_removed", "error")


# --- hooks: each called from one place that counts ---------------------------


def next_registration(resource: str, cause: str) -> None:
    """Why the next registration of `resource` happens: one of CAUSES."""
    if cause not in CAUSES:
        raise ValueError(f"not a registration cause: {cause!r}")
    _next_cause[resource] = cause


def resource_served(resource: str) -> None:
    """Every counter of a resource, at zero from the start: a rate or an
    increase over a series that appears only at its first count misses
    that count."""
    for cause in CAUSES:
        REGISTRATIONS.labels(resource, cause)
    for kind in REGISTER_FAILURE_KINDS:
        REGISTER_FAILURES.labels(resource, kind)
    for reason in REFUSALS:
        ALLOCATE_REFUSALS.labels(resource, reason)
    for cause in RESCAN_CAUSES:
        RESCANS.labels(resource, cause)
    LIST_MESSAGES.labels(resource)
    ALLOCATE_CALLS.labels(resource)
    ALLOCATE_SECONDS.labels(resource)
    for client in ("kubelet", "other"):
        STREAMS.labels(resource, client)


def dra_served(resource: str) -> None:
    """A DRA resource's series, at zero from its first publication."""
    for result in ("ok", "failed"):
        DRA_PUBLICATIONS.labels(resource, result)
    DRA_SLICE_WRITES.labels(resource)
    DRA_SLICES.labels(resource)


def dra_published(resource: str, written: int, slices: int) -> None:
    DRA_PUBLICATIONS.labels(resource, "ok").inc()
    DRA_SLICE_WRITES.labels(resource).inc(written)
    DRA_SLICES.labels(resource).set(slices)


def dra_publish_failed(resource: str) -> None:
    DRA_PUBLICATIONS.labels(resource, "failed").inc()


def dra_pool_gone(resource: str) -> None:
    """The resource's pool was deleted (it left the config, powerdev stops)."""
    DRA_SLICES.labels(resource).set(0)


def dra_claim_done(operation: str, began: float, ok: bool, prepared: int) -> None:
    """One claim prepared or unprepared (or not), `began` at time.perf_counter();
    `prepared`: the claims prepared now."""
    result = "ok" if ok else "error"
    DRA_CLAIM_SECONDS.labels(operation, result).observe(time.perf_counter() - began)
    DRA_CLAIMS.set(prepared)


def dra_claims_loaded(prepared: int) -> None:
    DRA_CLAIMS.set(prepared)


def registered(resource: str) -> None:
    REGISTRATIONS.labels(resource, _next_cause.pop(resource, "start")).inc()


def register_failed(resource: str, kind: str) -> None:
    REGISTER_FAILURES.labels(resource, kind).inc()


def stream_opened(resource: str, from_kubelet: bool) -> None:
    STREAMS.labels(resource, "kubelet" if from_kubelet else "other").inc()


def stream_closed(resource: str, from_kubelet: bool) -> None:
    STREAMS.labels(resource, "kubelet" if from_kubelet else "other").dec()


def list_sent(resource: str) -> None:
    LIST_MESSAGES.labels(resource).inc()


def allocate_started(resource: str) -> float:
    """Count an Allocate call; returns the start time for allocate_answered()."""
    ALLOCATE_CALLS.labels(resource).inc()
    return time.perf_counter()


def allocate_answered(resource: str, began: float) -> None:
    ALLOCATE_SECONDS.labels(resource).observe(time.perf_counter() - began)


def allocate_refused(
    plugin: Plugin, requests: Sequence[Sequence[str]], error: Exception, began: float
) -> None:
    """Count a refused Allocate by reason, time it, and log it (rate-limited)."""
    resource = plugin.resource.name
    reason = refusal_reason(plugin, requests)
    ALLOCATE_REFUSALS.labels(resource, reason).inc()
    allocate_answered(resource, began)
    oplog.refusal(resource, reason, requests, str(error))


def refusal_reason(plugin: Plugin, requests: Sequence[Sequence[str]]) -> str:
    advertised = {unit.id: unit.healthy for unit in plugin.units()}
    ids = [i for ids in requests for i in ids]
    if any(i not in advertised for i in ids):
        return "unknown_id"
    if any(not advertised[i] for i in ids):
        return "unhealthy_id"
    return "other"


EVENT_SOURCES = ("kernel", "udev", "inotify", "host_use", "other")
for _source in EVENT_SOURCES:
    EVENTS.labels(_source)
    EVENT_BATCHES.labels(_source)


def events_received(source: str, batch: object) -> None:
    """One batch from a device event source, named by its `source` label
    (one of EVENT_SOURCES): a list of events, or a rescan."""
    EVENT_BATCHES.labels(source).inc()
    EVENTS.labels(source).inc(len(batch) if isinstance(batch, list) else 1)


def rescan(resource: str, cause: str) -> None:
    RESCANS.labels(resource, cause).inc()


def config_loaded() -> None:
    LAST_GOOD_CONFIG.set(time.time())


def config_applied() -> None:
    RELOADS.labels("applied").inc()
    config_loaded()


def config_rejected() -> None:
    RELOADS.labels("rejected").inc()


# --- what describes the present: read at each scrape -------------------------


class _Present:
    """Devices, advertised units and state of every resource being served."""

    def __init__(self) -> None:
        self.served: list[tuple[list[Plugin], StatusFile]] = []

    def collect(self) -> Iterable[Any]:
        devices = GaugeMetricFamily(
            "powerdev_devices",
            "Device nodes found for a resource, by health",
            labels=["resource", "health"],
        )
        units = GaugeMetricFamily(
            "powerdev_advertised_units",
            "IDs advertised to the kubelet (one per device, or upper-limit shares), by health",
            labels=["resource", "health"],
        )
        states = GaugeMetricFamily(
            "powerdev_resource_state",
            "1 for the state each resource is in: waiting (for the kubelet), "
            "serving (Register not yet accepted), registered, "
            "re-registering (a kubelet restart, say, is being followed)",
            labels=["resource", "state"],
        )
        conditions = GaugeMetricFamily(
            "powerdev_device_condition",
            "Devices listed for a resource, by what each says of its own health: fine, "
            "degraded (works with less to spare: some paths down) or failed (Unhealthy)",
            labels=["resource", "condition"],
        )
        paths = GaugeMetricFamily(
            "powerdev_device_paths",
            "Paths of a multipath device listed for a resource, by state (running, "
            "offline, transport-offline, blocked...)",
            labels=["resource", "device", "state"],
        )
        for plugins, status in self.served:
            for plugin in plugins:
                name = plugin.resource.name
                listed = plugin.inventory.current.devices
                _conditions(plugin, listed, conditions, paths)
                healthy = sum(d.healthy for d in listed)
                devices.add_metric([name, "healthy"], healthy)
                devices.add_metric([name, "unhealthy"], len(listed) - healthy)
                advertised = plugin.units()
                good = sum(u.healthy for u in advertised)
                units.add_metric([name, "healthy"], good)
                units.add_metric([name, "unhealthy"], len(advertised) - good)
                state = status.resources.get(name, {}).get("state", "waiting")
                for each in STATES:
                    states.add_metric([name, each], 1.0 if state == each else 0.0)
        return [devices, units, states, conditions, paths]


def _conditions(
    plugin: Plugin,
    listed: Sequence[Any],
    conditions: GaugeMetricFamily,
    paths: GaugeMetricFamily,
) -> None:
    """Each listed device once (by its first name), by its condition."""
    name = plugin.resource.name
    counts = dict.fromkeys(LEVELS, 0)
    tracker = plugin.tracker
    seen = set()
    for device in listed:
        if device.key in seen:
            continue
        seen.add(device.key)
        condition = tracker.table.facts(device.key).condition if tracker is not None else None
        if condition is None:
            counts[FINE] += 1
            continue
        counts[condition.level] += 1
        for state, n in condition.path_counts().items():
            paths.add_metric([name, device.path, state], n)
    for level, n in counts.items():
        conditions.add_metric([name, level], n)


_PRESENT = _Present()
REGISTRY.register(_PRESENT)


@contextlib.contextmanager
def serving(plugins: list[Plugin], status: StatusFile) -> Iterator[None]:
    """Report these resources' devices and state while the block runs."""
    entry = (plugins, status)
    _PRESENT.served.append(entry)
    try:
        yield
    finally:
        _PRESENT.served.remove(entry)
