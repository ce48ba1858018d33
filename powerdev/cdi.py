"""CDI mode: a Container Device Interface spec per resource, and Allocate
answers that name CDI devices instead of listing DeviceSpecs.

With `"cdi": true` a resource's healthy devices are written, one CDI device
each, to `<spec dir>/<vendor>-<class>.json` (kind `<vendor>/<class>` from the
resource name `power-dev-plugin/dev`), with the node's path, type, numbers,
cgroup permissions and, where configured, the uid, gid and mode it should
have in the container. The runtime (containerd 1.7+, CRI-O) resolves the
names Allocate returns from that file, so the file is rewritten (atomically:
a temp file renamed over it) before any answer names a device it lacks, and
removed when the resource stops. Pure functions build the spec; SpecWriter
keeps the file in step with the inventory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
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
    entries: dict[str, list[dict[str, object]]] = {}  # one CDI device per ID, every name of it
    for device in devices:
        if not device.healthy:
            continue  # not the device the kubelet handed out under that ID
        node: dict[str, object] = {
            "path": device.path,
            "hostPath": device.path,
            "type": device.kind,
            "major": device.major,
            "minor": device.minor,
            "permissions": resource.permissions,
        }
        if resource.device_uid is not None:
            node["uid"] = resource.device_uid
        if resource.device_gid is not None:
            node["gid"] = resource.device_gid
        if resource.device_mode is not None:
            node["fileMode"] = resource.device_mode
        entries.setdefault(device_name(device.id), []).append(node)
    return {
        "cdiVersion": CDI_VERSION,
        "kind": kind_for(resource.name),
        "devices": [
            {"name": name, "containerEdits": {"deviceNodes": nodes}}
            for name, nodes in entries.items()
        ],
    }


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


class SpecWriter:
    """Keeps one resource's CDI spec file in step with its inventory."""

    def __init__(self, spec_dir: Path) -> None:
        self.spec_dir = spec_dir
        self._written: tuple[object, ...] | None = None  # what the file holds now
        self._path: Path | None = None
        self._lock = trio.Lock()
        self._closed = False

    async def ensure(self, resource: ResourceConfig, snapshot: Snapshot) -> None:
        """The file holds this snapshot's healthy devices, or is gone when CDI
        is off. Returns once that is so: Allocate waits on it."""
        key = (resource, snapshot.version) if resource.cdi else None
        if key == self._written or self._closed:
            return
        async with self._lock:
            if key == self._written or self._closed:
                return
            if resource.cdi:
                path = spec_path(self.spec_dir, resource.name)
                data = json.dumps(build_spec(resource, snapshot.devices), indent=1).encode()
                self._path = path  # known before it exists: close() will find it
                try:
                    with trio.CancelScope(shield=True):  # the thread runs to the end anyway
                        await trio.to_thread.run_sync(write_atomically, path, data)
                except OSError as err:
                    raise SpecWriteError(path, err) from None
            else:
                self.remove()
            self._written = key

    async def close(self) -> None:
        """The resource stops: no more writes, and its spec goes. Waits for a
        write in progress, so none lands after the removal."""
        self._closed = True
        with trio.CancelScope(shield=True):
            async with self._lock:
                self.remove()

    def remove(self) -> None:
        if self._path is not None:
            try:
                self._path.unlink()
                log.info("removed the CDI spec %s", self._path)
            except FileNotFoundError:
                pass
            except OSError as err:  # a read-only or vanished directory: never a crash
                log.warning("could not remove the CDI spec %s: %s", self._path, err.strerror)
            self._path = None
        self._written = None
