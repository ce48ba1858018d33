"""Shared helpers: temp device trees and a daemon-plus-fake-kubelet harness."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import trio

from powerdev.config import Config, ResourceConfig, parse_config
from powerdev.daemon import supervisor
from powerdev.daemon.settings import Settings
from powerdev.devtools.fake_kubelet import FakeKubelet
from powerdev.devtools.kit import KitBinary
from powerdev.devtools.testing import make_nodes, wait_for_file, wait_gone
from powerdev.resources.plugin import Plugin
from powerdev.rpc import asyncio_door

IS_ROOT = os.geteuid() == 0


@pytest.fixture
def tmp_path():
    """A short temp dir. Unix socket paths may have 107 bytes at most, and
    pytest's own tmp_path grows with the user name, $TMPDIR and the test's
    name; under it, a plugin dir's sockets may not fit."""
    base = "/tmp" if os.access("/tmp", os.W_OK) else None
    path = Path(tempfile.mkdtemp(prefix="pd-", dir=base))
    yield path
    shutil.rmtree(path, ignore_errors=True)


needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root: mknod and real kernel devices")


def require(found: Path | None, missing: str, env: Mapping[str, str] | None = None) -> Path:
    """`found`; if None, the test skips with `missing` (one line that names
    the command that builds the kit), or fails when $CI is "true": CI builds
    the kit first and must never skip a check against the real thing."""
    if found is None:
        if (os.environ if env is None else env).get("CI") == "true":
            pytest.fail(f"CI=true: {missing}", pytrace=False)
        pytest.skip(missing)
    return found


def require_tool(tool: KitBinary) -> Path:
    """A conformance kit binary's path, or the skip (the failure in CI) above."""
    return require(tool.find(), tool.missing)


def require_command(command: str, package: str) -> Path:
    """A host command's path, or the skip (the failure in CI) above, naming
    the Debian package that has it; `bash conformance/host-tools` installs
    every package the kernel tests use."""
    found = shutil.which(command, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    return require(
        Path(found) if found else None,
        f"{command} is missing: apt-get install {package} (or run bash conformance/host-tools)",
    )


def host_safe(tmp_path: Path) -> dict[str, object]:
    """Settings a test's daemon needs so that it never touches the host's CDI
    specs (/var/run/cdi) or asks a real kubelet's PodResources API."""
    return {"cdi_spec_dir": tmp_path / "cdi", "pod_resources_socket": None}


def make_dev_tree(root: Path, names: list[str], target: str | None = None) -> Path:
    """A /dev stand-in with one device node per name: as root, distinct
    character devices made with mknod (testing.make_nodes); without root,
    links to /dev/null, all one device. With `target`, every name is a link
    to that real node."""
    if target is None:
        make_nodes(root, names)
        return root
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
    return root


def config_for(text: str = "{}", **overrides: object) -> Config:
    config = parse_config(text, source="test-config.json")
    if overrides:
        resource = ResourceConfig(**{**config.resources[0].__dict__, **overrides})
        config = Config(config.source, (resource,), config.warnings)
    return config


@dataclass
class Harness:
    kubelet: FakeKubelet
    plugins: list[Plugin]
    settings: Settings
    nursery: trio.Nursery

    @property
    def plugin(self) -> Plugin:
        return self.plugins[0]

    @property
    def name(self) -> str:
        return self.plugin.resource.name

    def state(self):
        return self.kubelet.resources[self.name]

    async def wait_registered(self, count: int = 1) -> None:
        """Until the kubelet has `count` registrations and a first list on the latest."""
        name = self.name
        await self.kubelet.wait_until(
            lambda k: (
                k.registrations >= count
                and name in k.resources
                and k.resources[name].connected
                and k.resources[name].updates > 0
            )
        )


@contextlib.asynccontextmanager
async def daemon_and_kubelet(
    tmp_path: Path,
    config: Config,
    *,
    dev_root: Path,
    sys_root: Path | None = None,
    events: supervisor.EventSource | None = None,
    uevents: str = "off",
    kubelet_pods: dict[str, dict[str, list[str]]] | None = None,
    pod_resources_down: bool = False,
    **settings: object,
) -> AsyncIterator[Harness]:
    """A fake kubelet and the daemon, in-process, over real unix sockets.
    Device events come from `events` (a fake source) or, with uevents="auto"
    or "kernel", from the real netlink monitor; by default there are none."""
    plugin_dir = tmp_path / "device-plugins"
    kubelet = FakeKubelet(plugin_dir)
    kubelet.pods = kubelet_pods or {}  # what its PodResources API lists from the start
    kubelet.pod_resources_down = pod_resources_down  # UNAVAILABLE until a test says otherwise
    settings.setdefault("pod_resources_socket", kubelet.pod_resources_socket)
    settings.setdefault("cdi_spec_dir", tmp_path / "cdi")
    settings = Settings(
        plugin_dir=plugin_dir,
        dev_root=dev_root,
        sys_root=sys_root or tmp_path / "sys",
        uevents=uevents,
        **settings,  # type: ignore[arg-type]
    )
    async with asyncio_door(), trio.open_nursery() as nursery:
        await nursery.start(kubelet.run)
        plugins = await nursery.start(partial(supervisor.run, settings, config, events=events))
        harness = Harness(kubelet, plugins, settings, nursery)
        await harness.wait_registered()
        yield harness
        nursery.cancel_scope.cancel()


class ChannelEvents:
    """A fake device-event source fed by a channel; what is queued is one batch."""

    source = "other"

    def __init__(self) -> None:
        self.send, self._receive = trio.open_memory_channel(float("inf"))

    async def next_batch(self):
        first = await self._receive.receive()
        rest = self.ready_batch()
        return "rescan" if first == "rescan" or rest == "rescan" else [first, *rest]

    def ready_batch(self):
        batch = []
        while True:
            try:
                batch.append(self._receive.receive_nowait())
            except trio.WouldBlock:
                break
        return "rescan" if "rescan" in batch else batch


class StubResources:
    """What a Reloader drives (supervisor.Running), recording what it was asked to do."""

    def __init__(self, plugins):
        self.plugins = list(plugins)
        self.calls: list[tuple[str, object]] = []

    async def rescan(self, plugin):
        self.calls.append(("rescan", plugin))

    async def reconfigure(self, plugin, resource):
        self.calls.append(("reconfigure", plugin))
        plugin._resource = resource

    async def add(self, resource):
        self.calls.append(("add", resource))

    def remove(self, plugin, *, coming_back=False):
        self.calls.append(("remove", plugin))

    def changed(self):
        self.calls.append(("changed", None))


class DirectoryUdev:
    """A stand-in for udev's database (devices/udevdb.py) in tests without
    root: files named like udev's own (b8:0, c1:3) holding E:KEY=VALUE lines,
    read anew at each query as libudev reads its database."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def properties(self, kind: str, number: tuple[int, int]) -> dict[str, str]:
        try:
            text = (self.root / f"{kind}{number[0]}:{number[1]}").read_text()
        except OSError:
            return {}
        found = {}
        for line in text.splitlines():
            key, sep, value = line.removeprefix("E:").partition("=")
            if line.startswith("E:") and sep and key:
                found[key] = value
        return found


def with_udev_database(command: list[str], udev_run: Path) -> list[str]:
    """`command` in a private mount namespace (root) whose /run/udev is
    udev_run (with data/<b|c><major>:<minor> files), as the DaemonSet mounts
    the host's: libudev, through pyudev, reads that database."""
    script = (
        'mount -t tmpfs tmpfs /run && mkdir /run/udev && mount --bind "$0" /run/udev && exec "$@"'
    )
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        str(udev_run),
        *command,
    ]


# The control plane's fixtures and the hook that skips their tests without
# the kit: defined once (tests/e2e and tests/dra share one control plane).
from tests.controlplane_fixtures import (  # noqa: E402
    api,
    control_plane,
    pytest_collection_modifyitems,
)

__all__ = ["api", "control_plane", "pytest_collection_modifyitems", "wait_for_file", "wait_gone"]
