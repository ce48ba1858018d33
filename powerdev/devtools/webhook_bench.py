"""`powerdev bench-webhook`: the real `powerdev webhook` process on a TLS
socket on 127.0.0.1 (certificates from a test CA made for the run), asked
by httpx as the API server asks: AdmissionReviews, one after another, on a
kept-alive connection (HTTP/2 offered, HTTP/1.1 answered), and on a new
connection each (handshake included). It reports review latency (p50, p99,
max) per pod shape and the process's RSS before and after.

Then the hostile clients: HOSTILE TLS connections that each send the head
of a review of the largest body the webhook takes (3 MiB, --max-body) and
all of that body but its last byte, and then wait. It reports the highest
RSS seen while they are open (sampled every RSS_EVERY seconds for at most
HOLD_SECONDS), how many the webhook ended within that time, and the
latency of reviews on new connections meanwhile. It asserts nothing;
`--json` writes the figures."""

from __future__ import annotations

import json
import platform
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from powerdev.devtools.bench import percentile
from powerdev.devtools.testing import rss_kib

if TYPE_CHECKING:
    import trustme

WAIT_LIMIT = 60.0
READY = "powerdev webhook: serving"
HOSTILE = 60  # connections
HOSTILE_BODY = 3 * 1024 * 1024  # the webhook's default --max-body
HOLD_SECONDS = 15.0  # past the webhook's request deadline (10 s by default)
RSS_EVERY = 0.1


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


async def _review_on_a_new_connection(
    url: str, context: ssl.SSLContext, body: bytes, headers: dict[str, str]
) -> float:
    """Seconds for one review on a connection of its own (its TLS handshake
    included)."""
    import httpx  # the bench's only client library, imported when it runs

    began = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, verify=context, timeout=WAIT_LIMIT) as http:
        answer = await http.post("/mutate", content=body, headers=headers)
    if answer.status_code != 200:
        raise RuntimeError(f"bench: unexpected answer {answer.status_code}")
    return time.perf_counter() - began


async def _hostile(url: str, ca: trustme.CA, pid: int, body: bytes, reviews: int) -> list[dict]:
    """HOSTILE connections holding unfinished 3 MiB bodies: the highest RSS
    while they are open, how many the webhook ends, and reviews meanwhile."""
    host, port = url.removeprefix("https://").rsplit(":", 1)
    head = (
        "POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {HOSTILE_BODY}\r\n\r\n"
    ).encode()
    context = ssl.create_default_context()
    ca.configure_trust(context)
    hostile_context = ssl.create_default_context()
    ca.configure_trust(hostile_context)
    hostile_context.set_alpn_protocols(["http/1.1"])
    sent = trio.Event()
    all_ended = trio.Event()
    ready = 0
    ended = 0
    rss_max = 0

    async def one() -> None:
        nonlocal ready, ended
        tcp = await trio.open_tcp_stream(host, int(port))
        stream = trio.SSLStream(tcp, hostile_context, server_hostname=host)
        try:
            await stream.send_all(head + b" " * (HOSTILE_BODY - 1))
        except trio.BrokenResourceError:
            pass  # refused before the body was all sent
        ready += 1
        if ready == HOSTILE:
            sent.set()
        try:
            while await stream.receive_some(65536):
                pass  # an answer (a refusal): read, then the end
        except trio.BrokenResourceError:
            pass
        ended += 1
        if ended == HOSTILE:
            all_ended.set()
        await trio.aclose_forcefully(stream)

    samples: list[float] = []
    headers = {"content-type": "application/json"}
    async with trio.open_nursery() as nursery:
        for _ in range(HOSTILE):
            nursery.start_soon(one)
        with trio.fail_after(WAIT_LIMIT):
            await sent.wait()
        start = time.monotonic()

        async def sample_rss() -> None:
            nonlocal rss_max
            while time.monotonic() - start < HOLD_SECONDS and ended < HOSTILE:
                rss_max = max(rss_max, rss_kib(pid) or 0)
                await trio.sleep(RSS_EVERY)

        nursery.start_soon(sample_rss)
        for _ in range(reviews):
            samples.append(await _review_on_a_new_connection(url, context, body, headers))
        with trio.move_on_at(trio.current_time() + HOLD_SECONDS - (time.monotonic() - start)):
            await all_ended.wait()
        held = time.monotonic() - start
        nursery.cancel_scope.cancel()
    return [
        {
            "measure": f"RSS, highest while {HOSTILE} connections hold 3 MiB bodies unfinished",
            "mib": round(rss_max / 1024, 1),
        },
        {
            "measure": f"of {HOSTILE} hostile connections, ended by the webhook",
            "ended": ended,
            "within_s": round(held, 1),
        },
        {
            "measure": f"review on a new connection while {HOSTILE} hostile ones are open",
            **_spread(samples),
        },
    ]


async def run_bench(reviews: int, json_path: Path | None) -> dict:
    try:
        import httpx
        import trustme
    except ImportError as err:
        raise SystemExit(
            f"bench-webhook needs the test extras ({err.name}): pip install '.[test]'"
        ) from None

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
                    # at most 500 per connection here, the first 10 of each to warm up
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
                    {"measure": f"review, kept-alive: {shape}", "bytes": len(body),
                     **_spread(samples)}
                )  # fmt: skip
            samples = []
            body = _review(SHAPES["1 container, resources {}"], "")
            for _ in range(max(10, reviews // 10)):
                samples.append(await _review_on_a_new_connection(url, context, body, headers))
            rows.append(
                {"measure": "review on a new connection (TLS handshake)", **_spread(samples)}
            )
            rss_end = rss_kib(proc.pid)
            rows.append(
                {"measure": "RSS after the reviews", "mib": round((rss_end or 0) / 1024, 1)}
            )
            rows.extend(await _hostile(url, ca, proc.pid, body, max(10, reviews // 100)))
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
