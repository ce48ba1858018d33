"""What the daemon is told at start, apart from config.json: where things are
on the host, which event sources to use, and what the command line bound.
Built by the command line (or a test) and read by the supervisor and the
reloader; frozen for the daemon's life.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

from powerdev.config import DEFAULT_RESOURCE_NAME, DEFAULT_SOCKET_NAME
from powerdev.devices.udevdb import UdevDatabase
from powerdev.kubelet.paths import (
    DEFAULT_DRA_DRIVER,
    DEFAULT_DRA_PLUGINS_DIR,
    DEFAULT_DRA_REGISTRY_DIR,
    DEFAULT_PLUGIN_DIR,
    DEFAULT_POD_RESOURCES_SOCKET,
)
from powerdev.resources.cdi import DEFAULT_SPEC_DIR


@dataclass(frozen=True)
class DraSettings:
    """Where the DRA driver lives: its name, this node, the API server."""

    node_name: str
    driver: str = DEFAULT_DRA_DRIVER
    kubeconfig: Path | None = None  # None: the pod's service account
    plugins_dir: Path = Path(DEFAULT_DRA_PLUGINS_DIR)
    registry_dir: Path = Path(DEFAULT_DRA_REGISTRY_DIR)
    # This boot's ID (not namespaced: a pod reads the host's), so that a claim
    # prepared before a reboot is known to be from before it.
    boot_id: Path = Path("/proc/sys/kernel/random/boot_id")
    # Resources with "scope": "cluster": where the node reports its LUNs (a
    # ConfigMap in powerdev's namespace), and at least how often.
    lun_namespace: str = "power-device-plugin"
    lun_report_interval: float = 10.0


@dataclass(frozen=True)
class Settings:
    plugin_dir: Path = Path(DEFAULT_PLUGIN_DIR)
    dev_root: Path = Path("/dev")
    sys_root: Path = Path("/sys")
    uevents: str = "auto"  # "auto", "udev", "kernel", or "off" (rescans only)
    status_file: Path | None = None  # for `powerdev health`
    config_path: Path | None = None  # watched and reloaded when set
    # The host's mount table (the DaemonSet mounts /proc/1/mountinfo there);
    # None: this process's own, which is the host's when not in a container.
    host_mountinfo: Path | None = None
    cdi_spec_dir: Path = Path(DEFAULT_SPEC_DIR)  # where CDI-mode resources write their spec
    # The kubelet's PodResources API: which devices pods hold (None: never ask,
    # and so never forget a device a CDI spec once named).
    pod_resources_socket: Path | None = Path(DEFAULT_POD_RESOURCES_SOCKET)
    cdi_recheck_interval: float = 30.0  # seconds between asks while a spec keeps held devices
    # seconds between reads of what devices say of their own health (0: only at events)
    health_interval: float = 5.0
    # udev's database (devices/udevdb.py), for properties and identities
    udev: UdevDatabase | None = None
    # The flat config form's resource and socket names (the command line's).
    resource_name: str = DEFAULT_RESOURCE_NAME
    socket_name: str = DEFAULT_SOCKET_NAME
    metrics_socket: socket.socket | None = None  # bound by the CLI: /metrics, /healthz, /readyz
    dra: DraSettings | None = None  # for resources with "api": "dra"

    @property
    def mountinfo(self) -> Path:
        return self.host_mountinfo or Path("/proc/self/mountinfo")
