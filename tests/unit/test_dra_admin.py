"""A claim with admin access (adminAccess: true in its allocation): never a
holder. It is prepared on a device another claim holds, an ordinary claim
is prepared on a device it has, and its CDI spec lets the container read
the device only."""

from __future__ import annotations

import json

import pytest

from powerdev.dra.claims import ClaimRef, PrepareError
from tests.unit.test_both import DRIVER, POOL, both


def allocate(claims, name: str, uid: str, unit: str, *, admin: bool = False) -> ClaimRef:
    result = {"request": "r", "driver": DRIVER, "pool": POOL, "device": unit}
    if admin:
        result["adminAccess"] = True
    claims.api.claims[("ns", name)] = {
        "metadata": {"uid": uid},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }
    return ClaimRef("ns", name, uid)


def permissions(claims, uid: str) -> list[str]:
    spec = json.loads(claims.spec_path(uid).read_text())
    return [n["permissions"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]]


def holder_of(plugin, unit: str):
    (device,) = [d for d in plugin.inventory.current.devices if d.id == unit]
    return plugin.ledger.holder_of(device.key)


async def test_admin_access_is_prepared_on_a_device_another_claim_holds(tmp_path):
    plugin, claims = both(tmp_path, api="dra")
    await claims.prepare(allocate(claims, "app", "uid-app", "u1"))
    (prepared,) = await claims.prepare(allocate(claims, "look", "uid-look", "u1", admin=True))
    assert list(prepared.cdi_ids) == [f"{DRIVER}/claim=uid-look-u1"]
    assert permissions(claims, "uid-look") == ["r"]
    assert permissions(claims, "uid-app") == ["rw"]
    assert holder_of(plugin, "u1").claim == "uid-app"  # still the one holder
    await claims.unprepare(ClaimRef("ns", "look", "uid-look"))
    assert holder_of(plugin, "u1").claim == "uid-app"
    assert not claims.spec_path("uid-look").exists()


async def test_an_ordinary_claim_is_prepared_on_a_device_admin_access_has(tmp_path):
    plugin, claims = both(tmp_path, api="dra")
    await claims.prepare(allocate(claims, "look", "uid-look", "u2", admin=True))
    assert holder_of(plugin, "u2") is None  # admin access holds nothing
    await claims.prepare(allocate(claims, "app", "uid-app", "u2"))
    assert holder_of(plugin, "u2").claim == "uid-app"
    # a second ordinary claim is still refused: the first holds it
    with pytest.raises(PrepareError, match="still prepared for ResourceClaim ns/app"):
        await claims.prepare(allocate(claims, "other", "uid-other", "u2"))


async def test_a_restart_keeps_admin_access_out_of_the_ledger(tmp_path):
    _, claims = both(tmp_path, api="dra")
    await claims.prepare(allocate(claims, "look", "uid-look", "u1", admin=True))
    again_plugin, again = both(tmp_path, api="dra")
    await again.load()
    assert holder_of(again_plugin, "u1") is None
    await again.prepare(allocate(again, "app", "uid-app", "u1"))
    assert holder_of(again_plugin, "u1").claim == "uid-app"
