"""NodePrepareResources and NodeUnprepareResources, as plain Trio.

Preparing a claim: read it from the API server (namespace and name, its
UID checked), take the results of its allocation that are ours (this
driver, a pool of this node's DRA resources), check that each device is
present, healthy (so not host-used, not taken by another resource) in the
resource's inventory, write a CDI spec for the claim (one file per claim:
every name of each device, with the resource's permissions, uid, gid and
mode) and answer its CDI device IDs. Unpreparing removes the spec. Both
are idempotent and take a lock per claim. A checkpoint in the driver's
plugin directory (claim UID -> its spec and answer) lets a restarted
daemon answer a claim it prepared before without asking again, and rewrite
a spec that is gone (after a reboot /var/run/cdi is empty, while the
kubelet still hands the claim's CDI IDs to containers from its own
checkpoint): every spec in the checkpoint is rewritten at start. The
checkpoint's entries are typed records (dra/checkpoint.py), checked when
read: an entry that does not parse is set aside, kept in the file as it
is, and the devices it still names stay held until the kubelet unprepares
its claim or prepares it anew. An unprepare is done once the checkpoint
without the claim is saved; until then nothing changes and the kubelet is
told to try again. Every read and write of these files is done in a worker
thread.

Every claim is a holder in the node-wide ledger (resources/ownership.py),
which prepare asks first: a device whose family has another holder (another
claim, a pod through the device plugin API, a prepared disk under a
partition) is not prepared (a per-claim error; the kubelet tries again),
and a device a claim holds stays Unhealthy under any other holder (the
device plugin side of an "api": "both" resource included) until the claim
is unprepared.

The claims of a resource whose LUNs are shared ("shared": true, "scope":
"cluster") hold each device together, as one holder (SHARED_CLAIMS): a
second claim of it is prepared beside the first, anything else waits
until the last of them is unprepared.

A device a claim gets with admin access (`adminAccess: true` in its
request, for monitoring and diagnosis) is no holder: it is prepared
though other claims hold the device (present and healthy still), and it
keeps no one else from it, a set-aside checkpoint entry of it included;
its CDI spec lets the container read the device, never write it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import trio

from powerdev.devices.family import Key
from powerdev.devices.model import Device
from powerdev.dra.checkpoint import (
    VERSION,
    EntryError,
    HeldClaim,
    HeldDevice,
    parse_entry,
    salvage_keys,
    spec_keys,
)
from powerdev.dra.luns import pool_of
from powerdev.dra.names import device_name
from powerdev.resources.allocation import by_unit
from powerdev.resources.cdi import CDI_VERSION, device_node, write_atomically
from powerdev.resources.ownership import DRA, SHARED_CLAIMS, Ledger
from powerdev.resources.plugin import Plugin

log = logging.getLogger(__name__)

CDI_CLASS = "claim"  # the CDI kind of every claim's devices: <driver>/claim
# What a container of a claim with admin access may do with its devices:
# read them (and the kernel's ioctls a reader may make), never write.
ADMIN_PERMISSIONS = "r"
CHECKPOINT = "checkpoint.json"
CHECKPOINT_VERSION = VERSION
SET_ASIDE = "checkpoint.json.unreadable"  # a whole checkpoint that cannot be read, kept


def holds_claims(state_dir: Path) -> bool:
    """Does the checkpoint in this driver directory hold a prepared claim, or
    may it (it is there but cannot be read: load() says why and keeps it)?"""
    try:
        data = json.loads((state_dir / CHECKPOINT).read_bytes())
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True
    return not isinstance(data, dict) or data.get("claims") != {}


class ClaimApi(Protocol):
    async def claim(self, namespace: str, name: str) -> dict[str, Any] | None: ...


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str


_REF_FIELDS = ("namespace", "name", "UID")


@dataclass(frozen=True)
class Prepared:
    """One allocated device as the kubelet is told: its CDI IDs."""

    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None  # the allocation's, of a device shared by several


class PrepareError(Exception):
    """This claim cannot be prepared; str() is what the kubelet shows."""


class UnprepareError(Exception):
    """This claim cannot be unprepared now (it stays prepared); str() is what
    the kubelet shows, and it tries again."""


@dataclass
class Claims:
    driver: str
    node: str
    api: ClaimApi
    plugins: Callable[[], Sequence[Plugin]]  # the DRA resources served now
    cdi_dir: Path
    state_dir: Path  # <plugins dir>/<driver>: the checkpoint
    ledger: Ledger | None = None  # the node-wide one: who holds which device
    # finds the devices of an identity now ("SOURCE=value" -> keys); None: not looked up
    find: Callable[[str], Awaitable[list[Key]]] | None = None
    # finds what a host path names now; None: not looked up
    key_of: Callable[[str], Key | None] | None = None
    names_of: Callable[[Key], Sequence[str]] | None = None
    boot_id: str | None = None  # this boot's (/proc/sys/kernel/random/boot_id)
    _held: dict[str, HeldClaim] = field(default_factory=dict)
    # entries of the checkpoint that do not parse, by claim UID: kept as they are
    _aside: dict[str, object] = field(default_factory=dict)
    _leaving: dict[str, HeldClaim] = field(default_factory=dict)  # being unprepared: saving
    _locks: dict[str, trio.Lock] = field(default_factory=dict)
    _saving: trio.Lock = field(default_factory=trio.Lock)
    _names: dict[str, _PublishedNames] = field(default_factory=dict)  # by resource name

    @property
    def checkpoint_path(self) -> Path:
        return self.state_dir / CHECKPOINT

    def spec_path(self, uid: str) -> Path:
        return self.cdi_dir / f"{self.driver}-{uid}.json"

    @property
    def prepared_count(self) -> int:
        """The claims prepared now (those set aside count too: they hold)."""
        return len(self._held) + len(self._aside)

    async def load(self) -> None:
        """Read the checkpoint, bind each prepared device to what it is now
        (_rebind), and write again every spec that is gone or changed. An
        entry that does not parse is set aside (_set_aside); a whole file
        that does not is kept beside it (SET_ASIDE) and the driver starts
        with no claim."""
        self._held, self._aside = {}, {}
        entries = await trio.to_thread.run_sync(self._read_checkpoint)
        if entries is None:  # unreadable: what the claims' CDI specs name stays held
            specs = await trio.to_thread.run_sync(self._claim_specs)
            for uid, spec in specs.items():
                self._set_aside(uid, None, spec, "the checkpoint cannot be read (see above)")
            entries = {}
        for uid, value in entries.items():
            try:
                self._held[uid] = parse_entry(value)
            except EntryError as err:
                on_disk = await trio.to_thread.run_sync(_read_json, self.spec_path(uid))
                self._set_aside(uid, value, on_disk, str(err))
        rebound = False
        for uid, held in self._held.items():
            try:
                changed = await self._rebind(uid, held)
                rebound |= changed
                self._tell_ledger(uid, held, prepared=True)
                await self._ensure_spec(uid, held, again=changed)
            except OSError as err:
                log.warning(
                    "DRA: claim %s of the checkpoint %s: its CDI spec cannot be written (%s); "
                    "written when the kubelet prepares it again",
                    uid,
                    self.checkpoint_path,
                    err,
                )
        if rebound:
            try:
                await self._save()
            except OSError as err:
                log.warning(
                    "DRA: the checkpoint %s cannot be written: %s", self.checkpoint_path, err
                )

    def _read_checkpoint(self) -> dict[str, object] | None:
        """In a worker thread: the checkpoint's entries by claim UID. A file
        that cannot be read as a checkpoint at all is renamed aside, so that
        the next save does not overwrite what it held, and None returned."""
        path = self.checkpoint_path
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            problem = f"it is not JSON ({err})"
        else:
            version = data.get("version") if isinstance(data, dict) else None
            claims = data.get("claims") if isinstance(data, dict) else None
            if version == CHECKPOINT_VERSION and isinstance(claims, dict):
                return claims
            problem = (
                f"its version is {version!r}; this powerdev reads version {CHECKPOINT_VERSION}"
                if version != CHECKPOINT_VERSION
                else '"claims" is not an object'
            )
        aside = path.with_name(SET_ASIDE)
        try:
            os.replace(path, aside)
            kept = f"it is kept as {aside}"
        except OSError as err:
            kept = f"it cannot be kept as {aside} ({err}) and is left where it is"
        log.error(
            "DRA: the checkpoint %s cannot be read: %s; %s, and the driver starts with no "
            "prepared claim but those whose CDI specs are still there (their devices stay "
            "held until the kubelet prepares or unprepares them). To fix: "
            "restore it from %s (a checkpoint this powerdev wrote), or delete the pods whose "
            "ResourceClaims this driver prepared",
            path,
            problem,
            kept,
            aside,
        )
        return None

    def _claim_specs(self) -> dict[str, object]:
        """In a worker thread: the claims' CDI specs on disk, by claim UID."""
        found: dict[str, object] = {}
        prefix = f"{self.driver}-"
        try:
            names = sorted(p.name for p in self.cdi_dir.iterdir())
        except OSError:
            return found
        for name in names:
            if name.startswith(prefix) and name.endswith(".json"):
                found[name[len(prefix) : -len(".json")]] = _read_json(self.cdi_dir / name)
        return found

    def _set_aside(self, uid: str, value: object, on_disk: object, problem: str) -> None:
        """An entry that does not parse: kept in the file as it is, and every
        device it still names held in the ledger for its claim, so that none
        is handed to anyone else. The kubelet's next NodePrepareResources for
        the claim prepares it anew from the API server (its allocation says
        which devices it has); its NodeUnprepareResources forgets it."""
        found = salvage_keys(value)
        keys = spec_keys(on_disk)
        if keys:
            found.append((None, None, keys))
        self._aside[uid] = _Aside(value, found)
        self._hold_aside(uid)
        held = sorted({f"{k[0]} {k[1]}:{k[2]}" for _, _, ks in found for k in ks})
        log.error(
            "DRA: the checkpoint %s: claim %s: %s. The entry is set aside (kept in the file as "
            "it is); %s; the claim is prepared anew when the kubelet asks, and forgotten when "
            "it unprepares it. To fix: nothing, if the kubelet prepares or unprepares the "
            "claim; otherwise delete the claim's pod",
            self.checkpoint_path,
            uid,
            problem,
            f"its devices {', '.join(held)} stay held until then"
            if held
            else "it names no device that can be read, so none is held for it: check which "
            "devices its pod uses",
        )

    def _hold_aside(self, uid: str) -> None:
        """Hold in the ledger what a set-aside entry, or the claim's CDI spec
        on disk, still names."""
        if self.ledger is None:
            return
        for resource, unit, keys in self._aside[uid].found:
            # never in place of another claim's hold: what is set aside is a
            # guess, another claim's prepared device is known
            free = [k for k in keys if not self._held_by_another(k, uid)]
            if free:
                self.ledger.claimed(resource or "", unit or uid, free, uid)

    def _held_by_another(self, key: Key, uid: str) -> bool:
        holder = self.ledger.holder_of(key) if self.ledger is not None else None
        return holder is not None and holder.claim is not None and holder.claim != uid

    async def _rebind(self, uid: str, held: HeldClaim) -> bool:
        """At start: bind each device of a prepared claim to what it is now.
        Device numbers change across reboots (dm and sd numbering), and
        /var/run/cdi is a tmpfs: a spec written back verbatim would give a
        restarted container whatever now has the old numbers. So a device
        with an identity is found again by it: renumbered, its spec gets the
        new numbers; gone, it is dropped from the spec (the container cannot
        start with it) and reported Unhealthy. A device without an identity
        is kept only within the same boot while its paths still name the same
        numbers; after a reboot it is dropped: the safe side. (A claim an
        older powerdev prepared says no boot: it counts as this one, since an
        upgrade restarts powerdev far more often than a reboot does, and its
        paths must still name the same numbers.) True if the claim changed."""
        if self.find is None or self.key_of is None:
            return False
        boot = held.boot_id if held.says_boot else self.boot_id
        same_boot = self.boot_id is not None and boot == self.boot_id
        specs = held.spec_devices()
        changed = False
        for d in held.devices:
            if d.gone is not None:
                continue
            spec = specs.get(d.cdi_name)
            if spec is None:
                continue
            nodes = spec["containerEdits"]["deviceNodes"]
            old = sorted({(n["type"], n["major"], n["minor"]) for n in nodes})
            identity = d.identity
            if identity:
                kinds = {k[0] for k in old}
                found = sorted(k for k in await self.find(identity) if k[0] in kinds)
                if not found:
                    self._gone(uid, held, d, spec, f"no device of this node is {identity} now")
                    changed = True
                elif found != old:
                    log.info(
                        "DRA: claim %s: device %s (%s) is at %s now, not %s: its CDI spec gets "
                        "the new numbers",
                        uid,
                        d.device,
                        identity,
                        ", ".join(f"{k[1]}:{k[2]}" for k in found),
                        ", ".join(f"{k[1]}:{k[2]}" for k in old),
                    )
                    self._renumber(nodes, found)
                    d.keys = found
                    changed = True
                continue
            still = all(
                self.key_of(n["hostPath"]) == (n["type"], n["major"], n["minor"]) for n in nodes
            )
            if not (same_boot and still):
                why = (
                    "the node restarted, and a device without an identity cannot be told "
                    "from another at its numbers"
                    if not same_boot
                    else "its paths name other devices now"
                )
                self._gone(uid, held, d, spec, why)
                changed = True
        if changed or held.boot_id != self.boot_id or not held.says_boot:
            held.boot_id, held.says_boot = self.boot_id, True
            changed = True
        return changed

    def _renumber(self, nodes: list[dict[str, Any]], found: list[Key]) -> None:
        """The device's nodes, at its new numbers: each keeps its path in the
        container; its host path is the old one where that names the device
        now, else a name of the device."""
        key = found[0]
        for node in nodes:
            now = self.key_of(node["hostPath"]) if self.key_of is not None else None
            if now not in found:
                names = self.names_of(key) if self.names_of is not None else ()
                if names:
                    node["hostPath"] = names[0]
            node["type"], node["major"], node["minor"] = key

    def _gone(
        self, uid: str, held: HeldClaim, d: HeldDevice, spec: dict[str, Any], why: str
    ) -> None:
        log.warning(
            "DRA: claim %s: device %s of pool %s is not written back: %s; the claim's "
            "containers cannot start with it (Unhealthy)",
            uid,
            d.device,
            d.pool,
            why,
        )
        d.gone = why
        d.keys = []
        held.spec["devices"].remove(spec)

    async def prepare(self, claim: ClaimRef) -> list[Prepared]:
        given = (claim.namespace, claim.name, claim.uid)
        empty = [what for what, value in zip(_REF_FIELDS, given, strict=True) if not value]
        if empty:  # the API server would take an empty name for a LIST of all claims
            raise PrepareError(
                f"the claim reference {claim.namespace or '<none>'}/{claim.name or '<none>'} "
                f"(UID {claim.uid or '<none>'}) has an empty {' and an empty '.join(empty)}: "
                "a ResourceClaim is named by its namespace, name and UID; nothing is asked "
                "of the API server"
            )
        async with self._lock(claim.uid):
            held = self._held.get(claim.uid)
            if held is None:
                held = await self._prepare_anew(claim)
                # no await from the checks to here: the ledger holds its devices
                # before any other prepare looks
                self._held[claim.uid] = held
                aside = self._aside.pop(claim.uid, None)  # prepared anew: it replaces it
                self._tell_ledger(claim.uid, held, prepared=True)
                try:  # the spec, then the checkpoint: a failed write prepares nothing
                    await self._write_spec(claim.uid, held)
                    await self._save()
                except OSError:
                    del self._held[claim.uid]
                    self._tell_ledger(claim.uid, held, prepared=False)
                    if aside is not None:
                        self._aside[claim.uid] = aside
                        self._hold_aside(claim.uid)
                    await trio.to_thread.run_sync(_remove_in, self.spec_path(claim.uid))
                    raise
            else:
                gone = [d for d in held.devices if d.gone is not None]
                if gone:
                    raise PrepareError(
                        f"ResourceClaim {claim.namespace}/{claim.name}: device "
                        f"{gone[0].device} of pool {gone[0].pool} is gone: "
                        f"{gone[0].gone}; delete the pod so that the claim is allocated anew"
                    )
                await self._ensure_spec(claim.uid, held)
            return [
                Prepared(_base_requests(d.requests), d.pool, d.device, tuple(d.cdi_ids), d.share_id)
                for d in held.devices
            ]

    async def unprepare(self, claim: ClaimRef) -> None:
        """Forget the claim: its checkpoint entry first (saved), then its
        devices in the ledger and its CDI spec. A save that fails (a full
        disk) changes nothing: the claim stays prepared, and UnprepareError
        tells the kubelet, which tries again; never forgotten here while the
        file still holds it, so it is never back at the next start after the
        kubelet was told it is gone."""
        lock = self._lock(claim.uid)
        async with lock:
            held = self._held.pop(claim.uid, None)
            aside = self._aside.pop(claim.uid, None)
            if held is not None or aside is not None:
                if held is not None:
                    self._leaving[claim.uid] = held
                try:
                    await self._save(leaving=claim.uid)
                except BaseException as err:  # not saved (a full disk, or the call cancelled)
                    if held is not None:
                        self._held[claim.uid] = held
                    if aside is not None:
                        self._aside[claim.uid] = aside
                    if not isinstance(err, OSError):
                        raise
                    raise UnprepareError(
                        f"cannot unprepare ResourceClaim {claim.namespace}/{claim.name}: the "
                        f"checkpoint {self.checkpoint_path} cannot be written ({err}); the claim "
                        "stays prepared until it can (free space there), and the kubelet "
                        "tries again"
                    ) from err
                finally:
                    self._leaving.pop(claim.uid, None)
                self._tell_ledger(claim.uid, held, prepared=False)
            try:
                await trio.to_thread.run_sync(_remove_in, self.spec_path(claim.uid))
            except OSError as err:
                raise UnprepareError(
                    f"cannot remove the CDI spec {self.spec_path(claim.uid)} of ResourceClaim "
                    f"{claim.namespace}/{claim.name} ({err}); the kubelet tries again"
                ) from err
        if not lock.locked() and not lock.statistics().tasks_waiting:
            self._locks.pop(claim.uid, None)  # nobody holds or waits for it

    def _lock(self, uid: str) -> trio.Lock:
        return self._locks.setdefault(uid, trio.Lock())

    async def _prepare_anew(self, ref: ClaimRef) -> HeldClaim:
        where = f"ResourceClaim {ref.namespace}/{ref.name}"
        try:
            claim = await self.api.claim(ref.namespace, ref.name)
        except Exception as err:  # unreachable, refusing, timing out: lightkube's or httpx's
            raise PrepareError(
                f"{where} cannot be read from the API server ({type(err).__name__}: {err}); "
                "the kubelet tries again: check that powerdev reaches the API server "
                "(--kubeconfig, or the pod's service account token)"
            ) from err
        if ref.uid not in self._aside or self.ledger is None:
            return self._from_claim(ref, where, claim)
        # A set-aside entry's holds give way to what the claim's allocation
        # says now; no await from here until the ledger holds those (prepare).
        self.ledger.unclaimed(ref.uid)
        try:
            return self._from_claim(ref, where, claim)
        except PrepareError:
            self._hold_aside(ref.uid)
            raise

    def _from_claim(self, ref: ClaimRef, where: str, claim: dict[str, Any] | None) -> HeldClaim:
        """What the claim holds, from its allocation, once each device is
        checked (present, healthy, not held by another)."""
        if claim is None:
            raise PrepareError(f"{where} does not exist")
        if claim["metadata"].get("uid") != ref.uid:
            raise PrepareError(f"{where} has UID {claim['metadata'].get('uid')}, not {ref.uid}")
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            raise PrepareError(f"{where} is not allocated")
        results = [
            r
            for r in allocation.get("devices", {}).get("results") or []
            if r["driver"] == self.driver
        ]
        pools = {pool_of(self.node, p.resource): p for p in self.plugins()}
        devices: list[HeldDevice] = []
        spec_devices: list[dict[str, Any]] = []
        for result in results:
            plugin = pools.get(result["pool"])
            if plugin is None:
                raise PrepareError(
                    f"{where}: device {result['device']} is in pool {result['pool']}, "
                    f"which is not one of this node's ({self.node}) pools"
                )
            names_of = self._names.setdefault(plugin.resource.name, _PublishedNames())
            found = _unit(plugin, result["device"], names_of)
            if isinstance(found, str):
                raise PrepareError(
                    f"{where}: device {result['device']} of pool {result['pool']} {found}"
                )
            unit_id, names = found
            admin = bool(result.get("adminAccess"))
            # admin access is no holder: it may reach a device others hold
            holder = SHARED_CLAIMS if plugin.resource.shared else ref.uid
            why = None if admin else self._blocked(plugin, unit_id, names, holder)
            if why is not None:
                raise PrepareError(
                    f"{where}: device {result['device']} of pool {result['pool']} {why}; "
                    "it is prepared once that holder lets go"
                )
            cdi_name = f"{ref.uid}-{result['device']}"
            if any(d.cdi_name == cdi_name for d in devices):  # a shared device allocated twice
                cdi_name = f"{cdi_name}-{len(devices)}"
            nodes = [device_node(plugin.resource, d) for d in names]
            if admin:  # to look, not to write: another claim may hold it
                for node in nodes:
                    node["permissions"] = ADMIN_PERMISSIONS
            spec_devices.append({"name": cdi_name, "containerEdits": {"deviceNodes": nodes}})
            devices.append(
                HeldDevice(
                    requests=[result["request"]],
                    pool=result["pool"],
                    device=result["device"],
                    cdi_ids=[f"{self.driver}/{CDI_CLASS}={cdi_name}"],
                    resource=plugin.resource.name,
                    unit=unit_id,
                    admin=admin,
                    keys=sorted({d.key for d in names}),
                    identity=names[0].identity,
                    share_id=result.get("shareID"),
                    shared=plugin.resource.shared and not admin,
                )
            )
        spec = {
            "cdiVersion": CDI_VERSION,
            "kind": f"{self.driver}/{CDI_CLASS}",
            "devices": spec_devices,
        }
        return HeldClaim(ref.namespace, ref.name, self.boot_id, spec, devices)

    def _blocked(self, plugin: Plugin, unit: str, names: Sequence[Device], uid: str) -> str | None:
        """Why the node-wide ledger keeps this device from the claim: another
        claim, a pod through the device plugin API, or a holder of its family
        (a partition of a prepared disk, a disk's alias); None if free."""
        if self.ledger is None:
            return None
        for device in names:
            blocked = self.ledger.blocking(device.key, plugin.resource, unit, claim=uid)
            if blocked is not None:
                kin, holder = blocked
                if holder.api == DRA and holder.claim not in (None, SHARED_CLAIMS):
                    other = self._claim_name(holder.claim)
                    what = "it" if kin == device.key else self.ledger.name_of(kin)
                    return (
                        f"is held: {what} is still prepared for ResourceClaim {other} (its "
                        "pod's containers may still use it)"
                    )
                return f"is held: {self.ledger.why_held(device.key, kin, holder)}"
        return None

    def _claim_name(self, uid: str) -> str:
        held = self._held.get(uid)
        return f"{held.namespace}/{held.name}" if held is not None else uid

    def _tell_ledger(self, uid: str, held: HeldClaim | None, *, prepared: bool) -> None:
        """The claim's devices held in the ledger, or let go: a device it
        was prepared with as shared (the claim's own record, whatever the
        config says now) is held by the claims that share it, and let go
        once no other claim that shares it is prepared or being unprepared
        (`uid` is in neither then)."""
        if self.ledger is None:
            return
        if not prepared or held is None:
            self.ledger.unclaimed(uid)
            for d in held.devices if held is not None else ():
                if d.shared and d.unit is not None and not self._sharers(d):
                    self.ledger.unclaimed(SHARED_CLAIMS, (d.resource, d.unit))
            return
        for d in held.devices:
            if d.resource is not None and d.unit is not None and not d.admin:
                holder = SHARED_CLAIMS if d.shared else uid
                self.ledger.claimed(d.resource, d.unit, d.keys, holder)

    def _sharers(self, device: HeldDevice) -> bool:
        """Whether another claim that shares this unit is prepared, or being
        unprepared (its save not done: it may yet stay prepared)."""
        return any(
            (d.resource, d.unit) == (device.resource, device.unit) and d.shared
            for held in (*self._held.values(), *self._leaving.values())
            for d in held.devices
        )

    async def _ensure_spec(self, uid: str, held: HeldClaim, *, again: bool = False) -> None:
        path = self.spec_path(uid)
        if not held.spec["devices"]:
            await trio.to_thread.run_sync(_remove_in, path)  # every device is gone
            return
        if again or not await trio.to_thread.run_sync(path.exists):
            log.info("DRA: claim %s: its CDI spec is gone or changed: written again", uid)
            await self._write_spec(uid, held)

    async def _write_spec(self, uid: str, held: HeldClaim) -> None:
        """The claim's spec, encoded, written and synced in a worker thread."""
        await trio.to_thread.run_sync(_encode_and_write, self.spec_path(uid), held.spec, 1)

    async def _save(self, leaving: str | None = None) -> None:
        """The checkpoint as it is now, encoded, written and synced in a
        worker thread; one save at a time, so that none overwrites a later
        one. Entries set aside are written back as they were read; claims
        being unprepared stay in it until their own save (`leaving`, the
        one this save is for), which may yet fail."""
        async with self._saving:
            claims: dict[str, object] = {uid: a.value for uid, a in self._aside.items()}
            claims.update((uid, held.to_json()) for uid, held in self._held.items())
            claims.update(
                (uid, held.to_json()) for uid, held in self._leaving.items() if uid != leaving
            )
            data = {"version": CHECKPOINT_VERSION, "claims": claims}
            await trio.to_thread.run_sync(_encode_and_write, self.checkpoint_path, data, None)

    def prepared_devices(self) -> list[tuple[str, str, tuple[tuple[str, str, int, int], ...]]]:
        """Every device of every prepared claim, as (pool, device name, its
        nodes as (host path, kind, major, minor)), from the checkpoint; read
        only (dra/health.py). An entry set aside is not among them."""
        found = []
        for held in self._held.values():
            specs = held.spec_devices()
            for device in held.devices:
                spec = specs.get(device.cdi_name)
                nodes = tuple(
                    (n["hostPath"], n["type"], n["major"], n["minor"])
                    for n in (spec["containerEdits"]["deviceNodes"] if spec else ())
                )
                found.append((device.pool, device.device, nodes))  # gone: no node
        return found


def _base_requests(requests: Sequence[str]) -> tuple[str, ...]:
    """The requests the kubelet is told a device is for: each by the name a
    pod's container uses. With a prioritized list (firstAvailable) the
    allocation names the subrequest the scheduler chose ("dev/small"), but a
    container names the request ("dev"), and the kubelet hands a container
    the CDI IDs of the devices whose request names include the one it
    names; so, as the upstream kubelet plugin helper does, the subrequest
    is cut off. The checkpoint keeps the allocation's own names."""
    return tuple(dict.fromkeys(r.partition("/")[0] for r in requests))


@dataclass(frozen=True)
class _Aside:
    """An entry of the checkpoint that does not parse: as it was read, and
    the devices it (or its claim's CDI spec) still names."""

    value: object
    found: list[tuple[str | None, str | None, list[Key]]]


def _read_json(path: Path) -> object:
    """In a worker thread: a JSON file, or None if it cannot be read."""
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


def _encode_and_write(path: Path, value: object, indent: int | None) -> None:
    """In a worker thread: the value as JSON, written atomically (a temp file
    synced, then renamed), its directory made."""
    _write_in(path, json.dumps(value, indent=indent).encode())


def _write_in(path: Path, data: bytes) -> None:
    """In a worker thread: the file, atomically, its directory made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, data)


def _remove_in(path: Path) -> None:
    """In a worker thread: the file gone, if it was there."""
    path.unlink(missing_ok=True)


@dataclass
class _PublishedNames:
    """A resource's devices by their name in the slice -> (unit ID, its names),
    built once per inventory version, so that a prepare finds its device at
    once however many there are."""

    inventory: object = None
    version: int = -1
    table: dict[str, tuple[str, tuple[Device, ...]]] = field(default_factory=dict)

    def of(self, plugin: Plugin) -> dict[str, tuple[str, tuple[Device, ...]]]:
        snapshot = plugin.inventory.current
        if self.inventory is not plugin.inventory or self.version != snapshot.version:
            self.table = {
                device_name(u): (u, names) for u, names in by_unit(snapshot.devices).items()
            }
            self.inventory, self.version = plugin.inventory, snapshot.version
        return self.table


def _unit(
    plugin: Plugin, name: str, names_of: _PublishedNames
) -> tuple[str, tuple[Device, ...]] | str:
    """The unit ID and every name of the published device called `name`, if
    DRA may hand it out now; otherwise why not."""
    plugin.refresh()  # every device event already queued, applied first
    found = names_of.of(plugin).get(name)
    if found is not None:
        unit_id, names = found
        if not all(d.healthy for d in names):
            return "is not healthy, or is used by the host, on this node now"
        if plugin.resource.both:
            held = plugin.held_by_pods
            if held is None:
                return (
                    'is served through both APIs ("api": "both") and the kubelet has not '
                    "said yet which devices pods hold through the device plugin API"
                )
            if unit_id in held:
                return (
                    'is held by a pod through the device plugin API ("api": "both"): '
                    "it is prepared once the kubelet says no pod holds it"
                )
        return unit_id, names
    return "is not present on this node now"
