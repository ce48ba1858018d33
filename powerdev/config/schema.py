"""What a config is: the frozen settings (Config, ResourceConfig), their
defaults, the fields a config.json may hold, the bounds that protect the
daemon and the kubelet, and ConfigError.

Imports nothing of powerdev. values.py checks one value against these
bounds, fields.py and parse.py build the settings, overlap.py compares
resources.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_CONFIG_PATH = "/etc/power-device-plugin/config.json"
DEFAULT_RESOURCE_NAME = "power-dev-plugin/dev"
DEFAULT_SOCKET_NAME = "power-dev.csi.ibm.com-reg.sock"
DEFAULT_SCAN_INTERVAL = 3600.0  # IBM's plugin's default for the `time` strategy: 60 minutes
MIN_SCAN_INTERVAL = 10.0  # a rescan costs tens of ms at 10,000 devices; events do the rest
STRATEGIES = ("default", "time")
# upper-limit N advertises N units. The kubelet takes a ListAndWatch message
# of at most 4 MiB, about 200,000 units of ~20 bytes; each unit also costs
# powerdev a few hundred bytes and the DaemonSet's memory limit is 128 MiB.
# A node runs a few hundred pods at most (110 by default), so 10,000 is far
# above any real need and far below both limits.
MAX_UPPER_LIMIT = 10_000
MAX_CONFIG_BYTES = 1024 * 1024  # a config.json is a few hundred bytes
# Longer than any Linux path (PATH_MAX): bounds what a match and the config's
# overlap check may cost (len(pattern) x len(name), and pattern x pattern).
MAX_GLOB = 4096
RESERVED_NAMES = ("kubelet.sock", "kubelet_internal_checkpoint")  # the kubelet's own
UNIX_PATH_MAX = 107  # bytes in a unix socket path (sun_path holds 108, with the NUL)

KNOWN_FIELDS = (
    "nx-gzip",
    "permissions",
    "include-devices",
    "exclude-devices",
    "discovery-strategy",
    "scan-interval",
    "upper-limit",
    "allow-host-used-devices",
    "cdi",
    "device-uid",
    "device-gid",
    "device-mode",
    "allocation",
    "match-properties",
    "api",
    "whole-disks",
    "scope",
    "shared",
)
ENTRY_FIELDS = ("name", "socket")  # a resource of the "resources" list also has these
ALLOCATIONS = ("all", "each")
# Through which Kubernetes API a resource's devices are handed out: the device
# plugin API (Allocate), Dynamic Resource Allocation (ResourceSlices and
# NodePrepareResources), or both during a migration (one device, one holder
# across the two: see docs/dra.md).
APIS = ("device-plugin", "dra", "both")
# Where a DRA resource's devices are published: in the node's own pool, or,
# for LUNs that several nodes see, once for the whole cluster (the node
# reports them, `powerdev luns` publishes them: docs/dra.md).
SCOPES = ("node", "cluster")
MAX_RESOURCES = 32  # each is a socket, a registration and a stream


class ConfigError(ValueError):
    """A config that cannot be used; str() is the one line an operator reads."""

    def __init__(self, source: str, field_name: str | None, problem: str, fix: str) -> None:
        where = f"{source}: field {field_name!r}" if field_name else source
        super().__init__(f"{where}: {problem}; {fix}")


@dataclass(frozen=True)
class ResourceConfig:
    """One extended resource: what to discover and how to grant it."""

    name: str = DEFAULT_RESOURCE_NAME
    socket: str = DEFAULT_SOCKET_NAME
    nx_gzip: bool = False
    permissions: str = "rw"
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    strategy: str = "default"
    scan_interval: float = DEFAULT_SCAN_INTERVAL
    upper_limit: int = 0  # 0: no limit, one unit per device
    allow_host_used: bool = False  # also list devices the host mounts, swaps on or holds
    cdi: bool = False  # answer Allocate with CDI device names (cdi.py writes the spec)
    device_uid: int | None = None  # owner, group and mode of the node in the container (CDI)
    device_gid: int | None = None
    device_mode: int | None = None
    allocation: str = "all"  # "all": every grant carries every device; "each": the ones chosen
    # (udev property, globs): a device must match one glob of every property
    match_properties: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # or "dra": ResourceSlices and claims (powerdev/dra); or "both", for a migration
    api: str = "device-plugin"
    # "dra": a disk with partitions is published too, beside its partitions,
    # and so is every device that shares blocks with another; the pool's
    # shared counters keep two of them from two claims (resources/families.py)
    whole_disks: bool = False
    # "node": the node's own pool; "cluster": each LUN once for the cluster
    scope: str = "node"
    # "cluster" only: a LUN may be allocated to several claims at once (for
    # cluster filesystems, which order their own writes)
    shared: bool = False

    @property
    def dra(self) -> bool:
        """Served through DRA: its pool published, its claims prepared."""
        return self.api in ("dra", "both")

    @property
    def cluster(self) -> bool:
        """A LUN seen by several nodes: reported by each node, published once
        for the cluster (dra/lun_report.py, dra/lun_controller.py)."""
        return self.scope == "cluster"

    @property
    def device_plugin(self) -> bool:
        """Served through the device plugin API: its socket, its registration."""
        return self.api in ("device-plugin", "both")

    @property
    def partitions_only(self) -> bool:
        """A disk with partitions is left out, its partitions are the units:
        "each" mode, and DRA unless "whole-disks" says to publish the disk
        too (its pool's counters then keep the scheduler from allocating it
        with a partition: resources/families.py)."""
        return self.allocation == "each" and not (self.api == "dra" and self.whole_disks)

    @property
    def both(self) -> bool:
        """Served through both APIs, a device held through one withheld from the other."""
        return self.api == "both"


@dataclass(frozen=True)
class Config:
    """Everything read from one config file; `resources` is open to more than one."""

    source: str
    resources: tuple[ResourceConfig, ...]
    warnings: tuple[str, ...] = field(default=(), compare=False)
    raw: bytes | None = field(default=None, compare=False)  # the file's bytes; None: no file


def default_socket(resource_name: str) -> str:
    """The socket file of a named resource: power-dev-plugin/lun -> power-dev-plugin-lun.sock."""
    return resource_name.replace("/", "-") + ".sock"


def cdi_spec_file(resource_name: str) -> str:
    """The CDI spec file of a resource: power-dev-plugin/lun -> power-dev-plugin-lun.json."""
    return resource_name.replace("/", "-") + ".json"
