"""A small Kubernetes API client for the end-to-end tests and the bench:
httpx (already the webhook tests' client; on Trio through anyio) with the
admin's client certificate, plain JSON in and out, waits by watch, never
by timer; and the few things tests do to a cluster without a kubelet: a
Ready node, a namespace with its `default` ServiceAccount, a pod.

lightkube 1.0.1 was tried first. Under Trio it creates and watches, but it
brings a second HTTP stack (httpx2, httpcore2) beside httpx; a watch left
early leaves httpx2's stream generators for Trio to report, which this
suite's filterwarnings=error makes a failure; and its watch retries wait
with asyncio.sleep, which Trio cannot run.
"""

from __future__ import annotations

import contextlib
import json
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import httpx

NOT_READY_TAINT = "node.kubernetes.io/not-ready"
WATCH_SECONDS = 60  # the server ends a watch after this; wait_for lists and watches again


class ApiError(Exception):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        try:
            detail = json.loads(body).get("message", body)
        except ValueError:
            detail = body
        super().__init__(f"{method} {path}: {status}: {detail}")
        self.status = status


class Api:
    """JSON over HTTPS to one API server, as the admin."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, server: str, ca: Path, cert: Path, key: Path) -> AsyncIterator[Api]:
        context = ssl.create_default_context(cafile=str(ca))
        context.load_cert_chain(cert, key)
        async with httpx.AsyncClient(base_url=server, verify=context, timeout=30) as http:
            yield cls(http)

    async def request(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict:
        content = None if body is None else json.dumps(body).encode()
        headers = {"content-type": content_type} if content is not None else {}
        answer = await self.http.request(
            method, path, content=content, params=params, headers=headers
        )
        if answer.status_code >= 400:
            raise ApiError(method, path, answer.status_code, answer.text)
        return answer.json()

    async def get(self, path: str, **params: str) -> dict:
        return await self.request("GET", path, params=params or None)

    async def create(self, path: str, body: dict, **params: str) -> dict:
        return await self.request("POST", path, body, params=params or None)

    async def merge_patch(self, path: str, body: dict) -> dict:
        return await self.request("PATCH", path, body, content_type="application/merge-patch+json")

    async def delete(self, path: str) -> dict:
        return await self.request("DELETE", path)

    async def wait_for(
        self, collection: str, name: str, predicate: Callable[[dict], bool] = lambda _: True
    ) -> dict:
        """The object `name` in `collection` (a list path like
        /api/v1/namespaces/x/pods) once predicate(object) holds: a list, then
        a watch from the list's resourceVersion. The caller bounds the wait."""
        selector = f"metadata.name={name}"
        while True:
            listing = await self.get(collection, fieldSelector=selector)
            for item in listing["items"]:
                if predicate(item):
                    return item
            event = await self._watch(
                collection,
                selector,
                listing["metadata"]["resourceVersion"],
                lambda e: e["type"] in ("ADDED", "MODIFIED") and predicate(e["object"]),
            )
            if event is not None and event["type"] != "ERROR":
                return event["object"]
            # the watch ended, or an error event (like 410 Gone): list again

    async def wait_gone(self, collection: str, name: str) -> None:
        """Until the object `name` in `collection` is deleted."""
        selector = f"metadata.name={name}"
        while True:
            listing = await self.get(collection, fieldSelector=selector)
            if not listing["items"]:
                return
            version = listing["metadata"]["resourceVersion"]
            event = await self._watch(
                collection, selector, version, lambda e: e["type"] == "DELETED"
            )
            if event is not None and event["type"] == "DELETED":
                return

    async def _watch(
        self, collection: str, selector: str, version: str, done: Callable[[dict], bool]
    ) -> dict | None:
        """The first event of a watch for which done(event) holds, or an ERROR
        event; None if the server ends the watch first."""
        params = {
            "fieldSelector": selector,
            "watch": "true",
            "resourceVersion": version,
            "timeoutSeconds": str(WATCH_SECONDS),
        }
        timeout = httpx.Timeout(30, read=None)  # a quiet watch is not an error
        async with self.http.stream("GET", collection, params=params, timeout=timeout) as answer:
            if answer.status_code >= 400:
                raise ApiError(
                    "GET", collection, answer.status_code, (await answer.aread()).decode()
                )
            lines = answer.aiter_lines()
            async for line in lines:
                event = json.loads(line)
                if event["type"] == "ERROR" or done(event):
                    break
            else:
                return None
            # httpx reads a stream through a chain of async generators, and
            # Trio reports each one dropped unfinished (encode/httpx#3686). So
            # the response is closed and the chain runs to its end, which on
            # a closed connection is an error at once.
            await answer.aclose()
            with contextlib.suppress(httpx.HTTPError, httpx.StreamError):
                async for _ in lines:
                    pass
            return event

    # --- what tests do to a cluster without a kubelet ----------------------------------

    async def create_namespace(self, name: str, labels: dict[str, str] | None = None) -> dict:
        """The namespace, once its `default` ServiceAccount exists (made by
        the controller manager): the API server refuses a pod without it."""
        namespace = await self.create(
            "/api/v1/namespaces", {"metadata": {"name": name, "labels": labels or {}}}
        )
        await self.wait_for(f"/api/v1/namespaces/{name}/serviceaccounts", "default")
        return namespace

    async def label_namespace(self, name: str, labels: dict[str, str | None]) -> dict:
        """Labels set (None removes one), then its `default` ServiceAccount."""
        namespace = await self.merge_patch(
            f"/api/v1/namespaces/{name}", {"metadata": {"labels": labels}}
        )
        await self.wait_for(f"/api/v1/namespaces/{name}/serviceaccounts", "default")
        return namespace

    async def create_node(
        self, name: str, resources: dict[str, str] | None = None, taints: Sequence[dict] = ()
    ) -> dict:
        """A Node as a kubelet would register it, Ready, with `resources`
        (like {"cpu": "4", "example.com/dev": "2"}) as capacity and
        allocatable, and without the not-ready taint that the API server's
        admission puts on every new node (no node controller runs to lift it),
        but with `taints`."""
        capacity = {"cpu": "4", "memory": "8Gi", "pods": "110", **(resources or {})}
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
        await self.create("/api/v1/nodes", {"metadata": {"name": name, "labels": labels}})
        status = {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "made Ready by the e2e tests: no kubelet runs",
                }
            ],
        }
        node = await self.merge_patch(f"/api/v1/nodes/{name}/status", {"status": status})
        kept = [t for t in node["spec"].get("taints", []) if t["key"] != NOT_READY_TAINT]
        # The resourceVersion makes this a compare-and-swap: it fails rather
        # than drop a taint that someone else added meanwhile.
        return await self.merge_patch(
            f"/api/v1/nodes/{name}",
            {
                "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                "spec": {"taints": [*kept, *taints] or None},
            },
        )

    async def create_pod(self, namespace: str, pod: dict, **params: str) -> dict:
        return await self.create(f"/api/v1/namespaces/{namespace}/pods", pod, **params)


def pod(name: str, *containers: dict, annotations: dict | None = None, **spec: object) -> dict:
    """A pod of `containers` (container() makes one)."""
    metadata: dict[str, object] = {"name": name}
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": list(containers), **spec},
    }


def container(name: str, resources: dict | None = None) -> dict:
    c: dict[str, object] = {"name": name, "image": "registry.k8s.io/pause:3.10"}
    if resources is not None:
        c["resources"] = resources
    return c
