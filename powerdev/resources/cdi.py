"""CDI mode: a Container Device Interface spec per resource, and Allocate
answers that name CDI devices instead of listing DeviceSpecs.

With `"cdi": true` a resource's healthy devices are written, one CDI device
each, to `<spec dir>/<vendor>-<class>.json` (kind `<vendor>/<class>` from the
resource name `power-dev-plugin/dev`), with the node's path, type, numbers,
cgroup permissions and, where configured, the uid, gid and mode it should
have in the container. The runtime (containerd 1.7+, CRI-O) resolves the
names Allocate returns from that file, so the file is rewritten (atomically:
a temp file renamed over it) before any answer names a device it lacks. The
kubelet sends the same names again at every container restart, so a device
stays in the file while a pod may hold it (the kubelet's PodResources API),
across daemon restarts. Pure functions build the spec; SpecWriter keeps the
file in step with the inventory and the holders.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable, Collection, Mapping
from pathlib import Path

import trio

from powerdev.config import ResourceConfig, cdi_spec_file
from powerdev.devices.inventory import Snapshot
from powerdev.devices.model import Device

log = logging.getLogger(__name__)
CDI_VERSION = "0.5.0"  # hostPath on device nodes; read by containerd 1.7+ and CRI-O 1.28+
DEFAULT_SPEC_DIR = "/var/run/cdi"
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


def kind_for(resource_name: str) -> str:
    """The CDI kind, vendor/class, of a resource: its name as it is."""
    return resource_name


def device_name(device_id: str) -> str:
    """A device ID as a CDI device name; an ID CDI would refuse gets a hash."""
    if _NAME.match(device_id):
        return device_id
    return "dev-" + hashlib.sha256(device_id.encode()).hexdigest()[:16]


def qualified_names(resource: ResourceConfig, devices: tuple[Device, ...]) -> tuple[str, ...]:
    """What Allocate answers in CDI mode: every healthy device, fully qualified."""
    kind = kind_for(resource.name)
    return tuple(dict.fromkeys(f"{kind}={device_name(d.id)}" for d in devices if d.healthy))


def spec_path(spec_dir: Path, resource_name: str) -> Path:
    return spec_dir / cdi_spec_file(resource_name)


def build_spec(resource: ResourceConfig, devices: tuple[Device, ...]) -> dict[str, object]:
    """The spec of a resource's healthy devices: one CDI device per ID, every name of it."""
    return _spec(resource.name, _entries(resource, devices))


def device_node(resource: ResourceConfig, device: Device) -> dict[str, object]:
    """One device node as a CDI containerEdits entry, with the resource's
    permissions and, where configured, uid, gid and mode (DRA's claims too)."""
    return _node(resource, device)


def _node(resource: ResourceConfig, device: Device) -> dict[str, object]:
    node: dict[str, object] = {
        "path": device.path,
        "hostPath": device.path,
        "type": device.kind,
        "major": device.major,
        "minor": device.minor,
        "permissions": resource.permissions,
    }
    if owned(resource):
        # Both, always: the runtime's CDI library gives a node without a uid
        # (or gid) the container process's, so with only a group set every
        # pod granted the device would own it. The unset one is root's.
        node["uid"] = resource.device_uid or 0
        node["gid"] = resource.device_gid or 0
    if resource.device_mode is not None:
        node["fileMode"] = resource.device_mode
    return node


def owned(resource: ResourceConfig) -> bool:
    """Whether the resource says who owns its nodes in the container
    (device-uid or device-gid). Without either the spec names no owner,
    and the runtime makes the container's user and group the owners of
    each node (CDI's own rule); device-mode alone keeps that."""
    return resource.device_uid is not None or resource.device_gid is not None


class SpecWriteError(Exception):
    """The spec file cannot be written: str() names the file, the reason and the fix."""

    def __init__(self, path: Path, err: OSError) -> None:
        super().__init__(
            f"cannot write the CDI spec {path} ({err.strerror or err}): make {path.parent} "
            "a writable directory (the DaemonSet mounts the host's /var/run/cdi there), "
            "or turn cdi off"
        )


def write_atomically(path: Path, data: bytes) -> None:
    """Readers see the old file or the new one, never a part of either."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # the runtime reads it; it holds no secret
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


# Asks the kubelet: resource name -> device IDs some pod holds; None when it cannot be asked.
# Asks the kubelet: resource name -> the device IDs pods hold (a mapping of
# each ID to its pods does); None when it cannot say.
Held = Callable[[], Awaitable["Mapping[str, Collection[str]] | None"]]


class SpecWriter:
    """Keeps one resource's CDI spec file in step with its inventory, and
    never forgets a device some pod may still be started with.

    The kubelet keeps the CDI names of each Allocate answer in its
    checkpoint and sends them again at every container restart, so a name
    must resolve for as long as any pod holds it. The file holds the
    resource's healthy devices, and also each device written before that
    the kubelet's PodResources API still lists as held ("each": by the
    device's own ID; "all": while any pod holds any unit, since each holder
    was answered with every device). When the kubelet cannot be asked, the
    safe side: nothing written is forgotten. The file outlives the process
    (an upgrade's next daemon reads it back), and goes only when nothing in
    it is new or held: after the resource left the config or turned CDI
    off, once its last holder is gone.
    """

    def __init__(
        self,
        spec_dir: Path,
        resource_name: str,
        held_ids: Held | None = None,
        *,
        reaches_other: Callable[[str, list[dict[str, object]], bool], str | None] | None = None,
    ) -> None:
        self.path = spec_path(spec_dir, resource_name)
        # Does a kept name's node now reach another device (its numbers given
        # to another LUN meanwhile)? Then it is dropped: never a container
        # started with what now sits at the old numbers. Says what, or None.
        self._reaches_other = reaches_other
        self._resource_name = resource_name
        self._held_ids = held_ids
        self._entries: dict[str, list[dict[str, object]]] | None = None  # the file's; None: unread
        self._kept: set[str] = set()  # names the file holds only because a pod may hold them
        self._done: tuple[object, ...] | None = None  # what the file was last made from
        self._lock = trio.Lock()

    @property
    def keeps(self) -> bool:
        """Does the file hold devices only because a pod may hold them?"""
        return bool(self._kept)

    async def ensure(self, resource: ResourceConfig, snapshot: Snapshot | None) -> None:
        """The file holds this snapshot's healthy devices (none when CDI is off
        or the resource is gone: snapshot None), and every device written
        before that may still be held. Returns once that is so: Allocate
        waits on it. Nothing is dropped here: only recheck() does that, with an
        answer from the kubelet asked after the devices left the list.
        SpecWriteError when the directory refuses."""
        key = (resource, snapshot.version if snapshot is not None else None)
        if key == self._done:
            return
        async with self._lock:
            if key != self._done:
                await self._write(resource, snapshot, None)
                self._done = key

    async def recheck(self, resource: ResourceConfig, snapshot: Snapshot | None) -> None:
        """Ask the kubelet what pods hold now, then write what that allows:
        devices no pod holds are dropped."""
        held = None
        if self._held_ids is not None:
            answer = await self._held_ids()
            held = None if answer is None else answer.get(self._resource_name, ())
        async with self._lock:
            await self._write(resource, snapshot, held)
            self._done = (resource, snapshot.version if snapshot is not None else None)

    async def _write(
        self, resource: ResourceConfig, snapshot: Snapshot | None, held: Collection[str] | None
    ) -> None:
        """Under the lock: current devices, plus those written before that
        `held` (None: unknown, so all) says a pod may hold. The spec is
        built, compared, encoded and written in a worker thread: at 10,000
        devices that is some 100 ms of work the Trio thread never waits on."""
        stale = False
        if self._entries is None:
            self._entries, stale = await trio.to_thread.run_sync(_read_entries, self.path)
        devices = snapshot.devices if resource.cdi and snapshot is not None else ()
        written = old = self._entries
        held_here = _may_be_held(resource, held)
        current_names = {device_name(d.id) for d in devices if d.healthy}
        for name, nodes in list(old.items()):
            if name in current_names or not held_here(name) or self._reaches_other is None:
                continue
            other = self._reaches_other(name, nodes, resource.allocation == "each")
            if other is not None:
                log.warning(
                    "%s: the CDI spec %s drops %s, which a pod may still hold: %s",
                    self._resource_name,
                    self.path,
                    name,
                    other,
                )
                old = {k: v for k, v in old.items() if k != name}
        may_hold = held_here
        try:
            with trio.CancelScope(shield=True):  # the thread runs to the end anyway
                merged, kept = await trio.to_thread.run_sync(
                    _merge_and_write, self.path, resource, devices, old, written, may_hold, stale
                )
        except OSError as err:
            raise SpecWriteError(self.path, err) from None
        self._entries = merged
        self._log_kept(kept, held)

    def _log_kept(self, kept: set[str], held: Collection[str] | None) -> None:
        newly, gone = sorted(kept - self._kept), sorted(self._kept - kept)
        if newly:
            why = "until the kubelet says no pod holds them" if held is None else "pods hold them"
            log.info(
                "%s: the CDI spec %s keeps %s, which a pod may still be started with (%s)",
                self._resource_name,
                self.path,
                ", ".join(newly),
                why,
            )
        if gone:
            log.info(
                "%s: the CDI spec %s drops %s: no pod holds them any more",
                self._resource_name,
                self.path,
                ", ".join(gone),
            )
        self._kept = kept


def _merge_and_write(
    path: Path,
    resource: ResourceConfig,
    devices: tuple[Device, ...],
    old: dict[str, list[dict[str, object]]],
    written: dict[str, list[dict[str, object]]],
    may_hold: Callable[[str], bool],
    stale: bool,
) -> tuple[dict[str, list[dict[str, object]]], set[str]]:
    """In a worker thread: the spec's entries now (the devices', and those of
    `old` a pod may hold), written when they differ from what the file holds
    (`written`); and the names kept."""
    current = _entries(resource, devices)
    kept = {name: nodes for name, nodes in old.items() if name not in current and may_hold(name)}
    merged = current | kept
    if merged != written or stale:
        if merged:
            # compact: the C encoder (indent makes json use its pure-Python one)
            write_atomically(path, json.dumps(_spec(resource.name, merged)).encode())
        else:
            _remove(path)
    return merged, set(kept)


def _remove(path: Path) -> None:
    try:
        path.unlink()
        log.info("removed the CDI spec %s", path)
    except FileNotFoundError:
        pass
    except OSError as err:  # a read-only or vanished directory: never a crash
        log.warning("could not remove the CDI spec %s: %s", path, err.strerror)


def _may_be_held(resource: ResourceConfig, held: Collection[str] | None) -> Callable[[str], bool]:
    """Could a pod hold the device of a CDI name? `held`: the resource's
    device IDs some pod holds, as the kubelet just said; None: unknown."""
    if held is None:
        return lambda name: True
    if resource.allocation == "each":
        names = {device_name(i) for i in held}  # once, not once per name
        return names.__contains__
    return lambda name: bool(held)  # "all": each holder was answered with every device


def _entries(
    resource: ResourceConfig, devices: tuple[Device, ...]
) -> dict[str, list[dict[str, object]]]:
    """CDI device name -> its device nodes, for the healthy devices."""
    entries: dict[str, list[dict[str, object]]] = {}
    for device in devices:
        if device.healthy:  # not the device the kubelet handed out under that ID
            entries.setdefault(device_name(device.id), []).append(_node(resource, device))
    return entries


def _spec(kind: str, entries: dict[str, list[dict[str, object]]]) -> dict[str, object]:
    return {
        "cdiVersion": CDI_VERSION,
        "kind": kind_for(kind),
        "devices": [
            {"name": name, "containerEdits": {"deviceNodes": nodes}}
            for name, nodes in entries.items()
        ],
    }


def _read_entries(path: Path) -> tuple[dict[str, list[dict[str, object]]], bool]:
    """What a spec file written before (by an earlier daemon) names, and
    whether it must be written anew (it is not one we can read back)."""
    try:
        spec = json.loads(path.read_bytes())
        entries = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
        return entries, False
    except FileNotFoundError:
        return {}, False
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("the CDI spec %s cannot be read back (%s): written anew", path, err)
        return {}, True
