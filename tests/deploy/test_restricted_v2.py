"""The pods meant for OpenShift's restricted-v2 SCC (the examples' OpenShift
overlays, the webhook's) ask for nothing it refuses, and the Kubernetes
examples, which pin runAsUser, would be refused: the check tells them apart.

restricted-v2, as OpenShift 4.11 and later ship it: runAsUser MustRunAsRange
(a UID from the namespace's range, which a manifest cannot know, so none may
be pinned), no privileged container, no privilege escalation, every
capability dropped and none added but NET_BIND_SERVICE, no host network,
PID, IPC or ports, the RuntimeDefault seccomp profile, any supplemental
group, and only these volume types."""

from __future__ import annotations

import copy
import shutil

import pytest

from tests.deploy.test_manifests import ROOT, kustomize

pytestmark = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl is not on this machine"
)
VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
CAPABILITIES = {"NET_BIND_SERVICE"}


def pod_specs(docs: list[dict]) -> list[tuple[str, dict]]:
    found = []
    for doc in docs:
        if doc["kind"] == "Pod":
            found.append((doc["metadata"]["name"], doc["spec"]))
        elif doc["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            found.append((doc["metadata"]["name"], doc["spec"]["template"]["spec"]))
    return found


def refusals(spec: dict) -> list[str]:
    """Why restricted-v2 would refuse a pod with this spec (none: it admits it)."""
    why = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            why.append(key)
    pod_ctx = spec.get("securityContext", {})
    if "runAsUser" in pod_ctx:
        why.append(f"pod runAsUser {pod_ctx['runAsUser']}")
    if pod_ctx.get("seccompProfile", {}).get("type", "RuntimeDefault") != "RuntimeDefault":
        why.append("pod seccomp profile")
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= VOLUMES:
            why.append(f"volume {volume['name']}: {sorted(kinds)}")
    for container in spec.get("initContainers", []) + spec["containers"]:
        name = container["name"]
        ctx = container.get("securityContext", {})
        if "runAsUser" in ctx:
            why.append(f"{name}: runAsUser {ctx['runAsUser']}")
        if ctx.get("privileged"):
            why.append(f"{name}: privileged")
        if ctx.get("allowPrivilegeEscalation", False):
            why.append(f"{name}: allowPrivilegeEscalation")
        capabilities = ctx.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            why.append(f"{name}: does not drop ALL")
        if not set(capabilities.get("add", [])) <= CAPABILITIES:
            why.append(f"{name}: adds {capabilities['add']}")
        if ctx.get("seccompProfile", {}).get("type", "RuntimeDefault") != "RuntimeDefault":
            why.append(f"{name}: seccomp profile")
        if any("hostPort" in port for port in container.get("ports", [])):
            why.append(f"{name}: hostPort")
    return why


@pytest.mark.parametrize(
    "directory", ["examples/openshift", "examples/openshift/dra", "deploy/webhook/openshift"]
)
def test_the_openshift_pods_meet_restricted_v2(directory):
    docs = kustomize(ROOT / directory)
    specs = pod_specs(docs)
    if directory == "deploy/webhook/openshift":
        # the DaemonSet has its own SCC (deploy/openshift); the webhook asks for restricted-v2
        (webhook,) = [d for d in docs if d["kind"] == "Deployment"]
        annotations = webhook["spec"]["template"]["metadata"]["annotations"]
        assert annotations["openshift.io/required-scc"] == "restricted-v2"
        specs = [(webhook["metadata"]["name"], webhook["spec"]["template"]["spec"])]
    assert specs
    for name, spec in specs:
        assert refusals(spec) == [], f"{directory}: {name}"
        ctx = spec["securityContext"]
        assert "runAsGroup" not in ctx, name  # restricted-v2 assigns the group too
        assert ctx["runAsNonRoot"] is True, name


@pytest.mark.parametrize("directory", ["examples", "examples/dra"])
def test_the_kubernetes_examples_pin_a_uid_that_restricted_v2_refuses(directory):
    for name, spec in pod_specs(kustomize(ROOT / directory)):
        assert refusals(spec) == [f"pod runAsUser {spec['securityContext']['runAsUser']}"], name


def test_the_dra_examples_openshift_overlay_changes_only_the_uid_and_gid():
    plain = kustomize(ROOT / "examples" / "dra")
    expected = copy.deepcopy(plain)
    for doc in expected:
        if doc["kind"] == "Pod":
            del doc["spec"]["securityContext"]["runAsUser"]
            del doc["spec"]["securityContext"]["runAsGroup"]
    assert kustomize(ROOT / "examples" / "openshift" / "dra") == expected
    (pod,) = [d for d in plain if d["kind"] == "Pod"]
    assert pod["spec"]["resourceClaims"]  # the claim, as on Kubernetes
