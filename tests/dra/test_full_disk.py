"""An unprepare whose checkpoint cannot be saved (a full disk, a real
tmpfs filled up) with the kubelet's DRA manager (draharness): the kubelet
is told, the claim stays prepared (and is so after a restart: it was
never forgotten while the file held it), and once there is room the
kubelet's next try unprepares it, for good: a restart does not bring it
back."""

from __future__ import annotations

import contextlib
import errno
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from powerdev.devtools.harness import HarnessError
from powerdev.devtools.testing import is_root
from powerdev.dra.claims import CHECKPOINT
from tests.dra.test_driver import dra_node, powerdev
from tests.dra.test_harness import dirs

pytestmark = pytest.mark.skipif(not is_root(), reason="needs root: a tmpfs mount, mknod")

LIMIT = 90


@contextlib.contextmanager
def small_tmpfs(where: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted on `where` (made if need be), unmounted after."""
    import subprocess

    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(where: Path) -> Path:
    """`where` filled up: a file written until the disk refuses; the file."""
    filler = where / "filler"
    with filler.open("wb", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * 4096)
        except OSError as err:
            assert err.errno == errno.ENOSPC
    return filler


def held_claims(node_dir: Path) -> dict:
    return json.loads((node_dir / CHECKPOINT).read_text())["claims"]


async def test_an_unprepare_that_cannot_be_saved_keeps_the_claim_until_it_can(
    api, control_plane, draharness, tmp_path
):
    _, plugins, _ = dirs(tmp_path)
    with small_tmpfs(plugins), trio.fail_after(LIMIT):
        async with dra_node(api, control_plane, draharness, tmp_path) as node:
            state = plugins / node.driver
            async with powerdev(node):
                claim = await node.pod_with_claim("p1")
                uid = claim["metadata"]["uid"]
                ids = await node.harness.prepare(node.namespace, "p1")
                assert uid in held_claims(state)
                filler = fill(plugins)
                with pytest.raises(HarnessError, match="cannot be written"):
                    await node.harness.unprepare(node.namespace, "p1")
                assert uid in held_claims(state)
            async with powerdev(node):  # started again: still prepared, as the file says
                assert uid in held_claims(state)
                assert await node.harness.prepare(node.namespace, "p1") == ids
                filler.unlink()  # room again: the kubelet's next try
                await node.harness.unprepare(node.namespace, "p1")
                assert held_claims(state) == {}
            async with powerdev(node):  # and it does not come back
                assert held_claims(state) == {}
                assert not (node.cdi / f"{node.driver}-{uid}.json").exists()
