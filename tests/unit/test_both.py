"""The "api": "both" mode: one device, one holder across the device plugin API and
DRA. A unit prepared for a claim is Unhealthy on the device plugin side and
refused by Allocate; a unit Allocate handed out leaves what DRA offers and
is refused by prepare, until the kubelet (asked after the grant) says no pod
holds it; nothing is offered to DRA before the kubelet has said once. On a
mock clock: the only time that matters is "asked after the grant"."""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing

from powerdev.config import ResourceConfig
from powerdev.devices.inventory import Inventory
from powerdev.devices.model import Device
from powerdev.dra.claims import ClaimRef, Claims, PrepareError
from powerdev.dra.names import pool_name
from powerdev.resources.allocation import AllocationRefused
from powerdev.resources.ownership import GRANT_SETTLES, Ledger
from powerdev.resources.plugin import Plugin

DRIVER, NODE, RESOURCE = "dra.powerdev.io", "n1", "example.com/lun"
POOL = pool_name(NODE, RESOURCE)


def device(unit: str, minor: int) -> Device:
    return Device(unit, f"/dev/{unit}", "b", 8, minor, True, None, None)


class Api:
    """The API server's claims: each allocated one device of our pool."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict] = {}

    def allocate(self, name: str, uid: str, unit: str) -> ClaimRef:
        result = {"request": "r", "driver": DRIVER, "pool": POOL, "device": unit}
        self.claims[("ns", name)] = {
            "metadata": {"uid": uid},
            "status": {"allocation": {"devices": {"results": [result]}}},
        }
        return ClaimRef("ns", name, uid)

    async def claim(self, namespace: str, name: str) -> dict | None:
        await trio.lowlevel.checkpoint()
        return self.claims.get((namespace, name))


def both(tmp_path, api: str = "both") -> tuple[Plugin, Claims]:
    resource = ResourceConfig(name=RESOURCE, api=api, allocation="each")
    ledger = Ledger()
    plugin = Plugin(
        resource,
        Inventory([device("u1", 16), device("u2", 32)]),
        refresh=None,
        spec=None,
        ledger=ledger,
    )
    claims = Claims(
        DRIVER, NODE, Api(), lambda: [plugin], tmp_path / "cdi", tmp_path / "state", ledger
    )
    return plugin, claims


def kubelet_says(plugin: Plugin, held: set[str]) -> None:
    """The kubelet's PodResources answer, to an ask begun now: each of these
    units held by a pod of its own."""
    assert plugin.ledger is not None
    pods = {unit: {f"default/pod-{unit}"} for unit in held}
    plugin.ledger.answered({RESOURCE: pods}, trio.current_time())


def waits_under(claims: Claims, resource: ResourceConfig, device: Device) -> bool:
    """Does a holder other than (resource, its unit) hold the device?"""
    assert claims.ledger is not None
    return claims.ledger.blocking(device.key, resource, device.id) is not None


def health(plugin: Plugin) -> dict[str, bool]:
    return {u.id: u.healthy for u in plugin.units()}


def offered(plugin: Plugin) -> list[str]:
    return [d.id for d in plugin.offered_to_dra(plugin.inventory.current)]


@pytest.fixture
def clock():
    return trio.testing.MockClock(autojump_threshold=0)


async def test_a_prepared_unit_is_unhealthy_for_the_device_plugin_until_unprepared(tmp_path):
    plugin, claims = both(tmp_path)
    kubelet_says(plugin, set())  # no pod holds anything
    ref = claims.api.allocate("c1", "uid-1", "u1")
    version = plugin.inventory.current.version

    await claims.prepare(ref)
    assert health(plugin) == {"u1": False, "u2": True}
    assert plugin.inventory.current.version > version  # every ListAndWatch stream resends
    with pytest.raises(AllocationRefused, match="'u1' is held by a ResourceClaim"):
        plugin.allocate([["u1"]])
    assert offered(plugin) == ["u1", "u2"]  # still the claim's, in the slice

    # A restarted daemon knows it from the checkpoint before the resource serves.
    again_plugin, again = both(tmp_path)
    await again.load()
    assert health(again_plugin) == {"u1": False, "u2": True}

    # The ledger knows too: under the device plugin API alone (a reload that
    # changed "api") the device waits until the claim is unprepared.
    moved = ResourceConfig(name=RESOURCE, allocation="each")
    u1 = plugin.inventory.current.devices[0]
    assert waits_under(claims, moved, u1)

    await claims.unprepare(ref)
    assert health(plugin) == {"u1": True, "u2": True}
    assert not waits_under(claims, moved, u1)
    plugin.allocate([["u1"]])


async def test_a_unit_allocate_handed_out_returns_to_dra_only_when_no_pod_holds_it(tmp_path, clock):
    plugin, claims = both(tmp_path)
    assert offered(plugin) == []  # before the kubelet has said what pods hold
    with pytest.raises(PrepareError, match="has not said yet"):
        await claims.prepare(claims.api.allocate("c0", "uid-0", "u2"))

    kubelet_says(plugin, set())
    plugin.allocate([["u1"]])
    granted_at = trio.current_time()
    assert offered(plugin) == ["u2"]
    with pytest.raises(PrepareError, match=r"u1 of pool .* is held by a pod through the device"):
        await claims.prepare(claims.api.allocate("c1", "uid-1", "u1"))

    # An answer to an ask begun before the grant settled cannot free it ...
    await trio.sleep(GRANT_SETTLES / 2)
    kubelet_says(plugin, set())
    assert offered(plugin) == ["u2"]
    # ... nor one that says a pod holds it ...
    await trio.sleep(GRANT_SETTLES)
    kubelet_says(plugin, {"u1"})
    assert offered(plugin) == ["u2"]
    # ... the first later answer without it does.
    kubelet_says(plugin, set())
    assert trio.current_time() - granted_at > GRANT_SETTLES
    assert offered(plugin) == ["u1", "u2"]
    (prepared,) = await claims.prepare(claims.api.allocate("c2", "uid-2", "u1"))
    assert prepared.device == "u1"


async def test_what_pods_held_before_the_daemon_started_stays_out_of_dra(tmp_path):
    plugin, _ = both(tmp_path)
    kubelet_says(plugin, {"u2"})
    assert offered(plugin) == ["u1"]
    assert plugin.held_by_pods == {"u2"}


async def test_a_unit_the_kubelet_lists_again_after_a_lagging_answer_leaves_dra_again(
    tmp_path, clock
):
    """An answer that lagged behind a grant dropped it; the next one lists it
    held: it is withdrawn from what DRA offers again."""
    plugin, _ = both(tmp_path)
    kubelet_says(plugin, set())
    plugin.allocate([["u1"]])
    await trio.sleep(GRANT_SETTLES * 2)
    kubelet_says(plugin, set())  # lagging: the grant is not in it yet
    assert offered(plugin) == ["u1", "u2"]
    version = plugin.inventory.current.version
    kubelet_says(plugin, {"u1"})
    assert offered(plugin) == ["u2"]
    assert plugin.inventory.current.version > version  # the pool publishes again


async def test_resources_on_one_api_are_not_touched(tmp_path):
    for api in ("dra", "device-plugin"):
        plugin, _ = both(tmp_path / api, api)
        assert offered(plugin) == ["u1", "u2"]  # no kubelet answer needed
        assert plugin.ledger is not None
        version = plugin.inventory.version
        plugin.ledger.claimed(RESOURCE, "u1", [("b", 8, 16)], "uid-1")
        assert health(plugin) == {"u1": True, "u2": True}  # no side split: one API
        plugin.ledger.unclaimed("uid-1")
        plugin.allocate([["u1"]])
        assert offered(plugin) == ["u1", "u2"]
        # nothing to send again: no new list for the kubelet, no new pool
        assert plugin.inventory.version == version


async def test_a_unit_another_prepared_claim_holds_is_not_prepared_again(tmp_path):
    """A pod force-deleted, its claim deallocated and the device allocated to
    another claim before the kubelet unprepared the first: refused until then."""
    _, claims = both(tmp_path, "dra")
    first = await claims.prepare(claims.api.allocate("c1", "uid-1", "u1"))
    second = claims.api.allocate("c2", "uid-2", "u1")
    with pytest.raises(
        PrepareError, match=r"u1 of pool .* is still prepared for ResourceClaim ns/c1"
    ):
        await claims.prepare(second)
    await claims.unprepare(ClaimRef("ns", "c1", "uid-1"))
    (prepared,) = await claims.prepare(second)
    assert prepared.device == first[0].device


async def test_a_claim_whose_checkpoint_cannot_be_written_is_not_prepared(tmp_path):
    plugin, claims = both(tmp_path, "dra")
    claims.state_dir.parent.mkdir(parents=True, exist_ok=True)
    claims.state_dir.write_text("a file where the driver's directory should be")
    with pytest.raises(OSError):
        await claims.prepare(claims.api.allocate("c1", "uid-1", "u1"))
    assert not claims.spec_path("uid-1").exists()
    moved = ResourceConfig(name=RESOURCE, allocation="each")
    u1 = plugin.inventory.current.devices[0]
    assert not waits_under(claims, moved, u1)  # nobody was told
    claims.state_dir.unlink()
    await claims.prepare(claims.api.allocate("c1", "uid-1", "u1"))  # the kubelet's retry
    assert json.loads(claims.checkpoint_path.read_text())["claims"].keys() == {"uid-1"}
