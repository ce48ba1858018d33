"""Checks between the resources of one config: two resources may not share
a CDI spec file, and a device may belong to one resource only, so their
patterns may not overlap unless exclude-devices or match-properties keep
them apart.

parse.py calls these once every resource has been read on its own. Imports
schema.py and devices/gomatch.py (whether two Go globs can match one path).
"""

from __future__ import annotations

import posixpath

from powerdev.config.schema import ConfigError, ResourceConfig, cdi_spec_file
from powerdev.devices import gomatch


def check_spec_files(resources: list[ResourceConfig], source: str) -> None:
    """Two resources must not map to one CDI spec file (a-b/c and a/b-c would):
    one with CDI off still keeps and then removes the file it wrote before."""
    seen: dict[str, int] = {}
    for i, resource in enumerate(resources):
        name = cdi_spec_file(resource.name)
        if name in seen:
            other = resources[seen[name]].name
            raise ConfigError(
                source,
                f"resources[{i}].name",
                f"{resource.name!r} and resources[{seen[name]}] ({other!r}) map to one CDI "
                f"spec file, {name}",
                "rename one of them",
            )
        seen[name] = i


def check_overlaps(resources: list[ResourceConfig], source: str) -> None:
    """A device may belong to one resource only: refuse patterns of two
    resources that can match one path, unless exclude patterns or udev
    properties keep them apart."""
    for i, a in enumerate(resources):
        for j in range(i + 1, len(resources)):
            b = resources[j]
            if _properties_disjoint(a, b):
                continue
            clash = _pattern_clash(a, b)
            if clash:
                raise ConfigError(
                    source,
                    f"resources[{j}].include-devices",
                    f"{clash} of {b.name} can match the same device as {a.name}",
                    "a device belongs to one resource only: narrow the patterns, add "
                    "exclude-devices, or tell them apart with match-properties",
                )


def _pattern_clash(a: ResourceConfig, b: ResourceConfig) -> str | None:
    if a.nx_gzip and b.nx_gzip:
        return '"nx-gzip": true'
    if not a.include or not b.include:
        other = b if not a.include else a
        if not a.include and not b.include:
            return "block discovery (no include-devices)"
        for pattern in other.include:
            if posixpath.dirname(pattern) == "/dev":
                return f"pattern {pattern!r} (block discovery lists /dev/* block devices)"
        return None
    for pa in a.include:
        for pb in b.include:
            if _excluded_literal(pb, a) or _excluded_literal(pa, b):
                continue
            if gomatch.overlap(pa, pb):
                return f"pattern {pb!r} (and {pa!r})"
    return None


def _excluded_literal(pattern: str, other: ResourceConfig) -> bool:
    """A literal path that the other resource excludes cannot clash with it."""
    return not gomatch.has_magic(pattern) and any(gomatch.match(x, pattern) for x in other.exclude)


def _properties_disjoint(a: ResourceConfig, b: ResourceConfig) -> bool:
    """True when some property both resources match on has no value both accept."""
    theirs = dict(b.match_properties)
    for key, globs in a.match_properties:
        if key in theirs and not any(gomatch.overlap(x, y) for x in globs for y in theirs[key]):
            return True
    return False
