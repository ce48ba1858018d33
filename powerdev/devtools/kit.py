"""Where tests and the bench find the conformance kit's binaries.

`bash conformance/build` builds the kit (the kubelet's device manager
harness, its DRA manager harness, the CDI library's checker, a one-node
control plane, kubectl, a real node's kubelet, containerd and runc,
promtool for the alert rules, and actionlint for the workflows) from Go
modules
into conformance/bin/ of this checkout. Each binary may instead be named by
its environment variable; a variable that is set is the only place looked
at, so that a wrong path is reported rather than hidden by an older build.
Nothing in the daemon uses the kit.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KIT_BIN = ROOT / "conformance" / "bin"
BUILD_COMMAND = "bash conformance/build"


@dataclass(frozen=True)
class KitBinary:
    name: str  # its file name in conformance/bin/
    env: str  # the variable that names another build of it
    what: str  # what it is, for a person

    def find(self, env: Mapping[str, str] | None = None, kit_bin: Path = KIT_BIN) -> Path | None:
        """The executable that $env names if it is set, else the kit's build;
        None when that is not an executable file."""
        named = (os.environ if env is None else env).get(self.env)
        path = Path(named) if named else kit_bin / self.name
        return path if path.is_file() and os.access(path, os.X_OK) else None

    def where(self, env: Mapping[str, str] | None = None, kit_bin: Path = KIT_BIN) -> str:
        """Where find() looked, for a message."""
        named = (os.environ if env is None else env).get(self.env)
        if named:
            return f"${self.env}={named} is not an executable file"
        shown = kit_bin.relative_to(ROOT) if kit_bin.is_relative_to(ROOT) else kit_bin
        return f"no {shown}/{self.name} and ${self.env} unset"

    @property
    def missing(self) -> str:
        """One line for a test that cannot run without it."""
        return f"{self.what} is not built: run `{BUILD_COMMAND}` (needs Go), or set ${self.env}"


DMHARNESS = KitBinary("dmharness", "POWERDEV_DMHARNESS", "the kubelet's device manager harness")
DRAHARNESS = KitBinary(
    "draharness", "POWERDEV_DRAHARNESS", "the kubelet's DRA manager and plugin manager harness"
)
CDICHECK = KitBinary("cdicheck", "POWERDEV_CDICHECK", "the CDI library's checker")
PROMTOOL = KitBinary("promtool", "POWERDEV_PROMTOOL", "Prometheus's promtool")
TOOLS = {
    tool.name: tool
    for tool in (
        DMHARNESS,
        DRAHARNESS,
        CDICHECK,
        KitBinary("etcd", "POWERDEV_ETCD", "etcd"),
        KitBinary("kube-apiserver", "POWERDEV_KUBE_APISERVER", "kube-apiserver"),
        KitBinary("kube-scheduler", "POWERDEV_KUBE_SCHEDULER", "kube-scheduler"),
        KitBinary(
            "kube-controller-manager", "POWERDEV_KUBE_CONTROLLER_MANAGER", "kube-controller-manager"
        ),
        KitBinary("kubectl", "POWERDEV_KUBECTL", "kubectl"),
        KitBinary("kubelet", "POWERDEV_KUBELET", "the kubelet"),
        KitBinary("containerd", "POWERDEV_CONTAINERD", "containerd"),
        KitBinary("containerd-shim-runc-v2", "POWERDEV_CONTAINERD_SHIM", "containerd's runc shim"),
        KitBinary("ctr", "POWERDEV_CTR", "containerd's ctr"),
        KitBinary("runc", "POWERDEV_RUNC", "runc"),
    )
}
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")
NODE = ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr", "runc")  # a real node's


def find(name: str, env: Mapping[str, str] | None = None) -> Path | None:
    return TOOLS[name].find(env)


def where(name: str, env: Mapping[str, str] | None = None) -> str:
    return TOOLS[name].where(env)


def find_all(names: Iterable[str], env: Mapping[str, str] | None = None) -> dict[str, Path]:
    """The tools found, by name; missing ones are left out."""
    found = {name: find(name, env) for name in names}
    return {name: path for name, path in found.items() if path is not None}


def missing_message(missing: Iterable[str], env: Mapping[str, str] | None = None) -> str:
    """One line that names each missing tool, where it was looked for, and
    the command that builds the kit."""
    places = "; ".join(f"{name} ({where(name, env)})" for name in missing)
    return f"the conformance kit is not built: missing {places}; build it with: {BUILD_COMMAND}"
