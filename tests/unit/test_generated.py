"""The committed generated code matches protos/, and the README and CI agree."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

from powerdev._proto import api_pb2, podresources_pb2, v1beta1
from powerdev.devtools.kit import BUILD_COMMAND
from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_is_not_stale():
    done = subprocess.run(
        [sys.executable, str(ROOT / "protos" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_wire_names_and_numbers_match_the_kubelet_api():
    fields = v1beta1.ContainerAllocateResponse.__dataclass_fields__
    numbers = {name: f.metadata["betterproto"].number for name, f in fields.items()}
    assert numbers == {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5}
    device = v1beta1.Device(id="sda", health="Healthy")
    assert bytes(device) == b"\n\x03sda\x12\x07Healthy"
    request = v1beta1.RegisterRequest(version="v1beta1", endpoint="e.sock", resource_name="a/b")
    assert bytes(request) == b"\n\x07v1beta1\x12\x06e.sock\x1a\x03a/b"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```sh\n(.*?)\n```", readme, re.S)
    test_command = next(c for c in commands if "pytest" in c).strip()
    assert test_command.startswith("bash conformance/build && ")  # the kit, then the tests
    assert (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1] == test_command


def _upstream_fields(text: str) -> dict[str, dict[str, int]]:
    """message -> field name -> number, from the kubelet's api.proto."""
    messages: dict[str, dict[str, int]] = {}
    # `message X {}` on one line, or a body that ends with a `}` line
    for name, body in re.findall(r"^message (\w+) \{(?:\}|(.*?)^\})", text, re.S | re.M):
        fields = re.findall(r"^\s*(?:repeated )?(?:map<[^>]+>|\w+) (\w+) = (\d+)", body, re.M)
        messages[name] = {field: int(number) for field, number in fields}
    return messages


def _kubelet_proto(api: str) -> str:
    """A .proto of k8s.io/kubelet at the conformance kit's release, from Go's
    module cache (filled by `bash conformance/build`)."""
    replaced = re.search(
        r"k8s.io/kubelet => k8s.io/kubelet (v\S+)", (ROOT / "conformance" / "go.mod").read_text()
    )
    assert replaced is not None
    go = shutil.which("go")
    cache = go and subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True)
    where = f"k8s.io/kubelet@{replaced[1]}/pkg/apis/{api}"
    found = Path(cache.stdout.strip(), where) if cache else None
    upstream = require(
        found if found and found.is_file() else None,
        f"{where} is not in Go's module cache: run `{BUILD_COMMAND}` (needs Go)",
    )
    return upstream.read_text()


def _ours(module) -> dict[str, dict[str, int]]:
    return {
        message.name: {field.name: field.number for field in message.fields}
        for message in module.DESCRIPTOR.message_types_by_name.values()
    }


def test_every_message_and_field_has_the_kubelets_name_and_number():
    """The device plugin API, whole, against the kubelet's own api.proto."""
    assert _ours(api_pb2) == _upstream_fields(_kubelet_proto("deviceplugin/v1beta1/api.proto"))


def test_the_podresources_fields_we_read_have_the_kubelets_names_and_numbers():
    """PodResources: a subset (what powerdev reads), each as upstream has it."""
    upstream = _upstream_fields(_kubelet_proto("podresources/v1/api.proto"))
    for message, fields in _ours(podresources_pb2).items():
        assert fields.items() <= upstream[message].items(), message
