"""What pods hold, as the kubelet says: its PodResources API, asked by the
CDI spec writers (may a device leave a spec?) and by the node-wide ledger (may
a device that changed be granted again?), and once at start, to seed the
ledger with what pods held before this daemon. One voice for the log: that
the kubelet cannot be asked is said once, and again once it answers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import trio

from powerdev.resources import allocation
from powerdev.resources.ownership import Ledger
from powerdev.resources.plugin import Plugin
from powerdev.rpc.podresources import PodResourcesUnavailable, held_ids

log = logging.getLogger(__name__)


class PodsHold:
    def __init__(self, socket: Path | None) -> None:
        self.socket = socket  # None: never ask (so never forget what a spec named)
        self._unheld: str | None = None  # why the kubelet could not say, while it cannot

    async def held_ids(self) -> dict[str, set[str]] | None:
        """Resource name -> device IDs pods hold, from the kubelet; None when
        it cannot be asked (said once, and once again when it answers)."""
        if self.socket is None:
            return None
        try:
            held = await held_ids(self.socket)
        except Exception as err:  # whatever the kubelet or grpclib does, "cannot say" is safe
            if not isinstance(err, PodResourcesUnavailable):
                err = PodResourcesUnavailable(f"{self.socket}: {type(err).__name__}: {err}")
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

    async def seed(self, plugins: Iterable[Plugin], ledger: Ledger) -> None:
        """What pods held before this daemon started is what the kubelet
        says now: those units' devices are owned as if granted here, so a
        device that changes while held waits. Asked once, at start, before
        device events are applied (at most the PodResources timeout)."""
        held = None
        if self.socket is not None and not await trio.Path(self.socket).exists():
            log.info(
                "no PodResources socket at %s (yet): a device that changes while a pod "
                "holds it waits until the kubelet can be asked",
                self.socket,
            )
        else:
            held = await self.held_ids()
        if held is None:
            return
        for plugin in plugins:
            ids = held.get(plugin.resource.name, set())
            if not ids:
                continue
            devices = plugin.inventory.current.devices
            if plugin.resource.allocation != "each":
                ledger.granted(plugin.resource.name, None, devices)
                continue
            by_unit = allocation.by_unit(devices)
            for unit in ids:
                ledger.granted(plugin.resource.name, unit, by_unit.get(unit, ()))

    async def follow_both(self, plugin: Plugin, interval: float) -> None:
        """For a resource with "api": "both": tell it what pods hold through
        the device plugin API, so that a unit Allocate handed out returns to
        DRA once no pod holds it. Asked at once, then every `interval` while
        a handed-out unit may still be held or the kubelet cannot be asked;
        idle while none is, until Allocate hands one out."""
        name = plugin.resource.name
        if self.socket is None:
            log.warning(
                '%s: "api": "both" with no PodResources socket: what pods hold through the '
                "device plugin API cannot be known, so DRA is offered none of its devices",
                name,
            )
            return
        while True:
            asked_at = trio.current_time()
            held = await self.held_ids()
            if held is not None:
                plugin.pods_hold(held.get(name, set()), asked_at)
                if not plugin.held_by_pods:
                    await plugin.wait_granted()
            await trio.sleep(interval)
