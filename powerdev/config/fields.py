"""One resource's JSON object -> the ResourceConfig fields it sets.

A table names each field, the attribute it sets and the function that reads
it; each reader checks one field (CDI's four are also checked as a group)
and raises a ConfigError that names the file, the field and the fix, or
notes a warning for a harmless mistake. parse.py calls resource_fields()
for IBM's plugin's flat object and for each entry of "resources". Imports
schema.py, values.py (the one-value checks) and devices/gomatch.py.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from powerdev.config.schema import (
    ALLOCATIONS,
    APIS,
    ENTRY_FIELDS,
    KNOWN_FIELDS,
    MAX_UPPER_LIMIT,
    MIN_SCAN_INTERVAL,
    SCOPES,
    STRATEGIES,
    ConfigError,
)
from powerdev.config.values import (
    close_field,
    glob_size_problem,
    json_type,
    normalize_permissions,
    outside_dev,
    parse_duration,
    pattern_problem,
)
from powerdev.devices import gomatch


@dataclass(frozen=True)
class Entry:
    """One JSON object being read: its fields, its file, and its place."""

    data: dict[str, object]
    source: str
    prefix: str  # how messages name the object: "resources[1]." or "" (the flat form)
    warnings: list[str] = field(default_factory=list)

    def error(self, key: str, problem: str, fix: str) -> ConfigError:
        return ConfigError(self.source, self.prefix + key, problem, fix)

    def warn(self, key: str, problem: str, fix: str) -> None:
        """A mistake that does no harm: said the way an error would be."""
        self.warnings.append(str(ConfigError(self.source, self.prefix + key, problem, fix)))

    def want(self, key: str, kind: type | tuple[type, ...], example: str) -> Any:
        """The field's value if its JSON type is right (a boolean is no number)."""
        value = self.data[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.error(key, f"is a JSON {json_type(value)}", f"write it as {example}")
        return value


def _flag(entry: Entry, key: str) -> bool:
    return entry.want(key, bool, "true or false")


def _allocation(entry: Entry, key: str) -> str:
    allocation = entry.want(key, str, '"all" or "each"')
    if allocation not in ALLOCATIONS:
        raise entry.error(
            key,
            f"{allocation!r} is not an allocation mode",
            'use "all" (every grant carries every device) or "each" (one device a unit)',
        )
    return allocation


def _api(entry: Entry, key: str) -> str:
    api = entry.want(key, str, '"device-plugin", "dra" or "both"')
    if api not in APIS:
        raise entry.error(
            key,
            f"{api!r} is not an API",
            'use "device-plugin" (the kubelet\'s device plugin API, the default), "dra" '
            '(Dynamic Resource Allocation: ResourceSlices and ResourceClaims) or "both" '
            "(while workloads move from one to the other)",
        )
    return api


def _scope(entry: Entry, key: str) -> str:
    scope = entry.want(key, str, '"node" or "cluster"')
    if scope not in SCOPES:
        raise entry.error(
            key,
            f"{scope!r} is not a scope",
            'use "node" (the node\'s own pool, the default) or "cluster" (LUNs that several '
            "nodes see: each published once for the cluster by `powerdev luns`)",
        )
    return scope


def _match_properties(entry: Entry, key: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    table = entry.want(key, dict, '{"DM_UUID": "mpath-*"}')
    matched = []
    for name, value in table.items():
        where = f"{key}.{name}"
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
            raise entry.error(
                where,
                "is not a udev property name",
                "use names such as DM_UUID, ID_WWN, ID_SERIAL, ID_MODEL",
            )
        matched.append((name, _property_globs(entry, where, value)))
    return tuple(sorted(matched))


def _property_globs(entry: Entry, where: str, value: object) -> tuple[str, ...]:
    """One udev property's globs: a string, or a list of at least one."""
    if not isinstance(value, (str, list)) or value == []:
        raise entry.error(
            where,
            "is empty" if value == [] else f"is a JSON {json_type(value)}",
            'write a glob string, or a list of them, such as "mpath-*"',
        )
    globs = [value] if isinstance(value, str) else value
    for i, glob in enumerate(globs):
        element = f"{where}[{i}]" if isinstance(value, list) else where
        if not isinstance(glob, str):
            raise entry.error(
                element,
                f"is a JSON {json_type(glob)}",
                'write each glob as a string, such as "mpath-*"',
            )
        problem = (
            "it holds a NUL character"
            if "\0" in glob
            else glob_size_problem(glob) or gomatch.problem(glob)
        )
        if problem:
            raise entry.error(element, f"{glob!r}: {problem}", "fix the glob")
    return tuple(globs)


def _id_number(entry: Entry, key: str) -> int:
    number = entry.want(key, int, "a whole number such as 6 (the host's disk group)")
    if not 0 <= number < 2**31:
        raise entry.error(key, f"{number} is not a uid or gid", "use a number from 0 to 2147483647")
    return number


def _file_mode(entry: Entry, key: str) -> int:
    mode = entry.want(key, str, 'an octal string such as "0660"')
    if not re.fullmatch(r"0?[0-7]{3}", mode):
        raise entry.error(
            key,
            f"{mode!r} is not an octal file mode",
            'write it as three or four octal digits, such as "0660"',
        )
    return int(mode, 8)


def _permissions(entry: Entry, key: str) -> str | None:
    raw = entry.want(key, str, 'a string such as "rw"')
    if not raw.strip():
        return None  # blank: the default
    try:
        return normalize_permissions(raw.strip())
    except ValueError as err:
        raise entry.error(
            key, f"{raw!r}: {err}", 'use one or more of r, w, m, such as "rw"'
        ) from None


_FIX_PATTERN = "fix or remove the pattern"


def _patterns(entry: Entry, key: str) -> tuple[str, ...]:
    items = entry.want(key, list, '["/dev/dm-*", "/dev/mapper/*"]')
    patterns = []
    for i, item in enumerate(items):
        where = f"{key}[{i}]"
        if not isinstance(item, str):
            raise entry.error(
                where,
                f"is a JSON {json_type(item)}",
                'write each pattern as a string, like "/dev/sd*"',
            )
        if not item.strip():
            continue  # IBM's plugin drops empty entries too
        problem = pattern_problem(item.strip(), include=key == "include-devices")
        if problem:
            raise entry.error(where, f"{item!r}: {problem}", _FIX_PATTERN)
        useless = outside_dev(item.strip())  # only an exclude pattern gets here with one
        if useless:
            entry.warn(where, f"{item!r}: {useless}, so it excludes nothing", _FIX_PATTERN)
            patterns.append(item.strip())
            continue
        pattern = posixpath.normpath(item.strip())
        if pattern != item.strip():  # '.', '..' or '//': matched, and shown, resolved
            entry.warn(
                where,
                f"{item!r} is read as {pattern!r} ('.' and '..' resolved, '//' made '/'): "
                "a device is named by its path without them",
                "write the pattern that way",
            )
        patterns.append(pattern)
    return tuple(dict.fromkeys(patterns))


def _strategy(entry: Entry, key: str) -> str:
    strategy = entry.want(key, str, '"default" or "time"')
    if strategy not in STRATEGIES:
        raise entry.error(
            key,
            f"{strategy!r} is not a strategy",
            'use "default" (events) or "time" (events plus periodic rescans)',
        )
    return strategy


def _scan_interval(entry: Entry, key: str) -> float:
    raw = entry.data[key]
    if isinstance(raw, int) and not isinstance(raw, bool):
        # Go decodes a bare number into a Duration as nanoseconds (an int64)
        if not -(2**63) <= raw < 2**63:
            raise entry.error(
                key,
                "is a number of nanoseconds out of range",
                'write a duration such as "30s", "10m" or "2h"',
            )
        seconds = raw / 1e9
    else:
        raw = entry.want(key, str, 'a duration string such as "30s", "10m" or "2h"')
        try:
            seconds = parse_duration(raw)
        except ValueError as err:
            raise entry.error(
                key, f"{raw!r}: {err}", 'write a duration such as "30s", "10m" or "2h"'
            ) from None
    if not seconds >= MIN_SCAN_INTERVAL:  # also refuses NaN
        nanoseconds = " (a bare number is nanoseconds, as Go reads it)"
        raise entry.error(
            key,
            f"{raw!r} is shorter than the minimum of {MIN_SCAN_INTERVAL:g}s"
            + (nanoseconds if isinstance(raw, int) else ""),
            'write a duration of 10s or more, such as "30s", "10m" or "2h"',
        )
    return seconds


def _upper_limit(entry: Entry, key: str) -> int:
    limit = entry.want(key, int, "a whole number such as 10 (0 means no limit)")
    if limit < 0:
        raise entry.error(
            key, f"{limit} is negative", "use 0 for no limit or a positive number of pods"
        )
    if limit > MAX_UPPER_LIMIT:
        raise entry.error(
            key,
            f"{limit} is above the most powerdev advertises, {MAX_UPPER_LIMIT}",
            f"use at most {MAX_UPPER_LIMIT} (a node runs a few hundred pods at most; "
            "the kubelet's 4 MiB message limit allows about 200,000 units)",
        )
    return limit


# field, ResourceConfig attribute, reader (None from a reader: keep the default).
# Read in this order, the order they were always checked in, so that a config
# with two mistakes is told about the same one first; CDI's group is checked
# as a whole between the two tables.
Reader = Callable[[Entry, str], Any]
FIELDS_BEFORE_CDI: tuple[tuple[str, str, Reader], ...] = (
    ("api", "api", _api),
    ("allocation", "allocation", _allocation),
    ("match-properties", "match_properties", _match_properties),
    ("nx-gzip", "nx_gzip", _flag),
)
CDI_FIELDS: tuple[tuple[str, str, Reader], ...] = (
    ("cdi", "cdi", _flag),
    ("device-uid", "device_uid", _id_number),
    ("device-gid", "device_gid", _id_number),
    ("device-mode", "device_mode", _file_mode),
)
FIELDS_AFTER_CDI: tuple[tuple[str, str, Reader], ...] = (
    ("allow-host-used-devices", "allow_host_used", _flag),
    ("permissions", "permissions", _permissions),
    ("include-devices", "include", _patterns),
    ("exclude-devices", "exclude", _patterns),
    ("discovery-strategy", "strategy", _strategy),
    ("scan-interval", "scan_interval", _scan_interval),
    ("upper-limit", "upper_limit", _upper_limit),
    ("whole-disks", "whole_disks", _flag),
    ("scope", "scope", _scope),
    ("shared", "shared", _flag),
)


def resource_fields(
    data: dict[str, object], source: str, prefix: str
) -> tuple[dict[str, object], tuple[str, ...]]:
    """The ResourceConfig fields one JSON object sets, and warnings about it.
    `prefix` names the object in messages ("resources[1]." or "")."""
    entry = Entry(data, source, prefix)
    res = _read(entry, FIELDS_BEFORE_CDI)
    res |= _read(entry, CDI_FIELDS)
    _check_cdi_only(entry, res)
    res |= _read(entry, FIELDS_AFTER_CDI)
    warnings = (*entry.warnings, *_unknown_fields(entry))
    _check_mode(entry, res)
    return res, warnings


def _read(entry: Entry, table: tuple[tuple[str, str, Reader], ...]) -> dict[str, object]:
    res: dict[str, object] = {}
    for key, attr, read in table:
        if key in entry.data:
            value = read(entry, key)
            if value is not None:
                res[attr] = value
    return res


def _check_cdi_only(entry: Entry, res: dict[str, object]) -> None:
    cdi_only = [key for key, _, _ in CDI_FIELDS[1:] if key in entry.data]
    if res.get("api") == "dra":
        if "cdi" in entry.data:
            raise entry.error(
                "cdi",
                'is for the device plugin API: "api": "dra" always answers with CDI '
                "(a spec per claim)",
                "remove it",
            )
        return  # device-uid, -gid and -mode shape each claim's CDI spec
    if cdi_only and not res.get("cdi"):
        raise entry.error(
            cdi_only[0],
            "applies only to CDI answers (a DeviceSpec carries no owner, group or mode)",
            'set "cdi": true, or remove it',
        )


def _unknown_fields(entry: Entry) -> tuple[str, ...]:
    """Warnings for fields nobody reads; an error for one that looks misspelt."""
    known = (*KNOWN_FIELDS, *ENTRY_FIELDS) if entry.prefix else KNOWN_FIELDS
    for key in entry.data:
        meant = close_field(key) if key not in known else None
        if meant is not None:
            raise entry.error(key, "is not a known field", f"did you mean {meant!r}? Rename it")
    return tuple(
        f"{entry.source}: field {entry.prefix + key!r} is not known and is ignored; known fields: "
        + ", ".join(KNOWN_FIELDS)
        for key in entry.data
        if key not in known
    )


def _check_mode(entry: Entry, res: dict[str, object]) -> None:
    api = res.get("api")
    if res.get("whole_disks") and api != "dra":
        raise entry.error(
            "whole-disks",
            'publishes a disk beside its partitions, which only "api": "dra" can do (its '
            "pool tells the scheduler they overlap); through the device plugin API a "
            "partitioned disk's partitions are its units",
            'set "api": "dra", or remove it',
        )
    if res.get("scope", "node") == "cluster" and api != "dra":
        raise entry.error(
            "scope",
            f'"cluster" publishes each LUN once for the cluster through DRA, and the resource '
            f'says "api": {json.dumps(api or "device-plugin")}',
            'set "api": "dra", or remove scope (a device plugin cannot keep a LUN to one holder '
            "across nodes)",
        )
    if res.get("shared") and res.get("scope", "node") != "cluster":
        raise entry.error(
            "shared",
            "lets several claims hold one LUN at once, which only a resource with "
            '"scope": "cluster" publishes (one device for the cluster, that the scheduler '
            "may allocate more than once)",
            'set "scope": "cluster" (and "api": "dra"), or remove it',
        )
    if api in ("dra", "both"):
        # A DRA device is one device (every name of it): "each" units.
        if "upper-limit" in entry.data:
            raise entry.error(
                "upper-limit",
                f'shares units out, and "api": "{api}" publishes each device as itself',
                "remove upper-limit (a claim's count says how many devices a pod gets)",
            )
        if res.get("allocation", "each") != "each":
            raise entry.error(
                "allocation",
                f'"all" grants every device at once, and "api": "{api}" grants the devices '
                "a claim was allocated",
                'remove allocation, or write "each"',
            )
        res["allocation"] = "each"
    if res.get("allocation") == "each" and res.get("upper_limit", 0):
        raise entry.error(
            "upper-limit",
            'shares units out, and "allocation": "each" gives one device a unit',
            'remove upper-limit, or use "allocation": "all"',
        )
