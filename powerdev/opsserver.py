"""The operator's HTTP port: /metrics (Prometheus), /healthz and /readyz.

Served by the daemon's own Trio loop, beside everything else in its nursery:
h11 parses HTTP/1.1, one Trio task per connection, no thread. The port is
read-only and bounded so that it cannot become a way in or a way to stall
the daemon: GET only; a request head of at most MAX_HEAD bytes; each
connection gets REQUEST_SECONDS in all to send its request and take the
answer, then is closed; at most MAX_CONNECTIONS at once (more wait in the
kernel's backlog, not in memory). The listening socket is bound before
Trio starts (listen()), so a bad address stops `powerdev run` at once, and
a probe that comes during the first scan waits in the backlog.

/healthz: the loop answers, and every resource is waiting for the kubelet
or serving on a socket that accepts connections. /readyz: every resource
is registered with the kubelet and its socket accepts connections. Both
say why in the body, one line per resource, as `powerdev health` does.
"""

from __future__ import annotations

import errno
import logging
import socket
from typing import TYPE_CHECKING

import h11
import trio
from prometheus_client.exposition import choose_encoder

from powerdev import __version__, health, metrics
from powerdev.config import ConfigError

if TYPE_CHECKING:
    from powerdev.plugin import Plugin
    from powerdev.status import StatusFile

log = logging.getLogger(__name__)
MAX_HEAD = 8 * 1024  # request line and headers; a probe or a scrape sends a few hundred bytes
REQUEST_SECONDS = 5.0  # for the whole exchange: the request, our answer, sent
MAX_CONNECTIONS = 16  # handled at once; a kubelet probes one at a time, Prometheus scrapes one
DRAIN_BYTES = 64 * 1024  # after answering, unread bytes read and dropped (so the answer arrives)
DRAIN_SECONDS = 1.0
BACKLOG = 64
ACCEPT_PAUSE = 0.1  # after EMFILE and the like: try accepting again after this
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
PATHS = "/metrics, /healthz, /readyz"


def parse_address(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `:PORT` (every interface) or `[IPv6]:PORT` -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(
            f"{text!r} is not HOST:PORT, :PORT or [IPv6]:PORT (port 0 to 65535; 0: any free port)"
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{text!r}: write an IPv6 address in brackets, like [::1]:8080")
    return host, int(port)


def listen(address: str) -> socket.socket:
    """A listening TCP socket for `address` (see parse_address); ConfigError
    when it cannot be had, naming the option and the fix."""
    try:
        host, port = parse_address(address)
    except ValueError as err:
        raise ConfigError("--metrics-address", None, str(err), "use e.g. :8080") from None
    try:
        if host in ("", "*"):
            if socket.has_dualstack_ipv6():
                return socket.create_server(
                    ("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=BACKLOG
                )
            return socket.create_server(("0.0.0.0", port), backlog=BACKLOG)
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, _, _, _, where = infos[0]
        return socket.create_server(where, family=family, backlog=BACKLOG)
    except OSError as err:
        raise ConfigError(
            "--metrics-address",
            None,
            f"cannot listen on {address}: {err.strerror or err}",
            "choose a free port and an address of this host, or leave it unset",
        ) from None


def bound_address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class OpsApp:
    """Answers one request: (status, content type, body)."""

    def __init__(self, plugins: list[Plugin], status: StatusFile) -> None:
        self.plugins = plugins
        self.status = status

    def answer(self, method: bytes, target: bytes, accept: str) -> tuple[int, str, bytes]:
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


async def serve(
    sock: socket.socket,
    plugins: list[Plugin],
    status: StatusFile,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the port until cancelled; started() with the bound address."""
    app = OpsApp(plugins, status)
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
    limiter = trio.CapacityLimiter(MAX_CONNECTIONS)
    address = bound_address(sock)
    log.info("serving %s on %s", PATHS, address)
    try:
        async with trio.open_nursery() as nursery:
            task_status.started(address)
            while True:
                token = object()
                await limiter.acquire_on_behalf_of(token)
                try:
                    stream = await listener.accept()
                except OSError as err:
                    limiter.release_on_behalf_of(token)
                    if err.errno not in _OUT_OF_RESOURCES:
                        raise
                    log.warning("metrics port: cannot accept a connection: %s", err)
                    await trio.sleep(ACCEPT_PAUSE)
                    continue
                nursery.start_soon(_connection, app, stream, limiter, token)
    finally:
        await trio.aclose_forcefully(listener)


async def _connection(
    app: OpsApp, stream: trio.SocketStream, limiter: trio.CapacityLimiter, token: object
) -> None:
    try:
        answered = False
        with trio.move_on_after(REQUEST_SECONDS):
            await _exchange(app, stream)
            answered = True
        if answered:
            with trio.move_on_after(DRAIN_SECONDS):
                await _drain(stream)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass  # the client went away
    except Exception:  # a bug of ours must never stop the daemon
        log.exception("metrics port: answering a request failed")
    finally:
        limiter.release_on_behalf_of(token)
        await trio.aclose_forcefully(stream)


async def _exchange(app: OpsApp, stream: trio.SocketStream) -> None:
    """Read one request head, answer it, and say the connection closes."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as err:
            await _send(conn, stream, err.error_status_hint, "text/plain", b"bad request\n")
            return
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(4096))
            continue
        if isinstance(event, h11.Request):
            break
        return  # the client closed, or sent something that is not a request
    accept = next((v for k, v in event.headers if k == b"accept"), b"").decode("latin-1")
    status, content_type, body = app.answer(event.method, event.target, accept)
    await _send(conn, stream, status, content_type, body, head=event.method == b"HEAD")


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
    if status == 405:
        headers.append(("allow", "GET"))
    try:
        data = conn.send(h11.Response(status_code=status, headers=headers))
        if not head:  # an answer to HEAD has headers only
            data += conn.send(h11.Data(data=body))
        data += conn.send(h11.EndOfMessage())
    except h11.LocalProtocolError:
        return  # h11 cannot frame an answer after this error: just close
    await stream.send_all(data)
    await stream.send_eof()


async def _drain(stream: trio.SocketStream) -> None:
    """Read what the client still sends (a body we ignored), up to a bound,
    so that closing does not reset the connection before it has our answer."""
    left = DRAIN_BYTES
    while left > 0:
        data = await stream.receive_some(min(left, 4096))
        if not data:
            return
        left -= len(data)
