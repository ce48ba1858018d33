"""`powerdev scan`: what each resource of a config would advertise on this
host, each device's family, and every candidate left out with the reason.
It reads the config and the host's /dev and /sys; it needs no kubelet and
changes nothing.

It asks what the daemon asks, of one look at the host: the node's device
table (devices/table.py: names, identities, families, host use, read once
for the whole scan) and the one verdict (resources/verdict.py), with a
ledger of the listings of the resources before (one device, one
resource). Only the reasons the verdict cannot give (a pattern that
excludes the name, a name that is not a device node, properties that do
not match) are said here, before it is asked.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from powerdev.config import Config, ResourceConfig
from powerdev.devices import gomatch
from powerdev.devices.condition import UNWATCHED, Condition
from powerdev.devices.family import Key
from powerdev.devices.model import Device
from powerdev.devices.table import DeviceTable, HostFiles
from powerdev.devices.udevdb import UdevDatabase
from powerdev.resources import families
from powerdev.resources.matching import (
    candidates,
    describe,
    literal_only,
    properties_match,
    shared_id,
    start_warnings,
    wanted_key,
    why_nothing,
)
from powerdev.resources.ownership import Ledger
from powerdev.resources.verdict import UNHEALTHY, Case, judge


@dataclass
class Report:
    resource: str
    allocation: str
    api: str = "device-plugin"
    advertised: list[Device] = field(default_factory=list)
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (host path, why)
    # host path -> the names of its family: "same", "below", "above"
    families: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    # host path -> what the device says of its health (condition.py)
    conditions: dict[str, Condition] = field(default_factory=dict)


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
    host: HostFiles | None,
) -> list[Report]:
    table = DeviceTable(dev_root, sys_root, udev=udev, host=host)
    looked = [sorted(dict.fromkeys(candidates(r, dev_root, sys_root))) for r in config.resources]
    table.look(p for paths in looked for p in paths)
    ledger = Ledger(table)
    reports = []
    for resource, paths in zip(config.resources, looked, strict=True):
        report = Report(resource.name, resource.allocation, resource.api)
        listed: dict[Key, str] = {}
        for path in paths:
            device, why = _judge(resource, path, table, ledger)
            if device is None:
                report.left_out.append((path, why))
                continue
            report.advertised.append(device)
            report.families[path] = _family(table, device.key)
            report.conditions[path] = table.facts(device.key).condition
            listed.setdefault(device.key, path)
        for key, path in listed.items():
            ledger.add_listing(resource.name, key, path)
        if resource.dra:
            _apart(report, table, resource.whole_disks)
        if resource.allocation != "each" and resource.upper_limit <= 0:
            _share_ids(report, table)
        reports.append(report)
    return reports


def _apart(report: Report, table: DeviceTable, counted: bool) -> None:
    """A DRA pool's devices that share blocks with others of it: with
    "whole-disks" counted (published), else the ones the pool leaves out
    (resources/families.py), moved to left_out with the reason."""
    members = {d.id: d.key for d in report.advertised if table.overlapping(d.key)}
    if not members:
        return
    paths = {d.id: d.path for d in reversed(report.advertised)}
    found = families.plan(
        members,
        table.overlapping,
        table.relation,
        counters=counted,
        apart=families.APART,
        shown=paths.__getitem__,
    )
    kept = []
    for device in report.advertised:
        why = found.left_out.get(device.id)
        if why is None:
            kept.append(device)
        else:
            report.left_out.append((device.path, f"DRA: {why}"))
    report.advertised = kept


def _share_ids(report: Report, table: DeviceTable) -> None:
    """ "all" mode: every name of one device is one unit, with one ID."""
    names: dict[Key, list[str]] = {}
    for device in report.advertised:
        names.setdefault(device.key, []).append(device.path)
    ids = {k: shared_id(v, table.facts(k).kernel_name) for k, v in names.items()}
    report.advertised = [replace(d, id=ids[d.key]) for d in report.advertised]


def _judge(
    resource: ResourceConfig, path: str, table: DeviceTable, ledger: Ledger
) -> tuple[Device | None, str]:
    for pattern in resource.exclude:
        if gomatch.match(pattern, path):
            return None, f"excluded by {pattern!r}"
    key = table.key_of(path)
    if key is None or not wanted_key(resource, path, key):
        return None, "not a character or block device node"
    if resource.match_properties:
        props = table.properties(key)
        if not properties_match(resource.match_properties, props):
            wanted = ", ".join(f"{k}={'|'.join(g)}" for k, g in resource.match_properties)
            have = ", ".join(f"{k}={props.get(k, '(none)')}" for k, _ in resource.match_properties)
            return None, f"properties {have} do not match {wanted}"
    facts = table.facts(key)
    device = describe(resource, key, path, table)
    case = Case(
        literal_only=literal_only(resource, path, key, table),
        host_use=facts.host_use,
        allow_host_used=resource.allow_host_used,
        each=resource.partitions_only,
        has_partitions=facts.has_partitions,
        no_medium=facts.no_medium,
        failed=facts.condition.why if facts.condition.failed else None,
        rivals=ledger.rivals(resource.name, key, path),
    )
    verdict = judge(case, listed=False)
    if verdict.state == UNHEALTHY:  # listed, and granted to nobody
        return replace(device, healthy=False), verdict.reason
    if not verdict.offered:
        return None, verdict.reason
    return device, ""


def _family(table: DeviceTable, key: Key) -> dict[str, list[str]]:
    facts = table.facts(key)
    found: dict[str, list[str]] = {}
    for how, keys in (
        ("same", facts.family.same | (table.overlapping(key) - facts.family.overlapping)),
        ("below", facts.family.below),
        ("above", facts.family.above),
    ):
        if keys:
            found[how] = sorted(_name(table, k) for k in keys)
    return found


def _name(table: DeviceTable, key: Key) -> str:
    names = table.names(key)
    if names:
        return names[0].removeprefix("/dev/")
    facts = table.facts(key)
    if facts.kernel_name:
        return facts.kernel_name
    return f"{'block' if key[0] == 'b' else 'char'} {key[1]}:{key[2]}"


_THROUGH = {"dra": ", through DRA", "both": ", through the device plugin API and DRA"}
_HOW = {"same": "the same storage", "below": "lies on", "above": "under it"}


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
            condition = report.conditions.get(d.path)
            if condition is not None and not condition.fine:
                lines.append(f"    {condition.describe()}")
            if condition is not None and condition.paths:
                counts = ", ".join(f"{n} {state}" for state, n in condition.path_counts().items())
                lines.append(f"    paths: {counts}")
            family = report.families.get(d.path)
            if family:
                said = "; ".join(f"{_HOW[k]} {', '.join(v)}" for k, v in family.items())
                lines.append(f"    family: {said}")
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
                "advertised": [
                    {
                        **asdict(d),
                        "family": r.families.get(d.path, {}),
                        "condition": _condition(r.conditions.get(d.path, UNWATCHED)),
                    }
                    for d in r.advertised
                ],
                "left_out": [{"path": p, "reason": why} for p, why in r.left_out],
            }
            for r in reports
        ],
        indent=2,
    )


def _condition(condition: Condition) -> dict[str, object]:
    said: dict[str, object] = {"level": condition.level}
    if condition.why:
        said["why"] = condition.why
    if condition.paths:
        said["paths"] = condition.path_counts()
    return said
