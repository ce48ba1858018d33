"""The package layout is the architecture: each package imports only the
packages below it (the rule its docstring states), and no module imports,
even lazily, a module that imports it back."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "powerdev"

# Which powerdev packages each package may import, besides itself. "" is a
# module at the top (powerdev/__init__.py, __main__.py).
ALLOWED: dict[str, set[str]] = {
    "": {"cli"},
    "_proto": set(),
    "support": set(),
    "devices": {"support"},
    "config": {"support", "devices"},
    "resources": {"support", "devices", "config"},
    "kubelet": {"support"},
    "ops": {"support", "devices", "config", "resources", "kubelet"},
    "rpc": {"support", "devices", "config", "resources", "ops", "_proto"},
    "daemon": {"support", "devices", "config", "resources", "ops", "rpc", "kubelet"},
    "webhook": {"support", "config"},
    "cli": {"", "support", "devices", "config", "resources", "ops", "kubelet", "daemon"}
    | {"webhook", "devtools"},
    "devtools": {"", "support", "devices", "config", "resources", "ops", "rpc", "kubelet"}
    | {"daemon", "_proto"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {
    module_name(path): path
    for path in sorted(PACKAGE.rglob("*.py"))
    if "_proto" not in path.parts  # generated: it imports only itself and protobuf
}


def package_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or (len(parts) == 2 and f"{module}" in MODULES and not _is_package(module)):
        return ""
    return parts[1]


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def imports(module: str) -> set[str]:
    """The powerdev modules `module` imports: at the top, inside a function,
    or for the type checker only."""
    tree = ast.parse(MODULES[module].read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("powerdev"):
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("powerdev"))
    return {name for name in found if name != module}


def test_every_package_is_in_the_rule():
    assert {package_of(m) for m in MODULES} <= ALLOWED.keys()
    assert len(MODULES) > 60  # the rule walks the real tree


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_only_what_its_package_may(module):
    mine = package_of(module)
    wrong = {
        name
        for name in imports(module)
        if package_of(name) != mine
        and package_of(name) not in ALLOWED[mine]
        and name != "powerdev"  # the package itself holds only __version__
    }
    assert wrong == set(), f"{module} ({mine or 'top'}) may not import {sorted(wrong)}"


def test_no_import_cycles():
    """Counting the imports only a type checker sees: a cycle there still
    means two modules that cannot be read apart."""
    graph = {m: imports(m) & MODULES.keys() for m in MODULES}
    cycles = []
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert cycles == []


def test_the_device_layer_imports_no_config_and_no_resource():
    """The rule the device inventory was built for, said plainly."""
    devices = [m for m in MODULES if package_of(m) == "devices"]
    assert len(devices) > 5
    for module in devices:
        assert {package_of(n) for n in imports(module)} <= {"devices", "support"}
