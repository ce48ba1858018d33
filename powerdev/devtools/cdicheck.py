"""The real CDI library (tags.cncf.io/container-device-interface, the code
containerd and CRI-O use) as a command, conformance/cdicheck: validate spec
dirs, and resolve CDI names into an OCI spec as a runtime does. This module
runs it; kit.py finds it. For tests; nothing in the daemon uses it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any


def _run(binary: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [str(binary), *args], capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode not in (0, 1):
        raise RuntimeError(f"cdicheck {' '.join(args)}: {done.stderr.strip()}")
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def validate(binary: Path, *spec_dirs: Path) -> dict[str, Any]:
    return _run(binary, "validate", *map(str, spec_dirs))


def inject(binary: Path, spec_dirs: list[Path], names: list[str]) -> dict[str, Any]:
    return _run(binary, "inject", "--strict", *map(str, spec_dirs), "--", *names)
