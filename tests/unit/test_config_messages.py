"""What a config's author reads: each message names the file, the field and
the fix, in JSON's words (null, true, an array), never Python's."""

import json
import re
import sys

import pytest

from powerdev.config import KNOWN_FIELDS, ConfigError, parse_config

SOURCE = "/etc/power-device-plugin/config.json"


def message(data: object) -> str:
    with pytest.raises(ConfigError) as err:
        parse_config(json.dumps(data), source=SOURCE)
    return str(err.value)


def entry(**fields: object) -> dict[str, object]:
    """A "resources" list of one resource; keys spelt with '_' are JSON's '-'."""
    return {"resources": [{k.replace("_", "-"): v for k, v in fields.items()}]}


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"resources": [{}]},
            "field 'resources[0].name': is missing; "
            "name each resource as an extended resource, such as power-dev-plugin/lun",
        ),
        (
            entry(name=None),
            "field 'resources[0].name': is a JSON null; "
            'write it as a string such as "power-dev-plugin/lun"',
        ),
        (
            entry(name=True),
            "field 'resources[0].name': is a JSON boolean; "
            'write it as a string such as "power-dev-plugin/lun"',
        ),
        (
            entry(name=["a.io/x"]),
            "field 'resources[0].name': is a JSON array; "
            'write it as a string such as "power-dev-plugin/lun"',
        ),
        (
            entry(name="nodomain"),
            "field 'resources[0].name': 'nodomain': an extended resource name needs a domain "
            "prefix, like vendor.example/dev; "
            "name each resource as an extended resource, such as power-dev-plugin/lun",
        ),
        (
            entry(name="a.io/x", socket=None),
            "field 'resources[0].socket': is a JSON null; "
            'write it as a string such as "lun.sock", or leave it out',
        ),
        (
            entry(name="a.io/x", socket=False),
            "field 'resources[0].socket': is a JSON boolean; "
            'write it as a string such as "lun.sock", or leave it out',
        ),
        (
            entry(name="a.io/x", socket=""),
            "field 'resources[0].socket': '' is not a file name; "
            "use a file name such as lun.sock, or leave it out",
        ),
    ],
)
def test_a_resources_name_and_socket(data, expected):
    assert message(data) == f"{SOURCE}: {expected}"


# One value of each JSON type, and the shapes that hold one inside a list or
# an object: whatever field they land in, the message speaks JSON.
ODD_VALUES = [None, True, False, 0, -1, 2.5, "", "x", [], [None], [True], {}, {"A": None}]
PYTHON_WORDS = re.compile(r"\b(None|True|False)\b|\[\]|\{\}")


@pytest.mark.parametrize("key", [*KNOWN_FIELDS, "name", "socket"])
@pytest.mark.parametrize("value", ODD_VALUES, ids=json.dumps)
def test_no_message_speaks_python(key, value):
    flat = {key: value}
    listed = entry(name="a.io/x", cdi=True)
    listed["resources"][0][key] = value
    for data in (flat, listed):
        try:
            config = parse_config(json.dumps(data), source=SOURCE)
        except ConfigError as err:
            said = [str(err)]
        else:
            said = list(config.warnings)
        for line in said:
            assert not PYTHON_WORDS.search(line), line


@pytest.mark.parametrize(
    ("properties", "expected"),
    [
        (
            {"ID_SERIAL": [None]},
            "field 'match-properties.ID_SERIAL[0]': is a JSON null; "
            'write each glob as a string, such as "mpath-*"',
        ),
        (
            {"ID_SERIAL": ["3600*", 3]},
            "field 'match-properties.ID_SERIAL[1]': is a JSON number; "
            'write each glob as a string, such as "mpath-*"',
        ),
        (
            {"ID_SERIAL": []},
            "field 'match-properties.ID_SERIAL': is empty; "
            'write a glob string, or a list of them, such as "mpath-*"',
        ),
        (
            {"ID_SERIAL": None},
            "field 'match-properties.ID_SERIAL': is a JSON null; "
            'write a glob string, or a list of them, such as "mpath-*"',
        ),
        (
            {"ID_SERIAL": ["3600*", "[x"]},
            "field 'match-properties.ID_SERIAL[1]': '[x': a '[' is never closed; fix the glob",
        ),
        (
            {"ID_SERIAL": "[x"},
            "field 'match-properties.ID_SERIAL': '[x': a '[' is never closed; fix the glob",
        ),
    ],
)
def test_a_match_property_names_the_glob_at_fault(properties, expected):
    assert message({"match-properties": properties}) == f"{SOURCE}: {expected}"


def test_an_empty_glob_still_matches_an_empty_property():
    config = parse_config('{"match-properties": {"ID_PART": ""}}', source=SOURCE)
    assert config.resources[0].match_properties == (("ID_PART", ("",)),)


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        (
            "/dev/../etc/*",
            "field 'include-devices[0]': '/dev/../etc/*': it is /etc/* once '..' is resolved, "
            "and can never match: device nodes live under /dev; fix or remove the pattern",
        ),
        (
            "/dev/disk/../../sys/*",
            "field 'include-devices[0]': '/dev/disk/../../sys/*': it is /sys/* once '..' is "
            "resolved, and can never match: device nodes live under /dev; "
            "fix or remove the pattern",
        ),
        (
            "/sys/block/*",
            "field 'include-devices[0]': '/sys/block/*': it can never match: "
            "device nodes live under /dev; fix or remove the pattern",
        ),
    ],
)
def test_an_include_pattern_outside_dev_says_where_it_points(pattern, expected):
    assert message({"include-devices": [pattern]}) == f"{SOURCE}: {expected}"


@pytest.mark.parametrize("key", ["include-devices", "exclude-devices"])
def test_a_pattern_that_stays_under_dev_is_taken_resolved_and_said_so(key):
    """A device is named by its resolved path (its ID, its path in the
    container), so a pattern is matched resolved: an exclude pattern written
    with '..' excludes what it names."""
    config = parse_config(f'{{"{key}": ["/dev/mapper/../dm-*", "/dev//sd*"]}}', source=SOURCE)
    field = "include" if key == "include-devices" else "exclude"
    assert getattr(config.resources[0], field) == ("/dev/dm-*", "/dev/sd*")
    assert config.warnings == (
        f"{SOURCE}: field '{key}[0]': '/dev/mapper/../dm-*' is read as '/dev/dm-*' ('.' and "
        "'..' resolved, '//' made '/'): a device is named by its path without them; "
        "write the pattern that way",
        f"{SOURCE}: field '{key}[1]': '/dev//sd*' is read as '/dev/sd*' ('.' and "
        "'..' resolved, '//' made '/'): a device is named by its path without them; "
        "write the pattern that way",
    )


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        (
            "/dev/../etc/*",
            "field 'exclude-devices[0]': '/dev/../etc/*': it is /etc/* once '..' is resolved, "
            "and can never match: device nodes live under /dev, so it excludes nothing; "
            "fix or remove the pattern",
        ),
        (
            "/etc/*",
            "field 'exclude-devices[0]': '/etc/*': it can never match: "
            "device nodes live under /dev, so it excludes nothing; fix or remove the pattern",
        ),
    ],
)
def test_an_exclude_pattern_outside_dev_is_a_warning(pattern, expected):
    """Harmless, so the config stands; useless, so the operator hears of it."""
    config = parse_config(json.dumps({"exclude-devices": [pattern]}), source=SOURCE)
    assert config.resources[0].exclude == (pattern,)
    assert config.warnings == (f"{SOURCE}: {expected}",)


def test_pattern_warnings_come_before_unknown_fields_and_name_the_resource():
    data = entry(name="a.io/x", exclude_devices=["/dev/sd*", "/etc/*"], debug=1)
    first, second = parse_config(json.dumps(data), source=SOURCE).warnings
    assert first.startswith(f"{SOURCE}: field 'resources[0].exclude-devices[1]': '/etc/*': ")
    assert second.startswith(f"{SOURCE}: field 'resources[0].debug' is not known")


def test_a_number_too_long_to_read_is_said_without_python_advice():
    with pytest.raises(ConfigError) as err:
        parse_config('{"upper-limit": ' + "9" * 5000 + "}", source=SOURCE)
    assert str(err.value) == (
        f"{SOURCE}: cannot be read as JSON (a number has more than "
        f"{sys.get_int_max_str_digits()} digits); fix the value"
    )
