"""The names DRA objects get: a device's name in a slice (a DNS label from
its unit ID, stable across restarts), a resource's pool on a node, the
ResourceSlice objects' own names, and the driver's two sockets; and a
byte count spelled as the API server spells a quantity back. Pure
functions."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

MAX_LABEL = 63  # a DNS label (RFC 1123): a device's name in a slice
MAX_SUBDOMAIN = 253  # a DNS subdomain: a driver's name, an object's name
_NOT_LABEL = re.compile(r"[^a-z0-9-]")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_HASH = 8
_DECIMAL = ("", "k", "M", "G", "T", "P", "E")  # a quantity's decimal suffixes


def byte_quantity(size: int) -> str:
    """`size` as the API server writes the quantity back (canonical, decimal:
    100000000000 is "100G", 1048576 stays): what is published reads back
    the same, so a slice read from the server compares equal to it."""
    mantissa, power = size, 0
    while mantissa and mantissa % 1000 == 0 and power < len(_DECIMAL) - 1:
        mantissa, power = mantissa // 1000, power + 1
    return f"{mantissa}{_DECIMAL[power]}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:_HASH]


def device_name(unit_id: str) -> str:
    """A unit ID as a DNS label: lowercase, other characters made "-". When
    that changed anything, or the result is too long, a hash of the ID is
    appended, so that two IDs made alike never share a name.

    "dm-uuid.mpath-3600a0b8" -> "dm-uuid-mpath-3600a0b8-<8 hex digits>";
    "loop4" -> "loop4"."""
    cleaned = _NOT_LABEL.sub("-", unit_id.lower()).strip("-")
    if cleaned == unit_id and len(cleaned) <= MAX_LABEL and _LABEL.fullmatch(cleaned):
        return cleaned
    head = cleaned[: MAX_LABEL - _HASH - 1].strip("-")
    return f"{head}-{_digest(unit_id)}" if head else f"d-{_digest(unit_id)}"


def driver_problem(driver: str) -> str | None:
    """Why a driver name is not a DNS subdomain, or None."""
    if len(driver) > MAX_SUBDOMAIN:
        return f"is {len(driver)} characters, more than {MAX_SUBDOMAIN}"
    if not _SUBDOMAIN.fullmatch(driver):
        return "is not a DNS subdomain (lowercase letters, digits, '-' and '.')"
    return None


def pool_name(node: str, resource_name: str) -> str:
    """One pool per node and resource: "<node>/<resource name>"."""
    return f"{node}/{resource_name}"


def slice_name(node: str, driver: str, resource_name: str, index: int) -> str:
    """The name of the index-th ResourceSlice of a pool: readable node and
    resource, a hash of all three (two pools never share a name)."""
    readable = _NOT_LABEL.sub("-", f"{node}-{resource_name}".lower()).strip("-")[:200]
    return f"{readable}-{_digest(f'{driver}/{node}/{resource_name}')}-{index}"


def counter_slice_name(node: str, driver: str, resource_name: str, index: int) -> str:
    """The name of the index-th slice of a pool's shared counters (a slice
    holds devices or counters, never both): slice_name()'s, "c" before
    the index."""
    return slice_name(node, driver, resource_name, index).rpartition("-")[0] + f"-c{index}"


def registration_socket(registry_dir: Path, driver: str) -> Path:
    """Where the kubelet's plugin watcher finds the driver: <dir>/<driver>-reg.sock."""
    return registry_dir / f"{driver}-reg.sock"


def endpoint(plugins_dir: Path, driver: str) -> Path:
    """The driver's node service: <plugins dir>/<driver>/dra.sock."""
    return plugins_dir / driver / "dra.sock"
