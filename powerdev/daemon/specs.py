"""The CDI spec writers of the running resources, one per spec file, for as
long as the file may name a device a pod holds: kept in step with its
resource's list while it is served, retired (shrunk to what pods still hold,
then removed) when the resource leaves the config, and handed back to the
resource if it returns before that.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import trio

from powerdev.config import ResourceConfig
from powerdev.devices.table import DeviceTable
from powerdev.resources.cdi import Held, SpecWriteError, SpecWriter, device_name
from powerdev.resources.matching import unit_id
from powerdev.resources.plugin import Plugin

log = logging.getLogger(__name__)


class SpecWriters:
    def __init__(
        self,
        spec_dir: Path,
        held_ids: Held,
        recheck_interval: float,
        nursery: trio.Nursery,
        table: DeviceTable | None = None,
    ) -> None:
        self._table = table
        self._spec_dir = spec_dir
        self._held_ids = held_ids
        self._interval = recheck_interval
        self._nursery = nursery
        self._writers: dict[str, SpecWriter] = {}
        self._retiring: dict[str, trio.CancelScope] = {}

    def writer(self, name: str) -> SpecWriter:
        """The resource's writer: the one it had, if it is back in the config
        before its old spec went (its retiring stops), else a new one."""
        retiring = self._retiring.pop(name, None)
        if retiring is not None:
            retiring.cancel()
        writer = self._writers.get(name)
        if writer is None:
            writer = SpecWriter(
                self._spec_dir, name, self._held_ids, reaches_other=self._reaches_other
            )
            self._writers[name] = writer
        return writer

    def _reaches_other(self, name: str, nodes: list[dict[str, object]], each: bool) -> str | None:
        """Whether a name kept for a pod now reaches another device: its
        numbers belong to a device the node's table knows that is another
        unit ("each": a unit is named by what the device is), or (in "all"
        mode, named by path) that its path no longer names."""
        if self._table is None:
            return None
        for node in nodes:
            major, minor = node.get("major"), node.get("minor")
            if not isinstance(major, int) or not isinstance(minor, int):
                continue  # not a node this daemon wrote
            key = (str(node.get("type")), major, minor)
            path = str(node.get("hostPath"))
            names = self._table.names(key)
            if not names:
                continue  # nothing there the table knows of
            if each:
                facts = self._table.facts(key)
                unit = device_name(unit_id(key, facts.identity, facts.kernel_name))
                if unit != name:
                    return f"{key[1]}:{key[2]} is {unit} now"
            elif self._table.key_of(path) != key and path not in names:
                return f"{key[1]}:{key[2]} is {', '.join(names)} now"
        return None

    def retiring(self, name: str) -> bool:
        return name in self._retiring

    def retire(self, resource: ResourceConfig) -> None:
        """A resource gone from the config: its spec shrinks to what pods
        still hold, asked every recheck interval, and goes when that is
        nothing; unless the resource comes back first."""
        writer = self._writers.get(resource.name)
        if writer is None:
            return
        self._retiring[resource.name] = scope = trio.CancelScope()
        self._nursery.start_soon(self._retire, writer, resource, scope)

    async def _retire(
        self, writer: SpecWriter, resource: ResourceConfig, scope: trio.CancelScope
    ) -> None:
        with scope:
            while True:
                try:
                    await writer.recheck(resource, None)
                except SpecWriteError as err:
                    log.error("%s: %s", resource.name, err)
                if not writer.keeps:
                    break
                await trio.sleep(self._interval)
        if self._retiring.get(resource.name) is scope:  # done, and not taken back
            del self._retiring[resource.name]
            del self._writers[resource.name]

    async def keep(self, plugin: Plugin) -> None:
        """While the resource is served: its spec follows every change of its
        list (a changed config publishes anew too); while it keeps devices
        only because pods may hold them, the kubelet is asked again every
        recheck interval. The file stays when the daemon stops: the next
        one reads it back."""
        writer = plugin.spec
        assert writer is not None  # the supervisor gives every plugin one
        seen = 0
        while True:
            snapshot = None
            with trio.move_on_after(self._interval if writer.keeps else math.inf):
                snapshot = await plugin.inventory.wait_newer(seen)
            try:
                if snapshot is None:
                    await writer.recheck(plugin.resource, plugin.inventory.current)
                else:
                    seen = snapshot.version
                    await writer.ensure(plugin.resource, snapshot)
            except SpecWriteError as err:
                log.error("%s: %s; Allocate will try again", plugin.resource.name, err)
