"""LUNs seen by several nodes, as plain data: what a node reports, and the
merge of every node's report into the cluster pool's devices."""

from __future__ import annotations

import json

import pytest

from powerdev.config import ConfigError, parse_config
from powerdev.devices.condition import DEGRADED, FAILED, Condition
from powerdev.dra.luns import (
    Report,
    Sighting,
    merge,
    parse_report,
    report_body,
    working_paths,
    wwid_of,
)

LUN = Sighting("dm-uuid-mpath-3600a-1234abcd", "DM_UUID=mpath-3600a", 2, 1 << 30, "IBM", "2145")
HOSTS = {"a": "host-a", "b": "host-b", "c": "host-c"}


def report(node: str, *luns: Sighting, resource: str = "r/lun") -> Report:
    return Report(node, "d", resource, luns)


def selection(device: dict) -> list[str]:
    (term,) = device["nodeSelector"]["nodeSelectorTerms"]
    (expression,) = term["matchExpressions"]
    assert (expression["key"], expression["operator"]) == ("kubernetes.io/hostname", "In")
    return expression["values"]


def test_one_device_per_lun_naming_every_node_that_reports_it():
    devices, conflicts = merge("r/lun", [report("b", LUN), report("a", LUN), report("c")], HOSTS)
    assert conflicts == []
    (device,) = devices
    assert device["name"] == LUN.device
    assert selection(device) == ["host-a", "host-b"]
    assert device["attributes"]["wwid"] == {"string": "3600a"}
    assert device["capacity"] == {"size": {"value": str(1 << 30)}}
    assert device["bindsToNode"] is True
    # another resource's reports are not merged; a node with no label is not named
    assert merge("r/other", [report("a", LUN)], HOSTS) == ([], [])
    assert merge("r/lun", [report("x", LUN)], HOSTS) == ([], [])


def test_a_node_that_sees_another_size_is_said_and_not_merged_and_a_tie_merges_nobody():
    odd = Sighting(LUN.device, LUN.identity, 2, 1 << 20, "IBM", "2145")
    devices, conflicts = merge(
        "r/lun", [report("a", LUN), report("b", LUN), report("c", odd)], HOSTS
    )
    assert [selection(d) for d in devices] == [["host-a", "host-b"]]
    (conflict,) = conflicts
    assert (conflict.node, conflict.others) == ("c", ("a", "b"))
    assert "node c is left out" in conflict.describe()
    devices, conflicts = merge("r/lun", [report("a", LUN), report("c", odd)], HOSTS)
    assert devices == []
    assert sorted(c.node for c in conflicts) == ["a", "c"]
    assert "not published until the nodes agree" in conflicts[0].describe()


def test_working_paths_and_wwids():
    paths = (("sdd", "running"), ("sde", "transport-offline"))
    assert working_paths(Condition(DEGRADED, paths=paths)) == 1
    assert working_paths(Condition(FAILED, paths=(("sdd", "offline"),))) == 0
    assert working_paths(Condition()) == 1  # a plain disk: its one path
    assert working_paths(Condition(FAILED)) == 0
    assert wwid_of("DM_UUID=mpath-3600a") == "3600a"
    assert wwid_of("DM_UUID=LVM-xyz") is None
    assert wwid_of("WWID=naa.600a") == "naa.600a"


def test_a_report_round_trips_and_a_bad_one_says_why():
    body = report_body("ns", "a", "d", "r/lun", [LUN], 7)
    assert body["metadata"]["labels"]["powerdev.io/lun-report"] == "1"
    assert parse_report(body) == report("a", LUN)
    body["data"]["luns"] = '[{"device": "x"}]'
    with pytest.raises(ValueError, match="without 'identity'"):
        parse_report(body)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"scope": "cluster"}, '"api": "device-plugin"; set "api": "dra"'),
        ({"api": "both", "scope": "cluster"}, '"api": "both"'),
        ({"api": "dra", "scope": "san"}, "'san' is not a scope"),
    ],
)
def test_scope_cluster_needs_dra(entry, message):
    config = json.dumps({"resources": [{"name": "r/lun", **entry}]})
    with pytest.raises(ConfigError) as raised:
        parse_config(config, source="config.json")
    assert "config.json: field 'resources[0].scope'" in str(raised.value)
    assert message in str(raised.value)
