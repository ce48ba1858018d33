"""deploy/'s kustomize Components in every overlay, alone, together and in
every order: each combination renders what each component says it adds,
whatever the order of `components:`; the paths the components' comments give
render; and a component directory applied on its own is refused before
anything reaches a cluster.

deploy/cdi and deploy/dra both set config.json: deploy/dra's config (which
answers with CDI already) is the one whenever both are there, and the cdi
component then adds nothing. Every other pair changes different objects, so
each object of a combination is the one its component makes alone."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from powerdev.config import parse_config
from tests.deploy.test_manifests import ROOT, kustomize

pytestmark = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl is not on this machine"
)


def components(under: str = "deploy") -> list[str]:
    """The directories of deploy/ (or examples/) whose kustomization is a Component."""
    found = []
    for path in sorted((ROOT / under).glob("*/kustomization.yaml")):
        if (yaml.safe_load(path.read_text()) or {}).get("kind") == "Component":
            found.append(path.parent.name)
    return found


COMPONENTS = components()
# Every Component directory, which kubectl would otherwise apply as it is.
PARTS = [f"deploy/{name}" for name in COMPONENTS] + [
    f"examples/{n}" for n in components("examples")
]
# The overlays an admin applies; the docs add components to the first two, and
# the webhook's overlays carry the same DaemonSet and ConfigMap.
OVERLAYS = ["deploy", "deploy/openshift", "deploy/webhook", "deploy/webhook/openshift"]
DOCUMENTED = ["deploy", "deploy/openshift"]
SUBSETS = [s for n in range(1, len(COMPONENTS) + 1) for s in itertools.combinations(COMPONENTS, n)]


def identity(doc: dict) -> tuple[str, str, str]:
    return doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]


def render(tmp_path: Path, overlay: str, names, patches=()) -> dict[tuple, dict]:
    """`overlay`, from a fresh copy of deploy/, with the components `names` in
    that order (and `patches` after them), by identity."""
    root = tmp_path / "-".join(names or ["none"])
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(ROOT / "deploy", root / "deploy")
    kustomization = root / overlay / "kustomization.yaml"
    doc = yaml.safe_load(kustomization.read_text())
    if names:
        doc["components"] = [os.path.relpath(root / "deploy" / n, root / overlay) for n in names]
    doc.setdefault("patches", []).extend(patches)
    kustomization.write_text(yaml.safe_dump(doc))
    docs = kustomize(root / overlay)
    rendered = {identity(d): d for d in docs}
    assert len(rendered) == len(docs), "two objects with one identity"
    return rendered


def test_there_are_components_to_combine():
    assert {"cdi", "dra", "networkpolicy"} <= set(COMPONENTS)


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("subset", SUBSETS, ids="+".join)
def test_a_combination_renders_what_its_components_add_in_every_order(tmp_path, overlay, subset):
    plain = render(tmp_path, overlay, [])
    alone = {name: render(tmp_path, overlay, [name]) for name in subset}
    orders = [render(tmp_path, overlay, list(order)) for order in itertools.permutations(subset)]
    first = orders[0]
    for order, rendered in zip(itertools.permutations(subset), orders, strict=True):
        assert rendered == first, f"{overlay}: components {list(order)} render otherwise"

    effective = set(subset)
    if {"cdi", "dra"} <= effective:
        # deploy/dra includes what deploy/cdi adds, and its config wins.
        assert first == render(tmp_path, overlay, [n for n in subset if n != "cdi"])
        effective.discard("cdi")

    # What each component adds or changes, and that no two of them touch one object.
    changed = {
        name: {key for key, doc in alone[name].items() if plain.get(key) != doc}
        for name in effective
    }
    for a, b in itertools.combinations(sorted(effective), 2):
        assert not changed[a] & changed[b], f"{a} and {b} both change {changed[a] & changed[b]}"
    assert set(first) == set(plain).union(*(alone[n] for n in effective))
    for key, doc in first.items():
        owners = [n for n in effective if key in changed[n]]
        expected = alone[owners[0]][key] if owners else plain[key]
        assert doc == expected, f"{overlay} {list(subset)}: {key}"

    # And what the components say, on the combination itself.
    (cm,) = [d for k, d in first.items() if k[0] == "ConfigMap" and k[2] == "power-device-config"]
    (resource,) = parse_config(cm["data"]["config.json"], source="rendered").resources
    marker = cm["metadata"].get("annotations", {}).get("deploy.powerdev.io/config")
    if "dra" in subset:
        assert (marker, resource.api) == ("dra", "dra")
    elif "cdi" in subset:
        assert (marker, resource.api, resource.cdi) == ("cdi", "device-plugin", True)
    else:
        assert marker is None and not resource.cdi
    if "cdi" in subset or "dra" in subset:
        assert (resource.device_gid, resource.device_mode) == (6, 0o660)
    (ds,) = [d for k, d in first.items() if k[0] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    env = [e["name"] for e in pod["containers"][0]["env"]]
    assert env.count("POWERDEV_CDI_SPEC_DIR") == (1 if {"cdi", "dra"} & set(subset) else 0)
    assert ("NODE_NAME" in env) == ("dra" in subset)
    policies = [d for k, d in first.items() if k[0] == "NetworkPolicy" and "metrics" in k[2]]
    if "networkpolicy" in subset:
        (policy,) = policies
        assert policy["metadata"]["namespace"] == ds["metadata"]["namespace"]
        assert policy["spec"]["podSelector"]["matchLabels"].items() <= (
            ds["spec"]["template"]["metadata"]["labels"].items()
        )
    else:
        assert not policies
    if "luns" in subset:
        luns = first[("Deployment", ds["metadata"]["namespace"], "power-device-luns")]
        assert (
            luns["spec"]["template"]["spec"]["containers"][0]["image"]
            == (pod["containers"][0]["image"])
        )
        reports = first[
            ("RoleBinding", ds["metadata"]["namespace"], "power-device-plugin-lun-reports")
        ]
        assert reports["subjects"][0]["name"] == pod["serviceAccountName"]
    if "dra" in subset:
        binding = first[("ClusterRoleBinding", "", "power-device-plugin-dra")]
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": pod["serviceAccountName"],
                "namespace": ds["metadata"]["namespace"],
            }
        ]


# docs/dra.md's "both" step: a patch of the overlay, after the components.
BOTH = {
    "target": {"kind": "ConfigMap", "name": "power-device-config"},
    "patch": yaml.safe_dump(
        [{"op": "replace", "path": "/data/config.json", "value": '{"api": "both", "cdi": true}'}]
    ),
}


@pytest.mark.parametrize("order", [["dra"], ["cdi", "dra"], ["dra", "cdi"]], ids="+".join)
def test_an_overlays_own_config_patch_comes_after_the_components_in_any_order(tmp_path, order):
    rendered = render(tmp_path, "deploy", order, [BOTH])
    (cm,) = [d for k, d in rendered.items() if k[0] == "ConfigMap"]
    assert parse_config(cm["data"]["config.json"], source="patched").resources[0].both


COMMENTED = re.compile(r"^#\s+- (\S+)\s+\(in (\S+?)/?(?:kustomization\.yaml)?\)$")


def commented_paths(component: str) -> list[tuple[str, str]]:
    """The (path, overlay) pairs a component's comment tells an admin to add."""
    text = (ROOT / "deploy" / component / "kustomization.yaml").read_text()
    return [m.groups() for line in text.splitlines() if (m := COMMENTED.match(line))]


@pytest.mark.parametrize("component", COMPONENTS)
def test_the_paths_a_components_comment_gives_render(tmp_path, component):
    pairs = commented_paths(component)
    assert sorted(overlay.rstrip("/") for _, overlay in pairs) == DOCUMENTED, pairs
    for path, overlay in pairs:
        overlay = overlay.rstrip("/")
        root = tmp_path / overlay.replace("/", "-")
        shutil.copytree(ROOT / "deploy", root / "deploy")
        kustomization = root / overlay / "kustomization.yaml"
        doc = yaml.safe_load(kustomization.read_text())
        doc["components"] = [path]
        kustomization.write_text(yaml.safe_dump(doc))
        done = subprocess.run(
            ["kubectl", "kustomize", str(root / overlay)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, f"{component}: `- {path}` in {overlay}: {done.stderr}"


UNREACHABLE = """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


def apply_dry_run(directory: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """`kubectl apply -k` of a directory, against a server that is not there:
    what kubectl does before it talks to a cluster."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(UNREACHABLE)
    return subprocess.run(
        ["kubectl", "apply", "-k", str(directory), "--dry-run=client"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
    )


def test_there_are_parts_to_refuse():
    assert {"deploy/dra", "examples/check"} <= set(PARTS)


@pytest.mark.parametrize("component", PARTS)
def test_a_component_applied_alone_is_refused_before_the_cluster(tmp_path, component):
    done = apply_dry_run(ROOT / component, tmp_path)
    assert done.returncode != 0
    assert "127.0.0.1:9" not in done.stderr, f"{component} alone reached the cluster"
    assert done.stderr.startswith("error: "), done.stderr
    assert not done.stdout


def test_an_overlay_applied_reaches_the_cluster(tmp_path):
    """The check above tells a refusal from an apply: an overlay gets as far
    as the (missing) server."""
    assert "127.0.0.1:9" in apply_dry_run(ROOT / "deploy", tmp_path).stderr


@pytest.mark.skipif(
    (yaml.safe_load((ROOT / "deploy/monitoring/kustomization.yaml").read_text()) or {}).get("kind")
    == "Component",
    reason="deploy/monitoring is a component, combined above",
)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_monitoring_applied_beside_an_overlay_takes_none_of_its_objects(overlay):
    """deploy/monitoring is applied beside the overlay: it may not make an
    object the overlay makes (one apply would undo the other), and it is for
    the overlay's namespace."""
    beside = {identity(d) for d in kustomize(ROOT / "deploy" / "monitoring")}
    rendered = kustomize(ROOT / overlay)
    assert not beside & {identity(d) for d in rendered}
    (ds,) = [d for d in rendered if d["kind"] == "DaemonSet"]
    assert {ns for _, ns, _ in beside} <= {"", ds["metadata"]["namespace"]}
