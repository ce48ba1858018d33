"""The device layer knows no config and no resource: resources are views
over devices, never the other way round."""

from __future__ import annotations

import ast
from pathlib import Path

DEVICES = Path(__file__).resolve().parents[2] / "powerdev" / "devices"
FORBIDDEN = ("powerdev.config", "powerdev.resources", "powerdev.plugin", "powerdev.app")


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_device_layer_imports_no_config_and_no_resource():
    offending = {
        f"{path.name}: {name}"
        for path in sorted(DEVICES.glob("*.py"))
        for name in imports(path)
        if name.startswith(FORBIDDEN) or name in ("powerdev.config", "powerdev.resources")
    }
    assert offending == set()
    assert len(list(DEVICES.glob("*.py"))) > 5  # the directory is where it is said to be
