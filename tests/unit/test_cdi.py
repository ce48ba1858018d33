"""CDI mode, as plain data: the config fields, the spec, the names."""

import json
import stat

import pytest

from powerdev.config import ConfigError, ResourceConfig, parse_config
from powerdev.devices.model import Device
from powerdev.resources import cdi


def only(text: str) -> ResourceConfig:
    return parse_config(text, source="c.json").resources[0]


def test_cdi_fields():
    resource = only('{"cdi": true, "device-uid": 0, "device-gid": 6, "device-mode": "0660"}')
    assert (resource.cdi, resource.device_uid, resource.device_gid) == (True, 0, 6)
    assert resource.device_mode == 0o660
    assert only("{}").cdi is False and only("{}").device_mode is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"device-gid": 6}', "field 'device-gid': applies only to CDI answers"),
        ('{"cdi": true, "device-mode": "rw"}', 'such as "0660"'),
        ('{"cdi": true, "device-mode": "0999"}', "not an octal file mode"),
        ('{"cdi": true, "device-uid": -1}', "from 0 to 2147483647"),
        ('{"cdi": "yes"}', "true or false"),
    ],
)
def test_cdi_field_errors(text, message):
    with pytest.raises(ConfigError, match=r"^c\.json: field ") as err:
        only(text)
    assert message in str(err.value)


DEVICES = (
    Device("dm-0", "/dev/dm-0", "b", 253, 0),
    Device("mapper.mpatha", "/dev/mapper/mpatha", "b", 253, 0),
    Device("sdb", "/dev/sdb", "b", 8, 16, healthy=False),
    Device("odd+name", "/dev/odd+name", "c", 1, 3),
)


def test_the_spec_names_each_healthy_device_with_its_node():
    resource = only('{"cdi": true, "permissions": "r", "device-gid": 6, "device-mode": "0640"}')
    spec = cdi.build_spec(resource, DEVICES)
    assert spec["kind"] == "power-dev-plugin/dev" and spec["cdiVersion"] == "0.5.0"
    names = [d["name"] for d in spec["devices"]]
    assert names[:2] == ["dm-0", "mapper.mpatha"]
    assert names[2].startswith("dev-")  # an ID CDI would refuse gets a hash
    (node,) = spec["devices"][1]["containerEdits"]["deviceNodes"]
    assert node == {
        "path": "/dev/mapper/mpatha",
        "hostPath": "/dev/mapper/mpatha",
        "type": "b",
        "major": 253,
        "minor": 0,
        "permissions": "r",
        "uid": 0,  # root's: without it the runtime would make each pod the owner
        "gid": 6,
        "fileMode": 0o640,
    }
    assert cdi.qualified_names(resource, DEVICES) == tuple(
        f"power-dev-plugin/dev={n}" for n in names
    )


@pytest.mark.parametrize(
    ("fields", "owner"),
    [
        ("", None),  # no owner named: the runtime's rule, the container's user owns it
        (', "device-gid": 6', (0, 6)),
        (', "device-mode": "0600"', None),  # a mode says nothing of who: still the pod's
        (', "device-uid": 1000', (1000, 0)),
        (', "device-uid": 7, "device-gid": 8', (7, 8)),
    ],
)
def test_a_spec_that_sets_an_owner_or_a_group_names_both(fields, owner):
    """The runtime's CDI library fills a missing uid or gid with the
    container process's: a spec that says who may open a node says both."""
    node = cdi.device_node(only('{"cdi": true' + fields + "}"), DEVICES[0])
    assert (None if "uid" not in node else (node["uid"], node["gid"])) == owner
    assert ("gid" in node) == ("uid" in node)


def test_specs_are_written_atomically_and_readable(tmp_path):
    path = cdi.spec_path(tmp_path, "power-dev-plugin/dev")
    assert path.name == "power-dev-plugin-dev.json"
    cdi.write_atomically(path, b'{"a": 1}')
    cdi.write_atomically(path, b'{"a": 2}')
    assert json.loads(path.read_text()) == {"a": 2}
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left
