"""A real Kubernetes node on this machine, for the tests that run real pods:
the kubelet, containerd and runc from the conformance kit, joined to a
control plane of their own (controlplane.py with `node`), with the busybox
and pause images of images.py imported into containerd.

`run()` is a Trio service: the control plane, then containerd, the images,
the kubelet, until the Node is Ready; then task_status.started(Node).
Cancelled, it stops the kubelet, deletes every container (runc), stops
containerd and its shims, and removes every directory it made, the kubelet's
fixed ones too. Node.reboot() does the same to the node's parts only, wipes
what a reboot wipes (/run, the CDI specs) and starts them again.

What this machine kind needs, found by trying (each is set below):
- cgroup v1 only: the kubelet refuses it unless failCgroupV1 is false, and
  runs with the cgroupfs driver;
- no CAP_SYS_RESOURCE: runc cannot lower oom_score_adj, so containerd's
  restrict_oom_score_adj;
- the kubelet's device-plugins directory is /var/lib/kubelet/device-plugins
  whatever --root-dir says, so its root is /var/lib/kubelet (as a
  DaemonSet's hostPath mounts expect), and containerd's shims keep their
  sockets under /run/containerd: one node per machine at a time (LOCK), on
  a machine that is no Kubernetes node (a /var/lib/kubelet of its own);
- the CNI plugins bridge and host-local: the runtime's network is ready,
  and a pod off the host's network (the DaemonSet's) gets an address the
  kubelet's probes reach; the tests' pods use hostNetwork;
- no udev: /dev/loopN is root's, mode 0600, so a non-root pod opens a
  device only through the runtime's ownership options (OWNERSHIP) or CDI.

containerd and the kubelet share one mount namespace of their own: every
mount they make (images, volumes, sandboxes) goes when their last process
does, and the host's mounts are left as they are.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import trio

from powerdev.devtools import kit
from powerdev.devtools.cluster import controlplane, images
from powerdev.devtools.cluster.client import NOT_READY_TAINT
from powerdev.devtools.cluster.controlplane import Component, ControlPlane
from powerdev.devtools.testing import stop

NAME = "powerdev-node"  # resolves to 127.0.0.1 for the API server (controlplane.py)
LOCK = Path("/run/powerdev-kit-node.lock")
# The kubelet's root is the usual one: its device-plugins directory is
# there whatever --root-dir says, and a DaemonSet's hostPath mounts name it.
KUBELET_ROOT = Path("/var/lib/kubelet")
DEVICE_PLUGINS = KUBELET_ROOT / "device-plugins"
OURS = KUBELET_ROOT / ".powerdev-kit-node"  # marks a KUBELET_ROOT this module made
CONTAINERD_RUN = Path("/run/containerd")  # the shims', fixed
RUN_OURS = CONTAINERD_RUN / ".powerdev-kit-node"  # likewise for CONTAINERD_RUN
RUNC_ROOT = CONTAINERD_RUN / "runc" / "k8s.io"  # runc's state of the CRI's containers
HOST_CDI = Path("/var/run/cdi")  # where a DaemonSet's powerdev writes its specs
CNI_PLUGINS = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
CNI_NEEDED = ("bridge", "host-local", "loopback")  # the pods' network; the runtime's loopback
BRIDGE = "powerdev-kit0"  # the pods' network's bridge on the host
POD_SUBNET = "10.244.0.0/24"
KUBELET_PORT = 10250
START_LIMIT = 120.0  # seconds for the node's parts, after the control plane
STOP_LIMIT = 20.0  # seconds each process has after SIGTERM
# The runtime sets each DeviceSpec's owner to the container's runAsUser and
# runAsGroup: what an admin sets on a node whose devices are root's.
OWNERSHIP = True


class NodeError(Exception):
    """The node failed to start; str() says which part and where its log is."""


@dataclass
class Node:
    """What tests need of a running node."""

    name: str
    root: Path
    plane: ControlPlane
    tools: dict[str, Path]
    start_seconds: float  # from nothing to the Node Ready, the control plane included
    node_seconds: float  # from containerd's start to the Node Ready
    parts: dict[str, Component] = field(default_factory=dict)
    ownership: bool = OWNERSHIP  # containerd's device_ownership_from_security_context
    kubelet_started: float = 0.0  # time.time() as the running kubelet was started
    # The Ready heartbeat its start waited for (its own first Ready report).
    ready_heartbeat: datetime | None = None
    _nursery: trio.Nursery | None = field(default=None, repr=False)
    _token: trio.lowlevel.TrioToken | None = field(default=None, repr=False)

    @property
    def kubelet_root(self) -> Path:
        return KUBELET_ROOT

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet_root / "pod-resources" / "kubelet.sock"

    @property
    def plugins_registry(self) -> Path:
        return self.kubelet_root / "plugins_registry"

    @property
    def plugins(self) -> Path:
        return self.kubelet_root / "plugins"

    @property
    def cdi_dir(self) -> Path:
        """A CDI spec directory of this node's runtime, for a powerdev the
        test runs (a DaemonSet's writes HOST_CDI, the runtime's other one)."""
        return self.root / "cdi"

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    def log(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    def ctr(self, *args: str) -> list[str]:
        """The command line of the kit's ctr on this node's containerd, in
        the CRI's namespace."""
        address = str(self.containerd_socket)
        return [str(self.tools["ctr"]), "--address", address, "-n", "k8s.io", *args]

    # Each of these runs on the node's Trio loop; call() runs one from
    # another loop (a test's).

    async def restart_kubelet(self) -> None:
        """The kubelet stopped (SIGTERM) and started again under the
        running pods, until the Node is Ready again by its report."""
        await self.stop_kubelet()
        await self.start_kubelet()

    async def stop_kubelet(self) -> None:
        """The kubelet stopped (SIGTERM), the pods left running."""
        await _stop_part(self.parts.pop("kubelet"))

    async def restart_runtime(self, *, ownership: bool) -> None:
        """containerd stopped and started again with
        device_ownership_from_security_context set to `ownership`, under the
        running kubelet and pods (in the kubelet's mount namespace)."""
        self.ownership = ownership
        await _stop_part(self.parts.pop("containerd"))
        await self._start_containerd(join=self.parts["kubelet"].proc.pid)

    async def shut_down(self) -> None:
        """The first half of a reboot: every container and process of the
        node gone, and /run wiped (containerd's state and shim sockets, the
        CDI specs the tests' powerdev wrote, in cdi_dir); the disks kept
        (containerd's images, the kubelet's root with its checkpoints).
        HOST_CDI is left as it is: other programs of this machine may write
        there. boot() is the second half."""
        await self._stop_parts()
        for path in (self.root / "containerd" / "state", CONTAINERD_RUN, self.cdi_dir):
            _remove(path)
        self.cdi_dir.mkdir()

    async def boot(self) -> None:
        """containerd and the kubelet started again, until the Node is Ready."""
        await self._start_parts()

    async def call(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        """fn() on the node's loop, awaited from the caller's loop."""
        return await trio.to_thread.run_sync(
            partial(trio.from_thread.run, fn, trio_token=self._token)
        )

    # What run() and reboot() share.

    async def _start_parts(self) -> None:
        assert self._nursery is not None
        with trio.fail_after(START_LIMIT):
            _claim(CONTAINERD_RUN, RUN_OURS)
            await self._start_containerd()
            await _import_images(self)
            await self.start_kubelet()

    async def _start_containerd(self, join: int | None = None) -> None:
        """containerd, in a mount namespace of its own, or in the one of the
        process `join` (the running kubelet), until it has booted."""
        assert self._nursery is not None
        with trio.fail_after(START_LIMIT):
            argv, env = _containerd_command(self, join), _environment(self)
            self.parts["containerd"] = part = await controlplane._start(
                self._nursery, self.root, "containerd", argv, env
            )
            await part.output.wait_for(lambda line: "containerd successfully booted" in line)

    async def start_kubelet(self) -> None:
        """The kubelet, until its port takes connections and the Node is
        Ready by its own report: a Ready condition with a heartbeat after
        the last one the Node had when it started (that one, if any, was an
        earlier kubelet's, which has exited)."""
        assert self._nursery is not None
        with trio.fail_after(START_LIMIT):
            async with self.plane.api() as api:
                nodes = await api.get("/api/v1/nodes", fieldSelector=f"metadata.name={self.name}")
                before = max((ready_heartbeat(n) for n in nodes["items"]), default=None)
                self.kubelet_started = time.time()
                self.parts["kubelet"] = kubelet = await controlplane._start(
                    self._nursery, self.root, "kubelet", _kubelet_command(self), _environment(self)
                )
                await controlplane._until(kubelet, partial(_serving, kubelet))
                ready = await controlplane._until(
                    kubelet,
                    partial(api.wait_for, "/api/v1/nodes", self.name, partial(_ready, before)),
                )
            self.ready_heartbeat = ready_heartbeat(ready)

    async def _stop_parts(self) -> None:
        with trio.CancelScope(shield=True):
            if "kubelet" in self.parts:
                await _stop_part(self.parts.pop("kubelet"))
            await _delete_containers(self.tools["runc"])
            if "containerd" in self.parts:
                await _stop_part(self.parts.pop("containerd"))
            _kill_shims(self.tools["containerd-shim-runc-v2"])
            _remove_pod_cgroups()
            await trio.run_process(
                ["ip", "link", "delete", BRIDGE], capture_stderr=True, check=False
            )  # made again by the first pod after a boot


async def _serving(kubelet: Component) -> None:
    """Until the kubelet's API port takes connections (the API server's way
    to the pods' logs): it logs that it starts to listen, then listens. A
    refused try waits for its next log line, never for a timer."""
    await kubelet.output.wait_for(lambda line: "Starting to listen" in line)
    while True:
        seen = len(kubelet.output.lines)
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", KUBELET_PORT)
        except OSError:
            await kubelet.output.wait_for_line_after(seen)
            continue
        await stream.aclose()
        return


def ready_heartbeat(node: dict) -> datetime | None:
    """When the kubelet last reported the Node's Ready condition (to the
    second, as the API keeps it), or None without one."""
    for c in node.get("status", {}).get("conditions", []):
        if c["type"] == "Ready" and c.get("lastHeartbeatTime"):
            return datetime.fromisoformat(c["lastHeartbeatTime"])
    return None


def _ready(before: datetime | None, node: dict) -> bool:
    """Ready, without the not-ready taint, by a report after `before`:
    only a kubelet writes the condition's heartbeat, and every report
    writes it."""
    conditions = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
    taints = [t["key"] for t in node.get("spec", {}).get("taints", [])]
    heartbeat = ready_heartbeat(node)
    fresh = before is None or (heartbeat is not None and heartbeat > before)
    return conditions.get("Ready") == "True" and NOT_READY_TAINT not in taints and fresh


async def _stop_part(part: Component) -> None:
    part.stopping = True
    if part.proc.returncode is None:
        part.killed = await stop(part.proc, STOP_LIMIT)
    with trio.move_on_after(STOP_LIMIT):  # a child that kept its output open
        await part.output.wait_ended()


def _environment(node: Node) -> dict[str, str]:
    """Ours without proxies, with the kit's directory first on PATH: where
    containerd finds its shim."""
    env = controlplane._environment()
    shims = node.tools["containerd-shim-runc-v2"].parent
    env["PATH"] = f"{shims}:{env.get('PATH', '/usr/bin:/bin')}"
    return env


def _containerd_config(node: Node) -> str:
    """containerd's config (version 3, containerd 2.x): its own root, state
    and socket under the node's root; the CRI's runtime is the kit's runc."""
    base = node.root / "containerd"
    runtime = "plugins.'io.containerd.cri.v1.runtime'"
    lines = [
        "version = 3",
        f"root = {json.dumps(str(base / 'root'))}",
        f"state = {json.dumps(str(base / 'state'))}",
        "[grpc]",
        f"address = {json.dumps(str(node.containerd_socket))}",
        "[ttrpc]",
        f"address = {json.dumps(str(node.containerd_socket) + '.ttrpc')}",
        f"[{runtime}]",
        "restrict_oom_score_adj = true",
        f"device_ownership_from_security_context = {json.dumps(node.ownership)}",
        f"cdi_spec_dirs = {json.dumps([str(HOST_CDI), str(node.cdi_dir)])}",
        f"[{runtime}.containerd]",
        "default_runtime_name = 'runc'",
        f"[{runtime}.containerd.runtimes.runc]",
        "runtime_type = 'io.containerd.runc.v2'",
        f"[{runtime}.containerd.runtimes.runc.options]",
        f"BinaryName = {json.dumps(str(node.tools['runc']))}",
        f"[{runtime}.cni]",
        f"bin_dirs = {json.dumps([str(CNI_PLUGINS)])}",
        f"conf_dir = {json.dumps(str(node.root / 'cni'))}",
        "[plugins.'io.containerd.cri.v1.images'.pinned_images]",
        f"sandbox = {json.dumps(images.PAUSE)}",
    ]
    return "\n".join(lines) + "\n"


def _containerd_command(node: Node, join: int | None = None) -> list[str]:
    config = node.root / "containerd.toml"
    config.write_text(_containerd_config(node))
    containerd = [str(node.tools["containerd"]), "--config", str(config)]
    if join is not None:
        return ["nsenter", f"--mount=/proc/{join}/ns/mnt", "--", *containerd]
    # A mount namespace of its own, which the kubelet joins (nsenter).
    return ["unshare", "--mount", "--propagation", "slave", "--", *containerd]


def _kubelet_config(node: Node) -> dict[str, object]:
    pki = node.plane.pki
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": f"unix://{node.containerd_socket}",
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzPort": 0,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(pki.ca)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "podLogsDir": str(node.root / "pod-logs"),
        "failSwapOn": False,
        "resolvConf": "/etc/resolv.conf",
        "volumePluginDir": str(node.root / "volume-plugins"),
        # This machine's disk may be fuller than a node's would be.
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        # A pod whose DRA driver the kubelet does not know yet (a node that
        # boots) is tried again only at the next resync, 1 min by default.
        "syncFrequency": "10s",
        # A status that has not changed is reported again after this (5 min
        # by default): the bound of a start's wait for the kubelet's own Ready
        # report when its first one fell in the second of the last kubelet's.
        "nodeStatusReportFrequency": "10s",
    }


def _kubelet_command(node: Node) -> list[str]:
    config = node.root / "kubelet.json"
    config.write_text(json.dumps(_kubelet_config(node), indent=2) + "\n")
    containerd = node.parts["containerd"].proc.pid
    return [
        "nsenter", f"--mount=/proc/{containerd}/ns/mnt", "--",
        str(node.tools["kubelet"]),
        f"--config={config}",
        f"--kubeconfig={node.plane.pki.kubeconfig('kubelet')}",
        f"--root-dir={node.kubelet_root}",
        f"--cert-dir={node.kubelet_root / 'pki'}",  # else /var/lib/kubelet/pki, whatever the root
        f"--hostname-override={node.name}",
        "--v=2",
    ]  # fmt: skip


async def _import_images(node: Node) -> None:
    archive = images.write_archive(node.root / "images.tar")
    done = await trio.run_process(
        node.ctr("images", "import", str(archive)),
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    if done.returncode != 0:
        raise NodeError(f"ctr images import failed: {done.stderr.decode().strip()}")


async def _delete_containers(runc: Path) -> None:
    """Every container of the CRI's, killed and deleted by runc (their
    processes and cgroups), as a reboot would end them."""
    if not RUNC_ROOT.is_dir():
        return
    listing = await trio.run_process(
        [str(runc), "--root", str(RUNC_ROOT), "list", "-q"], capture_stdout=True, check=False
    )
    for container in listing.stdout.decode().split():
        await trio.run_process(
            [str(runc), "--root", str(RUNC_ROOT), "delete", "--force", container],
            capture_stderr=True,
            check=False,
        )


def _kill_shims(shim: Path) -> None:
    """The shims containerd started: each is a session of its own, and
    outlives containerd. Found by their executable."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.readlink(entry / "exe") == str(shim.resolve()):
                os.kill(int(entry.name), signal.SIGKILL)


def _remove_pod_cgroups() -> None:
    """The kubelet's QoS cgroups (cgroupfs driver), deepest first."""
    for top in _pod_cgroups():
        for path in sorted(top.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if path.is_dir():
                with contextlib.suppress(OSError):
                    path.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def leftovers(root: Path, tools: dict[str, Path]) -> list[str]:
    """What a stopped node left behind: a process of the kit's node parts
    still running, a directory it made, a cgroup of its pods. Empty after a
    clean stop."""
    left = []
    parts = {str(tools[name].resolve()) for name in kit.NODE if name in tools}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (exe := os.readlink(entry / "exe")) in parts:
                    left.append(f"process {entry.name} ({exe})")
    for path in (KUBELET_ROOT, CONTAINERD_RUN, root / "containerd"):
        if path.exists():
            left.append(f"directory {path}")
    left += [f"cgroup {top}" for top in _pod_cgroups()]
    if (Path("/sys/class/net") / BRIDGE).exists():
        left.append(f"network link {BRIDGE}")
    return left


def _cni_config(root: Path) -> dict[str, object]:
    """The pods' network: a bridge on the host (BRIDGE, the gateway) with
    addresses from POD_SUBNET, so that the kubelet's probes reach a pod
    that is not on the host's network (the DaemonSet's); the runtime adds
    the loopback itself. Nothing is routed or masqueraded beyond the node."""
    return {
        "cniVersion": "1.0.0",
        "name": "kit",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    "dataDir": str(root / "cni-addresses"),
                },
            }
        ],
    }


def _pod_cgroups() -> list[Path]:
    """The kubelet's top pod cgroup in each cgroup v1 hierarchy, or v2's."""
    base = Path("/sys/fs/cgroup")
    return [top for top in (base / "kubepods", *base.glob("*/kubepods")) if top.is_dir()]


def _claim(path: Path, marker: Path) -> None:
    """path for this node, made anew with marker in it: one left over by a
    run of ours that crashed is removed; one that is not ours (a real
    node's kubelet root, another containerd's /run/containerd) is never
    touched."""
    if path.exists() and not marker.exists():
        raise NodeError(
            f"{path} exists and was not made by the kit's node: this machine runs (or ran) "
            "a kubelet or containerd of its own; run the real node's tests on a machine "
            "without them"
        )
    _remove(path)
    path.mkdir(parents=True)
    marker.touch()


@contextlib.contextmanager
def machine_lock() -> Iterator[None]:
    """One real node per machine: its fixed directories are the machine's."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with LOCK.open("w") as holder:
        try:
            fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise NodeError(
                f"another real node runs on this machine (it holds {LOCK}); "
                "stop it first: its kubelet and containerd use /var/lib/kubelet "
                "and /run/containerd"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(holder, fcntl.LOCK_UN)


def missing_parts() -> str | None:
    """Why a node cannot start here, or None."""
    if os.geteuid() != 0:
        return "a real node needs root (containerd, runc and the kubelet run as root)"
    if sys.platform != "linux":
        return "a real node needs Linux"
    plugins = [(CNI_PLUGINS / name, "containernetworking-plugins") for name in CNI_NEEDED]
    for needed, package in ((images.BUSYBOX_BINARY, "busybox-static"), *plugins):
        if not needed.exists():
            return f"{needed} is missing: install Debian's {package} (bash conformance/host-tools)"
    return None


async def run(
    root: Path,
    tools: dict[str, Path],
    *,
    hosts: tuple[str, ...] = (),
    task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Start a control plane and a node named NAME in `root`, report the
    Node, and run them until cancelled; then stop everything and clean up."""
    began = trio.current_time()
    with machine_lock():
        _claim(KUBELET_ROOT, OURS)
        for sub in ("logs", "cni", "cdi"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        (root / "cni" / "10-kit.conflist").write_text(json.dumps(_cni_config(root)))
        try:
            await _run_node(root, tools, hosts, began, task_status)
        finally:
            for path in (KUBELET_ROOT, CONTAINERD_RUN, root / "containerd"):
                if path != CONTAINERD_RUN or RUN_OURS.exists():
                    _remove(path)


async def _run_node(
    root: Path,
    tools: dict[str, Path],
    hosts: tuple[str, ...],
    began: float,
    task_status: trio.TaskStatus[Node],
) -> None:
    async with trio.open_nursery() as nursery:
        plane = await nursery.start(
            partial(controlplane.run, root / "cp", tools, hosts=hosts, node=NAME)
        )
        node = Node(NAME, root, plane, tools, 0.0, 0.0)
        node._nursery = nursery
        node._token = trio.lowlevel.current_trio_token()
        try:
            parts_began = trio.current_time()
            await node._start_parts()
            now = trio.current_time()
            node.start_seconds, node.node_seconds = now - began, now - parts_began
            task_status.started(node)
            await trio.sleep_forever()
        finally:
            await node._stop_parts()
            nursery.cancel_scope.cancel()


@contextlib.contextmanager
def in_thread(root: Path, tools: dict[str, Path], *, hosts: tuple[str, ...] = ()) -> Iterator[Node]:
    """run() on a Trio loop of its own, in a thread (a session's fixture);
    yields the Node, and stops everything on the way out."""
    with controlplane.service_in_thread(
        partial(run, root, tools, hosts=hosts), "real-node"
    ) as node:
        yield node


async def _main(root: Path) -> None:
    needed = (*kit.CONTROL_PLANE, "kubectl", *kit.NODE)
    found = kit.find_all(needed)
    missing = [name for name in needed if name not in found]
    if missing:
        sys.exit(kit.missing_message(missing))
    if why := missing_parts():
        sys.exit(why)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            node = await nursery.start(partial(run, root, found))
            print(
                f"node {node.name} Ready in {node.start_seconds:.1f} s "
                f"({node.node_seconds:.1f} s after the control plane)"
            )
            print(f"export KUBECONFIG={node.plane.kubeconfig}")
            print(f"logs: {root / 'logs'} and {root / 'cp' / 'logs'}; Ctrl-C stops it")
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m powerdev.devtools.cluster.node DIR  (an empty or new directory)")
    trio.run(_main, Path(sys.argv[1]).resolve())
