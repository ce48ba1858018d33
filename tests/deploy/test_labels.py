"""app.kubernetes.io/part-of=powerdev on everything deploy/ and examples/ ship:
every object of every overlay, with every component, and every pod template
(the DaemonSet's, the webhook's, the examples'), so that the leftovers
command of docs/deployment.md finds what an uninstall left behind; no
selector changes because of it (a DaemonSet's or Deployment's cannot); and
that command names every kind they ship."""

from __future__ import annotations

import re
import shutil

import pytest

from tests.deploy.test_components import COMPONENTS, OVERLAYS
from tests.deploy.test_components import render as render_with
from tests.deploy.test_manifests import KUSTOMIZATIONS, ROOT, kustomize
from tests.docs.markdown import blocks

pytestmark = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl is not on this machine"
)
LABEL = "app.kubernetes.io/part-of"
# How `kubectl get` names each kind shipped ("all" covers workloads and services).
NAMES = {
    "Namespace": {"namespace", "namespaces", "ns"},
    "ConfigMap": {"configmap", "configmaps", "cm"},
    "ServiceAccount": {"serviceaccount", "serviceaccounts", "sa"},
    "DaemonSet": {"all", "daemonset", "daemonsets", "ds"},
    "Deployment": {"all", "deployment", "deployments", "deploy"},
    "Pod": {"all", "pod", "pods", "po"},
    "Service": {"all", "service", "services", "svc"},
    "Role": {"role", "roles"},
    "RoleBinding": {"rolebinding", "rolebindings"},
    "ClusterRole": {"clusterrole", "clusterroles"},
    "ClusterRoleBinding": {"clusterrolebinding", "clusterrolebindings"},
    "NetworkPolicy": {"networkpolicy", "networkpolicies", "netpol"},
    "PodDisruptionBudget": {"poddisruptionbudget", "poddisruptionbudgets", "pdb"},
    "MutatingWebhookConfiguration": {
        "mutatingwebhookconfiguration",
        "mutatingwebhookconfigurations",
    },
    "ValidatingAdmissionPolicy": {"validatingadmissionpolicy", "validatingadmissionpolicies"},
    "ValidatingAdmissionPolicyBinding": {
        "validatingadmissionpolicybinding",
        "validatingadmissionpolicybindings",
    },
    "DeviceClass": {"deviceclass", "deviceclasses"},
    "ResourceClaimTemplate": {"resourceclaimtemplate", "resourceclaimtemplates"},
    "SecurityContextConstraints": {"scc", "securitycontextconstraints"},
    "PodMonitor": {"podmonitor", "podmonitors"},
    "PrometheusRule": {"prometheusrule", "prometheusrules"},
    "Certificate": {"certificate", "certificates", "cert"},
    "Issuer": {"issuer", "issuers"},
}


def shipped(tmp_path) -> dict[str, list[dict]]:
    """Every kustomization as shipped, and every overlay with every component."""
    found = {directory: kustomize(ROOT / directory) for directory in KUSTOMIZATIONS}
    for overlay in OVERLAYS:
        found[f"{overlay} + {COMPONENTS}"] = list(
            render_with(tmp_path, overlay, COMPONENTS).values()
        )
    return found


def templates(doc: dict):
    """The pod templates of a workload, however deep (a CronJob's included)."""
    spec = doc.get("spec", {})
    if isinstance(spec, dict):
        if "template" in spec and "spec" in spec["template"]:
            yield spec["template"]
            yield from templates(spec["template"])
        if "jobTemplate" in spec:
            yield from templates(spec["jobTemplate"])


def selectors(node, path=""):
    """Every label selector in an object: (path, selector)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key.lower().endswith("selector") and isinstance(value, dict):
                yield f"{path}.{key}", value
            yield from selectors(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from selectors(value, f"{path}[{i}]")


def test_every_object_and_pod_template_carries_the_label_and_no_selector_does(tmp_path):
    for where, docs in shipped(tmp_path).items():
        assert docs, where
        for doc in docs:
            name = f"{where}: {doc['kind']} {doc['metadata']['name']}"
            assert doc["metadata"].get("labels", {}).get(LABEL) == "powerdev", name
            workload = list(templates(doc))
            if doc["kind"] in ("DaemonSet", "Deployment"):
                assert workload, name
            for template in workload:
                assert template["metadata"]["labels"][LABEL] == "powerdev", f"{name}: its pods"
            for path, selector in selectors(doc):
                assert LABEL not in str(selector), f"{name}: {path}"


def leftover_kinds() -> set[str]:
    """The kinds the leftovers command of docs/deployment.md's Uninstall asks for."""
    names = set()
    for b in blocks(ROOT / "docs" / "deployment.md"):
        for line in b.text.splitlines():
            m = re.match(rf"(?:kubectl|oc) get (\S+) .*-l {LABEL}=powerdev", line)
            if m:
                names |= set(m.group(1).split(","))
    assert names, "no leftovers command in docs/deployment.md"
    return names


def test_the_leftovers_command_names_every_kind_shipped(tmp_path):
    asked = leftover_kinds()
    kinds = {doc["kind"] for docs in shipped(tmp_path).values() for doc in docs}
    for kind in sorted(kinds):
        assert kind in NAMES, f"{kind}: say how kubectl names it, and add it to the command"
        assert NAMES[kind] & asked, f"docs/deployment.md's leftovers command misses {kind}"
    # and asks for nothing the manifests do not ship (a typo fails on a cluster)
    known = set().union(*(NAMES[k] for k in kinds))
    assert asked <= known, asked - known
