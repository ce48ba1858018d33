"""The trio-asyncio loop, a Trio-shaped gRPC server lifetime, and the one way
its streams send (a peer that has gone is a cancellation, not an error)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio
import trio_asyncio
from grpclib.config import Configuration
from grpclib.const import Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.protocol import H2Protocol
from grpclib.server import Server, Stream
from h2.exceptions import StreamClosedError

log = logging.getLogger(__name__)
CLOSE_TIMEOUT = 2.0  # seconds a closing server may take to end its calls


def after_bind(path: Path) -> None:
    """Called between bind and serving; tests replace it to act at that moment."""


@contextlib.asynccontextmanager
async def asyncio_door() -> AsyncIterator[None]:
    """An asyncio loop for grpclib, unless the caller already runs inside one."""
    if trio_asyncio.current_loop.get() is not None:
        yield
        return
    async with trio_asyncio.open_loop():
        yield


async def serve(
    path: Path,
    handlers: list[object],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `handlers` on a unix socket at `path` until cancelled.

    started() is called once the socket is bound and listening. On the way
    out the server is closed (its calls cancelled) and the socket removed,
    unless someone else has put a new file at that path meanwhile.
    """
    server = _Server(handlers, codec=PassThroughCodec(), config=NO_KEEPALIVE)
    # Binding is quick; a cancellation in the middle of it would leave a
    # bound socket that the `finally` below never sees.
    with trio.CancelScope(shield=True):
        await trio_asyncio.aio_as_trio(server.start)(path=str(path))
    bound: os.stat_result | None = None
    try:  # from here on, whatever happens, the server is closed on the way out
        try:
            after_bind(path)
            os.chmod(path, 0o600)  # the kubelet is root; nobody else may connect
            bound = os.stat(path)
        except FileNotFoundError:
            # Deleted the moment it was made (a kubelet starting up deletes
            # every socket): whoever watches the directory will serve again.
            pass
        task_status.started()
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            await trio_asyncio.aio_as_trio(server.shut_down)()
            if bound is not None:
                _remove_if_same(path, bound)


async def send_or_cancel(stream: Stream, message: object) -> None:
    """Send on a stream the peer may have just closed (a kubelet restarting
    ends its connection): that is the peer cancelling the call, and grpclib
    counts it as such, logged at INFO, only if the handler ends with
    CancelledError; any other exception is "Failed to handle cancellation",
    an ERROR with two tracebacks, for a routine event."""
    try:
        await stream.send_message(message)
    except (StreamClosedError, StreamTerminatedError, ConnectionError) as err:
        raise asyncio.CancelledError(f"the peer closed the stream: {err!r}") from err


# grpclib's servers ping every connection after 2 h idle, with a timer per
# connection. trio-asyncio keeps a cancelled timer until it is due, and the
# timer holds its whole connection: every kubelet restart (a connection or
# two) would keep about 10 KiB for two hours. A unix socket to the kubelet
# needs no keepalive: a peer that goes closes the socket.
NO_KEEPALIVE = Configuration(_keepalive_time=None)


class _Server(Server):
    """grpclib's Server, remembering its connections' transports so that they
    can be ended. (grpclib drops its own reference when it starts closing one,
    and a close that waits to flush to a peer that has gone never ends.)"""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._transports: weakref.WeakSet[asyncio.BaseTransport] = weakref.WeakSet()
        self._ending = False

    def _protocol_factory(self) -> H2Protocol:
        protocol = super()._protocol_factory()
        made, lost = protocol.connection_made, protocol.connection_lost
        handed = False  # whether grpclib got the connection

        def connection_made(transport: asyncio.BaseTransport) -> None:
            nonlocal handed
            if self._ending:  # accepted just before the close: end it at once
                transport.abort()  # type: ignore[attr-defined]
                return
            self._transports.add(transport)
            handed = True
            made(transport)

        def connection_lost(exc: BaseException | None) -> None:
            if handed:  # grpclib knows nothing of a connection ended before it got it
                lost(exc)

        protocol.connection_made = connection_made  # type: ignore[method-assign]
        protocol.connection_lost = connection_lost  # type: ignore[method-assign]
        return protocol

    async def shut_down(self) -> None:
        """Stop accepting, cancel every call (waiting up to CLOSE_TIMEOUT
        seconds for them to end), and end every connection. Runs on the
        asyncio loop.

        asyncio gives a connection its transport a turn after accepting it,
        and cannot once its Server is closed: the accepted socket would be
        left open, and found only by the garbage collector. So the listening
        sockets stop first, and the loop turns once (the ready queue runs in
        order) before the close."""
        self._ending = True  # a connection made from now on is ended at once
        loop = asyncio.get_running_loop()
        for listening in self._server.sockets if self._server is not None else ():
            loop.remove_reader(listening.fileno())
        await asyncio.sleep(0)
        self.close()  # cancels every call
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.wait_closed(), CLOSE_TIMEOUT)
        # grpclib leaves connections open; a client that never lets go would
        # keep one (and a call with no deadline, such as the kubelet's
        # Allocate, would wait forever). End them all. An aborted transport
        # closes its socket on the loop's next turn: a few rounds end them
        # all, so a loop closed right after this leaks nothing.
        for _ in range(3):
            self.abort_connections()
            await asyncio.sleep(0)

    def abort_connections(self) -> int:
        """Drop every connection still open, and any that comes after."""
        self._ending = True
        ended = 0
        for transport in list(self._transports):
            transport.abort()  # type: ignore[attr-defined]
            ended += 1
        return ended


class PassThroughCodec(ProtoCodec):
    """Protobuf, except that a reply given as bytes is already encoded."""

    def encode(self, message: Any, message_type: Any) -> bytes:
        if isinstance(message, bytes):
            return message
        return super().encode(message, message_type)

    def decode(self, data: bytes, message_type: Any) -> Any:
        try:
            return super().decode(data, message_type)
        except Exception as err:  # any malformed input: the caller's fault, said plainly
            raise GRPCError(
                Status.INVALID_ARGUMENT,
                f"the request is not a valid {message_type.__name__} message: {err}"[:300],
            ) from None


def _remove_if_same(path: Path, bound: os.stat_result) -> None:
    try:
        now = os.stat(path)
        if (now.st_dev, now.st_ino, now.st_ctime_ns) == (
            bound.st_dev,
            bound.st_ino,
            bound.st_ctime_ns,
        ):
            os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as err:
        log.warning("could not remove socket %s: %s", path, err)
