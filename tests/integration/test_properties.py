"""Bad input, generated: never a traceback, always a clean error or a right answer."""

import json

import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from powerdev.config import KNOWN_FIELDS, ConfigError, ResourceConfig, parse_config
from powerdev.devices.inventory import Inventory
from powerdev.devices.model import Device
from powerdev.resources.allocation import AllocationRefused, preferred
from powerdev.resources.plugin import Plugin
from powerdev.rpc.kubelet_side import PluginCallError
from tests.conftest import StubResources, config_for, daemon_and_kubelet, make_dev_tree

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=8,
)
texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=80)
ids = st.one_of(texts, st.sampled_from(["dm-0", "dm-1", "mapper.mpatha", "share-1", ""]))


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from([*KNOWN_FIELDS, "other"]), json_values, max_size=7))
def test_any_config_object_parses_or_fails_cleanly(fields):
    check_config_text(json.dumps(fields))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_any_config_text_parses_or_fails_cleanly(text):
    check_config_text(text)


def check_config_text(text):
    try:
        config = parse_config(text, source="/etc/power-device-plugin/config.json")
    except ConfigError as err:
        message = str(err)
        assert message.startswith("/etc/power-device-plugin/config.json")
        assert "\n" not in message.strip() or "not valid JSON" not in message
        return
    resource = config.resources[0]
    assert set(resource.permissions) <= set("rwm") and resource.permissions
    assert 0 <= resource.upper_limit <= 10_000 and resource.scan_interval >= 10


nasty_bytes = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda n: b"[" * n + b"]" * n, st.integers(1000, 200_000)),
    st.builds(lambda n: b'{"upper-limit": ' + b"9" * n + b"}", st.integers(1, 10_000)),
    st.builds(lambda d: json.dumps(d).encode(), st.dictionaries(st.text(), json_values)),
)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(content=nasty_bytes)
def test_any_bytes_at_reload_keep_the_daemon_and_a_good_config(tmp_path, content):
    """The reload path: whatever the file holds, reload() returns (True with a
    config applied, or False with the last good one kept) and never raises."""
    from powerdev.daemon.reload import Reloader
    from powerdev.daemon.settings import Settings

    path = tmp_path / "config.json"
    path.write_bytes(content)
    plugin = Plugin(ResourceConfig(), Inventory(), refresh=None, spec=None)
    good = plugin.resource
    running = StubResources([plugin])

    async def reload_once():
        return await Reloader(Settings(config_path=path), running).reload()

    applied = trio.run(reload_once)
    if not applied:
        assert plugin.resource == good and running.calls == []
    else:
        assert set(plugin.resource.permissions) <= set("rwm")


DEVICES = tuple(Device(i, f"/dev/{i}", "b", 253, n) for n, i in enumerate(["dm-0", "dm-1"]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(ids, max_size=20), max_size=10), st.integers(0, 3))
def test_allocate_refuses_or_grants_every_device(requests, limit):
    plugin = Plugin(ResourceConfig(upper_limit=limit), Inventory(DEVICES), refresh=None, spec=None)
    known = {u.id for u in plugin.units()}
    try:
        grants = plugin.allocate(requests)
    except AllocationRefused as err:
        assert any(i not in known for ids_ in requests for i in ids_)
        assert len(str(err)) < 400
        return
    assert all(i in known for ids_ in requests for i in ids_)
    assert len(grants) == len(requests)
    assert all([g.host_path for g in grant] == ["/dev/dm-0", "/dev/dm-1"] for grant in grants)


@settings(max_examples=300, deadline=None)
@given(st.lists(ids, max_size=50), st.lists(ids, max_size=10), st.integers(0, 60))
def test_preferred_keeps_what_must_be_kept(available, must, size):
    chosen = preferred(available, must, size)
    assert chosen[: len(set(must))] == list(dict.fromkeys(must))
    assert len(set(chosen)) == len(chosen)
    assert set(chosen) <= set(available) | set(must)
    assert len(chosen) <= max(size, len(set(must)))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["r", "w", "rw", "wr", "R", "W", "RW"]))
def test_m_is_granted_only_when_configured(permissions):
    config = parse_config(json.dumps({"permissions": permissions}), source="c.json")
    plugin = Plugin(config.resources[0], Inventory(DEVICES), refresh=None, spec=None)
    assert all("m" not in g.permissions for g in plugin.allocate([["dm-0"]])[0])


def test_default_permissions_have_no_m():
    plugin = Plugin(
        parse_config("{}", source="c").resources[0], Inventory(DEVICES), refresh=None, spec=None
    )
    assert {g.permissions for g in plugin.allocate([["dm-0"]])[0]} == {"rw"}


requests = st.lists(
    st.one_of(
        st.tuples(st.just("Allocate"), st.lists(st.lists(ids, max_size=30), max_size=5)),
        st.tuples(
            st.just("GetPreferredAllocation"),
            st.tuples(
                st.lists(ids, max_size=30), st.lists(ids, max_size=5), st.integers(-5, 200_000)
            ),
        ),
        st.tuples(
            st.sampled_from(["Allocate", "GetPreferredAllocation", "PreStartContainer"]),
            st.binary(max_size=300),
        ),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests)
def test_the_daemon_answers_any_request_cleanly_and_keeps_serving(tmp_path_factory, batch):
    tmp_path = tmp_path_factory.mktemp("props")
    dev = make_dev_tree(tmp_path / "dev", ["dm-0", "dm-1"])
    trio.run(_serve_batch, tmp_path, dev, batch)


async def _serve_batch(tmp_path, dev, batch):
    from powerdev.rpc import asyncio_door

    config = config_for('{"include-devices": ["/dev/dm-*"]}')
    with trio.fail_after(20):
        async with asyncio_door(), daemon_and_kubelet(tmp_path, config, dev_root=dev) as h:
            client = h.kubelet.client(h.name)
            for method, args in batch:
                try:
                    if isinstance(args, bytes):
                        await client.raw(method, args)
                    elif method == "Allocate":
                        grants = await h.kubelet.allocate_containers(h.name, args)
                        assert len(grants) == len(args)
                    else:
                        available, must, size = args
                        chosen = await client.preferred(available, must, size)
                        assert set(chosen) <= set(available) | set(must)
                except PluginCallError as err:
                    assert err.status == "INVALID_ARGUMENT", err
            grant = await h.kubelet.allocate(h.name, ["dm-0"])  # still serving
            assert len(grant.devices) == 2


def test_an_empty_file_at_runtime_keeps_the_last_good_config(tmp_path, caplog):
    """A writer caught between truncate and write: empty is not "defaults" now."""
    from powerdev.daemon.reload import Reloader
    from powerdev.daemon.settings import Settings

    path = tmp_path / "config.json"
    path.write_text("")
    plugin = Plugin(ResourceConfig(include=("/dev/dm-*",)), Inventory(), refresh=None, spec=None)
    running = StubResources([plugin])

    async def reload_once():
        return await Reloader(Settings(config_path=path), running, loaded=b"{}").reload()

    assert trio.run(reload_once) is False
    assert running.calls == [] and plugin.resource.include == ("/dev/dm-*",)
    assert any("is empty; the last good config stays in force" in r.message for r in caplog.records)
