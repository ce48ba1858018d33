"""The DRA driver's checkpoint under faults: entries that do not parse
(reported with the file, the claim and the field; set aside and kept; the
devices they still name held until the kubelet prepares the claim anew or
unprepares it), a whole file that does not parse (kept aside), a full disk
during an unprepare (the claim is not forgotten until the file says so),
and every write of the checkpoint and the specs off the Trio thread."""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
from pathlib import Path

import pytest
import trio

from powerdev.config import ResourceConfig
from powerdev.dra import claims as claims_module
from powerdev.dra.checkpoint import EntryError, parse_entry
from powerdev.dra.claims import SET_ASIDE, ClaimRef, UnprepareError
from powerdev.resources.ownership import Ledger
from tests.unit.test_dra import DEVICES, DRIVER, FakeClaims, make_claims

LIMIT = 10
C1 = ClaimRef("ns", "c1", "uid-1")
SDB_KEY = ("b", 8, 16)
OTHER = ResourceConfig(name="example.com/other")


def held_by(ledger: Ledger, key=SDB_KEY) -> str | None:
    """The claim that holds the device, as another resource's pod sees it."""
    found = ledger.blocking(key, OTHER, "x")
    return found[1].claim if found is not None else None


async def prepared(tmp_path: Path) -> FakeClaims:
    """c1 prepared with u1 (/dev/sdb, 8:16); the API fake that gave it."""
    api = FakeClaims()
    api.allocate("c1", "uid-1", "u1")
    claims = make_claims(tmp_path, api, DEVICES)
    await claims.prepare(C1)
    return api


def restarted(tmp_path: Path, api: FakeClaims):
    claims = make_claims(tmp_path, api, DEVICES)
    claims.ledger = Ledger()
    return claims


def edit_entry(claims, change) -> None:
    data = json.loads(claims.checkpoint_path.read_text())
    data["claims"]["uid-1"] = change(data["claims"]["uid-1"])
    claims.checkpoint_path.write_text(json.dumps(data))


def without(*path):
    def change(entry):
        if len(path) == 2:
            del entry[path[0]][0][path[1]]
        else:
            del entry[path[0]]
        return entry

    return change


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (without("devices"), '"devices" must be a list, not missing'),
        (lambda e: {**e, "devices": None}, '"devices" must be a list, not null'),
        (without("spec"), '"spec" must be an object, not missing'),
        (without("devices", "pool"), '"devices"[0]: "pool" must be a string, not missing'),
        (
            lambda e: {**e, "devices": [{**e["devices"][0], "keys": "b 8 16"}]},
            '"devices"[0]: "keys" must be a list of [kind',
        ),
        (lambda e: [e], "the entry must be an object, not a list"),
    ],
)
async def test_an_entry_that_does_not_parse_is_set_aside_and_its_devices_stay_held(
    tmp_path, caplog, change, field
):
    with trio.fail_after(LIMIT):
        api = await prepared(tmp_path)
        claims = restarted(tmp_path, api)
        edit_entry(claims, change)
        kept = json.loads(claims.checkpoint_path.read_text())["claims"]["uid-1"]
        caplog.set_level(logging.ERROR, logger="powerdev.dra.claims")
        await claims.load()  # no exception: the daemon goes on

        (said,) = [r.getMessage() for r in caplog.records]
        assert str(claims.checkpoint_path) in said and "claim uid-1" in said
        assert field in said and "set aside" in said and "b 8:16" in said
        assert claims.prepared_devices() == []
        # its device is not handed to anyone else
        assert held_by(claims.ledger) == "uid-1"

        # Another claim's save keeps the entry as it was read: nothing is lost.
        api.allocate("c2", "uid-2", "u1")
        with pytest.raises(claims_module.PrepareError, match="still prepared for ResourceClaim"):
            await claims.prepare(ClaimRef("ns", "c2", "uid-2"))
        await claims._save()
        assert json.loads(claims.checkpoint_path.read_text())["claims"]["uid-1"] == kept

        # The kubelet prepares c1 again: prepared anew from its allocation.
        reads = api.reads
        (again,) = await claims.prepare(C1)
        assert api.reads == reads + 1
        assert again.cdi_ids == (f"{DRIVER}/claim=uid-1-u1",)
        entry = json.loads(claims.checkpoint_path.read_text())["claims"]["uid-1"]
        parse_entry(entry)  # well-formed again
        assert held_by(claims.ledger) == "uid-1"

        await claims.unprepare(C1)
        assert held_by(claims.ledger) is None
        assert json.loads(claims.checkpoint_path.read_text())["claims"] == {}


async def test_a_set_aside_claim_that_is_unprepared_is_forgotten(tmp_path):
    with trio.fail_after(LIMIT):
        api = await prepared(tmp_path)
        claims = restarted(tmp_path, api)
        edit_entry(claims, without("devices"))
        await claims.load()
        assert held_by(claims.ledger) == "uid-1"
        await claims.unprepare(C1)
        assert held_by(claims.ledger) is None
        assert not claims.spec_path("uid-1").exists()
        assert json.loads(claims.checkpoint_path.read_text())["claims"] == {}


async def test_a_set_aside_claim_whose_allocation_is_refused_keeps_its_devices_held(tmp_path):
    with trio.fail_after(LIMIT):
        api = await prepared(tmp_path)
        claims = restarted(tmp_path, api)
        edit_entry(claims, without("devices"))
        await claims.load()
        api.allocate("c1", "uid-1", "u9")  # a device this node does not have
        with pytest.raises(claims_module.PrepareError, match="u9 of pool"):
            await claims.prepare(C1)
        assert held_by(claims.ledger) == "uid-1"


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"{not json", "it is not JSON"),
        (b'{"version": 2, "claims": {}}', "its version is 2; this powerdev reads version 1"),
        (b'{"version": 1, "claims": []}', '"claims" is not an object'),
    ],
)
async def test_a_checkpoint_that_does_not_parse_is_kept_aside_and_said_so(
    tmp_path, caplog, content, problem
):
    with trio.fail_after(LIMIT):
        claims = restarted(tmp_path, FakeClaims())
        claims.checkpoint_path.parent.mkdir(parents=True)
        claims.checkpoint_path.write_bytes(content)
        caplog.set_level(logging.ERROR, logger="powerdev.dra.claims")
        await claims.load()
        (said,) = [r.getMessage() for r in caplog.records]
        assert problem in said and str(claims.checkpoint_path) in said
        assert (claims.checkpoint_path.parent / SET_ASIDE).read_bytes() == content
        assert not claims.checkpoint_path.exists()


def test_the_first_wrong_field_is_named():
    with pytest.raises(EntryError, match=r'"spec"."devices"\[0\]."containerEdits": "deviceNodes"'):
        parse_entry(
            {
                "namespace": "ns",
                "name": "c1",
                "spec": {"devices": [{"name": "x", "containerEdits": {}}]},
                "devices": [],
            }
        )


async def test_an_unprepare_whose_save_fails_keeps_the_claim_until_it_is_saved(
    tmp_path, monkeypatch
):
    with trio.fail_after(LIMIT):
        api = await prepared(tmp_path)
        claims = restarted(tmp_path, api)
        await claims.load()
        write = claims_module._write_in

        def disk_full(path, data):
            if path == claims.checkpoint_path:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            write(path, data)

        monkeypatch.setattr(claims_module, "_write_in", disk_full)
        with pytest.raises(UnprepareError, match=r"No space left on device.*stays prepared"):
            await claims.unprepare(C1)
        assert held_by(claims.ledger) == "uid-1"  # nothing changed
        assert claims.spec_path("uid-1").exists()

        # The kubelet tries again once there is room: now it is gone for good.
        monkeypatch.setattr(claims_module, "_write_in", write)
        await claims.unprepare(C1)
        assert held_by(claims.ledger) is None
        assert not claims.spec_path("uid-1").exists()
        after = restarted(tmp_path, api)  # the next start
        await after.load()
        assert after.prepared_devices() == [] and held_by(after.ledger) is None
        assert not after.spec_path("uid-1").exists()


async def test_every_write_of_the_checkpoint_and_specs_is_off_the_trio_thread(
    tmp_path, monkeypatch
):
    trio_thread = threading.get_ident()
    done: list[tuple[str, str, bool]] = []
    replace, unlink = os.replace, Path.unlink

    def replacing(src, dst, *args, **kwargs):
        done.append(("replace", Path(dst).name, threading.get_ident() != trio_thread))
        return replace(src, dst, *args, **kwargs)

    def unlinking(self, *args, **kwargs):
        if str(self).startswith(str(tmp_path)) and not self.name.startswith("."):
            done.append(("unlink", self.name, threading.get_ident() != trio_thread))
        return unlink(self, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replacing)
    monkeypatch.setattr(Path, "unlink", unlinking)
    with trio.fail_after(LIMIT):
        api = await prepared(tmp_path)
        claims = restarted(tmp_path, api)
        claims.spec_path("uid-1").unlink()  # the test's own, on its thread
        done.clear()
        await claims.load()  # the spec is written again
        await claims.unprepare(C1)
    spec = f"{DRIVER}-uid-1.json"
    assert done == [
        ("replace", spec, True),
        ("replace", "checkpoint.json", True),
        ("unlink", spec, True),
    ]


@pytest.mark.parametrize("kubeconfig", ["missing", "not-yaml"])
async def test_the_checkpoint_is_loaded_and_served_whatever_becomes_of_the_api_client(
    tmp_path, kubeconfig
):
    """A missing token or a kubeconfig that does not parse: the claims the
    checkpoint holds are held all the same (the device plugin side of an
    "api": "both" resource never hands their devices out), and the kubelet
    can unprepare them over the driver's socket."""
    import contextlib

    import trio_asyncio
    from grpclib.client import Channel

    from powerdev._proto.k8s.io.kubelet.pkg.apis.dra import v1
    from powerdev.daemon.dra import DraDriver
    from powerdev.daemon.settings import DraSettings
    from powerdev.dra.names import endpoint
    from powerdev.rpc import asyncio_door

    with trio.fail_after(LIMIT):
        api = await prepared(tmp_path)  # the checkpoint: tmp_path/state
        plugins_dir = tmp_path / "plugins"
        plugins_dir.mkdir()
        (tmp_path / "state").rename(plugins_dir / DRIVER)
        config = tmp_path / "kubeconfig"
        if kubeconfig == "not-yaml":
            config.write_text("{{ not: yaml")
        settings = DraSettings(
            node_name="n1",
            driver=DRIVER,
            kubeconfig=config,
            plugins_dir=plugins_dir,
            registry_dir=tmp_path / "registry",
            boot_id=tmp_path / "boot_id",
        )
        ledger = Ledger()
        async with (
            asyncio_door(),
            contextlib.AsyncExitStack() as closing,
            trio.open_nursery() as nursery,
        ):
            driver = DraDriver(settings, tmp_path / "cdi", list, nursery, closing, ledger=ledger)
            await driver.resume()
            assert held_by(ledger) == "uid-1"

            async def unprepare():
                channel = Channel(path=str(endpoint(plugins_dir, DRIVER)))
                try:
                    request = v1.NodeUnprepareResourcesRequest(
                        claims=[v1.Claim(namespace="ns", name="c1", uid="uid-1")]
                    )
                    return await v1.DraPluginStub(channel).node_unprepare_resources(request)
                finally:
                    channel.close()

            answer = await trio_asyncio.aio_as_trio(unprepare)()
            assert answer.claims["uid-1"].error == ""
            assert held_by(ledger) is None
            nursery.cancel_scope.cancel()
        assert api.reads == 1


async def test_with_a_checkpoint_that_does_not_parse_the_devices_of_the_specs_left_stay_held(
    tmp_path,
):
    with trio.fail_after(LIMIT):
        api = await prepared(tmp_path)
        claims = restarted(tmp_path, api)
        claims.checkpoint_path.write_bytes(b"\0\0\0")  # a torn write, say
        await claims.load()
        assert held_by(claims.ledger) == "uid-1"  # from its CDI spec
        (again,) = await claims.prepare(C1)  # the kubelet asks again: prepared anew
        assert again.cdi_ids == (f"{DRIVER}/claim=uid-1-u1",)
        await claims.unprepare(C1)
        assert held_by(claims.ledger) is None
        assert json.loads(claims.checkpoint_path.read_text())["claims"] == {}


def test_what_a_claim_reaches_with_admin_access_is_not_salvaged_as_held():
    from powerdev.dra.checkpoint import salvage_keys

    node = {"type": "b", "major": 8, "minor": 16, "path": "/dev/sdb", "permissions": "r"}
    entry = {
        "devices": [{"keys": [["b", 8, 16]], "admin": True, "resource": "r", "unit": "u1"}],
        "spec": {"devices": [{"containerEdits": {"deviceNodes": [node]}}]},
    }
    assert salvage_keys(entry) == []  # neither from its devices nor from its spec
    entry["devices"][0]["admin"] = False
    assert salvage_keys(entry) == [("r", "u1", [("b", 8, 16)]), (None, None, [("b", 8, 16)])]
