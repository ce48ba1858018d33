"""DRA's pure parts and its claims' logic, with tables and fakes: device
and driver names, what a pool publishes, generations and stale slices, the
config's "api" field, and NodePrepare/NodeUnprepare (a per-claim error for
each way a claim can be wrong, idempotence, one API read under concurrent
calls, the checkpoint and the spec rewritten after a restart)."""

from __future__ import annotations

import json

import pytest
import trio
import trio.lowlevel
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from powerdev.config import ConfigError, ResourceConfig, parse_config
from powerdev.devices.condition import DEGRADED, FAILED, FINE, Condition
from powerdev.devices.inventory import Inventory
from powerdev.devices.model import Device
from powerdev.dra.claims import ClaimRef, Claims, PrepareError
from powerdev.dra.health import assess_all
from powerdev.dra.names import MAX_LABEL, device_name, driver_problem, pool_name
from powerdev.dra.placement import CLUSTER_POOL, MAX_DEVICES_WITH_TAINTS, place
from powerdev.dra.slices import CONDITION_TAINT, Pool, build_devices, build_slices
from powerdev.resources.plugin import Plugin

LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"


@pytest.mark.parametrize(
    ("unit_id", "expected"),
    [
        ("loop4", "loop4"),
        ("char-120-0", "char-120-0"),
        ("dm-uuid.mpath-3600a0b8", None),  # "." made "-": a hash appended
        ("Serial.ABC", None),
        ("x" * 64, None),  # too long: cut, and a hash
        ("___", None),
    ],
)
def test_device_names_are_dns_labels_and_stable(unit_id, expected):
    import re

    name = device_name(unit_id)
    assert re.fullmatch(LABEL, name) and len(name) <= MAX_LABEL
    assert name == device_name(unit_id)  # the same on every run
    if expected is not None:
        assert name == expected
    else:
        assert name != unit_id and re.search(r"-[0-9a-f]{8}$", name)


def test_two_ids_made_alike_get_two_names():
    assert device_name("a.b") != device_name("a_b")


@pytest.mark.parametrize(
    ("driver", "ok"),
    [
        ("dra.powerdev.io", True),
        ("a", True),
        ("Dra.io", False),
        ("a_b.io", False),
        ("a." * 130, False),
    ],
)
def test_the_driver_name_is_a_dns_subdomain(driver, ok):
    assert (driver_problem(driver) is None) is ok


def dev(path, minor, *, healthy=True, identity=None, numa=None, kind="b", unit=None):
    return Device(unit or path.rsplit("/", 1)[-1], path, kind, 8, minor, healthy, numa, identity)


def test_a_pool_publishes_one_device_per_healthy_unit_with_its_attributes(caplog):
    devices = [
        dev("/dev/dm-0", 0, identity="WWID=naa.600a", numa=1, unit="u1"),
        dev("/dev/mapper/mpatha", 0, identity="WWID=naa.600a", numa=1, unit="u1"),
        dev("/dev/sdb", 16, identity="ID_SERIAL=" + "S" * 65, unit="u2"),  # too long: left out
        dev("/dev/sdc", 32, healthy=False, unit="u3"),
        dev("/dev/" + "p" * 70, 48, kind="c", unit="u4"),  # a path over 64 characters
    ]
    said: set = set()
    published = {
        d["name"]: d["attributes"] for d in build_devices("example.com/lun", devices, said=said)
    }
    assert set(published) == {"u1", "u2", "u4"}
    assert published["u1"] == {
        "resource": {"string": "example.com/lun"},
        "kind": {"string": "block"},
        "path": {"string": "/dev/dm-0"},  # the shortest name
        "major": {"int": 8},
        "minor": {"int": 0},
        "wwid": {"string": "naa.600a"},
        "numaNode": {"int": 1},
    }
    assert "serial" not in published["u2"]
    assert "path" not in published["u4"] and published["u4"]["kind"] == {"string": "char"}
    lines = [r.getMessage() for r in caplog.records if "published without" in r.getMessage()]
    assert lines == [
        "example.com/lun: /dev/sdb is published without its serial attribute: longer than "
        "the 64 characters the API allows",
        f"example.com/lun: /dev/{'p' * 70} is published without its path attribute: longer "
        "than the 64 characters the API allows",
    ]
    build_devices("example.com/lun", devices, said=said)  # said once
    assert len([r for r in caplog.records if "published without" in r.getMessage()]) == 2


@pytest.mark.parametrize(
    ("count", "sizes"), [(0, [0]), (1, [1]), (56, [56]), (57, [56, 1]), (300, [56] * 5 + [20])]
)
def test_a_new_pool_fills_its_slices_to_56_of_64_and_says_how_many_there_are(count, sizes):
    """A node pool's slice holds at most 64 (any device may get a taint);
    packed anew, 56, leaving room for devices that come."""
    devices = [{"name": f"d{i}"} for i in range(count)]
    slices = build_slices("dra.powerdev.io", "n1", "example.com/lun", devices, 7)
    assert [len(s["spec"]["devices"]) for s in slices] == sizes
    for s in slices:
        assert s["spec"]["pool"] == {
            "name": pool_name("n1", "example.com/lun"),
            "generation": 7,
            "resourceSliceCount": len(sizes),
        }
        assert s["spec"]["nodeName"] == "n1"
    assert len({s["metadata"]["name"] for s in slices}) == len(sizes)


class Conditions:
    """What a tracker says of each device's own health, by path: the level,
    and whether a failed one would be offered but for its failure."""

    def __init__(self, levels: dict[str, str], otherwise_bad: frozenset[str] = frozenset()):
        self.levels = levels
        self.otherwise_bad = otherwise_bad

    def condition_of(self, device):
        return Condition(self.levels.get(device.path, FINE))

    def offered_but_for_failure(self, device):
        return device.path not in self.otherwise_bad


def test_health_is_a_taint_degraded_none_failed_noschedule_and_otherwise_bad_stays_out():
    devices = [
        dev("/dev/sda", 0, unit="fine"),
        dev("/dev/sdb", 16, unit="degraded"),
        dev("/dev/sdc", 32, healthy=False, unit="failed"),
        dev("/dev/sdd", 48, healthy=False, unit="failed-and-held"),
        dev("/dev/sde", 64, healthy=False, unit="held"),
    ]
    health = Conditions(
        {"/dev/sdb": DEGRADED, "/dev/sdc": FAILED, "/dev/sdd": FAILED},
        otherwise_bad=frozenset({"/dev/sdd"}),
    )
    published = {d["name"]: d for d in build_devices("example.com/lun", devices, health)}
    assert sorted(published) == ["degraded", "failed", "fine"]
    assert "taints" not in published["fine"]
    assert published["degraded"]["taints"] == [
        {"key": CONDITION_TAINT, "value": "degraded", "effect": "None"}
    ]
    assert published["failed"]["taints"] == [
        {"key": CONDITION_TAINT, "value": "failed", "effect": "NoSchedule"}
    ]
    # without a tracker to ask: no taints, and no failed device
    assert sorted(d["name"] for d in build_devices("example.com/lun", devices)) == [
        "degraded",
        "fine",
    ]


async def test_a_unit_built_before_is_reused_until_its_names_or_condition_change():
    from powerdev.dra.slices import build_devices_in_steps

    devices = [dev(f"/dev/sd{c}", i * 16, unit=f"u{i}") for i, c in enumerate("abcd")]
    health = Conditions({})
    built: dict = {}
    first = await build_devices_in_steps("example.com/lun", devices, health, built=built)
    assert first == build_devices("example.com/lun", devices, health)  # the same devices
    devices[1] = dev("/dev/sdb", 16, unit="u1", numa=1)  # this one changed
    health.levels["/dev/sdc"] = DEGRADED  # and this one's condition
    second = await build_devices_in_steps("example.com/lun", devices, health, built=built)
    assert second == build_devices("example.com/lun", devices, health)
    by_name = {d["name"]: d for d in first}
    assert [d is by_name[d["name"]] for d in second] == [True, False, False, True]
    assert second[1]["attributes"]["numaNode"] == {"int": 1}
    assert second[2]["taints"][0]["value"] == "degraded"
    del devices[3]  # a unit gone is forgotten
    await build_devices_in_steps("example.com/lun", devices, health, built=built)
    assert sorted(built) == ["u0", "u1", "u2"]


@pytest.mark.parametrize("tainted", [(), (0,), (100,), (55, 56), (199,)])
def test_taints_change_no_slice_of_a_node_pool(tainted):
    """Every slice of a node pool is within the 64 a tainted device allows,
    so where the taints are moves nobody."""
    taint = [{"key": CONDITION_TAINT, "value": "degraded", "effect": "None"}]
    devices = [
        {"name": f"d{i:03}", **({"taints": taint} if i in tainted else {})} for i in range(200)
    ]
    slices = build_slices("dra.powerdev.io", "n1", "example.com/lun", devices, 1)
    assert [len(s["spec"]["devices"]) for s in slices] == [56, 56, 56, 32]
    assert max(len(s["spec"]["devices"]) for s in slices) <= MAX_DEVICES_WITH_TAINTS
    assert [d for s in slices for d in s["spec"]["devices"]] == devices  # in order, all of them


def test_a_cluster_pool_fills_its_slices_to_112_of_128_and_takes_no_taint():
    devices = [{"name": f"d{i:03}"} for i in range(300)]
    slots, count = place({}, 0, devices, CLUSTER_POOL)
    assert count == 3 and max(slots.values()) == 2
    assert sum(1 for i in slots.values() if i == 0) == 112
    with pytest.raises(ValueError, match="at most 64"):
        place({}, 0, [{"name": "x", "taints": []}], CLUSTER_POOL)


def named(*names: str, tainted: tuple[str, ...] = ()) -> list[dict]:
    taint = [{"key": CONDITION_TAINT, "value": "degraded", "effect": "None"}]
    return [{"name": n, **({"taints": taint} if n in tainted else {})} for n in sorted(names)]


def units(n: int) -> list[str]:
    return [f"u{i:05}" for i in range(n)]


async def test_a_one_device_change_is_one_write_at_the_same_generation():
    api = FakeSlices()
    pool = Pool(api, DRIVER, NODE, RESOURCE)
    everyone = units(1000)
    assert await pool.publish(named(*everyone)) == 18  # a new pool: every slice (56 each)
    assert pool.generation == 1
    before = {k: v["spec"]["devices"] for k, v in api.slices.items()}
    assert await pool.publish(named(*everyone, "u99999")) == 1  # one came
    assert pool.generation == 1
    changed = [k for k, v in api.slices.items() if v["spec"]["devices"] != before[k]]
    assert len(changed) == 1
    assert await pool.publish(named(*everyone[1:], "u99999")) == 1  # one went
    # a device turns degraded: its taint fits its slice, nobody moves
    assert await pool.publish(named(*everyone[1:], "u99999", tainted=("u00500",))) == 1
    assert pool.generation == 1
    assert all(len(v["spec"]["devices"]) <= 64 for v in api.slices.values())
    # two slices' devices changed at once: a new generation on every slice
    assert await pool.publish(named(*everyone[2:-1], "u99999")) == len(api.slices)
    assert pool.generation == 2


# a run of device numbers (start, length) with some gone, and the tainted ones
RUNS = st.tuples(
    st.integers(0, 300),
    st.integers(0, 400),
    st.sets(st.integers(0, 700), max_size=40),
    st.sets(st.integers(0, 700)),
)


@given(st.lists(RUNS, min_size=1, max_size=8))
def test_placing_keeps_every_device_in_one_slice_within_the_limits(steps):
    """Whatever comes and goes (and is tainted), up to 400 devices: every
    device in exactly one slice, no slice over 64, a device that stays
    keeps its slice unless the pool was packed anew, and a slice is added
    only when every slice is full."""
    slots: dict[str, int] = {}
    count = 0
    for start, length, gone, tainted in steps:
        present = set(range(start, start + length)) - gone
        devices = named(*(f"u{i:03}" for i in present), tainted=tuple(f"u{i:03}" for i in tainted))
        before = dict(slots)
        slots, new_count = place(slots, count, devices)
        assert set(slots) == {d["name"] for d in devices}
        assert all(0 <= i < new_count for i in slots.values())
        groups: dict[int, list[dict]] = {}
        for device in devices:
            groups.setdefault(slots[device["name"]], []).append(device)
        for group in groups.values():
            assert len(group) <= 64
        if count and new_count >= count:  # not packed again: who stayed kept its slice
            for name, i in before.items():
                if name in slots:
                    assert slots[name] == i
        if count and new_count > count:  # a slice is added only when none had room
            assert all(len(groups.get(i, [])) == 64 for i in range(count))
        count = new_count


class FakeSlices:
    def __init__(self, found=()):
        self.slices = {s["metadata"]["name"]: s for s in found}
        self.deleted = []

    async def pool_slices(self, driver, node, pool):
        return [s for s in self.slices.values() if s["spec"]["pool"]["name"] == pool]

    async def apply_slice(self, body):
        self.slices[body["metadata"]["name"]] = body

    async def delete_slice(self, name):
        self.deleted.append(name)
        self.slices.pop(name, None)


async def test_a_pool_continues_the_generation_it_finds_and_drops_slices_it_no_longer_needs():
    left = build_slices("d.io", "n1", "e.com/r", [{"name": f"x{i}"} for i in range(200)], 41)
    api = FakeSlices(left)
    pool = Pool(api, "d.io", "n1", "e.com/r")
    await pool.publish([{"name": "x0"}])
    assert pool.generation == 42
    assert api.deleted == [s["metadata"]["name"] for s in left[1:]]
    assert [s["spec"]["pool"]["generation"] for s in api.slices.values()] == [42]
    await pool.delete()
    assert api.slices == {}


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"api": "grpc"}, "'api': 'grpc' is not an API"),
        ({"api": "dra", "upper-limit": 2}, "'upper-limit'"),
        ({"api": "dra", "allocation": "all"}, "'allocation'"),
        ({"api": "dra", "cdi": True}, "'cdi'"),
        ({"api": "both", "upper-limit": 2}, "'upper-limit'"),
        ({"api": "both", "allocation": "all"}, "'allocation'"),
        ({"api": "both", "device-uid": 5}, "'device-uid'.*set \"cdi\": true"),
        ({"device-uid": 5}, "'device-uid'"),  # still CDI-only for the device plugin API
        ({"whole-disks": True}, '\'whole-disks\'.*set "api": "dra"'),
        ({"api": "both", "whole-disks": True}, "'whole-disks'"),
    ],
)
def test_the_api_field_refuses_what_dra_cannot_do(fields, problem):
    with pytest.raises(ConfigError, match=problem):
        parse_config(json.dumps(fields), source="config.json")


def test_a_dra_resource_hands_out_each_device_and_the_flat_form_is_unchanged():
    (dra,) = parse_config('{"api": "dra", "device-uid": 5}', source="c").resources
    assert (dra.api, dra.allocation, dra.device_uid, dra.dra) == ("dra", "each", 5, True)
    (flat,) = parse_config("{}", source="c").resources
    assert flat == ResourceConfig() and flat.api == "device-plugin"


# --- claims ---------------------------------------------------------------

DRIVER, NODE, RESOURCE = "dra.powerdev.io", "n1", "example.com/lun"
POOL = pool_name(NODE, RESOURCE)


class FakeClaims:
    def __init__(self):
        self.claims = {}
        self.reads = 0

    def allocate(self, name, uid, *devices, driver=DRIVER, pool=POOL):
        results = [{"request": "r", "driver": driver, "pool": pool, "device": d} for d in devices]
        self.claims[("ns", name)] = {
            "metadata": {"uid": uid},
            "status": {"allocation": {"devices": {"results": results}}} if devices else {},
        }

    async def claim(self, namespace, name):
        self.reads += 1
        await trio.lowlevel.checkpoint()  # a real read yields: let concurrent calls meet
        return self.claims.get((namespace, name))


def make_claims(tmp_path, api, devices, *, host=None, boot="boot-1"):
    """Claims over these devices; with `host` (host path -> (key, identity)),
    what the node has now, as the device table tells it at start."""
    resource = ResourceConfig(name=RESOURCE, api="dra", allocation="each", device_gid=6)
    plugin = Plugin(resource, Inventory(devices), refresh=None, spec=None)
    claims = Claims(
        DRIVER, NODE, api, lambda: [plugin], tmp_path / "cdi", tmp_path / "state", boot_id=boot
    )
    if host is None:
        host = {d.path: (d.key, d.identity) for d in devices}

    async def find(identity):
        await trio.lowlevel.checkpoint()
        return sorted({key for key, ident in host.values() if ident == identity})

    claims.find = find
    claims.key_of = lambda path: host[path][0] if path in host else None
    claims.names_of = lambda key: sorted(p for p, (k, _) in host.items() if k == key)
    return claims


DEVICES = [dev("/dev/sdb", 16, unit="u1"), dev("/dev/sdc", 32, healthy=False, unit="u2")]


async def test_a_claim_is_prepared_once_answered_again_and_unprepared(tmp_path):
    api = FakeClaims()
    api.allocate("c1", "uid-1", "u1")
    claims = make_claims(tmp_path, api, DEVICES)
    ref = ClaimRef("ns", "c1", "uid-1")
    async with trio.open_nursery() as nursery:  # concurrent calls: one read
        for _ in range(3):
            nursery.start_soon(claims.prepare, ref)
    (prepared,) = await claims.prepare(ref)
    assert api.reads == 1
    assert prepared.cdi_ids == (f"{DRIVER}/claim=uid-1-u1",)
    assert (prepared.pool, prepared.device, prepared.requests) == (POOL, "u1", ("r",))
    spec = json.loads(claims.spec_path("uid-1").read_text())
    assert spec["kind"] == f"{DRIVER}/claim"
    (node,) = spec["devices"][0]["containerEdits"]["deviceNodes"]
    assert (node["path"], node["major"], node["minor"], node["gid"]) == ("/dev/sdb", 8, 16, 6)
    assert node["uid"] == 0  # a group without an owner: root's, never the pod's

    # A restart in the same boot: the checkpoint answers; a spec that went
    # is written again (sdb has no identity: its path still names 8:16).
    claims.spec_path("uid-1").unlink()
    again = make_claims(tmp_path, api, DEVICES)
    await again.load()
    assert claims.spec_path("uid-1").exists()
    assert await again.prepare(ref) == [prepared]
    assert api.reads == 1

    await again.unprepare(ref)
    await again.unprepare(ref)  # idempotent
    assert not claims.spec_path("uid-1").exists()
    assert json.loads(again.checkpoint_path.read_text())["claims"] == {}


@pytest.mark.parametrize(
    ("claim", "problem"),
    [
        (None, "does not exist"),
        (("other-uid", "u1"), "has UID other-uid"),
        (("uid-1",), "is not allocated"),
        (("uid-1", "u2"), "u2 of pool .* is not healthy, or is used by the host"),
        (("uid-1", "u9"), "u9 of pool .* is not present on this node now"),
    ],
)
async def test_each_wrong_claim_gets_its_own_error(tmp_path, claim, problem):
    api = FakeClaims()
    if claim is not None:
        api.allocate("c1", *claim)
    claims = make_claims(tmp_path, api, DEVICES)
    with pytest.raises(PrepareError, match=problem):
        await claims.prepare(ClaimRef("ns", "c1", "uid-1"))
    assert not claims.spec_path("uid-1").exists()


async def test_a_device_of_another_nodes_pool_is_refused_and_other_drivers_are_not_ours(tmp_path):
    api = FakeClaims()
    api.allocate("c1", "uid-1", "u1", pool=pool_name("n2", RESOURCE))
    claims = make_claims(tmp_path, api, DEVICES)
    with pytest.raises(PrepareError, match="not one of this node's"):
        await claims.prepare(ClaimRef("ns", "c1", "uid-1"))
    api.allocate("c2", "uid-2", "u1", driver="gpu.example.com")
    assert await claims.prepare(ClaimRef("ns", "c2", "uid-2")) == []


class FlakySlices(FakeSlices):
    """Refuses the first `failures` applies, as an API server that is away."""

    def __init__(self, failures):
        super().__init__()
        self.failures = failures
        self.applied = trio.Event()

    async def apply_slice(self, body):
        if self.failures:
            self.failures -= 1
            raise OSError("connection refused")
        await super().apply_slice(body)
        self.applied.set()
        self.applied = trio.Event()


async def test_publishing_outlasts_an_api_server_away_follows_changes_and_deletes_at_the_end(
    autojump_clock,
):
    from powerdev.dra.slices import keep_published

    api = FlakySlices(failures=3)
    inventory = Inventory([dev("/dev/sdb", 16, unit="u1")])
    resource = ResourceConfig(name=RESOURCE, api="dra", allocation="each")
    plugin = Plugin(resource, inventory, refresh=None, spec=None)
    pool = Pool(api, DRIVER, NODE, RESOURCE)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(keep_published, plugin, pool)  # started at the first try
            while not api.slices:
                await api.applied.wait()
            # Each try is a generation of its own: one half-published is superseded.
            assert api.failures == 0 and pool.generation == 4
            (only,) = api.slices.values()
            assert [d["name"] for d in only["spec"]["devices"]] == ["u1"]

            inventory.update({"/dev/sdc": dev("/dev/sdc", 32, unit="u2")})
            await api.applied.wait()
            (only,) = api.slices.values()
            assert [d["name"] for d in only["spec"]["devices"]] == ["u1", "u2"]
            assert only["spec"]["pool"]["generation"] == 4  # one slice changed: written alone

            api.slices.clear()  # a starting kubelet wipes the node's slices
            pool.lose()
            await api.applied.wait()
            assert pool.generation == 5 and len(api.slices) == 1  # every slice, anew
            nursery.cancel_scope.cancel()
    assert api.slices == {}  # deleted on the way out


class PickySlices(FakeSlices):
    """Refuses the applies whose number (from 1) is in `refuse`."""

    def __init__(self, refuse=()):
        super().__init__()
        self.refuse = set(refuse)
        self.applies = 0
        self.applied = trio.Event()

    async def apply_slice(self, body):
        self.applies += 1
        if self.applies in self.refuse:
            raise OSError("the API server is busy")
        await super().apply_slice(body)
        self.applied.set()
        self.applied = trio.Event()


def complete(api) -> bool:
    """Is the pool on the server whole: its slices all of one generation,
    as many as they say?"""
    pools = [s["spec"]["pool"] for s in api.slices.values()]
    return len({p["generation"] for p in pools}) == 1 and all(
        p["resourceSliceCount"] == len(pools) for p in pools
    )


async def test_a_publication_half_written_is_written_again_though_the_devices_went_back(
    autojump_clock,
):
    """Two slices change (a new generation): the first is written, the
    second refused; meanwhile the devices go back to what they were. The
    pool on the server is half one generation, half the other, until it is
    written again: it is, at once."""
    from powerdev.dra.slices import keep_published

    api = PickySlices()
    listed = [dev(f"/dev/sd{i}", i, unit=f"u{i:03}") for i in range(130)]  # 56 + 56 + 18
    inventory = Inventory(listed)
    resource = ResourceConfig(name=RESOURCE, api="dra", allocation="each")
    plugin = Plugin(resource, inventory, refresh=None, spec=None)
    pool = Pool(api, DRIVER, NODE, RESOURCE)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(keep_published, plugin, pool)
            assert len(api.slices) == 3 and complete(api)
            api.refuse = {api.applies + 3}  # the next publication's last write
            inventory.update(
                {
                    "/dev/sd0": dev("/dev/sd0", 0, unit="u000", numa=1),  # in the first slice
                    "/dev/sd129": dev("/dev/sd129", 129, unit="u129", numa=1),  # the third
                }
            )
            while api.applies < max(api.refuse):
                await api.applied.wait()
            assert not complete(api)
            inventory.update({"/dev/sd0": listed[0], "/dev/sd129": listed[129]})  # back
            while not complete(api):
                await api.applied.wait()
            numa = [
                d["attributes"].get("numaNode")
                for s in api.slices.values()
                for d in s["spec"]["devices"]
            ]
            assert numa == [None] * 130  # what the devices are now
            nursery.cancel_scope.cancel()


async def test_a_pool_lost_while_its_writes_are_in_flight_is_written_again():
    """The kubelet wipes the node's slices (lose()) while the pool's one
    slice is being written: the answer that comes after says nothing of
    what the server has now, and the next publication writes it anew."""

    class Slow(FakeSlices):
        def __init__(self):
            super().__init__()
            self.writing = trio.Event()
            self.go = trio.Event()

        async def apply_slice(self, body):
            self.writing.set()
            await self.go.wait()
            await super().apply_slice(body)

    api = Slow()
    pool = Pool(api, DRIVER, NODE, RESOURCE)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pool.publish, named("u1"))
        await api.writing.wait()
        api.slices.clear()  # wiped, and we are told
        pool.lose()
        api.go.set()
    assert len(api.slices) == 1  # the write answered after the wipe
    api.slices.clear()  # (as if the wipe came after it)
    assert await pool.publish(named("u1")) == 1  # written again, not taken as there
    assert len(api.slices) == 1


# --- the prepared devices' health (dra/health.py) ---------------------------------------

SDB = ("/dev/sdb", "b", 8, 16)
MAPPER = ("/dev/mapper/b", "b", 8, 16)


def health_of(nodes, listed, *, served=True):
    from powerdev.dra.health import assess

    resource = ResourceConfig(name=RESOURCE, api="dra", allocation="each")
    plugin = Plugin(resource, Inventory(listed), refresh=None, spec=None)
    found = assess(POOL, "u1", nodes, plugin if served else None)
    return found.health, found.message


@pytest.mark.parametrize(
    ("nodes", "listed", "health", "why"),
    [
        ((SDB,), [dev("/dev/sdb", 16, unit="u1")], "Healthy", ""),
        ((SDB,), [], "Unhealthy", "gone: /dev/sdb no longer on the host"),
        ((SDB,), [dev("/dev/sdb", 17, unit="u1")], "Unhealthy", "now another device (8:17)"),
        ((SDB,), [dev("/dev/sdb", 16, unit="u1", healthy=False)], "Unhealthy", "used by the host"),
        # one of its names gone, the device still there under the other: Healthy
        ((SDB, MAPPER), [dev("/dev/sdb", 16, unit="u1")], "Healthy", ""),
        # a name still there but unhealthy spoils it
        (
            (SDB, MAPPER),
            [dev("/dev/sdb", 16, unit="u1"), dev("/dev/mapper/b", 16, unit="u1", healthy=False)],
            "Unhealthy",
            "/dev/mapper/b not usable now",
        ),
        ((), [], "Unhealthy", "it was not found again when powerdev started"),
    ],
)
def test_a_prepared_device_is_healthy_while_listed_as_itself_and_healthy(
    nodes, listed, health, why
):
    found, message = health_of(nodes, listed)
    assert found == health
    assert why in message


def test_a_device_of_a_resource_no_longer_served_is_unknown():
    assert health_of((SDB,), [], served=False) == (
        "Unknown",
        "its resource is no longer served through DRA here",
    )


WWID_A, WWID_B = "WWID=naa.600a0b8000000001", "WWID=naa.600a0b8000000002"
LUNS = [dev("/dev/sdb", 16, identity=WWID_A, unit="u1"), dev("/dev/sdc", 32, unit="u2")]


async def rebooted(tmp_path, host, boot="boot-2"):
    """u1 (a LUN with a WWID) and u2 (a disk without one) prepared, then a
    reboot: /var/run/cdi is empty, the daemon starts with what `host` has."""
    api = FakeClaims()
    api.allocate("c1", "uid-1", "u1", "u2")
    claims = make_claims(tmp_path, api, LUNS)
    await claims.prepare(ClaimRef("ns", "c1", "uid-1"))
    claims.spec_path("uid-1").unlink()
    again = make_claims(tmp_path, api, LUNS, host=host, boot=boot)
    await again.load()
    return again


def spec_nodes(claims, uid="uid-1"):
    if not claims.spec_path(uid).exists():
        return None
    spec = json.loads(claims.spec_path(uid).read_text())
    return {
        d["name"]: [
            (n["path"], n["hostPath"], n["major"], n["minor"])
            for n in d["containerEdits"]["deviceNodes"]
        ]
        for d in spec["devices"]
    }


async def test_after_a_reboot_a_renumbered_lun_gets_its_spec_with_its_new_numbers(tmp_path):
    # the LUN is sdd (8:48) now; sdb (8:16) is another LUN, maybe the host's
    host = {"/dev/sdb": (("b", 8, 16), WWID_B), "/dev/sdd": (("b", 8, 48), WWID_A)}
    claims = await rebooted(tmp_path, host)
    nodes = spec_nodes(claims)
    # the container's path stays; the host's node is the LUN's, at its numbers
    assert nodes == {"uid-1-u1": [("/dev/sdb", "/dev/sdd", 8, 48)]}
    assert claims.prepared_devices() == [
        (POOL, "u1", (("/dev/sdd", "b", 8, 48),)),
        (POOL, "u2", ()),  # no identity, another boot: not written back
    ]
    saved = json.loads(claims.checkpoint_path.read_text())["claims"]["uid-1"]
    assert saved["boot_id"] == "boot-2" and saved["devices"][0]["keys"] == [["b", 8, 48]]
    with pytest.raises(PrepareError, match=r"u2 of pool .* is gone: the node restarted"):
        await claims.prepare(ClaimRef("ns", "c1", "uid-1"))


async def test_after_a_reboot_a_lun_that_is_gone_is_never_written_with_its_old_numbers(tmp_path):
    host = {"/dev/sdb": (("b", 8, 16), WWID_B), "/dev/sdc": (("b", 8, 32), None)}
    claims = await rebooted(tmp_path, host)
    assert spec_nodes(claims) is None  # nothing left to write: no spec at all
    assert claims.prepared_devices() == [(POOL, "u1", ()), (POOL, "u2", ())]
    assert [d.health for d in assess_all(claims.prepared_devices(), {})] == ["Unknown"] * 2


async def test_in_the_same_boot_a_device_without_identity_is_kept_while_its_path_is_it(tmp_path):
    host = {"/dev/sdb": (("b", 8, 16), WWID_A), "/dev/sdc": (("b", 8, 32), None)}
    claims = await rebooted(tmp_path, host, boot="boot-1")
    assert spec_nodes(claims) == {
        "uid-1-u1": [("/dev/sdb", "/dev/sdb", 8, 16)],
        "uid-1-u2": [("/dev/sdc", "/dev/sdc", 8, 32)],
    }
    moved = {"/dev/sdb": (("b", 8, 16), WWID_A), "/dev/sdc": (("b", 8, 64), None)}
    claims = await rebooted(tmp_path / "again", moved, boot="boot-1")
    assert spec_nodes(claims) == {"uid-1-u1": [("/dev/sdb", "/dev/sdb", 8, 16)]}


async def test_the_prepared_devices_are_read_from_the_claims(tmp_path):
    api = FakeClaims()
    api.allocate("c1", "uid-1", "u1")
    claims = make_claims(tmp_path, api, DEVICES)
    assert claims.prepared_devices() == []
    await claims.prepare(ClaimRef("ns", "c1", "uid-1"))
    assert claims.prepared_devices() == [(POOL, "u1", (SDB,))]
    again = make_claims(tmp_path, api, DEVICES)  # from the checkpoint, after a restart
    await again.load()
    assert again.prepared_devices() == [(POOL, "u1", (SDB,))]


async def test_each_stream_gets_the_list_at_once_then_changes_and_again_every_resend(
    tmp_path, autojump_clock
):
    from powerdev.dra.health import RESEND, HealthWatch

    api = FakeClaims()
    api.allocate("c1", "uid-1", "u1")
    claims = make_claims(tmp_path, api, DEVICES)
    (plugin,) = claims.plugins()
    watch = HealthWatch(claims.prepared_devices, claims.plugins, NODE)
    first = await watch.next_report(None)  # at once, even empty
    assert first.devices == ()
    # prepared with no deadline pending (its files are written in a worker
    # thread, and the mock clock would jump to one meanwhile)
    await claims.prepare(ClaimRef("ns", "c1", "uid-1"))
    with trio.fail_after(100):
        watch.claims_changed()
        began = trio.current_time()
        healthy = await watch.next_report(first)
        assert trio.current_time() == began  # woken by the claim, not the timer
        assert [(d.device, d.health) for d in healthy.devices] == [("u1", "Healthy")]

        # Two streams, each on its own: a change that leaves the list as it
        # was wakes them, and they wait on; the removal is sent at once.
        got = {}

        async def stream(name):
            got[name] = await watch.next_report(healthy)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream, "a")
            nursery.start_soon(stream, "b")
            await trio.testing.wait_all_tasks_blocked()
            plugin.inventory.update({"/dev/sdd": dev("/dev/sdd", 48, unit="u4")})
            await trio.testing.wait_all_tasks_blocked()
            assert got == {}
            plugin.inventory.update({"/dev/sdb": None})
        assert trio.current_time() == began
        for report in got.values():
            ((device, health, message),) = [(d.device, d.health, d.message) for d in report.devices]
            assert (device, health) == ("u1", "Unhealthy")
            assert "/dev/sdb no longer on the host" in message

        # Nothing changes: the same list again after RESEND seconds.
        again = await watch.next_report(got["a"])
        assert trio.current_time() == began + RESEND
        assert again.devices == got["a"].devices

    await claims.unprepare(ClaimRef("ns", "c1", "uid-1"))  # no deadline pending, as above
    with trio.fail_after(100):
        watch.claims_changed()
        assert (await watch.next_report(again)).devices == ()
        assert trio.current_time() == began + RESEND


# --- size, vendor and model (devices/identity.py block_facts; slices) -------------------


def test_a_block_device_publishes_its_size_as_capacity_and_its_vendor_and_model():
    from powerdev.devices.model import BlockFacts

    def described(unit, minor, facts):
        return Device(unit, f"/dev/{unit}", "b", 8, minor, facts=facts)

    devices = [
        described("u1", 0, BlockFacts(1 << 30, "IBM", "2145")),
        described("u2", 16, BlockFacts(0, None, "M" * 65)),  # a model too long: left out
        described("u3", 32, None),  # no facts (not asked for, or sysfs does not know it)
    ]
    published = {d["name"]: d for d in build_devices(RESOURCE, devices)}
    assert published["u1"]["capacity"] == {"size": {"value": "1073741824"}}
    assert published["u1"]["attributes"]["vendor"] == {"string": "IBM"}
    assert published["u1"]["attributes"]["model"] == {"string": "2145"}
    assert published["u2"]["capacity"] == {"size": {"value": "0"}}
    assert not {"vendor", "model"} & set(published["u2"]["attributes"])
    assert "capacity" not in published["u3"]


def block_tree(tmp_path):
    """A SCSI disk sda (and sda1), an NVMe namespace, a multipath map over
    two SCSI paths and a partition of it, an LVM volume, a virtio disk."""
    from tests.unit.test_identity import NVME, SCSI_DEV, VDA, FakeSys, scsi_disk

    tree = FakeSys(tmp_path / "sys")
    scsi_disk(tree)
    tree.link(f"{SCSI_DEV}/subsystem", "../../../../../../bus/scsi")
    tree.file(f"{SCSI_DEV}/vendor", "IBM     \n")
    tree.file(f"{SCSI_DEV}/model", "2145            \n")
    tree.file("pci0000:00/0000:00:1f.2/host0/target0:0:0/0:0:0:0/block/sda/size", "2097152\n")
    tree.file(f"{NVME}/model", "Samsung SSD 970 EVO Plus 1TB            \n")
    tree.link(f"{NVME}/subsystem", "../../../../../../class/nvme")
    tree.device(f"{NVME}/nvme0n1", (259, 0), uevent={"DEVTYPE": "disk"}, files={"size": "8\n"})
    tree.link(f"{NVME}/nvme0n1/device", "..")
    for host, sd, minor, vendor in (
        ("host1", "sdb", 16, "NETAPP  "),
        ("host2", "sdc", 32, "\x01?"),
    ):
        scsi = f"pci0000:00/0000:00:1f.3/{host}/target1:0:0/1:0:0:0"
        tree.device(f"{scsi}/block/{sd}", (8, minor), uevent={"DEVTYPE": "disk"})
        tree.link(f"{scsi}/block/{sd}/device", "../../../1:0:0:0")
        tree.link(f"{scsi}/subsystem", "../../../../../../bus/scsi")
        tree.file(f"{scsi}/vendor", vendor + "\n")
        tree.file(f"{scsi}/model", "LUN C-Mode\n")
    maps = (
        ("dm-3", 3, "mpath-3600a098038303053453f463045727a", ("sdb", "sdc")),
        ("dm-4", 4, "part1-mpath-3600a098038303053453f463045727a", ("dm-3",)),
        ("dm-5", 5, "LVM-Xy12", ("sdb",)),
    )
    for name, minor, uuid, slaves in maps:
        made = tree.device(f"virtual/block/{name}", (253, minor), files={"dm/uuid": uuid + "\n"})
        (made / "slaves").mkdir()
        for slave in slaves:
            where = tree.root / "dev" / "block"
            target = {"sdb": "8:16", "sdc": "8:32", "dm-3": "253:3"}[slave]
            tree.link(f"virtual/block/{name}/slaves/{slave}", str((where / target).resolve()))
    tree.device(VDA, (252, 0), uevent={"DEVTYPE": "disk"}, files={"size": "1\n"})
    tree.link(f"{VDA}/device", "../..")
    tree.file(VDA.rsplit("/", 2)[0] + "/vendor", "0x1af4\n")
    tree.link(VDA.rsplit("/", 2)[0] + "/subsystem", "../../../../bus/virtio")
    return tree.root


@pytest.mark.parametrize(
    ("number", "facts"),
    [
        ((8, 0), (1 << 30, "IBM", "2145")),  # SCSI: INQUIRY strings, trimmed
        ((8, 1), (None, "IBM", "2145")),  # a partition: its disk's (no size file here)
        ((259, 0), (4096, None, "Samsung SSD 970 EVO Plus 1TB")),  # NVMe: no vendor string
        ((253, 3), (None, "NETAPP", "LUN C-Mode")),  # multipath: its first path's
        ((253, 4), (None, "NETAPP", "LUN C-Mode")),  # a partition of the map: the same
        ((253, 5), (None, None, None)),  # LVM: no one disk
        ((252, 0), (512, None, None)),  # virtio: its "vendor" is a number
        ((8, 32), (None, None, "LUN C-Mode")),  # a vendor that is not printable: left out
    ],
)
def test_block_facts_come_from_scsi_and_nvme_devices_and_multipath_paths(tmp_path, number, facts):
    from powerdev.devices.identity import block_facts

    root = block_tree(tmp_path)
    found = block_facts(root, number)
    assert found is not None
    assert (found.size, found.vendor, found.model) == facts
    assert block_facts(root, (8, 99)) is None


async def test_a_claim_the_api_server_cannot_give_gets_an_error_that_says_so(tmp_path):
    class Down(FakeClaims):
        async def claim(self, namespace, name):
            raise ConnectionRefusedError("all attempts to connect to 127.0.0.1:6443 failed")

    claims = make_claims(tmp_path, Down(), DEVICES)
    with pytest.raises(PrepareError, match="ResourceClaim ns/c1 cannot be read from the API ser"):
        await claims.prepare(ClaimRef("ns", "c1", "uid-1"))
    assert not claims.spec_path("uid-1").exists()


async def test_devices_built_in_steps_are_those_built_at_once():
    from powerdev.dra.slices import build_devices_in_steps

    devices = [dev(f"/dev/d{i}", i, healthy=i % 7 != 0, unit=f"u{i % 900}") for i in range(1200)]
    at_once = build_devices("example.com/lun", devices)
    assert await build_devices_in_steps("example.com/lun", devices, step=64) == at_once
    assert len(at_once) == 900 - len({i % 900 for i in range(1200) if i % 7 == 0})


async def test_a_device_of_a_subrequest_is_answered_for_its_request(tmp_path):
    """firstAvailable: the allocation names "dev/small"; a container names
    "dev", so the answer says "dev" (the checkpoint keeps "dev/small")."""
    api = FakeClaims()
    api.allocate("c1", "uid-1", "u1")
    api.claims[("ns", "c1")]["status"]["allocation"]["devices"]["results"][0]["request"] = (
        "dev/small"
    )
    claims = make_claims(tmp_path, api, DEVICES)
    (prepared,) = await claims.prepare(ClaimRef("ns", "c1", "uid-1"))
    assert prepared.requests == ("dev",)
    saved = json.loads(claims.checkpoint_path.read_text())["claims"]["uid-1"]
    assert saved["devices"][0]["requests"] == ["dev/small"]
    again = make_claims(tmp_path, api, DEVICES)  # answered from the checkpoint after a restart
    await again.load()
    assert await again.prepare(ClaimRef("ns", "c1", "uid-1")) == [prepared]


async def test_a_taint_says_since_when_its_condition_holds_not_when_its_slice_was_written(
    monkeypatch,
):
    """timeAdded is the time powerdev first published the unit in that
    condition: kept when the unit or its neighbours are built again, new
    when the condition changes, gone with the taint."""
    from powerdev.dra import slices
    from powerdev.dra.slices import build_devices_in_steps

    clock = iter(["2026-12-02T10:00:00Z", "2026-12-02T11:00:00Z", "2026-12-02T12:00:00Z"])
    monkeypatch.setattr(slices, "_now", lambda: next(clock))
    devices = [dev(f"/dev/sd{c}", i * 16, unit=f"u{i}") for i, c in enumerate("abc")]
    health = Conditions({"/dev/sdb": DEGRADED})
    built: dict = {}
    since: dict = {}

    async def taints() -> dict:
        published = await build_devices_in_steps(
            "example.com/lun", devices, health, built=built, since=since
        )
        return {d["name"]: d.get("taints") for d in published}

    first = await taints()
    assert first["u1"] == [
        {
            "key": CONDITION_TAINT,
            "value": "degraded",
            "effect": "None",
            "timeAdded": "2026-12-02T10:00:00Z",
        }
    ]
    devices[1] = dev("/dev/sdb", 16, unit="u1", numa=1)  # built again, same condition
    devices[0] = dev("/dev/sda", 0, unit="u0", numa=1)  # and a neighbour
    assert (await taints())["u1"][0]["timeAdded"] == "2026-12-02T10:00:00Z"
    health.levels["/dev/sdb"] = FAILED  # a new condition: a new time
    devices[1] = dev("/dev/sdb", 16, healthy=False, unit="u1")
    assert (await taints())["u1"][0]["timeAdded"] == "2026-12-02T11:00:00Z"
    del health.levels["/dev/sdb"]  # fine again: no taint, nothing kept
    devices[1] = dev("/dev/sdb", 16, unit="u1")
    assert (await taints())["u1"] is None
    assert since == {}
    health.levels["/dev/sdb"] = DEGRADED  # degraded once more: since now
    assert (await taints())["u1"][0]["timeAdded"] == "2026-12-02T12:00:00Z"


async def test_a_taints_time_outlasts_a_restart_read_back_from_the_slices_left(autojump_clock):
    """A restarted powerdev reads its pool's slices back: a device still in
    the condition its taint says keeps the taint's timeAdded; one whose
    condition changed meanwhile gets the time now."""
    from powerdev.dra.slices import keep_published

    earlier = build_slices(
        DRIVER,
        NODE,
        RESOURCE,
        [
            {
                "name": name,
                "taints": [
                    {
                        "key": CONDITION_TAINT,
                        "value": "degraded",
                        "effect": "None",
                        "timeAdded": "2026-01-01T00:00:00Z",
                    }
                ],
            }
            for name in ("u1", "u2")
        ],
        7,
    )
    api = FlakySlices(failures=0)
    api.slices = {s["metadata"]["name"]: s for s in earlier}
    inventory = Inventory(
        [dev("/dev/sdb", 16, unit="u1"), dev("/dev/sdc", 32, unit="u2", healthy=False)]
    )
    resource = ResourceConfig(name=RESOURCE, api="dra", allocation="each")
    health = Conditions({"/dev/sdb": DEGRADED, "/dev/sdc": FAILED})
    health.resource, health.ledger = resource, None
    plugin = Plugin(resource, inventory, refresh=None, spec=None)
    plugin.tracker = health
    pool = Pool(api, DRIVER, NODE, RESOURCE)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(keep_published, plugin, pool)
            (only,) = api.slices.values()
            assert only["spec"]["pool"]["generation"] == 8  # on from the generation left
            taints = {d["name"]: d["taints"][0] for d in only["spec"]["devices"]}
            assert taints["u1"]["timeAdded"] == "2026-01-01T00:00:00Z"  # degraded all along
            assert taints["u2"]["value"] == "failed"
            assert taints["u2"]["timeAdded"] != "2026-01-01T00:00:00Z"  # failed since now
            nursery.cancel_scope.cancel()
