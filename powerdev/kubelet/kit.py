"""Where tests and the bench find the conformance kit's binaries.

`bash conformance/build` builds the kit (the kubelet's device manager
harness, the CDI library's checker, a one-node control plane) from Go
modules into conformance/bin/ of this checkout. Each binary may also be
named by an environment variable, which is looked at first. Nothing in the
daemon uses the kit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

KIT_BIN = Path(__file__).resolve().parents[2] / "conformance" / "bin"
BUILD_COMMAND = "bash conformance/build"


@dataclass(frozen=True)
class KitBinary:
    name: str  # its file name in conformance/bin/
    env: str  # the variable that names another build of it
    what: str  # what it is, for a person

    def find(self, kit_bin: Path = KIT_BIN) -> Path | None:
        """The executable that $env names, else the kit's build; None if neither is."""
        named = os.environ.get(self.env)
        for path in ([Path(named)] if named else []) + [kit_bin / self.name]:
            if path.is_file() and os.access(path, os.X_OK):
                return path
        return None

    @property
    def missing(self) -> str:
        """One line for a test that cannot run without it."""
        return f"{self.what} is not built: run `{BUILD_COMMAND}` (needs Go), or set ${self.env}"


DMHARNESS = KitBinary("dmharness", "POWERDEV_DMHARNESS", "the kubelet's device manager harness")
CDICHECK = KitBinary("cdicheck", "POWERDEV_CDICHECK", "the CDI library's checker")
