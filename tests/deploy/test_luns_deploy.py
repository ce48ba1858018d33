"""deploy/luns: what it renders, and what the kit's real API server (v1.36.3,
--authorization-mode=Node,RBAC) makes of it.

Rendered: `powerdev luns` as a Deployment of the DaemonSet's image, on
Kubernetes and (with the overlay's patch) under OpenShift's restricted-v2;
the roles grant exactly the calls powerdev/dra/lun_api.py makes.

Applied with deploy/ and deploy/dra: every object is accepted; a
SubjectAccessReview shows each service account may make its calls and no
other; the admission policies keep a node's token to its own node's LUN
reports (no other node's, no other ConfigMap) and `powerdev luns` to the
cluster pools; and under exactly those tokens a node's report, written as
powerdev writes it, is published by a real `powerdev luns` as one device
whose node selection names that node."""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

import pytest
import trio
import yaml

from powerdev.devtools.cluster.client import Api
from powerdev.dra.luns import (
    HOSTNAME_LABEL,
    Sighting,
    cluster_pool_name,
    cluster_slice_name,
    report_body,
)
from tests.deploy.test_components import render as render_components
from tests.deploy.test_dra_deploy import (
    ADDED,
    DRIVER,
    LIMIT,
    SLICES,
    as_token,
    daemonset_identity,
    kubectl,
    needs_kubectl,
    one,
    path_of,
    pod_token,
    powerdev_process,
    refused,
    render,
    review,
    server_side_apply,
    token_kubeconfig,
    until_refused,
)
from tests.deploy.test_manifests import KUBERNETES_VERSIONS, ROOT
from tests.deploy.test_restricted_v2 import refusals

LUNS = "power-device-luns"  # its Deployment and ServiceAccount
NAMESPACE = "power-device-plugin"
REPORTS_POLICY = "power-device-plugin-lun-reports"
REPORTS = f"/api/v1/namespaces/{NAMESPACE}/configmaps"  # where the nodes report
POOLS_POLICY = "power-device-luns-cluster-pools"
RESOURCE = "power-dev-plugin/lun"
# What powerdev/dra/lun_api.py calls for `powerdev luns`: (resource, verb, namespaced).
CONTROLLER_CALLS = {
    ("configmaps", "list", True),
    ("configmaps", "watch", True),
    ("leases", "get", True),
    ("leases", "create", True),
    ("leases", "update", True),
    ("resourceslices", "list", False),
    ("resourceslices", "create", False),
    ("resourceslices", "patch", False),
    ("resourceslices", "delete", False),
    ("nodes", "list", False),
    ("nodes", "watch", False),
}
# And for a node's powerdev, its reports: a server-side apply, a delete.
NODE_CALLS = {("configmaps", "create"), ("configmaps", "patch"), ("configmaps", "delete")}
GROUPS = {
    "configmaps": "",
    "nodes": "",
    "leases": "coordination.k8s.io",
    "resourceslices": "resource.k8s.io",
}


def component_docs() -> list[dict]:
    docs = []
    for path in sorted((ROOT / "deploy" / "luns").glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs.extend(yaml.safe_load_all(path.read_text()))
    return docs


def granted(role: dict) -> set[tuple[str, str]]:
    found = set()
    for rule in role["rules"]:
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule
        for resource in rule["resources"]:
            assert rule["apiGroups"] == [GROUPS[resource]]
            found |= {(resource, verb) for verb in rule["verbs"]}
    return found


def test_the_roles_grant_exactly_the_calls_powerdev_makes():
    docs = component_docs()
    namespaced = granted(one(docs, "Role", LUNS))
    cluster = granted(one(docs, "ClusterRole", LUNS))
    assert namespaced == {(r, v) for r, v, inside in CONTROLLER_CALLS if inside}
    assert cluster == {(r, v) for r, v, inside in CONTROLLER_CALLS if not inside}
    assert granted(one(docs, "Role", "power-device-plugin-lun-reports")) == NODE_CALLS
    for name in (LUNS, "power-device-plugin-lun-reports"):
        binding = one(docs, "RoleBinding", name)
        assert binding["roleRef"]["name"] == name
    namespace, account = daemonset_identity()
    assert one(docs, "RoleBinding", "power-device-plugin-lun-reports")["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": namespace}
    ]


@needs_kubectl
@pytest.mark.parametrize("overlay", ["deploy", "deploy/openshift"])
def test_the_deployment_runs_the_daemonsets_image_restricted(tmp_path, overlay):
    docs = list(render_components(tmp_path, overlay, ["dra", "luns"]).values())
    daemonset = one(docs, "DaemonSet")
    deployment = one(docs, "Deployment", LUNS)
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["image"] == daemonset["spec"]["template"]["spec"]["containers"][0]["image"]
    assert container["command"] == ["powerdev", "luns"]
    assert spec["serviceAccountName"] == LUNS and spec["automountServiceAccountToken"] is True
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env == {"POWERDEV_LUN_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"}
    assert deployment["metadata"]["namespace"] == daemonset["metadata"]["namespace"]
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)
    if overlay == "deploy/openshift":
        assert refusals(spec) == []
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["openshift.io/required-scc"] == "restricted-v2"
    else:
        assert refusals(spec) == ["pod runAsUser 65534"]  # pinned, as the webhook's


# --- applied ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def applied(control_plane, tmp_path_factory):
    """deploy/ with deploy/dra and deploy/luns, applied with the kit's
    kubectl; the cluster-wide objects the two add go afterwards (the
    DeviceClass too: other tests make the shipped one)."""
    tmp = tmp_path_factory.mktemp("luns-deploy")
    docs = render(tmp, "deploy", "dra", "luns")
    kubectl(control_plane, "apply", "-f", "-", stdin=yaml.safe_dump_all(docs))
    yield docs
    added = [d for d in docs if d["kind"] in ADDED]  # deploy/dra's, and this one's
    kubectl(
        control_plane,
        "delete",
        "--ignore-not-found",
        "--wait=false",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(added),
    )


async def test_the_api_server_accepts_what_the_component_adds(api, applied):
    with trio.fail_after(LIMIT):
        for doc in applied:
            stored = await api.get(path_of(doc))
            if doc["kind"] == "ValidatingAdmissionPolicy":
                warnings = stored.get("status", {}).get("typeChecking", {})
                assert not warnings.get("expressionWarnings"), doc["metadata"]["name"]


async def test_each_account_may_make_its_calls_and_no_other(api, applied):
    reviews = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
    controller = f"system:serviceaccount:{NAMESPACE}:{LUNS}"
    namespace, account = daemonset_identity()
    node = f"system:serviceaccount:{namespace}:{account}"
    wrong = []

    async def ask(user: str, verb: str, resource: str, where: str, want: bool) -> None:
        asked = review(user, verb, resource, where, GROUPS[resource])
        answer = await api.create(reviews, asked)
        if answer["status"]["allowed"] != want:
            wrong.append(f"{user}: {verb} {resource} {where}: allowed {not want}")

    with trio.fail_after(LIMIT):
        for resource, verb, inside in sorted(CONTROLLER_CALLS):
            await ask(controller, verb, resource, NAMESPACE if inside else "", True)
        for verb, resource, where in [
            ("create", "configmaps", NAMESPACE),
            ("patch", "configmaps", NAMESPACE),
            ("delete", "configmaps", NAMESPACE),
            ("list", "configmaps", "kube-system"),
            ("delete", "leases", NAMESPACE),
            ("get", "leases", "kube-system"),
            ("update", "resourceslices", ""),
            ("get", "nodes", ""),
            ("patch", "nodes", ""),
        ]:
            await ask(controller, verb, resource, where, False)
        for resource, verb in sorted(NODE_CALLS):
            await ask(node, verb, resource, namespace, True)
        for verb, resource, where in [
            ("create", "configmaps", "kube-system"),
            ("get", "leases", namespace),
            ("get", "nodes", ""),
        ]:
            await ask(node, verb, resource, where, False)
    assert not wrong, wrong


def report_for(node: str, luns: list[Sighting]) -> dict:
    return report_body(NAMESPACE, node, DRIVER, RESOURCE, luns, heartbeat=1)


async def apply_report(token_api: Api, body: dict, **params: str) -> dict:
    return await server_side_apply(token_api, REPORTS, body, **params)


async def service_account_token(api: Api, account: str) -> str:
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
    path = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{account}/token"
    return (await api.create(path, request))["status"]["token"]


LUN = Sighting("wwid-3600a0b8", "WWID=3600a0b80000", paths=2, size=1 << 30, vendor="IBM")


async def test_a_node_writes_only_its_own_reports_and_luns_only_cluster_pools(
    api, control_plane, applied
):
    node, other = f"luns-{secrets.token_hex(3)}", f"luns-{secrets.token_hex(3)}"
    with trio.fail_after(LIMIT):
        await api.create_node(node)
        token = await pod_token(api, node)
        luns_token = await service_account_token(api, LUNS)
        async with (
            as_token(control_plane, token) as as_node,
            as_token(control_plane, luns_token) as as_luns,
        ):
            elsewhere = report_for(other, [LUN])
            await until_refused(
                lambda: apply_report(as_node, elsewhere, dryRun="All"), REPORTS_POLICY
            )
            await apply_report(as_node, report_for(node, [LUN]), dryRun="All")  # its own
            config = f"/api/v1/namespaces/{NAMESPACE}/configmaps/power-device-config"
            await refused(
                as_node.request(
                    "PATCH",
                    config,
                    {"data": {"node": node}},
                    params={"dryRun": "All"},
                    content_type="application/merge-patch+json",
                ),
                REPORTS_POLICY,
            )
            await refused(
                as_node.request("DELETE", config, params={"dryRun": "All"}), REPORTS_POLICY
            )

            node_pool = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"probe-{secrets.token_hex(3)}"},
                "spec": {
                    "driver": DRIVER,
                    "nodeName": node,
                    "pool": {"name": f"{node}/probe", "generation": 1, "resourceSliceCount": 1},
                    "devices": [],
                },
            }

            async def write_node_pool() -> dict:
                return await as_luns.create(SLICES, node_pool, dryRun="All")

            await until_refused(write_node_pool, POOLS_POLICY)
            cluster = {
                **node_pool,
                "spec": {
                    "driver": DRIVER,
                    "allNodes": True,
                    "pool": {
                        "name": cluster_pool_name(RESOURCE),
                        "generation": 1,
                        "resourceSliceCount": 1,
                    },
                    "devices": [],
                },
            }
            await as_luns.create(SLICES, cluster, dryRun="All")


async def test_under_the_shipped_roles_a_nodes_report_becomes_one_cluster_device(
    api, control_plane, applied, tmp_path: Path
):
    """A node's report, written with that node's token as powerdev writes
    it, and `powerdev luns` (a real process) with its own account's token:
    the cluster pool has the LUN, selecting that node by its hostname label."""
    node = f"luns-{secrets.token_hex(3)}"
    with trio.fail_after(LIMIT):
        await api.create_node(node)
        await api.merge_patch(
            f"/api/v1/nodes/{node}", {"metadata": {"labels": {HOSTNAME_LABEL: node}}}
        )
        token = await pod_token(api, node)
        luns_token = await service_account_token(api, LUNS)
        async with as_token(control_plane, token) as as_node:
            body = report_for(node, [LUN])
            await until_refused(  # the policy in force: a report of another node is refused
                lambda: apply_report(as_node, report_for(f"{node}-x", [LUN]), dryRun="All"),
                REPORTS_POLICY,
            )
            await apply_report(as_node, body)
        kubeconfig = token_kubeconfig(tmp_path / "luns.kubeconfig", control_plane, luns_token)
        command = [
            *(sys.executable, "-m", "powerdev", "luns"),
            *("--kubeconfig", str(kubeconfig), "--lease-name", f"lease-{node}"),
        ]
        report = f"/api/v1/namespaces/{NAMESPACE}/configmaps/{body['metadata']['name']}"
        try:
            async with powerdev_process(command, tmp_path / "luns.log"):
                published = await api.wait_for(
                    SLICES,
                    cluster_slice_name(DRIVER, RESOURCE, 0),
                    lambda s: bool(s["spec"].get("devices")),
                )
            (device,) = published["spec"]["devices"]
            assert device["name"] == LUN.device
            assert published["spec"]["perDeviceNodeSelection"] is True
            (term,) = device["nodeSelector"]["nodeSelectorTerms"]
            assert term["matchExpressions"] == [
                {"key": HOSTNAME_LABEL, "operator": "In", "values": [node]}
            ]
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await api.delete(report)
