"""Where the end-to-end tests find the conformance kit's binaries
(`bash conformance/build` makes them): each through its environment variable
first, else conformance/bin/ in this checkout. A variable that is set is the
only place looked at, so that a wrong path is reported instead of hidden by
an older build. controlplane.py runs what is found here."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "conformance" / "bin"
BUILD_COMMAND = "bash conformance/build"
TOOLS = {
    "etcd": "POWERDEV_ETCD",
    "kube-apiserver": "POWERDEV_KUBE_APISERVER",
    "kube-scheduler": "POWERDEV_KUBE_SCHEDULER",
    "kube-controller-manager": "POWERDEV_KUBE_CONTROLLER_MANAGER",
    "kubectl": "POWERDEV_KUBECTL",
}
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find(name: str, env: dict[str, str] | None = None) -> Path | None:
    """The tool's path, or None when it is not there."""
    env = os.environ if env is None else env
    named = env.get(TOOLS[name])
    path = Path(named) if named else BIN / name
    return path if _executable(path) else None


def where(name: str, env: dict[str, str] | None = None) -> str:
    """Where find() looked for the tool, for a message."""
    env = os.environ if env is None else env
    variable = TOOLS[name]
    named = env.get(variable)
    if named:
        return f"${variable}={named} is not an executable file"
    return f"no {BIN.relative_to(ROOT)}/{name} and ${variable} unset"


def find_all(names: tuple[str, ...], env: dict[str, str] | None = None) -> dict[str, Path]:
    """The tools found, by name; missing ones are left out."""
    found = {name: find(name, env) for name in names}
    return {name: path for name, path in found.items() if path is not None}


def missing_message(missing: list[str], env: dict[str, str] | None = None) -> str:
    """One line that names each missing tool, where it was looked for, and
    the command that builds the kit."""
    places = "; ".join(f"{name} ({where(name, env)})" for name in missing)
    return f"the conformance kit is not built: missing {places}; build it with: {BUILD_COMMAND}"
