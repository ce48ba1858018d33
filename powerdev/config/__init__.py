"""The seed's config.json, parsed into frozen settings.

Pure functions only: the daemon decides when to read the file, and
the device code (devices/) reads the settings. Every error names the file,
the field and the fix, because an operator reads it in `kubectl logs`.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from powerdev.devices import gomatch

DEFAULT_CONFIG_PATH = "/etc/power-device-plugin/config.json"
DEFAULT_RESOURCE_NAME = "power-dev-plugin/dev"
DEFAULT_SOCKET_NAME = "power-dev.csi.ibm.com-reg.sock"
DEFAULT_SCAN_INTERVAL = 3600.0  # the seed's default for the `time` strategy: 60 minutes
MIN_SCAN_INTERVAL = 10.0  # a rescan costs tens of ms at 10,000 devices; events do the rest
STRATEGIES = ("default", "time")
# upper-limit N advertises N units. The kubelet takes a ListAndWatch message
# of at most 4 MiB, about 200,000 units of ~20 bytes; each unit also costs
# powerdev a few hundred bytes and the DaemonSet's memory limit is 128 MiB.
# A node runs a few hundred pods at most (110 by default), so 10,000 is far
# above any real need and far below both limits.
MAX_UPPER_LIMIT = 10_000
MAX_CONFIG_BYTES = 1024 * 1024  # a config.json is a few hundred bytes

KNOWN_FIELDS = (
    "nx-gzip",
    "permissions",
    "include-devices",
    "exclude-devices",
    "discovery-strategy",
    "scan-interval",
    "upper-limit",
    "allow-host-used-devices",
    "cdi",
    "device-uid",
    "device-gid",
    "device-mode",
    "allocation",
    "match-properties",
)
ENTRY_FIELDS = ("name", "socket")  # a resource of the "resources" list also has these
ALLOCATIONS = ("all", "each")
MAX_RESOURCES = 32  # each is a socket, a registration and a stream


class ConfigError(ValueError):
    """A config that cannot be used; str() is the one line an operator reads."""

    def __init__(self, source: str, field_name: str | None, problem: str, fix: str) -> None:
        where = f"{source}: field {field_name!r}" if field_name else source
        super().__init__(f"{where}: {problem}; {fix}")


@dataclass(frozen=True)
class ResourceConfig:
    """One extended resource: what to discover and how to grant it."""

    name: str = DEFAULT_RESOURCE_NAME
    socket: str = DEFAULT_SOCKET_NAME
    nx_gzip: bool = False
    permissions: str = "rw"
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    strategy: str = "default"
    scan_interval: float = DEFAULT_SCAN_INTERVAL
    upper_limit: int = 0  # 0: no limit, one unit per device
    allow_host_used: bool = False  # also list devices the host mounts, swaps on or holds
    cdi: bool = False  # answer Allocate with CDI device names (cdi.py writes the spec)
    device_uid: int | None = None  # owner, group and mode of the node in the container (CDI)
    device_gid: int | None = None
    device_mode: int | None = None
    allocation: str = "all"  # "all": every grant carries every device; "each": the ones chosen
    # (udev property, globs): a device must match one glob of every property
    match_properties: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class Config:
    """Everything read from one config file; `resources` is open to more than one."""

    source: str
    resources: tuple[ResourceConfig, ...]
    warnings: tuple[str, ...] = field(default=(), compare=False)
    raw: bytes | None = field(default=None, compare=False)  # the file's bytes; None: no file


# --- small parsers, each testable alone -------------------------------------

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def parse_duration(text: str) -> float:
    """A Go duration string ("30s", "10m", "1h30m", "1.5h") in seconds.

    Raises ValueError for anything Go's time.ParseDuration would refuse, and
    for negative durations, which make no sense as a scan interval.
    """
    if not isinstance(text, str) or not text:
        raise ValueError("empty duration")
    if text == "0":
        return 0.0
    if text[0] in "+-":
        if text[0] == "-":
            raise ValueError("negative duration")
        text = text[1:]
    pos, total = 0, 0.0
    while pos < len(text):
        m = _DURATION_PART.match(text, pos)
        if not m:
            raise ValueError(f"cannot read {text[pos:]!r}")
        total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    if pos == 0:
        raise ValueError("no number and unit")
    return total


def normalize_permissions(text: str) -> str:
    """cgroup device permissions: a non-empty set of r, w, m, any order or case."""
    letters = text.lower()
    bad = sorted(set(letters) - set("rwm"))
    if bad:
        raise ValueError(f"letters {''.join(bad)!r} are not r, w or m")
    if len(set(letters)) != len(letters):
        raise ValueError("a letter is repeated")
    return "".join(c for c in "rwm" if c in letters)


_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$")
_QUALIFIED_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def resource_name_problem(name: str) -> str | None:
    """Why the kubelet would refuse `name` as an extended resource name, or None."""
    if "/" not in name:
        return "an extended resource name needs a domain prefix, like vendor.example/dev"
    prefix, _, rest = name.partition("/")
    if name.startswith("requests."):
        return "must not start with 'requests.'"
    if "kubernetes.io/" in name:
        return "the kubernetes.io domain is reserved"
    if not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix):
        return f"prefix {prefix!r} is not a DNS subdomain of at most 253 characters"
    if not rest or len(rest) > 63 or not _QUALIFIED_NAME.match(rest):
        return f"name {rest!r} must be 1-63 letters, digits, '-', '_' or '.'"
    return None


# Longer than any Linux path (PATH_MAX): bounds what a match and the config's
# overlap check may cost (len(pattern) x len(name), and pattern x pattern).
MAX_GLOB = 4096


def _glob_size_problem(glob: str) -> str | None:
    if len(glob.encode()) > MAX_GLOB:
        return f"it is longer than {MAX_GLOB} bytes, more than any path on Linux"
    return None


def pattern_problem(pattern: str, *, include: bool = True) -> str | None:
    """Why a glob pattern is unusable, or None. Patterns are Go globs (see
    devices/gomatch.py); an include pattern must point below /dev, since
    only device nodes are ever advertised."""
    if "\0" in pattern:
        return "it holds a NUL character, which no path has"
    too_long = _glob_size_problem(pattern)
    if too_long:
        return too_long
    if not pattern.startswith("/"):
        return "patterns are absolute host paths, like /dev/dm-*"
    problem = gomatch.problem(pattern)
    if problem:
        return f"not a valid Go glob pattern: {problem}"
    # Go's Glob walks ".." like any name: /dev/../etc/* is /etc/*.
    if include and not posixpath.normpath(pattern).startswith("/dev/"):
        return "it can never match: device nodes live under /dev"
    return None


RESERVED_NAMES = ("kubelet.sock", "kubelet_internal_checkpoint")  # the kubelet's own
UNIX_PATH_MAX = 107  # bytes in a unix socket path (sun_path holds 108, with the NUL)


def socket_problem(name: object) -> str | None:
    """Why a socket file name cannot be ours, or None."""
    if not isinstance(name, str) or not name or name in (".", ".."):
        return "is not a file name"
    if "/" in name or "\0" in name:
        return "is not a bare file name (no '/', no NUL)"
    if name in RESERVED_NAMES:
        return "is the kubelet's own file"
    return None


def socket_path_problem(plugin_dir: Path, name: str) -> str | None:
    """Why a socket at plugin_dir/name could not be bound or dialled, or None."""
    path = plugin_dir.absolute() / name
    size = len(os.fsencode(path))
    if size > UNIX_PATH_MAX:
        return (
            f"the socket path {path} is {size} bytes, over the {UNIX_PATH_MAX} "
            "a unix socket path may have"
        )
    return None


def _close_field(key: str) -> str | None:
    """A known field that `key` is probably a misspelling of."""
    # Imported here: only a bad config needs it, and the daemon's resident
    # memory is mostly its imports (difflib is about 0.5 MiB of it).
    import difflib

    close = difflib.get_close_matches(key.lower(), KNOWN_FIELDS, n=1, cutoff=0.75)
    return close[0] if close else None


# --- the file -----------------------------------------------------------------


def parse_config(
    text: str,
    *,
    source: str,
    resource_name: str = DEFAULT_RESOURCE_NAME,
    socket_name: str = DEFAULT_SOCKET_NAME,
) -> Config:
    """Parse config.json text. Raises ConfigError naming source, field and fix."""
    try:
        data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as err:
        raise ConfigError(
            source,
            None,
            f"not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})",
            "fix the JSON syntax",
        ) from None
    except RecursionError:
        raise ConfigError(
            source, None, "nests arrays or objects too deeply", "write a flat JSON object"
        ) from None
    except ValueError as err:  # say, a number of more digits than Python reads
        raise ConfigError(
            source, None, f"cannot be read as JSON ({err})", "fix the value"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            source,
            None,
            f"the top level is a JSON {_json_type(data)}",
            'write an object such as {"permissions": "rw"}',
        )

    if "resources" not in data:  # the seed's flat form: one resource, named on the command line
        problem = resource_name_problem(resource_name)
        if problem:
            raise ConfigError(
                "--resource-name",
                None,
                f"{resource_name!r}: {problem}",
                f"use a name such as {DEFAULT_RESOURCE_NAME}",
            )
        problem = socket_problem(socket_name)
        if problem:
            raise ConfigError(
                "--socket-name",
                None,
                f"{socket_name!r} {problem}",
                f"use a file name such as {DEFAULT_SOCKET_NAME}",
            )
        res, warnings = _resource_fields(data, source, "")
        _check_mode(res, source, "")
        resource = ResourceConfig(name=resource_name, socket=socket_name, **res)  # type: ignore[arg-type]
        _check_cdi(resource, source, "cdi")
        return Config(source=source, resources=(resource,), warnings=warnings)
    return _parse_resources(data, source)


def _resource_fields(
    data: dict[str, object], source: str, prefix: str
) -> tuple[dict[str, object], tuple[str, ...]]:
    """The ResourceConfig fields one JSON object sets, and warnings about it.
    `prefix` names the object in messages ("resources[1]." or "")."""

    def want(key: str, kind: type | tuple[type, ...], example: str) -> object:
        value = data[key]
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if not ok:
            raise ConfigError(
                source, prefix + key, f"is a JSON {_json_type(value)}", f"write it as {example}"
            )
        return value

    res: dict[str, object] = {}
    if "allocation" in data:
        allocation = want("allocation", str, '"all" or "each"')
        if allocation not in ALLOCATIONS:
            raise ConfigError(
                source,
                prefix + "allocation",
                f"{allocation!r} is not an allocation mode",
                'use "all" (every grant carries every device) or "each" (one device a unit)',
            )
        res["allocation"] = allocation
    if "match-properties" in data:
        res["match_properties"] = _match_properties(
            want("match-properties", dict, '{"DM_UUID": "mpath-*"}'), source, prefix
        )
    if "nx-gzip" in data:
        res["nx_gzip"] = want("nx-gzip", bool, "true or false")
    if "cdi" in data:
        res["cdi"] = want("cdi", bool, "true or false")
    for key, attr in (("device-uid", "device_uid"), ("device-gid", "device_gid")):
        if key in data:
            number = want(key, int, "a whole number such as 6 (the host's disk group)")
            if not 0 <= number < 2**31:
                raise ConfigError(
                    source,
                    prefix + key,
                    f"{number} is not a uid or gid",
                    "use a number from 0 to 2147483647",
                )
            res[attr] = number
    if "device-mode" in data:
        mode = want("device-mode", str, 'an octal string such as "0660"')
        if not re.fullmatch(r"0?[0-7]{3}", mode):
            raise ConfigError(
                source,
                prefix + "device-mode",
                f"{mode!r} is not an octal file mode",
                'write it as three or four octal digits, such as "0660"',
            )
        res["device_mode"] = int(mode, 8)
    cdi_only = [k for k in ("device-uid", "device-gid", "device-mode") if k in data]
    if cdi_only and not res.get("cdi"):
        raise ConfigError(
            source,
            prefix + cdi_only[0],
            "applies only to CDI answers (a DeviceSpec carries no owner, group or mode)",
            'set "cdi": true, or remove it',
        )
    if "allow-host-used-devices" in data:
        res["allow_host_used"] = want("allow-host-used-devices", bool, "true or false")
    if "permissions" in data:
        raw = want("permissions", str, 'a string such as "rw"')
        if raw.strip():
            try:
                res["permissions"] = normalize_permissions(raw.strip())
            except ValueError as err:
                raise ConfigError(
                    source,
                    prefix + "permissions",
                    f"{raw!r}: {err}",
                    'use one or more of r, w, m, such as "rw"',
                ) from None
    for key, attr in (("include-devices", "include"), ("exclude-devices", "exclude")):
        if key in data:
            items = want(key, list, '["/dev/dm-*", "/dev/mapper/*"]')
            patterns = []
            for i, item in enumerate(items):
                if not isinstance(item, str):
                    raise ConfigError(
                        source,
                        f"{prefix}{key}[{i}]",
                        f"is a JSON {_json_type(item)}",
                        'write each pattern as a string, like "/dev/sd*"',
                    )
                if not item.strip():
                    continue  # the seed drops empty entries too
                problem = pattern_problem(item.strip(), include=key == "include-devices")
                if problem:
                    raise ConfigError(
                        source,
                        f"{prefix}{key}[{i}]",
                        f"{item!r}: {problem}",
                        "fix or remove the pattern",
                    )
                patterns.append(item.strip())
            res[attr] = tuple(dict.fromkeys(patterns))
    if "discovery-strategy" in data:
        strategy = want("discovery-strategy", str, '"default" or "time"')
        if strategy not in STRATEGIES:
            raise ConfigError(
                source,
                prefix + "discovery-strategy",
                f"{strategy!r} is not a strategy",
                'use "default" (events) or "time" (events plus periodic rescans)',
            )
        res["strategy"] = strategy
    if "scan-interval" in data:
        raw = data["scan-interval"]
        if isinstance(raw, int) and not isinstance(raw, bool):
            # Go decodes a bare number into a Duration as nanoseconds (an int64)
            if not -(2**63) <= raw < 2**63:
                raise ConfigError(
                    source,
                    prefix + "scan-interval",
                    "is a number of nanoseconds out of range",
                    'write a duration such as "30s", "10m" or "2h"',
                )
            seconds = raw / 1e9
        else:
            raw = want("scan-interval", str, 'a duration string such as "30s", "10m" or "2h"')
            try:
                seconds = parse_duration(raw)
            except ValueError as err:
                raise ConfigError(
                    source,
                    prefix + "scan-interval",
                    f"{raw!r}: {err}",
                    'write a duration such as "30s", "10m" or "2h"',
                ) from None
        if not seconds >= MIN_SCAN_INTERVAL:  # also refuses NaN
            raise ConfigError(
                source,
                prefix + "scan-interval",
                f"{raw!r} is shorter than the minimum of {MIN_SCAN_INTERVAL:g}s"
                + (
                    " (a bare number is nanoseconds, as Go reads it)"
                    if isinstance(raw, int)
                    else ""
                ),
                'write a duration of 10s or more, such as "30s", "10m" or "2h"',
            )
        res["scan_interval"] = seconds
    if "upper-limit" in data:
        limit = want("upper-limit", int, "a whole number such as 10 (0 means no limit)")
        if limit < 0:
            raise ConfigError(
                source,
                prefix + "upper-limit",
                f"{limit} is negative",
                "use 0 for no limit or a positive number of pods",
            )
        if limit > MAX_UPPER_LIMIT:
            raise ConfigError(
                source,
                prefix + "upper-limit",
                f"{limit} is above the most powerdev advertises, {MAX_UPPER_LIMIT}",
                f"use at most {MAX_UPPER_LIMIT} (a node runs a few hundred pods at most; "
                "the kubelet's 4 MiB message limit allows about 200,000 units)",
            )
        res["upper_limit"] = limit

    known = (*KNOWN_FIELDS, *ENTRY_FIELDS) if prefix else KNOWN_FIELDS
    for key in data:
        meant = _close_field(key) if key not in known else None
        if meant is not None:
            raise ConfigError(
                source, prefix + key, "is not a known field", f"did you mean {meant!r}? Rename it"
            )
    warnings = tuple(
        f"{source}: field {prefix + key!r} is not known and is ignored; known fields: "
        + ", ".join(KNOWN_FIELDS)
        for key in data
        if key not in known
    )
    return res, warnings


def _match_properties(
    table: dict[str, object], source: str, prefix: str
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    field_name = prefix + "match-properties"
    matched = []
    for key, value in table.items():
        globs = [value] if isinstance(value, str) else value
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", key):
            raise ConfigError(
                source,
                f"{field_name}.{key}",
                "is not a udev property name",
                "use names such as DM_UUID, ID_WWN, ID_SERIAL, ID_MODEL",
            )
        if not isinstance(globs, list) or not globs or not all(isinstance(g, str) for g in globs):
            raise ConfigError(
                source,
                f"{field_name}.{key}",
                f"is a JSON {_json_type(value)}",
                'write a glob string, or a list of them, such as "mpath-*"',
            )
        for glob in globs:
            problem = (
                "it holds a NUL character"
                if "\0" in glob
                else _glob_size_problem(glob) or gomatch.problem(glob)
            )
            if problem:
                raise ConfigError(
                    source, f"{field_name}.{key}", f"{glob!r}: {problem}", "fix the glob"
                )
        matched.append((key, tuple(globs)))
    return tuple(sorted(matched))


_CDI_VENDOR = re.compile(r"^[A-Za-z]([A-Za-z0-9.-]*[A-Za-z0-9])?$")
_CDI_CLASS = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_-]*[A-Za-z0-9])?$")


def cdi_name_problem(resource_name: str) -> str | None:
    """Why a resource name cannot be the kind (vendor/class) of a CDI spec
    that containerd and CRI-O load, or None."""
    vendor, _, cls = resource_name.partition("/")
    if not _CDI_VENDOR.match(vendor):
        return f"CDI needs a vendor that starts with a letter, and {vendor!r} does not"
    if not _CDI_CLASS.match(cls):
        return f"CDI needs a class of letters, digits, '-' and '_', and {cls!r} is not"
    return None


def _check_cdi(resource: ResourceConfig, source: str, where: str) -> None:
    if resource.cdi:
        problem = cdi_name_problem(resource.name)
        if problem:
            raise ConfigError(
                source,
                where,
                f"{resource.name!r}: {problem}",
                "rename the resource, or turn cdi off",
            )


def _check_mode(res: dict[str, object], source: str, prefix: str) -> None:
    if res.get("allocation") == "each" and res.get("upper_limit", 0):
        raise ConfigError(
            source,
            prefix + "upper-limit",
            'shares units out, and "allocation": "each" gives one device a unit',
            'remove upper-limit, or use "allocation": "all"',
        )


def _parse_resources(data: dict[str, object], source: str) -> Config:
    """The form with several named resources: {"resources": [{...}, ...]}."""
    entries = data["resources"]
    if not isinstance(entries, list) or not entries:
        raise ConfigError(
            source,
            "resources",
            f"is a JSON {_json_type(entries)}" if not isinstance(entries, list) else "is empty",
            'write a list of resources, such as [{"name": "power-dev-plugin/lun", ...}]',
        )
    if len(entries) > MAX_RESOURCES:
        raise ConfigError(
            source,
            "resources",
            f"lists {len(entries)} resources, more than {MAX_RESOURCES}",
            "merge resources that hand out the same devices",
        )
    stray = [k for k in data if k != "resources"]
    if stray:
        raise ConfigError(
            source,
            stray[0],
            'is beside "resources"',
            'move it into each resource of the "resources" list',
        )
    resources: list[ResourceConfig] = []
    warnings: list[str] = []
    for i, entry in enumerate(entries):
        prefix = f"resources[{i}]."
        if not isinstance(entry, dict):
            raise ConfigError(
                source,
                f"resources[{i}]",
                f"is a JSON {_json_type(entry)}",
                'write each resource as an object with a "name"',
            )
        name = entry.get("name")
        if not isinstance(name, str) or resource_name_problem(name):
            why = resource_name_problem(name) if isinstance(name, str) else "it is missing"
            raise ConfigError(
                source,
                prefix + "name",
                f"{name!r}: {why}",
                "name each resource as an extended resource, such as power-dev-plugin/lun",
            )
        socket = entry.get("socket", default_socket(name))
        problem = socket_problem(socket)
        if problem:
            raise ConfigError(
                source,
                prefix + "socket",
                f"{socket!r} {problem}",
                "use a file name such as lun.sock, or leave it out",
            )
        res, more = _resource_fields(entry, source, prefix)
        _check_mode(res, source, prefix)
        warnings.extend(more)
        resource = ResourceConfig(name=name, socket=socket, **res)  # type: ignore[arg-type]
        _check_cdi(resource, source, prefix + "name")
        resources.append(resource)
    for field_name, attr in (("name", "name"), ("socket", "socket")):
        seen: dict[str, int] = {}
        for i, resource in enumerate(resources):
            value = getattr(resource, attr)
            if value in seen:
                raise ConfigError(
                    source,
                    f"resources[{i}].{field_name}",
                    f"{value!r} is also the {field_name} of resources[{seen[value]}]",
                    f"give each resource its own {field_name}",
                )
            seen[value] = i
    _check_spec_files(resources, source)
    _check_overlaps(resources, source)
    return Config(source=source, resources=tuple(resources), warnings=tuple(warnings))


def default_socket(resource_name: str) -> str:
    """The socket file of a named resource: power-dev-plugin/lun -> power-dev-plugin-lun.sock."""
    return resource_name.replace("/", "-") + ".sock"


def cdi_spec_file(resource_name: str) -> str:
    """The CDI spec file of a resource: power-dev-plugin/lun -> power-dev-plugin-lun.json."""
    return resource_name.replace("/", "-") + ".json"


def _check_spec_files(resources: list[ResourceConfig], source: str) -> None:
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


def _check_overlaps(resources: list[ResourceConfig], source: str) -> None:
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


def decode_config(data: bytes, source: str) -> str:
    """The file's bytes as text; ConfigError (naming the file) if not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            source,
            None,
            f"is not UTF-8 text ({err.reason} at byte {err.start})",
            "save it as UTF-8 JSON",
        ) from None


def load_config(
    path: str | Path,
    *,
    resource_name: str = DEFAULT_RESOURCE_NAME,
    socket_name: str = DEFAULT_SOCKET_NAME,
) -> Config:
    """Read and parse a config file; a missing file means the defaults, as in
    the seed, and a warning that says what they mean."""
    path = Path(path)
    raw: bytes | None = None
    try:
        raw = read_config_bytes(path)
        text = decode_config(raw, str(path))
    except FileNotFoundError:
        source = f"{path} (missing: defaults)"
        config = parse_config(
            "", source=source, resource_name=resource_name, socket_name=socket_name
        )
        return replace(
            config, warnings=(_defaults_warning(f"{path} does not exist"), *config.warnings)
        )
    except IsADirectoryError:
        raise ConfigError(
            str(path), None, "is a directory", "point --config at the config.json file inside it"
        ) from None
    except OSError as err:
        raise ConfigError(
            str(path), None, f"cannot be read ({err})", "check the file and its permissions"
        ) from None
    else:
        source = str(path)
    config = parse_config(text, source=source, resource_name=resource_name, socket_name=socket_name)
    if not text.strip():
        config = replace(config, warnings=(_defaults_warning(f"{path} is empty"), *config.warnings))
    return replace(config, raw=raw)


def _defaults_warning(why: str) -> str:
    return (
        f"{why}: using the defaults, as the seed does. They advertise every block device "
        "of the host (disks, partitions, dm-*; not loop, ram or zram) except those the host "
        'mounts, swaps on or holds; write a config.json with "include-devices" to choose'
    )


def read_config_bytes(path: Path) -> bytes:
    """The file's bytes, refusing a file far larger than any config."""
    with path.open("rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(
            str(path),
            None,
            f"is larger than {MAX_CONFIG_BYTES // 1024} KiB",
            "point --config at the config.json file",
        )
    return data


def _json_type(value: object) -> str:
    return {
        bool: "boolean",
        int: "number",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
        type(None): "null",
    }.get(type(value), "value")
