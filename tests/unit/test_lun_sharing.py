"""LUNs for cluster filesystems ("shared": true with "scope": "cluster"):
the config's rule, the report's flag, the merge that shares a resource's
LUNs only when every node says so, and the node's ledger, in which the
claims of a shared LUN hold it together."""

from __future__ import annotations

import dataclasses
import json

import pytest
import trio
import trio.testing

from powerdev.config import ConfigError, ResourceConfig, parse_config
from powerdev.devices.inventory import Inventory
from powerdev.dra.claims import ClaimRef, Claims, PrepareError, UnprepareError
from powerdev.dra.luns import (
    Report,
    cluster_pool_name,
    merge,
    parse_report,
    report_body,
    sharing_conflict,
)
from powerdev.resources.ownership import SHARED_CLAIMS, Ledger
from powerdev.resources.plugin import Plugin
from tests.unit.test_both import DRIVER, NODE, RESOURCE, device
from tests.unit.test_luns import HOSTS, LUN

POOL = cluster_pool_name(RESOURCE)


def config(**fields) -> ResourceConfig:
    entry = {"name": "r/lun", "include-devices": ["/dev/mapper/*"], **fields}
    (resource,) = parse_config(json.dumps({"resources": [entry]}), source="config.json").resources
    return resource


def test_shared_is_for_luns_published_once_for_the_cluster():
    assert config(api="dra", scope="cluster", shared=True).shared
    assert not config(api="dra", scope="cluster").shared
    with pytest.raises(ConfigError, match=r"resources\[0\]\.shared.*set \"scope\": \"cluster\""):
        config(api="dra", shared=True)
    with pytest.raises(ConfigError, match=r"resources\[0\]\.shared': is a JSON string"):
        config(api="dra", scope="cluster", shared="yes")


def test_a_report_says_whether_its_nodes_config_shares_the_resource():
    body = report_body("ns", "a", "d", "r/lun", [LUN], 7, shared=True)
    assert body["data"]["shared"] == "true"
    assert parse_report(body).shared
    assert not parse_report(report_body("ns", "a", "d", "r/lun", [LUN], 7)).shared
    older = report_body("ns", "a", "d", "r/lun", [LUN], 7)
    del older["data"]["shared"]  # a powerdev from before "shared": one claim at a time
    assert not parse_report(older).shared
    older["data"]["shared"] = "yes"
    with pytest.raises(ValueError, match="its shared is 'yes'"):
        parse_report(older)


def test_a_luns_device_is_shared_only_when_every_node_says_so():
    def shared_by(*nodes: str) -> list[Report]:
        return [Report(n, "d", "r/lun", (LUN,), n in nodes) for n in ("a", "b")]

    (device,), _ = merge("r/lun", shared_by("a", "b"), HOSTS)
    assert device["allowMultipleAllocations"] is True
    # unset, a claim would consume the whole size: one claim again
    assert device["capacity"]["size"]["requestPolicy"] == {"default": "0"}
    assert sharing_conflict("r/lun", shared_by("a", "b")) is None

    (device,), _ = merge("r/lun", shared_by("a"), HOSTS)
    assert "allowMultipleAllocations" not in device
    assert device["capacity"] == {"size": {"value": str(LUN.size)}}
    said = sharing_conflict("r/lun", shared_by("a"))
    assert said is not None and said.startswith('nodes b do not say "shared": true')
    assert sharing_conflict("r/lun", shared_by()) is None  # exclusive everywhere: nothing to say


def node(tmp_path, *, shared: bool) -> tuple[Plugin, Claims, dict]:
    resource = ResourceConfig(
        name=RESOURCE, api="dra", allocation="each", scope="cluster", shared=shared
    )
    ledger = Ledger()
    plugin = Plugin(resource, Inventory([device("u1", 16)]), refresh=None, spec=None, ledger=ledger)
    allocated: dict = {}

    class Api:
        async def claim(self, namespace: str, name: str) -> dict | None:
            return allocated.get((namespace, name))

    claims = Claims(
        DRIVER, NODE, Api(), lambda: [plugin], tmp_path / "cdi", tmp_path / "state", ledger
    )
    return plugin, claims, allocated


def allocate(allocated: dict, name: str, uid: str) -> ClaimRef:
    result = {"request": "r", "driver": DRIVER, "pool": POOL, "device": "u1", "shareID": uid[::-1]}
    allocated[("ns", name)] = {
        "metadata": {"uid": uid},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }
    return ClaimRef("ns", name, uid)


def holder(plugin: Plugin):
    (only,) = plugin.inventory.current.devices
    assert plugin.ledger is not None
    return plugin.ledger.holder_of(only.key)


async def restarted_with_two_sharers(tmp_path, *, shared: bool) -> tuple[Plugin, Claims]:
    """Claims one and two prepared on a shared LUN; then powerdev started
    again with `shared` in its config, its checkpoint loaded."""
    _, claims, allocated = node(tmp_path, shared=True)
    await claims.prepare(allocate(allocated, "one", "uid-1"))
    await claims.prepare(allocate(allocated, "two", "uid-2"))
    plugin, again, _ = node(tmp_path, shared=shared)
    await again.load()
    return plugin, again


async def test_the_claims_of_a_shared_lun_hold_it_together_until_the_last_lets_go(tmp_path):
    plugin, claims, allocated = node(tmp_path, shared=True)
    one = allocate(allocated, "one", "uid-1")
    two = allocate(allocated, "two", "uid-2")
    (first,) = await claims.prepare(one)
    (second,) = await claims.prepare(two)
    assert (first.share_id, second.share_id) == ("1-diu", "2-diu")  # each its own share
    assert holder(plugin).claim == SHARED_CLAIMS
    assert "the ResourceClaims that share it" in str(holder(plugin))
    await claims.unprepare(one)
    assert holder(plugin).claim == SHARED_CLAIMS  # "two" still has it
    await claims.unprepare(two)
    assert holder(plugin) is None


async def test_a_restart_holds_a_shared_lun_for_its_claims_and_keeps_their_shares(tmp_path):
    plugin, again = await restarted_with_two_sharers(tmp_path, shared=True)
    assert holder(plugin).claim == SHARED_CLAIMS
    (prepared,) = await again.prepare(ClaimRef("ns", "two", "uid-2"))
    assert prepared.share_id == "2-diu"  # from the checkpoint: the API server is not asked
    await again.unprepare(ClaimRef("ns", "one", "uid-1"))
    assert holder(plugin).claim == SHARED_CLAIMS
    await again.unprepare(ClaimRef("ns", "two", "uid-2"))
    assert holder(plugin) is None


async def test_an_exclusive_lun_is_still_one_claims(tmp_path):
    plugin, claims, allocated = node(tmp_path, shared=False)
    await claims.prepare(allocate(allocated, "one", "uid-1"))
    with pytest.raises(PrepareError, match="still prepared for ResourceClaim ns/one"):
        await claims.prepare(allocate(allocated, "two", "uid-2"))
    assert holder(plugin).claim == "uid-1"


async def test_a_shared_lun_is_let_go_by_its_last_claim_though_sharing_was_turned_off_meanwhile(
    tmp_path,
):
    """A reload sets "shared": false while a claim holds the LUN shared: the
    claim's own record says how it holds it, so its unprepare lets the LUN
    go, and a new claim (exclusive now) is prepared."""
    plugin, claims, allocated = node(tmp_path, shared=True)
    one = allocate(allocated, "one", "uid-1")
    await claims.prepare(one)
    await plugin.reconfigure(dataclasses.replace(plugin.resource, shared=False))
    with pytest.raises(PrepareError, match="the ResourceClaims that share it"):
        await claims.prepare(allocate(allocated, "two", "uid-2"))  # not beside a shared hold
    await claims.unprepare(one)
    assert holder(plugin) is None
    await claims.prepare(allocate(allocated, "three", "uid-3"))
    assert holder(plugin).claim == "uid-3"


async def test_a_restart_with_sharing_off_keeps_the_lun_held_while_any_sharer_is_prepared(
    tmp_path,
):
    """Two claims share the LUN; powerdev restarts with "shared": false (a
    new ConfigMap, the DaemonSet rolled): both still hold it together, and
    it is let go only when the last is unprepared."""
    plugin, again = await restarted_with_two_sharers(tmp_path, shared=False)
    assert holder(plugin).claim == SHARED_CLAIMS
    await again.unprepare(ClaimRef("ns", "two", "uid-2"))
    assert holder(plugin).claim == SHARED_CLAIMS  # "one" is still prepared
    await again.unprepare(ClaimRef("ns", "one", "uid-1"))
    assert holder(plugin) is None


async def test_a_sharer_whose_unprepare_fails_keeps_the_lun_held(tmp_path, monkeypatch):
    """Two sharers unprepared at once: the first's save is done, the
    second's fails (a full disk). The second stays prepared, and so the
    LUN stays held: the first did not let it go while the second's save
    was under way."""
    plugin, claims, allocated = node(tmp_path, shared=True)
    one, two = allocate(allocated, "one", "uid-1"), allocate(allocated, "two", "uid-2")
    await claims.prepare(one)
    await claims.prepare(two)
    saving = claims._save
    second_saves = trio.Event()
    done_first = trio.Event()

    async def save(leaving: str | None = None) -> None:
        if leaving == "uid-2" and not second_saves.is_set():
            second_saves.set()
            await done_first.wait()  # the first's unprepare ends meanwhile
            raise OSError(28, "No space left on device")
        await saving(leaving)

    monkeypatch.setattr(claims, "_save", save)
    async with trio.open_nursery() as nursery:

        async def second() -> None:
            with pytest.raises(UnprepareError):
                await claims.unprepare(two)

        nursery.start_soon(second)
        await second_saves.wait()
        await claims.unprepare(one)
        done_first.set()
    assert "uid-2" in claims._held
    assert holder(plugin).claim == SHARED_CLAIMS
    # and the file says so too: the first's save kept the second, whose own
    # save had not been done; started again, the LUN is held for it
    assert list(json.loads(claims.checkpoint_path.read_text())["claims"]) == ["uid-2"]
    plugin, again, _ = node(tmp_path, shared=True)
    await again.load()
    assert holder(plugin).claim == SHARED_CLAIMS


async def test_an_unprepare_cancelled_before_its_save_keeps_the_claim_held(tmp_path):
    """The kubelet's deadline passes while the unprepare waits for another
    save: the claim stays prepared and held, in memory as on disk, and the
    kubelet's next try lets it go."""
    plugin, claims, allocated = node(tmp_path, shared=True)
    one = allocate(allocated, "one", "uid-1")
    await claims.prepare(one)
    release = trio.Event()

    async def another_save() -> None:
        async with claims._saving:
            await release.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(another_save)
        await trio.testing.wait_all_tasks_blocked()
        with trio.move_on_after(0.05) as waited:
            await claims.unprepare(one)
        assert waited.cancelled_caught
        release.set()
    assert "uid-1" in claims._held and holder(plugin).claim == SHARED_CLAIMS
    await claims.unprepare(one)
    assert holder(plugin) is None
    assert json.loads(claims.checkpoint_path.read_text())["claims"] == {}


async def test_an_admin_claim_from_a_checkpoint_before_shared_was_written_holds_nothing(tmp_path):
    """A checkpoint an earlier powerdev wrote has no "shared": a device with
    a shareID is taken for a shared one, unless the claim has admin access,
    which never holds; the last real sharer lets the LUN go."""
    plugin, claims, allocated = node(tmp_path, shared=True)
    one = allocate(allocated, "one", "uid-1")
    await claims.prepare(one)
    (result,) = allocated[("ns", "one")]["status"]["allocation"]["devices"]["results"]
    admin = {**result, "shareID": "admin-share", "adminAccess": True}
    allocated[("ns", "adm")] = {
        "metadata": {"uid": "uid-adm"},
        "status": {"allocation": {"devices": {"results": [admin]}}},
    }
    await claims.prepare(ClaimRef("ns", "adm", "uid-adm"))
    data = json.loads(claims.checkpoint_path.read_text())
    for entry in data["claims"].values():
        for written in entry["devices"]:
            written.pop("shared", None)
    claims.checkpoint_path.write_text(json.dumps(data))
    plugin, again, _ = node(tmp_path, shared=True)
    await again.load()
    assert holder(plugin).claim == SHARED_CLAIMS  # "one", read as shared by its shareID
    await again.unprepare(one)
    assert holder(plugin) is None


async def test_one_claim_given_a_shared_lun_twice_gets_two_cdi_devices_of_distinct_names(
    tmp_path,
):
    """With allowMultipleAllocations one claim's two requests may get the
    same LUN (two shareIDs): its spec names two devices, never one name
    twice (the runtime refuses such a spec)."""
    plugin, claims, allocated = node(tmp_path, shared=True)
    results = [
        {"request": request, "driver": DRIVER, "pool": POOL, "device": "u1", "shareID": share}
        for request, share in (("a", "share-a"), ("b", "share-b"))
    ]
    allocated[("ns", "c")] = {
        "metadata": {"uid": "uid-c"},
        "status": {"allocation": {"devices": {"results": results}}},
    }
    prepared = await claims.prepare(ClaimRef("ns", "c", "uid-c"))
    assert [p.share_id for p in prepared] == ["share-a", "share-b"]
    ids = [i for p in prepared for i in p.cdi_ids]
    assert len(set(ids)) == 2
    spec = json.loads(claims.spec_path("uid-c").read_text())
    names = [d["name"] for d in spec["devices"]]
    assert len(set(names)) == 2 and all(i.rpartition("=")[2] in names for i in ids)
    await claims.unprepare(ClaimRef("ns", "c", "uid-c"))
    assert holder(plugin) is None
