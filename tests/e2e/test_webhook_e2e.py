"""`powerdev webhook` end to end, through the kit's API server: deploy/webhook
rendered and applied with the kit's kubectl as a user would, the real
`powerdev webhook` process serving it, pods created through the API.

What differs from a cluster, and why:
- No cert-manager runs: a test CA (trustme) issues the serving certificate
  for the Certificate's dnsNames and goes into caBundle, as cert-manager's
  CA injector would put its CA there; the Certificate and Issuers are not
  applied (this API server has no such kinds).
- The service reference becomes a URL. The API server resolves a service
  reference to the Service's cluster IP (or, with
  --enable-aggregator-routing, to an endpoint address, and the API refuses
  loopback endpoint addresses), and without kube-proxy and a kubelet
  neither reaches a process on 127.0.0.1. The URL keeps the Service's DNS
  name, which the certificate names and which the API server's own
  /etc/hosts (controlplane.py) maps to 127.0.0.1, and the Service's path.
- A relay (relay.py) stands in for the Service between the URL's port and
  the webhook's, and lets a test end connections or make them hang.
Everything else of the MutatingWebhookConfiguration is as rendered: the
selectors, failurePolicy, timeoutSeconds, sideEffects, reinvocationPolicy.
The Deployment and DaemonSet are applied too; no kubelet runs their pods.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import shlex
import signal
import ssl
import subprocess
from dataclasses import dataclass

import pytest
import trio
import trustme
import yaml

from powerdev.devtools.cluster.client import Api, container, pod
from powerdev.devtools.cluster.controlplane import ControlPlane
from powerdev.devtools.kit import ROOT
from tests.conftest import wait_for_file
from tests.controlplane_fixtures import LOOPBACK_NAMES
from tests.e2e.relay import Relay
from tests.webhook.conftest import (
    Process,
    SecretDir,
    pair_files,
    settings_for,
    sha256_of,
    webhook_process,
)

LIMIT = 60  # seconds: the bound of each test here
RESOURCE = "power-dev-plugin/dev"
NOT_APPLIED = ("Certificate", "Issuer")  # cert-manager's kinds
MWC_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
FAILING_OPEN = "Failed calling webhook, failing open"  # the API server's log line
PROBE_PACE = 0.05  # seconds between two dry-run probes
# "The selector also leaves out kube-system, kube-public, kube-node-lease
# and power-device-plugin" (docs/webhook.md).
README_LEFT_OUT = ("kube-system", "kube-public", "kube-node-lease", "power-device-plugin")


def one(docs: list[dict], kind: str, name: str) -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


@pytest.fixture(scope="module")
def rendered(control_plane: ControlPlane) -> list[dict]:
    """deploy/webhook as `kubectl kustomize` (the kit's) renders it."""
    done = subprocess.run(
        control_plane.kubectl("kustomize", str(ROOT / "deploy" / "webhook")),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return list(yaml.safe_load_all(done.stdout))


def for_this_cluster(rendered: list[dict], ca_pem: bytes, port: int) -> list[dict]:
    """The rendered objects to apply here: see the module's docstring."""
    docs = [copy.deepcopy(d) for d in rendered if d["kind"] not in NOT_APPLIED]
    (mwc,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    for hook in mwc["webhooks"]:
        service = hook["clientConfig"].pop("service")
        host = f"{service['name']}.{service['namespace']}.svc"
        assert host in LOOPBACK_NAMES, f"the API server cannot resolve {host}; add it"
        hook["clientConfig"]["url"] = f"https://{host}:{port}{service['path']}"
        hook["clientConfig"]["caBundle"] = base64.b64encode(ca_pem).decode()
    return docs


@dataclass
class Webhook:
    process: Process
    relay: Relay
    ca: trustme.CA
    dns_names: list[str]
    secret: SecretDir
    applied: list[dict]

    @property
    def hook(self) -> dict:
        (mwc,) = [d for d in self.applied if d["kind"] == "MutatingWebhookConfiguration"]
        (hook,) = mwc["webhooks"]
        return hook

    def lines(self, start: int = 0) -> list[str]:
        return self.process.stderr.lines[start:]


async def kubectl(control_plane: ControlPlane, *args: str, stdin: bytes | None = None) -> str:
    done = await trio.run_process(
        control_plane.kubectl(*args),
        stdin=stdin,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr.decode()}"
    return done.stdout.decode()


@pytest.fixture
async def webhook(control_plane, api, rendered, tmp_path):
    """The webhook process, with a certificate for the Certificate's
    dnsNames, behind a relay, and deploy/webhook applied pointing at it."""
    ca = trustme.CA()
    dns_names = one(rendered, "Certificate", "power-dev-webhook")["spec"]["dnsNames"]
    secret = SecretDir(tmp_path / "tls")
    secret.write(pair_files(ca.issue_cert(*dns_names)))
    settings = settings_for(tmp_path, secret)
    config = one(rendered, "ConfigMap", "power-dev-webhook-config")["data"]["webhook.json"]
    settings.config_path.write_text(config)
    async with (
        webhook_process(settings, "--log-level", "debug") as process,
        trio.open_nursery() as nursery,
    ):
        relay = await nursery.start(Relay(int(process.url.rsplit(":", 1)[1])).run)
        docs = for_this_cluster(rendered, ca.cert_pem.bytes(), relay.port)
        await kubectl(control_plane, "apply", "-f", "-", stdin=yaml.safe_dump_all(docs).encode())
        yield Webhook(process, relay, ca, dns_names, secret, docs)
        nursery.cancel_scope.cancel()


async def selected_namespace(api: Api, webhook: Webhook, name: str) -> None:
    """A namespace with the labels the rendered namespaceSelector asks for."""
    await api.create_namespace(name, webhook.hook["namespaceSelector"]["matchLabels"])


async def until_the_api_server_calls_it(api: Api, namespace: str) -> None:
    """The API server takes a new webhook configuration from its informer a
    moment after the write; until then a pod is not sent to the webhook.
    Server-side dry runs (nothing is stored) until one comes back with the
    resource: there is no event to wait for, and each try is a real request."""
    while True:
        probe = pod("probe", container("app"))
        answer = await api.create_pod(namespace, probe, dryRun="All")
        if answer["spec"]["containers"][0]["resources"]:
            return
        await trio.sleep(PROBE_PACE)


def resources(stored: dict, kind: str = "containers") -> dict[str, dict]:
    return {c["name"]: c["resources"] for c in stored["spec"].get(kind, [])}


def readme_check() -> tuple[list[str], str]:
    """The "Check it" command of docs/webhook.md (kubectl's arguments, split
    as a shell would) and the output the page shows for it."""
    lines = (ROOT / "docs" / "webhook.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("kubectl run probe"))
    command = shlex.split(lines[start].rstrip("\\") + lines[start + 1])
    shown = lines[start + 2]
    assert command[0] == "kubectl" and shown.startswith("# "), (command, shown)
    return command[1:], shown[2:]


async def test_as_rendered_a_pod_gets_the_resource_as_the_readme_says(webhook, api, control_plane):
    with trio.fail_after(LIMIT):
        stored = await api.get(f"{MWC_PATH}/power-dev-webhook")
        (mwc,) = [d for d in webhook.applied if d["kind"] == "MutatingWebhookConfiguration"]
        annotations = dict(stored["metadata"]["annotations"])
        del annotations["kubectl.kubernetes.io/last-applied-configuration"]  # kubectl apply's
        assert annotations == mwc["metadata"]["annotations"]
        assert stored["metadata"]["labels"] == mwc["metadata"]["labels"]
        (hook,) = stored["webhooks"]
        for key, value in webhook.hook.items():
            assert hook[key] == value, key  # the API server keeps every rendered field

        # The docs' check, as it is written there: kubectl run --dry-run=server.
        args, shown = readme_check()
        namespace = args[args.index("-n") + 1]
        await selected_namespace(api, webhook, namespace)
        await until_the_api_server_calls_it(api, namespace)
        assert await kubectl(control_plane, *args) == shown
        assert any(f"pod {namespace}/probe (dry run): added" in x for x in webhook.lines())

        await selected_namespace(api, webhook, "team-a")
        db = pod(
            "db",
            container("app"),
            container("sidecar", {"limits": {"cpu": "100m", "memory": "64Mi"}}),
            container("own", {"limits": {RESOURCE: "2"}, "requests": {RESOURCE: "2"}}),
            initContainers=[container("setup")],
        )
        stored = await api.create_pod("team-a", db)
        one_device = {RESOURCE: "1"}
        assert resources(stored) == {
            "app": {"limits": one_device, "requests": one_device},
            # requests default to the limits, before the webhook sees the pod
            "sidecar": {
                "limits": {"cpu": "100m", "memory": "64Mi", **one_device},
                "requests": {"cpu": "100m", "memory": "64Mi", **one_device},
            },
            "own": {"limits": {RESOURCE: "2"}, "requests": {RESOURCE: "2"}},  # its own numbers
        }
        assert resources(stored, "initContainers") == {"setup": {}}  # init-containers: false

        named = pod(
            "named",
            container("worker"),
            container("helper"),
            annotations={"power-dev-plugin/containers": "worker"},
        )
        stored = await api.create_pod("team-a", named)
        assert resources(stored) == {
            "worker": {"limits": one_device, "requests": one_device},
            "helper": {},
        }
        # what was stored is what the API server returns
        fetched = await api.get("/api/v1/namespaces/team-a/pods/named")
        assert resources(fetched) == resources(stored)


async def test_pods_left_out_are_stored_unchanged(webhook, api):
    with trio.fail_after(LIMIT):
        label = webhook.hook["namespaceSelector"]["matchLabels"]
        # Left out by the API server (the namespaceSelector): never sent.
        await api.create_namespace("unlabelled")
        for name in README_LEFT_OUT:  # labelled anyway
            await api.label_namespace(name, label)
        never_sent = ["unlabelled", *README_LEFT_OUT]
        # Sent, and left alone by the webhook.
        await api.create_namespace("openshift-ops", label)
        await selected_namespace(api, webhook, "team-b")
        await until_the_api_server_calls_it(api, "team-b")
        mark = len(webhook.lines())

        for namespace in [*never_sent, "openshift-ops"]:
            stored = await api.create_pod(namespace, pod("plain", container("app")))
            assert resources(stored) == {"app": {}}, namespace
        opted_out = pod(
            "opted-out", container("app"), annotations={"power-dev-plugin/inject": "false"}
        )
        assert resources(await api.create_pod("team-b", opted_out)) == {"app": {}}

        # One pod that is mutated: the webhook logs each review before it
        # answers, so once its line is read every earlier review's line is too.
        assert resources(await api.create_pod("team-b", pod("last", container("app"))))["app"]
        await webhook.process.stderr.wait_for(lambda x: "pod team-b/last: added" in x, mark)
        seen = webhook.lines(mark)
        for namespace in never_sent:
            assert not [x for x in seen if f"pod {namespace}/" in x], namespace
        assert any(
            "pod openshift-ops/plain left alone: namespace 'openshift-ops' is never mutated" in x
            for x in seen
        )
        assert any(
            "pod team-b/opted-out left alone: the pod is annotated power-dev-plugin/inject: false"
            in x
            for x in seen
        )


async def _create_timed(api: Api, namespace: str, name: str) -> tuple[dict, float]:
    began = trio.current_time()
    stored = await api.create_pod(namespace, pod(name, container("app")))
    return stored, trio.current_time() - began


async def _failed_open(control_plane: ControlPlane, before: int) -> None:
    """Until the API server has logged one more call that failed open."""
    log = control_plane.log("kube-apiserver")
    await wait_for_file(log, lambda text: text.count(FAILING_OPEN) > before)


def _failures_so_far(control_plane: ControlPlane) -> int:
    return control_plane.log("kube-apiserver").read_text().count(FAILING_OPEN)


async def test_with_the_webhook_down_pods_are_still_created(webhook, api, control_plane, capsys):
    timeout = webhook.hook["timeoutSeconds"]
    assert webhook.hook["failurePolicy"] == "Ignore"
    with trio.fail_after(LIMIT):
        await selected_namespace(api, webhook, "team-down")
        await until_the_api_server_calls_it(api, "team-down")
        webhook.process.proc.send_signal(signal.SIGTERM)
        assert await webhook.process.proc.wait() == 0
        before = _failures_so_far(control_plane)
        stored, took = await _create_timed(api, "team-down", "while-down")
        assert resources(stored) == {"app": {}}
        await _failed_open(control_plane, before)
        assert took < timeout  # refused at once: the timeout is not what ends it
    with capsys.disabled():
        print(
            f"\nwebhook down (process stopped): pod created without the resource in "
            f"{took * 1000:.0f} ms (failurePolicy Ignore; timeoutSeconds {timeout})"
        )


async def test_a_webhook_that_hangs_costs_a_pod_its_timeout_and_no_more(
    webhook, api, control_plane, capsys
):
    timeout = webhook.hook["timeoutSeconds"]
    with trio.fail_after(LIMIT):
        await selected_namespace(api, webhook, "team-hang")
        await until_the_api_server_calls_it(api, "team-hang")
        # Held whichever connection the API server sends on: ending its open
        # ones instead raced with its next call, which then failed at once.
        webhook.relay.holding = True
        before = _failures_so_far(control_plane)
        stored, took = await _create_timed(api, "team-hang", "while-hung")
        assert resources(stored) == {"app": {}}
        await _failed_open(control_plane, before)
        assert timeout <= took < timeout + 5
    with capsys.disabled():
        print(
            f"\nwebhook hung (connection accepted, never answered): pod created without the "
            f"resource in {took:.2f} s (timeoutSeconds {timeout})"
        )


async def served_certificate(port: int, ca: trustme.CA, name: str) -> str:
    """The sha256 of the certificate a new connection gets, checked as the
    API server checks it: against the CA, for the Service's name."""
    context = ssl.create_default_context()
    ca.configure_trust(context)
    stream = trio.SSLStream(
        await trio.open_tcp_stream("127.0.0.1", port), context, server_hostname=name
    )
    async with stream:
        await stream.do_handshake()
        der = stream.getpeercert(binary_form=True)
    return hashlib.sha256(der).hexdigest()


async def test_a_rotated_certificate_keeps_working(webhook, api):
    host = webhook.dns_names[0]
    with trio.fail_after(LIMIT):
        await selected_namespace(api, webhook, "team-rotate")
        await until_the_api_server_calls_it(api, "team-rotate")  # connected, first certificate
        first = await served_certificate(webhook.relay.port, webhook.ca, host)
        stored = await api.create_pod("team-rotate", pod("before", container("app")))
        assert resources(stored)["app"]["limits"] == {RESOURCE: "1"}

        # A renewal as cert-manager makes one: a new key pair from the same
        # CA, so caBundle stays; the kubelet swaps the Secret's ..data link.
        renewed = webhook.ca.issue_cert(*webhook.dns_names)
        assert sha256_of(renewed) != first
        mark = len(webhook.lines())
        webhook.secret.write(pair_files(renewed))
        await webhook.process.stderr.wait_for(lambda x: sha256_of(renewed) in x, mark)
        assert await served_certificate(webhook.relay.port, webhook.ca, host) == sha256_of(renewed)
        # The API server's open connection, if it still has one, keeps working.
        stored = await api.create_pod("team-rotate", pod("kept", container("app")))
        assert resources(stored)["app"]["limits"] == {RESOURCE: "1"}

        # End every connection: the API server must open a new one, whose
        # handshake can only get the renewed certificate.
        await webhook.relay.end_all()
        connections = webhook.relay.accepted
        await until_the_api_server_calls_it(api, "team-rotate")
        stored = await api.create_pod("team-rotate", pod("after", container("app")))
        assert resources(stored)["app"]["limits"] == {RESOURCE: "1"}
        assert webhook.relay.accepted > connections


def test_the_rendered_service_is_what_the_url_names(rendered):
    """The URL's host is the Service's DNS name, and the certificate names it."""
    service = one(rendered, "Service", "power-dev-webhook")
    host = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    certificate = one(rendered, "Certificate", "power-dev-webhook")
    assert host == certificate["spec"]["dnsNames"][0]
    assert set(certificate["spec"]["dnsNames"]) <= set(LOOPBACK_NAMES)
    data = json.loads(
        one(rendered, "ConfigMap", "power-dev-webhook-config")["data"]["webhook.json"]
    )
    assert data["resource"] == RESOURCE
