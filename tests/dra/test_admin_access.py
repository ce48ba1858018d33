"""Admin access (adminAccess: true, GA in 1.36) end to end: the real
scheduler allocates a device an ordinary claim holds to a claim with admin
access (in a namespace labelled for it), the kubelet's DRA manager
(draharness) prepares both, and the CDI library gives the admin container
a read-only cgroup rule; and an ordinary claim is prepared on a device a
claim with admin access has."""

from __future__ import annotations

import pytest
import trio

from powerdev.devtools.cdicheck import inject
from powerdev.devtools.kit import CDICHECK
from powerdev.devtools.testing import is_root
from tests.conftest import require_tool
from tests.dra.test_driver import LIMIT, dra_node, powerdev
from tests.dra.test_harness import RESOURCE_API
from tests.dra.test_health import claim_on

pytestmark = pytest.mark.skipif(not is_root(), reason="needs root: distinct nodes (mknod)")
ADMIN_NAMESPACE_LABEL = "resource.kubernetes.io/admin-access"


@pytest.fixture
def cdicheck():
    return require_tool(CDICHECK)


def access(resolved: dict) -> list[str]:
    return [rule["access"] for rule in resolved["resourceDevices"]]


async def admin_claim(node, name: str, path: str) -> dict:
    """A claim with admin access to the device at `path`, a pod using it,
    bound: the claim."""
    claims = f"{RESOURCE_API}/namespaces/{node.namespace}/resourceclaims"
    spec = node.claim_spec(cel=f'device.attributes["{node.driver}"].path == "{path}"')
    spec["devices"]["requests"][0]["exactly"]["adminAccess"] = True
    await node.api.create(
        claims,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": spec,
        },
    )
    await node.pod_using(name, {"resourceClaimName": name})
    await node.bound(name)
    return await node.api.get(f"{claims}/{name}")


def device_of(claim: dict) -> str:
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return result["device"]


async def test_admin_access_reaches_a_held_device_read_only_and_holds_nothing(
    api, control_plane, draharness, cdicheck, tmp_path
):
    with trio.fail_after(LIMIT):
        async with (
            dra_node(api, control_plane, draharness, tmp_path, devices=("dra0", "dra1")) as node,
            powerdev(node),
        ):
            await api.label_namespace(node.namespace, {ADMIN_NAMESPACE_LABEL: "true"})
            # dra0: an ordinary claim first, then admin access to it
            app = await claim_on(node, "app", "/dev/dra0")
            app_ids = (await node.harness.prepare(node.namespace, "app"))["c0"]
            assert access(inject(cdicheck, [node.cdi], app_ids)) == ["rw"]
            look = await admin_claim(node, "look", "/dev/dra0")
            (result,) = look["status"]["allocation"]["devices"]["results"]
            assert result["adminAccess"] is True and result["device"] == device_of(app)
            look_ids = (await node.harness.prepare(node.namespace, "look"))["c0"]
            resolved = inject(cdicheck, [node.cdi], look_ids)
            assert resolved["ok"] and access(resolved) == ["r"]

            # dra1: admin access first, then an ordinary claim on it
            watch = await admin_claim(node, "watch", "/dev/dra1")
            await node.harness.prepare(node.namespace, "watch")
            other = await claim_on(node, "other", "/dev/dra1")
            assert device_of(other) == device_of(watch)
            other_ids = (await node.harness.prepare(node.namespace, "other"))["c0"]
            assert access(inject(cdicheck, [node.cdi], other_ids)) == ["rw"]
