"""The real CDI library (tags.cncf.io/container-device-interface, the code
containerd and CRI-O use) as a command, conformance/cdicheck: validate spec
dirs, and resolve CDI names into an OCI spec as a runtime does. This module
finds the command and runs it. For tests; nothing in the daemon uses it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

CDICHECK_ENV = "POWERDEV_CDICHECK"
BUILT = Path(__file__).resolve().parents[2] / "conformance" / "bin" / "cdicheck"
MISSING = (
    "the CDI library's checker is not built: run `bash conformance/build` (needs Go), "
    f"or set ${CDICHECK_ENV}"
)


def find_cdicheck() -> Path | None:
    """The executable at $POWERDEV_CDICHECK, else conformance/bin/cdicheck in
    this checkout (built by `bash conformance/build`); None if neither is."""
    named = os.environ.get(CDICHECK_ENV)
    candidates = [Path(named)] if named else []
    candidates.append(BUILT)
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    return None


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
