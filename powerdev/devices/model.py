"""A device node as the plugin advertises and grants it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

HOST_DEV = "/dev"
MAX_ID_LENGTH = 63  # the API documents this bound for Device.ID


@dataclass(frozen=True, slots=True)
class BlockFacts:
    """What a block device is besides its identity, for DRA's attributes
    and capacity (identity.block_facts reads them from sysfs)."""

    size: int | None = None  # bytes
    vendor: str | None = None  # trimmed, as the disk reports it (SCSI INQUIRY)
    model: str | None = None


@dataclass(frozen=True, slots=True)
class Device:
    """One character or block device node, by its path on the host."""

    id: str
    path: str  # host path, e.g. /dev/mapper/mpatha; also the path in the container
    kind: str  # "b" (block) or "c" (character)
    major: int
    minor: int
    healthy: bool = True
    numa: int | None = None  # the NUMA node the kernel reports for it, if any
    identity: str | None = None  # what it is, whatever its name: "DM_UUID=mpath-3600..."
    # Its place among the host's disks (block devices only): the whole
    # disk's numbers when it is a partition, and whether it is a disk that
    # has partitions. Two holders must never get overlapping blocks.
    whole_disk: tuple[int, int] | None = None
    has_partitions: bool = False
    # Size, vendor and model of a block device, where a resource wants
    # them (DRA's attributes); None otherwise.
    facts: BlockFacts | None = None
    # The device itself, whatever its name: kind and numbers (kept, since
    # the node-wide ledger asks it of every device at every look; given by
    # whoever has one already, so that one tuple serves every name).
    key: tuple[str, int, int] = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.key is None:
            object.__setattr__(self, "key", (self.kind, self.major, self.minor))


def device_id(host_path: str) -> str:
    """A stable ID derived from the host path: /dev/mapper/mpatha -> mapper.mpatha.

    The same node always gets the same ID, across rescans and restarts; IDs
    over 63 characters keep a readable head and a hash of the whole path.
    """
    rel = host_path.removeprefix(HOST_DEV + "/").strip("/")
    ident = rel.replace("/", ".")
    if len(ident) > MAX_ID_LENGTH:
        digest = hashlib.sha256(host_path.encode()).hexdigest()[:12]
        ident = f"{ident[: MAX_ID_LENGTH - 13]}-{digest}"
    return ident
