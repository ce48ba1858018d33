"""The operator's HTTP port: /metrics (Prometheus), /healthz and /readyz.

Served by the daemon's own Trio loop, beside everything else in its nursery:
h11 parses HTTP/1.1, one Trio task per connection, no thread. Anyone who can
reach the pod can reach the port, so it is served so that a probe is always
answered at once, whatever other clients do, and so that nobody can make
the daemon hold more than a bounded number of descriptors and bytes:

- No client ever waits for another: every pending connection is accepted
  (see powerdev/support/bounded.py, which the webhook shares), none waits
  for a free slot, and no error of accept() ends the port. At most
  connection_limit() stay open; past it, each new connection closes the
  oldest one from its own address if that holds at least its share, else
  from the address holding the most, whatever it is doing, if it is
  SPARE_SECONDS old; past twice the limit, whatever its age. A probe or a
  scrape lasts milliseconds, so only connections held open on purpose are
  closed, and a probe's only by a flood from its own address of twice the
  limit's connections within those milliseconds.
- Requests that want the same answer at the same moment share one
  computation of it (OpsApp.respond), so that the loop's work grows with
  the connections, not with the cost of /metrics or of the health checks.
- Each connection has REQUEST_SECONDS in all (its request head, our answer,
  sent), then it is closed; one request per connection (Connection: close).
- A request head of at most MAX_HEAD bytes (431 beyond); a body is never
  read, only up to DRAIN_BYTES of it drained after the answer.
- GET only, three paths; anything else is a fixed refusal.

The listening socket is bound before Trio starts (listen()), so a bad
address stops `powerdev run` at once, and a probe that comes during the
first scan waits in the backlog.

/healthz: the loop answers, and every resource is waiting for the kubelet,
registering again, or serving on a socket that accepts connections.
/readyz: every resource is registered with the kubelet and its socket
accepts connections. Both say why in the body, one line per resource, as
`powerdev health` does.

Why not hypercorn, an ASGI server with a Trio worker: it has no bound on
open connections and none can be added through its API (only by driving
its private TCPServer class from our own accept loop); its sends are shielded
from cancellation, so a client that never reads an answer larger than the
socket buffers holds the connection, and the server's shutdown, for ever;
and it speaks HTTP/2 on a plain port to any client that asks (prior
knowledge or h2c), which a read-only port of three paths does not need.
"""

from __future__ import annotations

import logging
import socket
from http import HTTPStatus
from typing import TYPE_CHECKING

import trio
from prometheus_client.exposition import choose_encoder

from powerdev import __version__
from powerdev.config import ConfigError
from powerdev.ops import health, metrics
from powerdev.ops.oplog import bound_address
from powerdev.support import bounded
from powerdev.support.bounded import (
    ListenError as ListenError,  # raised by listen(); the CLI catches it by this name
)
from powerdev.support.bounded import (
    OpenConnections,
    accept_connections,
    parse_address,
)

if TYPE_CHECKING:
    import h11

    from powerdev.ops.status import StatusFile
    from powerdev.resources.plugin import Plugin

log = logging.getLogger(__name__)
MAX_HEAD = 8 * 1024  # request line and headers; a probe or a scrape sends a few hundred bytes
REQUEST_SECONDS = 5.0  # a connection's whole life: the request, our answer, sent
MAX_OPEN = 512  # connections kept open; past this, a new one closes an old one (see below)
MIN_OPEN = 16  # ... unless the descriptor limit is so low that a quarter of it is less
SPARE_SECONDS = 1.0  # past the limit, a younger connection is closed only past twice the limit
DRAIN_BYTES = 64 * 1024  # after answering, unread bytes read and dropped (so the answer arrives)
DRAIN_SECONDS = 1.0
PATHS = "/metrics, /healthz, /readyz"


def listen(address: str) -> socket.socket:
    """A listening TCP socket for `address` (see parse_address). ConfigError
    for an address that is not one; ListenError when it cannot be had. Both
    name the option and the fix."""
    try:
        parse_address(address)
    except ValueError as err:
        raise ConfigError("--metrics-address", None, str(err), "use e.g. :8080") from None
    return bounded.listen(
        address,
        "--metrics-address",
        "choose a free port and an address of this host, or leave it unset",
    )


Answer = tuple[int, str, bytes]  # status, content type, body


class _Shared:
    """One computation of an answer, and the requests waiting for it."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.answer: Answer | None = None


class OpsApp:
    """Answers one request: (status, content type, body)."""

    def __init__(self, plugins: list[Plugin], status: StatusFile) -> None:
        self.plugins = plugins
        self.status = status
        self._computing: dict[tuple[bytes, str], _Shared] = {}

    async def respond(self, method: bytes, target: bytes, accept: str) -> Answer:
        """answer(), made once for all the requests for the same answer that
        come in the same scheduling round: however many clients ask at once,
        the loop spends one /metrics exposition and one health check (a
        connect per resource) on them, and never answers with something made
        before the request came."""
        path = target.split(b"?", 1)[0]
        if method != b"GET" or path not in (b"/metrics", b"/healthz", b"/readyz"):
            return self.answer(method, target, accept)  # a fixed refusal: nothing to share
        kind = choose_encoder(accept)[1] if path == b"/metrics" else ""
        key = (path, kind)
        shared = self._computing.get(key)
        if shared is not None:
            await shared.done.wait()
            if shared.answer is None:
                raise RuntimeError(f"answering {path.decode()} failed (see the first error)")
            return shared.answer
        shared = self._computing[key] = _Shared()
        try:
            await trio.lowlevel.cancel_shielded_checkpoint()  # the others of this round join
            shared.answer = self.answer(method, path, accept)
        finally:
            self._computing.pop(key, None)
            shared.done.set()
        return shared.answer

    def answer(self, method: bytes, target: bytes, accept: str) -> Answer:
        path = target.split(b"?", 1)[0]
        if path not in (b"/metrics", b"/healthz", b"/readyz"):
            return 404, "text/plain", f"not found: this port serves {PATHS}\n".encode()
        if method != b"GET":
            return 405, "text/plain", b"only GET is served here\n"
        if path == b"/metrics":
            encode, content_type = choose_encoder(accept)
            return 200, content_type, encode(metrics.REGISTRY)
        lines: list[str] = []
        ok = health.judge(self._resources(), ready=path == b"/readyz", say=lines.append)
        lines.append(f"powerdev {__version__}: {'ok' if ok else 'not ok'}")
        return (200 if ok else 503), "text/plain", ("\n".join(lines) + "\n").encode()

    def _resources(self) -> dict[str, dict[str, object]]:
        """Each resource's state; one that has not reported yet is waiting."""
        known = self.status.resources
        names = [p.resource.name for p in self.plugins]
        return {name: dict(known.get(name, {"state": "waiting"})) for name in names}


def connection_limit() -> int:
    """How many connections the port keeps open: MAX_OPEN, or a quarter of
    the process's descriptor limit when that is lower (see
    bounded.connection_limit), so that the port can never take the
    descriptors the kubelet's sockets and the device watches need."""
    return bounded.connection_limit(MAX_OPEN, MIN_OPEN)


async def serve(
    sock: socket.socket,
    plugins: list[Plugin],
    status: StatusFile,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the port until cancelled; started() with the bound address."""
    import h11  # noqa: F401  # the HTTP parser, loaded now the port is on: not by every `run`

    app = OpsApp(plugins, status)
    connections = OpenConnections(
        connection_limit(), name="metrics port", spare_seconds=SPARE_SECONDS
    )
    address = bound_address(sock)
    sock.setblocking(False)
    log.info("serving %s on %s", PATHS, address)
    try:
        async with trio.open_nursery() as nursery:

            def start(stream: trio.SocketStream, peer: str) -> None:
                scope = connections.add(stream, peer, REQUEST_SECONDS)
                nursery.start_soon(_connection, app, stream, scope, connections)

            task_status.started(address)
            await accept_connections(sock, connections, start)
    finally:
        sock.close()


async def _connection(
    app: OpsApp,
    stream: trio.SocketStream,
    scope: trio.CancelScope,
    connections: OpenConnections,
) -> None:
    try:
        with scope:
            if await _exchange(app, stream):
                with trio.move_on_after(DRAIN_SECONDS):
                    await _drain(stream)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass  # the client went away, or we closed it to make room
    except Exception:  # a bug of ours must never stop the daemon
        log.exception("metrics port: answering a request failed")
    finally:
        connections.remove(stream)
        await trio.aclose_forcefully(stream)


async def _exchange(app: OpsApp, stream: trio.SocketStream) -> bool:
    """Read one request head, answer it, and say the connection closes.
    True when an answer was sent."""
    import h11  # loaded by serve(): a lookup here

    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as err:
            await _send(conn, stream, err.error_status_hint, "text/plain", b"bad request\n")
            return True
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(4096))
            continue
        if isinstance(event, h11.Request):
            break
        return False  # the client closed, or sent something that is not a request
    accept = next((v for k, v in event.headers if k == b"accept"), b"").decode("latin-1")
    status, content_type, body = await app.respond(event.method, event.target, accept)
    await _send(conn, stream, status, content_type, body, head=event.method == b"HEAD")
    return True


async def _send(
    conn: h11.Connection,
    stream: trio.SocketStream,
    status: int,
    content_type: str,
    body: bytes,
    *,
    head: bool = False,
) -> None:
    headers = [
        ("content-type", content_type),
        ("content-length", str(len(body))),
        ("connection", "close"),
    ]
    import h11  # loaded by serve(): a lookup here

    if status == 405:
        headers.append(("allow", "GET"))
    try:
        data = conn.send(h11.Response(status_code=status, headers=headers, reason=_reason(status)))
        if not head:  # an answer to HEAD has headers only
            data += conn.send(h11.Data(data=body))
        data += conn.send(h11.EndOfMessage())
    except h11.LocalProtocolError:
        return  # h11 cannot frame an answer after this error: just close
    await stream.send_all(data)
    await stream.send_eof()


def _reason(status: int) -> bytes:
    """The standard reason phrase (h11 sends none unless told)."""
    try:
        return HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b""


async def _drain(stream: trio.SocketStream) -> None:
    """Read what the client still sends (a body we ignored), up to a bound,
    so that closing does not reset the connection before it has our answer."""
    left = DRAIN_BYTES
    while left > 0:
        data = await stream.receive_some(min(left, 4096))
        if not data:
            return
        left -= len(data)
