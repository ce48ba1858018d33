"""The node's side of a resource with "scope": "cluster": instead of a pool
of its own, the node reports its LUNs (luns.sightings) in a ConfigMap of
its own (luns.report_body), written again at every inventory change and
at least every `interval` seconds (its heartbeat: the controller drops a
node whose report stops changing, lun_controller.py). On the way out the
report is deleted, so the node leaves every LUN's selection at once. The
claims of the cluster pool are prepared by claims.py, which finds the
allocated device by its name, made from the LUN's identity."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

import trio

from powerdev.dra.lun_api import LunApi
from powerdev.dra.luns import report_body, report_name, sightings
from powerdev.dra.names import device_name
from powerdev.resources.allocation import by_unit
from powerdev.resources.plugin import Plugin
from powerdev.support.backoff import Backoff

log = logging.getLogger(__name__)

RETRY = (0.1, 10.0)
DELETE_TIMEOUT = 5.0


async def keep_reported(
    plugin: Plugin,
    api: LunApi,
    *,
    namespace: str,
    node: str,
    driver: str,
    interval: float,
    problem: Callable[[str | None], None] = lambda _: None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Report the resource's LUNs until cancelled; started() once first
    reported (or first tried)."""
    name = plugin.resource.name
    backoff = Backoff(*RETRY)
    # Counted on from this start's wall clock (µs), not from 0: a restarted
    # powerdev whose first report said what the last one before it did would
    # write the very same ConfigMap, which the API server keeps as it is (no
    # new resourceVersion, no watch event), and a node that had gone silent
    # would come back only at its next heartbeat.
    heartbeat = time.time_ns() // 1000
    said: tuple | None = None
    try:
        while True:
            snapshot = plugin.inventory.current
            units = by_unit(plugin.offered_to_dra(snapshot))
            tracker = plugin.tracker
            assert tracker is not None  # a served resource has its tracker
            found = sightings(units, tracker.condition_of, device_name)
            heartbeat += 1
            body = report_body(
                namespace, node, driver, name, found, heartbeat, plugin.resource.shared
            )
            try:
                await api.apply_report(body)
            except Exception as err:  # the API server: unreachable, refusing
                problem(f"its LUN report cannot be written ({err}): trying again")
                log.warning("%s: cannot write its LUN report (%s): trying again", name, err)
                task_status.started()
                task_status = trio.TASK_STATUS_IGNORED
                await trio.sleep(backoff.next())
                continue
            backoff.reset()
            problem(None)
            now = tuple(found)
            if now != said:
                said = now
                log.info(
                    "%s: reported %d LUNs in ConfigMap %s/%s", name, len(found), namespace,
                    body["metadata"]["name"],
                )  # fmt: skip
            task_status.started()
            task_status = trio.TASK_STATUS_IGNORED
            with trio.move_on_after(interval):  # the heartbeat
                await plugin.inventory.wait_newer(snapshot.version)
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(DELETE_TIMEOUT):
            with contextlib.suppress(Exception):
                await api.delete_report(namespace, report_name(node, driver, name))
                log.info("%s: its LUN report is deleted", name)
