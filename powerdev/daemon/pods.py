"""What pods hold, as the kubelet says: its PodResources API, asked by the
CDI spec writers (may a device leave a spec?) and by the node-wide ledger
(may a holder's device go to another?). One voice for the log: that the
kubelet cannot be asked is said once, and again once it answers. And what
the ledger holds at start, until the kubelet has said (hold_at_start).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import trio

from powerdev.resources import allocation
from powerdev.resources.ownership import Ledger
from powerdev.resources.plugin import Plugin
from powerdev.rpc.podresources import Holding, PodResourcesUnavailable, held_ids

log = logging.getLogger(__name__)


class PodsHold:
    def __init__(self, socket: Path | None) -> None:
        self.socket = socket  # None: never ask (so never forget what a spec named)
        self._unheld: str | None = None  # why the kubelet could not say, while it cannot

    async def held_ids(self) -> Holding | None:
        """Resource name -> device IDs pods hold -> those pods, from the
        kubelet; None when it cannot be asked (said once, and once again
        when it answers)."""
        if self.socket is None:
            return None
        if not await trio.Path(self.socket).exists():
            if self._unheld is None:
                log.info(
                    "no PodResources socket at %s (yet): a device that changes while a pod "
                    "may hold it waits until the kubelet can be asked",
                    self.socket,
                )
            self._unheld = "no socket"
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


async def hold_at_start(
    plugins: Iterable[Plugin],
    ledger: Ledger,
    step: int = 250,
    *,
    held_now: Holding | None = None,
) -> None:
    """What pods held before this daemon started is not known until the
    kubelet says: until then, every device a resource lists through the
    device plugin API counts as held by the unit it is listed as, so that a
    device that changes meanwhile waits. The ledger asks the kubelet at
    once, and again every recheck interval until it answers. A resource
    served through DRA alone may have devices that pods got through the
    device plugin API before (a resource moved from "both" to "dra"):
    those that the kubelet lists in `held_now` (its answer at start) count
    as held the same way, and stay out of the pool until it says no pod
    holds them. `step` units a Trio step."""
    held = 0
    for plugin in plugins:
        devices = plugin.inventory.current.devices
        name = plugin.resource.name
        if not plugin.resource.device_plugin:
            listed = (held_now or {}).get(name, {})
            units = [(u, names) for u, names in allocation.by_unit(devices).items() if u in listed]
        elif plugin.resource.allocation == "each":
            units = list(allocation.by_unit(devices).items())
        else:
            units = [(None, list(devices))]  # "all": any unit holds every device
        for unit, names in units:
            keys = [d.key for d in names]
            for at in range(0, len(keys), step):
                part = keys[at : at + step]
                ledger.provisional(name, unit, part)
                held += len(part)
                if held >= step:
                    held = 0
                    await trio.lowlevel.checkpoint()
            if not plugin.resource.device_plugin:
                # Its own devices, held through the other API: it rules on
                # them again (a device plugin resource's own hold is no bar).
                plugin.regate(set(keys))
    ledger.settle()
