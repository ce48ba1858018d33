"""Leader election through a coordination.k8s.io Lease, as client-go's
leaderelection does it: a replica takes the Lease when nobody holds it, or
when the holder has not renewed it for `duration` seconds by this
replica's own clock (it notes when it last saw the Lease change; no clock
is compared across machines); every write names the resourceVersion it
read, so of two that try at once one wins and the other sees a conflict.
The leader renews it every duration / 3; one that cannot renew within
duration * 2/3 stops leading (its work is cancelled) before any other
replica may take over. On the way out the leader lets the Lease go (no
holder), so the next takes over at once."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Protocol

import trio

log = logging.getLogger(__name__)

RELEASE_TIMEOUT = 5.0


class LeaseApi(Protocol):
    async def lease(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def create_lease(self, body: dict[str, Any]) -> dict[str, Any]: ...

    async def replace_lease(self, body: dict[str, Any]) -> dict[str, Any]: ...


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Elector:
    def __init__(
        self, api: LeaseApi, namespace: str, name: str, identity: str, duration: float
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.duration = duration
        self._held: dict[str, Any] | None = None  # the Lease as we last wrote it
        self._seen: tuple[Any, ...] | None = None  # the Lease's holder and renewal, last seen
        self._seen_at = 0.0  # when it last changed, by our clock

    @property
    def _whole(self) -> int:
        return max(1, round(self.duration))

    def _body(self, found: dict[str, Any] | None, holder: str | None) -> dict[str, Any]:
        now = _micro_now()
        spec = dict((found or {}).get("spec") or {})
        taking = spec.get("holderIdentity") != holder
        spec.update(
            holderIdentity=holder,
            leaseDurationSeconds=self._whole if holder else 1,
            renewTime=now,
        )
        if taking and holder:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = spec.get("leaseTransitions", -1) + 1
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if found is not None:
            metadata["resourceVersion"] = found["metadata"]["resourceVersion"]
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": spec,
        }

    async def _try_acquire(self) -> bool:
        from powerdev.dra.lun_api import Conflict

        found = await self.api.lease(self.namespace, self.name)
        if found is None:
            try:
                self._held = await self.api.create_lease(self._body(None, self.identity))
            except Conflict:
                return False
            return True
        spec = found.get("spec") or {}
        holder = spec.get("holderIdentity")
        seen = (holder, spec.get("renewTime"), found["metadata"].get("resourceVersion"))
        if seen != self._seen:
            self._seen, self._seen_at = seen, trio.current_time()
        held_for = float(spec.get("leaseDurationSeconds") or self.duration)
        if holder and holder != self.identity and trio.current_time() - self._seen_at < held_for:
            return False  # held, and renewed lately
        try:
            self._held = await self.api.replace_lease(self._body(found, self.identity))
        except Conflict:
            return False
        if holder and holder != self.identity:
            log.info("luns: took over the Lease %s from %s", self.name, holder)
        return True

    async def _renew(self, lost: trio.CancelScope) -> None:
        """Renew until it cannot within the deadline: then `lost` is cancelled."""
        from powerdev.dra.lun_api import Conflict

        deadline = trio.current_time() + self.duration * 2 / 3
        while True:
            await trio.sleep(self.duration / 3)
            try:
                with trio.fail_at(deadline):
                    self._held = await self.api.replace_lease(self._body(self._held, self.identity))
                deadline = trio.current_time() + self.duration * 2 / 3
            except Conflict:
                log.error("luns: the Lease %s was taken by another replica", self.name)
                lost.cancel()
                return
            except trio.TooSlowError:
                log.error(
                    "luns: the Lease %s could not be renewed within %gs: no longer leading",
                    self.name,
                    self.duration * 2 / 3,
                )
                lost.cancel()
                return
            except Exception as err:  # the API server: try again before the deadline
                log.warning("luns: cannot renew the Lease %s (%s): trying again", self.name, err)

    async def _release(self) -> None:
        if self._held is None:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(RELEASE_TIMEOUT):
            try:
                await self.api.replace_lease(self._body(self._held, None))
                log.info("luns: let the Lease %s go", self.name)
            except Exception as err:  # another holder now, or no API server: it expires
                log.warning("luns: cannot let the Lease %s go (%s)", self.name, err)
        self._held = None

    async def lead(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run work() whenever this replica holds the Lease, until cancelled."""
        retry = max(self.duration / 5, 0.05)
        while True:
            try:
                acquired = await self._try_acquire()
            except Exception as err:  # the API server
                log.warning("luns: cannot read the Lease %s (%s): trying again", self.name, err)
                acquired = False
            if not acquired:
                await trio.sleep(retry)
                continue
            log.info("luns: leading (Lease %s/%s, %s)", self.namespace, self.name, self.identity)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._renew, nursery.cancel_scope)
                    await work()
                    nursery.cancel_scope.cancel()
            finally:
                await self._release()  # after a loss too: a stale resourceVersion fails
            self._seen = None
