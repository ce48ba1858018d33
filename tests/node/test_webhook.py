"""The webhook on the real node: a pod created without the resource, in a
namespace the webhook selects, is given it by `powerdev webhook` (deploy/
webhook's MutatingWebhookConfiguration as rendered, its service turned into
a URL as tests/e2e/test_webhook_e2e.py explains), is scheduled by it, and
runs with its device."""

from __future__ import annotations

import secrets

import pytest
import trio
import trustme
import yaml

from powerdev.devtools.cluster.nodepods import busybox_pod, loop_devices, write_and_read
from powerdev.devtools.kit import ROOT
from powerdev.devtools.testing import LOOP_PATTERN, is_root
from tests.e2e.test_webhook_e2e import (
    MWC_PATH,
    for_this_cluster,
    kubectl,
    one,
    until_the_api_server_calls_it,
)
from tests.node.conftest import LIMIT, allocatable, powerdev, written
from tests.webhook.conftest import SecretDir, pair_files, settings_for, webhook_process

pytestmark = pytest.mark.skipif(not is_root(), reason="needs root: a real node and loop devices")

RESOURCE = "power-dev-plugin/dev"  # what the shipped webhook.json adds


async def test_a_pod_created_without_the_resource_gets_it_and_runs_with_its_device(
    real_node, node_api, namespace, tmp_path
):
    plane = real_node.plane
    rendered = list(
        yaml.safe_load_all(await kubectl(plane, "kustomize", str(ROOT / "deploy" / "webhook")))
    )
    ca = trustme.CA()
    secret = SecretDir(tmp_path / "tls")
    secret.write(
        pair_files(
            ca.issue_cert(*one(rendered, "Certificate", "power-dev-webhook")["spec"]["dnsNames"])
        )
    )
    settings = settings_for(tmp_path, secret)
    config = one(rendered, "ConfigMap", "power-dev-webhook-config")["data"]["webhook.json"]
    settings.config_path.write_text(config)
    with trio.fail_after(2 * LIMIT), loop_devices(tmp_path, 1) as [(device, backing)]:
        async with webhook_process(settings) as process:
            port = int(process.url.rsplit(":", 1)[1])
            docs = for_this_cluster(rendered, ca.cert_pem.bytes(), port)
            (mwc,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
            await kubectl(plane, "apply", "-f", "-", stdin=yaml.safe_dump(mwc).encode())
            try:
                (hook,) = mwc["webhooks"]
                labels = hook["namespaceSelector"]["matchLabels"]
                await node_api.label_namespace(namespace.name, labels)
                await until_the_api_server_calls_it(node_api, namespace.name)
                entry = {
                    "name": RESOURCE,
                    "socket": "webhook.sock",
                    "include-devices": [LOOP_PATTERN],
                }
                async with powerdev(real_node, tmp_path, [entry]):
                    await allocatable(node_api, real_node, RESOURCE, 1)
                    text = f"hooked-{secrets.token_hex(3)}"
                    body = busybox_pod("plain", write_and_read(device, text))
                    stored = await node_api.create(namespace.pods, body)
                    assert stored["spec"]["containers"][0]["resources"]["limits"] == {RESOURCE: "1"}
                    phase, log = await namespace.ended("plain")
                    assert (phase, f"read: {text}") == ("Succeeded", log.strip()), log
                    assert written(backing, text) == text
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(LIMIT):
                    await node_api.delete(f"{MWC_PATH}/{mwc['metadata']['name']}")
