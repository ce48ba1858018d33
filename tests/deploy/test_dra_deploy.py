"""deploy/dra and examples/dra: what they render, and what the kit's real
API server (v1.36.3, --authorization-mode=Node,RBAC, powerdev/devtools/cluster/controlplane.py)
makes of them.

Rendered: the component validates, adds what the driver needs (the node's
name, its plugin directory, the plugin registry, the CDI spec dir, the
token) at the paths powerdev's defaults name, and changes nothing else of
the overlay, the security context above all; it composes with deploy/cdi.

Applied: every object is accepted; a SubjectAccessReview shows the service
account may make exactly the calls powerdev/dra/kubeapi.py makes, and
nothing beside them; and, as root with the kit's draharness as the node's
kubelet, `powerdev run` with a token of that service account (bound to a
pod on the node, as the kubelet would mount it) and examples/dra's config
publishes its pool, follows a hotplug, publishes again after a deletion,
prepares the example pod's claim, which the real scheduler allocated
through deploy/dra's DeviceClass, and deletes its pool when it stops,
while the admission policy refuses that token any other node's slices.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import kubernetes_validate
import pytest
import trio
import yaml

from powerdev.cli import build_parser
from powerdev.config import parse_config
from powerdev.devtools.cdicheck import inject
from powerdev.devtools.cluster import client as kubeapi
from powerdev.devtools.cluster.client import Api, ApiError
from powerdev.devtools.cluster.controlplane import ControlPlane
from powerdev.devtools.draharness import DRAHarness
from powerdev.devtools.kit import CDICHECK, DRAHARNESS
from powerdev.devtools.testing import dra_options, is_root, make_nodes, run_command, stop
from powerdev.dra.names import pool_name, slice_name
from tests.conftest import require_tool
from tests.deploy.test_manifests import (
    KUBERNETES_VERSIONS,
    OPENSHIFT_KINDS,
    ROOT,
    kustomize,
)
from tests.docs.markdown import blocks
from tests.dra.test_harness import TAINT, dirs

needs_kubectl = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl is not on this machine"
)

DEFAULTS = build_parser().parse_args(["run"])  # what `powerdev run` uses unless told
DRIVER = DEFAULTS.dra_driver  # dra.powerdev.io
RESOURCE = DEFAULTS.resource_name  # power-dev-plugin/dev
RESOURCE_API = "/apis/resource.k8s.io/v1"
SLICES = f"{RESOURCE_API}/resourceslices"
# The kinds deploy/dra adds to an overlay.
ADDED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "DeviceClass",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
# What powerdev/dra/kubeapi.py calls: list and watch (a field selector on
# spec.driver and spec.nodeName), a server-side apply (PATCH; create too when
# it makes the slice: the API server asks for both), delete by name; and get
# a claim. The ClusterRole must grant exactly these.
DRIVER_CALLS = {
    ("resourceslices", "list"),
    ("resourceslices", "watch"),
    ("resourceslices", "create"),
    ("resourceslices", "patch"),
    ("resourceslices", "delete"),
    ("resourceclaims", "get"),
}
POLICY = "power-device-plugin-dra-own-node"
LIMIT = 60  # seconds: the bound of each test against the API server
PROBE_PACE = 0.05  # seconds between two dry-run probes (the policy's start, see below)


def render(tmp_path: Path, overlay: str, *components: str) -> list[dict]:
    """`overlay` rendered from a copy of deploy/, with `components` added in order."""
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    kustomization = tmp_path / overlay / "kustomization.yaml"
    doc = yaml.safe_load(kustomization.read_text())
    doc["components"] = [
        os.path.relpath(tmp_path / "deploy" / c, tmp_path / overlay) for c in components
    ]
    kustomization.write_text(yaml.safe_dump(doc))
    return kustomize(tmp_path / overlay)


def one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    return doc


def pod_spec(docs: list[dict]) -> dict:
    return one(docs, "DaemonSet")["spec"]["template"]["spec"]


def by_name(items: list[dict], key: str = "name") -> dict[str, dict]:
    return {item[key]: item for item in items}


# --- rendered ------------------------------------------------------------------------


@needs_kubectl
@pytest.mark.parametrize("overlay", ["deploy", "deploy/openshift"])
def test_the_component_adds_what_the_driver_needs_and_nothing_else(tmp_path, overlay):
    docs = render(tmp_path, overlay, "dra")
    for doc in docs:
        if doc["kind"] not in OPENSHIFT_KINDS:
            for version in KUBERNETES_VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)
        # what an uninstall leaves behind can be found
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "powerdev", doc["kind"]
    plain = kustomize(ROOT / overlay)
    changed = ("DaemonSet", "ConfigMap", "SecurityContextConstraints")
    assert {d["kind"] for d in docs} - {d["kind"] for d in plain} == ADDED
    assert [d for d in docs if d["kind"] not in ADDED | set(changed)] == [
        d for d in plain if d["kind"] not in changed
    ]

    spec, before = pod_spec(docs), pod_spec(plain)
    (container,), (container_before,) = spec["containers"], before["containers"]
    # The security posture is the base's, to the letter.
    assert container["securityContext"] == container_before["securityContext"]
    for key in ("securityContext", "hostNetwork", "hostPID", "hostIPC", "serviceAccountName"):
        assert spec[key] == before[key], key
    assert container["ports"] == container_before["ports"]
    assert container["resources"] == container_before["resources"]
    # The token: the base pod has none, this one has its service account's.
    assert (before["automountServiceAccountToken"], spec["automountServiceAccountToken"]) == (
        False,
        True,
    )

    env = by_name(container["env"])
    added_env = {n: e for n, e in env.items() if n not in by_name(container_before["env"])}
    assert added_env == {
        "NODE_NAME": {
            "name": "NODE_NAME",
            "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
        },
        "POWERDEV_CDI_SPEC_DIR": {"name": "POWERDEV_CDI_SPEC_DIR", "value": "/var/run/cdi"},
    }
    assert Path(env["POWERDEV_CDI_SPEC_DIR"]["value"]) == Path(DEFAULTS.cdi_spec_dir)

    volumes = by_name(spec["volumes"])
    mounts = by_name(container["volumeMounts"])
    new = set(volumes) - set(by_name(before["volumes"]))
    assert new == set(mounts) - set(by_name(container_before["volumeMounts"]))
    host = {name: volumes[name]["hostPath"]["path"] for name in new}
    # The driver's own plugin directory (not its neighbours'), the plugin
    # watcher's, and the CDI specs: each at its host path, since the kubelet
    # dials the socket path the driver names, and the runtime reads the spec.
    assert host == {
        "dra-plugin": str(Path(DEFAULTS.dra_plugins_dir) / DRIVER),
        "plugins-registry": str(DEFAULTS.dra_registry_dir),
        "cdi-specs": str(DEFAULTS.cdi_spec_dir),
    }
    for name in new:
        assert mounts[name]["mountPath"] == host[name], name
        assert not mounts[name].get("readOnly", False), name  # sockets, specs, checkpoint
        assert mounts[name].get("mountPropagation", "None") == "None", name
    assert volumes["plugins-registry"]["hostPath"]["type"] == "Directory"  # the kubelet's

    cm = one(docs, "ConfigMap", "power-device-config")
    config = parse_config(cm["data"]["config.json"], source="deploy/dra configmap")
    assert config.warnings == ()
    (resource,) = config.resources
    assert (resource.name, resource.api) == (RESOURCE, "dra")
    assert (resource.device_gid, resource.device_mode) == (6, 0o660)  # the examples' group

    if overlay == "deploy/openshift":
        # the token is a projected volume, which the SCC must allow
        scc = one(docs, "SecurityContextConstraints")
        scc_before = one(plain, "SecurityContextConstraints")
        assert scc["volumes"] == [*scc_before["volumes"], "projected"]
        assert {k: v for k, v in scc.items() if k != "volumes"} == {
            k: v for k, v in scc_before.items() if k != "volumes"
        }


@needs_kubectl
@pytest.mark.parametrize("order", [("cdi", "dra"), ("dra", "cdi")])
def test_with_deploy_cdi_in_either_order_the_cdi_mount_is_there_once(tmp_path, order):
    """Both add the host's /var/run/cdi; strategic merges by name keep one."""
    docs = render(tmp_path, "deploy", *order)
    spec = pod_spec(docs)
    (container,) = spec["containers"]
    assert [v["name"] for v in spec["volumes"]].count("cdi-specs") == 1
    assert [m["mountPath"] for m in container["volumeMounts"]].count("/var/run/cdi") == 1
    assert [e["name"] for e in container["env"]].count("POWERDEV_CDI_SPEC_DIR") == 1
    kubernetes_validate.validate(one(docs, "DaemonSet"), KUBERNETES_VERSIONS[0], strict=True)


def component_docs() -> list[dict]:
    docs = []
    for path in sorted((ROOT / "deploy" / "dra").glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs.extend(yaml.safe_load_all(path.read_text()))
    return docs


def daemonset_identity() -> tuple[str, str]:
    """The namespace and ServiceAccount of the base's DaemonSet."""
    ds = yaml.safe_load((ROOT / "deploy" / "base" / "03-daemonset.yaml").read_text())
    return ds["metadata"]["namespace"], ds["spec"]["template"]["spec"]["serviceAccountName"]


def test_the_cluster_role_grants_exactly_the_calls_the_driver_makes():
    docs = component_docs()
    role = one(docs, "ClusterRole")
    granted = set()
    for rule in role["rules"]:
        assert rule["apiGroups"] == ["resource.k8s.io"]
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule
        granted |= {(r, v) for r in rule["resources"] for v in rule["verbs"]}
    assert granted == DRIVER_CALLS
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    namespace, account = daemonset_identity()
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": namespace}
    ]


def test_the_class_and_the_policy_name_the_default_driver_resource_and_account():
    docs = component_docs()
    spec = one(docs, "DeviceClass")["spec"]
    (selector,) = spec["selectors"]
    assert selector["cel"]["expression"] == (
        f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].resource == "{RESOURCE}"'
    )
    # Unchanged pods: the extended resource the device plugin registers
    # (powerdev's default resource name) is served by this class through DRA.
    assert spec["extendedResourceName"] == RESOURCE
    policy = one(docs, "ValidatingAdmissionPolicy")
    namespace, account = daemonset_identity()
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == (
        f'request.userInfo.username == "system:serviceaccount:{namespace}:{account}"'
    )
    assert any(f'== "{DRIVER}"' in v["expression"] for v in policy["spec"]["validations"])
    binding = one(docs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }


EXAMPLES = ROOT / "examples" / "dra"


def test_the_example_claims_the_components_class_with_the_example_config():
    docs = [d for p in sorted(EXAMPLES.glob("0*.yaml")) for d in yaml.safe_load_all(p.read_text())]
    template = one(docs, "ResourceClaimTemplate")
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert (
        request["exactly"]["deviceClassName"]
        == one(component_docs(), "DeviceClass")["metadata"]["name"]
    )
    pod = one(docs, "Pod")["spec"]
    (claim,) = pod["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == template["metadata"]["name"]
    (container,) = pod["containers"]
    assert container["resources"]["claims"] == [{"name": claim["name"]}]
    assert pod["securityContext"]["supplementalGroups"] == [6]
    config = parse_config((EXAMPLES / "config-dra.json").read_text(), source="config-dra.json")
    assert config.warnings == ()
    (resource,) = config.resources
    assert (resource.name, resource.api, resource.device_gid) == (RESOURCE, "dra", 6)
    # the "both" form is the same but for the api
    dra = json.loads((EXAMPLES / "config-dra.json").read_text())
    both = json.loads((EXAMPLES / "config-both.json").read_text())
    assert both["resources"][0].pop("api") == "both"
    assert both["resources"][0].pop("cdi") is True  # the device plugin side's uid, gid, mode
    assert dra["resources"][0].pop("api") == "dra"
    assert both == dra


def test_the_both_example_is_a_valid_config():
    config = parse_config((EXAMPLES / "config-both.json").read_text(), source="config-both.json")
    assert config.warnings == ()
    assert config.resources[0].api == "both"


DRA_PAGE = ROOT / "docs" / "dra.md"


def page_manifests() -> list[dict]:
    """The manifests of docs/dra.md (blocks marked "not run: a manifest")."""
    return [
        doc
        for b in blocks(DRA_PAGE)
        if b.kind == "not run" and b.value.startswith("a manifest")
        for doc in yaml.safe_load_all(b.text)
    ]


def test_each_class_serves_the_extended_resource_of_the_devices_it_selects():
    """deploy/dra's class and docs/dra.md's: a pod that asks for the
    resource under resources.limits gets devices of that resource."""
    classes = [d for d in [*component_docs(), *page_manifests()] if d["kind"] == "DeviceClass"]
    assert len(classes) == 2
    for doc in classes:
        (selector,) = doc["spec"]["selectors"]
        (selected,) = re.findall(r'\.resource == "([^"]+)"', selector["cel"]["expression"])
        assert doc["spec"]["extendedResourceName"] == selected, doc["metadata"]["name"]


def test_the_pages_migration_snippet_is_the_components_config_but_both():
    """docs/dra.md's "both" step: the shipped DRA config, "api" and "cdi" aside."""
    (snippet,) = [
        yaml.safe_load(b.text)
        for b in blocks(DRA_PAGE)
        if b.kind == "render" and "patches" in (yaml.safe_load(b.text) or {})
    ]
    assert snippet["components"] == ["dra"]
    (patch,) = snippet["patches"]
    (op,) = yaml.safe_load(patch["patch"])
    both = json.loads(op["value"])
    component = yaml.safe_load((ROOT / "deploy" / "dra" / "kustomization.yaml").read_text())
    (shipped,) = [
        json.loads(yaml.safe_load(p["patch"])["data"]["config.json"])
        for p in component["patches"]
        if p["target"]["kind"] == "ConfigMap"
    ]
    assert parse_config(json.dumps(both), source="docs/dra.md").resources[0].both
    assert (both.pop("api"), shipped.pop("api")) == ("both", "dra")
    assert both.pop("cdi") is True  # the device plugin side's gid and mode
    assert both == shipped


# --- against the kit's API server ---------------------------------------------------


def kubectl(plane: ControlPlane, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        plane.kubectl(*args), input=stdin, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def applied(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[dict]]:
    """deploy/ with deploy/dra, rendered and applied with the kit's kubectl,
    as an admin would. The namespaced objects stay (tests/e2e applies the
    same namespace and ServiceAccount; no kubelet runs the DaemonSet), the
    cluster-wide ones this component adds go afterwards."""
    tmp = tmp_path_factory.mktemp("dra-deploy")
    docs = render(tmp, "deploy", "dra")
    kubectl(control_plane, "apply", "-f", "-", stdin=yaml.safe_dump_all(docs))
    yield docs
    added = [d for d in docs if d["kind"] in ADDED]
    kubectl(
        control_plane,
        "delete",
        "--ignore-not-found",
        "--wait=false",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(added),
    )


def path_of(doc: dict, namespace: str | None = None) -> str:
    """The API path of a rendered object."""
    group_version = doc["apiVersion"]
    prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    kind = doc["kind"].lower()
    plural = kind[:-1] + "ies" if kind.endswith("y") else kind + ("es" if kind[-1] == "s" else "s")
    namespace = namespace or doc["metadata"].get("namespace")
    scope = f"/namespaces/{namespace}" if namespace and doc["kind"] != "Namespace" else ""
    return f"{prefix}{scope}/{plural}/{doc['metadata']['name']}"


async def test_the_api_server_accepts_every_object_as_rendered(api, applied):
    with trio.fail_after(LIMIT):
        for doc in applied:
            stored = await api.get(path_of(doc))
            labels = stored["metadata"]["labels"]
            assert doc["metadata"]["labels"].items() <= labels.items(), doc["kind"]
            if doc["kind"] == "ClusterRole":
                assert stored["rules"] == doc["rules"]
            if doc["kind"] == "DeviceClass":
                assert stored["spec"]["selectors"] == doc["spec"]["selectors"]
                # kept: an API server without the DRAExtendedResource gate drops it
                assert stored["spec"].get("extendedResourceName") == RESOURCE
            if doc["kind"] == "ValidatingAdmissionPolicy":
                # its CEL compiled: no type-checking warnings
                assert (
                    not stored.get("status", {}).get("typeChecking", {}).get("expressionWarnings")
                )


async def test_the_example_template_makes_the_pods_claim_of_the_class(api, control_plane, applied):
    """examples/dra as rendered: the controller manager makes the pod's claim
    from the template, naming deploy/dra's class. (No node has the devices:
    the pod stays pending; the next test schedules one.)"""
    docs = kustomize(EXAMPLES)
    namespace = one(docs, "Namespace")["metadata"]["name"]
    pods = f"/api/v1/namespaces/{namespace}/pods"
    kubectl(control_plane, "apply", "-f", "-", stdin=yaml.safe_dump_all(docs))
    try:
        with trio.fail_after(LIMIT):
            name = one(docs, "Pod")["metadata"]["name"]
            pod = await api.wait_for(pods, name, lambda p: p["status"].get("resourceClaimStatuses"))
            (status,) = pod["status"]["resourceClaimStatuses"]
            claim = await api.get(
                f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{status['resourceClaimName']}"
            )
            (request,) = claim["spec"]["devices"]["requests"]
            assert (
                request["exactly"]["deviceClassName"]
                == one(applied, "DeviceClass")["metadata"]["name"]
            )
    finally:
        kubectl(control_plane, "delete", "namespace", namespace, "--wait=false")


async def test_the_pages_manifests_are_accepted(api, applied):
    """docs/dra.md's DeviceClass, templates and pod, as the API server
    would store them (dry run: nothing is kept), their CEL compiled."""
    manifests = page_manifests()
    assert sorted(d["kind"] for d in manifests) == [
        "DeviceClass",
        "Pod",
        "Pod",
        "ResourceClaimTemplate",
        "ResourceClaimTemplate",
    ]
    namespace = f"dra-page-{secrets.token_hex(3)}"
    with trio.fail_after(LIMIT):
        await api.create_namespace(namespace)
        try:
            for doc in manifests:
                where = None if doc["kind"] == "DeviceClass" else namespace
                stored = await api.create(path_of(doc, where).rsplit("/", 1)[0], doc, dryRun="All")
                assert (stored["kind"], stored["metadata"]["name"]) == (
                    doc["kind"],
                    doc["metadata"]["name"],
                )
        finally:
            await api.delete(f"/api/v1/namespaces/{namespace}")


def review(
    user: str,
    verb: str,
    resource: str,
    namespace: str = "",
    group: str = "resource.k8s.io",
    subresource: str = "",
) -> dict:
    namespace_of_account = user.split(":")[2]
    attributes = {"group": group, "resource": resource, "verb": verb}
    if namespace:
        attributes["namespace"] = namespace
    if subresource:
        attributes["subresource"] = subresource
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            # as the API server authenticates a service account's token
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{namespace_of_account}",
                "system:authenticated",
            ],
            "resourceAttributes": attributes,
        },
    }


# (verb, resource, namespace, group, subresource): none of these is a call of the driver.
NOT_ALLOWED = [
    ("get", "resourceslices", "", "resource.k8s.io", ""),
    ("update", "resourceslices", "", "resource.k8s.io", ""),
    ("deletecollection", "resourceslices", "", "resource.k8s.io", ""),
    ("list", "resourceclaims", "team-a", "resource.k8s.io", ""),
    ("watch", "resourceclaims", "team-a", "resource.k8s.io", ""),
    ("create", "resourceclaims", "team-a", "resource.k8s.io", ""),
    ("update", "resourceclaims", "team-a", "resource.k8s.io", ""),
    ("patch", "resourceclaims", "team-a", "resource.k8s.io", ""),
    ("delete", "resourceclaims", "team-a", "resource.k8s.io", ""),
    ("update", "resourceclaims", "team-a", "resource.k8s.io", "status"),
    ("get", "resourceclaimtemplates", "team-a", "resource.k8s.io", ""),
    ("create", "deviceclasses", "", "resource.k8s.io", ""),
    ("update", "deviceclasses", "", "resource.k8s.io", ""),
    ("delete", "deviceclasses", "", "resource.k8s.io", ""),
    ("get", "secrets", "power-device-plugin", "", ""),
    ("list", "secrets", "power-device-plugin", "", ""),
    ("get", "secrets", "kube-system", "", ""),
    ("get", "configmaps", "power-device-plugin", "", ""),
    ("list", "pods", "team-a", "", ""),
    ("get", "nodes", "", "", ""),
    ("patch", "nodes", "", "", "status"),
    ("create", "serviceaccounts", "power-device-plugin", "", "token"),
    ("create", "validatingadmissionpolicies", "", "admissionregistration.k8s.io", ""),
    ("delete", "validatingadmissionpolicybindings", "", "admissionregistration.k8s.io", ""),
    ("escalate", "clusterroles", "", "rbac.authorization.k8s.io", ""),
]


async def test_the_service_account_may_make_the_drivers_calls_and_no_other(api, applied):
    namespace, account = daemonset_identity()
    user = f"system:serviceaccount:{namespace}:{account}"
    reviews = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
    wrong = []
    with trio.fail_after(LIMIT):
        for resource, verb in sorted(DRIVER_CALLS):
            # claims live in the workloads' namespaces, any of them
            where = "team-a" if resource == "resourceclaims" else ""
            answer = await api.create(reviews, review(user, verb, resource, where))
            if not answer["status"]["allowed"]:
                wrong.append(f"refused: {verb} {resource} {where}")
        for verb, resource, where, group, sub in NOT_ALLOWED:
            answer = await api.create(reviews, review(user, verb, resource, where, group, sub))
            if answer["status"]["allowed"]:
                wrong.append(f"allowed: {verb} {resource}/{sub} {where} ({group})")
    assert not wrong, wrong


# --- powerdev under exactly that role ---------------------------------------------


@contextlib.asynccontextmanager
async def as_token(plane: ControlPlane, token: str) -> AsyncIterator[Api]:
    """An API client that authenticates with a bearer token, as a pod does."""
    context = ssl.create_default_context(cafile=str(plane.pki.ca))
    headers = {"authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(
        base_url=plane.server, verify=context, timeout=30, headers=headers
    ) as http:
        yield Api(http)


def token_kubeconfig(path: Path, plane: ControlPlane, token: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "kit",
                "cluster": {"server": plane.server, "certificate-authority": str(plane.pki.ca)},
            }
        ],
        "users": [{"name": "powerdev", "user": {"token": token}}],
        "contexts": [{"name": "powerdev", "context": {"cluster": "kit", "user": "powerdev"}}],
        "current-context": "powerdev",
    }
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


async def pod_token(api: Api, node: str) -> str:
    """A token of powerdev's service account bound to a pod on `node`: what
    the kubelet mounts into the DaemonSet's pod there (the API server puts
    the node's name in it)."""
    namespace, account = daemonset_identity()
    pod = await api.create_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"powerdev-{node}"},
            "spec": {
                "nodeName": node,
                "serviceAccountName": account,
                "automountServiceAccountToken": False,
                "containers": [{"name": "plugin", "image": "registry.k8s.io/pause:3.10"}],
            },
        },
    )
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "expirationSeconds": 3600,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"],
            },
        },
    }
    answer = await api.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", request
    )
    return answer["status"]["token"]


def slice_body(name: str, node: str, driver: str = DRIVER) -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": f"{node}/probe", "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }


async def server_side_apply(api: Api, path: str, body: dict, **params: str) -> dict:
    """What powerdev's lightkube client sends for an object (`path`: its
    collection's)."""
    return await api.request(
        "PATCH",
        f"{path}/{body['metadata']['name']}",
        body,
        params={"fieldManager": "powerdev", "force": "true", **params},
        content_type="application/apply-patch+yaml",
    )


async def refused(call, expected: str) -> str:
    """The error of a call that must fail, which must say `expected`."""
    try:
        await call
    except ApiError as err:
        assert expected in str(err), str(err)
        return str(err)
    raise AssertionError(f"allowed; expected a refusal that says {expected!r}")


async def until_refused(call, policy: str) -> None:
    """The API server loads an admission policy some time after it is
    stored, and says nowhere when: repeat a dry run (nothing is stored) of
    what `policy` refuses, paced, until it is refused by it. The caller
    bounds the wait."""
    while True:
        try:
            await call()
        except ApiError as err:
            if policy in str(err):
                return
            raise
        await trio.sleep(PROBE_PACE)


@contextlib.asynccontextmanager
async def powerdev_process(command: list[str], log: Path) -> AsyncIterator[trio.Process]:
    """`powerdev run`; SIGTERM on the way out, and its log on a failure."""
    with log.open("wb") as out:
        proc = await trio.lowlevel.open_process(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    except BaseException:
        print(f"powerdev's log:\n{log.read_text()}")  # noqa: ASYNC240 (a small local file)
        raise
    finally:
        await stop(proc)


def selecting() -> dict:
    """A claim for one device of deploy/dra's class, narrowed by CEL over
    the published attributes (none of the test's devices has a wwid)."""
    attributes = f'device.attributes["{DRIVER}"]'
    expression = (
        f'{attributes}.kind == "char" && !("wwid" in {attributes}) && '
        f'{attributes}.path.startsWith("/dev/dm-") && {attributes}.major > 0'
    )
    request = {
        "name": "dev",
        "exactly": {
            "deviceClassName": "power-dev-plugin-dev",
            "count": 1,
            "selectors": [{"cel": {"expression": expression}}],
        },
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "selecting"},
        "spec": {"devices": {"requests": [request]}},
    }


def example_for(node: str) -> list[dict]:
    """examples/dra's check script, template and pod as rendered, in the
    node's namespace, the pod kept to the node (a nodeSelector and the
    node's taint tolerated)."""
    docs = [d for d in kustomize(EXAMPLES) if d["kind"] != "Namespace"]
    for doc in docs:
        doc["metadata"]["namespace"] = node
    pod = one(docs, "Pod")["spec"]
    pod["nodeSelector"] = {"kubernetes.io/hostname": node}
    pod["tolerations"] = [
        {"key": TAINT, "operator": "Equal", "value": node, "effect": "NoSchedule"}
    ]
    return docs


@pytest.mark.skipif(not is_root(), reason="needs root: distinct device nodes (mknod)")
async def test_powerdev_publishes_and_prepares_under_exactly_that_role(
    api, control_plane, applied, tmp_path
):
    draharness = require_tool(DRAHARNESS)
    cdicheck = require_tool(CDICHECK)
    node = f"dra-rbac-{secrets.token_hex(3)}"
    first = slice_name(node, DRIVER, RESOURCE, 0)
    mine = {"fieldSelector": f"spec.driver={DRIVER},spec.nodeName={node}"}
    dev = tmp_path / "dev"
    make_nodes(dev, ["dm-0", "dm-1"])  # examples/dra/config-dra.json takes /dev/dm-*
    registry, plugins, state = dirs(tmp_path)
    cdi = tmp_path / "cdi"
    with trio.fail_after(2 * LIMIT):  # a node's whole life: the harness, powerdev, a pod
        await api.create_node(node, taints=[{"key": TAINT, "value": node, "effect": "NoSchedule"}])
        await api.create_namespace(node)
        token = await pod_token(api, node)
        kubeconfig = token_kubeconfig(tmp_path / "token.kubeconfig", control_plane, token)
        command = run_command(
            tmp_path / "device-plugins",
            EXAMPLES / "config-dra.json",
            dev,
            *("--uevents", "off", "--status-file", str(tmp_path / "status.json")),
            *dra_options(tmp_path, node, kubeconfig),
        )  # the driver is the default, dra.powerdev.io, as deploy/dra names it
        async with (
            DRAHarness.running(
                draharness,
                tmp_path / "draharness.log",
                node_name=node,
                kubeconfig=control_plane.kubeconfig,
            ) as harness,
            as_token(control_plane, token) as as_powerdev,
        ):
            await harness.start(registry, plugins, state)
            await harness.wait_wipe(1)  # a starting kubelet deletes its node's slices
            async with powerdev_process(command, tmp_path / "powerdev.log") as proc:
                await harness.wait_driver(DRIVER)
                # Published with create and patch (a server-side apply).
                published = await api.wait_for(SLICES, first)
                assert published["spec"]["pool"]["name"] == pool_name(node, RESOURCE)
                assert len(published["spec"]["devices"]) == 2
                managers = {m["manager"] for m in published["metadata"]["managedFields"]}
                assert managers == {"powerdev"}
                # A hotplug: the same slice patched (its one slice, so the pool
                # keeps its generation, or a later one if the pool was
                # written anew meanwhile: the kubelet's registration).
                make_nodes(dev, ["dm-2"])
                patched = await api.wait_for(
                    SLICES, first, lambda s: len(s["spec"]["devices"]) == 3
                )
                assert patched["metadata"]["uid"] == published["metadata"]["uid"]
                assert patched["metadata"]["generation"] > published["metadata"]["generation"]
                assert (
                    patched["spec"]["pool"]["generation"] >= published["spec"]["pool"]["generation"]
                )
                # Deleted by someone else: seen through its watch, published again.
                await api.delete(f"{SLICES}/{first}")
                again = await api.wait_for(
                    SLICES, first, lambda s: s["metadata"]["uid"] != patched["metadata"]["uid"]
                )
                assert len(again["spec"]["devices"]) == 3

                # examples/dra's pod: the scheduler allocates its claim through
                # deploy/dra's DeviceClass; the kubelet (the harness) asks
                # powerdev to prepare it, which reads the claim with the token.
                for doc in example_for(node):
                    await api.create(path_of(doc).rsplit("/", 1)[0], doc)
                pod_name = one(example_for(node), "Pod")["metadata"]["name"]
                pods = f"/api/v1/namespaces/{node}/pods"
                pod = await api.wait_for(
                    pods, pod_name, lambda p: p["spec"].get("nodeName") == node
                )
                pod = await api.wait_for(
                    pods, pod_name, lambda p: p["status"].get("resourceClaimStatuses")
                )
                (status,) = pod["status"]["resourceClaimStatuses"]
                claim_path = (
                    f"{RESOURCE_API}/namespaces/{node}/resourceclaims/{status['resourceClaimName']}"
                )
                claim = await api.get(claim_path)
                (result,) = claim["status"]["allocation"]["devices"]["results"]
                assert (result["driver"], result["pool"]) == (DRIVER, pool_name(node, RESOURCE))
                prepared = await harness.prepare(node, pod_name)
                uid = claim["metadata"]["uid"]
                assert prepared == {"sample": [f"{DRIVER}/claim={uid}-{result['device']}"]}
                resolved = inject(cdicheck, [cdi], prepared["sample"])
                assert resolved["ok"], resolved
                (device,) = resolved["linuxDevices"]
                assert device["path"].startswith("/dev/dm-")
                assert (device["gid"], device["fileMode"]) == (6, 0o660)

                # A claim that selects on the attributes as docs/dra.md shows,
                # guarded with `in`: the real scheduler evaluates it.
                await api.create(f"{RESOURCE_API}/namespaces/{node}/resourceclaims", selecting())
                await api.create_pod(
                    node,
                    kubeapi.pod(
                        "selecting",
                        kubeapi.container("c0", {"claims": [{"name": "dev"}]}),
                        resourceClaims=[{"name": "dev", "resourceClaimName": "selecting"}],
                        nodeSelector={"kubernetes.io/hostname": node},
                        tolerations=[{"key": TAINT, "operator": "Equal", "value": node}],
                    ),
                )
                selected = await api.wait_for(
                    f"{RESOURCE_API}/namespaces/{node}/resourceclaims",
                    "selecting",
                    lambda c: c.get("status", {}).get("allocation"),
                )
                (chosen,) = selected["status"]["allocation"]["devices"]["results"]
                assert chosen["pool"] == pool_name(node, RESOURCE)
                assert chosen["device"] != result["device"]  # one device, one claim

                # What the token may not do.
                elsewhere = f"{node}-elsewhere"
                probe = slice_body(f"probe-{secrets.token_hex(3)}", elsewhere)
                await until_refused(
                    lambda: server_side_apply(as_powerdev, SLICES, probe, dryRun="All"), POLICY
                )
                await refused(
                    server_side_apply(as_powerdev, SLICES, slice_body(f"{node}-x", elsewhere)),
                    f"may only write its own node's ResourceSlices, not those of {elsewhere}",
                )
                await refused(
                    server_side_apply(
                        as_powerdev, SLICES, slice_body(f"{node}-y", node, "gpu.example.com")
                    ),
                    "may only write ResourceSlices of the driver dra.powerdev.io",
                )
                theirs = slice_body(f"{node}-theirs", elsewhere)
                await api.create(SLICES, theirs)
                await refused(
                    as_powerdev.delete(f"{SLICES}/{node}-theirs"),
                    f"not those of {elsewhere}",
                )
                await api.delete(f"{SLICES}/{node}-theirs")
                await refused(as_powerdev.get(f"{SLICES}/{first}"), "403")  # no get: never used
                await refused(as_powerdev.delete(claim_path), "403")
                await refused(
                    as_powerdev.get("/api/v1/namespaces/power-device-plugin/secrets"), "403"
                )

                await api.merge_patch(
                    f"{pods}/{pod_name}/status", {"status": {"phase": "Succeeded"}}
                )
                await harness.unprepare(node, pod_name)
                assert not inject(cdicheck, [cdi], prepared["sample"])["ok"]
            # Stopped: its pool deleted, with the token, before it exited.
            assert proc.returncode == 0, (tmp_path / "powerdev.log").read_text()
            assert (await api.get(SLICES, **mine))["items"] == []
        namespace, _ = daemonset_identity()
        await api.delete(f"/api/v1/namespaces/{namespace}/pods/powerdev-{node}")
        await api.delete(f"/api/v1/namespaces/{node}")
