"""The DaemonSet itself on the real node: the image built from the
Dockerfile (cluster/image.py; a base made from Debian's packages where the
registry's cannot be pulled), imported into the node's containerd, and
`kubectl apply -k` of an overlay of deploy/ that points the image at it and
lists the loop devices in the shipped config. The pod starts under the
manifests' own security context and mounts, its probes pass, the node
advertises the resource, `kubectl apply -k` of an overlay of examples/
(the busybox image for UBI's, which the kit has no registry for) runs the
example pods, whose logs say they read their devices, and `kubectl delete
-k` of both leaves nothing behind."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from powerdev.devtools.cluster import image, images
from powerdev.devtools.cluster.node import DEVICE_PLUGINS
from powerdev.devtools.cluster.nodepods import loop_devices
from powerdev.devtools.kit import ROOT
from powerdev.devtools.testing import LOOP_PATTERN, is_root
from tests import conftest
from tests.e2e.test_webhook_e2e import kubectl
from tests.node.conftest import LIMIT, Namespace, allocatable

pytestmark = pytest.mark.skipif(not is_root(), reason="needs root: a real node and loop devices")

RESOURCE = "power-dev-plugin/dev"
NAMESPACE = "power-device-plugin"
EXAMPLES = "power-dev-example"
UDEV = Path("/run/udev")  # the DaemonSet mounts it (type Directory); no udev runs here


@pytest.fixture(scope="module")
def powerdev_image(real_node) -> Iterator[Path]:
    """The image's OCI archive, built once for the module."""
    why = image.unavailable()
    if why:
        conftest.require(None, why)
    work = Path(tempfile.mkdtemp(prefix="pd-image-", dir="/tmp"))
    try:
        yield image.build(work / "powerdev.tar", log=work / "build.log")
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def udev_directory() -> Iterator[None]:
    """/run/udev, which the DaemonSet mounts (hostPath type Directory): on a
    node without udev, an empty one; removed after if made here."""
    made = not UDEV.exists()
    UDEV.mkdir(exist_ok=True)
    yield
    if made:
        shutil.rmtree(UDEV, ignore_errors=True)


def overlays(tmp: Path) -> tuple[Path, Path]:
    """Copies of deploy/ and examples/, and an overlay of each: the
    DaemonSet's image is the one built here, the config lists the loop
    devices; the examples' image is the kit's busybox."""
    for tree in ("deploy", "examples"):
        shutil.copytree(ROOT / tree, tmp / tree)
    name, tag = image.IMAGE.rsplit(":", 1)
    config = {
        "nx-gzip": False,
        "permissions": "rw",
        "include-devices": [LOOP_PATTERN],
        "discovery-strategy": "default",
    }
    deploy = tmp / "deploy-kit"
    deploy.mkdir()
    (deploy / "kustomization.yaml").write_text(
        json.dumps(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": ["../deploy"],
                "images": [
                    {"name": "quay.io/powercloud/powerdev", "newName": name, "newTag": tag}
                ],
                "patches": [
                    {
                        "target": {"kind": "ConfigMap", "name": "power-device-config"},
                        "patch": json.dumps(
                            [{"op": "replace", "path": "/data/config.json",
                              "value": json.dumps(config)}]
                        ),
                    }
                ],
            }
        )
    )  # fmt: skip
    busybox, busybox_tag = images.BUSYBOX.rsplit(":", 1)
    examples = tmp / "examples-kit"
    examples.mkdir()
    (examples / "kustomization.yaml").write_text(
        json.dumps(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": ["../examples"],
                "images": [
                    {
                        "name": "registry.access.redhat.com/ubi9/ubi-minimal",
                        "newName": busybox,
                        "newTag": busybox_tag,
                    }
                ],
            }
        )
    )
    return deploy, examples


async def test_the_daemonset_from_the_image_serves_the_examples_and_goes_without_a_trace(
    real_node, node_api, powerdev_image, udev_directory, tmp_path
):
    plane = real_node.plane
    with trio.fail_after(4 * LIMIT), loop_devices(tmp_path, 2) as loops:
        done = await trio.run_process(
            real_node.ctr("images", "import", str(powerdev_image)), capture_stderr=True
        )
        assert done.returncode == 0
        deploy, examples = overlays(tmp_path)
        try:
            await _deploy_and_run_the_examples(real_node, node_api, deploy, examples, loops)
        except BaseException:
            with trio.CancelScope(shield=True), trio.move_on_after(LIMIT):
                for tree in (examples, deploy):  # the next tests share the node
                    await kubectl(plane, "delete", "-k", str(tree), "--ignore-not-found")
            raise
        await kubectl(plane, "delete", "-k", str(examples), "--wait=true")
        await kubectl(plane, "delete", "-k", str(deploy), "--wait=true")
        await node_api.wait_gone("/api/v1/namespaces", EXAMPLES)
        await node_api.wait_gone("/api/v1/namespaces", NAMESPACE)
        left = await node_api.get(
            "/api/v1/pods", labelSelector="app.kubernetes.io/part-of=powerdev"
        )
        assert left["items"] == []
        # powerdev's socket is gone; only the kubelet's own files stay
        files = {p.name for p in DEVICE_PLUGINS.iterdir()}
        assert files <= {"kubelet.sock", "kubelet_internal_checkpoint"}, files


async def _deploy_and_run_the_examples(real_node, node_api, deploy, examples, loops) -> None:
    plane = real_node.plane
    await kubectl(plane, "apply", "-k", str(deploy))
    # Ready: its readiness probe (/readyz) passed on the node
    await node_api.wait_for(
        f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets",
        "power-device-plugin",
        lambda d: d.get("status", {}).get("numberReady") == 1,
    )
    (pod,) = (await node_api.get(f"/api/v1/namespaces/{NAMESPACE}/pods"))["items"]
    assert pod["spec"]["containers"][0]["image"] == image.IMAGE
    await allocatable(node_api, real_node, RESOURCE, len(loops))

    await kubectl(plane, "apply", "-k", str(examples))
    sample = Namespace(node_api, EXAMPLES, real_node)
    started = await node_api.wait_for(
        sample.pods, "power-dev-sample", lambda p: p["status"].get("phase") != "Pending"
    )
    assert started["status"]["phase"] == "Running", started["status"]
    # "all": the pod has every device; one line for each, then it sleeps
    log = await sample.wait_log(
        "power-dev-sample",
        lambda t: t.count("read 4 KiB") + t.count("CANNOT") == len(loops),
        container="sample",
    )
    assert "CANNOT" not in log, log
    for device, _ in loops:
        assert f"read 4 KiB: {device}" in log, log
