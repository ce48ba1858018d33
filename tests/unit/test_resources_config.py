"""Several named resources in one config.json, beside the seed's flat form."""

import json

import pytest

from powerdev.config import ConfigError, parse_config


def config(data):
    return parse_config(json.dumps(data), source="c.json")


SAN = {
    "resources": [
        {"name": "power-dev-plugin/nx-gzip", "nx-gzip": True, "include-devices": []},
        {
            "name": "power-dev-plugin/lun",
            "include-devices": ["/dev/mapper/*"],
            "exclude-devices": ["/dev/mapper/control"],
            "allocation": "each",
            "permissions": "r",
            "match-properties": {"DM_UUID": "mpath-*", "ID_MODEL": ["2145", "FlashSystem*"]},
        },
    ]
}


def test_the_flat_form_is_one_resource_named_on_the_command_line():
    (resource,) = parse_config('{"permissions": "r"}', source="c.json").resources
    assert (resource.name, resource.socket) == (
        "power-dev-plugin/dev",
        "power-dev.csi.ibm.com-reg.sock",
    )
    assert resource.allocation == "all"


def test_several_resources_each_with_its_own_fields_and_socket():
    gzip, lun = config(SAN).resources
    assert (gzip.name, gzip.socket, gzip.nx_gzip) == (
        "power-dev-plugin/nx-gzip",
        "power-dev-plugin-nx-gzip.sock",
        True,
    )
    assert (lun.allocation, lun.permissions, lun.include) == ("each", "r", ("/dev/mapper/*",))
    assert lun.match_properties == (
        ("DM_UUID", ("mpath-*",)),
        ("ID_MODEL", ("2145", "FlashSystem*")),
    )
    assert lun.socket == "power-dev-plugin-lun.sock"


def test_an_explicit_socket_and_per_resource_warnings():
    c = config({"resources": [{"name": "a.example/x", "socket": "x.sock", "debug": 1}]})
    assert c.resources[0].socket == "x.sock"
    assert c.warnings[0].startswith("c.json: field 'resources[0].debug' is not known")


def resources(*entries):
    return {"resources": list(entries)}


@pytest.mark.parametrize(
    ("data", "field", "fix"),
    [
        ({"resources": []}, "'resources'", "write a list of resources"),
        ({"resources": {}}, "'resources'", "write a list of resources"),
        ({"resources": [{}], "permissions": "r"}, "'permissions'", "move it into each resource"),
        (resources("x"), "'resources[0]'", 'an object with a "name"'),
        (resources({}), "'resources[0].name'", "extended resource"),
        (resources({"name": "nodomain"}), "'resources[0].name'", "power-dev-plugin/lun"),
        (
            resources({"name": "a.io/x", "socket": "a/b"}),
            "'resources[0].socket'",
            "a file name",
        ),
        (
            resources({"name": "a.io/x"}, {"name": "a.io/x"}),
            "'resources[1].name'",
            "its own name",
        ),
        (
            resources(
                {"name": "a.io/x", "socket": "s.sock", "include-devices": ["/dev/a*"]},
                {"name": "a.io/y", "socket": "s.sock", "include-devices": ["/dev/b*"]},
            ),
            "'resources[1].socket'",
            "its own socket",
        ),
        (
            resources({"name": "a.io/x", "allocation": "some"}),
            "'resources[0].allocation'",
            '"each"',
        ),
        (
            resources({"name": "a.io/x", "allocation": "each", "upper-limit": 3}),
            "'resources[0].upper-limit'",
            "remove upper-limit",
        ),
        (
            resources({"name": "a.io/x", "match-properties": {"dm_uuid": "x"}}),
            "'resources[0].match-properties.dm_uuid'",
            "DM_UUID",
        ),
        (
            resources({"name": "a.io/x", "match-properties": {"DM_UUID": 3}}),
            "'resources[0].match-properties.DM_UUID'",
            "glob string",
        ),
        (
            resources({"name": "a.io/x", "match-properties": {"DM_UUID": "[x"}}),
            "'resources[0].match-properties.DM_UUID'",
            "fix the glob",
        ),
        (
            resources(
                {"name": "a-b/c", "socket": "1.sock", "cdi": True, "include-devices": ["/dev/a*"]},
                {"name": "a/b-c", "socket": "2.sock", "include-devices": ["/dev/b*"]},  # cdi off
            ),
            "'resources[1].name'",
            "map to one CDI spec file, a-b-c.json; rename one of them",
        ),
        (
            resources({"name": "a.io/x", "permisions": "r"}),
            "'resources[0].permisions'",
            "did you mean 'permissions'?",
        ),
    ],
)
def test_errors_name_the_resource_and_field(data, field, fix):
    with pytest.raises(ConfigError) as err:
        config(data)
    message = str(err.value)
    assert message.startswith(f"c.json: field {field}"), message
    assert fix in message


@pytest.mark.parametrize(
    ("a", "b", "clash"),
    [
        ({"include-devices": ["/dev/dm-*"]}, {"include-devices": ["/dev/dm-1"]}, True),
        ({"include-devices": ["/dev/dm-*"]}, {"include-devices": ["/dev/sd*"]}, False),
        ({"include-devices": ["/dev/sd[a-c]"]}, {"include-devices": ["/dev/sd[^a-c]"]}, False),
        ({"include-devices": ["/dev/mapper/*"]}, {"include-devices": ["/dev/*"]}, False),
        (  # an excluded literal path cannot clash
            {"include-devices": ["/dev/dm-*"], "exclude-devices": ["/dev/dm-1"]},
            {"include-devices": ["/dev/dm-1"]},
            False,
        ),
        ({}, {}, True),  # block discovery twice
        ({}, {"include-devices": ["/dev/sd*"]}, True),  # block discovery lists /dev/sd*
        ({}, {"include-devices": ["/dev/mapper/*"]}, False),
        (
            {"nx-gzip": True, "include-devices": ["/dev/x"]},
            {"nx-gzip": True, "include-devices": ["/dev/y"]},
            True,
        ),
        (  # the same paths, told apart by udev properties
            {"include-devices": ["/dev/mapper/*"], "match-properties": {"DM_UUID": "mpath-*"}},
            {"include-devices": ["/dev/mapper/*"], "match-properties": {"DM_UUID": "LVM-*"}},
            False,
        ),
        (
            {"include-devices": ["/dev/mapper/*"], "match-properties": {"DM_UUID": "mpath-*"}},
            {"include-devices": ["/dev/mapper/*"], "match-properties": {"DM_UUID": "*"}},
            True,
        ),
    ],
)
def test_a_device_can_belong_to_one_resource_only(a, b, clash):
    data = resources({"name": "a.io/first", **a}, {"name": "a.io/second", **b})
    if not clash:
        assert len(config(data).resources) == 2
        return
    with pytest.raises(ConfigError) as err:
        config(data)
    message = str(err.value)
    assert "c.json: field 'resources[1].include-devices'" in message
    assert "a.io/second" in message and "a.io/first" in message
    assert "a device belongs to one resource only" in message


@pytest.mark.parametrize(
    ("entry", "field", "problem"),
    [
        ({"name": "a.io/x", "include-devices": ["/dev/sd\u0000a"]}, "include-devices[0]", "NUL"),
        ({"name": "a.io/x", "socket": "kubelet_internal_checkpoint"}, "socket", "kubelet's own"),
        ({"name": "a.io/x", "socket": "kubelet.sock"}, "socket", "kubelet's own"),
        ({"name": "a.io/x", "socket": ".."}, "socket", "not a file name"),
        ({"name": "a.io/x", "socket": "a\u0000b"}, "socket", "no NUL"),
        (
            {"name": "a.io/x", "match-properties": {"DM_UUID": "x\u0000"}},
            "match-properties.DM_UUID",
            "NUL",
        ),
        ({"name": "1vendor.io/lun", "cdi": True}, "name", "starts with a letter"),
        ({"name": "a.io/x", "include-devices": ["/dev/../etc/*"]}, "include-devices[0]", "/dev"),
        (
            {"name": "a.io/x", "include-devices": ["/dev/" + "*a" * 2046]},
            "include-devices[0]",
            "longer than 4096 bytes",
        ),
        (
            {"name": "a.io/x", "match-properties": {"ID_MODEL": "*x" * 2049}},
            "match-properties.ID_MODEL",
            "longer than 4096 bytes",
        ),
        ({"name": "example.com/lun.gold", "cdi": True}, "name", "class of letters"),
    ],
)
def test_inputs_that_once_crashed_the_daemon_or_the_runtime_are_config_errors(
    entry, field, problem
):
    with pytest.raises(ConfigError) as err:
        config({"resources": [entry]})
    assert f"field 'resources[0].{field}'" in str(err.value) and problem in str(err.value)


def test_a_huge_bare_scan_interval_is_an_error_not_an_overflow():
    with pytest.raises(ConfigError, match="scan-interval"):
        parse_config('{"scan-interval": ' + "9" * 400 + "}", source="c.json")
