"""A compact one-to-many index for the node-wide ledger and the trackers.

Nearly every device has one name and one resource, and nearly every holder
one device, so a key's one value is stored bare and a container is made
only for a second one: at 10,000 devices this keeps the work of a full look
on the Trio thread to dictionary updates, and a holder of one device costs
no container of its own. The container is a dict used as an ordered set (a
set's table is nearly twice a dict's: 512 KiB against under 300 at 10,000).
"""

from __future__ import annotations

from collections.abc import Hashable


class Index:
    def __init__(self) -> None:
        self._map: dict[Hashable, object] = {}

    def add(self, key: Hashable, value: Hashable) -> bool:
        """Add; True if the key had no such value. (Values are never dicts.)"""
        have = self._map.get(key)
        if have is None:
            self._map[key] = value
        elif isinstance(have, dict):
            if value in have:
                return False
            have[value] = None
        elif have == value:
            return False
        else:
            self._map[key] = {have: None, value: None}
        return True

    def discard(self, key: Hashable, value: Hashable) -> bool:
        """Remove; True if the key had that value."""
        have = self._map.get(key)
        if isinstance(have, dict):
            if value not in have:
                return False
            del have[value]
            if len(have) == 1:
                self._map[key] = next(iter(have))
            return True
        if have is not None and have == value:
            del self._map[key]
            return True
        return False

    def get(self, key: Hashable) -> tuple:
        have = self._map.get(key)
        if have is None:
            return ()
        return tuple(have) if isinstance(have, dict) else (have,)

    def forget(self, key: Hashable) -> None:
        self._map.pop(key, None)

    def compact(self) -> None:
        """Made again at the size it needs now (a dict keeps the room it
        grew to however many keys go)."""
        self._map = dict(self._map)

    def several(self, key: Hashable) -> bool:
        """Does the key have more than one value?"""
        return isinstance(self._map.get(key), dict)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._map

    def keys(self) -> list[Hashable]:
        return list(self._map)
