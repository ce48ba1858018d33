"""The host-use rule against the real kernel (root), beyond one mounted
device: the neighbours and the whole disk of a mounted partition, the other
member of a two-device btrfs, a filesystem a swap file keeps alive after a
lazy unmount, a loop device stacked on another, an XFS external log, an
ext4 external journal, and dm and md members where the kernel has them.
Each case is judged the same way by a rescan, by a device event and by
`powerdev scan`, and comes back once the host lets go.

Loop devices are loop400-loop419, apart from powerdev.devtools.testing's 300-399."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from powerdev.config import ResourceConfig
from powerdev.devices.events import DeviceEvent
from powerdev.devices.hostuse_events import HostUseEvents
from powerdev.devices.inventory import Inventory
from powerdev.devices.table import HostFiles
from powerdev.devtools.testing import LoopControl
from powerdev.ops import scan
from powerdev.resources.allocation import AllocationRefused, check_request, grant, units
from powerdev.resources.tracker import Tracker
from tests.conftest import config_for, needs_root, require_command

pytestmark = [
    needs_root,
    pytest.mark.skipif(not os.path.exists("/dev/loop-control"), reason="no /dev/loop-control"),
]
FIRST = 400  # loop400-loop419
PATTERN = "/dev/loop4[01][0-9]*"  # those disks and their partitions (loop400p1)
MOUNTINFO = Path("/proc/self/mountinfo")
SWAPS = Path("/proc/swaps")
DEV, SYS = Path("/dev"), Path("/sys")
LIMIT = 60
MiB = 1024 * 1024


def run(*command: str, **options: object) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, **options)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(command)}: exit {done.returncode}: {done.stderr.strip()}")


def sparse(path: Path, size: int) -> Path:
    with path.open("wb") as f:
        f.truncate(size)
    return path


class Loops:
    """Loop devices made through /dev/loop-control and bound with losetup."""

    def __init__(self, control: LoopControl) -> None:
        self.control = control
        self.bound: list[str] = []

    def attach(self, index: int, backing: Path | str, *, partitions: bool = False) -> str:
        node = f"/dev/{self.control.add(index)}"
        run("losetup", *(["--partscan"] if partitions else []), node, str(backing))
        self.bound.append(node)
        if partitions:
            # The kernel adds what its own partition parsers find; partx adds
            # the rest (a kernel built without the GPT parser) through BLKPG.
            # Either way the nodes and the sysfs entries exist on return.
            run("partx", "--update", node)
        return node


@contextlib.contextmanager
def loop_devices() -> Iterator[Loops]:
    """Every loop device made here is detached and removed on the way out."""
    fd = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    loops = Loops(LoopControl(fd))
    try:
        for index in range(FIRST, FIRST + 20):  # leftovers of an interrupted run
            with contextlib.suppress(OSError, AssertionError):
                run("losetup", "--detach", f"/dev/loop{index}")
            with contextlib.suppress(OSError):
                loops.control.remove(index)
        yield loops
    finally:
        for node in reversed(loops.bound):  # the outer of two stacked loops first
            with contextlib.suppress(OSError, AssertionError):
                run("losetup", "--detach", node)
        for index in sorted(loops.control.made):
            with contextlib.suppress(OSError):
                loops.control.remove(index)
        os.close(fd)


class Mount:
    def __init__(self, node: str, where: Path, *options: str) -> None:
        where.mkdir(exist_ok=True)
        run("mount", *options, node, str(where))
        self.where = where
        self.mounted = True

    def unmount(self, *options: str) -> None:
        if self.mounted:
            self.mounted = False
            run("umount", *options, str(self.where))


@contextlib.contextmanager
def mounted(node: str, where: Path, *options: str) -> Iterator[Mount]:
    mount = Mount(node, where, *options)
    try:
        yield mount
    finally:
        mount.unmount()


def host() -> HostFiles:
    return HostFiles(MOUNTINFO, SWAPS)


def guarded_tracker() -> Tracker:
    return Tracker(ResourceConfig(include=(PATTERN,)), Inventory(), DEV, SYS, host=host())


def listed(tracker: Tracker) -> dict[str, bool]:
    return {d.path: d.healthy for d in tracker.inventory.current.devices}


async def fresh_screen() -> Tracker:
    """What a daemon starting now would list (and leave out)."""
    tracker = guarded_tracker()
    await tracker.rescan()
    return tracker


def scan_reasons() -> dict[str, str]:
    """`powerdev scan`'s left-out lines for these loop devices."""
    config = config_for(f'{{"include-devices": ["{PATTERN}"]}}')
    (report,) = scan.scan(config, DEV, SYS, None, host())
    return dict(report.left_out)


async def assert_left_out(expected: dict[str, str]) -> Tracker:
    """A fresh rescan leaves out exactly these, with these reasons, and so
    does `powerdev scan`."""
    tracker = await fresh_screen()
    assert tracker.left_out() == {p: f"the host uses it: {why}" for p, why in expected.items()}
    assert not set(expected) & set(listed(tracker))
    assert scan_reasons() == {path: f"the host uses it: {why}" for path, why in expected.items()}
    return tracker


def number_of(node: str) -> tuple[int, int]:
    st = os.stat(node)
    return os.major(st.st_rdev), os.minor(st.st_rdev)


def gpt_image(path: Path) -> Path:
    """A GPT disk: partition 1 a small BIOS boot partition (like a PReP or
    EFI partition on a real node), partition 2 the rest, for a filesystem."""
    sparse(path, 64 * MiB)
    table = "label: gpt\nsize=8MiB, type=21686148-6449-6E6F-744E-656564454649\ntype=L\n"
    require_command("sfdisk", "fdisk")
    run("sfdisk", "--quiet", str(path), input=table)
    return path


async def test_a_mounted_partition_keeps_its_disk_and_its_neighbours_out(tmp_path):
    require_command("partx", "util-linux")
    require_command("mkfs.ext4", "e2fsprogs")
    with trio.fail_after(LIMIT), loop_devices() as loops:
        disk = loops.attach(FIRST, gpt_image(tmp_path / "disk.img"), partitions=True)
        boot, root = f"{disk}p1", f"{disk}p2"
        run("mkfs.ext4", "-q", "-F", root)
        tracker = guarded_tracker()
        await tracker.rescan()
        assert listed(tracker) == {disk: True, boot: True, root: True}
        where = tmp_path / "root"
        with mounted(root, where) as mount:
            # Listed before: they stay listed, Unhealthy, and none is granted.
            await tracker.rescan()
            assert listed(tracker) == {disk: False, boot: False, root: False}
            devices = tracker.inventory.current.devices
            assert tuple(grant(devices, "rw")) == ()
            with pytest.raises(AllocationRefused):
                check_request([boot.removeprefix("/dev/")], {u.id: u for u in units(devices, 0)})
            # A daemon starting now never lists them, and says why.
            fresh = await assert_left_out(
                {
                    root: f"mounted at {where}",
                    boot: f"on the same disk as loop{FIRST}p2, which is mounted at {where}",
                    disk: f"the whole disk of loop{FIRST}p2, which is mounted at {where}",
                }
            )
            # A device event for the unmounted neighbour is screened the same way.
            fresh.apply([DeviceEvent("change", (boot,), "block", number_of(boot))])
            assert listed(fresh) == {}
            mount.unmount()
            await tracker.rescan()
            assert listed(tracker) == {disk: True, boot: True, root: True}
            # what the mount table's change flag brings in the daemon (HOST_USE)
            fresh.follow(fresh.table.host_tables_changed())
            assert listed(fresh) == {disk: True, boot: True, root: True}
            await assert_left_out({})


async def test_the_second_member_of_a_two_device_btrfs_is_kept_out(tmp_path):
    require_command("mkfs.btrfs", "btrfs-progs")
    with trio.fail_after(LIMIT), loop_devices() as loops:
        first = loops.attach(FIRST + 1, sparse(tmp_path / "a.img", 256 * MiB))
        second = loops.attach(FIRST + 2, sparse(tmp_path / "b.img", 256 * MiB))
        run("mkfs.btrfs", "-q", "-f", "-d", "single", "-m", "single", first, second)
        where = tmp_path / "data"
        with mounted(first, where) as mount:
            await assert_left_out(
                {
                    first: f"mounted at {where}",
                    second: f"in a btrfs filesystem with loop{FIRST + 1}, "
                    f"which is mounted at {where}",
                }
            )
            mount.unmount()
            await assert_left_out({})


async def test_a_swap_file_keeps_a_lazily_unmounted_filesystem_in_use(tmp_path):
    require_command("mkfs.ext4", "e2fsprogs")
    require_command("mkswap", "util-linux")
    with trio.fail_after(LIMIT), loop_devices() as loops, contextlib.ExitStack() as stack:
        node = loops.attach(FIRST + 3, sparse(tmp_path / "fs.img", 32 * MiB))
        run("mkfs.ext4", "-q", "-F", node)
        where = tmp_path / "fs"
        mount = stack.enter_context(mounted(node, where))
        swapfile = where / "swapfile"
        run("fallocate", "--length", str(8 * MiB), str(swapfile))  # swap wants no holes
        swapfile.chmod(0o600)
        run("mkswap", str(swapfile))
        events = stack.enter_context(HostUseEvents(DEV, MOUNTINFO, SWAPS))
        before = events.in_use()
        run("swapon", str(swapfile))
        # A path to the file that outlives the lazy unmount, for swapoff.
        held = os.open(where, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        stack.callback(os.close, held)
        stack.callback(run, "swapoff", f"/proc/self/fd/{held}/swapfile", pass_fds=(held,))
        assert events.in_use() != before  # a swap file going on or off is a change
        await assert_left_out({node: f"mounted at {where}"})
        mount.unmount("--lazy")
        assert node not in MOUNTINFO.read_text()  # noqa: ASYNC240 (a small proc file)
        await assert_left_out(
            {
                node: "under a live ext4 filesystem missing from the mount table, "
                "while a swap file is active (/swapfile)"
            }
        )
        stack.close()  # swapoff, then the last reference to the filesystem goes
        await assert_left_out({})


async def test_a_loop_device_holds_the_block_device_under_it(tmp_path):
    require_command("mkfs.ext4", "e2fsprogs")
    with trio.fail_after(LIMIT), loop_devices() as loops:
        inner = loops.attach(FIRST + 4, sparse(tmp_path / "inner.img", 32 * MiB))
        outer = loops.attach(FIRST + 5, inner)
        run("mkfs.ext4", "-q", "-F", inner)
        tracker = await assert_left_out({inner: f"held by loop{FIRST + 5}"})
        assert listed(tracker) == {outer: True}
        where = tmp_path / "m"
        with mounted(inner, where) as mount:  # a loop device takes no exclusive claim
            await assert_left_out(
                {
                    inner: f"mounted at {where}",
                    outer: f"on top of loop{FIRST + 4}, which is mounted at {where}",
                }
            )
            mount.unmount()
        with mounted(outer, where) as mount:
            await assert_left_out(
                {
                    outer: f"mounted at {where}",
                    inner: f"under loop{FIRST + 5}, which is mounted at {where}",
                }
            )
            mount.unmount()


async def test_an_xfs_external_log_is_kept_out(tmp_path):
    require_command("mkfs.xfs", "xfsprogs")
    with trio.fail_after(LIMIT), loop_devices() as loops:
        data = loops.attach(FIRST + 6, sparse(tmp_path / "data.img", 320 * MiB))
        log = loops.attach(FIRST + 7, sparse(tmp_path / "log.img", 64 * MiB))
        run("mkfs.xfs", "-q", "-f", "-l", f"logdev={log}", data)
        where = tmp_path / "xfs"
        with mounted(data, where, "-o", f"logdev={log}") as mount:
            await assert_left_out(
                {
                    data: f"mounted at {where}",
                    log: f"the external log of the xfs filesystem mounted at {where}",
                }
            )
            mount.unmount()
            await assert_left_out({})


async def test_an_ext4_external_journal_is_kept_out(tmp_path):
    require_command("mkfs.ext4", "e2fsprogs")
    with trio.fail_after(LIMIT), loop_devices() as loops:
        journal = loops.attach(FIRST + 8, sparse(tmp_path / "journal.img", 16 * MiB))
        data = loops.attach(FIRST + 9, sparse(tmp_path / "data.img", 32 * MiB))
        run("mkfs.ext4", "-q", "-F", "-b", "4096", "-O", "journal_dev", journal)
        run("mkfs.ext4", "-q", "-F", "-b", "4096", "-J", f"device={journal}", data)
        where = tmp_path / "ext4"
        with mounted(data, where) as mount:
            await assert_left_out(
                {
                    data: f"mounted at {where}",
                    journal: "the external journal (jbd2) of a mounted filesystem",
                }
            )
            mount.unmount()
            await assert_left_out({})


def holders(node: str) -> list[str]:
    return os.listdir(f"/sys/class/block/{node.removeprefix('/dev/')}/holders")


def kernel_has_device_mapper() -> bool:
    try:
        return "device-mapper" in Path("/proc/misc").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not kernel_has_device_mapper(), reason="this kernel has no device-mapper")
async def test_the_legs_of_a_dm_map_are_held(tmp_path):
    require_command("dmsetup", "dmsetup")
    name = "powerdev-test-linear"
    with trio.fail_after(LIMIT), loop_devices() as loops, contextlib.ExitStack() as stack:
        leg = loops.attach(FIRST + 10, sparse(tmp_path / "leg.img", 16 * MiB))
        with contextlib.suppress(AssertionError):
            run("dmsetup", "remove", name)  # a leftover of an interrupted run
        run("dmsetup", "create", name, "--table", f"0 {16 * MiB // 512} linear {leg} 0")
        stack.callback(run, "dmsetup", "remove", name)
        (dm,) = holders(leg)
        assert dm.startswith("dm-")
        await assert_left_out({leg: f"held by {dm}"})


@pytest.mark.skipif(not os.path.exists("/proc/mdstat"), reason="this kernel has no md driver")
async def test_the_members_of_an_md_array_are_held(tmp_path):
    require_command("mdadm", "mdadm")
    with trio.fail_after(LIMIT), loop_devices() as loops, contextlib.ExitStack() as stack:
        a = loops.attach(FIRST + 11, sparse(tmp_path / "a.img", 32 * MiB))
        b = loops.attach(FIRST + 12, sparse(tmp_path / "b.img", 32 * MiB))
        array = "/dev/md/powerdev-test"
        run(
            "mdadm", "--create", array, "--run", "--level=1", "--raid-devices=2",
            "--metadata=1.2", "--assume-clean", a, b,
        )  # fmt: skip
        stack.callback(run, "mdadm", "--stop", array)
        (md,) = holders(a)
        assert md.startswith("md")
        await assert_left_out({a: f"held by {md}", b: f"held by {md}"})


async def test_a_holder_that_comes_and_goes_is_seen_by_its_event_alone(tmp_path):
    # No rescan: the event of the loop device stacked on a listed one is
    # enough, both ways (joined now when it comes, joined before when it goes).
    with trio.fail_after(LIMIT), loop_devices() as loops:
        inner = loops.attach(FIRST + 13, sparse(tmp_path / "inner.img", 8 * MiB))
        bystander = loops.attach(FIRST + 14, sparse(tmp_path / "other.img", 8 * MiB))
        tracker = guarded_tracker()
        await tracker.rescan()
        assert listed(tracker) == {inner: True, bystander: True}
        outer = loops.attach(FIRST + 15, inner)
        number = number_of(outer)
        tracker.apply([DeviceEvent("add", (outer,), "block", number)])
        # held by the outer one: Unhealthy; the outer one is free to grant
        assert listed(tracker) == {inner: False, bystander: True, outer: True}
        # what the next event of the outer one looks at again: not the bystander
        touched = tracker.table.joined_to([number])
        assert touched == {tracker.table.key_of(inner), tracker.table.key_of(outer)}
        run("losetup", "--detach", outer)
        tracker.apply([DeviceEvent("change", (outer,), "block", number)])
        # the inner one is free again; the outer one, detached, has no medium
        assert listed(tracker) == {inner: True, bystander: True, outer: False}
