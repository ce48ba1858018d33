"""Faults against the real daemon process and the fake kubelet. Every test
ends with SIGTERM in the middle of what it does: exit 0, socket removed.

Devices live in a temp /dev/pool, matched by "/dev/pool/*": powerdev watches
that directory, so adding and removing nodes there is a real device change."""

import contextlib
import os
import signal
import subprocess

import pytest
import trio
import trio.lowlevel

from powerdev.config import DEFAULT_RESOURCE_NAME as RESOURCE
from powerdev.devtools.testing import is_root, make_nodes
from powerdev.rpc.kubelet_side import PluginCallError, PluginClient
from powerdev.support.probe import socket_answers
from tests.conftest import wait_for_file
from tests.faults.harness import kubelet_running, registered, spawn, write_config

LIMIT = 120
FD_BOUND = 2  # descriptors a daemon may hold more after 100 restarts than after 10
RSS_BOUND_KIB = 4096  # and memory


def pool(tmp_path, count):
    make_nodes(tmp_path / "dev" / "pool", [f"d{i}" for i in range(count)])
    return tmp_path / "dev", write_config(
        tmp_path / "config.json", **{"include-devices": ["/dev/pool/*"]}
    )


def listed(kubelet):
    return set(kubelet.resources[RESOURCE].devices)


def on_disk(dev):
    return {f"pool.{name}" for name in os.listdir(dev / "pool")}


async def stop_cleanly(daemon, *, successor=None):
    """SIGTERM: exit 0, and no socket left behind. With a successor (a second
    daemon waiting for the path), the path may hold the successor's new socket."""
    assert await daemon.terminate() == 0
    if successor is None:
        assert not daemon.socket.exists()
    else:
        # The successor binds the path anew and registers; a socket there that
        # answers is its own, since ours has exited. (Not inode numbers: a new
        # file may get the number of the one just deleted.)
        await successor
        assert socket_answers(daemon.socket)


async def test_100_kubelet_restarts_hold_descriptors_and_memory(tmp_path):
    dev, config = pool(tmp_path, 1000)
    with trio.fail_after(LIMIT):
        async with (
            kubelet_running(tmp_path / "device-plugins") as (kubelet, _),
            spawn(tmp_path, config, dev) as daemon,
        ):
            await kubelet.wait_until(registered(1, 1000))
            for n in range(2, 12):  # warm up: caches, buffers, lazily imported code
                await kubelet.restart()
                await kubelet.wait_until(registered(n, 1000))
            fds, rss = daemon.fds(), daemon.rss_kib()
            for n in range(12, 112):
                await kubelet.restart()
                await kubelet.wait_until(registered(n, 1000))
            assert kubelet.registrations == 111
            print(
                f"\n100 restarts: fds {fds} -> {daemon.fds()}, RSS {rss} -> {daemon.rss_kib()} KiB"
            )
            assert daemon.fds() <= fds + FD_BOUND, (fds, daemon.fds())
            assert daemon.rss_kib() <= rss + RSS_BOUND_KIB, (rss, daemon.rss_kib())
            await kubelet.restart()  # and SIGTERM while it re-registers
            await stop_cleanly(daemon)


async def test_clients_that_never_let_go_keep_nothing_after_restarts(tmp_path):
    """A debugging client holding a ListAndWatch stream open, on every
    registration: a closed server must end its connection, whatever it does."""
    dev, config = pool(tmp_path, 100)
    with trio.fail_after(LIMIT):
        async with (
            kubelet_running(tmp_path / "device-plugins") as (kubelet, nursery),
            spawn(tmp_path, config, dev) as daemon,
        ):
            await kubelet.wait_until(registered(1, 100))
            clients = []

            async def hold_a_stream() -> None:
                client = PluginClient(daemon.socket)
                clients.append(client)
                await nursery.start(client.stall)

            await hold_a_stream()
            for n in range(2, 5):  # warm up
                await kubelet.restart()
                await kubelet.wait_until(registered(n, 100))
                await hold_a_stream()
            fds = daemon.fds()
            for n in range(5, 25):
                await kubelet.restart()
                await kubelet.wait_until(registered(n, 100))
                await hold_a_stream()
            print(
                f"\n20 restarts, each with a client that never lets go: fds {fds} -> {daemon.fds()}"
            )
            assert daemon.fds() <= fds + FD_BOUND
            for client in clients:
                client.close()
            await stop_cleanly(daemon)


async def test_restarts_during_allocates(tmp_path):
    dev, config = pool(tmp_path, 2000)
    outcomes = {"ok": 0, "failed": 0}
    answered = trio.Event()  # set on every answered Allocate, then armed again
    with trio.fail_after(LIMIT):
        async with (
            kubelet_running(tmp_path / "device-plugins") as (kubelet, _),
            spawn(tmp_path, config, dev) as daemon,
        ):
            await kubelet.wait_until(registered(1, 2000))

            async def allocate_forever():
                nonlocal answered
                while True:
                    registration = kubelet.registrations
                    client = PluginClient(daemon.socket)
                    try:
                        while True:
                            await client.allocate_bytes(["pool.d7"])
                            outcomes["ok"] += 1
                            answered.set()
                            answered = trio.Event()
                    except (PluginCallError, OSError):
                        outcomes["failed"] += 1  # the server went away mid-call: expected
                    finally:
                        client.close()
                    # Not a spin: the next server comes with the next registration.
                    await kubelet.wait_until(lambda k, r=registration: k.registrations > r)

            async with trio.open_nursery() as allocating:
                allocating.start_soon(allocate_forever)
                for n in range(2, 12):
                    await answered.wait()  # Allocates are being answered: restart now
                    await kubelet.restart()
                    await kubelet.wait_until(registered(n, 2000))
                await answered.wait()  # and they are answered after the last restart
                allocating.cancel_scope.cancel()
            grant = await kubelet.allocate(RESOURCE, ["pool.d1"])
            assert len(grant.devices) == 2000
            print(f"\nallocates across 10 restarts: {outcomes}")
            assert outcomes["failed"] <= 10  # at most one cut off per restart, never a hang
            await stop_cleanly(daemon)


async def test_restart_during_a_big_list_send_and_while_devices_change(tmp_path):
    dev, config = pool(tmp_path, 5000)
    with trio.fail_after(LIMIT):
        async with (
            kubelet_running(tmp_path / "device-plugins") as (kubelet, _nursery),
            spawn(tmp_path, config, dev) as daemon,
        ):
            await kubelet.wait_until(registered(1, 5000))

            async def churn():
                for round_ in range(20):
                    make_nodes(dev / "pool", [f"new{round_}-{i}" for i in range(50)])
                    for i in range(0, 50, 2):
                        (dev / "pool" / f"new{round_}-{i}").unlink()
                    await trio.lowlevel.checkpoint()

            async with trio.open_nursery() as work:
                work.start_soon(churn)
                for n in range(2, 8):
                    await kubelet.restart()  # lists of 5,000+ devices are in flight
                    await kubelet.wait_until(registered(n))
            await kubelet.wait_until(lambda k: listed(k) == on_disk(dev))
            assert len(listed(kubelet)) == 5000 + 20 * 25
            make_nodes(dev / "pool", ["last"])
            await kubelet.restart()
            await stop_cleanly(daemon)  # SIGTERM while a change and a restart are in flight


async def test_kubelet_absent_then_refusing_then_accepting(tmp_path):
    dev, config = pool(tmp_path, 3)
    plugin_dir = tmp_path / "device-plugins"
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path, config, dev) as daemon:
            await wait_for_file(daemon.log, lambda text: "waiting for the kubelet" in text)
            async with kubelet_running(plugin_dir) as (kubelet, _):
                kubelet.refuse_next = 6
                await kubelet.wait_until(registered(1, 3))
                assert len(kubelet.refusals) == 6
                failures = daemon.lines("Register failed")
                assert len(failures) == 1, failures  # six refusals, one change of state: one line
                assert "the device manager is not ready" in failures[0]
                await stop_cleanly(daemon)


async def test_a_kubelet_socket_that_speaks_garbage_never_ends_the_daemon(tmp_path):
    dev, config = pool(tmp_path, 3)
    plugin_dir = tmp_path / "device-plugins"
    plugin_dir.mkdir()
    listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await listener.bind(str(plugin_dir / "kubelet.sock"))
    listener.listen()
    replies = [b"", b"\x00\x00\x12\x04garbage, not HTTP/2\xff" * 50, b"HTTP/1.1 400 Bad\r\n\r\n"]
    served = 0
    every_kind_tried = trio.Event()

    async def speak_garbage() -> None:
        nonlocal served
        while True:
            conn, _ = await listener.accept()
            with conn:
                await conn.send(replies[served % len(replies)])
                served += 1
                if served == len(replies):
                    every_kind_tried.set()

    with trio.fail_after(LIMIT):
        async with spawn(tmp_path, config, dev) as daemon, trio.open_nursery() as garbage:
            garbage.start_soon(speak_garbage)
            await every_kind_tried.wait()  # three Register calls met garbage
            garbage.cancel_scope.cancel()
            listener.close()
            assert daemon.proc.returncode is None  # still running
            async with kubelet_running(plugin_dir) as (kubelet, _):  # a real one starts
                await kubelet.wait_until(registered(1, 3))
                await stop_cleanly(daemon)


async def test_a_deleted_socket_is_served_and_registered_again(tmp_path):
    dev, config = pool(tmp_path, 3)
    with trio.fail_after(LIMIT):
        async with (
            kubelet_running(tmp_path / "device-plugins") as (kubelet, _),
            spawn(tmp_path, config, dev) as daemon,
        ):
            await kubelet.wait_until(registered(1, 3))
            daemon.socket.unlink()
            await kubelet.wait_until(registered(2, 3))
            assert daemon.socket.exists()
            daemon.socket.unlink()
            await stop_cleanly(daemon)  # SIGTERM while it serves again


async def test_a_second_powerdev_waits_for_the_first_to_go(tmp_path):
    dev, config = pool(tmp_path, 3)
    with trio.fail_after(LIMIT):
        async with kubelet_running(tmp_path / "device-plugins") as (kubelet, _):
            async with spawn(tmp_path, config, dev, "first") as first:
                await kubelet.wait_until(registered(1, 3))
                inode = first.socket.stat().st_ino
                async with spawn(tmp_path, config, dev, "second") as second:
                    await wait_for_file(second.log, lambda t: "another server answers" in t)
                    assert first.socket.stat().st_ino == inode  # not taken
                    assert kubelet.registrations == 1 and kubelet.resources[RESOURCE].connected
                    # the rolling update ends the old pod, and the new one takes over
                    await stop_cleanly(first, successor=kubelet.wait_until(registered(2, 3)))
                    grant = await kubelet.allocate(RESOURCE, ["pool.d0"])
                    assert len(grant.devices) == 3
                    await stop_cleanly(second)


async def test_a_stream_that_stops_reading_holds_up_nobody(tmp_path):
    dev, config = pool(tmp_path, 5000)  # one list is ~85 KB: more than a 64 KB flow-control window
    with trio.fail_after(LIMIT):
        async with (
            kubelet_running(tmp_path / "device-plugins") as (kubelet, nursery),
            spawn(tmp_path, config, dev) as daemon,
        ):
            await kubelet.wait_until(registered(1, 5000))
            stuck = PluginClient(daemon.socket)
            await nursery.start(stuck.stall)  # opens ListAndWatch, never reads
            rss = daemon.rss_kib()
            for round_ in range(15):
                make_nodes(dev / "pool", [f"more{round_}"])
                await kubelet.wait_until(lambda k, r=round_: f"pool.more{r}" in listed(k))
            assert listed(kubelet) == on_disk(dev)
            print(f"\nstuck reader: 15 changes, RSS {rss} -> {daemon.rss_kib()} KiB")
            assert daemon.rss_kib() <= rss + 8 * 1024  # nothing piles up for the stuck one
            stuck.close()
            await stop_cleanly(daemon)


async def test_a_storm_of_thousands_of_changes_ends_exact(tmp_path):
    dev, config = pool(tmp_path, 10)
    with trio.fail_after(LIMIT):
        async with (
            kubelet_running(tmp_path / "device-plugins") as (kubelet, _),
            spawn(tmp_path, config, dev) as daemon,
        ):
            await kubelet.wait_until(registered(1, 10))
            before = kubelet.resources[RESOURCE].updates
            # The daemon is stopped while the storm is made, so all 4,000
            # changes wait in its queues: they must come out as one message.
            daemon.proc.send_signal(signal.SIGSTOP)
            try:
                make_nodes(dev / "pool", [f"s{i}" for i in range(3000)])
                for i in range(0, 3000, 3):
                    (dev / "pool" / f"s{i}").unlink()
            finally:
                daemon.proc.send_signal(signal.SIGCONT)
            await kubelet.wait_until(lambda k: listed(k) == on_disk(dev))
            assert len(listed(kubelet)) == 10 + 3000 - 1000
            updates = kubelet.resources[RESOURCE].updates - before
            print(f"\nstorm: 4,000 changes, {updates} ListAndWatch message(s)")
            assert updates == 1
            make_nodes(dev / "pool", [f"t{i}" for i in range(500)])
            await stop_cleanly(daemon)  # SIGTERM in the middle of a storm


@contextlib.contextmanager
def read_only_dir(path):
    """A directory nobody may write: a read-only tmpfs as root (mode bits do
    not stop root), mode 0555 otherwise."""
    path.mkdir()
    if not is_root():
        path.chmod(0o555)
        yield "Permission denied"
        return
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "none", str(path)], check=True)
    try:
        yield "Read-only file system"
    finally:
        subprocess.run(["umount", str(path)], check=True)


async def test_a_cdi_spec_dir_that_cannot_be_written_is_an_allocate_error_not_a_crash(tmp_path):
    make_nodes(tmp_path / "dev" / "pool", ["d0", "d1"])
    config = write_config(
        tmp_path / "config.json", **{"include-devices": ["/dev/pool/*"], "cdi": True}
    )
    specs = tmp_path / "cdi"
    with trio.fail_after(LIMIT), read_only_dir(specs) as reason:
        async with (
            kubelet_running(tmp_path / "device-plugins") as (kubelet, _),
            spawn(tmp_path, config, tmp_path / "dev", "d", "--cdi-spec-dir", str(specs)) as daemon,
        ):
            await kubelet.wait_until(registered(1, 2))
            for _ in range(2):  # refused each time, and served on
                with pytest.raises(PluginCallError) as err:
                    await kubelet.allocate(RESOURCE, ["pool.d0"])
                assert err.value.status == "FAILED_PRECONDITION"
                assert f"cannot write the CDI spec {specs}/power-dev-plugin-dev.json" in str(
                    err.value
                )
                assert reason in str(err.value) and "turn cdi off" in str(err.value)
            assert kubelet.resources[RESOURCE].connected
            assert daemon.lines("Traceback") == []
            await stop_cleanly(daemon)
