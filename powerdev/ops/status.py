"""What each resource is doing, in a small JSON file, for `powerdev health`.

The daemon writes the file (atomically, on every change of state only); the
health command reads it and checks the claim by dialling the plugin's socket.
States: "waiting" (no kubelet.sock yet), "serving" (socket up, Register not
yet accepted), "registered", "re-registering" (a reason to register again
was seen, a kubelet restart say: the old socket is going or gone, the next
one is not up yet; it lasts milliseconds). An entry may also say a
"problem": what keeps the resource from its work now, such as a DRA pool
the API server cannot be reached to publish.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)
DEFAULT_STATUS_FILE = "/run/powerdev/status.json"


class StatusFile:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.resources: dict[str, dict[str, object]] = {}
        self._warned = False

    def set(self, resource: str, state: str, socket: Path) -> None:
        if self.resources.get(resource, {}).get("state") == state:
            return
        entry: dict[str, object] = {"state": state, "socket": str(socket), "since": time.time()}
        problem = self.resources.get(resource, {}).get("problem")
        if problem is not None:
            entry["problem"] = problem
        self.resources[resource] = entry
        self._write()

    def problem(self, resource: str, text: str | None) -> None:
        """What keeps a served resource from doing its work now (a DRA pool
        the API server does not take), or None once nothing does."""
        entry = self.resources.get(resource)
        if entry is None or entry.get("problem") == text:
            return
        if text is None:
            del entry["problem"]
        else:
            entry["problem"] = text
        self._write()

    def forget(self, resource: str) -> None:
        """A resource that stopped being served (gone from the config)."""
        if self.resources.pop(resource, None) is not None:
            self._write()

    def _write(self) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            tmp.write_text(json.dumps({"pid": os.getpid(), "resources": self.resources}))
            os.replace(tmp, self.path)
        except OSError as err:
            if not self._warned:
                log.warning(
                    "cannot write the status file %s (%s); `powerdev health` will report unknown",
                    self.path,
                    err,
                )
                self._warned = True


def read_status_file(path: Path) -> tuple[int | None, dict[str, dict[str, object]]]:
    """(the writer's pid, the resources); (None, {}) if missing or unreadable."""
    try:
        data = json.loads(path.read_text())
        pid = data.get("pid")
        return (pid if isinstance(pid, int) else None), dict(data.get("resources", {}))
    except (OSError, ValueError, AttributeError, TypeError):
        return None, {}
