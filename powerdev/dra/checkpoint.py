"""The DRA driver's checkpoint (<plugins dir>/<driver>/checkpoint.json) as
typed records: what each prepared claim holds (HeldClaim, HeldDevice),
read and checked field by field when the file is loaded, and written back
as the same JSON. dra/claims.py owns the records; this module only says
what a well-formed entry is.

An entry that does not parse is not dropped: parse_entry() raises
EntryError, which names the field, and claims.py sets the entry aside,
keeps it verbatim in the file and holds whatever devices it can still
read from it (salvage_keys), so that its devices are not handed to
anyone else until the kubelet unprepares the claim or prepares it anew.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from powerdev.devices.family import Key

VERSION = 1
KINDS = ("b", "c")


class EntryError(ValueError):
    """One entry of the checkpoint cannot be read: str() names the field."""


@dataclass
class HeldDevice:
    """One device of a prepared claim, as the kubelet was told it."""

    requests: list[str]
    pool: str
    device: str
    cdi_ids: list[str]
    resource: str | None = None  # None: a checkpoint of a powerdev before the ledger
    unit: str | None = None
    admin: bool = False
    keys: list[Key] = field(default_factory=list)
    identity: str | None = None
    gone: str | None = None  # why it was not written back at start
    share_id: str | None = None  # which allocation of a device shared by several
    shared: bool = False  # prepared as a shared resource's: held with the claims that share it

    @property
    def cdi_name(self) -> str:
        """Its device's name in the claim's CDI spec."""
        return self.cdi_ids[0].rpartition("=")[2]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requests": self.requests,
            "pool": self.pool,
            "device": self.device,
            "cdi_ids": self.cdi_ids,
            "admin": self.admin,
            "keys": [list(k) for k in self.keys],
            "identity": self.identity,
        }
        if self.resource is not None:
            out["resource"] = self.resource
        if self.unit is not None:
            out["unit"] = self.unit
        if self.gone is not None:
            out["gone"] = self.gone
        if self.share_id is not None:
            out["share_id"] = self.share_id
        if self.shared:
            out["shared"] = True
        return out


@dataclass
class HeldClaim:
    """A prepared claim: its name, the boot it was prepared in, the CDI spec
    written for it (a CDI document, kept as JSON: it is written as it is)
    and its devices."""

    namespace: str
    name: str
    boot_id: str | None
    spec: dict[str, Any]
    devices: list[HeldDevice]
    says_boot: bool = True  # False: an older powerdev's entry, which had no boot_id

    def spec_devices(self) -> dict[str, dict[str, Any]]:
        return {d["name"]: d for d in self.spec["devices"]}

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "boot_id": self.boot_id,
            "spec": self.spec,
            "devices": [d.to_json() for d in self.devices],
        }


def parse_entry(value: object) -> HeldClaim:
    """A claim's entry, checked field by field; EntryError names the first
    field that is missing or of the wrong type."""
    entry = _mapping(value, "the entry")
    devices = _list(entry, "devices", "the entry")
    spec = _mapping(entry.get("spec", _MISSING), '"spec"')
    _check_spec(spec)
    held = HeldClaim(
        namespace=_string(entry, "namespace", "the entry"),
        name=_string(entry, "name", "the entry"),
        boot_id=_optional_string(entry, "boot_id", "the entry"),
        spec=spec,
        devices=[_device(d, f'"devices"[{i}]') for i, d in enumerate(devices)],
        says_boot="boot_id" in entry,
    )
    names = set(held.spec_devices())
    for i, d in enumerate(held.devices):
        if d.gone is None and d.cdi_name not in names:
            raise EntryError(
                f'"devices"[{i}]: its CDI name {d.cdi_name!r} is not a device of "spec"'
            )
    return held


def salvage_keys(value: object) -> list[tuple[str | None, str | None, list[Key]]]:
    """From an entry that does not parse, each device it still says something
    of: (resource, unit, its device numbers), read field by field, whatever
    else is wrong; what cannot be read is skipped."""
    found: list[tuple[str | None, str | None, list[Key]]] = []
    entry = value if isinstance(value, dict) else {}
    devices = entry.get("devices")
    admin: set[Key] = set()  # what the claim reaches with admin access: it holds none
    for d in devices if isinstance(devices, list) else ():
        if not isinstance(d, dict):
            continue
        listed = d.get("keys")
        keys: list[Key] = (
            [(k[0], k[1], k[2]) for k in listed if _is_key(k)] if isinstance(listed, list) else []
        )
        if d.get("admin") is True:
            admin.update(keys)
            continue
        resource = d.get("resource") if isinstance(d.get("resource"), str) else None
        unit = d.get("unit") if isinstance(d.get("unit"), str) else None
        if keys:
            found.append((resource, unit, keys))
    spec = entry.get("spec")
    named = [k for k in spec_keys(spec) if k not in admin]
    found.extend((None, None, keys) for keys in [named] if keys)
    return found


def spec_keys(spec: object) -> list[Key]:
    """The device numbers a CDI spec (or what is left of one) names."""
    keys: set[Key] = set()
    devices = spec.get("devices") if isinstance(spec, dict) else None
    for d in devices if isinstance(devices, list) else ():
        edits = d.get("containerEdits") if isinstance(d, dict) else None
        nodes = edits.get("deviceNodes") if isinstance(edits, dict) else None
        for n in nodes if isinstance(nodes, list) else ():
            if isinstance(n, dict) and _is_key([n.get("type"), n.get("major"), n.get("minor")]):
                keys.add((n["type"], n["major"], n["minor"]))
    return sorted(keys)


def _device(value: object, where: str) -> HeldDevice:
    d = _mapping(value, where)
    cdi_ids = _strings(d, "cdi_ids", where)
    if not cdi_ids:
        raise EntryError(f'{where}: "cdi_ids" is empty')
    keys = d.get("keys", [])
    if not isinstance(keys, list) or not all(_is_key(k) for k in keys):
        raise EntryError(f'{where}: "keys" must be a list of [kind ("b" or "c"), major, minor]')
    admin = d.get("admin", False)
    if not isinstance(admin, bool):
        raise EntryError(f'{where}: "admin" must be true or false')
    share_id = _optional_string(d, "share_id", where)
    # before "shared" was written: a shareID is a shared allocation, unless
    # admin access (which never holds)
    shared = d.get("shared", share_id is not None and not admin)
    if not isinstance(shared, bool):
        raise EntryError(f'{where}: "shared" must be true or false')
    resource = _optional_string(d, "resource", where)
    unit = _optional_string(d, "unit", where)
    if (resource is None) != (unit is None):
        raise EntryError(f'{where}: "resource" and "unit" go together; one is missing')
    return HeldDevice(
        requests=_strings(d, "requests", where),
        pool=_string(d, "pool", where),
        device=_string(d, "device", where),
        cdi_ids=cdi_ids,
        resource=resource,
        unit=unit,
        admin=admin,
        keys=[(k[0], k[1], k[2]) for k in keys],
        identity=_optional_string(d, "identity", where),
        gone=_optional_string(d, "gone", where),
        share_id=share_id,
        shared=shared,
    )


def _check_spec(spec: dict[str, Any]) -> None:
    for i, d in enumerate(_list(spec, "devices", '"spec"')):
        where = f'"spec"."devices"[{i}]'
        d = _mapping(d, where)
        _string(d, "name", where)
        edits = _mapping(d.get("containerEdits", _MISSING), f'{where}."containerEdits"')
        nodes = _list(edits, "deviceNodes", f'{where}."containerEdits"')
        for j, n in enumerate(nodes):
            at = f'{where}."containerEdits"."deviceNodes"[{j}]'
            n = _mapping(n, at)
            _string(n, "hostPath", at)
            if not _is_key([n.get("type"), n.get("major"), n.get("minor")]):
                raise EntryError(f'{at}: "type" must be "b" or "c", "major" and "minor" numbers')


def _is_key(value: object) -> bool:
    return (
        isinstance(value, list | tuple)
        and len(value) == 3
        and value[0] in KINDS
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value[1:])
    )


def _mapping(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise EntryError(f"{where} must be an object, not {_kind(value)}")
    return value


def _list(entry: dict[str, Any], name: str, where: str) -> list[Any]:
    value = entry.get(name, _MISSING)
    if not isinstance(value, list):
        raise EntryError(f'{where}: "{name}" must be a list, not {_kind(value)}')
    return value


def _string(entry: dict[str, Any], name: str, where: str) -> str:
    value = entry.get(name, _MISSING)
    if not isinstance(value, str):
        raise EntryError(f'{where}: "{name}" must be a string, not {_kind(value)}')
    return value


def _optional_string(entry: dict[str, Any], name: str, where: str) -> str | None:
    value = entry.get(name)
    if value is not None and not isinstance(value, str):
        raise EntryError(f'{where}: "{name}" must be a string or null, not {_kind(value)}')
    return value


def _strings(entry: dict[str, Any], name: str, where: str) -> list[str]:
    value = _list(entry, name, where)
    if not all(isinstance(v, str) for v in value):
        raise EntryError(f'{where}: "{name}" must be a list of strings')
    return value


_MISSING = object()  # a field the entry does not have


def _kind(value: object) -> str:
    if value is _MISSING:
        return "missing"
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )
