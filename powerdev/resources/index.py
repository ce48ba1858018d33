"""A compact one-to-many index for the node-wide ledger and the trackers.

Nearly every device has one name and one resource, so a key's one value is
stored bare and a set is made only for a second one: at 10,000 devices this
keeps the work of a full look on the Trio thread to dictionary updates.
"""

from __future__ import annotations

from collections.abc import Hashable


class Index:
    def __init__(self) -> None:
        self._map: dict[Hashable, object] = {}

    def add(self, key: Hashable, value: Hashable) -> bool:
        """Add; True if the key had no such value."""
        have = self._map.get(key)
        if have is None:
            self._map[key] = value
        elif isinstance(have, set):
            if value in have:
                return False
            have.add(value)
        elif have == value:
            return False
        else:
            self._map[key] = {have, value}
        return True

    def discard(self, key: Hashable, value: Hashable) -> bool:
        """Remove; True if the key had that value."""
        have = self._map.get(key)
        if isinstance(have, set):
            if value not in have:
                return False
            have.discard(value)
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
        return tuple(have) if isinstance(have, set) else (have,)

    def forget(self, key: Hashable) -> None:
        self._map.pop(key, None)

    def several(self, key: Hashable) -> bool:
        """Does the key have more than one value?"""
        return isinstance(self._map.get(key), set)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._map

    def keys(self) -> list[Hashable]:
        return list(self._map)
