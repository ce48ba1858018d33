"""An inotify descriptor that Trio waits on: the one piece under every watch
in powerdev (the plugin directory, device directories, the config directory)."""

from __future__ import annotations

from pathlib import Path

import trio
from inotify_simple import Event, INotify


class Watcher:
    """Use as a context manager; closing tells Trio first, so no task is left
    waiting on a closed descriptor."""

    def __init__(self) -> None:
        self._inotify = INotify()

    def add(self, path: Path, mask: int) -> int:
        return self._inotify.add_watch(path, mask)

    def remove(self, wd: int) -> None:
        try:
            self._inotify.rm_watch(wd)
        except OSError:
            pass  # already gone with its directory

    def ready(self) -> list[Event]:
        """The events queued now, without waiting (maybe none)."""
        return self._inotify.read(timeout=0)

    async def wait(self) -> None:
        """Return once events are queued."""
        await trio.lowlevel.wait_readable(self._inotify.fileno())

    async def events(self) -> list[Event]:
        """Wait until events are queued, then take them all."""
        await self.wait()
        return self.ready()

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc: object) -> None:
        trio.lowlevel.notify_closing(self._inotify.fileno())
        self._inotify.close()
