"""The operator's log lines, as tables: grammar, natural order, what changed,
the start lines, the rate limit on refusals, and the two log formats."""

from __future__ import annotations

import json
import logging
import sys
import tempfile
from datetime import datetime
from pathlib import Path

import pytest

from powerdev.config import ResourceConfig, load_config, parse_config
from powerdev.daemon.settings import Settings
from powerdev.devices.inventory import Inventory
from powerdev.devices.model import Device
from powerdev.ops import logformat, metrics, oplog
from powerdev.resources.plugin import Plugin


@pytest.mark.parametrize(
    ("count", "text"),
    [(0, "no device"), (1, "1 device"), (2, "2 devices"), (10_000, "10,000 devices")],
)
def test_counts_in_proper_grammar(count, text):
    assert oplog.plural(count, "device") == text


def test_names_in_natural_order_and_cut_after_a_bound():
    paths = ["/dev/loop42", "/dev/loop5", "/dev/sdb", "/dev/loop4", "/dev/mapper/mpatha"]
    assert oplog.names(paths) == "loop4, loop5, loop42, mapper/mpatha, sdb"
    many = [f"/dev/sd{i}" for i in range(30, 0, -1)]
    assert oplog.names(many, most=3) == "sd1, sd2, sd3 and 27 more"


def listing(**health: bool) -> dict[str, bool]:
    return {f"/dev/{name}": ok for name, ok in health.items()}


@pytest.mark.parametrize(
    ("before", "after", "line"),
    [
        (None, {}, "no device"),
        (None, listing(loop5=True, loop42=True, loop4=True), "3 devices: loop4, loop5, loop42"),
        (None, listing(sda=True, sdb=False), "2 devices (1 Unhealthy): sda, sdb"),
        (
            listing(loop4=True, sdb=True),
            listing(loop4=True, loop42=True),
            "added loop42; removed sdb; now 2 devices",
        ),
        (listing(sdb=True), {}, "removed sdb; now no device"),
        (listing(a=True, b=True), listing(a=True), "removed b; now 1 device"),
        (
            listing(sda=True, sdb=True),
            listing(sda=False, sdb=True),
            "Unhealthy: sda; now 2 devices (1 Unhealthy)",
        ),
        (listing(sda=False), listing(sda=True), "Healthy again: sda; now 1 device"),
        (listing(sda=True), listing(sda=True), None),
    ],
)
def test_a_device_list_change_says_what_changed(before, after, line):
    assert oplog.describe_change(before, after) == line


def test_the_device_log_remembers_what_it_said_per_resource():
    log = oplog.DeviceLog()
    a = [Device("sda", "/dev/sda", "b", 8, 0)]
    ab = [*a, Device("sdb", "/dev/sdb", "b", 8, 16)]
    assert log.change("x/a", a) == "1 device: sda"
    assert log.change("x/b", ab) == "2 devices: sda, sdb"
    assert log.change("x/a", ab) == "added sdb; now 2 devices"
    assert log.change("x/a", ab) is None


def test_the_device_log_follows_an_inventory_by_the_paths_it_changed():
    """After the first line, a line costs what changed: it reads only the
    paths the inventory says were set or removed, and says the same as a
    comparison of the whole lists would."""
    log = oplog.DeviceLog()
    sda, sdb = Device("sda", "/dev/sda", "b", 8, 0), Device("sdb", "/dev/sdb", "b", 8, 16)
    inventory = Inventory([sda])
    follow = lambda: log.follow("x/a", inventory.by_path, inventory.take_paths_changed())  # noqa: E731
    assert follow() == "1 device: sda"
    assert inventory.take_paths_changed() == set()
    inventory.update({"/dev/sdb": sdb})
    assert follow() == "added sdb; now 2 devices"
    inventory.update({"/dev/sda": Device("sda", "/dev/sda", "b", 8, 0, healthy=False)})
    assert follow() == "Unhealthy: sda; now 2 devices (1 Unhealthy)"
    inventory.update({"/dev/sda": None, "/dev/sdc": None})  # sdc was never listed
    assert follow() == "removed sda; now 1 device"
    inventory.update({"/dev/sdb": sdb})  # the same device: not a change
    assert inventory.take_paths_changed() == set()
    inventory.publish([sda, sdb])  # a whole new list: compared in full
    assert follow() == "added sda; now 2 devices"
    assert follow() is None


def test_the_start_lines_name_version_sources_port_socket_and_every_setting():
    config = parse_config(
        '{"include-devices": ["/dev/dm-*"], "exclude-devices": ["/dev/dm-9"], '
        '"upper-limit": 4, "discovery-strategy": "time", "scan-interval": "10m", '
        '"permissions": "r", "nx-gzip": true}',
        source="/etc/power-device-plugin/config.json",
    )
    config = type(config)(config.source, config.resources, raw=b"{}")
    lines = oplog.start_lines(Settings(plugin_dir=Path("/p")), config, "kernel")
    assert lines[0] == (
        "powerdev 0.1.0 starting: config /etc/power-device-plugin/config.json; events: kernel "
        "uevents (netlink) + inotify on the device directories + host mount changes; "
        "/metrics, /healthz, /readyz: off"
    )
    assert lines[1] == (
        "power-dev-plugin/dev: socket /p/power-dev.csi.ibm.com-reg.sock; nx-gzip true, "
        "permissions r, include-devices [/dev/dm-*], exclude-devices [/dev/dm-9], "
        "discovery-strategy time, scan-interval 600s, upper-limit 4, "
        "allow-host-used-devices false, cdi false, allocation all"
    )
    missing = Path(tempfile.mkdtemp()) / "x.json"
    first = oplog.start_lines(Settings(), load_config(missing), "off")[0]
    assert f"config {missing} (missing: defaults);" in first  # said once
    assert first.count("missing: defaults") == 1


def test_refusals_are_logged_in_a_burst_then_one_per_period_with_a_count():
    log = oplog.RefusalLog(burst=2, period=10.0)
    say = [log.line("r/x", "unknown_id", [["a", "b"]], "unknown device ID 'b'", t) for t in (0, 0)]
    assert say[0] == (
        "r/x: Allocate refused (unknown_id) for requested IDs [a, b]: unknown device ID 'b'; "
        "the kubelet fails the pod with UnexpectedAdmissionError"
    )
    assert say[1] is not None
    assert log.line("r/x", "unknown_id", [["a"]], "e", 1.0) is None  # over the burst
    assert log.line("r/x", "unknown_id", [["a"]], "e", 2.0) is None
    assert log.line("r/x", "unhealthy_id", [["a"]], "e", 2.0) is not None  # its own bucket
    later = log.line("r/x", "unknown_id", [["c"]], "e", 12.0)  # one token back after 10 s
    assert later is not None and later.endswith("(2 similar refusals not logged before this one)")
    assert log.line("r/x", "unknown_id", [["c"]], "e", 12.5) is None
    long = log.line("r/y", "other", [[f"id{i}" for i in range(200)]], "e", 0)
    assert long is not None and "..." in long and len(long) < 500


def test_a_refusal_reason_comes_from_the_advertised_ids():

    inventory = Inventory(
        [Device("sda", "/dev/sda", "b", 8, 0), Device("sdb", "/dev/sdb", "b", 8, 16, False)]
    )
    plugin = Plugin(ResourceConfig(), inventory, refresh=None, spec=None)
    assert metrics.refusal_reason(plugin, [["sda", "nope"]]) == "unknown_id"
    assert metrics.refusal_reason(plugin, [["sda", "sdb"]]) == "unhealthy_id"
    assert metrics.refusal_reason(plugin, [["sda"]]) == "other"


@pytest.mark.parametrize("cause", [c for c in metrics.CAUSES if c != "start"])
def test_registration_causes(cause):
    before = metrics.REGISTRY.get_sample_value(
        "powerdev_registrations_total", {"resource": "t/cause", "cause": cause}
    )
    metrics.next_registration("t/cause", cause)
    metrics.registered("t/cause")
    after = metrics.REGISTRY.get_sample_value(
        "powerdev_registrations_total", {"resource": "t/cause", "cause": cause}
    )
    assert after == (before or 0) + 1


def test_a_registration_cause_is_a_label_not_a_sentence():
    """The label comes from the code that knows the cause, never from the log's words."""
    with pytest.raises(ValueError, match="not a registration cause"):
        metrics.next_registration("t/cause", "kubelet.sock was created again")


def record(message: str, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            exc_info = sys.exc_info()
    return logging.LogRecord("powerdev.x", logging.WARNING, __file__, 1, message, (), exc_info)


def test_text_logs_carry_the_time_zone():
    line = logformat.TextFormatter().format(record("hello"))
    stamp, level, rest = line.split(" ", 2)
    assert datetime.fromisoformat(stamp).utcoffset() is not None
    assert (level, rest) == ("WARNING", "powerdev.x: hello")


def test_json_logs_are_one_object_per_line_even_with_newlines_and_tracebacks():
    line = logformat.JsonFormatter().format(record('two\nlines and "quotes" ünï', exc=True))
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == 'two\nlines and "quotes" ünï'
    assert entry["level"] == "WARNING" and entry["logger"] == "powerdev.x"
    assert datetime.fromisoformat(entry["time"]).utcoffset() is not None
    assert "RuntimeError: boom" in entry["exception"]


def test_a_reload_says_what_changed_in_config_json_words():
    """Never Python's: no None, True, tuples or field names with underscores."""
    old = ResourceConfig(include=("/dev/dm-*",))
    new = ResourceConfig(
        include=("/dev/dm-*", "/dev/sd*"),
        nx_gzip=True,
        device_uid=0,
        match_properties=(("DM_UUID", ("mpath-*",)),),
    )
    said = oplog.describe_changes(old, new)
    assert said == (
        "nx-gzip false -> true, include-devices [/dev/dm-*] -> [/dev/dm-*, /dev/sd*], "
        "device-uid unset -> 0, match-properties {} -> {DM_UUID: mpath-*}"
    )
    assert oplog.describe_changes(new, new) == ""
