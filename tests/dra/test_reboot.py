"""A prepared claim across a reboot, end to end (root): the kit's control
plane allocates a loop device (its identity: its backing file) to a claim,
the kubelet's DRA manager (draharness) has it prepared, and then the node
"reboots": /var/run/cdi is emptied, the boot ID changes, and the loop
numbers are dealt again, the claim's file on another number and another
file on the claim's old one. The next daemon writes the claim's spec with
the device's new numbers, never the old ones."""

from __future__ import annotations

import os

import pytest
import trio

from powerdev.devtools.cdicheck import inject
from powerdev.devtools.kit import CDICHECK
from tests.conftest import require_command, require_tool, wait_for_file
from tests.dra.test_driver import LIMIT, dra_node, powerdev
from tests.kernel.test_host_use_topology import loop_devices, run, sparse

pytestmark = pytest.mark.skipif(
    not os.path.exists("/dev/loop-control"), reason="no /dev/loop-control"
)
FIRST = 413  # loop413, loop414 (inside test_host_use_topology's range, one test at a time)
MiB = 1024 * 1024


@pytest.fixture
def cdicheck():
    return require_tool(CDICHECK)


async def test_after_a_reboot_a_prepared_claim_follows_its_device_to_its_new_numbers(
    api,
    control_plane,
    draharness,
    cdicheck,
    tmp_path,
):
    require_command("losetup", "util-linux")
    boot = tmp_path / "boot_id"
    boot.write_text("before-the-reboot\n")
    ours, other = sparse(tmp_path / "ours.img", 4 * MiB), sparse(tmp_path / "other.img", 4 * MiB)
    options = ("--sys-root", "/sys", "--boot-id-file", str(boot))
    with trio.fail_after(LIMIT), loop_devices() as loops:
        old = loops.attach(FIRST, ours)
        async with dra_node(
            api, control_plane, draharness, tmp_path, options=options, host_devices=(old,)
        ) as node:
            async with powerdev(node):
                claim = await node.pod_with_claim("p1")
                uid = claim["metadata"]["uid"]
                (ids,) = (await node.harness.prepare(node.namespace, "p1")).values()
                before = inject(cdicheck, [node.cdi], ids)
                assert before["ok"], before
                assert [(d["major"], d["minor"]) for d in before["linuxDevices"]] == [(7, FIRST)]
            # the reboot: an empty /var/run/cdi, a new boot, the numbers dealt again
            spec = node.cdi / f"{node.driver}-{uid}.json"
            spec.unlink()
            boot.write_text("after-the-reboot\n")
            run("losetup", "--detach", old)
            new = loops.attach(FIRST + 1, ours)
            run("losetup", old, str(other))  # another device at the claim's old numbers
            config = tmp_path / "config.json"
            config.write_text(config.read_text().replace(f'"{old}"', f'"{old}", "{new}"'))
            async with powerdev(node):
                await wait_for_file(spec, lambda text: ids[0].split("=")[1] in text)
                after = inject(cdicheck, [node.cdi], ids)
                assert after["ok"], after
                # the claim's own file, at its new numbers; the container's path stays
                assert [(d["path"], d["major"], d["minor"]) for d in after["linuxDevices"]] == [
                    (old, 7, FIRST + 1)
                ]
                again = await node.harness.prepare(node.namespace, "p1")  # the checkpoint answers
                assert list(again.values()) == [ids]
