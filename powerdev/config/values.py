"""One value at a time: the small parsers and checkers a config field uses
(durations, permissions, resource and socket names, glob patterns, CDI
names), each testable alone, and the words messages use for JSON types and
for a misspelt field.

A checker returns why a value is unusable, or None; fields.py and
parse.py turn that into a ConfigError naming the file and the field.
Imports schema.py (the bounds) and devices/gomatch.py (Go globs).
"""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path

from powerdev.config.schema import KNOWN_FIELDS, MAX_GLOB, RESERVED_NAMES, UNIX_PATH_MAX
from powerdev.devices import gomatch

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


def glob_size_problem(glob: str) -> str | None:
    if len(glob.encode()) > MAX_GLOB:
        return f"it is longer than {MAX_GLOB} bytes, more than any path on Linux"
    return None


def pattern_problem(pattern: str, *, include: bool = True) -> str | None:
    """Why a glob pattern is unusable, or None. Patterns are Go globs (see
    devices/gomatch.py); an include pattern must point below /dev, since
    only device nodes are ever advertised."""
    if "\0" in pattern:
        return "it holds a NUL character, which no path has"
    too_long = glob_size_problem(pattern)
    if too_long:
        return too_long
    if not pattern.startswith("/"):
        return "patterns are absolute host paths, like /dev/dm-*"
    problem = gomatch.problem(pattern)
    if problem:
        return f"not a valid Go glob pattern: {problem}"
    return outside_dev(pattern) if include else None


def outside_dev(pattern: str) -> str | None:
    """Why an absolute pattern can never match a device node, or None."""
    # Go's Glob walks ".." like any name: /dev/../etc/* is /etc/*.
    resolved = posixpath.normpath(pattern)
    if resolved.startswith("/dev/"):
        return None
    if ".." in pattern.split("/"):
        return f"it is {resolved} once '..' is resolved, and can never match: " + _UNDER_DEV
    return "it can never match: " + _UNDER_DEV


_UNDER_DEV = "device nodes live under /dev"


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


def close_field(key: str) -> str | None:
    """A known field that `key` is probably a misspelling of."""
    # Imported here: only a bad config needs it, and the daemon's resident
    # memory is mostly its imports (difflib is about 0.5 MiB of it).
    import difflib

    close = difflib.get_close_matches(key.lower(), KNOWN_FIELDS, n=1, cutoff=0.75)
    return close[0] if close else None


def json_type(value: object) -> str:
    """The JSON name of a decoded value's type, as a config's author knows it."""
    return {
        bool: "boolean",
        int: "number",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
        type(None): "null",
    }.get(type(value), "value")
