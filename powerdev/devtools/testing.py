"""Helpers to exercise powerdev on a real machine: device trees made with
mknod (or links to /dev/null without root), and loop devices made and
removed through /dev/loop-control, which give real kernel uevents; and a
child process stopped as the kubelet's node would stop it. Used by the
tests and by `powerdev bench`."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import signal
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import trio
from inotify_simple import flags as iflags

from powerdev.support.inotify import Watcher

LOOP_SET_FD = 0x4C00
LOOP_CLR_FD = 0x4C01
LOOP_CTL_ADD = 0x4C80
LOOP_CTL_REMOVE = 0x4C81
FIRST_LOOP = 300  # indexes 300-399, matched by /dev/loop3[0-9][0-9], far from losetup's
LOOP_PATTERN = "/dev/loop3[0-9][0-9]"


def run_command(plugin_dir: Path, config: Path, dev_root: Path, *options: str) -> list[str]:
    """The command line of `powerdev run` on a temp plugin dir, for a child process."""
    return [
        sys.executable,
        "-m",
        "powerdev",
        "run",
        "--plugin-dir",
        str(plugin_dir),
        "--config",
        str(config),
        "--dev-root",
        str(dev_root),
        *options,
    ]


def dra_options(
    root: Path, node: str, kubeconfig: Path, driver: str | None = None
) -> tuple[str, ...]:
    """`powerdev run`'s options for a DRA node: its name, the API server's
    kubeconfig, the driver unless it is the default, and the driver's CDI
    specs and sockets under root, laid out as a kubelet's are: cdi/,
    plugins/ and plugins_registry/."""
    return (
        "--node-name", node,
        *(("--dra-driver", driver) if driver else ()),
        "--kubeconfig", str(kubeconfig),
        "--cdi-spec-dir", str(root / "cdi"),
        "--dra-plugins-dir", str(root / "plugins"),
        "--dra-registry-dir", str(root / "plugins_registry"),
    )  # fmt: skip


def rss_kib(pid: int) -> int | None:
    """A process's resident memory in KiB (VmRSS), or None if it reports none."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return None


def is_root() -> bool:
    return os.geteuid() == 0


# Character major 120 is reserved for local use: no driver takes it.
NODE_MAJOR = 120
_minors = itertools.count()


def make_nodes(root: Path, names: list[str]) -> str:
    """One character device node per name under root. As root, distinct
    devices made with mknod (120:N, N never reused in this process), which
    no driver answers; without root, links to /dev/null, which are all one
    device. Returns which it used."""
    root.mkdir(parents=True, exist_ok=True)
    real = is_root()
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if real:
            minor = next(_minors) % (1 << 20)
            os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(NODE_MAJOR, minor))
        else:
            path.symlink_to("/dev/null")
    return "mknod (distinct devices)" if real else "links to /dev/null (one device)"


MEDIUM_BYTES = 1 << 20  # the sparse file a loop device made with a medium is bound to


class LoopControl:
    """Loop devices made and removed through /dev/loop-control. A new loop
    device has no medium (sysfs `size` 0), and powerdev does not offer it;
    add(index, medium=True) binds it at once to a sparse file of its own
    (kept in `backing_dir`), as a loop device a host offers is."""

    def __init__(self, fd: int, backing_dir: Path | None = None) -> None:
        self.fd = fd
        self.made: set[int] = set()
        self.backing_dir = backing_dir
        self._bound: set[int] = set()

    def add(self, index: int, *, medium: bool = False) -> str:
        fcntl.ioctl(self.fd, LOOP_CTL_ADD, index)
        self.made.add(index)
        if medium:
            self.attach(index)
        return f"loop{index}"

    def attach(self, index: int) -> None:
        """Bind the loop device to its sparse file (LOOP_SET_FD)."""
        if self.backing_dir is None:
            raise RuntimeError("LoopControl: no backing_dir for a medium")
        backing = self.backing_dir / f"loop{index}.img"
        with backing.open("wb") as f:
            f.truncate(MEDIUM_BYTES)
        fd = os.open(f"/dev/loop{index}", os.O_RDWR | os.O_CLOEXEC)
        try:
            _set_fd(fd, backing)
        finally:
            os.close(fd)
        self._bound.add(index)

    def detach(self, index: int) -> None:
        """Unbind it (LOOP_CLR_FD), as `losetup -d` does."""
        fd = os.open(f"/dev/loop{index}", os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.ioctl(fd, LOOP_CLR_FD, 0)
        finally:
            os.close(fd)
        self._bound.discard(index)

    def remove(self, index: int) -> None:
        if index in self._bound:
            with contextlib.suppress(OSError):  # detached already (`losetup -d`)
                self.detach(index)
        fcntl.ioctl(self.fd, LOOP_CTL_REMOVE, index)
        self.made.discard(index)


@contextlib.contextmanager
def loop_control() -> Iterator[LoopControl]:
    """Loop devices made here are removed on the way out, whatever happened."""
    fd = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    backing = tempfile.TemporaryDirectory(prefix="powerdev-loops-")
    control = LoopControl(fd, Path(backing.name))
    try:
        for index in range(FIRST_LOOP, FIRST_LOOP + 100):  # leftovers of an interrupted run
            with contextlib.suppress(OSError):
                control.remove(index)
        yield control
    finally:
        for index in sorted(control.made):
            with contextlib.suppress(OSError):
                control.remove(index)
        os.close(fd)
        backing.cleanup()


def _set_fd(loop_fd: int, backing: Path) -> None:
    """Bind an open loop device to a file (LOOP_SET_FD)."""
    file_fd = os.open(backing, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.ioctl(loop_fd, LOOP_SET_FD, file_fd)
    finally:
        os.close(file_fd)


@contextlib.contextmanager
def bound(node: str | Path, backing: Path) -> Iterator[None]:
    """A loop device node bound to a file (LOOP_SET_FD) while inside, and
    unbound (LOOP_CLR_FD) and closed on the way out."""
    fd = os.open(node, os.O_RDWR | os.O_CLOEXEC)
    try:
        _set_fd(fd, backing)
        try:
            yield
        finally:
            fcntl.ioctl(fd, LOOP_CLR_FD, 0)
    finally:
        os.close(fd)


async def stop(proc: trio.Process, limit: float = 10.0) -> bool:
    """SIGTERM, and wait at most `limit` seconds (even when the caller is
    being cancelled); killed if it is still there then, and reaped. True
    if it had to be killed."""
    with trio.CancelScope(shield=True):
        with trio.move_on_after(limit):
            proc.send_signal(signal.SIGTERM)
            await proc.wait()
        if proc.returncode is not None:
            return False
        proc.kill()
        await proc.wait()
        return True


async def wait_for_file(path: Path, predicate) -> str:
    """The file's text, once predicate(text) holds; woken by inotify, never by a timer."""
    with Watcher() as watcher:
        watcher.add(
            path.parent, iflags.CREATE | iflags.MOVED_TO | iflags.CLOSE_WRITE | iflags.MODIFY
        )
        while True:
            try:
                text = path.read_text()  # noqa: ASYNC240 (a tiny local file)
            except FileNotFoundError:
                text = None
            if text is not None and predicate(text):
                return text
            await watcher.events()


async def wait_gone(path: Path) -> None:
    """Until path does not exist; woken by inotify, never by a timer."""
    with Watcher() as watcher:
        watcher.add(path.parent, iflags.DELETE | iflags.MOVED_FROM)
        while path.exists():  # noqa: ASYNC240 (one stat)
            await watcher.events()
