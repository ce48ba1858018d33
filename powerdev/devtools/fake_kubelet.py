"""A fake kubelet that behaves like the real one (see kubelet-contract.md).

- At start it creates the directory, deletes every socket in it, then
  serves Registration on kubelet.sock.
- Register is synchronous: it checks the version and the resource name,
  dials the endpoint, calls GetDevicePluginOptions (an error fails Register)
  and opens ListAndWatch, then answers. Errors are gRPC UNKNOWN.
- Every ListAndWatch message is the whole list; capacity counts every
  device, allocatable the exactly-"Healthy" ones. When a stream ends, every
  device of that resource turns unhealthy, and the kubelet never redials.
- Registering a resource again replaces the old endpoint.
- restart() does what a kubelet restart does to the directory.

State is plain data; tests wait on it with `wait_until(predicate)`. Calls
that dial the plugin (allocate) are made from inside `rpc.asyncio_door()`.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio
import trio.lowlevel

from powerdev.config import resource_name_problem
from powerdev.kubelet.paths import API_VERSION, KUBELET_SOCKET
from powerdev.rpc import asyncio_door
from powerdev.rpc.kubelet_side import (
    ContainerGrant,
    Holders,
    PluginClient,
    RegisterRefused,
    serve_pod_resources,
    serve_registration,
)

log = logging.getLogger(__name__)
DIAL_TIMEOUT = 10.0


@dataclass
class ResourceState:
    """What the kubelet knows of one extended resource."""

    name: str
    endpoint: str
    devices: dict[str, str] = field(default_factory=dict)  # ID -> health string
    connected: bool = True
    updates: int = 0  # ListAndWatch messages received on the current connection
    options: tuple[bool, bool] = (False, False)  # as GetDevicePluginOptions answered
    # RegisterRequest.options: the kubelet ignores them (the call above is
    # what counts); kept so that tests can compare the two.
    register_options: tuple[bool, bool] = (False, False)
    ended_reason: str | None = None

    @property
    def capacity(self) -> int:
        return len(self.devices)

    @property
    def allocatable(self) -> int:
        if not self.connected:
            return 0
        return sum(1 for h in self.devices.values() if h == "Healthy")

    def healthy_ids(self) -> list[str]:
        if not self.connected:
            return []
        return sorted(i for i, h in self.devices.items() if h == "Healthy")


@dataclass(frozen=True)
class Event:
    """One thing the kubelet saw, for logs and the local runner."""

    kind: str  # "registered", "update", "ended", "refused", "restarted"
    resource: str
    detail: str = ""
    devices: tuple[tuple[str, str], ...] = ()


class FakeKubelet:
    def __init__(
        self,
        plugin_dir: Path,
        *,
        on_event: Callable[[Event], None] | None = None,
        before_dial: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.plugin_dir = plugin_dir
        self.resources: dict[str, ResourceState] = {}
        # PodResources: the pods the kubelet still counts, and what each holds
        # (tests set it); served beside the plugin dir, as under /var/lib/kubelet.
        self.pods: Holders = {}
        self.pod_resources_socket = plugin_dir.parent / "pod-resources" / "kubelet.sock"
        self.pod_resources_asked = 0
        self.pod_resources_down = False  # answer UNAVAILABLE, as a kubelet still starting may
        self.registrations = 0
        self.refusals: list[str] = []
        self.refuse_next = 0  # refuse this many Register calls, as a kubelet in trouble would
        self.restarts = 0
        self.generation = 0  # how many times it has started serving
        # Awaited in Register just before the kubelet dials the plugin, so a
        # test can act at exactly that moment (say, open another stream first).
        self.before_dial = before_dial
        self._clients: dict[str, tuple[PluginClient, trio.CancelScope]] = {}
        self._replaced: list[tuple[PluginClient, trio.CancelScope]] = []
        self._on_event = on_event
        self._changed = trio.Event()
        self._restart_requested = trio.Event()
        self._streams: trio.Nursery | None = None

    # --- watching the state -------------------------------------------------

    def _note(self, event: Event) -> None:
        self._changed.set()
        self._changed = trio.Event()
        if self._on_event is not None:
            self._on_event(event)

    async def wait_until(self, predicate: Callable[[FakeKubelet], bool]) -> None:
        """Return once predicate(self) holds; re-checked on every state change."""
        while not predicate(self):
            await self._changed.wait()

    # --- lifetime ---------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled, starting anew whenever restart() asks."""
        async with asyncio_door():
            first = True
            while True:
                self._clean_directory()
                try:
                    async with trio.open_nursery() as life:
                        self._streams = life
                        await life.start(
                            serve_registration, self.plugin_dir / KUBELET_SOCKET, self._register
                        )
                        self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
                        self.pod_resources_socket.unlink(missing_ok=True)
                        await life.start(
                            serve_pod_resources, self.pod_resources_socket, self._pod_listing
                        )
                        self.generation += 1
                        if first:
                            task_status.started()
                            first = False
                        self._note(Event("restarted" if self.generation > 1 else "started", ""))
                        await self._restart_requested.wait()
                        self._restart_requested = trio.Event()
                        life.cancel_scope.cancel()
                finally:
                    self._drop_all_clients()

    def _pod_listing(self) -> Holders | None:
        self.pod_resources_asked += 1
        self._changed.set()  # for wait_until; not an event a log would show
        self._changed = trio.Event()
        if self.pod_resources_down:
            return None
        return {pod: {r: list(ids) for r, ids in held.items()} for pod, held in self.pods.items()}

    async def restart(self) -> None:
        """Stop, as a kubelet restart does (its plugin connections end), delete
        every socket in the directory, and serve kubelet.sock again. Returns
        once the new kubelet serves."""
        self.restarts += 1
        target = self.generation + 1
        self._restart_requested.set()
        await self.wait_until(lambda k: k.generation >= target)

    def _clean_directory(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        for entry in os.scandir(self.plugin_dir):
            try:
                if stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                    os.unlink(entry.path)
            except FileNotFoundError:
                pass

    def _drop_all_clients(self) -> None:
        for client, scope in [*self._clients.values(), *self._replaced]:
            scope.cancel()
            client.close()
        self._clients.clear()
        self._replaced.clear()
        for state in self.resources.values():
            state.connected = False
        self._streams = None

    # --- Registration -------------------------------------------------------------

    async def register(
        self,
        version: str,
        endpoint: str,
        resource: str,
        options: tuple[bool, bool] = (False, False),
    ) -> None:
        """What the Registration service does with one Register call."""
        await self._register(version, endpoint, resource, options)

    async def _register(
        self, version: str, endpoint: str, resource: str, options: tuple[bool, bool]
    ) -> None:
        try:
            await self._admit(version, endpoint, resource, options)
        except RegisterRefused as err:
            self.refusals.append(str(err))
            self._note(Event("refused", resource, str(err)))
            raise

    async def _admit(
        self, version: str, endpoint: str, resource: str, register_options: tuple[bool, bool]
    ) -> None:
        if self.refuse_next > 0:
            self.refuse_next -= 1
            raise RegisterRefused("the device manager is not ready (refused on request)")
        if version != API_VERSION:
            raise RegisterRefused(
                f"invalid version {version!r}, supported versions: [{API_VERSION}]"
            )
        problem = resource_name_problem(resource)
        if problem:
            raise RegisterRefused(f"invalid resource name {resource!r}: {problem}")
        if not endpoint or "/" in endpoint:
            raise RegisterRefused(f"invalid endpoint {endpoint!r}: must be a file name")
        if self.before_dial is not None:
            await self.before_dial()
        client = PluginClient(self.plugin_dir / endpoint)
        try:
            with trio.fail_after(DIAL_TIMEOUT):
                options = await client.options(dial_seconds=DIAL_TIMEOUT)
        except Exception as err:
            client.close()
            raise RegisterRefused(f"failed to dial device plugin at {endpoint}: {err}") from None
        old = self._clients.pop(resource, None)
        if old is not None:
            # A second Register for a name replaces the endpoint. As in the
            # real device manager, the old stream is not cut here: it ends
            # when its plugin ends it, and then affects only the old state.
            self._replaced.append(old)
        state = ResourceState(
            resource, endpoint, options=options, register_options=register_options
        )
        self.resources[resource] = state
        self.registrations += 1
        scope = trio.CancelScope()
        self._clients[resource] = (client, scope)
        assert self._streams is not None
        self._streams.start_soon(self._list_and_watch, client, state, scope)
        self._note(Event("registered", resource, endpoint))

    async def _list_and_watch(
        self, client: PluginClient, state: ResourceState, scope: trio.CancelScope
    ) -> None:
        def on_update(devices: list[tuple[str, str]]) -> None:
            state.devices = dict(devices)
            state.updates += 1
            self._note(Event("update", state.name, devices=tuple(devices)))

        with scope:
            reason = await client.watch(on_update)
            # As the real kubelet: the resource's devices turn unhealthy, and
            # nothing redials; only a new Register brings them back.
            state.connected = False
            state.ended_reason = reason
            log.info("ListAndWatch ended unexpectedly for device plugin %s: %s", state.name, reason)
            self._note(Event("ended", state.name, reason))

    # --- what a pod admission does ------------------------------------------------

    async def allocate(self, resource: str, ids: Sequence[str]) -> ContainerGrant:
        """One container's Allocate; the kubelet keeps container_responses[0]."""
        return (await self.allocate_containers(resource, [ids]))[0]

    async def allocate_containers(
        self, resource: str, requests: Sequence[Sequence[str]]
    ) -> list[ContainerGrant]:
        client, _ = self._clients[resource]
        return await client.allocate(requests)

    def client(self, resource: str) -> PluginClient:
        return self._clients[resource][0]

    def end_stream(self, resource: str) -> None:
        """End the resource's ListAndWatch from the kubelet's side, as a
        broken connection would; the kubelet then never redials."""
        client, scope = self._clients.pop(resource)
        scope.cancel()
        client.close()
