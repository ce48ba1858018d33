"""The one verdict on a device under a resource: Offered, Unhealthy with a
reason, or LeftOut with a reason.

Everything that decides a device's fate is asked here, in this order, and
nowhere else: the daemon's lists (tracker.py), Allocate (plugin.py), DRA's
slices and NodePrepareResources (dra/), and `powerdev scan` (ops/scan.py).

1. A control node or kernel interface that no pattern names literally is
   left out (devices/special.py).
2. A device the host uses is left out, or Unhealthy where it is already
   listed, unless the resource allows host-used devices.
3. In "each" mode a disk with partitions is left out (or Unhealthy where
   listed): its partitions are the units, so no two pods share blocks.
   Through DRA alone the disk is offered too: its pool's shared counters
   keep the scheduler from allocating it and a partition to two claims
   (resources/families.py), and rule 8 keeps a second holder off at prepare.
4. A block device with no medium (sysfs `size` 0: a loop device with no
   file attached or detached, a drive with no disc) is left out, or
   Unhealthy where listed: there is nothing to read or write, and a pod
   that holds it sees it fail rather than vanish; once a medium is back it
   is offered again.
5. A device that has failed (its own state in sysfs: no working path, SCSI
   offline, NVMe controller dead, no NX credit; condition.py) is Unhealthy,
   listed or not: capacity counts it, allocatable does not. A degraded one
   is still offered.
6. A name that now reaches another device than the one first seen there is
   Unhealthy: it is not what the kubelet handed out under its ID.
7. A device another resource lists, or one whose family another resource
   lists, goes to neither: left out, or Unhealthy where listed.
8. A device whose family has another holder (the ledger, ownership.py) is
   Unhealthy until that holder lets go.

Plain data in, plain data out: the caller gathers the facts (the device
table), the rivals and the holders (the ledger).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

OFFERED, UNHEALTHY, LEFT_OUT = "Offered", "Unhealthy", "LeftOut"

EACH_DISK_WITH_PARTITIONS = (
    'a disk with partitions: in "each" mode its partitions are the units, '
    "so that two pods never share blocks"
)
ONE_RESOURCE = "a device belongs to one resource only"


@dataclass(frozen=True, slots=True)
class Verdict:
    state: str  # OFFERED, UNHEALTHY or LEFT_OUT
    reason: str = ""  # why not offered, in words that follow "<path>: "

    @property
    def offered(self) -> bool:
        return self.state == OFFERED

    @property
    def listed(self) -> bool:
        """Advertised at all (healthy or not)."""
        return self.state != LEFT_OUT


OFFER = Verdict(OFFERED)


@dataclass(frozen=True, slots=True)
class Case:
    """What is known of one name of one device, for one resource."""

    literal_only: str | None = None  # why only a literal pattern may grant it
    named_literally: bool = False  # a pattern names its path exactly
    host_use: str | None = None  # why the host uses it
    allow_host_used: bool = False
    each: bool = False  # the resource's units are partitions, not their disk (rule 3)
    has_partitions: bool = False
    no_medium: str | None = None  # why a block device has nothing to read or write
    failed: str | None = None  # what its own state says is wrong, when it has failed
    renumbered: str | None = None  # what the name reaches now, when not what it first did
    rivals: Sequence[str] = ()  # other resources that list it or its family, as phrases
    held: str | None = None  # the other holder of its family, and until when


def judge(case: Case, *, listed: bool) -> Verdict:
    """The verdict. `listed`: the resource advertises the name now, so a
    device that turns bad stays listed, Unhealthy, and the kubelet grants
    it no more (it is not taken away under a running pod)."""

    def out(why: str) -> Verdict:
        return Verdict(UNHEALTHY, why) if listed else Verdict(LEFT_OUT, why)

    if case.literal_only is not None and not case.named_literally:
        return Verdict(LEFT_OUT, f"{case.literal_only}: name it literally")
    if case.host_use is not None and not case.allow_host_used:
        return out(f"the host uses it: {case.host_use}")
    if case.each and case.has_partitions:
        return out(EACH_DISK_WITH_PARTITIONS)
    if case.no_medium is not None:
        return out(case.no_medium)
    if case.failed is not None:
        return Verdict(UNHEALTHY, f"it has failed: {case.failed}")
    if case.renumbered is not None:
        return Verdict(UNHEALTHY, case.renumbered)
    if case.rivals:
        return out(f"{'; '.join(case.rivals)}: {ONE_RESOURCE}")
    if case.held is not None:
        return Verdict(UNHEALTHY, case.held)
    return OFFER
