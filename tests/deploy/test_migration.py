"""docs/migration.md, checked against what IBM's manifests make and what
powerdev's render: the steps delete exactly IBM's objects that powerdev does
not take over, never the namespace or the admin's ConfigMap; what they keep
becomes powerdev's (same identity, the admin's config.json in it); IBM's
ClusterRoleBinding, which names powerdev's ServiceAccount, is deleted, and
no object of powerdev's has its name."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from tests.deploy.test_components import COMPONENTS, OVERLAYS, identity
from tests.deploy.test_components import render as render_with
from tests.deploy.test_manifests import ROOT, kustomize
from tests.docs.markdown import blocks

pytestmark = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl is not on this machine"
)
PAGE = ROOT / "docs" / "migration.md"
NS = "power-device-plugin"

# What IBM's manifests/ makes (IBM/power-device-plugin): the four objects its
# install reports (project, serviceaccount, clusterrolebinding and daemonset,
# each named power-device-plugin), the DaemonSet's namespace, pod label and
# ServiceAccount, and the binding's subject, that ServiceAccount. Only what
# these checks need; the binding's role is not in IBM's README.
IBM = {
    ("Project", "", "power-device-plugin"): {},
    ("ServiceAccount", NS, "power-device-plugin"): {},
    ("ClusterRoleBinding", "", "power-device-plugin"): {
        "subjects": [{"kind": "ServiceAccount", "name": "power-device-plugin", "namespace": NS}]
    },
    ("DaemonSet", NS, "power-device-plugin"): {
        "pod_labels": {"app": "power-device-plugin"},
        "serviceAccountName": "power-device-plugin",
    },
}
# Not in manifests/: the admin makes it in that namespace, IBM's DaemonSet mounts it.
ADMIN_CONFIG = ("ConfigMap", NS, "power-device-config")
# A Project is OpenShift's view of a Namespace of the same name.
SAME = {"Project": "Namespace"}
KINDS = {
    "daemonset": "DaemonSet",
    "ds": "DaemonSet",
    "serviceaccount": "ServiceAccount",
    "sa": "ServiceAccount",
    "clusterrolebinding": "ClusterRoleBinding",
    "rolebinding": "RoleBinding",
    "configmap": "ConfigMap",
    "cm": "ConfigMap",
    "namespace": "Namespace",
    "ns": "Namespace",
    "project": "Project",
}


def commands() -> list[list[str]]:
    """The page's commands, in order, as words (comments dropped)."""
    found = []
    for b in blocks(PAGE):
        if b.lang == "sh":
            for line in b.text.splitlines():
                words = shlex.split(line, comments=True)
                if words:
                    found.append(words)
    return found


def deletes() -> list[tuple[tuple[str, str, str], list[str]]]:
    """Each `oc delete KIND [-n NS] NAME` of the page: (identity, its words)."""
    found = []
    for words in commands():
        if words[:2] not in (["oc", "delete"], ["kubectl", "delete"]):
            continue
        assert "-k" not in words and "-f" not in words and "-l" not in words, words
        args = [w for w in words[2:] if not w.startswith("--")]
        namespace = ""
        if "-n" in args:
            i = args.index("-n")
            namespace = args[i + 1]
            del args[i : i + 2]
        kind, name = args
        found.append(((KINDS[kind], namespace, name), words))
    return found


def migrated(tmp_path: Path) -> dict[tuple, dict]:
    """The page's kustomization, rendered from its file blocks in a copy of deploy/."""
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    for b in blocks(PAGE):
        if b.kind == "file":
            (tmp_path / b.value).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / b.value).write_text(b.text)
    (directory,) = {Path(b.value).parent for b in blocks(PAGE) if b.kind == "file"}
    return {identity(d): d for d in kustomize(tmp_path / directory)}


def powerdevs(tmp_path: Path) -> list[dict]:
    """Every object of every overlay, with and without every component."""
    docs = []
    for overlay in OVERLAYS:
        docs += kustomize(ROOT / overlay)
        docs += render_with(tmp_path / "components", overlay, COMPONENTS).values()
    return docs


def test_the_steps_delete_exactly_ibms_objects_that_powerdev_does_not_take_over():
    deleted = [key for key, _ in deletes()]
    assert len(deleted) == len(set(deleted))
    kept = {key for key in IBM if key[0] in SAME}  # the namespace, with the config in it
    assert set(deleted) == set(IBM) - kept
    assert ADMIN_CONFIG not in deleted
    assert not [key for key in deleted if key[0] in ("Namespace", "Project")]


def test_the_daemonset_goes_with_its_pods_before_powerdev_is_applied():
    words = commands()
    ((_, delete_ds),) = [(k, w) for k, w in deletes() if k[0] == "DaemonSet"]
    assert "--cascade=foreground" in delete_ds  # returns once IBM's pods are gone
    (apply,) = [w for w in words if w[:3] == ["oc", "apply", "-k"]]
    assert max(words.index(w) for _, w in deletes()) < words.index(apply)


def test_what_the_steps_keep_becomes_powerdevs_with_the_admins_config(tmp_path):
    rendered = migrated(tmp_path)
    kept = [key for key in IBM if key not in {k for k, _ in deletes()}]
    for kind, namespace, name in [*kept, ADMIN_CONFIG]:
        mine = rendered[(SAME.get(kind, kind), namespace, name)]
        assert mine["metadata"]["labels"]["app.kubernetes.io/part-of"] == "powerdev"
    (config,) = [b.text for b in blocks(PAGE) if b.kind == "file" and b.value.endswith(".json")]
    assert rendered[ADMIN_CONFIG]["data"] == {"config.json": config}
    # and the rest is deploy/openshift as shipped
    shipped = {identity(d): d for d in kustomize(ROOT / "deploy" / "openshift")}
    assert set(rendered) == set(shipped)
    for key, doc in rendered.items():
        if key != ADMIN_CONFIG:
            assert doc == shipped[key], key
    # what the steps delete, powerdev makes anew (the names are the same)
    for key, _ in deletes():
        if key[0] != "ClusterRoleBinding":
            assert key in rendered, key


def test_ibms_binding_would_bind_powerdevs_account_so_the_steps_delete_it(tmp_path):
    docs = powerdevs(tmp_path)
    accounts = {
        (d["metadata"]["namespace"], d["metadata"]["name"])
        for d in docs
        if d["kind"] == "ServiceAccount"
    }
    deleted = {key for key, _ in deletes()}
    for key, facts in IBM.items():
        for subject in facts.get("subjects", []):
            if (subject["namespace"], subject["name"]) in accounts:
                assert key in deleted, f"{key} binds powerdev's {subject} and is left"
    assert any(IBM[k].get("subjects") for k in deleted)  # the danger is real
    # the deletes by name can only hit IBM's: powerdev has no binding of those names
    ours = {identity(d) for d in docs if d["kind"].endswith("Binding")}
    assert not ours & {k for k in deleted if k[0].endswith("Binding")}
    # the look for other bindings leaves powerdev's out: each carries the label
    for d in docs:
        if d["kind"].endswith("Binding"):
            assert d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "powerdev"
    finder = [w for w in commands() if w[:3] == ["oc", "get", "clusterrolebinding,rolebinding"]]
    assert finder and "!app.kubernetes.io/part-of" in finder[0]


def test_ibms_pods_share_powerdevs_label_so_nothing_is_deleted_by_label():
    """Why the page deletes by name: a label selector would take both plugins' pods."""
    ds = yaml.safe_load((ROOT / "deploy" / "base" / "03-daemonset.yaml").read_text())
    ibm = IBM[("DaemonSet", NS, "power-device-plugin")]
    assert ibm["pod_labels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert ibm["serviceAccountName"] == ds["spec"]["template"]["spec"]["serviceAccountName"]
    assert deletes()  # and deletes() refuses -l, -k and -f
