"""`powerdev bench-webhook`: the real `powerdev webhook` process on a TLS
socket on 127.0.0.1 (certificates from a throwaway test CA), asked by httpx
as the API server asks: AdmissionReviews, one after another, on a kept-alive
HTTP/2 connection, and on a new connection each (handshake included). It
reports review latency (p50, p99, max) per pod shape and the process's RSS
before and after. It asserts nothing; `--json` writes the figures."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import trio

from powerdev.devtools.bench import percentile
from powerdev.devtools.testing import rss_kib

WAIT_LIMIT = 60.0
READY = "powerdev webhook: serving"


def _container(name: str, resources: dict | None, env: int = 0) -> dict:
    c: dict = {
        "name": name,
        "image": "registry.example/app:1.0",
        "imagePullPolicy": "IfNotPresent",
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "env": [{"name": f"VAR_{i}", "value": "x" * 64} for i in range(env)],
    }
    if resources is not None:
        c["resources"] = resources
    return c


def _pod(*containers: dict) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "app-5f7c9d-", "namespace": "bench", "labels": {"app": "b"}},
        "spec": {"containers": list(containers), "restartPolicy": "Always"},
    }


SHAPES = {
    "1 container, resources {}": _pod(_container("a", {})),
    "1 container, cpu/memory limits": _pod(
        _container("a", {"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "1"}})
    ),
    "5 containers, mixed": _pod(
        *(_container(f"c{i}", [{}, None, {"limits": {"cpu": "1"}}][i % 3]) for i in range(5))
    ),
    "left alone (kube-system)": _pod(_container("a", {})),
    "large pod (about 1 MiB, 4 containers)": _pod(
        *(_container(f"c{i}", {}, env=3000) for i in range(4))
    ),
}


def _review(pod: dict, shape: str) -> bytes:
    namespace = "kube-system" if "kube-system" in shape else "bench"
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": namespace,
                "operation": "CREATE",
                "object": pod,
                "dryRun": False,
            },
        }
    ).encode()


def _spread(samples: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in samples]
    return {
        "p50_ms": round(percentile(ms, 50), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "max_ms": round(max(ms), 3),
        "n": len(ms),
    }


async def _wait_ready(stderr: trio.abc.ReceiveStream) -> str:
    buffer = b""
    with trio.fail_after(WAIT_LIMIT):
        while True:
            chunk = await stderr.receive_some(65536)
            if not chunk:
                raise RuntimeError(f"bench: the webhook ended: {buffer.decode()}")
            buffer += chunk
            for line in buffer.decode("utf-8", "replace").splitlines():
                if line.startswith(READY):
                    return line.split()[-1]


async def run_bench(reviews: int, json_path: Path | None) -> dict:
    try:
        import httpx
        import trustme
    except ImportError as err:
        raise SystemExit(
            f"bench-webhook needs the test extras ({err.name}): pip install '.[test]'"
        ) from None
    import ssl

    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="powerdev-bench-webhook-") as tmp:
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1")
        tls = Path(tmp) / "tls"
        tls.mkdir()
        (tls / "tls.crt").write_bytes(b"".join(b.bytes() for b in cert.cert_chain_pems))
        (tls / "tls.key").write_bytes(cert.private_key_pem.bytes())
        context = ssl.create_default_context()
        ca.configure_trust(context)
        command = [
            sys.executable, "-m", "powerdev", "webhook",
            "--listen", "127.0.0.1:0", "--cert-dir", str(tls),
            "--config", str(Path(tmp) / "webhook.json"),
            "--log-level", "warning", "--drain-seconds", "0",
        ]  # fmt: skip
        proc = await trio.lowlevel.open_process(command, stderr=subprocess.PIPE)
        try:
            url = await _wait_ready(proc.stderr)
            rss_start = rss_kib(proc.pid)
            rows.append({"measure": "RSS after start", "mib": round((rss_start or 0) / 1024, 1)})
            headers = {"content-type": "application/json"}
            for shape, pod in SHAPES.items():
                count = max(10, reviews // (20 if "large" in shape else 1))
                samples: list[float] = []
                body = _review(pod, shape)
                while len(samples) < count:
                    # hypercorn ends a connection after 1,000 requests (GOAWAY), which
                    # also spreads the API server's load over the replicas; so at most
                    # 500 per connection here, the first 10 of each to warm up
                    async with httpx.AsyncClient(
                        base_url=url, verify=context, http2=True, timeout=WAIT_LIMIT
                    ) as http:
                        for i in range(min(510, count - len(samples) + 10)):
                            start = time.perf_counter()
                            answer = await http.post("/mutate", content=body, headers=headers)
                            elapsed = time.perf_counter() - start
                            if (
                                answer.status_code != 200
                                or not answer.json()["response"]["allowed"]
                            ):
                                raise RuntimeError(f"bench: unexpected answer {answer.status_code}")
                            if i >= 10:
                                samples.append(elapsed)
                rows.append(
                    {"measure": f"review, kept-alive h2: {shape}", "bytes": len(body),
                     **_spread(samples)}
                )  # fmt: skip
            samples = []
            body = _review(SHAPES["1 container, resources {}"], "")
            for _ in range(max(10, reviews // 10)):
                start = time.perf_counter()
                async with httpx.AsyncClient(base_url=url, verify=context, http2=True) as http:
                    answer = await http.post("/mutate", content=body, headers=headers)
                samples.append(time.perf_counter() - start)
                if answer.status_code != 200:
                    raise RuntimeError(f"bench: unexpected answer {answer.status_code}")
            rows.append(
                {"measure": "review on a new connection (TLS handshake)", **_spread(samples)}
            )
            rss_end = rss_kib(proc.pid)
            rows.append(
                {"measure": "RSS after the reviews", "mib": round((rss_end or 0) / 1024, 1)}
            )
        finally:
            proc.terminate()
            with trio.move_on_after(10):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    result = {
        "machine": {
            "python": platform.python_version(),
            "machine": platform.machine(),
            "kernel": platform.release(),
        },
        "rows": rows,
    }
    for row in rows:
        figures = ", ".join(f"{k} {v}" for k, v in row.items() if k != "measure")
        print(f"{row['measure']}: {figures}")
    if json_path is not None:
        await trio.Path(json_path).write_text(json.dumps(result, indent=2))
    return result
