"""A TCP relay on 127.0.0.1 that stands in for a Service in the end-to-end
tests: the API server's connections to a webhook URL arrive here, and each
is piped to the webhook's port, as kube-proxy forwards a Service's traffic
to a pod. TLS passes through untouched.

What a Service would not give a test: the relay counts the connections it
accepts, can end every open one (as a restarted pod or an idle timeout
would), and can hold every connection, open or new, without a byte of
answer (a webhook that hangs): from then on, what a client sends is read
and dropped, whichever connection it sends it on."""

from __future__ import annotations

from collections.abc import Callable

import trio


async def _pipe(
    source: trio.SocketStream,
    sink: trio.SocketStream,
    done: trio.CancelScope,
    dropping: Callable[[], bool] = lambda: False,
) -> None:
    try:
        while data := await source.receive_some(65536):
            if not dropping():
                await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    done.cancel()  # one side ended: end the connection


class Relay:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.accepted = 0  # connections so far
        self.holding = False  # True: every connection reads and never answers
        self._open: set[trio.CancelScope] = set()
        self._changed = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[Relay] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._handle, listeners)
            task_status.started(self)

    async def _handle(self, client: trio.SocketStream) -> None:
        self.accepted += 1
        with trio.CancelScope() as scope:
            self._open.add(scope)
            try:
                async with client:
                    if self.holding:  # until the client gives up, or end_all()
                        while await client.receive_some(65536):
                            pass
                        return
                    try:
                        upstream = await trio.open_tcp_stream("127.0.0.1", self.target_port)
                    except OSError:
                        return  # nothing listens there: the client sees its connection end
                    async with upstream, trio.open_nursery() as pipes:
                        pipes.start_soon(
                            _pipe, client, upstream, pipes.cancel_scope, self._dropping
                        )
                        pipes.start_soon(_pipe, upstream, client, pipes.cancel_scope)
            finally:
                self._open.discard(scope)
                self._changed.set()
                self._changed = trio.Event()

    def _dropping(self) -> bool:
        return self.holding

    async def end_all(self) -> None:
        """End every open connection, and return once all are closed."""
        for scope in list(self._open):
            scope.cancel()
        while self._open:
            await self._changed.wait()
