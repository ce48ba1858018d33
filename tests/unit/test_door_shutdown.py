"""The asyncio side of a gRPC server's end (rpc/door.py, _Server.shut_down),
on a plain asyncio loop whose turns the test can count.

asyncio accepts a connection in one turn and makes its transport in the
next; a Server closed between the two leaves the accepted socket open
(the transport's constructor fails on the closed Server) until the garbage
collector finds it. The test stops the server in exactly that gap, where a
client (a kubelet, say) that connects just as a server stops lands."""

from __future__ import annotations

import asyncio
import gc
import socket
import sys
from pathlib import Path

from powerdev.rpc.door import NO_KEEPALIVE, PassThroughCodec, _Server


class _WatchedLoop(asyncio.SelectorEventLoop):
    """Says when asyncio makes the task that gives an accepted connection its
    transport: before the task, so that whoever waits for it runs first."""

    def __init__(self) -> None:
        super().__init__()
        self.accepted = asyncio.Event()

    def create_task(self, coro, **kwargs):  # type: ignore[no-untyped-def, override]
        if getattr(coro, "__name__", "") == "_accept_connection2":
            self.accepted.set()
        return super().create_task(coro, **kwargs)


def test_a_connection_accepted_as_the_server_stops_is_ended_and_its_socket_closed(tmp_path):
    path = tmp_path / "s.sock"
    leaks: list[str] = []
    hook, sys.unraisablehook = sys.unraisablehook, lambda u: leaks.append(repr(u.exc_value))
    loop = _WatchedLoop()
    try:
        client = loop.run_until_complete(_stop_between_accept_and_transport(loop, path))
        loop.run_until_complete(asyncio.sleep(0))
    finally:
        loop.close()
    try:
        client.settimeout(5)
        try:
            assert client.recv(1) == b""  # ended, before a byte of HTTP/2
        except ConnectionResetError:
            pass  # ended just as well
        client.close()
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert leaks == []


async def _stop_between_accept_and_transport(loop: _WatchedLoop, path: Path) -> socket.socket:
    server = _Server([], codec=PassThroughCodec(), config=NO_KEEPALIVE)
    await server.start(path=str(path))
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(str(path))  # in the listening socket's backlog
    await loop.accepted.wait()  # accepted; its transport is a turn away...
    await server.shut_down()  # ...and the server stops now
    return client
