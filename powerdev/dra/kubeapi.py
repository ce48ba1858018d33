"""The API server, as DRA needs it: ResourceSlices (list a pool's, apply,
delete) and ResourceClaims (get one). lightkube's async client, on anyio,
so on Trio without a thread per call. Imported only when some resource
says "api": "dra" (lightkube and its models cost memory: see
docs/performance.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypeVar

import trio
from lightkube import AsyncClient, KubeConfig
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

FIELD_MANAGER = "powerdev"
PAGE = 8  # slices a list request asks for

Kind = TypeVar("Kind")


async def get_or_none(
    api: AsyncClient, kind: type[Kind], name: str, namespace: str | None = None
) -> Kind | None:
    """The object, or None when the API server has none of that name."""
    try:
        return await api.get(kind, name, namespace=namespace)
    except ApiError as err:
        if err.status.code == 404:
            return None
        raise


async def delete_if_there(
    api: AsyncClient, kind: type, name: str, namespace: str | None = None
) -> None:
    """The object deleted; one already gone is no error."""
    try:
        await api.delete(kind, name, namespace=namespace)
    except ApiError as err:
        if err.status.code != 404:
            raise


def refuses_none_effect(err: ApiError) -> bool:
    """Is this the refusal of a taint's effect None, as a Kubernetes 1.34
    API server with DRADeviceTaints on gives it (its validation's
    NotSupported on spec.devices[i].taints[j].effect; read in its
    pkg/apis/resource/validation, not tried on one)?"""
    message = err.status.message or ""
    return err.status.code == 422 and 'effect: Unsupported value: "None"' in message


def config_problem(kubeconfig: Path | None) -> str | None:
    """Why the API server's address and credentials cannot be read, or None."""
    try:
        _config(kubeconfig)
    except Exception as err:  # lightkube's own, or the file system's
        where = kubeconfig or "the pod's service account"
        return f"{where} cannot be used ({type(err).__name__}: {err})"
    return None


def _config(kubeconfig: Path | None) -> KubeConfig:
    if kubeconfig is not None:
        return KubeConfig.from_file(kubeconfig)
    return KubeConfig.from_service_account()


def client(kubeconfig: Path | None) -> AsyncClient:
    """A client from the kubeconfig file, or the pod's service account."""
    return AsyncClient(_config(kubeconfig), field_manager=FIELD_MANAGER)


class KubeApi:
    """SliceApi (slices.py) and what claims.py reads, over one client."""

    def __init__(self, api: AsyncClient) -> None:
        self._api = api

    @property
    def client(self) -> AsyncClient:
        """The one client, for lun_api.py (LUNs seen by several nodes)."""
        return self._api

    async def pool_slices(self, driver: str, node: str, pool: str) -> list[dict[str, Any]]:
        found = []
        fields = {"spec.driver": driver, "spec.nodeName": node}
        # a page at a time: 79 slices of 10,000 devices decoded at once hold
        # the Trio thread some 40 ms; and a slice at a time within a page
        # (a page of 8 slices of 64 devices, made into dicts in one step,
        # held it some 30 ms)
        async for item in self._api.list(ResourceSlice, fields=fields, chunk_size=PAGE):
            body = item.to_dict()
            if body["spec"]["pool"]["name"] == pool:
                found.append(body)
            await trio.lowlevel.checkpoint()
        return found

    async def deleted_slices(self, driver: str, node: str) -> AsyncIterator[str]:
        """The name of each of the node's slices of the driver, as it is deleted."""
        fields = {"spec.driver": driver, "spec.nodeName": node}
        async for op, item in self._api.watch(ResourceSlice, fields=fields):
            if op == "DELETED" and item.metadata is not None and item.metadata.name:
                yield item.metadata.name

    async def apply_slice(self, body: dict[str, Any]) -> bool:
        """The slice created or updated; whether the API server kept counters
        in it (shared ones, or ones its devices consume)."""
        try:
            kept = await self._api.apply(from_dict(body), force=True)
        except ApiError as err:
            if refuses_none_effect(err):
                from powerdev.dra.slices import TaintEffectRefused

                raise TaintEffectRefused(err.status.message) from err
            raise
        spec = kept.spec
        return bool(spec.sharedCounters) or any(d.consumesCounters for d in spec.devices or ())

    async def delete_slice(self, name: str) -> None:
        await delete_if_there(self._api, ResourceSlice, name)

    async def claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The claim, or None when the API server has none of that name."""
        found = await get_or_none(self._api, ResourceClaim, name, namespace)
        return None if found is None else found.to_dict()

    async def aclose(self) -> None:
        await self._api.close()
