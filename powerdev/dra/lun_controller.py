"""`powerdev luns`: the one writer of the cluster pools of LUNs that several
nodes see. While it holds the Lease (lease.py) it lists the nodes' report
ConfigMaps, watches them, and publishes for each resource one pool,
"cluster/luns/<resource>" (luns.merge, luns.cluster_slices), written
again when a report changes, a node's report has not changed for `ttl`
seconds (its heartbeat stopped: the node leaves every selection), or a
reporting node's Node changes readiness or label (it watches the Nodes:
a NotReady node leaves every selection at once). A pool
whose devices are what the server already has is not written: a new
leader that finds the pool right writes nothing. A LUN keeps its slice
(placement.place): a change within one slice is that slice written at
the same generation; one that touches more is a new generation written
to every slice of the pool, and slices no longer needed go."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import trio

from powerdev.dra.lun_api import LunApi
from powerdev.dra.luns import (
    HOSTNAME_LABEL,
    REPORT_LABEL,
    NodeSeen,
    Report,
    cluster_pool_name,
    cluster_slices,
    merge,
    parse_report,
    sharing_conflict,
)
from powerdev.support.backoff import Backoff

log = logging.getLogger(__name__)

POOL_PREFIX = cluster_pool_name("")
RETRY = (0.1, 10.0)


@dataclass
class _Pool:
    generation: int = 0
    slices: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # name -> devices
    slots: dict[str, int] = field(default_factory=dict)  # device name -> its slice
    stale: set[str] = field(default_factory=set)  # slices of an older generation, to go
    declared: int = 0  # the slice count the newest generation's slices name


@dataclass
class Controller:
    api: LunApi
    namespace: str
    driver: str
    ttl: float  # seconds a report may go unchanged before its node drops out
    # by ConfigMap: the report, when it was last written (by this replica's
    # clock), its resourceVersion then
    _reports: dict[str, tuple[Report, float, str | None]] = field(default_factory=dict)
    _changed: trio.Event = field(default_factory=trio.Event)
    _pools: dict[str, _Pool] = field(default_factory=dict)  # by resource name
    _said: set[str] = field(default_factory=set)  # conflicts said
    _unsure: bool = False  # a write failed: what the pools hold is read again first
    _nodes: dict[str, NodeSeen] = field(default_factory=dict)  # every Node, by name
    _node_said: dict[str, str] = field(default_factory=dict)  # a reporting node's trouble
    _backoff: Backoff = field(default_factory=lambda: Backoff(*RETRY))
    writes: int = 0  # slices applied or deleted, since it was made
    passes: int = 0  # merges of every report

    async def run(self) -> None:
        """Keep the cluster pools right until cancelled (while leading)."""
        self._reports.clear()
        self._pools.clear()
        backoff = Backoff(*RETRY)
        while True:  # what is there now, before any merge (without Nodes none is selected)
            try:
                nodes_version = await self._load_nodes()
                version = await self._load()
                await self._recall()
                break
            except Exception as err:  # the API server, or a role without a call it needs
                log.warning(
                    "luns: cannot read the Nodes, the reports or the cluster pools (%s): "
                    "trying again",
                    err,
                )
                self._pools.clear()
                await trio.sleep(backoff.next())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch, version)
            nursery.start_soon(self._watch_nodes, nodes_version)
            first = True
            while True:
                self._changed = trio.Event()
                written = self.writes
                await self._publish_all()
                if first:
                    first = False
                    log.info(
                        "luns: took up %d reports and %d cluster pools: %d slices written",
                        len(self._reports),
                        len(self._pools),
                        self.writes - written,
                    )
                with trio.move_on_at(self._next_expiry()):
                    await self._changed.wait()

    def _seen(self, body: dict[str, Any]) -> bool:
        """The report noted; whether the pools may change (a heartbeat alone,
        the same LUNs written again, only keeps its node alive). A report
        listed again with its resourceVersion unchanged was not written
        since: its node is no more alive than it was."""
        name = body["metadata"]["name"]
        version = body["metadata"].get("resourceVersion")
        try:
            report = parse_report(body)
        except ValueError as err:
            log.warning("luns: report %s/%s is left out: %s", self.namespace, name, err)
            return self._reports.pop(name, None) is not None
        if report.driver != self.driver:
            return False
        now = trio.current_time()
        before = self._reports.get(name)
        if before is None:
            self._reports[name] = (report, now, version)
            return True
        last, seen, was = before
        if version is not None and version == was:
            now = seen  # listed again, not written
        self._reports[name] = (report, now, version)
        # changed, or back from silence with the same LUNs
        return last != report or seen + self.ttl < trio.current_time() <= now + self.ttl

    async def _load(self) -> str | None:
        """Every report now; the resourceVersion to watch from."""
        found, version = await self.api.reports(self.namespace)
        names = {body["metadata"]["name"] for body in found}
        for gone in set(self._reports) - names:
            del self._reports[gone]
        for body in found:
            self._seen(body)
        return version

    async def _recall(self) -> None:
        """What the cluster pools hold on the server (an earlier leader's):
        the newest generation's slices, where each device is, and the
        slices of older ones, which go at the next write."""
        for body in await self.api.cluster_slices(self.driver, POOL_PREFIX):
            spec = body["spec"]
            resource = spec["pool"]["name"].removeprefix(POOL_PREFIX)
            pool = self._pools.setdefault(resource, _Pool())
            name, generation = body["metadata"]["name"], spec["pool"]["generation"]
            if generation > pool.generation:
                pool.stale.update(pool.slices)
                pool.generation, pool.slices, pool.slots = generation, {}, {}
            if generation < pool.generation:
                pool.stale.add(name)
                continue
            pool.slices[name] = spec.get("devices") or []
            pool.declared = spec["pool"].get("resourceSliceCount", 0)
            index = _index(name)
            for device in pool.slices[name] if index is not None else ():
                pool.slots[device["name"]] = index

    async def _watch(self, version: str | None) -> None:
        backoff = Backoff(*RETRY)
        while True:
            try:
                async for op, body in self.api.watch_reports(self.namespace, version):
                    backoff.reset()
                    version = body["metadata"].get("resourceVersion") or version
                    if op == "DELETED":
                        changed = self._reports.pop(body["metadata"]["name"], None) is not None
                    elif REPORT_LABEL in (body["metadata"].get("labels") or {}):
                        changed = self._seen(body)
                    else:  # its label taken off: no longer a report
                        changed = self._reports.pop(body["metadata"]["name"], None) is not None
                    if changed:
                        self._changed.set()
            except Exception as err:  # the watch ended, its version too old: list again
                log.warning("luns: watching the reports: %s: listing them again", err)
                await trio.sleep(backoff.next())
                try:
                    version = await self._load()
                except Exception as again:
                    log.warning("luns: cannot list the reports (%s)", again)
                    continue
                self._changed.set()

    async def _load_nodes(self) -> str | None:
        """Every Node's label and readiness now; the resourceVersion to
        watch from."""
        self._nodes, version = await self.api.nodes()
        return version

    async def _watch_nodes(self, version: str | None) -> None:
        """A Node that goes NotReady (the node lifecycle controller marks it
        Unknown once its kubelet is silent), is deleted or loses its label
        leaves every selection at once; back, it is named again."""
        backoff = Backoff(*RETRY)
        while True:
            try:
                async for op, name, seen, at in self.api.watch_nodes(version):
                    backoff.reset()
                    version = at or version
                    was = self._nodes.get(name)
                    if op == "DELETED":
                        self._nodes.pop(name, None)
                    else:
                        self._nodes[name] = seen
                    if self._nodes.get(name) != was and self._reports_of(name):
                        self._changed.set()
            except Exception as err:  # the watch ended, its version too old: list again
                log.warning("luns: watching the nodes: %s: listing them again", err)
                await trio.sleep(backoff.next())
                try:
                    version = await self._load_nodes()
                except Exception as again:
                    log.warning("luns: cannot list the nodes (%s)", again)
                    continue
                self._changed.set()

    def _reports_of(self, node: str) -> bool:
        return any(r.node == node for r, _, _ in self._reports.values())

    def _hostnames(self, live: list[Report]) -> dict[str, str]:
        """The label of each reporting node that may be selected now; each
        that may not is said once, and again when it may."""
        hostnames = {}
        for node in sorted({r.node for r in live}):
            seen = self._nodes.get(node)
            if seen is None:
                trouble = "has no Node object: none of its LUNs can be selected for it"
            elif seen.label is None:
                trouble = f"has no {HOSTNAME_LABEL} label: none of its LUNs can be selected for it"
            elif not seen.ready:
                trouble = "is not Ready: it is left out of every LUN's selection until it is"
            else:
                hostnames[node] = seen.label
                if self._node_said.pop(node, None) is not None:
                    log.info("luns: node %s may be selected again", node)
                continue
            if self._node_said.get(node) != trouble:
                self._node_said[node] = trouble
                log.error("luns: node %s %s", node, trouble)
        return hostnames

    def _live(self) -> list[Report]:
        now = trio.current_time()
        return [r for r, seen, _ in self._reports.values() if now - seen <= self.ttl]

    def _next_expiry(self) -> float:
        now = trio.current_time()
        times = [seen + self.ttl for _, seen, _ in self._reports.values() if seen + self.ttl >= now]
        return min(times, default=now + self.ttl) + 0.01

    async def _publish_all(self) -> None:
        self.passes += 1
        if self._unsure:
            self._pools.clear()
            try:
                await self._recall()
            except Exception as err:  # the API server: tried again at once after a pause
                log.warning("luns: cannot read the cluster pools (%s): trying again", err)
                self._changed.set()
                await trio.sleep(self._backoff.next())
                return
            self._unsure = False
        live = self._live()
        hostnames = self._hostnames(live)
        resources = sorted({r.resource for r in live} | set(self._pools))
        failed = False
        for resource in resources:
            devices, conflicts = merge(resource, live, hostnames)
            said = [c.describe() for c in conflicts]
            disagreed = sharing_conflict(resource, live)
            if disagreed is not None:
                said.append(disagreed)
            for text in said:
                if text not in self._said:
                    self._said.add(text)
                    log.error("luns: %s: %s", resource, text)
            try:
                await self._publish(resource, devices)
            except Exception as err:  # the API server; tried again after a pause
                log.warning("luns: %s: cannot publish the cluster pool (%s)", resource, err)
                self._unsure = True
                failed = True
        if failed:  # one pause a pass, longer each pass that fails: no spin
            self._changed.set()
            await trio.sleep(self._backoff.next())
        else:
            self._backoff.reset()

    async def _publish(self, resource: str, devices: list[dict[str, Any]]) -> None:
        """The pool's devices written: one slice changed (each device keeps
        its slice) is that slice at the same generation, the pool whole
        meanwhile; more, or another count of slices, is a new generation
        on every slice. Slices no longer needed go."""
        pool = self._pools.setdefault(resource, _Pool())
        now, slots = cluster_slices(
            self.driver, resource, devices, pool.generation, pool.slots, len(pool.slices)
        )
        changed = [b for b in now if pool.slices.get(b["metadata"]["name"]) != b["spec"]["devices"]]
        # whole: the slices found are all the pool's, and as many as it needs
        # (a leader that stopped within a new generation left it short)
        whole = len(now) == len(pool.slices) == pool.declared
        if not changed and whole and not pool.stale:
            return
        generation = pool.generation
        if len(changed) > 1 or not whole:  # the same slices, at the next generation, all written
            generation += 1
            for body in now:
                body["spec"]["pool"]["generation"] = generation
            changed = now
        for body in changed:
            await self.api.apply_slice(body)
            self.writes += 1
        wanted = {b["metadata"]["name"]: b["spec"]["devices"] for b in now}
        for name in sorted((set(pool.slices) | pool.stale) - set(wanted)):
            await self.api.delete_slice(name)
            self.writes += 1
        pool.generation, pool.slices, pool.slots, pool.stale = generation, wanted, slots, set()
        pool.declared = len(now)
        log.info(
            "luns: %s: published %d LUNs in pool %s (generation %d, %d of %d slices written): %s",
            resource,
            len(devices),
            cluster_pool_name(resource),
            generation,
            len(changed),
            len(now),
            "; ".join(f"{d['name']} on {', '.join(_nodes(d))}" for d in devices[:10]),
        )


def _index(slice_name: str) -> int | None:
    """A cluster slice's place in its pool: the number its name ends with
    (luns.cluster_slice_name); None for a name not made so (its devices
    are placed again)."""
    tail = slice_name.rpartition("-")[2]
    return int(tail) if tail.isdigit() else None


def _nodes(device: dict[str, Any]) -> list[str]:
    term = device["nodeSelector"]["nodeSelectorTerms"][0]
    return list(term["matchExpressions"][0]["values"])


async def serve(
    *,
    kubeconfig: Any,
    namespace: str,
    driver: str,
    ttl: float,
    lease_name: str,
    lease_duration: float,
    identity: str,
) -> None:
    """`powerdev luns` until SIGTERM or SIGINT: lead when it can, publish
    while it leads, let the Lease go on the way out."""
    import signal

    from powerdev.dra import kubeapi
    from powerdev.dra.lease import Elector

    client = kubeapi.client(kubeconfig)
    api = LunApi(client)
    elector = Elector(api, namespace, lease_name, identity, lease_duration)
    controller = Controller(api, namespace, driver, ttl)
    log.info(
        "luns: %s for driver %s: reports in %s, dropped after %gs unchanged",
        identity,
        driver,
        namespace,
        ttl,
    )
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(elector.lead, controller.run)
                async for signum in signals:
                    log.info("luns: %s: stopping", signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    break
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            await client.close()
