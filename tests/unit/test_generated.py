"""The committed generated code matches protos/, and the README and CI agree."""

import re
import subprocess
import sys
from pathlib import Path

from powerdev._proto import v1beta1

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
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command.strip() in (ROOT / ".ci" / "run").read_text()
