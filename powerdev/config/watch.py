"""Notice, by inotify, when config.json may have changed.

A ConfigMap volume changes by a symlink swap: the kubelet writes a new
timestamped directory, points `..data_tmp` at it and renames that over
`..data`, which config.json links through. Editing the file in place, or
replacing it by rename, also happens. So the watch is on the directory, and
any change there is a reason to read the file again; the caller compares
contents and keeps the last good config when the new one is bad.
"""

from __future__ import annotations

import logging
from pathlib import Path

import trio
from inotify_simple import flags as F

from powerdev.support.inotify import Inotify, Watcher

log = logging.getLogger(__name__)
_MASK = F.CREATE | F.CLOSE_WRITE | F.MOVED_TO | F.MOVED_FROM | F.DELETE | F.ATTRIB


class ConfigWatch:
    """Use as a context manager; wait_for_change() returns after a change."""

    def __init__(self, config_path: Path, inotify: Inotify | None = None) -> None:
        self._watcher = Watcher(inotify)
        self.watching = False
        try:
            self._watcher.add(config_path.parent, _MASK)
            self.watching = True
        except OSError as err:
            log.info("not watching %s for config changes (%s); SIGHUP reloads", config_path, err)

    def __enter__(self) -> ConfigWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self._watcher.__exit__()

    async def wait_for_change(self) -> None:
        if not self.watching:
            await trio.sleep_forever()
        await self._watcher.events()
