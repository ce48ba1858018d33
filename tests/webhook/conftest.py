"""The webhook's test kit: a test CA (trustme), key pairs laid out as a
mounted Secret, AdmissionReview requests, pod shapes as the API server sends
them, the webhook in-process or as a real process, and an HTTPS client."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import os
import ssl
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
import trustme

from powerdev.webhook.server import READY_LINE, Serving, Settings, serve

LIMIT = 20  # seconds: the bound of every async test here
NAMESPACE = "power-device-plugin"
RESOURCE = "power-dev-plugin/dev"


# --- key pairs ------------------------------------------------------------------


class SecretDir:
    """A directory laid out as the kubelet writes a Secret volume: the files
    are links through `..data`, and an update swaps `..data` by rename."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.version = 0
        path.mkdir(parents=True, exist_ok=True)

    def write(self, files: dict[str, bytes]) -> None:
        self.version += 1
        target = self.path / f"..v{self.version}"
        target.mkdir()
        for name, data in files.items():
            (target / name).write_bytes(data)
        tmp = self.path / "..data_tmp"
        tmp.symlink_to(target.name)
        os.replace(tmp, self.path / "..data")
        for name in files:
            link = self.path / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")


def pair_files(cert: trustme.LeafCert) -> dict[str, bytes]:
    chain = b"".join(blob.bytes() for blob in cert.cert_chain_pems)
    return {"tls.crt": chain, "tls.key": cert.private_key_pem.bytes()}


def sha256_of(cert: trustme.LeafCert) -> str:
    der = ssl.PEM_cert_to_DER_cert(cert.cert_chain_pems[0].bytes().decode())
    return hashlib.sha256(der).hexdigest()


def client_context(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def secret(tmp_path, ca) -> SecretDir:
    secret = SecretDir(tmp_path / "tls")
    secret.write(pair_files(ca.issue_cert("127.0.0.1", "localhost")))
    return secret


# --- reviews and pods -------------------------------------------------------------


def review(pod: dict | None, namespace: str = "team-a", **request: object) -> dict:
    body = {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": namespace,
        "operation": "CREATE",
        "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
        "object": pod,
        "oldObject": None,
        "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }
    body.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": body}


def container(name: str, resources: object = "{}") -> dict:
    """A container as the API server has defaulted it; resources "{}" is what
    it sends for a container that asked for nothing; None leaves the key out."""
    c = {
        "name": name,
        "image": "registry.example/app:1.0",
        "imagePullPolicy": "IfNotPresent",
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "volumeMounts": [
            {
                "name": "kube-api-access-x7k2p",
                "readOnly": True,
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            }
        ],
    }
    if resources == "{}":
        c["resources"] = {}
    elif resources is not None:
        c["resources"] = copy.deepcopy(resources)
    return c


def deployment_pod(*containers: dict, init: list[dict] | None = None, **metadata: object) -> dict:
    """A Deployment's pod as the API server sends it to a webhook on CREATE:
    defaulted, no name yet (generateName), owned by the ReplicaSet."""
    meta = {
        "generateName": "db-7d9c6b5f4-",
        "namespace": "team-a",
        "labels": {"app": "db", "pod-template-hash": "7d9c6b5f4"},
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": "db-7d9c6b5f4",
                "uid": "0d1f4a4e-6c38-4b8e-9b57-5b7a1e0c2d11",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    for key, value in metadata.items():
        meta[key] = {**meta.get(key, {}), **value}  # type: ignore[dict-item]
    spec: dict[str, object] = {
        "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"sources": []}}],
        "containers": list(containers),
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "serviceAccount": "default",
        "securityContext": {},
        "schedulerName": "default-scheduler",
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
        ],
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    }
    if init is not None:
        spec["initContainers"] = init
    return {"kind": "Pod", "apiVersion": "v1", "metadata": meta, "spec": spec, "status": {}}


# --- the webhook, in-process and as a process ----------------------------------------


def settings_for(tmp_path: Path, secret: SecretDir, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "config_path": tmp_path / "config" / "webhook.json",
        "cert_dir": secret.path,
        "listen": "127.0.0.1:0",
        "namespace": NAMESPACE,
        "drain_seconds": 0.0,
    }
    values.update(overrides)
    Path(values["config_path"]).parent.mkdir(parents=True, exist_ok=True)  # type: ignore[arg-type]
    return Settings(**values)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def webhook_in_process(settings: Settings) -> AsyncIterator[Serving]:
    async with trio.open_nursery() as nursery:
        serving = await nursery.start(partial(serve, settings))
        yield serving
        nursery.cancel_scope.cancel()


@dataclass
class StderrLines:
    """Every line the process writes to stderr, read as it comes; tests wait
    for a line, never for time."""

    stream: trio.abc.ReceiveStream
    lines: list[str] = field(default_factory=list)
    ended: bool = False
    _new: trio.Event = field(default_factory=trio.Event)

    async def pump(self) -> None:
        buffer = b""
        while True:
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                self.ended = True
                self._wake()
                return
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            self.lines.extend(line.decode("utf-8", "replace") for line in complete)
            self._wake()

    def _wake(self) -> None:
        self._new.set()
        self._new = trio.Event()

    async def wait_for(self, predicate, start: int = 0) -> tuple[int, str]:
        """The first line from index `start` on that satisfies predicate."""
        index = start
        while True:
            while index < len(self.lines):
                if predicate(self.lines[index]):
                    return index, self.lines[index]
                index += 1
            if self.ended:
                raise AssertionError("the webhook ended; its stderr:\n" + "\n".join(self.lines))
            await self._new.wait()


@dataclass
class Process:
    proc: trio.Process
    url: str
    stderr: StderrLines


def webhook_command(settings: Settings, *more: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "powerdev",
        "webhook",
        "--config",
        str(settings.config_path),
        "--cert-dir",
        str(settings.cert_dir),
        "--listen",
        settings.listen,
        "--namespace",
        settings.namespace,
        "--drain-seconds",
        str(settings.drain_seconds),
        *more,
    ]


@contextlib.asynccontextmanager
async def webhook_process(settings: Settings, *more: str) -> AsyncIterator[Process]:
    """`powerdev webhook` as a user runs it; ready when it prints its ready line."""
    async with trio.open_nursery() as nursery:
        proc = await trio.lowlevel.open_process(
            webhook_command(settings, *more), stderr=subprocess.PIPE
        )
        try:
            stderr = StderrLines(proc.stderr)
            nursery.start_soon(stderr.pump)
            _, line = await stderr.wait_for(lambda text: text.startswith(READY_LINE))
            yield Process(proc, line.split()[-1], stderr)
        finally:
            if proc.returncode is None:
                proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()
            nursery.cancel_scope.cancel()


def client(ca: trustme.CA, url: str, *, http2: bool = False) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, verify=client_context(ca), http2=http2, timeout=10)


async def post_review(http: httpx.AsyncClient, body: dict) -> dict:
    answer = await http.post("/mutate", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    result = answer.json()
    assert result["apiVersion"] == "admission.k8s.io/v1"
    assert result["kind"] == "AdmissionReview"
    assert result["response"]["uid"] == body["request"]["uid"]
    assert result["response"]["allowed"] is True
    return result["response"]
