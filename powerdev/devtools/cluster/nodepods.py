"""Pods and `powerdev run` on the kit's real node (node.py), for the tests
in tests/node and for `powerdev bench --node`: busybox pods as the
restricted Pod Security level has them (UID 1000, every capability dropped,
no privilege escalation, a read-only root, RuntimeDefault seccomp), scripts
that write and read a device, and the command line of a powerdev that is
the node's device plugin and DRA driver."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from powerdev.devtools import testing
from powerdev.devtools.cluster import images, node
from powerdev.devtools.cluster.node import Node

UID, GID = 1000, 1000  # every pod's user and group
DRIVER = "dra.powerdev.io"  # powerdev's DRA driver, the default
RESOURCE_API = "/apis/resource.k8s.io/v1"


def pod_security(groups: tuple[int, ...] = ()) -> dict:
    """What every test pod runs with: the restricted Pod Security level."""
    return {
        "runAsUser": UID,
        "runAsGroup": GID,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
        **({"supplementalGroups": list(groups)} if groups else {}),
    }


CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def write_and_read(device: str, mark: str) -> str:
    """A script that writes `mark` at the start of `device` (a path, or a
    pattern that names the one device the pod has), synced, and reads it
    back; it prints what it read, and fails if it cannot open it."""
    return (
        f"DEV=$(echo {device}); "
        f"printf '%s' '{mark}' | dd of=$DEV conv=fsync 2>/tmp/dd.err "
        "|| { cat /tmp/dd.err; exit 3; }; "
        f"echo read: $(dd if=$DEV bs={len(mark)} count=1 2>/dev/null)"
    )


def keep_writing(pattern: str) -> str:
    """A script that writes a count, 8 digits, at the start of every device
    `pattern` names, five times a second, and logs `wrote N` after each
    round; it fails as soon as a device cannot be written."""
    return (
        "i=0; while true; do i=$((i+1)); "
        f"for DEV in {pattern}; do printf '%08d' $i | dd of=$DEV conv=fsync 2>/tmp/dd.err "
        "|| { cat /tmp/dd.err; exit 3; }; done; echo wrote $i; sleep 0.2; done"
    )


def busybox_pod(
    name: str,
    script: str,
    *,
    resources: dict | None = None,
    claims: list[dict] | None = None,
    groups: tuple[int, ...] = (),
) -> dict:
    """A pod of one busybox container that runs `script` once, as UID
    1000 with every capability dropped, on the host's network."""
    container: dict[str, object] = {
        "name": "c0",
        "image": images.BUSYBOX,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
        "securityContext": CONTAINER_SECURITY,
        # /tmp for dd's messages: the root is read-only
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    if resources:
        container["resources"] = resources
    spec: dict[str, object] = {
        "hostNetwork": True,
        "restartPolicy": "Never",
        "securityContext": pod_security(groups),
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {"medium": "Memory"}}],
        "terminationGracePeriodSeconds": 1,
    }
    if claims:
        spec["resourceClaims"] = claims
        container.setdefault("resources", {})["claims"] = [{"name": c["name"]} for c in claims]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def powerdev_command(real_node: Node, config: Path, *options: str) -> list[str]:
    """`powerdev run` as the node's device plugin (and DRA driver): the
    kubelet's fixed device-plugins directory, its PodResources socket, the
    runtime's CDI spec directory, the node's name and the admin's kubeconfig."""
    return [
        sys.executable, "-m", "powerdev", "run",
        "--config", str(config),
        "--plugin-dir", str(node.DEVICE_PLUGINS),
        "--pod-resources-socket", str(real_node.pod_resources_socket),
        "--cdi-spec-dir", str(real_node.cdi_dir),
        "--node-name", real_node.name,
        "--kubeconfig", str(real_node.plane.kubeconfig),
        "--dra-plugins-dir", str(real_node.plugins),
        "--dra-registry-dir", str(real_node.plugins_registry),
        *options,
    ]  # fmt: skip


def all_registered(count: int, text: str) -> bool:
    """Whether powerdev's status file (text) says that the kubelet has
    registered each of its `count` resources."""
    try:
        states = json.loads(text)["resources"]
    except ValueError:
        return False
    return len(states) == count and all(s.get("state") == "registered" for s in states.values())


def device_class(name: str, resource: str, driver: str = DRIVER) -> dict:
    """A DeviceClass for the devices of one powerdev resource."""
    cel = f'device.driver == "{driver}" && device.attributes["{driver}"].resource == "{resource}"'
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": cel}}]},
    }


@contextlib.contextmanager
def loop_devices(tmp: Path, count: int, first: int = 0) -> Iterator[list[tuple[str, Path]]]:
    """`count` real loop devices (/dev/loop3NN), each bound to a 1 MiB file
    of zeros in tmp: [(node, backing file)]; unbound and removed on the way out."""
    with testing.loop_control() as control, contextlib.ExitStack() as stack:
        made = []
        for k in range(count):
            index = testing.FIRST_LOOP + first + k
            device = f"/dev/{control.add(index)}"
            backing = tmp / f"loop{index}.img"
            backing.write_bytes(bytes(1 << 20))
            stack.enter_context(testing.bound(device, backing))
            made.append((device, backing))
        yield made
