"""The package layout is the architecture: each package imports only what
its docstring's "May import:" sentence names (read here: the docstring is
the rule), and no module imports, even lazily, a module that imports it
back."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "powerdev"

PACKAGES = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
# Without a docstring rule: the modules at the top (powerdev/__init__.py
# holds the version, __main__.py runs the command line) and generated code.
FIXED = {"": {"cli"}, "_proto": set()}


def stated_rule(package: str) -> set[str]:
    """What the package's docstring says it may import: the packages named
    between "May import:" and the end of that sentence ("anything" is every
    package, "generated code" is _proto)."""
    doc = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text())) or ""
    _, found, rest = doc.partition("May import:")
    assert found, f"powerdev/{package}/__init__.py: its docstring says no 'May import:'"
    sentence = re.split(r"\.(?:\s|$)", " ".join(rest.split()), maxsplit=1)[0]
    if "anything" in sentence:
        return set(PACKAGES) | {""}
    named = {word for word in re.findall(r"[a-z_]+", sentence) if word in PACKAGES}
    return named | ({"_proto"} if "generated code" in sentence else set())


ALLOWED: dict[str, set[str]] = {
    **{p: stated_rule(p) for p in PACKAGES if p not in FIXED},
    **FIXED,
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
