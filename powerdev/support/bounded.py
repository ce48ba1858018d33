"""What keeps a TCP port served by a Trio loop bounded whatever its clients
do, shared by the daemon's metrics and probe port (powerdev/ops/opsserver.py)
and the admission webhook (powerdev/webhook/server.py):

- listen(): the listening socket, bound before Trio starts, with a clear
  error naming the option when the address is not one or cannot be had.
- connection_limit(): how many connections to keep open, never more than
  a quarter of the process's descriptor limit.
- OpenConnections: the connections open now, each with the cancel scope
  that bounds its life; past the limit, a new connection closes an old one
  (see there for which), so no client ever waits for a free slot.
- accept_connections(): every pending connection accepted, none refused by
  an error of accept() (the ones that say "try again" are retried at once,
  running out of descriptors closes the oldest connection, and any other
  error is logged and retried after a pause): no client, and no state of
  the host, ends the port.
- LogEvery: at most one log line per period about one kind of event.

Imports only the standard library and Trio, so both servers stay light.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import resource
import socket
from collections.abc import Callable

import trio

log = logging.getLogger(__name__)
BACKLOG = 1024  # connections the kernel holds until accepted (capped by net.core.somaxconn)
ACCEPT_BATCH = 256  # connections accepted in a row before the loop lets other tasks run
ACCEPT_PAUSE = 0.1  # after EMFILE or an unexpected error: try accepting again after this
LOG_SECONDS = 60.0  # at most one line per this about one kind of event
SPARE_SECONDS = 1.0  # past the limit, a younger connection is closed only past twice the limit
OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# A connection that went before it was accepted, one a firewall refused, or
# one whose network went away (Linux passes these on from the new socket):
# the next one may be fine, so accept again at once.
ACCEPT_AGAIN = frozenset(
    {
        errno.ECONNABORTED,
        errno.EPROTO,
        errno.EPERM,
        errno.ENETDOWN,
        errno.ENETUNREACH,
        errno.EHOSTDOWN,
        errno.EHOSTUNREACH,
        errno.ENONET,
        errno.ENOPROTOOPT,
        errno.EOPNOTSUPP,
        errno.ETIMEDOUT,
        errno.ECONNRESET,
    }
)


class LogEvery:
    """due() is true at most once per `seconds` (Trio's clock); `skipped`
    counts the times it said no since it last said yes."""

    def __init__(self, seconds: float = LOG_SECONDS) -> None:
        self.seconds = seconds
        self.skipped = 0
        self._at = -math.inf

    def due(self) -> bool:
        now = trio.current_time()
        if now - self._at < self.seconds:
            self.skipped += 1
            return False
        self._at = now
        self.skipped = 0
        return True


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


class ListenError(Exception):
    """The port cannot be had (taken, or not an address of this host): the
    config is fine, the host is not ready for it."""


def listen(address: str, option: str, fix: str) -> socket.socket:
    """A listening TCP socket on `address` (see parse_address; ValueError if
    it is not one): every interface for ":PORT" or "*:PORT". ListenError,
    naming `option`, the address and then `fix`, when it cannot be had."""
    host, port = parse_address(address)
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
        reason = os.strerror(err.errno) if err.errno else str(err)
        raise ListenError(f"{option}: cannot listen on {address}: {reason}; {fix}") from None


def connection_limit(max_open: int, min_open: int) -> int:
    """`max_open`, or a quarter of the process's descriptor limit when that
    is lower, but at least `min_open` (or `max_open` if less). Twice this,
    at most half the descriptors, may be open for a second (see
    OpenConnections), so a port can never take the descriptors the rest of
    the process needs."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_open
    return max(min(min_open, max_open), min(max_open, soft // 4))


class OpenConnections:
    """The connections open now, oldest first, each with the cancel scope
    that bounds its life. At the limit, a new connection closes the oldest
    one from its own address if that address holds at least its share (the
    average per address), else the oldest from the address that holds the
    most; one younger than `spare_seconds` is spared until twice the limit
    are open. A client holding connections open can only push out its own,
    never make another wait, and never close the connection of a client
    that holds few (a probe, the API server's few) for milliseconds."""

    def __init__(self, limit: int, *, name: str, spare_seconds: float = SPARE_SECONDS) -> None:
        self.limit = limit
        self.name = name
        self.spare_seconds = spare_seconds
        self._open: dict[trio.SocketStream, tuple[str, trio.CancelScope, float]] = {}
        self._by_address: dict[str, dict[trio.SocketStream, None]] = {}
        self.shed = 0  # closed to make room, since the start
        self._log = LogEvery()

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, stream: object) -> bool:
        """Still counted in: not closed to make room."""
        return stream in self._open

    def add(self, stream: trio.SocketStream, address: str, seconds: float) -> trio.CancelScope:
        """Count `stream` in, closing an old one if the limit says so; the
        scope returned ends it `seconds` from now (its holder may move that)."""
        if len(self._open) >= self.limit:
            self.close_oldest(address, spare_young=len(self._open) < 2 * self.limit)
        now = trio.current_time()
        scope = trio.CancelScope(deadline=now + seconds)
        self._open[stream] = (address, scope, now)
        self._by_address.setdefault(address, {})[stream] = None
        return scope

    def remove(self, stream: trio.SocketStream) -> None:
        entry = self._open.pop(stream, None)
        if entry is not None:
            same = self._by_address[entry[0]]
            del same[stream]
            if not same:
                del self._by_address[entry[0]]

    def close_oldest(self, address: str | None = None, *, spare_young: bool = False) -> None:
        """Close the oldest connection from `address` if it holds at least
        its share, else from the address with the most connections open;
        with spare_young, not if it is younger than spare_seconds."""
        if not self._open:
            return
        held = len(self._by_address.get(address, ()))  # type: ignore[arg-type]
        if held == 0 or held * len(self._by_address) < len(self._open):
            address = max(self._by_address, key=lambda a: len(self._by_address[a]))
        stream = next(iter(self._by_address[address]))
        _, scope, opened = self._open[stream]
        if spare_young and trio.current_time() - opened < self.spare_seconds:
            return
        self.remove(stream)
        scope.cancel()
        stream.socket.close()  # its descriptor goes now, not when its task next runs
        self.shed += 1
        if self._log.due():
            log.warning(
                "%s: %d connections open (the limit): closing the oldest from %s "
                "(%d closed so far); some client holds connections open",
                self.name,
                self.limit,
                address,
                self.shed,
            )


async def accept_connections(
    sock: socket.socket,
    connections: OpenConnections,
    start: Callable[[trio.SocketStream, str], None],
) -> None:
    """Accept on the non-blocking listening `sock` for ever, calling
    start(stream, peer address) for each connection: it counts the stream
    in `connections` and starts the task that serves it. An error of
    accept() never ends this: a connection that went away is skipped, a
    lack of descriptors or memory closes the oldest connection and pauses,
    and any other error (one the kernel adds in a later version, a socket
    that stopped listening) is logged, once a minute, and retried after a
    pause, so the port serves again as soon as the cause goes."""
    resources = LogEvery()
    unexpected: dict[int | None, LogEvery] = {}
    while True:
        await trio.lowlevel.wait_readable(sock)
        for _ in range(ACCEPT_BATCH):
            try:
                accepted, peer = sock.accept()
            except BlockingIOError:
                break
            except OSError as err:
                if err.errno in ACCEPT_AGAIN:
                    continue
                if err.errno in OUT_OF_RESOURCES:
                    if resources.due():
                        log.warning("%s: cannot accept a connection: %s", connections.name, err)
                    connections.close_oldest()  # one descriptor back, if we hold any
                else:
                    every = unexpected.setdefault(err.errno, LogEvery())
                    if every.due():
                        log.error(
                            "%s: accepting a connection failed (%s); trying again every "
                            "%.1f s, the connections open are served on",
                            connections.name,
                            err,
                            ACCEPT_PAUSE,
                        )
                await trio.sleep(ACCEPT_PAUSE)
                break
            stream = trio.SocketStream(trio.socket.from_stdlib_socket(accepted))
            start(stream, str(peer[0]) if isinstance(peer, tuple) else str(peer))
