"""One device, one holder, on real loop devices (root): in "each" mode a
partitioned disk is offered as its partitions only; a disk in one resource
and its partition in another is a config error; a loop number that comes
back bound to another file is not granted while a pod holds the old one.

Loop devices are loop415-loop419 (the range of test_host_use_topology)."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import pytest
import trio

from powerdev.config import DEFAULT_RESOURCE_NAME as NAME
from powerdev.config import ResourceConfig
from powerdev.devices.identity import identity_id
from powerdev.devices.inventory import Inventory
from powerdev.devices.table import HostFiles
from powerdev.ops import scan
from powerdev.resources.ownership import find_overlap
from powerdev.resources.tracker import Tracker
from powerdev.resources.verdict import EACH_DISK_WITH_PARTITIONS
from tests.conftest import (
    config_for,
    daemon_and_kubelet,
    needs_root,
    require_command,
    wait_gone,
)
from tests.kernel.test_host_use_topology import (
    DEV,
    MOUNTINFO,
    SWAPS,
    SYS,
    gpt_image,
    loop_devices,
    run,
    sparse,
)

pytestmark = [
    needs_root,
    pytest.mark.skipif(not os.path.exists("/dev/loop-control"), reason="no /dev/loop-control"),
]
FIRST = 415
LIMIT = 60
MiB = 1024 * 1024


async def test_each_offers_a_partitioned_disk_as_its_partitions_only(tmp_path):
    require_command("partx", "util-linux")
    with trio.fail_after(LIMIT), loop_devices() as loops:
        disk = loops.attach(FIRST, gpt_image(tmp_path / "disk.img"), partitions=True)
        resource = ResourceConfig(include=(f"{disk}*",), allocation="each")
        host = HostFiles(MOUNTINFO, SWAPS)
        tracker = Tracker(resource, Inventory(), DEV, SYS, host=host)
        await tracker.rescan()
        listed = {d.path: d.healthy for d in tracker.inventory.current.devices}
        assert listed == {f"{disk}p1": True, f"{disk}p2": True}
        config = config_for(f'{{"include-devices": ["{disk}*"], "allocation": "each"}}')
        (report,) = scan.scan(config, DEV, SYS, None, host)
        assert dict(report.left_out) == {disk: EACH_DISK_WITH_PARTITIONS}  # scan says so too
        # "all" mode hands every device to every holder anyway: the disk stays
        shared = Tracker(ResourceConfig(include=(f"{disk}*",)), Inventory(), DEV, SYS, host=host)
        await shared.rescan()
        assert {d.path for d in shared.inventory.current.devices} == {
            disk,
            f"{disk}p1",
            f"{disk}p2",
        }


def test_a_disk_in_one_resource_and_its_partition_in_another_overlap(tmp_path):
    require_command("partx", "util-linux")
    with loop_devices() as loops:
        disk = loops.attach(FIRST + 1, gpt_image(tmp_path / "disk.img"), partitions=True)
        whole = ResourceConfig(name="example.com/disk", include=(disk,))
        part = ResourceConfig(name="example.com/part", socket="p.sock", include=(f"{disk}p1",))
        clash = find_overlap([whole, part], DEV, SYS)
        assert clash == (
            1,
            f"example.com/part matches {disk}p1 ({_key(disk + 'p1')}) and "
            f"example.com/disk lists its whole disk {disk}",
        )
        assert find_overlap([part, whole], DEV, SYS) == (
            1,
            f"example.com/disk matches {disk} ({_key(disk)}) and "
            f"example.com/part lists its partition {disk}p1",
        )


def _key(node: str) -> str:
    st = os.stat(node)
    return f"block {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


def listed(kubelet, name: str) -> dict[str, str]:
    """What the kubelet has of the resource now: ID -> health."""
    return dict(kubelet.resources[name].devices)


def rebind(node: str, image: Path) -> None:
    """Another LUN at the same numbers: the loop number bound to another file."""
    run("losetup", "--detach", node)
    run("losetup", node, str(image))


@pytest.mark.parametrize(
    "held_since", ["this daemon", "before this daemon", "before, and the kubelet slow to say"]
)
async def test_a_loop_number_bound_to_another_file_waits_while_a_pod_holds_the_old(
    tmp_path, held_since
):
    """A pod holds a loop device's unit; the loop number is bound to another
    file (another LUN at the same numbers). The new unit waits until the
    kubelet says no pod holds the old one. When the pod is from before this
    daemon and the kubelet cannot answer at first, it waits all the same:
    what pods hold is asked again until the kubelet answers."""
    slow = held_since.endswith("slow to say")
    first = sparse(tmp_path / "first.img", 4 * MiB)
    # before: the kubelet lists the pod when powerdev starts (a restart)
    earlier = {"p1": {NAME: [identity_id("LOOP_BACKING_FILE", str(first))]}}
    second = sparse(tmp_path / "second.img", 4 * MiB)
    config = config_for(f'{{"include-devices": ["/dev/loop{FIRST + 2}"], "allocation": "each"}}')
    with trio.fail_after(LIMIT), loop_devices() as loops:
        node = loops.attach(FIRST + 2, first)
        async with daemon_and_kubelet(
            tmp_path,
            config,
            dev_root=Path("/dev"),
            sys_root=Path("/sys"),
            uevents="kernel",
            cdi_recheck_interval=0.05,
            kubelet_pods=earlier if held_since.startswith("before") else None,
            pod_resources_down=slow,
        ) as h:
            kubelet, name = h.kubelet, h.name
            units = partial(listed, kubelet, name)

            await kubelet.wait_until(lambda k: len(units()) == 1)
            (old,) = units()
            assert old.startswith("loop-file.") and units()[old] == "Healthy"
            if held_since == "this daemon":
                await kubelet.allocate(name, [old])
            kubelet.pods = {"p1": {name: [old]}}
            assert kubelet.pods == earlier
            # Another LUN at the same numbers: the pod's container may still
            # reach them, so the new unit is not granted while p1 holds the old.
            rebind(node, second)
            await kubelet.wait_until(lambda k: old not in units() and len(units()) == 1)
            (new,) = units()
            assert new != old
            await kubelet.wait_until(lambda k: units() == {new: "Unhealthy"})
            if slow:  # asked, and asked again: it waits the whole time
                asked = kubelet.pod_resources_asked
                await kubelet.wait_until(lambda k: k.pod_resources_asked > asked + 1)
                assert units() == {new: "Unhealthy"}
                kubelet.pod_resources_down = False
            asked = kubelet.pod_resources_asked
            await kubelet.wait_until(lambda k: k.pod_resources_asked > asked + 1)
            assert units() == {new: "Unhealthy"}
            kubelet.pods = {}
            await kubelet.wait_until(lambda k: units() == {new: "Healthy"})
            grant = await kubelet.allocate(name, [new])
            assert [d.host_path for d in grant.devices] == [node]


async def test_a_cdi_name_a_pod_holds_is_dropped_once_its_numbers_are_another_device(tmp_path):
    """A pod holds a loop device's unit through CDI; the loop number is bound
    to another file. The spec keeps names a pod may still be started with,
    but not this one: its numbers reach another device now, and a restarted
    container must not open it."""
    first = sparse(tmp_path / "first.img", 4 * MiB)
    second = sparse(tmp_path / "second.img", 4 * MiB)
    specs = tmp_path / "cdi"
    specs.mkdir()  # /var/run/cdi, as the DaemonSet mounts it
    config = config_for(
        f'{{"include-devices": ["/dev/loop{FIRST + 3}"], "allocation": "each", "cdi": true}}'
    )
    with trio.fail_after(LIMIT), loop_devices() as loops:
        node = loops.attach(FIRST + 3, first)
        async with daemon_and_kubelet(
            tmp_path,
            config,
            dev_root=Path("/dev"),
            sys_root=Path("/sys"),
            uevents="kernel",
            cdi_spec_dir=specs,
            cdi_recheck_interval=0.05,
        ) as h:
            kubelet, name = h.kubelet, h.name
            units = partial(listed, kubelet, name)

            await kubelet.wait_until(lambda k: len(units()) == 1)
            (old,) = units()
            await kubelet.allocate(name, [old])
            kubelet.pods = {"p1": {name: [old]}}  # and it stays held
            spec = specs / "power-dev-plugin-dev.json"
            assert old in spec.read_text()
            rebind(node, second)
            await kubelet.wait_until(lambda k: old not in units() and len(units()) == 1)
            # the spec held only that name, and the new device waits (Unhealthy):
            # nothing is left to name, so the file goes
            await wait_gone(spec)
