"""`powerdev webhook`: the ASGI app (/mutate, /healthz, /readyz) served over
HTTPS by hypercorn's Trio worker, beside the config and key-pair watches, in
one nursery. Its neighbours: review.py answers, tls.py holds the key pair,
config.py reads webhook.json.

The HTTP edge checks what it can before any JSON is parsed: the path and
method, the content type, and the body size (Content-Length first, then the
bytes as they arrive). What fails there gets an HTTP error status; with
failurePolicy Ignore the API server then admits the pod unmodified.
"""

from __future__ import annotations

import json
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from powerdev.config import ConfigError, decode_config
from powerdev.config.watch import ConfigWatch
from powerdev.webhook import review
from powerdev.webhook.config import (
    DEFAULT_LISTEN,
    DEFAULT_MAX_BODY,
    DEFAULT_NAMESPACE,
    WebhookConfig,
    load_webhook_config,
    parse_webhook_config,
)
from powerdev.webhook.tls import KeyPair

log = logging.getLogger(__name__)
READY_LINE = "powerdev webhook: serving"
DRAIN_FACTOR = 4  # an over-limit body up to this many times the limit is read and dropped

Scope = dict
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


@dataclass(frozen=True)
class Settings:
    config_path: Path
    cert_dir: Path
    listen: str = DEFAULT_LISTEN
    namespace: str = DEFAULT_NAMESPACE
    max_body: int = DEFAULT_MAX_BODY
    drain_seconds: float = 5.0


class ConfigHolder:
    """The config in force. A changed file is applied when valid; a bad or
    vanished one is logged once and the last good config stays in force."""

    def __init__(self, path: Path, config: WebhookConfig) -> None:
        self.path = path
        self.config = config
        self.applied = 1
        self.rejected = 0
        self._seen = self._read()
        self._tried = trio.Event()

    def _read(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:
            return f"unreadable: {err}".encode()

    def reload(self) -> bool:
        seen = self._read()
        if seen == self._seen:
            return True
        self._seen = seen
        try:
            if seen is None:
                log.warning("%s is gone; the last good webhook config stays in force", self.path)
                self.rejected += 1
                return False
            try:
                config = parse_webhook_config(
                    decode_config(seen, str(self.path)), source=str(self.path)
                )
            except ConfigError as err:
                log.error("webhook config not applied, the last good one stays in force: %s", err)
                self.rejected += 1
                return False
            self.config = config
            self.applied += 1
            log.info("webhook config applied: %s", config.describe())
            return True
        finally:
            self._tried.set()
            self._tried = trio.Event()

    async def wait_until(self, predicate: Callable[[ConfigHolder], bool]) -> None:
        while not predicate(self):
            await self._tried.wait()

    async def watch(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Reload on a change in the file's directory (inotify) and on SIGHUP."""
        with (
            ConfigWatch(self.path) as watch,
            trio.open_signal_receiver(signal.SIGHUP) as hangups,
        ):
            task_status.started()
            async with trio.open_nursery() as nursery:

                async def on_hangup() -> None:
                    async for _ in hangups:
                        log.info("received SIGHUP: reading %s again", self.path)
                        self.reload()

                nursery.start_soon(on_hangup)
                while True:
                    await watch.wait_for_change()
                    self.reload()


class WebhookApp:
    """The ASGI application. `ready` is what /readyz reports."""

    def __init__(self, holder: ConfigHolder, *, namespace: str, max_body: int) -> None:
        self.holder = holder
        self.namespace = namespace
        self.max_body = max_body
        self.ready = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
        elif scope["type"] == "http":
            status, body = await self._handle(scope, receive)
            kind = b"application/json" if body.startswith(b"{") else b"text/plain; charset=utf-8"
            headers = [(b"content-type", kind), (b"content-length", str(len(body)).encode())]
            if status == 405:
                allowed = b"POST" if scope["path"] == "/mutate" else b"GET, HEAD"
                headers.append((b"allow", allowed))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
        else:  # a websocket: not ours
            await send({"type": "websocket.close", "code": 1008})

    async def _handle(self, scope: Scope, receive: Receive) -> tuple[int, bytes]:
        path, method = scope["path"], scope["method"]
        if path in ("/healthz", "/readyz"):
            if method not in ("GET", "HEAD"):
                return 405, b"use GET\n"
            if path == "/readyz" and not self.ready:
                return 503, b"not ready: stopping\n"
            return 200, b"ok\n"
        if path != "/mutate":
            return 404, b"not found: this webhook serves /mutate, /healthz and /readyz\n"
        if method != "POST":
            return 405, b"use POST with an AdmissionReview\n"
        headers = {k.lower(): v for k, v in scope["headers"]}
        media = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if media != b"application/json":
            return 415, b"the body must be application/json (an AdmissionReview)\n"
        length = headers.get(b"content-length")
        if length is not None and not length.isdigit():
            return 400, b"bad Content-Length\n"
        if length is not None and int(length) > DRAIN_FACTOR * self.max_body:
            return 413, self._too_large()  # not worth reading: answer, and the connection closes
        body = await _read_body(receive, self.max_body)
        if body is None:
            return 413, self._too_large()
        try:
            request = review.parse(body)
        except review.BadReview as err:
            log.warning("bad request to /mutate: %s", err)
            return 400, f"bad AdmissionReview: {err}\n".encode()
        try:
            result = review.answer(request, self.holder.config, own_namespace=self.namespace)
        except Exception:  # a bug of ours must not block a pod, nor stop the server
            log.exception("could not answer review %s; allowing it unmodified", request["uid"])
            result = review.unmodified(request["uid"], "the webhook failed; see its log")
        return 200, json.dumps(result, separators=(",", ":")).encode()

    def _too_large(self) -> bytes:
        return f"the body is larger than {self.max_body} bytes\n".encode()


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The request body, or None when it is over `limit` bytes (or the client
    left). A body somewhat over the limit is read to its end and dropped, so
    that the 413 reaches a client still sending, instead of a reset; past
    DRAIN_FACTOR times the limit, reading stops."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
        else:
            chunks.clear()
        more = message.get("more_body", False)
        if not more or size > DRAIN_FACTOR * limit:
            return b"".join(chunks) if size <= limit else None


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class _HypercornSettings(HypercornConfig):
    """Hypercorn's settings, serving with our key pair's context (reloadable)."""

    def __init__(self, keys: KeyPair, listen: str) -> None:
        super().__init__()
        self._keys = keys
        self.bind = [listen]
        self.certfile = str(keys.cert_path)
        self.keyfile = str(keys.key_path)
        self.errorlog = logging.getLogger("powerdev.webhook.http")
        self.accesslog = None
        self.include_server_header = False
        self.read_timeout = 10
        self.ssl_handshake_timeout = 10
        self.graceful_timeout = 5

    def create_ssl_context(self):  # type: ignore[override]
        return self._keys.front


@dataclass
class Prepared:
    """What is read before serving: a failure here stops the command at start."""

    config: WebhookConfig
    keys: KeyPair


def prepare(settings: Settings) -> Prepared:
    """Read the config and the key pair. Raises ConfigError or KeyPairError."""
    return Prepared(load_webhook_config(settings.config_path), KeyPair(settings.cert_dir))


@dataclass
class Serving:
    url: str
    app: WebhookApp
    keys: KeyPair
    holder: ConfigHolder
    stop: trio.Event


async def serve(
    settings: Settings,
    prepared: Prepared | None = None,
    *,
    task_status: trio.TaskStatus[Serving] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled, or until `stop` is set (then gracefully)."""
    prepared = prepared or prepare(settings)
    holder = ConfigHolder(settings.config_path, prepared.config)
    app = WebhookApp(holder, namespace=settings.namespace, max_body=settings.max_body)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(holder.watch)
        await nursery.start(prepared.keys.watch)

        async def http(*, task_status: trio.TaskStatus[list[str]]) -> None:
            await hypercorn_serve(
                app,
                _HypercornSettings(prepared.keys, settings.listen),
                shutdown_trigger=stop.wait,
                task_status=task_status,
                mode="asgi",
            )
            nursery.cancel_scope.cancel()  # the watches end with the server

        binds = await nursery.start(http)
        app.ready = True
        log.info("webhook config: %s", prepared.config.describe())
        task_status.started(Serving(binds[0], app, prepared.keys, holder, stop))


async def run_until_signalled(
    settings: Settings, prepared: Prepared, say: Callable[[str], None]
) -> None:
    """Serve; on SIGTERM or SIGINT report not ready, keep answering for
    `drain_seconds` (while the Service's endpoints catch up), then stop."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            serving: Serving = await nursery.start(partial(serve, settings, prepared))
            say(f"{READY_LINE} {serving.url}")

            async def on_signal() -> None:
                async for signum in signals:
                    log.info(
                        "received %s: not ready; stopping in %.1f s",
                        signal.Signals(signum).name,
                        settings.drain_seconds,
                    )
                    serving.app.ready = False
                    await trio.sleep(settings.drain_seconds)
                    serving.stop.set()
                    return

            nursery.start_soon(on_signal)
