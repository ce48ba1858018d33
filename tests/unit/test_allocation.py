"""Advertised units, Allocate answers and preferences: tables of cases."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from powerdev.config import ResourceConfig
from powerdev.devices.inventory import Inventory
from powerdev.devices.model import Device
from powerdev.resources.allocation import (
    AllocationRefused,
    DeviceGrant,
    Unit,
    check_request,
    grant,
    preferred,
    units,
)
from powerdev.resources.plugin import Plugin

A = Device("sda", "/dev/sda", "b", 8, 0)
B = Device("mapper.mpatha", "/dev/mapper/mpatha", "b", 253, 0)
GONE = Device("sdz", "/dev/sdz", "b", 8, 400, healthy=False)


@pytest.mark.parametrize(
    ("devices", "limit", "expected"),
    [
        ((), 0, ()),
        ((A, B), 0, (Unit("sda", True), Unit("mapper.mpatha", True))),
        ((A, GONE), 0, (Unit("sda", True), Unit("sdz", False))),
        ((A, B), 3, (Unit("share-1", True), Unit("share-2", True), Unit("share-3", True))),
        ((GONE,), 2, (Unit("share-1", False), Unit("share-2", False))),
        ((), 1, (Unit("share-1", False),)),
    ],
)
def test_units(devices, limit, expected):
    assert units(devices, limit) == expected


@pytest.mark.parametrize(
    ("ids", "error"),
    [
        (["sda"], None),
        ([], None),
        (["sda", "mapper.mpatha"], None),
        (["nope"], "unknown device ID 'nope'"),
        (["sda", "sdz"], "device ID 'sdz' is Unhealthy"),
        (["x" * 5000], "unknown device ID 'xxxx"),
    ],
)
def test_check_request(ids, error):
    advertised = {u.id: u for u in units((A, B, GONE), 0)}
    if error is None:
        check_request(ids, advertised)
    else:
        with pytest.raises(AllocationRefused, match=error) as err:
            check_request(ids, advertised)
        assert len(str(err.value)) < 300


def test_grant_gives_every_healthy_device_at_its_host_path():
    assert tuple(grant((A, GONE, B), "rw")) == (
        DeviceGrant("/dev/sda", "/dev/sda", "rw"),
        DeviceGrant("/dev/mapper/mpatha", "/dev/mapper/mpatha", "rw"),
    )


@pytest.mark.parametrize(
    ("available", "must", "size", "expected"),
    [
        (["a", "b", "c"], [], 2, ["a", "b"]),
        (["a", "b", "c"], ["c"], 2, ["c", "a"]),
        (["a", "b"], ["b", "b"], 1, ["b"]),
        ([], [], 3, []),
        (["a"], [], 0, []),
    ],
)
def test_preferred(available, must, size, expected):
    assert preferred(available, must, size) == expected


@pytest.mark.parametrize("allocation", ["all", "each"])
def test_a_plugin_without_a_spec_writer_never_answers_cdi_names(allocation):
    """CDI names with no file behind them would fail the container at start."""
    resource = ResourceConfig(name="a.io/x", cdi=True, allocation=allocation)
    plugin = Plugin(resource, Inventory((A, B)), refresh=None, spec=None)
    with pytest.raises(RuntimeError, match="CDI names need a spec file"):
        plugin.allocate([["sda"]])


def test_plugin_answers_every_container_and_caches_per_version():
    plugin = Plugin(ResourceConfig(permissions="r"), Inventory((A, B)), refresh=None, spec=None)
    first = plugin.allocate([["sda"], ["mapper.mpatha"]])
    assert len(first) == 2 and first[0] == first[1]
    assert [g.permissions for g in first[0]] == ["r", "r"]
    assert plugin.allocate([["sda"]])[0] is first[0]  # same version: the same answer object
    plugin.inventory.publish((A,))
    assert tuple(plugin.allocate([["sda"]])[0]) == (DeviceGrant("/dev/sda", "/dev/sda", "r"),)
    with pytest.raises(AllocationRefused, match=r"unknown device ID 'mapper\.mpatha'"):
        plugin.allocate([["mapper.mpatha"]])


def test_upper_limit_units_grant_every_device():
    plugin = Plugin(ResourceConfig(upper_limit=2), Inventory((A, B)), refresh=None, spec=None)
    assert [u.id for u in plugin.units()] == ["share-1", "share-2"]
    assert [g.host_path for g in plugin.allocate([["share-2"]])[0]] == [
        "/dev/mapper/mpatha",  # the inventory lists devices by path
        "/dev/sda",
    ]
    with pytest.raises(AllocationRefused, match="unknown device ID 'share-3'"):
        plugin.allocate([["share-3"]])


async def test_inventory_versions_and_waiting():
    inventory = Inventory((A,))
    assert inventory.current.version == 1
    assert inventory.publish((A,)) is False  # same list: no new version
    assert (await inventory.wait_newer(0)).devices == (A,)
    assert inventory.publish((A, B)) is True
    snapshot = await inventory.wait_newer(1)
    assert (snapshot.version, snapshot.devices) == (2, (B, A))  # in path order


def test_backoff_doubles_to_its_bound_and_starts_again_after_a_success():
    from powerdev.support.backoff import Backoff

    backoff = Backoff(0.1, 1.0)
    assert [backoff.next() for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    backoff.reset()
    assert backoff.next() == 0.1


def test_each_mode_one_unit_per_identity_and_grants_only_the_chosen():
    from powerdev.resources.allocation import grant_chosen, units

    lun = "dm-uuid.mpath-3600a"
    devices = (
        Device(lun, "/dev/dm-3", "b", 253, 3, numa=1),
        Device(lun, "/dev/mapper/mpatha", "b", 253, 3, numa=1),
        Device("dm-uuid.mpath-3600b", "/dev/dm-4", "b", 253, 4, numa=0),
    )
    (a, b) = units(devices, 0, "each")
    assert (a.id, a.healthy, a.numa) == (lun, True, 1)  # two names, one unit
    assert b.numa == 0
    plugin = Plugin(
        ResourceConfig(allocation="each", permissions="r"),
        Inventory(devices),
        refresh=None,
        spec=None,
    )
    (grant,) = plugin.allocate([[lun]])
    assert grant == (
        DeviceGrant("/dev/dm-3", "/dev/dm-3", "r"),
        DeviceGrant("/dev/mapper/mpatha", "/dev/mapper/mpatha", "r"),
    )
    assert grant_chosen({}, ["nothing"], "rw") == ()
    assert plugin.prefers


@pytest.mark.parametrize(
    ("available", "must", "size", "numa", "expected"),
    [
        # one node has enough: all from it, in natural order
        (["d10", "d2", "d1", "d3"], [], 2, {"d1": 0, "d2": 1, "d3": 1, "d10": 1}, ["d2", "d3"]),
        # the must-include device's node first
        (["d1", "d2", "d3", "d4"], ["d1"], 2, {"d1": 0, "d2": 1, "d3": 1, "d4": 0}, ["d1", "d4"]),
        # no node has enough: the biggest first, then the rest
        (["a", "b", "c"], [], 3, {"a": 0, "b": 1, "c": 1}, ["b", "c", "a"]),
        # devices without topology come after those with it
        (["x", "y", "z"], [], 1, {"x": None, "y": 0, "z": None}, ["y"]),
        # natural order: loop4 < loop5 < loop42
        (["loop42", "loop5", "loop4"], [], 3, {}, ["loop4", "loop5", "loop42"]),
        # must-include alone can fill the request
        (["a", "b"], ["b", "a"], 2, {}, ["b", "a"]),
    ],
)
def test_preferred_allocation_on_one_numa_node(available, must, size, numa, expected):
    from powerdev.resources.allocation import preferred_on_one_node

    assert preferred_on_one_node(available, must, size, numa) == expected


def test_a_precomputed_natural_order_chooses_as_the_sort_does():
    """Plugin.preferred() hands the natural order in, computed once per list:
    the choice is the same as sorting every time, whatever order the
    kubelet lists the free IDs in."""
    import random

    from powerdev.resources.allocation import natural_key, preferred_on_one_node

    ids = [f"loop{i}" for i in range(300)]
    numa = {unit: i % 3 if i % 7 else None for i, unit in enumerate(ids)}
    order = {unit: i for i, unit in enumerate(sorted(ids, key=natural_key))}
    shuffled = random.Random(7).sample(ids, len(ids))
    for size in (1, 5, 120, 300):
        assert preferred_on_one_node(shuffled, ["loop9"], size, numa, order) == (
            preferred_on_one_node(shuffled, ["loop9"], size, numa)
        )


def _preferred_by_sorting_everything(available, must, size, numa):
    """What the choice means, written the plain way: group the free IDs by
    NUMA node, order the nodes, sort each node's IDs naturally, take from
    the front."""
    from powerdev.resources.allocation import natural_key

    chosen = list(dict.fromkeys(must))
    free = [i for i in dict.fromkeys(available) if i not in chosen]
    need = size - len(chosen)
    wanted = {numa.get(i) for i in chosen} - {None}
    groups: dict = {}
    for unit in free:
        groups.setdefault(numa.get(unit), []).append(unit)

    def rank(node):
        n = len(groups[node])
        return (node not in wanted, n < need, node is None, -n, -1 if node is None else node)

    for node in sorted(groups, key=rank):
        chosen += sorted(groups[node], key=natural_key)
    return chosen[: max(size, len(dict.fromkeys(must)))]


@given(
    ids=st.lists(st.from_regex(r"[ab]0?[0-9]", fullmatch=True), max_size=40),
    nodes=st.one_of(
        st.lists(st.one_of(st.none(), st.integers(0, 3)), min_size=40, max_size=40),
        st.sampled_from([[None] * 40, [1] * 40]),  # every device on one node, or on none
    ),
    must=st.lists(st.from_regex(r"[abc]0?[0-9]", fullmatch=True), max_size=3),
    size=st.integers(0, 45),
    listed=st.one_of(st.none(), st.just(set()), st.sets(st.integers(0, 39), max_size=2)),
    seed=st.integers(0, 1000),
)
def test_the_choice_ranks_only_what_it_takes_and_chooses_as_sorting_all_would(
    ids, nodes, must, size, listed, seed
):
    """Whatever the IDs (duplicates, names with one natural key: a01, a1),
    their nodes, the must-include IDs (listed or not) and the size asked,
    and whether the natural order given knows every ID: the choice is the
    one a full sort of every free ID would make."""
    import random

    from powerdev.resources.allocation import natural_key, preferred_on_one_node

    numa = dict(zip(ids, nodes, strict=False))
    known = random.Random(seed).sample(sorted(set(ids)), len(set(ids)))  # any order in
    if listed is not None:  # an order made from a list without some of them
        known = [u for i, u in enumerate(known) if i not in listed]
    order = {u: i for i, u in enumerate(sorted(known, key=natural_key))}
    got = preferred_on_one_node(ids, must, size, numa, order if listed is not None else None)
    assert got == _preferred_by_sorting_everything(ids, must, size, numa)
    assert got == preferred_on_one_node(ids, must, size, numa, order)
    # as Plugin calls it: whether the IDs the order knows sit on one node
    one_node = len({numa.get(u) for u in order}) <= 1
    assert got == preferred_on_one_node(ids, must, size, numa, order, one_node=one_node)


async def test_the_grant_made_ahead_is_the_one_the_first_allocate_hands_out(monkeypatch):
    """Registration's warm-up makes the "all"-mode grant in a worker thread;
    the first pod's Allocate then makes none on the Trio thread."""
    from powerdev.resources import allocation as allocation_module

    plugin = Plugin(ResourceConfig(), Inventory((A, B)), refresh=None, spec=None)
    await plugin.warm()

    def made_again(*args):
        raise AssertionError("the grant was made again at Allocate")

    monkeypatch.setattr(allocation_module, "grant", made_again)
    (grant,) = plugin.allocate([["sda"]], refresh=False)
    assert {g.host_path for g in grant} == {"/dev/sda", "/dev/mapper/mpatha"}


async def test_a_grant_made_ahead_never_replaces_one_made_for_a_newer_list(monkeypatch):
    """The list changes, and a pod's Allocate makes the new list's grant,
    while the warm-up's grant is being made in its thread: the warm-up's
    older grant is dropped, and later Allocates hand out the new one
    without making it again."""
    import trio

    from powerdev.resources import allocation as allocation_module

    inventory = Inventory((A, B))
    plugin = Plugin(ResourceConfig(), inventory, refresh=None, spec=None)
    made = allocation_module.grant

    def while_the_list_changes(devices, permissions):
        monkeypatch.setattr(allocation_module, "grant", made)
        trio.from_thread.run_sync(inventory.publish, (A,))
        trio.from_thread.run_sync(plugin.allocate, [["sda"]])  # a pod meanwhile
        return made(devices, permissions)

    monkeypatch.setattr(allocation_module, "grant", while_the_list_changes)
    await plugin.warm()

    def made_again(*args):
        raise AssertionError("the grant was made again at Allocate")

    monkeypatch.setattr(allocation_module, "grant", made_again)
    (grant,) = plugin.allocate([["sda"]], refresh=False)
    assert [g.host_path for g in grant] == ["/dev/sda"]


async def test_a_count_made_in_its_thread_is_in_force_while_the_natural_order_is_made(
    monkeypatch,
):
    """ "each": a new list's units are counted, then put in natural order,
    each in a worker thread; an Allocate between the two finds the count
    made, and does not count again on the Trio thread."""
    import threading

    import trio

    from powerdev.resources import plugin as plugin_module

    devices = tuple(Device(f"loop{i}", f"/dev/loop{i}", "b", 7, i) for i in range(5))
    plugin = Plugin(ResourceConfig(allocation="each"), Inventory(devices), refresh=None, spec=None)
    counted, ranked = plugin_module._counted, plugin_module._ranked
    on_trio_thread = []
    ranking_began, go_on = threading.Event(), threading.Event()

    def counting(*args):
        on_trio_thread.append(threading.current_thread() is threading.main_thread())
        return counted(*args)

    def ranking(units):
        ranking_began.set()
        go_on.wait(timeout=30)
        return ranked(units)

    monkeypatch.setattr(plugin_module, "_counted", counting)
    monkeypatch.setattr(plugin_module, "_ranked", ranking)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(plugin.units_soon, plugin.inventory.current)
        try:
            await trio.to_thread.run_sync(ranking_began.wait, 30)
            assert len(plugin.units()) == 5  # an Allocate meanwhile
        finally:
            go_on.set()
    assert on_trio_thread == [False]
    assert plugin.preferred([(["loop3", "loop1"], [], 1)]) == [["loop1"]]


@given(
    st.lists(
        st.text(alphabet="ab-._:/0123456789xyzAZ ", max_size=12).filter(lambda t: t.isprintable()),
        max_size=30,
    )
)
def test_the_natural_order_as_one_string_sorts_as_the_natural_key(names):
    """natural_text() (one string a name, for sorting a whole list) puts
    any names, with leading zeros, punctuation below the digits and ties
    (a01, a1), in exactly natural_key()'s order."""
    from powerdev.resources.allocation import natural_key, natural_sorted, natural_text

    assert sorted(names, key=natural_text) == sorted(names, key=natural_key)
    tricky = ["a1", "a01", "a001", "a-", "a", "a.1", "a 1", "a10", "a9", "b", "A1", "a1b", "a1-"]
    for order in (tricky, tricky[::-1], sorted(tricky)):
        assert sorted(order, key=natural_text) == sorted(order, key=natural_key)
    # the marks natural_text uses, in a name: natural_sorted sorts by natural_key then
    marked = [*names, "a\x01", "a\x00b", "a1"]
    assert natural_sorted(marked) == sorted(marked, key=natural_key)
    assert sorted(["a1", "a\x01"], key=natural_text) != sorted(["a1", "a\x01"], key=natural_key)


def test_a_units_names_are_kept_in_order_and_one_name_is_the_device_itself():
    from powerdev.resources.allocation import by_unit, named, units_named

    a = Device("lun", "/dev/dm-3", "b", 253, 3)
    b = Device("lun", "/dev/mapper/mpatha", "b", 253, 3)
    c = Device("lun", "/dev/disk/by-id/dm-uuid-mpath-3600a", "b", 253, 3)
    other = Device("sdb", "/dev/sdb", "b", 8, 16)
    grouped = units_named([a, other, b, c])
    assert grouped["sdb"] is other  # no tuple of one
    assert named(grouped, "lun") == (a, b, c) == by_unit([a, other, b, c])["lun"]
    assert named(grouped, "sdb") == (other,) and named(grouped, "gone") == ()
