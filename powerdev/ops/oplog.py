"""What the daemon tells an operator in its log, worded here: the start
lines, device list changes (what changed, in natural order, with counts in
proper grammar), and Allocate refusals (each with the IDs asked for and the
reason, rate-limited). Plain functions and small state; no Trio.
"""

from __future__ import annotations

import heapq
import logging
import socket
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from powerdev import __version__
from powerdev.resources.allocation import natural_key

log = logging.getLogger(__name__)
MOST_NAMES = 20  # names shown for each kind of change; the rest are counted
REFUSAL_BURST = 5  # refusals logged at once per resource and reason ...
REFUSAL_PERIOD = 10.0  # ... then one per this many seconds, with a count of those left out


def plural(count: int, noun: str) -> str:
    """`1 device`, `2 devices`, `no device`."""
    if count == 0:
        return f"no {noun}"
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def short_name(path: str) -> str:
    """A device path as an admin names it: /dev/loop42 -> loop42."""
    return path.removeprefix("/dev/")


def names(paths: Collection[str], most: int = MOST_NAMES) -> str:
    """The first few names in natural order, and how many more: one name
    made at a time (a list of 10,000 short names would outlive each one)."""
    shown = ", ".join(heapq.nsmallest(most, map(short_name, paths), key=natural_key))
    left = len(paths) - most
    return shown + (f" and {left:,} more" if left > 0 else "")


def describe_change(
    before: Mapping[str, bool] | None, after: Mapping[str, bool], most: int = MOST_NAMES
) -> str | None:
    """What changed between two device lists (path -> healthy), or None if
    nothing did. The first list is described as what was found."""
    total = _total(len(after), sum(after.values()))
    if before is None:
        return f"{total}: {names(after, most)}" if after else total
    return _said(*_changes(before, after.get, before.keys() | after.keys()), total, most)


def _changes(
    before: Mapping[str, bool], now: Callable[[str], bool | None], paths: Iterable[str]
) -> tuple[list[str], list[str], list[str], list[str]]:
    """Of these paths: those added, removed, turned Unhealthy and turned
    Healthy between `before` and `now` (path -> healthy, None if unlisted)."""
    added: list[str] = []
    removed: list[str] = []
    sick: list[str] = []
    well: list[str] = []
    for path in paths:
        was, healthy = before.get(path), now(path)
        if healthy is None:
            if was is not None:
                removed.append(path)
        elif was is None:
            added.append(path)
        elif was != healthy:
            (sick if was else well).append(path)
    return added, removed, sick, well


def _total(count: int, healthy: int) -> str:
    total = plural(count, "device")
    if count != healthy:
        total += f" ({count - healthy} Unhealthy)"
    return total


def _said(
    added: list[str], removed: list[str], sick: list[str], well: list[str], total: str, most: int
) -> str | None:
    parts = []
    if added:
        parts.append(f"added {names(added, most)}")
    if removed:
        parts.append(f"removed {names(removed, most)}")
    if sick:
        parts.append(f"Unhealthy: {names(sick, most)}")
    if well:
        parts.append(f"Healthy again: {names(well, most)}")
    if not parts:
        return None
    return f"{'; '.join(parts)}; now {total}"


class DeviceLog:
    """The last device list logged for each resource, to log what changed."""

    def __init__(self) -> None:
        self._last: dict[str, dict[str, bool]] = {}

    def knows(self, resource: str) -> bool:
        """Has a list of this resource been logged (so the next line costs
        what changed)?"""
        return resource in self._last

    def begin(self, resource: str, listed: Mapping[str, Any]) -> dict[str, bool]:
        """The first list of a resource, recorded now; its line is
        `describe_change(None, <what this returns>)`, which the caller may
        make in a worker thread (it is a copy: later lines change the record)."""
        now = {p: d.healthy for p, d in listed.items()}
        self._last[resource] = now
        return dict(now)

    def change(self, resource: str, devices: Iterable[Any]) -> str | None:
        """The line for this list (objects with .path and .healthy), or None."""
        now = {d.path: d.healthy for d in devices}
        text = describe_change(self._last.get(resource), now)
        self._last[resource] = now
        return text

    def follow(
        self, resource: str, listed: Mapping[str, Any], paths: Iterable[str] | None
    ) -> str | None:
        """The line for the list `listed` (path -> object with .healthy), where
        only `paths` changed since the last line (None: any may have). Costs
        what changed, not the list's length, after the first."""
        last = self._last.get(resource)
        if last is None or paths is None:
            return self.change(resource, listed.values())
        now = {p: (d.healthy if (d := listed.get(p)) is not None else None) for p in paths}
        changes = _changes(last, now.get, now)
        for path, healthy in now.items():
            if healthy is None:
                last.pop(path, None)
            else:
                last[path] = healthy
        return _said(*changes, _total(len(last), sum(last.values())), MOST_NAMES)


# --- the start lines ----------------------------------------------------------


CONFIG_NAMES = {  # ResourceConfig field -> its name in config.json
    "include": "include-devices",
    "exclude": "exclude-devices",
    "strategy": "discovery-strategy",
    "allow_host_used": "allow-host-used-devices",
}


def setting_name(field_name: str) -> str:
    """A ResourceConfig field's name in config.json."""
    return CONFIG_NAMES.get(field_name, field_name.replace("_", "-"))


def setting_value(field_name: str, value: Any) -> str:
    """A setting's value as an operator writes it in config.json terms."""
    if value is None:
        return "unset"
    if field_name == "device_mode":
        return f"{value:04o}"
    if field_name == "match_properties":
        return "{" + ", ".join(f"{k}: {'|'.join(g)}" for k, g in value) + "}"
    if field_name == "upper_limit" and value == 0:
        return "0 (one unit per device)"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return "[" + ", ".join(map(str, value)) + "]"
    if isinstance(value, float) and value.is_integer():
        return f"{int(value)}s" if "interval" in field_name else str(int(value))
    return str(value)


def describe_resource(resource: Any) -> str:
    """Every setting of a resource (a dataclass), by its config.json name."""
    shown = []
    for item in fields(resource):
        if item.name in ("name", "socket"):
            continue
        value = getattr(resource, item.name)
        if value is None or (item.name == "match_properties" and not value):
            continue  # not set: nothing to say (device-uid, device-gid, ...)
        if item.name == "api" and value == "device-plugin":
            continue  # the default, and what every resource did before DRA
        if item.name == "whole_disks" and not value:
            continue  # the default, and DRA's only
        if item.name == "scope" and value == "node":
            continue  # the default: the node's own pool
        if item.name == "shared" and not value:
            continue  # the default, and a cluster scope's only
        shown.append(f"{setting_name(item.name)} {setting_value(item.name, value)}")
    return ", ".join(shown)


def describe_changes(old: Any, new: Any) -> str:
    """The settings that differ between two configs of a resource, in
    config.json words: `permissions rw -> r, device-uid unset -> 0`."""
    return ", ".join(
        f"{setting_name(item.name)} {setting_value(item.name, getattr(old, item.name))} -> "
        f"{setting_value(item.name, getattr(new, item.name))}"
        for item in fields(new)
        if getattr(old, item.name) != getattr(new, item.name)
    )


EVENT_SOURCES = {
    "kernel": "kernel uevents (netlink)",
    "udev": "udev events (netlink)",
    "off": "no uevents (--uevents off)",
    "caller": "a source given by the caller",
}


def bound_address(sock: socket.socket) -> str:
    """A bound TCP socket's address as an operator writes it (IPv6 in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def start_lines(settings: Any, config: Any, events: str) -> list[str]:
    """The version, where the config came from, the event sources, the
    metrics port; then each resource's socket and every effective setting."""
    source = config.source  # says "(missing: defaults)" itself when the file is missing
    watched = (
        "" if events == "caller" else " + inotify on the device directories + host mount changes"
    )
    port = settings.metrics_socket
    lines = [
        f"powerdev {__version__} starting: config {source}; "
        f"events: {EVENT_SOURCES.get(events, events)}{watched}; "
        f"/metrics, /healthz, /readyz: {bound_address(port) if port else 'off'}"
    ]
    for resource in config.resources:
        lines.append(
            f"{resource.name}: socket {settings.plugin_dir / resource.socket}; "
            f"{describe_resource(resource)}"
        )
    return lines


def log_start(settings: Any, config: Any, events: str) -> None:
    for line in start_lines(settings, config, events):
        log.info("%s", line)


# --- Allocate refusals, rate-limited -------------------------------------------


@dataclass
class _Bucket:
    tokens: float
    stamp: float
    left_out: int = 0


class RefusalLog:
    """Logs each refusal, up to REFUSAL_BURST at once and then one per
    REFUSAL_PERIOD for each (resource, reason); a logged line says how many
    were left out since the last one."""

    def __init__(self, burst: int = REFUSAL_BURST, period: float = REFUSAL_PERIOD) -> None:
        self.burst = burst
        self.period = period
        self._buckets: dict[tuple[str, str], _Bucket] = {}

    def line(
        self, resource: str, reason: str, requests: Sequence[Sequence[str]], error: str, now: float
    ) -> str | None:
        bucket = self._buckets.setdefault((resource, reason), _Bucket(self.burst, now))
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.stamp) / self.period)
        bucket.stamp = now
        if bucket.tokens < 1:
            bucket.left_out += 1
            return None
        bucket.tokens -= 1
        asked = "; ".join(", ".join(ids) or "(none)" for ids in requests) or "(none)"
        if len(asked) > 300:
            asked = asked[:300] + "..."
        text = (
            f"{resource}: Allocate refused ({reason}) for requested IDs [{asked}]: {error}; "
            f"the kubelet fails the pod with UnexpectedAdmissionError"
        )
        if bucket.left_out:
            text += f" ({plural(bucket.left_out, 'similar refusal')} not logged before this one)"
            bucket.left_out = 0
        return text


_refusals = RefusalLog()


def refusal(resource: str, reason: str, requests: Sequence[Sequence[str]], error: str) -> None:
    text = _refusals.line(resource, reason, requests, error, time.monotonic())
    if text is not None:
        log.warning("%s", text)
