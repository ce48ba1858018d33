"""Our DRA, plugin registration and DRA health .proto files (protos/) against
the kubelet's own, at the conformance kit's release: each upstream file,
read from Go's module cache, is compiled with protoc and its descriptor
compared with the one our generated module holds. So the package, every
message, field name, number, type and label, every enum value and every
method are upstream's; only comments and options may differ."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, json_format

from powerdev._proto import (
    dra_v1_pb2,
    dra_v1beta1_pb2,
    drahealth_pb2,
    pluginregistration_pb2,
)
from powerdev._proto.k8s.io.kubelet.pkg.apis.dra import v1 as dra_v1
from tests.unit.test_generated import _kubelet_proto

PAIRS = [
    ("dra/v1/api.proto", dra_v1_pb2),
    ("dra/v1beta1/api.proto", dra_v1beta1_pb2),
    ("pluginregistration/v1/api.proto", pluginregistration_pb2),
    ("dra-health/v1alpha1/api.proto", drahealth_pb2),
]


def _compiled(text: str, where: Path) -> descriptor_pb2.FileDescriptorProto:
    """The descriptor protoc makes of one .proto's text."""
    where.mkdir(parents=True)
    (where / "api.proto").write_text(text)
    out = where / "api.pb"
    protoc = [sys.executable, "-m", "grpc_tools.protoc", f"-I{where}"]
    subprocess.run(
        [*protoc, f"--descriptor_set_out={out}", "api.proto"],
        check=True,
        capture_output=True,
    )
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return files.file[0]


def _shape(file: descriptor_pb2.FileDescriptorProto) -> dict:
    """What goes on the wire and into method names, in an order-free form:
    the file without its name, options (go_package) and comments, with
    messages, enums, services, fields and methods sorted by name."""
    shaped = descriptor_pb2.FileDescriptorProto()
    shaped.CopyFrom(file)
    for drop in ("name", "options", "source_code_info"):
        shaped.ClearField(drop)
    return _sorted(json_format.MessageToDict(shaped, preserving_proto_field_name=True))


def _sorted(value):
    """Lists of named things sorted by name, all the way down; without
    json_name, which protoc writes only into a descriptor set (it follows
    from the field's name)."""
    if isinstance(value, dict):
        return {key: _sorted(item) for key, item in value.items() if key != "json_name"}
    if isinstance(value, list):
        items = [_sorted(item) for item in value]
        if all(isinstance(item, dict) and "name" in item for item in items):
            items.sort(key=lambda item: item["name"])
        return items
    return value


@pytest.mark.parametrize(("upstream", "ours"), PAIRS, ids=[p for p, _ in PAIRS])
def test_same_descriptor_as_the_kubelets(upstream, ours, tmp_path):
    theirs = _compiled(_kubelet_proto(upstream), tmp_path / "upstream")
    mine = descriptor_pb2.FileDescriptorProto.FromString(ours.DESCRIPTOR.serialized_pb)
    assert _shape(mine) == _shape(theirs)


def test_method_names_and_wire_bytes():
    """The full method names the kubelet calls, and one message's bytes."""
    assert "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources" in (
        dra_v1.DraPluginBase().__mapping__()
    )
    claim = dra_v1.Claim(namespace="ns", uid="u1", name="c")
    assert bytes(claim) == b"\n\x02ns\x12\x02u1\x1a\x01c"
    device = dra_v1.Device(request_names=["r"], cdi_device_ids=["a/b=c"], share_id="")
    assert bytes(device) == b'\n\x01r"\x05a/b=c*\x00'  # an optional field set to "" is sent
