"""The API server, as LUNs seen by several nodes need it: the nodes'
report ConfigMaps (apply, delete, list, watch), the Nodes (list, watch:
their hostname labels and readiness), the cluster pool's ResourceSlices
(list, apply, delete) and the controller's Lease (get, create, replace
with its resourceVersion). lightkube's async client, as
kubeapi.py's; imported only by lun_report.py and lun_controller.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from lightkube import AsyncClient
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import ConfigMap, Node
from lightkube.resources.resource_v1 import ResourceSlice

from powerdev.dra.kubeapi import PAGE, KubeApi, delete_if_there, get_or_none
from powerdev.dra.luns import REPORT_LABEL, NodeSeen, node_seen


class Conflict(Exception):
    """Someone else changed the object first (HTTP 409)."""


class LunApi:
    def __init__(self, api: AsyncClient) -> None:
        self._api = api

    # the nodes' reports

    async def apply_report(self, body: dict[str, Any]) -> None:
        await self._api.apply(from_dict(body), force=True)

    async def delete_report(self, namespace: str, name: str) -> None:
        await delete_if_there(self._api, ConfigMap, name, namespace)

    async def reports(self, namespace: str) -> tuple[list[dict[str, Any]], str | None]:
        """Every report, and the list's resourceVersion: where a watch of
        what changes next starts (an item's own may be older than what
        etcd keeps)."""
        labels = {REPORT_LABEL: None}  # the label is there, whatever its value
        listing = self._api.list(ConfigMap, namespace=namespace, labels=labels)
        items = [item.to_dict() async for item in listing]
        return items, listing.resourceVersion

    async def watch_reports(
        self, namespace: str, resource_version: str | None
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Each change to a report after `resource_version`: (ADDED,
        MODIFIED or DELETED, the ConfigMap)."""
        labels = {REPORT_LABEL: None}
        async for op, item in self._api.watch(
            ConfigMap, namespace=namespace, labels=labels, resource_version=resource_version
        ):
            yield op, item.to_dict()

    # the Nodes: their hostname labels and readiness

    async def nodes(self) -> tuple[dict[str, NodeSeen], str | None]:
        """Every Node (name -> its label and readiness), and the list's
        resourceVersion, where a watch of what changes next starts."""
        listing = self._api.list(Node, chunk_size=PAGE * 50)
        found = {}
        async for item in listing:
            body = item.to_dict()
            found[body["metadata"]["name"]] = node_seen(body)
        return found, listing.resourceVersion

    async def watch_nodes(
        self, resource_version: str | None
    ) -> AsyncIterator[tuple[str, str, NodeSeen, str | None]]:
        """Each change to a Node after `resource_version`: (ADDED, MODIFIED
        or DELETED, its name, its label and readiness, its resourceVersion)."""
        async for op, item in self._api.watch(Node, resource_version=resource_version):
            body = item.to_dict()
            meta = body["metadata"]
            yield op, meta["name"], node_seen(body), meta.get("resourceVersion")

    # the cluster pool

    async def cluster_slices(self, driver: str, prefix: str) -> list[dict[str, Any]]:
        """The driver's slices of no one node whose pool's name starts so."""
        found = []
        async for item in self._api.list(ResourceSlice, fields={"spec.driver": driver}):
            body = item.to_dict()
            spec = body["spec"]
            if spec["pool"]["name"].startswith(prefix) and not spec.get("nodeName"):
                found.append(body)
        return found

    async def apply_slice(self, body: dict[str, Any]) -> None:
        await self._api.apply(from_dict(body), force=True)

    async def delete_slice(self, name: str) -> None:
        await KubeApi(self._api).delete_slice(name)

    # the leader's Lease

    async def lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = await get_or_none(self._api, Lease, name, namespace)
        return None if found is None else found.to_dict()

    async def create_lease(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._unless_conflict(self._api.create, body)

    async def replace_lease(self, body: dict[str, Any]) -> dict[str, Any]:
        """The Lease written if its resourceVersion is still the server's."""
        return await self._unless_conflict(self._api.replace, body)

    @staticmethod
    async def _unless_conflict(write: Any, body: dict[str, Any]) -> dict[str, Any]:
        try:
            kept = await write(from_dict(body))
        except ApiError as err:
            if err.status.code == 409:
                raise Conflict(str(err)) from err
            raise
        return kept.to_dict()
