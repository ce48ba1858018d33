"""LUNs that several nodes see ("scope": "cluster"), as plain data: what a
node reports of them, and how the reports of every node merge into one
cluster pool. Pure functions; lun_report.py (the node side) and
lun_controller.py (`powerdev luns`, the one writer of the cluster pool)
move these bodies to and from the API server.

A node reports each unit of the resource that has an identity (a
multipath map's DM UUID, a disk's WWN) and at least one working path, in
a ConfigMap of its own (report_body): the unit's device name (the same on
every node, since it is made from the identity: names.device_name), the
identity, how many paths work, its size, vendor and model. A unit with no
working path, host-used or otherwise unhealthy is not reported: the node
leaves that LUN's selection.

merge() makes one device per LUN of the live reports, whose nodeSelector
names exactly the nodes that report it (by their kubernetes.io/hostname
label). A LUN whose size, vendor or model
differs between nodes is merged only over the nodes that agree with the
most others; the rest are conflicts (said, not merged); a tie merges
nobody. A resource whose every node says "shared": true has devices
that may be allocated to several claims at once (allowMultipleAllocations).
cluster_slices() places the devices in the pool's slices, with
perDeviceNodeSelection, each LUN kept in its slice across changes.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from powerdev.devices.condition import FAILED, FINE, STATES, Condition
from powerdev.devices.model import Device
from powerdev.dra.names import byte_quantity, pool_name
from powerdev.dra.placement import CLUSTER_POOL, place

REPORT_LABEL = "powerdev.io/lun-report"  # on every node's report ConfigMap
REPORT_VERSION = "1"  # the label's value: the form of the report's data
MAX_STRING = 64  # a string attribute's longest value
_NOT_LABEL = re.compile(r"[^a-z0-9-]")
_WORKING = {state for state, level in STATES.items() if level == FINE}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:8]


def cluster_pool_name(resource_name: str) -> str:
    """The resource's one cluster pool: "cluster/luns/<resource name>". A
    node's pool is "<node>/<resource name>", two slashes (a resource name
    has one, a node name none): three never name a node's."""
    return f"cluster/luns/{resource_name}"


def pool_of(node: str, resource: Any) -> str:
    """The pool a resource's devices are allocated from (a ResourceConfig):
    the cluster pool with "scope": "cluster", else the node's own."""
    if resource.cluster:
        return cluster_pool_name(resource.name)
    return pool_name(node, resource.name)


def cluster_slice_name(driver: str, resource_name: str, index: int) -> str:
    readable = _NOT_LABEL.sub("-", f"luns-{resource_name}".lower()).strip("-")[:200]
    return f"{readable}-{_digest(f'{driver}/cluster/{resource_name}')}-{index}"


def report_name(node: str, driver: str, resource_name: str) -> str:
    """The ConfigMap a node reports a resource's LUNs in."""
    readable = _NOT_LABEL.sub("-", f"luns-{node}-{resource_name}".lower()).strip("-")[:200]
    return f"{readable}-{_digest(f'{driver}/{node}/{resource_name}')}"


@dataclass(frozen=True)
class Sighting:
    """One LUN as one node sees it."""

    device: str  # its name in the cluster pool (from its identity)
    identity: str  # "SOURCE=value"
    paths: int  # working paths on the node
    size: int | None = None
    vendor: str | None = None
    model: str | None = None

    def what(self) -> tuple[str, int | None, str | None, str | None]:
        """What must be the same on every node for it to be one LUN."""
        return (self.identity, self.size, self.vendor, self.model)

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "identity": self.identity,
            "paths": self.paths,
            "size": self.size,
            "vendor": self.vendor,
            "model": self.model,
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Sighting:
        """Raises ValueError for a value that is not a sighting."""
        try:
            device, identity, paths = value["device"], value["identity"], value["paths"]
        except (KeyError, TypeError) as err:
            raise ValueError(f"a LUN without {err}") from None
        if not (isinstance(device, str) and isinstance(identity, str) and isinstance(paths, int)):
            raise ValueError("device and identity must be strings, paths a number")
        size, vendor, model = value.get("size"), value.get("vendor"), value.get("model")
        if size is not None and not isinstance(size, int):
            raise ValueError("size must be a number")
        for text in (vendor, model):
            if text is not None and not isinstance(text, str):
                raise ValueError("vendor and model must be strings")
        return cls(device, identity, paths, size, vendor, model)


def working_paths(condition: Condition) -> int:
    """A device's working paths: those of its multipath map or NVMe
    namespace that run; a device without paths (a plain disk) has one
    unless it has failed."""
    if condition.paths:
        return sum(1 for _, state in condition.paths if state in _WORKING)
    return 0 if condition.level == FAILED else 1


def sightings(
    units: Mapping[str, Sequence[Device]],
    condition_of: Any,
    device_name: Any,
) -> list[Sighting]:
    """What a node reports of a resource's units (unit ID -> its names):
    those with an identity, every name healthy, and a working path."""
    found = []
    for unit_id, names in units.items():
        first = names[0]
        if not first.identity or not all(d.healthy for d in names):
            continue
        paths = working_paths(condition_of(first))
        if paths < 1:
            continue
        facts = first.facts
        found.append(
            Sighting(
                device=device_name(unit_id),
                identity=first.identity,
                paths=paths,
                size=facts.size if facts is not None else None,
                vendor=facts.vendor if facts is not None else None,
                model=facts.model if facts is not None else None,
            )
        )
    return sorted(found, key=lambda s: s.device)


def report_body(
    namespace: str,
    node: str,
    driver: str,
    resource_name: str,
    found: Sequence[Sighting],
    heartbeat: int,
    shared: bool = False,
) -> dict[str, Any]:
    """The node's report of a resource, as a ConfigMap. `heartbeat` changes
    at every write, so the controller sees the node alive; `shared`: the
    node's config says "shared": true for the resource."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": report_name(node, driver, resource_name),
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "powerdev", REPORT_LABEL: REPORT_VERSION},
        },
        "data": {
            "node": node,
            "driver": driver,
            "resource": resource_name,
            "heartbeat": str(heartbeat),
            "shared": "true" if shared else "false",
            "luns": json.dumps([s.to_json() for s in found], separators=(",", ":")),
        },
    }


@dataclass(frozen=True)
class Report:
    node: str
    driver: str
    resource: str
    luns: tuple[Sighting, ...]
    shared: bool = False


def parse_report(body: Mapping[str, Any]) -> Report:
    """A report ConfigMap's data; ValueError says what is wrong with it."""
    data = body.get("data") or {}
    try:
        node, driver, resource = data["node"], data["driver"], data["resource"]
    except KeyError as err:
        raise ValueError(f"its data has no {err}") from None
    try:
        luns = json.loads(data.get("luns", "[]"))
    except ValueError as err:
        raise ValueError(f"its luns are not JSON ({err})") from None
    if not isinstance(luns, list):
        raise ValueError("its luns are not a list")
    shared = data.get("shared", "false")
    if shared not in ("true", "false"):
        raise ValueError(f'its shared is {shared!r}, not "true" or "false"')
    sighted = tuple(Sighting.from_json(v) for v in luns)
    return Report(node, driver, resource, sighted, shared == "true")


@dataclass(frozen=True)
class Conflict:
    """A node that sees a LUN's identity as something else than the others."""

    device: str
    node: str
    seen: tuple[str, int | None, str | None, str | None]
    others: tuple[str, ...]  # the nodes merged, empty: a tie, nobody merged
    agreed: tuple[str, int | None, str | None, str | None] | None

    def describe(self) -> str:
        def what(w: tuple[str, int | None, str | None, str | None]) -> str:
            return f"{w[0]} size {w[1]} vendor {w[2]!r} model {w[3]!r}"

        if self.agreed is None:
            return (
                f"LUN {self.device}: node {self.node} sees {what(self.seen)}, and as many other "
                "nodes see it otherwise: not published until the nodes agree (check the "
                "SAN's mapping: one WWID must be one LUN)"
            )
        return (
            f"LUN {self.device}: node {self.node} sees {what(self.seen)}, but "
            f"{', '.join(self.others)} see {what(self.agreed)}: node {self.node} is left out "
            "of its selection (check the SAN's mapping to that node)"
        )


def wwid_of(identity: str) -> str | None:
    """The WWID an identity says: a multipath map's DM UUID "mpath-<wwid>",
    or a disk's WWN."""
    source, _, value = identity.partition("=")
    if source == "DM_UUID":
        return value.removeprefix("mpath-") if value.startswith("mpath-") else None
    if source in ("WWID", "ID_WWN"):
        return value or None
    return None


HOSTNAME_LABEL = "kubernetes.io/hostname"


@dataclass(frozen=True)
class NodeSeen:
    """What the cluster pool needs of a Node: its kubernetes.io/hostname
    label (what a LUN's node selection names) and whether it is Ready."""

    label: str | None
    ready: bool


def node_seen(body: Mapping[str, Any]) -> NodeSeen:
    """A Node's label and readiness: Ready only with a Ready condition whose
    status is "True" (a node just registered has none yet; the node
    lifecycle controller sets it "Unknown" once the kubelet goes silent)."""
    labels = (body.get("metadata") or {}).get("labels") or {}
    conditions = (body.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return NodeSeen(labels.get(HOSTNAME_LABEL), ready)


def merge(
    resource_name: str, reports: Iterable[Report], hostnames: Mapping[str, str]
) -> tuple[list[dict[str, Any]], list[Conflict]]:
    """The cluster pool's devices for the resource from the live reports,
    sorted by name, and the conflicts. A device's nodeSelector names its
    nodes by their kubernetes.io/hostname label (`hostnames`: node name ->
    its label; a node without one is not selected): a node field selector
    (matchFields on metadata.name) takes one value only, and the allocator
    takes a selector of one term only."""
    seen: dict[str, dict[str, Sighting]] = {}
    mine = [r for r in reports if r.resource == resource_name]
    shared = sharing(mine)
    for report in mine:
        for s in report.luns:
            seen.setdefault(s.device, {})[report.node] = s
    devices, conflicts = [], []
    for name in sorted(seen):
        by_what: dict[tuple[str, int | None, str | None, str | None], list[str]] = {}
        for node, s in sorted(seen[name].items()):
            by_what.setdefault(s.what(), []).append(node)
        ranked = sorted(by_what.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        tie = len(ranked) > 1 and len(ranked[0][1]) == len(ranked[1][1])
        agreed, nodes = (None, []) if tie else ranked[0]
        for what, group in ranked:
            if what == agreed:
                continue
            for node in group:
                conflicts.append(Conflict(name, node, what, tuple(nodes), agreed))
        if agreed is None:
            continue
        labels = sorted({hostnames[n] for n in nodes if n in hostnames})
        if labels:
            devices.append(_device(resource_name, name, seen[name][nodes[0]], labels, shared))
    return devices, conflicts


def sharing(reports: Sequence[Report]) -> bool:
    """Whether a resource's LUNs are shared: when every node that reports
    it says so. One node whose config says otherwise keeps them to one
    claim at a time (the safe side: a LUN handed to two claims cannot be
    taken back from one)."""
    return bool(reports) and all(r.shared for r in reports)


def sharing_conflict(resource_name: str, reports: Iterable[Report]) -> str | None:
    """What to say when some nodes report the resource shared and others
    not; None when they agree."""
    mine = [r for r in reports if r.resource == resource_name]
    apart = sorted(r.node for r in mine if not r.shared)
    if not apart or len(apart) == len(mine):
        return None
    return (
        f'nodes {", ".join(apart)} do not say "shared": true for it as the others do: its '
        "LUNs go to one claim at a time until every node's config.json says the same"
    )


def _device(
    resource_name: str, name: str, s: Sighting, hosts: Sequence[str], shared: bool = False
) -> dict[str, Any]:
    attributes: dict[str, dict[str, Any]] = {
        "resource": {"string": resource_name},
        "kind": {"string": "block"},
    }
    wwid = wwid_of(s.identity)
    for key, text in (("wwid", wwid), ("vendor", s.vendor), ("model", s.model)):
        if text and len(text) <= MAX_STRING:
            attributes[key] = {"string": text}
    device: dict[str, Any] = {
        "name": name,
        "attributes": attributes,
        "nodeSelector": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": HOSTNAME_LABEL, "operator": "In", "values": list(hosts)}
                    ]
                }
            ]
        },
    }
    if s.size is not None:
        device["capacity"] = {"size": {"value": byte_quantity(s.size)}}
        if shared:
            # A claim that asks for no part of the size consumes none of it
            # (unset, it would consume all of it: one claim again).
            device["capacity"]["size"]["requestPolicy"] = {"default": "0"}
    if shared:
        device["allowMultipleAllocations"] = True
    # The claim's allocation names the one node it was allocated for, so the
    # pods that share one claim all run there.
    device["bindsToNode"] = True
    return device


def cluster_slices(
    driver: str,
    resource_name: str,
    devices: Sequence[dict[str, Any]],
    generation: int,
    slots: Mapping[str, int] | None = None,
    count: int = 0,
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The cluster pool's slices at a generation (at least one, even empty),
    and each device's slice: where `slots` had it in a pool of `count`
    slices (placement.place; 0: packed anew), so that a change of one LUN
    is a change of one slice."""
    placed, count = place(dict(slots or {}), count, devices, CLUSTER_POOL)
    groups: list[list[dict[str, Any]]] = [[] for _ in range(count)]
    for device in devices:
        groups[placed[device["name"]]].append(device)
    bodies = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {
                "name": cluster_slice_name(driver, resource_name, i),
                "labels": {"app.kubernetes.io/managed-by": "powerdev"},
            },
            "spec": {
                "driver": driver,
                "perDeviceNodeSelection": True,
                "pool": {
                    "name": cluster_pool_name(resource_name),
                    "generation": generation,
                    "resourceSliceCount": count,
                },
                "devices": group,
            },
        }
        for i, group in enumerate(groups)
    ]
    return bodies, placed
