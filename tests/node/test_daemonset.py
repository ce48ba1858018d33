"""The DaemonSet itself on the real node: the image built from the
Dockerfile (cluster/image.py; a base made from Debian's packages where the
registry's cannot be pulled), imported into the node's containerd, and
`kubectl apply -k` of an overlay of deploy/ that points the image at it and
lists the loop devices in the shipped config, with as many units as the
example pods ask for. The pod starts under the manifests' own security
context and mounts, its probes pass, the node advertises the resource,
`kubectl apply -k` of an overlay of examples/ (the busybox image for UBI's,
which the kit has no registry for) runs the example pods (the sample pod
and the Deployment's two), whose logs say each read every device, and
`kubectl delete -k` of both leaves nothing behind."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import yaml

from powerdev.devtools.cluster import image, images
from powerdev.devtools.cluster.node import DEVICE_PLUGINS
from powerdev.devtools.cluster.nodepods import loop_devices
from powerdev.devtools.kit import ROOT
from powerdev.devtools.testing import LOOP_PATTERN, is_root
from tests import conftest
from tests.e2e.test_webhook_e2e import kubectl
from tests.node.conftest import LIMIT, Namespace, allocatable, pod_story

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


def units_asked(objects: list[dict]) -> dict[str, int]:
    """How many units of RESOURCE each example pod, or each Deployment's
    pods together, ask for (limits; a Deployment's times its replicas)."""
    asked = {}
    for o in objects:
        if o["kind"] == "Pod":
            spec, times = o["spec"], 1
        elif o["kind"] == "Deployment":
            spec, times = o["spec"]["template"]["spec"], o["spec"].get("replicas", 1)
        else:
            continue
        limits = [c.get("resources", {}).get("limits", {}) for c in spec["containers"]]
        asked[o["metadata"]["name"]] = times * sum(int(lim.get(RESOURCE, 0)) for lim in limits)
    return asked


async def overlays(plane, tmp: Path) -> tuple[Path, Path, list[dict]]:
    """Copies of deploy/ and examples/, and an overlay of each: the
    DaemonSet's image is the one built here, the config lists the loop
    devices, with as many units (upper-limit) as the example pods ask for
    together, so that all of them run; the examples' image is the kit's
    busybox. Also the examples' objects, as the overlay renders them."""
    for tree in ("deploy", "examples"):
        shutil.copytree(ROOT / tree, tmp / tree)
    examples = _examples_overlay(tmp)
    rendered = list(yaml.safe_load_all(await kubectl(plane, "kustomize", str(examples))))
    name, tag = image.IMAGE.rsplit(":", 1)
    config = {
        "nx-gzip": False,
        "permissions": "rw",
        "include-devices": [LOOP_PATTERN],
        "discovery-strategy": "default",
        # With one unit per device (the shipped config), two loop devices
        # serve two of the three example pods, and the third stays Pending:
        # whichever the scheduler sees last.
        "upper-limit": sum(units_asked(rendered).values()),
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
    return deploy, examples, rendered


def _examples_overlay(tmp: Path) -> Path:
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
    return examples


async def test_the_daemonset_from_the_image_serves_the_examples_and_goes_without_a_trace(
    real_node, node_api, powerdev_image, udev_directory, tmp_path
):
    plane = real_node.plane
    with trio.fail_after(4 * LIMIT), loop_devices(tmp_path, 2) as loops:
        done = await trio.run_process(
            real_node.ctr("images", "import", str(powerdev_image)), capture_stderr=True
        )
        assert done.returncode == 0
        deploy, examples, rendered = await overlays(plane, tmp_path)
        try:
            await _deploy_and_run_the_examples(
                real_node, node_api, deploy, examples, rendered, loops
            )
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


async def _deploy_and_run_the_examples(
    real_node, node_api, deploy, examples, rendered, loops
) -> None:
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
    asked = units_asked(rendered)
    assert asked == {"power-dev-sample": 1, "power-dev-workload": 2}, asked
    await allocatable(node_api, real_node, RESOURCE, sum(asked.values()))

    await kubectl(plane, "apply", "-k", str(examples))
    example = Namespace(node_api, EXAMPLES, real_node)
    await example.running("power-dev-sample")
    workload = await _replicas_running(example, "power-dev-workload", 2)
    # "all": each pod has every device; one line for each, then it sleeps
    for name, container in [("power-dev-sample", "sample")] + [(w, "workload") for w in workload]:
        log = await example.wait_log(
            name,
            lambda t: t.count("read 4 KiB") + t.count("CANNOT") == len(loops),
            container=container,
        )
        assert "running as: uid=1000" in log, (name, log)
        assert "CANNOT" not in log, (name, log)
        for device, _ in loops:
            assert f"read 4 KiB: {device}" in log, (name, log)


async def _replicas_running(example: Namespace, deployment: str, replicas: int) -> list[str]:
    """The names of the Deployment's pods once `replicas` of them are
    Running; else a test failure that tells each one's story."""
    selector = f"app={deployment}"

    def phases(listing: dict) -> dict[str, str]:
        return {p["metadata"]["name"]: p["status"].get("phase") for p in listing["items"]}

    with trio.move_on_after(LIMIT):
        await example.api.wait_for(
            f"/apis/apps/v1/namespaces/{example.name}/deployments",
            deployment,
            lambda d: d.get("status", {}).get("readyReplicas") == replicas,
        )
        running = phases(await example.api.get(example.pods, labelSelector=selector))
        if list(running.values()) == ["Running"] * replicas:
            return sorted(running)
    listing = await example.api.get(example.pods, labelSelector=selector)
    raise AssertionError(
        f"{deployment}: its pods {phases(listing)}, not {replicas} Running "
        f"(waited up to {LIMIT} s)\n"
        + await pod_story(example.api, example.node, example.name, sorted(phases(listing)))
    )
