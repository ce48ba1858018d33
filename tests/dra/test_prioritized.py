"""A prioritized list (firstAvailable, GA in 1.36) end to end: the real
scheduler picks the second of two alternatives (the first asks for more
devices than the node has), so the allocation names the subrequest
("dev/small"); a container that names the request ("dev") gets the
device's CDI IDs from the kubelet's own DRA manager (draharness), which
hands a container the devices whose request names include the one it
names."""

from __future__ import annotations

import pytest
import trio

from powerdev.devtools.cdicheck import inject
from powerdev.devtools.cluster.client import container, pod
from powerdev.devtools.kit import CDICHECK
from powerdev.devtools.testing import is_root
from tests.conftest import require_tool
from tests.dra.test_driver import LIMIT, dra_node, powerdev
from tests.dra.test_harness import RESOURCE_API, TAINT

pytestmark = pytest.mark.skipif(not is_root(), reason="needs root: distinct nodes (mknod)")


@pytest.fixture
def cdicheck():
    return require_tool(CDICHECK)


async def test_a_container_naming_the_request_gets_the_device_of_the_chosen_alternative(
    api, control_plane, draharness, cdicheck, tmp_path
):
    with trio.fail_after(LIMIT):
        async with (
            dra_node(api, control_plane, draharness, tmp_path) as node,
            powerdev(node),
        ):
            claims = f"{RESOURCE_API}/namespaces/{node.namespace}/resourceclaims"
            alternatives = [
                {"name": "big", "deviceClassName": node.name, "count": 2},  # the node has one
                {"name": "small", "deviceClassName": node.name, "count": 1},
            ]
            await api.create(
                claims,
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": "p1"},
                    "spec": {
                        "devices": {"requests": [{"name": "dev", "firstAvailable": alternatives}]}
                    },
                },
            )
            body = pod(
                "p1",
                container("c0", {"claims": [{"name": "dev", "request": "dev"}]}),
                container("c1", {"claims": [{"name": "dev"}]}),
                resourceClaims=[{"name": "dev", "resourceClaimName": "p1"}],
                tolerations=[{"key": TAINT, "operator": "Equal", "value": node.name}],
            )
            await api.create_pod(node.namespace, body)
            await node.bound("p1")
            claim = await api.get(f"{claims}/p1")
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            assert result["request"] == "dev/small"

            prepared = await node.harness.prepare(node.namespace, "p1")
            cdi_id = f"{node.driver}/claim={claim['metadata']['uid']}-{result['device']}"
            assert prepared == {"c0": [cdi_id], "c1": [cdi_id]}
            assert inject(cdicheck, [node.cdi], prepared["c0"])["ok"]
