"""inotify for Trio: one instance for the whole daemon, shared by every
watch in powerdev (the plugin directory of each resource, the device
directories, the config directory).

The kernel gives root 128 inotify instances for the whole host, shared with
systemd and the kubelet, so the daemon opens one (`Inotify`) and hands out
views of it (`Watcher`), each with its own watches and its own queue of
events. Two views may watch one directory: the kernel then has one watch
whose mask is the union, and each view gets only the events it asked for.
Nobody polls: one task at a time waits for the descriptor to be readable,
and whoever reads it hands every event to its views and wakes only the
views that got some (the kubelet writes its checkpoint beside our socket at
every admission: that wakes the watch of the plugin directory, not every
other watch of the daemon). When the task that waits on the descriptor
leaves, one of the others takes over.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

import trio
from inotify_simple import Event, INotify
from inotify_simple import flags as F

_ALWAYS = F.IGNORED | F.Q_OVERFLOW  # delivered whatever the mask


class Inotify:
    """One inotify descriptor and the views that share it. Use as a context
    manager; closing tells Trio first, so no task is left waiting on it."""

    def __init__(self) -> None:
        self._inotify = INotify()
        self._masks: dict[int, dict[Watcher, int]] = {}  # wd -> view -> its mask
        self._reader: trio.CancelScope | None = None  # the task waiting for the descriptor
        self._reader_view: Watcher | None = None  # the view it waits for
        self._sleeping: dict[Watcher, trio.Event] = {}  # views waiting, each woken alone

    def add(self, view: Watcher, path: Path, mask: int) -> int:
        wd = self._inotify.add_watch(path, mask | F.MASK_ADD)
        self._masks.setdefault(wd, {})[view] = mask
        return wd

    def remove(self, view: Watcher, wd: int) -> None:
        views = self._masks.get(wd, {})
        views.pop(view, None)
        if not views:
            self._masks.pop(wd, None)
            try:
                self._inotify.rm_watch(wd)
            except OSError:
                pass  # already gone with its directory

    def read_now(self) -> None:
        """Hand every event queued now to the views that asked for it, and
        wake those views; when there were none, nothing changed for anyone,
        and nobody is woken (an Allocate asks at every call)."""
        events = self._inotify.read(timeout=0)
        if not events:
            return
        got: set[Watcher] = set()
        for event in events:
            if event.mask & F.Q_OVERFLOW:  # not about one watch: everyone lost events
                for views in self._masks.values():
                    for view in views:
                        view.queue.append(event)
                        got.add(view)
                continue
            for view, mask in list(self._masks.get(event.wd, {}).items()):
                if event.mask & (mask | _ALWAYS):
                    view.queue.append(event)
                    got.add(view)
            if event.mask & F.IGNORED:  # the kernel dropped the watch
                self._masks.pop(event.wd, None)
        for view in got:
            woken = self._sleeping.pop(view, None)
            if woken is not None:
                woken.set()
        # The view waiting on the descriptor too: its events may have been
        # read by a view's ready() in another task, and then it stays quiet.
        if self._reader is not None and self._reader_view in got:
            self._reader.cancel()

    async def wait_for(self, view: Watcher) -> None:
        """Return once `view` has events; one task waits on the descriptor
        for everyone, and another takes over when it leaves, for whatever
        reason (its events came, or it was cancelled)."""
        try:
            while not view.queue:
                if self._reader is None:
                    await self._read_for(view)
                    continue
                woken = self._sleeping[view] = trio.Event()
                try:
                    await woken.wait()
                finally:
                    if self._sleeping.get(view) is woken:
                        del self._sleeping[view]
        finally:
            if self._reader is None:
                self._hand_over()

    async def _read_for(self, view: Watcher) -> None:
        """Wait on the descriptor for every view, then read it."""
        readable = False
        try:
            with trio.CancelScope() as self._reader:
                self._reader_view = view
                await trio.lowlevel.wait_readable(self._inotify.fileno())
                readable = True
        finally:
            self._reader = self._reader_view = None
        if readable:
            self.read_now()

    def _hand_over(self) -> None:
        """Nobody waits on the descriptor: one waiting view's task does next."""
        for view, woken in self._sleeping.items():
            del self._sleeping[view]
            woken.set()
            return

    def __enter__(self) -> Inotify:
        return self

    def __exit__(self, *exc: object) -> None:
        trio.lowlevel.notify_closing(self._inotify.fileno())
        self._inotify.close()


class Watcher:
    """One view of an Inotify: its watches and the events on them. Use as a
    context manager; leaving removes its watches (those nobody else shares).
    Made without an Inotify, it opens its own (for tools and tests)."""

    def __init__(self, inotify: Inotify | None = None) -> None:
        self._own = inotify is None
        self._inotify = inotify if inotify is not None else Inotify()
        self.queue: deque[Event] = deque()
        self._wds: set[int] = set()

    def add(self, path: Path, mask: int) -> int:
        wd = self._inotify.add(self, path, mask)
        self._wds.add(wd)
        return wd

    def remove(self, wd: int) -> None:
        self._wds.discard(wd)
        self._inotify.remove(self, wd)

    def ready(self) -> list[Event]:
        """The events queued now, without waiting (maybe none)."""
        self._inotify.read_now()
        events = list(self.queue)
        self.queue.clear()
        return events

    async def wait(self) -> None:
        """Return once events are queued."""
        await self._inotify.wait_for(self)

    async def events(self) -> list[Event]:
        """Wait until events are queued, then take them all."""
        await self.wait()
        return self.ready()

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc: object) -> None:
        for wd in list(self._wds):
            self.remove(wd)
        if self._own:
            self._inotify.__exit__()
