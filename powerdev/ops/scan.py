"""`powerdev scan`: what each resource of a config would advertise on this
host, and every candidate left out with the reason. It reads the config and
the host's /dev and /sys; it needs no kubelet and changes nothing.

The same functions the daemon uses decide (patterns, probe, control nodes,
udev properties, identities, the host-use guard); this module only asks
them one at a time, so it can say which one said no. Host use is one look
at the host for the whole scan (HostUseGuard.survey), asked per device as
the daemon's screen asks it, so the reasons are the ones the daemon logs.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from powerdev.config import Config, ResourceConfig
from powerdev.devices import gomatch, identity
from powerdev.devices.discovery import control_allowed, probe
from powerdev.devices.inuse import HostUse, HostUseGuard
from powerdev.devices.model import Device
from powerdev.devices.udevdb import UdevDatabase
from powerdev.resources.matching import (
    candidates,
    describe,
    properties_match,
    start_warnings,
    why_nothing,
)
from powerdev.resources.tracker import EACH_DISK_WITH_PARTITIONS


@dataclass
class Report:
    resource: str
    allocation: str
    api: str = "device-plugin"
    advertised: list[Device] = field(default_factory=list)
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (host path, why)


def warnings(config: Config, reports: list[Report], dev_root: Path, sys_root: Path) -> list[str]:
    """Every warning `powerdev run` gives at start for this config on this
    host, in its order and words: the config file's, each resource's before
    it scans, and each resource that advertises nothing, with why."""
    said = list(config.warnings)
    for resource, report in zip(config.resources, reports, strict=True):
        said += start_warnings(resource, dev_root)
        if not report.advertised:
            why = why_nothing(resource, dev_root, sys_root)
            said.append(f"{resource.name}: advertises no device: {why}")
    return said


def scan(
    config: Config,
    dev_root: Path,
    sys_root: Path,
    udev: UdevDatabase | None,
    guard: HostUseGuard | None,
) -> list[Report]:
    reports = []
    claimed: dict[str, str] = {}  # host path -> the resource that lists it
    use = guard.survey() if guard is not None else None
    for resource in config.resources:
        report = Report(resource.name, resource.allocation, resource.api)
        for path in sorted(dict.fromkeys(candidates(resource, dev_root, sys_root))):
            device, why = _judge(resource, path, dev_root, sys_root, udev, use)
            if device is not None and path in claimed:
                device, why = None, f"held by another resource, {claimed[path]}"
            if device is None:
                report.left_out.append((path, why))
            else:
                claimed[path] = resource.name
                report.advertised.append(device)
        reports.append(report)
    return reports


def _judge(
    resource: ResourceConfig,
    path: str,
    dev_root: Path,
    sys_root: Path,
    udev: UdevDatabase | None,
    use: HostUse | None,
) -> tuple[Device | None, str]:
    for pattern in resource.exclude:
        if gomatch.match(pattern, path):
            return None, f"excluded by {pattern!r}"
    device = probe(dev_root, path)
    if device is None:
        return None, "not a character or block device node"
    if not control_allowed(device, resource.include, sys_root):
        return None, "a control node (it creates or removes host devices): name it literally"
    number = (device.major, device.minor)
    if resource.match_properties:
        props = identity.properties(sys_root, udev, device.kind, number)
        if not properties_match(resource.match_properties, props):
            wanted = ", ".join(f"{k}={'|'.join(g)}" for k, g in resource.match_properties)
            have = ", ".join(f"{k}={props.get(k, '(none)')}" for k, _ in resource.match_properties)
            return None, f"properties {have} do not match {wanted}"
    if use is not None and not resource.allow_host_used:
        why = use.reason(device)
        if why is not None:
            return None, f"the host uses it: {why}"
    described = describe(resource, device, sys_root, udev, with_identity=True)
    if described is not None and resource.allocation == "each" and described.has_partitions:
        return None, EACH_DISK_WITH_PARTITIONS
    return described, ""


_THROUGH = {"dra": ", through DRA", "both": ", through the device plugin API and DRA"}


def as_text(reports: list[Report]) -> str:
    lines = []
    for report in reports:
        count = len(report.advertised)
        how = report.allocation + _THROUGH.get(report.api, "")
        lines.append(f"{report.resource} ({how}): {count} device{'' if count == 1 else 's'}")
        for d in report.advertised:
            lines.append(
                f"  {d.id}  {d.path}  {d.kind} {d.major}:{d.minor}  "
                f"identity {d.identity or '-'}  numa {'-' if d.numa is None else d.numa}  "
                f"{'Healthy' if d.healthy else 'Unhealthy'}"
            )
        for path, why in report.left_out:
            lines.append(f"  left out: {path}: {why}")
    return "\n".join(lines)


def as_json(reports: list[Report]) -> str:
    return json.dumps(
        [
            {
                "resource": r.resource,
                "allocation": r.allocation,
                "api": r.api,
                "advertised": [asdict(d) for d in r.advertised],
                "left_out": [{"path": p, "reason": why} for p, why in r.left_out],
            }
            for r in reports
        ],
        indent=2,
    )
