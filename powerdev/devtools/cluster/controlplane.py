"""A one-node Kubernetes control plane for the end-to-end tests and the
bench: etcd, kube-apiserver, kube-scheduler and kube-controller-manager
from the conformance kit (kit.py finds them), on 127.0.0.1 only, with the
certificates and kubeconfigs of pki.py. No kubelet and no container
runtime: tests make Node objects and pods themselves (client.py).

`run()` is a Trio service. It starts each process once the one before is
ready: etcd prints a ready line; the API server answers /readyz; the
scheduler logs that its handlers synced; the controller manager makes the
`default` ServiceAccount. Then it calls task_status.started(ControlPlane).
Cancelled, it stops them in reverse order: SIGTERM, then SIGKILL after
STOP_LIMIT. Each process's output goes to DIR/logs/NAME.log. The bench
starts etcd and the API server only (controllers=False). The API server
alone can be stopped and started again on its port, over the same etcd
(ControlPlane.stop_apiserver(), start_apiserver()): an API server outage.

pytest-trio gives every test its own Trio loop, so a control plane shared by
a session cannot live in one: `in_thread()` runs it on a loop of its own, in
a thread. A test that needs one of its own (to stop its API server) starts
run() in its own loop. `python -m powerdev.devtools.cluster.controlplane
DIR` runs one until Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import httpx
import trio

from powerdev.devtools import kit
from powerdev.devtools.cluster.client import Api
from powerdev.devtools.cluster.pki import Pki, make_pki, write_kubeconfigs
from powerdev.devtools.testing import stop

T = TypeVar("T")

START_LIMIT = 120.0  # seconds for the whole start, on a busy 2-core machine
STOP_LIMIT = 15.0  # seconds each process has after SIGTERM before SIGKILL
READY_POLL = 0.1  # seconds between two /readyz requests
ETCD_READY = "etcd: serving "
SERVICE_CIDR = "10.96.0.0/24"
# What the controller manager runs: service accounts and their tokens (the
# API server refuses a pod whose ServiceAccount is missing), namespace
# deletion, owner-based garbage collection, and ResourceClaims for pods
# (dynamic resource allocation).
CONTROLLERS = (
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "namespace-controller",
    "garbage-collector-controller",
    "resourceclaim-controller",
)
# What a real node also needs of it (node.py): the node lifecycle controller
# lifts the not-ready taint the node registers with, the root CA publisher
# writes the `kube-root-ca.crt` ConfigMap that every pod's token volume
# projects, and the DaemonSet, Deployment and ReplicaSet controllers make
# the pods of deploy/ and examples/.
NODE_CONTROLLERS = (
    "node-lifecycle-controller",
    "root-ca-certificate-publisher-controller",
    "daemonset-controller",
    "deployment-controller",
    "replicaset-controller",
)
# How each stops on SIGTERM (returncode; negative: ended by that signal),
# when not 0. The scheduler without leader election exits 1, "finished
# without leader elect". The controller manager catches signals only with
# the ControllerManagerReleaseLeaderElectionLockOnExit feature gate (off by
# default), so SIGTERM ends it as Go's default action does.
CLEAN_EXIT = {"kube-scheduler": (1,), "kube-controller-manager": (-signal.SIGTERM,)}


class ControlPlaneError(Exception):
    """A process failed to start or to stop; str() has the end of its log."""


class Output:
    """A process's output (stdout and stderr together), appended to its log
    file as it comes. wait_for() wakes on each new line, never on a timer."""

    def __init__(self, name: str, stream: trio.abc.ReceiveStream, path: Path) -> None:
        self.name = name
        self.path = path
        self.lines: list[str] = []
        self.ended = False
        self.scope = trio.CancelScope(shield=True)  # outlives a cancel: the stop needs it
        self._stream = stream
        self._file = path.open("ab")
        self._new = trio.Event()

    async def pump(self) -> None:
        buffer = b""
        with self.scope, self._file:
            while chunk := await self._stream.receive_some(65536):
                self._file.write(chunk)
                self._file.flush()
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                self.lines.extend(line.decode("utf-8", "replace") for line in complete)
                self._wake()
        self.ended = True
        self._wake()

    def _wake(self) -> None:
        self._new.set()
        self._new = trio.Event()

    def tail(self, count: int = 20) -> str:
        return "\n".join(self.lines[-count:])

    async def wait_for(self, predicate: Callable[[str], bool]) -> str:
        """The first line that satisfies predicate; raises if the output ends first."""
        index = 0
        while True:
            while index < len(self.lines):
                if predicate(self.lines[index]):
                    return self.lines[index]
                index += 1
            if self.ended:
                raise self.ended_error()
            await self._new.wait()

    async def wait_for_line_after(self, count: int) -> str:
        """The first line after the first `count`; raises if the output ends first."""
        while len(self.lines) <= count:
            if self.ended:
                raise self.ended_error()
            await self._new.wait()
        return self.lines[count]

    async def wait_ended(self) -> None:
        """Until the process's output has ended (every line is in the log)."""
        while not self.ended:
            await self._new.wait()

    def ended_error(self) -> ControlPlaneError:
        return ControlPlaneError(
            f"{self.name} ended before it was ready; the end of {self.path}:\n{self.tail()}"
        )


@dataclass
class Component:
    name: str
    proc: trio.Process
    output: Output
    stopping: bool = False
    killed: bool = False
    crashed: bool = False  # killed on purpose: stop_apiserver(kill=True)

    def stop_problem(self) -> str | None:
        """Why its stop was not clean, or None."""
        if self.crashed:
            return None
        if self.killed:
            return f"{self.name} did not stop within {STOP_LIMIT} s of SIGTERM and was killed"
        if self.proc.returncode not in CLEAN_EXIT.get(self.name, (0,)):
            return (
                f"{self.name} exited {self.proc.returncode} after SIGTERM; "
                f"the end of {self.output.path}:\n{self.output.tail()}"
            )
        return None


@dataclass
class ControlPlane:
    """What tests need of a running control plane."""

    root: Path
    server: str  # https://127.0.0.1:PORT
    pki: Pki
    tools: dict[str, Path]
    components: list[Component]
    start_seconds: float
    exited: dict[str, int] = field(default_factory=dict)  # exits before the stop
    # What start_apiserver() needs: run()'s nursery, the command, the environment.
    _nursery: trio.Nursery | None = field(default=None, repr=False)
    _apiserver_argv: list[str] = field(default_factory=list, repr=False)
    _env: dict[str, str] = field(default_factory=dict, repr=False)

    async def stop_apiserver(self, *, kill: bool = False) -> None:
        """Stop kube-apiserver alone and return once it has exited and its
        log is whole. etcd, with the cluster's data, and the other processes
        go on; its port stays reserved, so that nothing else takes it before
        start_apiserver(). From the Trio loop that runs the control plane
        (not in_thread()).

        SIGTERM, and SIGKILL after STOP_LIMIT: a graceful stop, which waits
        for open watches until its shutdown timeout (60 s), longer than
        STOP_LIMIT. With `kill`, SIGKILL at once: a crash (the kubelet
        kills a static pod's API server that outlasts its grace period),
        every connection cut without an answer."""
        apiserver = self._component("kube-apiserver")
        if kill:
            apiserver.stopping = apiserver.crashed = True
            apiserver.proc.kill()
            await apiserver.proc.wait()
        else:
            await _stop(apiserver)
        await apiserver.output.wait_ended()
        problem = apiserver.stop_problem()
        if problem:
            raise ControlPlaneError(problem)

    async def start_apiserver(self) -> None:
        """kube-apiserver again after stop_apiserver(), with the same flags:
        the same port, certificates and etcd, so the same data. Returns once
        its /readyz answers 200; its output goes on in the same log."""
        index = next(i for i, c in enumerate(self.components) if c.name == "kube-apiserver")
        if self.components[index].proc.returncode is None:
            raise ControlPlaneError("kube-apiserver runs already: stop_apiserver() first")
        assert self._nursery is not None
        apiserver = await _start(
            self._nursery, self.root, "kube-apiserver", self._apiserver_argv, self._env
        )
        self.components[index] = apiserver
        with trio.fail_after(START_LIMIT):
            await _apiserver_ready(self, apiserver)
        self._nursery.start_soon(_record_exit, apiserver, self.exited)

    def _component(self, name: str) -> Component:
        (found,) = [c for c in self.components if c.name == name]
        return found

    @property
    def kubeconfig(self) -> Path:
        """The admin's (system:masters)."""
        return self.pki.kubeconfig("admin")

    def api(self) -> contextlib.AbstractAsyncContextManager[Api]:
        """An API client as the admin, for the current Trio loop."""
        admin = self.pki.clients["admin"]
        return Api.connect(self.server, self.pki.ca, admin.cert, admin.key)

    def kubectl(self, *args: str) -> list[str]:
        """The command line of the kit's kubectl as the admin."""
        return [str(self.tools["kubectl"]), "--kubeconfig", str(self.kubeconfig), *args]

    def log(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    def failures(self) -> list[str]:
        """The processes that exited while the control plane was up."""
        return [f"{name} exited {code}; see {self.log(name)}" for name, code in self.exited.items()]


@contextlib.contextmanager
def reserved_port() -> Iterator[int]:
    """A free port on 127.0.0.1 that no other program can take before the
    API server binds it: held by a socket bound with SO_REUSEPORT and not
    listening (so it gets no connections), and the API server binds it with
    the same option (--permit-port-sharing). Nothing to race for."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", 0))
        yield holder.getsockname()[1]
    finally:
        holder.close()


def _environment() -> dict[str, str]:
    """The processes' environment: ours without proxy settings, so that the
    API server calls webhooks and etcd directly."""
    return {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}


def hosts_file(path: Path, names: tuple[str, ...]) -> Path:
    """This machine's /etc/hosts with `names` added for 127.0.0.1."""
    base = Path("/etc/hosts").read_text() if Path("/etc/hosts").exists() else ""
    path.write_text(base.rstrip("\n") + "\n127.0.0.1 " + " ".join(names) + "\n")
    return path


def private_hosts(hosts: Path) -> list[str]:
    """The command prefix that runs a program with `hosts` as its /etc/hosts,
    in a mount namespace of its own (unshare), so that the host's file and
    every other process are left as they are. Root has the right to mount;
    another user gets it in a user namespace mapped to itself."""
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    script = 'mount --bind "$0" /etc/hosts && exec "$@"'
    return ["unshare", *user, "--mount", "--propagation", "private", "--", "sh", "-c", script]


async def _start(
    nursery: trio.Nursery, root: Path, name: str, argv: list[str], env: dict[str, str]
) -> Component:
    proc = await trio.lowlevel.open_process(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=root,
        start_new_session=True,  # a Ctrl-C reaches us, and we stop them in order
    )
    assert proc.stdout is not None
    component = Component(name, proc, Output(name, proc.stdout, root / "logs" / f"{name}.log"))
    nursery.start_soon(component.output.pump)
    return component


async def _stop(component: Component) -> None:
    component.stopping = True
    if component.proc.returncode is None:
        component.killed = await stop(component.proc, STOP_LIMIT)


async def _record_exit(component: Component, exited: dict[str, int]) -> None:
    code = await component.proc.wait()
    if not component.stopping:
        exited[component.name] = code


async def _until(component: Component, ready: Callable[[], Awaitable[T]]) -> T:
    """What ready() returns, once it does; raises, with the end of its
    log, if the component's output ends first (it exited)."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(component.output.wait_for, lambda _: False)  # raises at the end
        result = await ready()
        nursery.cancel_scope.cancel()
    return result


async def _apiserver_ready(plane: ControlPlane, apiserver: Component) -> None:
    # its log says when it listens; from then on, /readyz
    await apiserver.output.wait_for(lambda line: "Serving securely on" in line)
    async with plane.api() as api:
        await _until(apiserver, partial(_readyz, api))


async def _readyz(api: Api) -> None:
    """Until /readyz answers 200. The API server has no way to say so: each
    try is a real request, paced by READY_POLL."""
    while True:
        try:
            if (await api.http.get("/readyz")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await trio.sleep(READY_POLL)


def _etcd_command(root: Path, pki: Pki, tools: dict[str, Path]) -> list[str]:
    return [
        str(tools["etcd"]),
        f"--data-dir={root / 'etcd'}",
        f"--cert-file={pki.etcd.cert}",
        f"--key-file={pki.etcd.key}",
        f"--trusted-ca-file={pki.ca}",
    ]


def _apiserver_command(
    root: Path,
    pki: Pki,
    tools: dict[str, Path],
    etcd_url: str,
    port: int,
    hosts: Path,
    node: str | None = None,
) -> list[str]:
    apiserver = [
        *private_hosts(hosts),
        hosts,
        tools["kube-apiserver"],
        f"--etcd-servers={etcd_url}",
        f"--etcd-cafile={pki.ca}",
        f"--etcd-certfile={pki.etcd_client.cert}",
        f"--etcd-keyfile={pki.etcd_client.key}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        "--permit-port-sharing=true",  # see reserved_port()
        f"--tls-cert-file={pki.apiserver.cert}",
        f"--tls-private-key-file={pki.apiserver.key}",
        f"--client-ca-file={pki.ca}",
        "--authorization-mode=Node,RBAC",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-account-key-file={pki.service_account_public}",
        f"--service-account-signing-key-file={pki.service_account_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # The `kubernetes` Service's endpoints would be 127.0.0.1, which the
        # API refuses for an endpoint; no pod here needs to reach it.
        "--endpoint-reconciler-type=none",
        f"--cert-dir={root / 'apiserver-certs'}",
    ]
    if node is not None:
        kubelet_client = pki.clients["apiserver-kubelet-client"]
        apiserver += [
            # The node's name resolves to 127.0.0.1 in the private hosts file;
            # its InternalIP is whatever address the kubelet found.
            "--kubelet-preferred-address-types=Hostname,InternalIP",
            f"--kubelet-client-certificate={kubelet_client.cert}",
            f"--kubelet-client-key={kubelet_client.key}",
        ]
    return [str(a) for a in apiserver]


def _controller_commands(
    pki: Pki, tools: dict[str, Path], node: str | None = None
) -> tuple[list[str], list[str]]:
    controllers = CONTROLLERS + (NODE_CONTROLLERS if node is not None else ())
    scheduler = [
        tools["kube-scheduler"],
        f"--kubeconfig={pki.kubeconfig('scheduler')}",
        "--leader-elect=false",
        "--secure-port=0",  # no health port: nothing reads it
        "-v=3",  # for the "Handlers synced" line
    ]
    controller_manager = [
        tools["kube-controller-manager"],
        f"--kubeconfig={pki.kubeconfig('controller-manager')}",
        "--leader-elect=false",
        "--secure-port=0",
        f"--controllers={','.join(controllers)}",
        # Each controller as its own ServiceAccount, which the bootstrap RBAC
        # binds to its role (the namespace controller's deletecollection, for
        # one): the controller manager's own user has none of these.
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki.service_account_key}",
        f"--root-ca-file={pki.ca}",
    ]
    return [str(a) for a in scheduler], [str(a) for a in controller_manager]


async def run(
    root: Path,
    tools: dict[str, Path],
    *,
    hosts: tuple[str, ...] = (),
    controllers: bool = True,
    node: str | None = None,
    task_status: trio.TaskStatus[ControlPlane] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Start the control plane in `root`, report it started, and run it
    until cancelled. `hosts` are names that the API server resolves to
    127.0.0.1 (webhook URLs), through a private /etc/hosts. Without
    `controllers`, only etcd and kube-apiserver (no scheduler, no
    controller manager: nothing allocates claims or makes ServiceAccounts).
    With `node`, ready for a real kubelet by that name (node.py): its client
    certificate, its name resolving to 127.0.0.1, and the controllers a
    node needs (NODE_CONTROLLERS)."""
    (root / "logs").mkdir(parents=True, exist_ok=True)
    pki = make_pki(root / "pki", node)
    if node is not None:
        hosts = (*hosts, node)
    env = _environment()
    components: list[Component] = []
    exited: dict[str, int] = {}
    began = trio.current_time()
    # The port is held while the control plane runs: the API server binds
    # it again when start_apiserver() restarts it.
    with reserved_port() as port:
        async with trio.open_nursery() as nursery:
            try:
                with trio.fail_after(START_LIMIT):
                    etcd_argv = _etcd_command(root, pki, tools)
                    etcd = await _start(nursery, root, "etcd", etcd_argv, env)
                    components.append(etcd)
                    ready = await etcd.output.wait_for(lambda line: line.startswith(ETCD_READY))
                    etcd_url = ready.removeprefix(ETCD_READY)
                    server = f"https://127.0.0.1:{port}"
                    write_kubeconfigs(pki, server)
                    hosts_path = hosts_file(root / "hosts", ("localhost", *hosts))
                    argv = _apiserver_command(root, pki, tools, etcd_url, port, hosts_path, node)
                    apiserver = await _start(nursery, root, "kube-apiserver", argv, env)
                    components.append(apiserver)
                    plane = ControlPlane(
                        root, server, pki, tools, components, 0.0, exited, nursery, argv, env
                    )
                    await _apiserver_ready(plane, apiserver)
                    if controllers:
                        await _start_controllers(nursery, plane, node)
                    for component in components:
                        nursery.start_soon(_record_exit, component, exited)
                plane.start_seconds = trio.current_time() - began
                task_status.started(plane)
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    for component in reversed(components):
                        await _stop(component)
                    for component in components:
                        component.output.scope.cancel()


async def _start_controllers(
    nursery: trio.Nursery, plane: ControlPlane, node: str | None = None
) -> None:
    """The scheduler and the controller manager, until the scheduler's
    handlers have synced and the `default` ServiceAccount exists."""
    scheduler_argv, manager_argv = _controller_commands(plane.pki, plane.tools, node)
    root, env = plane.root, plane._env
    scheduler = await _start(nursery, root, "kube-scheduler", scheduler_argv, env)
    plane.components.append(scheduler)
    manager = await _start(nursery, root, "kube-controller-manager", manager_argv, env)
    plane.components.append(manager)
    await scheduler.output.wait_for(lambda line: "Handlers synced" in line)
    async with plane.api() as api:
        accounts = "/api/v1/namespaces/default/serviceaccounts"
        await _until(manager, partial(api.wait_for, accounts, "default"))


@contextlib.asynccontextmanager
async def running(
    root: Path, tools: dict[str, Path], *, hosts: tuple[str, ...] = (), controllers: bool = True
) -> AsyncIterator[ControlPlane]:
    """run() in the current Trio loop while the block lasts: a control plane
    of one's own; on the way out it is stopped, and a process that did not
    stop cleanly is an error."""
    async with trio.open_nursery() as nursery:
        plane = await nursery.start(partial(run, root, tools, hosts=hosts, controllers=controllers))
        try:
            yield plane
        finally:
            nursery.cancel_scope.cancel()
    problems = [p for c in plane.components if (p := c.stop_problem())]
    if problems:
        raise ControlPlaneError("\n".join(problems))


@contextlib.contextmanager
def service_in_thread(service: Callable[..., Awaitable[None]], name: str) -> Iterator[Any]:
    """A Trio service (started with nursery.start(service)) on a loop of its
    own, in a thread named `name`; yields what it reported started, and on
    the way out cancels it, waits for its end and raises what it raised."""
    started = threading.Event()
    box: dict[str, Any] = {}

    async def host() -> None:
        box["token"] = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as scope:
            box["scope"] = scope
            async with trio.open_nursery() as nursery:
                box["value"] = await nursery.start(service)
                started.set()

    def main() -> None:
        try:
            trio.run(host)
        except BaseException as err:  # handed to the caller's thread
            box["error"] = err
        finally:
            started.set()

    thread = threading.Thread(target=main, name=name, daemon=True)
    thread.start()
    started.wait()
    if "error" in box:
        thread.join()
        raise box["error"]
    try:
        yield box["value"]
    finally:
        trio.from_thread.run_sync(box["scope"].cancel, trio_token=box["token"])
        thread.join()
        if "error" in box:
            raise box["error"]


@contextlib.contextmanager
def in_thread(root: Path, tools: dict[str, Path], *, hosts: tuple[str, ...] = ()):
    """run() on a Trio loop of its own, in a thread; yields the ControlPlane,
    and on the way out stops it and raises if a process did not stop cleanly."""
    with service_in_thread(partial(run, root, tools, hosts=hosts), "control-plane") as plane:
        yield plane
    problems = [p for c in plane.components if (p := c.stop_problem())]
    if problems:
        raise ControlPlaneError("\n".join(problems))


async def _main(root: Path) -> None:
    found = kit.find_all((*kit.CONTROL_PLANE, "kubectl"))
    missing = [name for name in (*kit.CONTROL_PLANE, "kubectl") if name not in found]
    if missing:
        sys.exit(kit.missing_message(missing))
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            plane = await nursery.start(partial(run, root, found))
            print(f"control plane up in {plane.start_seconds:.1f} s: {plane.server}")
            print(f"export KUBECONFIG={plane.kubeconfig}")
            print(f"logs: {root / 'logs'}; Ctrl-C stops it")
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(
            "usage: python -m powerdev.devtools.cluster.controlplane DIR  "
            "(an empty or new directory)"
        )
    trio.run(_main, Path(sys.argv[1]).resolve())
