"""deploy/webhook and its OpenShift variant: what the kustomize builds hold,
schema-valid where a schema exists (the Kubernetes kinds, after kustomize);
cert-manager's kinds, which have no schema here, parsed strictly against the
fields this overlay uses; and the wiring between the pieces (names, ports,
Secret, CA injection, the command line) that a schema cannot see."""

import os
import shutil
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from powerdev.cli import build_parser
from powerdev.devtools import kit
from powerdev.webhook.config import WebhookConfig, parse_webhook_config
from tests.conftest import require_tool
from tests.deploy.test_manifests import kustomize
from tests.deploy.test_release import kustomize as release_kustomize

ROOT = Path(__file__).resolve().parents[2]
VERSION = "1.35.0"
NAMESPACE = "power-device-plugin"
SECRET = "power-dev-webhook-tls"
needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl")


def files(*parts: str) -> list[dict]:
    docs = []
    for path in sorted((ROOT / "deploy" / "webhook").glob("**/*.yaml")):
        if path.name != "kustomization.yaml":
            docs.extend(yaml.safe_load_all(path.read_text()))
    return [d for d in docs if not parts or d["kind"] in parts]


def built(directory: str) -> list[dict]:
    return kustomize(ROOT / directory)


def one(docs: list[dict], kind: str, name: str = "power-dev-webhook") -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


# --- cert-manager: strict parsing of what we use ----------------------------------------

CERTIFICATE_SPEC = {
    "secretName": str,
    "issuerRef": dict,
    "commonName": str,
    "dnsNames": list,
    "duration": str,
    "renewBefore": str,
    "isCA": bool,
    "usages": list,
    "privateKey": dict,
}
USAGES = {"server auth", "digital signature", "key encipherment", "cert sign", "crl sign"}
PRIVATE_KEY = {
    "algorithm": {"RSA", "ECDSA", "Ed25519"},
    "size": int,
    "rotationPolicy": {"Always", "Never"},
}


def _duration_hours(text: str) -> int:
    assert text.endswith("h") and text[:-1].isdigit(), f"use whole hours, like 2160h: {text}"
    return int(text[:-1])


def check_certificate(doc: dict) -> None:
    assert doc["apiVersion"] == "cert-manager.io/v1"
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}
    assert {"name", "namespace"} <= set(doc["metadata"]) <= {"name", "namespace", "labels"}
    spec = doc["spec"]
    assert {"secretName", "issuerRef"} <= set(spec)
    for key, value in spec.items():
        assert key in CERTIFICATE_SPEC, f"Certificate spec has no field {key!r}"
        assert isinstance(value, CERTIFICATE_SPEC[key]), key
    assert set(spec["issuerRef"]) <= {"name", "kind", "group"}
    assert spec["issuerRef"]["kind"] in ("Issuer", "ClusterIssuer")
    assert set(spec.get("usages", [])) <= USAGES
    for key, value in spec.get("privateKey", {}).items():
        allowed = PRIVATE_KEY[key]
        assert value in allowed if isinstance(allowed, set) else isinstance(value, allowed), key
    if "duration" in spec:
        assert _duration_hours(spec["renewBefore"]) < _duration_hours(spec["duration"])


def check_issuer(doc: dict) -> None:
    assert doc["apiVersion"] == "cert-manager.io/v1"
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}
    (kind,) = doc["spec"]  # exactly one issuer type
    assert kind in ("selfSigned", "ca")
    if kind == "ca":
        assert set(doc["spec"]["ca"]) == {"secretName"}
    else:
        assert doc["spec"]["selfSigned"] == {}


def test_cert_manager_documents_parse_strictly_and_chain_up():
    certificates = {d["metadata"]["name"]: d for d in files("Certificate")}
    issuers = {d["metadata"]["name"]: d for d in files("Issuer")}
    for doc in certificates.values():
        check_certificate(doc)
        assert doc["spec"]["issuerRef"]["name"] in issuers
    for doc in issuers.values():
        check_issuer(doc)
    serving = certificates["power-dev-webhook"]
    assert serving["spec"]["secretName"] == SECRET
    assert serving["spec"]["dnsNames"][0] == f"power-dev-webhook.{NAMESPACE}.svc"
    assert "isCA" not in serving["spec"]
    # signed by a CA Issuer, so the injected bundle survives a serving-cert renewal
    ca_issuer = issuers[serving["spec"]["issuerRef"]["name"]]
    ca_cert = [
        c
        for c in certificates.values()
        if c["spec"]["secretName"] == ca_issuer["spec"]["ca"]["secretName"]
    ]
    assert len(ca_cert) == 1 and ca_cert[0]["spec"]["isCA"] is True


# --- the shared pieces --------------------------------------------------------------------


def test_deployment_least_privilege_two_replicas_and_a_pdb():
    (deployment,) = files("Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    pod = spec["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    (container,) = pod["containers"]
    ctx = container["securityContext"]
    assert ctx["privileged"] is False and ctx["allowPrivilegeEscalation"] is False
    assert ctx["readOnlyRootFilesystem"] is True and ctx["runAsNonRoot"] is True
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not any("hostPath" in v for v in pod["volumes"])
    (pdb,) = files("PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
    (account,) = [a for a in files("ServiceAccount")]
    assert account["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert not files("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")


def test_the_container_runs_the_webhook_command_with_what_it_mounts():
    (deployment,) = files("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = build_parser().parse_args(container["command"][1:])
    assert container["command"][0] == "powerdev" and args.command == "webhook"
    env = {e["name"]: e for e in container["env"]}
    assert env["POWERDEV_WEBHOOK_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.namespace"
    )
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert Path(env["POWERDEV_WEBHOOK_CONFIG"]["value"]).parent == Path(mounts["config"])
    assert env["POWERDEV_WEBHOOK_CERT_DIR"]["value"] == mounts["tls"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == SECRET
    assert volumes["config"]["configMap"]["name"] == "power-dev-webhook-config"
    port = int(env["POWERDEV_WEBHOOK_LISTEN"]["value"].rsplit(":", 1)[1])
    (declared,) = container["ports"]
    assert declared["containerPort"] == port
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert (get["path"], get["port"], get["scheme"]) == (path, declared["name"], "HTTPS")


def test_webhook_configuration_choices():
    (mwc,) = files("MutatingWebhookConfiguration")
    (hook,) = mwc["webhooks"]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["timeoutSeconds"] <= 10
    assert hook["sideEffects"] == "None"
    assert hook["reinvocationPolicy"] == "Never"
    assert hook["admissionReviewVersions"] == ["v1"]
    (rule,) = hook["rules"]
    assert rule["operations"] == ["CREATE"] and rule["resources"] == ["pods"]
    assert rule["apiGroups"] == [""] and rule["apiVersions"] == ["v1"]
    selector = hook["namespaceSelector"]
    assert selector["matchLabels"] == {"power-dev-plugin/inject": "enabled"}
    (never,) = selector["matchExpressions"]
    assert never["key"] == "kubernetes.io/metadata.name" and never["operator"] == "NotIn"
    assert {"kube-system", NAMESPACE} <= set(never["values"])
    (service,) = files("Service")
    target = hook["clientConfig"]["service"]
    assert (target["name"], target["namespace"]) == (
        service["metadata"]["name"],
        service["metadata"]["namespace"],
    )
    assert target["path"] == "/mutate"
    (port,) = service["spec"]["ports"]
    assert target["port"] == port["port"] and port["targetPort"] == "https"


def test_the_shipped_webhook_json_is_valid_and_the_defaults():
    text = (ROOT / "deploy/webhook/common/webhook.json").read_text()
    assert (
        parse_webhook_config(text, source="deploy/webhook/common/webhook.json") == WebhookConfig()
    )


# --- the builds ------------------------------------------------------------------------------


def validate_built(docs: list[dict]) -> None:
    for doc in docs:
        if doc["kind"] in ("Certificate", "Issuer"):
            check_certificate(doc) if doc["kind"] == "Certificate" else check_issuer(doc)
        elif doc["kind"] != "SecurityContextConstraints":
            kubernetes_validate.validate(doc, VERSION, strict=True)


@needs_kubectl
def test_the_cert_manager_build():
    docs = built("deploy/webhook")
    validate_built(docs)
    assert one(docs, "DaemonSet", "power-device-plugin")  # the plugin comes along
    mwc = one(docs, "MutatingWebhookConfiguration")
    source = mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    namespace, name = source.split("/")
    certificate = one(docs, "Certificate", name)
    assert certificate["metadata"]["namespace"] == namespace
    assert certificate["spec"]["secretName"] == SECRET
    config = one(docs, "ConfigMap", "power-dev-webhook-config")
    assert parse_webhook_config(config["data"]["webhook.json"], source="built") == WebhookConfig()
    image = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "quay.io/powercloud/powerdev:0.1.0"


@needs_kubectl
def test_the_openshift_build():
    docs = built("deploy/webhook/openshift")
    validate_built(docs)
    assert not [d for d in docs if d["kind"] in ("Certificate", "Issuer")]
    assert one(docs, "SecurityContextConstraints", "power-device-plugin")
    service = one(docs, "Service")
    annotations = service["metadata"]["annotations"]
    assert annotations["service.beta.openshift.io/serving-cert-secret-name"] == SECRET
    mwc = one(docs, "MutatingWebhookConfiguration")
    assert mwc["metadata"]["annotations"] == {"service.beta.openshift.io/inject-cabundle": "true"}
    template = one(docs, "Deployment")["spec"]["template"]
    assert template["metadata"]["annotations"] == {"openshift.io/required-scc": "restricted-v2"}
    assert "runAsUser" not in template["spec"]["securityContext"]  # the SCC assigns one
    assert template["spec"]["securityContext"]["runAsNonRoot"] is True


# --- who can reach the webhook: the NetworkPolicy component -----------------------------------

# What docs/webhook.md ("Who can reach the webhook") has an admin add to the
# overlay: the component, and the API server's addresses in place of the
# placeholder.
API_SERVER_ADDRESSES = """
patches:
  - target:
      kind: NetworkPolicy
      name: power-dev-webhook
    patch: |-
      - op: replace
        path: /spec/ingress/0/from
        value:
          - ipBlock:
              cidr: 10.0.0.11/32
          - ipBlock:
              cidr: 10.0.0.12/32
"""
PLACEHOLDER = "192.0.2.1/32"  # RFC 5737: no host's


def kit_kustomize(path: Path) -> list[dict]:
    """`kubectl kustomize` with the conformance kit's kubectl."""
    return [d for d in release_kustomize(require_tool(kit.TOOLS["kubectl"]), path) if d]


def with_policy(tmp_path: Path, overlay: str, patches: str | None) -> list[dict]:
    """`overlay` rendered from a copy of deploy/ with the component (and patches) added."""
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    kustomization = tmp_path / overlay / "kustomization.yaml"
    doc = yaml.safe_load(kustomization.read_text())
    component = tmp_path / "deploy/webhook/networkpolicy"
    doc["components"] = [os.path.relpath(component, tmp_path / overlay)]
    if patches is not None:
        doc.setdefault("patches", []).extend(yaml.safe_load(patches)["patches"])
    kustomization.write_text(yaml.safe_dump(doc))
    return kit_kustomize(tmp_path / overlay)


@pytest.mark.parametrize("overlay", ["deploy/webhook", "deploy/webhook/openshift"])
@pytest.mark.parametrize("addresses", ["placeholder", "set"])
def test_the_networkpolicy_component_admits_only_the_api_server_to_the_webhook(
    tmp_path, overlay, addresses
):
    docs = with_policy(tmp_path, overlay, API_SERVER_ADDRESSES if addresses == "set" else None)
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    kubernetes_validate.validate(policy, VERSION, strict=True)
    deployment = one(docs, "Deployment")
    template = deployment["spec"]["template"]
    assert not template["spec"].get("hostNetwork")  # else no NetworkPolicy would apply
    assert policy["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert policy["metadata"]["labels"]["app.kubernetes.io/part-of"] == "powerdev"
    selected = policy["spec"]["podSelector"]["matchLabels"]
    assert selected and selected.items() <= template["metadata"]["labels"].items()
    daemonset = one(docs, "DaemonSet", "power-device-plugin")
    assert not selected.items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]  # one rule: nothing else gets in
    (port,) = rule["ports"]
    (container,) = template["spec"]["containers"]
    (declared,) = container["ports"]
    assert port == {"port": declared["name"], "protocol": "TCP"}
    (service_port,) = one(docs, "Service")["spec"]["ports"]
    assert service_port["targetPort"] == declared["name"]  # what the API server connects to
    for probe in ("livenessProbe", "readinessProbe"):  # from the node: always let through
        assert container[probe]["httpGet"]["port"] == declared["name"]
    sources = rule["from"]
    assert all(set(source) == {"ipBlock"} for source in sources)  # no selector of pods
    cidrs = [source["ipBlock"]["cidr"] for source in sources]
    expected = {"placeholder": [PLACEHOLDER], "set": ["10.0.0.11/32", "10.0.0.12/32"]}
    assert cidrs == expected[addresses]
    assert all("except" not in source["ipBlock"] for source in sources)
    # Everything else the overlay makes is as without the component.
    assert [d for d in docs if d["kind"] != "NetworkPolicy"] == kit_kustomize(ROOT / overlay)
