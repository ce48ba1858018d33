"""The re-registration loop of one resource.

Each pass is one *registration*: wait for kubelet.sock, serve on a fresh
socket, Register (retried with backoff), then wait for a reason to do it
again: the kubelet restarted (inotify: our socket deleted, kubelet.sock
created again) or the kubelet's ListAndWatch stream ended. Then the pass's
nursery is cancelled, which stops the old server and removes its socket
before the next pass registers again. Nothing here knows about devices.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import trio

from powerdev.config import ResourceConfig
from powerdev.kubelet.watch import DirectoryGone, PluginDirWatch, Reason
from powerdev.ops import metrics
from powerdev.ops.status import StatusFile
from powerdev.resources.plugin import Plugin
from powerdev.rpc import (
    Answers,
    KubeletUnreachable,
    PluginService,
    RegisterError,
    register,
    serve,
)
from powerdev.support.backoff import Backoff
from powerdev.support.inotify import Inotify
from powerdev.support.probe import socket_answers

log = logging.getLogger(__name__)

REGISTER_BACKOFF = (0.05, 5.0)  # first and longest wait between Register attempts
STREAM_END_BACKOFF = (0.1, 5.0)  # before Register, after repeated quick stream ends
ERROR_BACKOFF = (0.1, 5.0)  # after an OSError from the plugin directory
STABLE_AFTER = 10.0  # a registration that lived this long resets the stream-end backoff
STREAM_ENDED = Reason(
    "stream_end",
    "the kubelet ended our ListAndWatch stream (it is stopping or restarting, "
    "or another plugin took the resource)",
)


async def serve_resource(
    plugin_dir: Path,
    plugin: Plugin,
    status: StatusFile | None = None,
    *,
    inotify: Inotify | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The re-registration loop for one resource; started() when first serving.
    Its watch of the plugin directory is a view of `inotify`, the daemon's one."""
    status = status or StatusFile(None)
    socket_path = plugin_dir / plugin.resource.socket

    def report(state: str) -> None:
        status.set(plugin.resource.name, state, socket_path)

    def serving() -> None:
        nonlocal task_status
        errors.reset()
        task_status.started()
        task_status = trio.TASK_STATUS_IGNORED

    errors = Backoff(*ERROR_BACKOFF)
    while True:
        try:
            with PluginDirWatch(plugin_dir, plugin.resource.socket, inotify) as watch:
                if watch.made:
                    log.warning(
                        "%s: the plugin directory %s did not exist (the kubelet makes it when "
                        "it starts): made it, to wait there for kubelet.sock; if the kubelet "
                        "uses another directory, set --plugin-dir to it",
                        plugin.resource.name,
                        plugin_dir,
                    )
                await _registrations(plugin, watch, socket_path, serving, report)
        except* DirectoryGone as group:
            metrics.next_registration(plugin.resource.name, "plugin_dir_removed")
            log.warning("%s: %s; watching it again", plugin.resource.name, group.exceptions[0])
        except* OSError as group:
            # A socket or directory that a kubelet changed under our feet:
            # never a reason to exit, which would cost a pod restart.
            metrics.next_registration(plugin.resource.name, "error")
            delay = errors.next()
            log.error(
                "%s: %s; trying again in %.2fs", plugin.resource.name, group.exceptions[0], delay
            )
            await trio.sleep(delay)


async def _registrations(
    plugin: Plugin,
    watch: PluginDirWatch,
    socket_path: Path,
    serving: Callable[[], None],
    report: Callable[[str], None],
) -> None:
    """One registration per pass: serve, Register, wait for a reason to redo it."""
    resource = plugin.resource
    answers = Answers(plugin)  # encoded replies, kept across registrations
    stream_ends = Backoff(*STREAM_END_BACKOFF)
    quick_ends = 0  # registrations in a row whose stream the kubelet ended quickly
    while True:
        if not watch.kubelet_socket.exists():
            log.info("waiting for the kubelet: %s does not exist yet", watch.kubelet_socket)
            report("waiting")
        if socket_answers(socket_path):
            # Never take a socket from a live server (a second powerdev, say,
            # in a rolling update): wait until it is gone, then serve.
            log.error(
                "%s: another server answers on %s; waiting until it goes away",
                resource.name,
                socket_path,
            )
            report("waiting")
            reason = await watch.wait_for_restart()
            metrics.next_registration(resource.name, reason.cause)
            log.info("%s: %s; serving", resource.name, reason)
            continue
        socket_path.unlink(missing_ok=True)  # noqa: ASYNC240 (one local directory entry)
        new_kubelet = await watch.wait_for_kubelet()
        service = PluginService(plugin, answers)
        began = trio.current_time()
        # A kubelet that keeps ending our stream (say, another plugin took the
        # resource) gets Register with backoff; a kubelet that started anew, at once.
        delay = 0.0 if new_kubelet or quick_ends < 2 else stream_ends.next()
        async with trio.open_nursery() as registration:
            await registration.start(serve, socket_path, [service])
            log.info("%s: serving on %s", resource.name, socket_path)
            serving()
            report("serving")

            registration.start_soon(_register_until_done, watch, service, resource, delay, report)
            registration.start_soon(_warm_up, service, answers, plugin)

            reason = await _first_of(watch.wait_for_restart, partial(_stream_end, service))
            report("re-registering")  # our socket may be gone already: alive, not ready
            registration.cancel_scope.cancel()
        metrics.next_registration(resource.name, reason.cause)
        log.info("%s: %s; serving and registering again", resource.name, reason)
        quick = trio.current_time() - began < STABLE_AFTER
        if reason == STREAM_ENDED and quick and not new_kubelet:
            quick_ends += 1
        else:
            quick_ends = 0
            stream_ends.reset()


async def _warm_up(service: PluginService, answers: Answers, plugin: Plugin) -> None:
    """Once the kubelet has its first list, encode Allocate's answer (in a
    worker thread), so that the first pod's admission does not pay for it."""
    await service.kubelet_list_sent.wait()
    await plugin.warm()
    await answers.allocate(plugin.allocate([[]], refresh=False))


async def _stream_end(service: PluginService) -> Reason:
    await service.kubelet_stream_ended.wait()
    return STREAM_ENDED


async def _register_until_done(
    watch: PluginDirWatch,
    service: PluginService,
    resource: ResourceConfig,
    first_delay: float = 0.0,
    report: Callable[[str], None] = lambda state: None,
) -> None:
    """Register, retrying with backoff. A kubelet that does not answer is
    one that is stopping or restarting: said once at INFO, since the new one
    will be seen (kubelet.sock created again) and registered with at once.
    A kubelet that answers and refuses is a WARNING, once per reason."""
    await trio.sleep(first_delay)
    backoff = Backoff(*REGISTER_BACKOFF)
    last_error = None
    while True:
        try:
            service.registering = True
            await register(watch.kubelet_socket, resource.socket, resource.name, service.options())
        except KubeletUnreachable as err:
            metrics.register_failed(resource.name, "unreachable")
            if str(err) != last_error:
                log.info(
                    "%s: the kubelet does not answer (%s); it is stopping or restarting, "
                    "so powerdev registers as soon as it is back",
                    resource.name,
                    err,
                )
                last_error = str(err)
        except RegisterError as err:
            metrics.register_failed(resource.name, "refused")
            if str(err) != last_error:
                log.warning(
                    "%s: Register failed: %s (retrying with backoff up to %.0fs)",
                    resource.name,
                    err,
                    backoff.longest,
                )
                last_error = str(err)
        else:
            log.info("%s: registered with the kubelet", resource.name)
            metrics.registered(resource.name)
            report("registered")
            return
        finally:
            service.registering = False
        await trio.sleep(backoff.next())


async def _first_of(*waiters: Callable[[], Awaitable[Reason]]) -> Reason:
    """Run the waiters together; return what the first to finish returns."""
    results: list[Reason] = []
    async with trio.open_nursery() as nursery:

        async def one(waiter: Callable[[], Awaitable[Reason]]) -> None:
            results.append(await waiter())
            nursery.cancel_scope.cancel()

        for waiter in waiters:
            nursery.start_soon(one, waiter)
    return results[0]
