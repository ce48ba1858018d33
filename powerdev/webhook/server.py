"""`powerdev webhook`: /mutate, /healthz and /readyz over HTTPS (HTTP/1.1,
kept alive), served by our own Trio loop beside the config and key-pair
watches, in one nursery. Its neighbours: review.py answers, tls.py holds the
key pair, config.py reads webhook.json; powerdev/support/bounded.py has the
accept loop and the connection bound it shares with the daemon's metrics
port.

Any pod in the cluster that can reach the port is a client, and with
failurePolicy Ignore a webhook that is down means pods created without
their devices, silently. So nothing a client does can make it hold more
than a bounded number of connections, seconds and bytes:

- Every pending connection is accepted, none waits for a free slot; at most
  --max-connections stay open (or a quarter of the descriptor limit), and
  past that a new one closes the oldest from its own address if that holds
  its share, else from the address holding the most (OpenConnections): a
  client holding many connections pushes out its own, not the API
  server's few.
- A TLS handshake has --handshake-seconds from the accept; a request, from
  its first byte to our answer sent (its head, its body, the review), has
  --request-seconds; a kept-alive connection may wait IDLE_SECONDS for its
  next request. Past a deadline the connection is closed.
- A request head is at most MAX_HEAD bytes (431 beyond); a body at most
  --max-body (413; declared over DRAIN_FACTOR times that, not read at all).
  Each connection may hold SMALL_BODY bytes of a body; what bodies hold
  beyond that comes from one budget of BUDGET_BODIES times --max-body for
  all the connections together, and a body that finds it spent gets 503.
  So the memory held for clients is at most about 150 KiB a connection
  (SMALL_BODY, the head, a TLS connection's state and buffers), for up to
  twice --max-connections, plus the budget, whatever they send: with the
  defaults, some 50 MiB over the process's own (measured by
  `powerdev bench-webhook`; see docs/webhook.md).
- Each kind of refusal is logged at most once a minute, with a count.

The edge checks what it can before any JSON is parsed: the path and
method, the content type, and the body size (Content-Length first, then the
bytes as they arrive). What fails there gets an HTTP error status; with
failurePolicy Ignore the API server then admits the pod unmodified.

Only HTTP/1.1 is offered (ALPN): the API server speaks it as well as
HTTP/2, and keeps a few connections alive to each replica.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from http import HTTPStatus
from pathlib import Path

import h11
import trio

from powerdev.config import ConfigError, decode_config
from powerdev.config.watch import ConfigWatch
from powerdev.support.bounded import (
    ListenError,
    LogEvery,
    OpenConnections,
    accept_connections,
    connection_limit,
    listen,
)
from powerdev.webhook import review
from powerdev.webhook.config import (
    DEFAULT_HANDSHAKE_SECONDS,
    DEFAULT_LISTEN,
    DEFAULT_MAX_BODY,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_NAMESPACE,
    DEFAULT_REQUEST_SECONDS,
    WebhookConfig,
    load_webhook_config,
    parse_webhook_config,
)
from powerdev.webhook.tls import KeyPair

log = logging.getLogger(__name__)
READY_LINE = "powerdev webhook: serving"
DRAIN_FACTOR = 4  # an over-limit body up to this many times the limit is read and dropped
MAX_HEAD = 16 * 1024  # request line and headers; the API server sends a few hundred bytes
RECEIVE_BYTES = 16 * 1024  # read at most this much at a time (a TLS record)
SMALL_BODY = 16 * 1024  # body bytes any connection may hold; a review is about 1 KiB
BUDGET_BODIES = 4  # body bytes beyond SMALL_BODY, for all connections: this many --max-body
IDLE_SECONDS = 100.0  # a kept-alive connection's wait for its next request (> Go's 90 s)
MIN_OPEN = 16  # connections kept open however low the descriptor limit
DRAIN_BYTES = 64 * 1024  # before closing: unread bytes read and dropped (so the answer arrives)
DRAIN_SECONDS = 1.0
GRACE_SECONDS = 5.0  # at a stop, requests under way get this long to be answered


@dataclass(frozen=True)
class Settings:
    config_path: Path
    cert_dir: Path
    listen: str = DEFAULT_LISTEN
    namespace: str = DEFAULT_NAMESPACE
    max_body: int = DEFAULT_MAX_BODY
    drain_seconds: float = 5.0
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    request_seconds: float = DEFAULT_REQUEST_SECONDS
    handshake_seconds: float = DEFAULT_HANDSHAKE_SECONDS


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


Answer = tuple[int, bytes]  # status, body


class WebhookApp:
    """What each request gets. `ready` is what /readyz reports."""

    def __init__(self, holder: ConfigHolder, *, namespace: str, max_body: int) -> None:
        self.holder = holder
        self.namespace = namespace
        self.max_body = max_body
        self.ready = False
        self._bad = LogEvery()

    def before_body(self, method: str, path: str, headers: dict[bytes, bytes]) -> Answer | None:
        """The answer a request gets from its head alone, or None: read the
        body (at most max_body bytes) and call review() with it."""
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
        media = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if media != b"application/json":
            return 415, b"the body must be application/json (an AdmissionReview)\n"
        length = headers.get(b"content-length")
        if length is not None and int(length) > DRAIN_FACTOR * self.max_body:
            return 413, self.too_large()  # not worth reading: answer, and the connection closes
        return None

    def review(self, body: bytes) -> Answer:
        try:
            request = review.parse(body)
        except review.BadReview as err:
            if self._bad.due():
                log.warning("bad request to /mutate: %s", err)
            return 400, f"bad AdmissionReview: {err}\n".encode()
        try:
            result = review.answer(request, self.holder.config, own_namespace=self.namespace)
        except Exception:  # a bug of ours must not block a pod, nor stop the server
            log.exception("could not answer review %s; allowing it unmodified", request["uid"])
            result = review.unmodified(request["uid"], "the webhook failed; see its log")
        return 200, json.dumps(result, separators=(",", ":")).encode()

    def too_large(self) -> bytes:
        return f"the body is larger than {self.max_body} bytes\n".encode()


class BodyBudget:
    """The body bytes all connections together may hold beyond SMALL_BODY
    each. take() says no when that would pass `total`."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self.refused = 0
        self._log = LogEvery()

    def take(self, size: int) -> bool:
        if self.used + size > self.total:
            self.refused += 1
            if self._log.due():
                log.warning(
                    "webhook: request bodies hold %d bytes beyond %d each (the limit, %d times "
                    "--max-body): a large one is refused with 503 (%d so far); some client "
                    "sends large bodies slowly",
                    self.used,
                    SMALL_BODY,
                    BUDGET_BODIES,
                    self.refused,
                )
            return False
        self.used += size
        return True

    def give(self, size: int) -> None:
        self.used -= size


class _Close(Exception):
    """The connection ends after this answer (sent by _send)."""


class HttpsServer:
    """Serves `app` on a listening socket with the key pair's TLS context,
    within the bounds the module's docstring lists."""

    def __init__(self, app: WebhookApp, keys: KeyPair, settings: Settings) -> None:
        self.app = app
        self.keys = keys
        self.settings = settings
        self.connections = OpenConnections(
            connection_limit(settings.max_connections, MIN_OPEN), name="webhook"
        )
        self.budget = BodyBudget(BUDGET_BODIES * settings.max_body)
        self.stopping = False
        self.timed_out = 0  # connections closed at a deadline, since the start
        self._idle: set[trio.CancelScope] = set()
        self._log_timeout = LogEvery()

    async def serve(
        self,
        sock: socket.socket,
        stop: trio.Event,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept until `stop`; then answer the requests under way (for at
        most GRACE_SECONDS), close the idle connections and return."""
        sock.setblocking(False)
        try:
            async with trio.open_nursery() as handlers:

                def start(stream: trio.SocketStream, peer: str) -> None:
                    scope = self.connections.add(stream, peer, self.settings.handshake_seconds)
                    handlers.start_soon(self._connection, stream, peer, scope)

                async with trio.open_nursery() as accepting:
                    accepting.start_soon(accept_connections, sock, self.connections, start)
                    task_status.started()
                    await stop.wait()
                    accepting.cancel_scope.cancel()
                sock.close()
                self.stopping = True
                for scope in list(self._idle):
                    scope.cancel()
                handlers.cancel_scope.deadline = trio.current_time() + GRACE_SECONDS
        finally:
            sock.close()

    async def _connection(self, tcp: trio.SocketStream, peer: str, scope: trio.CancelScope) -> None:
        stream = trio.SSLStream(tcp, self.keys.front, server_side=True, https_compatible=True)
        phase = "TLS handshake"
        try:
            with scope:
                try:
                    await stream.do_handshake()
                except trio.BrokenResourceError as err:
                    log.debug("webhook: TLS handshake with %s failed: %r", peer, err.__cause__)
                    return
                phase = "request"
                conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
                scope.deadline = trio.current_time() + self.settings.request_seconds
                try:
                    kept = False
                    while await self._exchange(conn, stream, scope, kept):
                        conn.start_next_cycle()
                        kept = True
                except _Close:
                    with trio.move_on_after(DRAIN_SECONDS):
                        await _drain(stream)
                await stream.aclose()  # close_notify, then the socket
            if scope.cancelled_caught and tcp in self.connections and not self.stopping:
                self.timed_out += 1
                if self._log_timeout.due():
                    log.warning(
                        "webhook: closed a connection from %s that took longer than %.1f s "
                        "for its %s (%d closed so far); some client is slow, or holds "
                        "connections open",
                        peer,
                        self.settings.handshake_seconds
                        if phase == "TLS handshake"
                        else self.settings.request_seconds,
                        phase,
                        self.timed_out,
                    )
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the client went away, or we closed it to make room
        except Exception:  # a bug of ours must never stop the webhook
            log.exception("webhook: serving a connection from %s failed", peer)
        finally:
            self.connections.remove(tcp)
            await trio.aclose_forcefully(stream)

    async def _next_event(self, conn: h11.Connection, stream: trio.SSLStream) -> h11.Event:
        """The next event of the request, read as needed; a request that
        is not HTTP gets h11's error status, and the connection closes."""
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as err:
                status = err.error_status_hint
                if status == 431:
                    body = f"the request head is larger than {MAX_HEAD} bytes\n".encode()
                else:  # h11's words quote the client's bytes: not sent back
                    body = b"bad request: not HTTP/1.1 (this port serves /mutate over HTTPS)\n"
                await self._send(conn, stream, status, body)
                raise _Close from None
            if event is not h11.NEED_DATA:
                return event
            conn.receive_data(await stream.receive_some(RECEIVE_BYTES))

    async def _exchange(
        self, conn: h11.Connection, stream: trio.SSLStream, scope: trio.CancelScope, kept: bool
    ) -> bool:
        """One request and its answer; True if the connection serves another.
        On a connection `kept` alive after a first request, the wait for
        the next one is IDLE_SECONDS, and its deadline starts with its
        first byte."""
        if kept and conn.trailing_data == (b"", False):
            if self.stopping:
                return False
            scope.deadline = math.inf  # the wait's own, below; a shed still cancels `scope`
            with trio.move_on_after(IDLE_SECONDS) as waiting:
                self._idle.add(waiting)
                try:
                    data = await stream.receive_some(RECEIVE_BYTES)
                finally:
                    self._idle.discard(waiting)
            if waiting.cancelled_caught:
                return False  # idle too long, or we stop: close, quietly
            conn.receive_data(data)
        if kept:  # the next request's own deadline, also when it came with the last one
            scope.deadline = trio.current_time() + self.settings.request_seconds
        event = await self._next_event(conn, stream)
        if not isinstance(event, h11.Request):
            return False  # the client closed, or ended a kept-alive connection
        method, path = event.method.decode("ascii"), event.target.decode("ascii", "replace")
        path = path.split("?", 1)[0]
        headers = dict(event.headers)  # h11 gives names in lower case
        answer = self.app.before_body(method, path, headers)
        if answer is None:
            if conn.they_are_waiting_for_100_continue:
                await stream.send_all(conn.send(h11.InformationalResponse(status_code=100)))
            answer = await self._body_and_review(conn, stream)
        else:
            try:
                conn.next_event()  # the end of an empty body, if that is what came
            except h11.RemoteProtocolError:
                pass  # the answer closes the connection
        await self._send(conn, stream, *answer, head=method == "HEAD")
        if conn.our_state is h11.MUST_CLOSE:
            raise _Close
        return True

    async def _body_and_review(self, conn: h11.Connection, stream: trio.SSLStream) -> Answer:
        limit = self.app.max_body
        chunks: list[bytes] = []
        size = taken = 0
        try:
            while True:
                event = await self._next_event(conn, stream)
                if isinstance(event, h11.EndOfMessage):
                    break
                if not isinstance(event, h11.Data):
                    raise _Close  # the client went away in the middle of its body
                size += len(event.data)
                if size > DRAIN_FACTOR * limit:
                    break  # not worth reading further: the answer closes the connection
                if size > limit:
                    chunks.clear()
                    continue
                beyond = max(0, size - SMALL_BODY) - taken
                if beyond:
                    if not self.budget.take(beyond):
                        return 503, b"busy: too many large requests at once; try again\n"
                    taken += beyond
                chunks.append(event.data)
            if size > limit:
                return 413, self.app.too_large()
            body = b"".join(chunks)
            chunks.clear()
            return self.app.review(body)
        finally:
            self.budget.give(taken)

    async def _send(
        self,
        conn: h11.Connection,
        stream: trio.SSLStream,
        status: int,
        body: bytes,
        *,
        head: bool = False,
    ) -> None:
        kind = "application/json" if body.startswith(b"{") else "text/plain; charset=utf-8"
        headers = [("content-type", kind), ("content-length", str(len(body)))]
        if status == 405:
            headers.append(("allow", "POST" if body.startswith(b"use POST") else "GET, HEAD"))
        if self.stopping or conn.their_state is not h11.DONE:
            headers.append(("connection", "close"))  # not read to its end, or we stop
        reason = HTTPStatus(status).phrase.encode("ascii")
        try:
            data = conn.send(h11.Response(status_code=status, headers=headers, reason=reason))
            if not head:  # an answer to HEAD has headers only
                data += conn.send(h11.Data(data=body))
            data += conn.send(h11.EndOfMessage())
        except h11.LocalProtocolError:
            raise _Close from None  # h11 cannot frame an answer after this error: just close
        await stream.send_all(data)


async def _drain(stream: trio.abc.ReceiveStream) -> None:
    """Read what the client still sends (a body not read), up to a bound, so
    that closing does not reset the connection before it has our answer."""
    left = DRAIN_BYTES
    while left > 0:
        data = await stream.receive_some(min(left, 16384))
        if not data:
            return
        left -= len(data)


@dataclass
class Prepared:
    """What is read before serving: a failure here stops the command at start."""

    config: WebhookConfig
    keys: KeyPair
    sock: socket.socket


def prepare(settings: Settings) -> Prepared:
    """Read the config and the key pair, and bind the port. Raises
    ConfigError, KeyPairError or ListenError."""
    config = load_webhook_config(settings.config_path)
    try:
        sock = listen(settings.listen, "--listen", "choose a free port and an address of this host")
    except ValueError as err:
        raise ListenError(f"--listen {settings.listen!r}: {err}") from None
    try:
        return Prepared(config, KeyPair(settings.cert_dir), sock)
    except BaseException:
        sock.close()
        raise


@dataclass
class Serving:
    url: str
    app: WebhookApp
    keys: KeyPair
    holder: ConfigHolder
    stop: trio.Event
    server: HttpsServer


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
    server = HttpsServer(app, prepared.keys, settings)
    stop = trio.Event()
    host, port = prepared.sock.getsockname()[:2]
    url = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    async with trio.open_nursery() as nursery:
        await nursery.start(holder.watch)
        await nursery.start(prepared.keys.watch)

        async def http(*, task_status: trio.TaskStatus[None]) -> None:
            await server.serve(prepared.sock, stop, task_status=task_status)
            nursery.cancel_scope.cancel()  # the watches end with the server

        await nursery.start(http)
        app.ready = True
        log.info("webhook config: %s", prepared.config.describe())
        task_status.started(Serving(url, app, prepared.keys, holder, stop, server))


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
