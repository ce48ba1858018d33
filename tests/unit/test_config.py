"""config.json parsing: every field of the seed, and the errors an operator reads."""

import pytest

from powerdev.config import (
    DEFAULT_RESOURCE_NAME,
    DEFAULT_SOCKET_NAME,
    KNOWN_FIELDS,
    ConfigError,
    ResourceConfig,
    load_config,
    normalize_permissions,
    parse_config,
    parse_duration,
    resource_name_problem,
)
from powerdev.config.fields import CDI_FIELDS, FIELDS_AFTER_CDI, FIELDS_BEFORE_CDI


def only(text: str):
    return parse_config(text, source="/etc/power-device-plugin/config.json").resources[0]


def test_empty_and_missing_mean_the_seeds_defaults(tmp_path):
    resource = load_config(tmp_path / "absent.json").resources[0]
    assert resource == only("{}") == only("")
    assert (resource.name, resource.socket) == (DEFAULT_RESOURCE_NAME, DEFAULT_SOCKET_NAME)
    assert (resource.nx_gzip, resource.permissions, resource.strategy) == (False, "rw", "default")
    assert (resource.include, resource.exclude, resource.upper_limit) == ((), (), 0)
    assert resource.scan_interval == 3600.0


def test_every_field_is_read():
    resource = only("""{
        "nx-gzip": true, "permissions": "RWM",
        "include-devices": ["/dev/dm-*", " /dev/mapper/* ", "", "/dev/dm-*"],
        "exclude-devices": ["/dev/sda*"],
        "discovery-strategy": "time", "scan-interval": "1h30m", "upper-limit": 12}""")
    assert resource.nx_gzip is True
    assert resource.permissions == "rwm"
    assert resource.include == (
        "/dev/dm-*",
        "/dev/mapper/*",
    )  # trimmed, empty dropped, deduplicated
    assert resource.exclude == ("/dev/sda*",)
    assert resource.strategy == "time"
    assert resource.scan_interval == 5400.0
    assert resource.upper_limit == 12


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("10m", 600),
        ("2h", 7200),
        ("1h30m", 5400),
        ("1.5h", 5400),
        ("500ms", 0.5),
        ("0", 0),
        ("+5s", 5),
        ("2h45m30.5s", 9930.5),
        ("100us", 1e-4),
    ],
)
def test_go_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "10", "s", "5 m", "-1s", "1d", "1h-5m", "h1"])
def test_bad_durations(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("r", "r"),
        ("w", "w"),
        ("m", "m"),
        ("rw", "rw"),
        ("WR", "rw"),
        ("mwr", "rwm"),
        ("rM", "rm"),
    ],
)
def test_permissions(text, normal):
    assert normalize_permissions(text) == normal


@pytest.mark.parametrize("text", ["rx", "rr", "read", "r w"])
def test_bad_permissions(text):
    with pytest.raises(ValueError):
        normalize_permissions(text)


def test_scan_interval_as_go_nanoseconds():
    assert only('{"scan-interval": 30000000000}').scan_interval == 30.0


@pytest.mark.parametrize(
    ("text", "field", "fix"),
    [
        ('{"permissions": "rx"}', "'permissions'", "one or more of r, w, m"),
        ('{"permissions": 7}', "'permissions'", 'a string such as "rw"'),
        ('{"nx-gzip": "yes"}', "'nx-gzip'", "true or false"),
        ('{"include-devices": "/dev/dm-*"}', "'include-devices'", '["/dev/dm-*"'),
        ('{"include-devices": [3]}', "'include-devices[0]'", "as a string"),
        ('{"include-devices": ["dm-*"]}', "'include-devices[0]'", "absolute host paths"),
        ('{"exclude-devices": ["/dev/[sd"]}', "'exclude-devices[0]'", "never closed"),
        ('{"discovery-strategy": "fast"}', "'discovery-strategy'", '"default"'),
        ('{"scan-interval": "10"}', "'scan-interval'", '"30s"'),
        ('{"scan-interval": "0s"}', "'scan-interval'", "shorter than the minimum of 10s"),
        ('{"scan-interval": "9s"}', "'scan-interval'", "10s or more"),
        ('{"scan-interval": 60}', "'scan-interval'", "a bare number is nanoseconds"),
        ('{"upper-limit": 1000000}', "'upper-limit'", "use at most 10000"),
        ('{"include-devices": ["/sys/block/*"]}', "'include-devices[0]'", "under /dev"),
        ('{"include-devices": ["/dev/sd[]"]}', "'include-devices[0]'", "not a valid Go glob"),
        ('{"include-devices": ["/dev/dm\\\\"]}', "'include-devices[0]'", "backslash"),
        ('{"permisions": "r"}', "'permisions'", "did you mean 'permissions'?"),
        ('{"upper_limit": 3}', "'upper_limit'", "did you mean 'upper-limit'?"),
        ('{"nx_gzip": true}', "'nx_gzip'", "did you mean 'nx-gzip'?"),
        ('{"allow-host-used-devices": "yes"}', "'allow-host-used-devices'", "true or false"),
        ('{"scan-interval": true}', "'scan-interval'", "duration string"),
        ('{"upper-limit": -1}', "'upper-limit'", "0 for no limit"),
        ('{"upper-limit": "5"}', "'upper-limit'", "whole number"),
        ('{"upper-limit": 2.5}', "'upper-limit'", "whole number"),
        ('{"upper-limit": true}', "'upper-limit'", "whole number"),
    ],
)
def test_errors_name_file_field_and_fix(text, field, fix):
    with pytest.raises(ConfigError) as err:
        only(text)
    message = str(err.value)
    assert message.startswith("/etc/power-device-plugin/config.json: field " + field)
    assert fix in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "not valid JSON (line 1, column 2"),
        ("[1, 2]", "top level is a JSON array"),
        ('"rw"', "top level is a JSON string"),
        ("[" * 100_000 + "]" * 100_000, "nests arrays or objects too deeply"),
        ('{"upper-limit": ' + "9" * 5000 + "}", "cannot be read as JSON"),
    ],
)
def test_whole_file_errors(text, problem):
    with pytest.raises(ConfigError, match=r"^/etc/power-device-plugin/config.json: ") as err:
        only(text)
    assert problem in str(err.value)


def test_unknown_fields_warn_and_do_not_fail():
    config = parse_config('{"debug": true}', source="c.json")
    assert config.resources[0] == parse_config("{}", source="c.json").resources[0]
    assert config.warnings == (
        "c.json: field 'debug' is not known and is ignored; known fields: "
        + ", ".join(KNOWN_FIELDS),
    )
    assert KNOWN_FIELDS[:7] == (  # the seed's fields, all of them
        "nx-gzip",
        "permissions",
        "include-devices",
        "exclude-devices",
        "discovery-strategy",
        "scan-interval",
        "upper-limit",
    )


def test_directory_and_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match=r"is a directory; point --config at the config\.json"):
        load_config(tmp_path)
    bad = tmp_path / "c.json"
    bad.write_bytes(b"\xff\xfe{")
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(invalid start byte at byte 0\)"):
        load_config(bad)


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("power-dev-plugin/dev", True),
        ("example.com/disk", True),
        ("a.b-c/x_y.z", True),
        ("dev", False),
        ("kubernetes.io/dev", False),
        ("requests.example.com/dev", False),
        ("Example.com/dev", False),
        ("example.com/", False),
        ("example.com/" + "x" * 64, False),
        ("-bad.com/dev", False),
        ("example.com/-x", False),
    ],
)
def test_resource_names_as_the_kubelet_checks_them(name, ok):
    assert (resource_name_problem(name) is None) is ok


def test_bad_resource_and_socket_names_are_config_errors():
    with pytest.raises(ConfigError, match=r"^--resource-name: 'dev': "):
        parse_config("{}", source="c", resource_name="dev")
    with pytest.raises(ConfigError, match=r"^--socket-name: 'a/b' is not a bare file name"):
        parse_config("{}", source="c", socket_name="a/b")


def test_a_missing_file_says_what_the_defaults_mean(tmp_path):
    (warning,) = load_config(tmp_path / "absent.json").warnings
    assert str(tmp_path / "absent.json") in warning and "does not exist" in warning
    assert "every block device of the host" in warning and "include-devices" in warning


def test_a_huge_file_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(" " * (2 * 1024 * 1024) + "{}")
    with pytest.raises(ConfigError, match="larger than 1024 KiB"):
        load_config(path)


def test_the_loaded_bytes_are_kept_for_reload_comparison(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b'{"permissions": "r"}')
    assert load_config(path).raw == b'{"permissions": "r"}'
    assert load_config(tmp_path / "absent.json").raw is None


def test_every_known_field_has_one_reader():
    tables = (FIELDS_BEFORE_CDI, CDI_FIELDS, FIELDS_AFTER_CDI)
    read = [key for table in tables for key, _, _ in table]
    assert sorted(read) == sorted(KNOWN_FIELDS)
    attributes = {attr for table in tables for _, attr, _ in table}
    assert attributes <= set(ResourceConfig.__dataclass_fields__)
