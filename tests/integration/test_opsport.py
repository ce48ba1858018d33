"""The metrics and probe port in the daemon's own nursery, over real TCP
sockets on 127.0.0.1: what /metrics reports, what /healthz and /readyz say,
and that garbage, slow, huge and many requests neither block nor stop it."""

from __future__ import annotations

import logging
import math
from functools import partial

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from powerdev.daemon import registrar, supervisor
from powerdev.daemon.settings import Settings
from powerdev.devices.events import DeviceEvent
from powerdev.devtools.fake_kubelet import FakeKubelet
from powerdev.ops import metrics, oplog, opsserver
from powerdev.rpc import asyncio_door
from powerdev.rpc.kubelet_side import PluginCallError
from tests.conftest import (
    ChannelEvents,
    config_for,
    daemon_and_kubelet,
    host_safe,
    make_dev_tree,
    needs_root,
)

LIMIT = 20


def port_socket():
    return opsserver.listen("127.0.0.1:0")


async def exchange(port: int, raw: bytes) -> bytes:
    """Send raw bytes; everything the server sends until it closes."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(raw)
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


async def http(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes, read until the server closes; (status, headers, body)."""
    data = await exchange(port, raw)
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body


async def get(port: int, path: str, accept: str = "") -> tuple[int, dict[str, str], bytes]:
    extra = f"Accept: {accept}\r\n" if accept else ""
    return await http(port, f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode())


def samples(text: bytes) -> dict[tuple[str, frozenset], float]:
    found = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def counted(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def value(found, name, **labels) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


async def test_metrics_describe_devices_registration_streams_and_the_build(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", ["dm-0", "dm-1", "dm-2"])
    name = "example.com/ops-metrics"
    config = config_for('{"include-devices": ["/dev/dm-*"]}', name=name, socket="ops-m.sock")
    sock = port_socket()
    port = sock.getsockname()[1]
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config, dev_root=dev, metrics_socket=sock) as h:
            status, headers, body = await get(port, "/metrics")
            assert status == 200 and headers["content-type"].startswith("text/plain")
            found = samples(body)
            assert value(found, "powerdev_devices", resource=name, health="healthy") == 3
            assert value(found, "powerdev_devices", resource=name, health="unhealthy") == 0
            assert value(found, "powerdev_advertised_units", resource=name, health="healthy") == 3
            assert value(found, "powerdev_resource_state", resource=name, state="registered") == 1
            assert value(found, "powerdev_resource_state", resource=name, state="waiting") == 0
            assert value(found, "powerdev_registrations_total", resource=name, cause="start") == 1
            assert (
                value(found, "powerdev_listandwatch_streams", resource=name, client="kubelet") == 1
            )
            assert value(found, "powerdev_listandwatch_messages_total", resource=name) >= 1
            assert value(found, "powerdev_rescans_total", resource=name, cause="start") == 1
            assert value(found, "powerdev_config_last_applied_timestamp_seconds") > 0
            builds = [k for k in found if k[0] == "powerdev_build_info"]
            assert builds and ("version", "0.1.0") in builds[0][1]
            assert value(found, "process_resident_memory_bytes") > 0

            # The kubelet restarts: a registration caused by it, and the new stream.
            await h.kubelet.restart()
            await h.wait_registered(2)
            found = samples((await get(port, "/metrics"))[2])
            causes = {
                dict(k[1])["cause"]: v
                for k, v in found.items()
                if k[0] == "powerdev_registrations_total" and dict(k[1])["resource"] == name
            }
            assert causes.get("start") == 1
            # Whichever the daemon saw first: the stream's end or the directory's change.
            again = ("kubelet_restart", "socket_removed", "stream_end")
            assert sum(causes.get(c, 0) for c in again) == 1, causes

            # OpenMetrics when asked for it, as Prometheus does.
            status, headers, body = await get(
                port, "/metrics", accept="application/openmetrics-text; version=1.0.0"
            )
            assert headers["content-type"].startswith("application/openmetrics-text")
            assert body.endswith(b"# EOF\n")


async def test_allocate_calls_refusals_and_latency_are_counted_and_refusals_logged(
    tmp_path, caplog
):
    dev = make_dev_tree(tmp_path / "dev", ["dm-0", "dm-1"])
    name = "example.com/ops-allocate"
    config = config_for('{"include-devices": ["/dev/dm-*"]}', name=name, socket="ops-a.sock")
    sock = port_socket()
    port = sock.getsockname()[1]
    caplog.set_level(logging.WARNING, logger="powerdev")
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config, dev_root=dev, metrics_socket=sock) as h:
            before = samples((await get(port, "/metrics"))[2])
            await h.kubelet.allocate(name, ["dm-0"])
            began = trio.current_time()
            refused = 12
            for _ in range(refused):
                with pytest.raises(PluginCallError, match="unknown device ID 'sdz9'"):
                    await h.kubelet.allocate(name, ["dm-1", "sdz9"])
            elapsed = trio.current_time() - began
            after = samples((await get(port, "/metrics"))[2])

    def delta(metric, **labels):
        return value(after, metric, **labels) - value(before, metric, **labels)

    assert delta("powerdev_allocate_calls_total", resource=name) == 1 + refused
    assert delta("powerdev_allocate_refusals_total", resource=name, reason="unknown_id") == refused
    assert delta("powerdev_allocate_duration_seconds_count", resource=name) == 1 + refused
    lines = [r.getMessage() for r in caplog.records if "Allocate refused" in r.getMessage()]
    assert lines, "no refusal was logged"
    assert lines[0].startswith(
        f"{name}: Allocate refused (unknown_id) for requested IDs [dm-1, sdz9]"
    )
    assert "unknown device ID 'sdz9'" in lines[0]
    # Rate-limited: a burst of 5, then one per 10 s.
    assert len(lines) <= 5 + math.ceil(elapsed / 10)


async def test_healthz_and_readyz_follow_the_kubelet(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", ["dm-0"])
    name = "example.com/ops-ready"
    config = config_for('{"include-devices": ["/dev/dm-*"]}', name=name, socket="ops-r.sock")
    sock = port_socket()
    port = sock.getsockname()[1]
    plugin_dir = tmp_path / "device-plugins"
    settings = Settings(
        plugin_dir=plugin_dir, dev_root=dev, sys_root=tmp_path / "sys", uevents="off",
        metrics_socket=sock, **host_safe(tmp_path),
    )  # fmt: skip
    with trio.fail_after(LIMIT):
        async with asyncio_door(), trio.open_nursery() as nursery:
            nursery.start_soon(partial(supervisor.run, settings, config, events=ChannelEvents()))
            # No kubelet yet: alive, not ready. (A request made before the port
            # is served waits in the listening socket's backlog.)
            status, _, body = await get(port, "/readyz")
            assert status == 503 and f"{name}: waiting for the kubelet (not ok)" in body.decode()
            status, _, body = await get(port, "/healthz")
            assert status == 200 and body.decode().endswith("powerdev 0.1.0: ok\n")

            kubelet = FakeKubelet(plugin_dir)
            await nursery.start(kubelet.run)
            await kubelet.wait_until(lambda k: name in k.resources and k.resources[name].updates)
            status, _, body = await get(port, "/readyz")
            assert status == 200, body
            assert f"{name}: registered, socket" in body.decode()
            assert (await get(port, "/healthz"))[0] == 200
            nursery.cancel_scope.cancel()


async def test_while_registering_again_the_probes_say_so_alive_and_not_ready(tmp_path, monkeypatch):
    """From the moment the daemon sees a reason to register again (here, its
    socket removed, as a kubelet restart does) until the new socket serves,
    the state is re-registering: alive, not ready. The new server's start is
    held here, so that the probes are asked inside that window."""
    dev = make_dev_tree(tmp_path / "dev", ["dm-0"])
    name = "example.com/ops-again"
    config = config_for('{"include-devices": ["/dev/dm-*"]}', name=name, socket="ops-g.sock")
    sock = port_socket()
    port = sock.getsockname()[1]
    serve = registrar.serve
    calls = 0
    held, release = trio.Event(), trio.Event()

    async def held_second_time(*args, task_status=trio.TASK_STATUS_IGNORED):
        nonlocal calls
        calls += 1
        if calls == 2:
            held.set()
            await release.wait()
        await serve(*args, task_status=task_status)

    monkeypatch.setattr(registrar, "serve", held_second_time)
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config, dev_root=dev, metrics_socket=sock) as h:
            (h.settings.plugin_dir / "ops-g.sock").unlink()
            await held.wait()
            status, _, body = await get(port, "/healthz")
            assert status == 200, body
            assert f"{name}: re-registering" in body.decode()
            status, _, body = await get(port, "/readyz")
            assert status == 503 and f"{name}: re-registering" in body.decode(), body
            found = samples((await get(port, "/metrics"))[2])
            assert value(found, "powerdev_resource_state", resource=name, state="registered") == 0
            assert (
                value(found, "powerdev_resource_state", resource=name, state="re-registering") == 1
            )
            release.set()
            await h.wait_registered(2)
            assert (await get(port, "/readyz"))[0] == 200


async def test_garbage_slow_huge_and_many_requests_neither_block_nor_stop_the_daemon(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(opsserver, "REQUEST_SECONDS", 0.5)
    dev = make_dev_tree(tmp_path / "dev", ["dm-0"])
    name = "example.com/ops-abuse"
    config = config_for('{"include-devices": ["/dev/dm-*"]}', name=name, socket="ops-x.sock")
    sock = port_socket()
    port = sock.getsockname()[1]
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config, dev_root=dev, metrics_socket=sock) as h:
            # Not HTTP at all: 400, and the connection is closed.
            assert (await http(port, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" * 10))[
                0
            ] == 400
            assert (await http(port, b"GET\r\n\r\n"))[0] == 400
            # Writes and other methods: refused.
            for method in ("POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"):
                status, headers, _ = await http(
                    port,
                    f"{method} /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode(),
                )
                assert status == 405 and headers["allow"] == "GET", method
            assert (await get(port, "/metrics/../etc/passwd"))[0] == 404
            # A head over the bound: 431, without reading the rest.
            huge = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"
            assert (await http(port, huge))[0] == 431

            async def slow_client(closed: list[int]) -> None:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                async with stream:
                    await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # no end
                    try:
                        while await stream.receive_some(4096):
                            pass
                    except trio.BrokenResourceError:
                        pass
                closed.append(1)

            async def huge_body() -> None:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                async with stream:
                    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n"
                    try:
                        await stream.send_all(head)
                        for _ in range(64):  # 4 MiB, more than the server drains
                            await stream.send_all(b"x" * 65536)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass  # the server closed: what it should do

            closed: list[int] = []
            slow = 20  # each held open until the server's deadline cuts it off
            async with trio.open_nursery() as clients:
                for _ in range(slow):
                    clients.start_soon(slow_client, closed)
                clients.start_soon(huge_body)
                # Meanwhile the daemon serves the kubelet as ever...
                grant = await h.kubelet.allocate(name, ["dm-0"])
                assert [d.host_path for d in grant.devices] == ["/dev/dm-0"]
                # ... and a probe gets its answer without waiting for them.
                status, _, _ = await get(port, "/healthz")
                assert status == 200
            assert len(closed) == slow  # each slow client was closed by the server

            # Many connections opened and dropped at once.
            for _ in range(200):
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                await stream.aclose()
            status, _, body = await get(port, "/readyz")
            assert status == 200, body
            grant = await h.kubelet.allocate(name, ["dm-0"])
            assert grant.devices


def test_a_bad_or_taken_address_is_one_clear_error():
    for text in ("8080", "host:port", "::1:80", ":0x50", ":70000", ":-1"):
        with pytest.raises(ValueError):
            opsserver.parse_address(text)
    assert opsserver.parse_address(":8080") == ("", 8080)
    assert opsserver.parse_address("[::1]:9") == ("::1", 9)
    taken = port_socket()
    with taken:
        address = oplog.bound_address(taken)
        with pytest.raises(opsserver.ListenError, match=f"cannot listen on {address}"):
            opsserver.listen(address)


@needs_root  # distinct devices (mknod): every name of one device is one unit
async def test_every_device_event_batch_and_rescan_is_counted(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", ["dm-0"])
    name = "example.com/ops-events"
    config = config_for('{"include-devices": ["/dev/dm-*"]}', name=name, socket="ops-e.sock")
    events = ChannelEvents()
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config, dev_root=dev, events=events) as h:
            before_batches = counted("powerdev_device_event_batches_total", source="other")
            before_rescans = counted("powerdev_rescans_total", resource=name, cause="event")
            make_dev_tree(dev, ["dm-1"])
            events.send.send_nowait(DeviceEvent("add", ("/dev/dm-1",), "block"))
            await h.kubelet.wait_until(lambda k: k.resources[name].capacity == 2)
            make_dev_tree(dev, ["dm-2"])  # found by the rescan only
            events.send.send_nowait("rescan")
            await h.kubelet.wait_until(lambda k: k.resources[name].capacity == 3)
            assert counted("powerdev_rescans_total", resource=name, cause="event") == (
                before_rescans + 1
            )
            batches = counted("powerdev_device_event_batches_total", source="other")
            assert batches >= before_batches + 2


async def test_device_events_are_counted_by_the_source_that_saw_them(tmp_path):
    """A node made in /dev reaches the daemon through inotify, and is counted so."""
    dev = make_dev_tree(tmp_path / "dev", ["dm-0"])
    name = "example.com/ops-inotify"
    config = config_for('{"include-devices": ["/dev/dm-*"]}', name=name, socket="ops-i.sock")
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config, dev_root=dev) as h:
            before = counted("powerdev_device_events_total", source="inotify")
            others = counted("powerdev_device_events_total", source="other")
            (dev / "dm-1").symlink_to("/dev/null")
            await h.kubelet.wait_until(lambda k: k.resources[name].capacity == 2)
            assert counted("powerdev_device_events_total", source="inotify") > before
            assert counted("powerdev_device_events_total", source="other") == others


async def test_register_refusals_are_counted_and_the_accepted_one_by_its_cause(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", ["dm-0"])
    name = "example.com/ops-refused"
    config = config_for('{"include-devices": ["/dev/dm-*"]}', name=name, socket="ops-f.sock")
    plugin_dir = tmp_path / "device-plugins"
    settings = Settings(
        plugin_dir=plugin_dir, dev_root=dev, sys_root=tmp_path / "sys", **host_safe(tmp_path)
    )
    with trio.fail_after(LIMIT):
        async with asyncio_door(), trio.open_nursery() as nursery:
            kubelet = FakeKubelet(plugin_dir)
            kubelet.refuse_next = 2
            await nursery.start(kubelet.run)
            await nursery.start(partial(supervisor.run, settings, config, events=ChannelEvents()))
            await kubelet.wait_until(lambda k: name in k.resources and k.resources[name].updates)
            assert counted("powerdev_register_failures_total", resource=name, kind="refused") == 2
            assert counted("powerdev_registrations_total", resource=name, cause="start") == 1
            nursery.cancel_scope.cancel()


async def test_config_reloads_applied_and_rejected_are_counted_with_the_last_good_time(tmp_path):
    from powerdev.config import ResourceConfig
    from powerdev.daemon.reload import Reloader
    from powerdev.devices.inventory import Inventory
    from powerdev.resources.plugin import Plugin

    path = tmp_path / "config.json"
    path.write_text('{"permissions": "rw"}')
    name = "example.com/ops-reload"
    plugin = Plugin(
        ResourceConfig(name=name, socket="ops-l.sock"), Inventory(), refresh=None, spec=None
    )
    from powerdev.daemon.settings import Settings
    from tests.conftest import StubResources

    running = StubResources([plugin])
    settings = Settings(config_path=path, resource_name=name, socket_name="ops-l.sock")
    reloader = Reloader(settings, running, loaded=path.read_bytes())
    applied = counted("powerdev_config_reloads_total", result="applied")
    rejected = counted("powerdev_config_reloads_total", result="rejected")
    config_rescans = counted("powerdev_rescans_total", resource=name, cause="config")
    metrics.LAST_GOOD_CONFIG.set(0)

    path.write_text('{"permissions": "rwx"}')
    assert await reloader.reload() is False
    assert counted("powerdev_config_reloads_total", result="rejected") == rejected + 1
    assert counted("powerdev_config_last_applied_timestamp_seconds") == 0

    path.write_text('{"permissions": "r"}')
    assert await reloader.reload() is True
    assert counted("powerdev_config_reloads_total", result="applied") == applied + 1
    assert counted("powerdev_config_last_applied_timestamp_seconds") > 0
    assert counted("powerdev_rescans_total", resource=name, cause="config") == config_rescans + 1
    assert ("reconfigure", plugin) in running.calls and plugin.resource.permissions == "r"
