"""Notice, by inotify events and never by polling, when the kubelet restarts.

One watch lasts across registrations, so that no event falls into the gap
between one registration and the next. Events are compared by name, never by
inode (a new file may get the old inode number).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from inotify_simple import flags as F

from powerdev.kubelet.paths import KUBELET_SOCKET
from powerdev.support.inotify import Inotify, Watcher

_MASK = F.CREATE | F.DELETE | F.MOVED_FROM | F.MOVED_TO | F.DELETE_SELF | F.MOVE_SELF
_GONE = F.DELETE | F.MOVED_FROM
_NEW = F.CREATE | F.MOVED_TO
_DIR_GONE = F.DELETE_SELF | F.MOVE_SELF | F.IGNORED


@dataclass(frozen=True)
class Reason:
    """Why a resource serves and registers again: `cause` is the metric's
    label, `said` the words of the log line."""

    cause: str
    said: str

    def __str__(self) -> str:
        return self.said


class DirectoryGone(Exception):
    """The watched directory was removed or moved; the watch is over."""


class PluginDirWatch:
    def __init__(self, plugin_dir: Path, socket_name: str, inotify: Inotify | None = None) -> None:
        # The kubelet makes it when it starts; made here if it is missing, so
        # that it can be watched. `made` says so, for the log.
        self.made = not plugin_dir.is_dir()
        plugin_dir.mkdir(parents=True, exist_ok=True)
        self.plugin_dir = plugin_dir
        self.socket_name = socket_name
        self._watcher = Watcher(inotify)
        try:
            self._watcher.add(plugin_dir, _MASK)
        except BaseException:
            self._watcher.__exit__()
            raise

    def __enter__(self) -> PluginDirWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self._watcher.__exit__()

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET

    def _kubelet_created(self, events: list) -> bool:
        for event in events:
            if event.mask & _DIR_GONE:
                raise DirectoryGone(f"{self.plugin_dir} was removed")
        return any(e.name == KUBELET_SOCKET and e.mask & _NEW for e in events)

    async def wait_for_kubelet(self) -> bool:
        """Return once kubelet.sock exists. True when it was created since the
        watch last looked (a kubelet that started anew); events about our own
        socket up to now are dropped, as they describe a registration that is over."""
        created = False
        while not self.kubelet_socket.exists():
            created |= self._kubelet_created(await self._watcher.events())
        return self._kubelet_created(self._watcher.ready()) or created

    async def wait_for_restart(self) -> Reason:
        """Return, with the reason, when our socket goes or kubelet.sock is made anew."""
        while True:
            for event in await self._watcher.events():
                if event.mask & _DIR_GONE:
                    raise DirectoryGone(f"{self.plugin_dir} was removed")
                if event.name == self.socket_name and event.mask & _GONE:
                    return Reason("socket_removed", f"our socket {self.socket_name} was removed")
                if event.name == KUBELET_SOCKET and event.mask & _NEW:
                    return Reason(
                        "kubelet_restart", "kubelet.sock was created again: the kubelet restarted"
                    )
