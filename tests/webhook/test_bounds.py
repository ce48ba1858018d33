"""Nothing a client does takes the webhook down: clients that hold
connections idle, send a request head or a body a byte at a time, send
bytes that are not TLS or not HTTP, flood the port, or send large bodies
slowly never keep an honest AdmissionReview from its answer, and each is
cut at its deadline or refused. Real TLS sockets on 127.0.0.1 against the
webhook in-process; Trio's MockClock lets the deadlines' seconds pass at
once (it jumps only when every task waits)."""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx
import pytest
import trio
import trio.testing
import trustme

from powerdev.support import bounded
from powerdev.webhook import server
from powerdev.webhook.config import DEFAULT_HANDSHAKE_SECONDS, DEFAULT_REQUEST_SECONDS
from tests.webhook.conftest import (
    client_context,
    container,
    deployment_pod,
    post_review,
    review,
    settings_for,
    webhook_in_process,
)

LIMIT = 600.0  # mock seconds: the bound of every test here, far past every deadline
HEAD_PACE = 2.0  # the slow client's byte of head every this many seconds
BODY_PACE = 3.0  # the trickler's byte of body every this many seconds
EACH = 8  # clients of each kind
MARGIN = 1.0  # mock seconds: how late a cut may be seen after its deadline


@pytest.fixture
def mock_time() -> trio.testing.MockClock:
    """Jumps to the next deadline when no task has run for 50 ms of real
    time: between two steps of a client and the server on loopback, a task
    always runs sooner."""
    return trio.testing.MockClock(autojump_threshold=0.05)


class Seen(logging.Handler):
    """The records under `powerdev` whose message holds `words`."""

    def __init__(self, words: str) -> None:
        super().__init__()
        self.words = words
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if self.words in record.getMessage():
            self.records.append(record)


@pytest.fixture
def log_of():
    handlers = []

    def watch(words: str) -> Seen:
        seen = Seen(words)
        logging.getLogger("powerdev").addHandler(seen)
        handlers.append(seen)
        return seen

    yield watch
    for seen in handlers:
        logging.getLogger("powerdev").removeHandler(seen)


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("https://").rsplit(":", 1)
    return host, int(port)


def _context(ca: trustme.CA) -> ssl.SSLContext:
    context = client_context(ca)
    context.set_alpn_protocols(["http/1.1"])
    return context


@dataclass
class Bad:
    """One misbehaving client: when it connected, when its TLS handshake
    ended, when it sent its first byte of a request and when it got an
    answer, when the server ended the connection, and what it received."""

    kind: str
    connected: trio.Event = field(default_factory=trio.Event)  # it is doing its thing
    ended: trio.Event = field(default_factory=trio.Event)
    opened_at: float = 0.0
    ready_at: float = 0.0
    answered_at: float = 0.0
    ended_at: float = 0.0
    sent: int = 0
    got: bytes = b""


async def _until_closed(stream: trio.abc.ReceiveStream, bad: Bad) -> None:
    """Read until the server ends the connection; note when."""
    try:
        while chunk := await stream.receive_some(65536):
            bad.got += chunk
            if bad.got.endswith(b"ok\n"):
                bad.answered_at = trio.current_time()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # a reset, or TLS without close_notify: ended all the same
    bad.ended_at = trio.current_time()
    bad.ended.set()


async def _trickle(stream: trio.abc.SendStream, data: bytes, pace: float, bad: Bad) -> None:
    """Send `data` a byte every `pace` seconds (the client's pace: it waits
    for nothing), until the server cuts the connection."""
    try:
        for i in range(len(data)):
            await stream.send_all(data[i : i + 1])
            bad.sent += 1
            bad.connected.set()
            await trio.sleep(pace)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def _tcp(url: str, bad: Bad) -> trio.SocketStream:
    stream = await trio.open_tcp_stream(*_address(url))
    bad.opened_at = trio.current_time()
    return stream


async def _tls(url: str, ca: trustme.CA, bad: Bad) -> trio.SSLStream:
    stream = trio.SSLStream(await _tcp(url, bad), _context(ca), server_hostname="127.0.0.1")
    await stream.do_handshake()
    bad.ready_at = trio.current_time()
    return stream


async def idle_tcp(url: str, ca: trustme.CA, bad: Bad) -> None:
    """Connects, never starts TLS."""
    async with await _tcp(url, bad) as stream:
        bad.connected.set()
        await _until_closed(stream, bad)


async def not_tls(url: str, ca: trustme.CA, bad: Bad) -> None:
    """Plain HTTP to the HTTPS port: not a TLS handshake."""
    async with await _tcp(url, bad) as stream:
        await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        bad.connected.set()
        await _until_closed(stream, bad)


async def idle_tls(url: str, ca: trustme.CA, bad: Bad) -> None:
    """Completes the handshake, never sends a request."""
    async with await _tls(url, ca, bad) as stream:
        bad.connected.set()
        await _until_closed(stream, bad)


async def slow_head(url: str, ca: trustme.CA, bad: Bad) -> None:
    """Slow loris over TLS: a request head a byte every HEAD_PACE seconds."""
    head = b"POST /mutate HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000
    async with await _tls(url, ca, bad) as stream, trio.open_nursery() as nursery:
        nursery.start_soon(_trickle, stream, head, HEAD_PACE, bad)
        await _until_closed(stream, bad)
        nursery.cancel_scope.cancel()


async def trickled_body(url: str, ca: trustme.CA, bad: Bad) -> None:
    """A whole head, then its body of 1,000 bytes a byte every BODY_PACE seconds."""
    head = (
        b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n"
    )
    async with await _tls(url, ca, bad) as stream, trio.open_nursery() as nursery:
        await stream.send_all(head)
        nursery.start_soon(_trickle, stream, b" " * 1000, BODY_PACE, bad)
        await _until_closed(stream, bad)
        nursery.cancel_scope.cancel()


async def not_http(url: str, ca: trustme.CA, bad: Bad) -> None:
    """TLS, then bytes that are not HTTP."""
    async with await _tls(url, ca, bad) as stream:
        await stream.send_all(bytes(range(1, 32)) + b" \x80\xff garbage\r\n\r\n")
        bad.connected.set()
        await _until_closed(stream, bad)


async def kept_idle(url: str, ca: trustme.CA, bad: Bad) -> None:
    """One request on a kept-alive connection, then nothing."""
    async with await _tls(url, ca, bad) as stream:
        await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        bad.connected.set()
        await _until_closed(stream, bad)


Client = Callable[[str, trustme.CA, Bad], Awaitable[None]]
CLIENTS: list[Client] = [idle_tcp, not_tls, idle_tls, slow_head, trickled_body, not_http, kept_idle]


async def test_honest_reviews_are_answered_while_bad_clients_hold_and_each_is_cut_in_time(
    tmp_path, ca, secret, mock_time, log_of
):
    timeouts = log_of("that took longer than")
    settings = settings_for(tmp_path, secret)
    pod = deployment_pod(container("db"))
    bads = [Bad(client.__name__) for client in CLIENTS for _ in range(EACH)]
    by_kind = {client.__name__: client for client in CLIENTS}
    with trio.fail_after(LIMIT):
        async with webhook_in_process(settings) as serving, trio.open_nursery() as clients:
            for bad in bads:
                clients.start_soon(by_kind[bad.kind], serving.url, ca, bad)
            for bad in bads:
                await bad.connected.wait()
            held = [bad for bad in bads if bad.kind not in ("not_tls", "not_http")]
            # Honest reviews, on a kept-alive connection and on new ones, and the probes.
            async with httpx.AsyncClient(
                base_url=serving.url, verify=client_context(ca), timeout=LIMIT
            ) as http:
                for _ in range(20):
                    assert "patch" in await post_review(http, review(pod))
                assert (await http.get("/healthz")).text == "ok\n"
            for _ in range(5):
                async with httpx.AsyncClient(
                    base_url=serving.url, verify=client_context(ca), timeout=LIMIT
                ) as http:
                    assert "patch" in await post_review(http, review(pod))
            assert not [bad.kind for bad in held if bad.ended.is_set()]  # all held meanwhile
            for bad in bads:
                await bad.ended.wait()
            async with httpx.AsyncClient(
                base_url=serving.url, verify=client_context(ca), timeout=LIMIT
            ) as http:
                assert "patch" in await post_review(http, review(pod))  # and after

    def took(bad: Bad, since: float) -> float:
        return bad.ended_at - since

    for bad in bads:
        if bad.kind == "idle_tcp":  # the handshake's deadline
            assert 0 <= took(bad, bad.opened_at) - DEFAULT_HANDSHAKE_SECONDS < MARGIN, bad
        elif bad.kind in ("idle_tls", "slow_head", "trickled_body"):  # the request's
            assert 0 <= took(bad, bad.ready_at) - DEFAULT_REQUEST_SECONDS < MARGIN, bad
            assert not bad.got, bad  # no answer: cut
        elif bad.kind == "kept_idle":  # answered, then the kept-alive connection's wait
            assert bad.got.startswith(b"HTTP/1.1 200 OK\r\n"), bad
            assert 0 <= took(bad, bad.answered_at) - server.IDLE_SECONDS < MARGIN, bad
        elif bad.kind == "not_tls":  # closed at once: no deadline needed
            assert took(bad, bad.opened_at) < MARGIN and not bad.got, bad
        else:  # not_http: an error status, and the connection closed after the drain
            assert bad.got.startswith(b"HTTP/1.1 400 Bad Request\r\n"), bad
            assert b"not HTTP/1.1" in bad.got, bad
            assert took(bad, bad.ready_at) < server.DRAIN_SECONDS + MARGIN, bad
    trickler = next(bad for bad in bads if bad.kind == "trickled_body")
    assert trickler.sent < 1000  # cut long before its body ended
    # Dozens cut, one line (at most one a minute).
    assert len(timeouts.records) == 1
    assert serving.server.timed_out == EACH * 4


async def test_past_the_connection_limit_a_flood_closes_its_own_oldest(
    tmp_path, ca, secret, mock_time, log_of
):
    """At the limit, every new connection is still taken, and closes the
    oldest of the address holding the most: the flood's, never the honest
    client's, which is answered whatever the flood does."""
    shed = log_of("connections open (the limit)")
    limit = server.MIN_OPEN
    settings = settings_for(tmp_path, secret, max_connections=limit)
    with trio.fail_after(LIMIT):
        async with webhook_in_process(settings) as serving:
            host, port = _address(serving.url)
            context = _context(ca)

            async def flood_one() -> trio.SSLStream:
                tcp = await trio.open_tcp_stream(host, port, local_address="127.0.0.2")
                stream = trio.SSLStream(tcp, context, server_hostname="127.0.0.1")
                await stream.do_handshake()
                return stream

            flood = [await flood_one() for _ in range(limit)]
            # Older than SPARE_SECONDS, younger than the request's deadline.
            await trio.sleep(2 * bounded.SPARE_SECONDS)
            async with httpx.AsyncClient(
                base_url=serving.url, verify=client_context(ca), timeout=LIMIT
            ) as http:
                for _ in range(limit):
                    flood.append(await flood_one())
                    response = await post_review(http, review(deployment_pod(container("a"))))
                    assert "patch" in response
            # Closed to make room, already: not at a deadline, which is seconds away.
            with trio.fail_after(MARGIN), pytest.raises(trio.BrokenResourceError):
                await flood[0].receive_some(100)
            assert serving.server.connections.shed >= limit
            for stream in flood:
                await trio.aclose_forcefully(stream)
    assert len(shed.records) == 1


async def test_large_bodies_held_open_share_one_budget_and_a_small_review_still_passes(
    tmp_path, ca, secret, mock_time
):
    """Bodies of --max-body held unfinished: what they hold beyond
    SMALL_BODY each comes from one budget of BUDGET_BODIES times
    --max-body; the one that finds it spent gets 503, the rest are cut at
    their deadline; a small review is answered meanwhile, and a large one
    after, the budget given back."""
    max_body = 1024 * 1024
    settings = settings_for(tmp_path, secret, max_body=max_body)
    pod = deployment_pod(container("db"))
    holders = [Bad("large_body") for _ in range(server.BUDGET_BODIES + 1)]

    async def large_body(url: str, bad: Bad) -> None:
        head = (
            f"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {max_body}\r\n\r\n"
        ).encode()
        async with await _tls(url, ca, bad) as stream, trio.open_nursery() as nursery:
            nursery.start_soon(_until_closed, stream, bad)
            try:
                await stream.send_all(head + b" " * (max_body - 1))  # all but the last byte
            except trio.BrokenResourceError:
                pass  # refused before all was sent
            bad.connected.set()

    with trio.fail_after(LIMIT):
        async with webhook_in_process(settings) as serving, trio.open_nursery() as clients:
            for bad in holders:
                clients.start_soon(large_body, serving.url, bad)
            await _first_ended(holders)  # the one that found the budget spent
            (refused,) = [bad for bad in holders if bad.ended.is_set()]
            assert refused.got.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), refused
            assert b"too many large requests" in refused.got
            async with httpx.AsyncClient(
                base_url=serving.url, verify=client_context(ca), timeout=LIMIT
            ) as http:
                assert "patch" in await post_review(http, review(pod))
                for bad in holders:
                    await bad.ended.wait()
                big = review(deployment_pod(container("x", {"limits": {"cpu": "1"}})))
                big["request"]["object"]["metadata"]["annotations"] = {"pad": "x" * 900_000}
                answer = await http.post("/mutate", content=json.dumps(big), headers=_json())
                assert answer.status_code == 200 and answer.json()["response"]["allowed"]
            assert serving.server.budget.used == 0
    held = [bad for bad in holders if bad is not refused]
    assert all(not bad.got for bad in held)  # cut at the deadline, unanswered
    assert all(0 <= bad.ended_at - bad.ready_at - DEFAULT_REQUEST_SECONDS < MARGIN for bad in held)


def _json() -> dict[str, str]:
    return {"content-type": "application/json"}


async def _first_ended(bads: list[Bad]) -> None:
    async with trio.open_nursery() as nursery:

        async def one(bad: Bad) -> None:
            await bad.ended.wait()
            nursery.cancel_scope.cancel()

        for bad in bads:
            nursery.start_soon(one, bad)
