"""Notice, by inotify events and never by polling, when the kubelet restarts.

A watch belongs to one registration: it is opened before the plugin binds its
socket, so nothing that happens after that is missed, and events are compared
by name, never by inode (a new file may get the old inode number).
"""

from __future__ import annotations

from pathlib import Path

import trio
from inotify_simple import INotify
from inotify_simple import flags as F

from powerdev.kubelet.paths import KUBELET_SOCKET

_MASK = F.CREATE | F.DELETE | F.MOVED_FROM | F.MOVED_TO | F.DELETE_SELF | F.MOVE_SELF
_GONE = F.DELETE | F.MOVED_FROM
_NEW = F.CREATE | F.MOVED_TO
_DIR_GONE = F.DELETE_SELF | F.MOVE_SELF | F.IGNORED


class PluginDirWatch:
    def __init__(self, plugin_dir: Path, socket_name: str) -> None:
        plugin_dir.mkdir(parents=True, exist_ok=True)
        self.plugin_dir = plugin_dir
        self.socket_name = socket_name
        self._inotify = INotify()
        try:
            self._inotify.add_watch(plugin_dir, _MASK)
        except BaseException:
            self._inotify.close()
            raise

    def __enter__(self) -> PluginDirWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self._inotify.close()

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET

    async def _events(self) -> list:
        await trio.lowlevel.wait_readable(self._inotify.fileno())
        return self._inotify.read(timeout=0)

    def drain(self) -> None:
        """Forget events already queued: they describe the past we have just checked."""
        self._inotify.read(timeout=0)

    async def wait_for_kubelet(self) -> None:
        """Return once kubelet.sock exists (at once if it does)."""
        while not self.kubelet_socket.exists():
            for event in await self._events():
                if event.mask & _DIR_GONE:
                    raise FileNotFoundError(f"{self.plugin_dir} was removed")

    async def wait_for_restart(self) -> str:
        """Return, with the reason, when our socket goes or kubelet.sock is made anew."""
        while True:
            for event in await self._events():
                if event.mask & _DIR_GONE:
                    return f"{self.plugin_dir} was removed"
                if event.name == self.socket_name and event.mask & _GONE:
                    return f"our socket {self.socket_name} was removed"
                if event.name == KUBELET_SOCKET and event.mask & _NEW:
                    return "kubelet.sock was created again: the kubelet restarted"
