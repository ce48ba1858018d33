"""The probe answers first: whatever other clients of the metrics and probe
port do (hold connections idle, send a byte a second, send garbage, never
read their answer, or just come in great numbers), /healthz and /readyz
are answered within a second, the kubelet's calls as ever, and the
connections they hold are bounded and cut off. Real TCP sockets on
127.0.0.1, the daemon in-process with the fake kubelet."""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable

import pytest
import trio

from powerdev.ops import health, opsserver
from powerdev.ops.status import StatusFile
from powerdev.support import bounded
from tests.conftest import config_for, daemon_and_kubelet, make_dev_tree
from tests.integration.test_opsport import exchange, get

LIMIT = 30
PROBE_SECONDS = 1.0  # what a probe may take, whatever the other clients do
CLIENTS = 200

Client = Callable[[int, trio.Event], Awaitable[None]]


async def _hold(stream: trio.SocketStream) -> None:
    """Keep the connection open, reading nothing, until cancelled."""
    async with stream:
        await trio.sleep_forever()


async def idle(port: int, connected: trio.Event) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    connected.set()
    await _hold(stream)


async def slow(port: int, connected: trio.Event) -> None:
    """Slow loris: a request head sent a byte a second, never finished."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000
    async with stream:
        try:
            for i in range(len(head)):
                await stream.send_all(head[i : i + 1])
                connected.set()
                await trio.sleep(1)  # the client's pace, not a wait for anything
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # cut off by the server: what it should do
        await trio.sleep_forever()


async def garbage(port: int, connected: trio.Event) -> None:
    """Bytes that are not HTTP and never end a line, then nothing."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(bytes(range(256)).replace(b"\n", b"").replace(b"\r", b"") * 4)
    connected.set()
    await _hold(stream)


async def never_reads(port: int, connected: trio.Event) -> None:
    """A complete request, then the answer is never read and nothing closed."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    connected.set()
    await _hold(stream)


@pytest.mark.parametrize("client", [idle, slow, garbage, never_reads])
async def test_clients_holding_connections_never_delay_a_probe(tmp_path, client: Client):
    dev = make_dev_tree(tmp_path / "dev", ["dm-0"])
    name = f"example.com/ops-hold-{client.__name__}"
    config = config_for('{"include-devices": ["/dev/dm-*"]}', name=name, socket="ops-h.sock")
    sock = opsserver.listen("127.0.0.1:0")
    port = sock.getsockname()[1]
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config, dev_root=dev, metrics_socket=sock) as h:
            async with trio.open_nursery() as clients:
                for _ in range(CLIENTS):
                    connected = trio.Event()
                    clients.start_soon(client, port, connected)
                    await connected.wait()
                with trio.fail_after(PROBE_SECONDS):
                    status, _, body = await get(port, "/healthz")
                assert status == 200, body
                with trio.fail_after(PROBE_SECONDS):
                    status, _, body = await get(port, "/readyz")
                assert status == 200 and f"{name}: registered" in body.decode(), body
                grant = await h.kubelet.allocate(name, ["dm-0"])
                assert [d.host_path for d in grant.devices] == ["/dev/dm-0"]
                clients.cancel_scope.cancel()


async def test_many_busy_clients_never_delay_a_probe(tmp_path):
    """Clients that each make request after request, as fast as they can."""
    dev = make_dev_tree(tmp_path / "dev", ["dm-0"])
    name = "example.com/ops-busy"
    config = config_for('{"include-devices": ["/dev/dm-*"]}', name=name, socket="ops-b.sock")
    sock = opsserver.listen("127.0.0.1:0")
    port = sock.getsockname()[1]

    async def busy(path: str, started: trio.Event) -> None:
        while True:
            await get(port, path)
            started.set()

    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config, dev_root=dev, metrics_socket=sock):
            async with trio.open_nursery() as clients:
                for i in range(50):
                    started = trio.Event()
                    clients.start_soon(busy, "/metrics" if i % 2 else "/nothing", started)
                    await started.wait()
                for _ in range(5):
                    with trio.fail_after(PROBE_SECONDS):
                        status, _, body = await get(port, "/healthz")
                    assert status == 200, body
                clients.cancel_scope.cancel()


async def _serve_alone(nursery: trio.Nursery) -> int:
    """The port with no resource (so /healthz is 200), in `nursery`; its port."""
    sock = opsserver.listen("127.0.0.1:0")
    await nursery.start(opsserver.serve, sock, [], StatusFile(None))
    return sock.getsockname()[1]


async def test_a_client_that_never_reads_a_large_answer_is_cut_off(monkeypatch):
    """An answer larger than both sides' socket buffers: the send blocks
    until the connection's deadline, which ends it; a probe meanwhile is
    answered, and the server stops at once when cancelled."""
    monkeypatch.setattr(opsserver, "REQUEST_SECONDS", 0.5)
    big = b"x" * (16 * 1024 * 1024)
    answer = opsserver.OpsApp.answer

    def large(self, method, target, accept):
        if target == b"/large":
            return 200, "text/plain", big
        return answer(self, method, target, accept)

    connection = opsserver._connection
    accepted = 0
    large_ended = trio.Event()  # the first connection accepted is the large answer's

    async def watched(*args):
        nonlocal accepted
        first = accepted == 0
        accepted += 1
        await connection(*args)
        if first:
            large_ended.set()

    monkeypatch.setattr(opsserver.OpsApp, "answer", large)
    monkeypatch.setattr(opsserver, "_connection", watched)
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            port = await _serve_alone(nursery)
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(b"GET /large HTTP/1.1\r\nHost: x\r\n\r\n")
                with trio.fail_after(PROBE_SECONDS):
                    assert (await get(port, "/healthz"))[0] == 200
                # Read nothing until the server has given up on us: then what
                # arrives is a part of the answer, and the end of the connection.
                await large_ended.wait()
                received = 0
                try:
                    while chunk := await stream.receive_some(1 << 20):
                        received += len(chunk)
                except trio.BrokenResourceError:
                    pass  # reset: the server closed with our unread bytes
                assert 0 < received < len(big)
            nursery.cancel_scope.cancel()


async def test_a_flood_from_one_address_closes_its_own_oldest_never_a_probe(monkeypatch):
    """Past the limit, a new connection closes the oldest from its own
    address if that holds its share, else from the address holding the
    most: the probes' connections (here two at once, liveness and
    readiness, and a third coming while the port is full), from another
    address, stay open however many connections the flood makes."""
    monkeypatch.setattr(opsserver, "MAX_OPEN", 32)
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            port = await _serve_alone(nursery)
            # Probes slow to ask: the worst case.
            probes = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2)]
            flood = []
            for _ in range(4 * 32):
                stream = await trio.open_tcp_stream("127.0.0.1", port, local_address="127.0.0.2")
                flood.append(stream)
            # The flood's newest connection is served: so each before it was accepted.
            await flood[-1].send_all(request)
            assert (await flood[-1].receive_some(100)).startswith(b"HTTP/1.1 200 ")
            probes.append(await trio.open_tcp_stream("127.0.0.1", port))
            for probe in reversed(probes):
                await probe.send_all(request)
                with trio.fail_after(PROBE_SECONDS):
                    assert (await probe.receive_some(100)).startswith(b"HTTP/1.1 200 ")
            assert await flood[0].receive_some(100) == b""  # closed to make room
            for stream in [*probes, *flood]:
                await stream.aclose()
            nursery.cancel_scope.cancel()


async def test_past_the_limit_young_connections_are_spared_until_twice_the_limit(monkeypatch):
    """A flood of short requests from the probe's own address (pods with
    hostNetwork on the kubelet's node) keeps the port past its limit with
    connections that each last milliseconds: they, and the probe among
    them, are not closed until twice the limit are open."""
    monkeypatch.setattr(opsserver, "MAX_OPEN", 32)
    monkeypatch.setattr(opsserver, "SPARE_SECONDS", 3600.0)  # every connection here is young
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            port = await _serve_alone(nursery)
            opened = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2 * 32)]
            await opened[-1].send_all(request)  # each before it is accepted, then
            assert (await opened[-1].receive_some(100)).startswith(b"HTTP/1.1 200 ")
            await opened[0].send_all(request)  # the first is still open
            assert (await opened[0].receive_some(100)).startswith(b"HTTP/1.1 200 ")
            more = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(8)]
            await more[-1].send_all(request)
            assert (await more[-1].receive_some(100)).startswith(b"HTTP/1.1 200 ")
            assert await opened[1].receive_some(100) == b""  # past twice the limit: closed
            for stream in [*opened, *more]:
                await stream.aclose()
            nursery.cancel_scope.cancel()


async def test_requests_at_the_same_moment_share_one_answer_and_later_ones_get_a_new_one(
    monkeypatch,
):
    judged = 0
    judge = health.judge

    def counted(*args, **kwargs):
        nonlocal judged
        judged += 1
        return judge(*args, **kwargs)

    monkeypatch.setattr(health, "judge", counted)
    app = opsserver.OpsApp([], StatusFile(None))
    answers = []
    by_path: dict[bytes, list] = {}

    async def ask(path: bytes) -> None:
        answer = await app.respond(b"GET", path, "")
        answers.append(answer)
        by_path.setdefault(path, []).append(answer)

    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            for _ in range(100):
                nursery.start_soon(ask, b"/healthz")
        assert judged == 1 and len(answers) == 100
        assert all(a == (200, "text/plain", b"powerdev 0.1.0: ok\n") for a in answers)
        await ask(b"/healthz?again")
        assert judged == 2
        async with trio.open_nursery() as nursery:
            for path in (b"/healthz", b"/readyz", b"/metrics", b"/metrics"):
                nursery.start_soon(ask, path)
        assert judged == 4  # one each for /healthz and /readyz
        first, second = by_path[b"/metrics"]
        assert first[2] is second[2]  # one exposition for both


@pytest.mark.parametrize(
    ("descriptors", "limit"),
    [(1024, 256), (1 << 20, opsserver.MAX_OPEN), (40, opsserver.MIN_OPEN)],
)
def test_the_port_keeps_at_most_a_quarter_of_the_descriptor_limit(monkeypatch, descriptors, limit):
    monkeypatch.setattr(bounded.resource, "getrlimit", lambda _: (descriptors, 1 << 20))
    assert opsserver.connection_limit() == limit


class _Seen(logging.Handler):
    """Sets `event` at the first record whose message holds `words`."""

    def __init__(self, words: str) -> None:
        super().__init__()
        self.words = words
        self.event = trio.Event()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if self.words in record.getMessage():
            self.records.append(record)
            self.event.set()


def _chosen_port() -> int:
    """A port bound by number (a socket bound to port 0 loses its port when
    it stops listening; one bound by number keeps it)."""
    with socket.create_server(("127.0.0.1", 0)) as free:
        return free.getsockname()[1]


async def test_an_unexpected_accept_error_is_logged_and_the_port_serves_again_after_it():
    """shutdown() on the listening socket makes every accept() fail with
    EINVAL, an error that is none of those accept() passes on from a new
    connection: the port logs it once, keeps trying, and serves again as
    soon as the socket listens again; the daemon's nursery never sees it."""
    port = _chosen_port()
    sock = opsserver.listen(f"127.0.0.1:{port}")
    seen = _Seen("accepting a connection failed")
    logging.getLogger("powerdev").addHandler(seen)
    try:
        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                await nursery.start(opsserver.serve, sock, [], StatusFile(None))
                assert (await get(port, "/healthz"))[0] == 200
                sock.shutdown(socket.SHUT_RD)  # not listening: accept() says EINVAL
                await seen.event.wait()
                sock.listen(16)
                assert (await get(port, "/healthz"))[0] == 200
                nursery.cancel_scope.cancel()
    finally:
        logging.getLogger("powerdev").removeHandler(seen)
    (record,) = seen.records  # once, though accept() failed again and again
    assert record.levelno == logging.ERROR
    assert "Invalid argument" in record.getMessage()


async def test_answers_carry_the_standard_reason_phrase():
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            port = await _serve_alone(nursery)
            for request, line in [
                (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 200 OK\r\n"),
                (b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 404 Not Found\r\n"),
                (
                    b"PUT /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
                    b"HTTP/1.1 405 Method Not Allowed\r\n",
                ),
                (b"GARBAGE\r\n\r\n", b"HTTP/1.1 400 Bad Request\r\n"),
            ]:
                data = await exchange(port, request)
                assert data.startswith(line), data[:80]
            nursery.cancel_scope.cancel()
