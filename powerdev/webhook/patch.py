"""Which containers of a pod get the resource, and the JSONPatch that adds it.

Pure functions over the pod as the API server sends it (plain JSON data).
The namespace's labels are not in an AdmissionReview: the namespace choice
is the MutatingWebhookConfiguration's namespaceSelector, evaluated by the
API server. Here: the namespaces never touched, the pod's labels and
annotations, the containers, and a patch that is right for every shape of
`resources` (absent, null, without limits, with other keys).
"""

from __future__ import annotations

from dataclasses import dataclass

from powerdev.webhook.config import WebhookConfig

INJECT_ANNOTATION = "power-dev-plugin/inject"
CONTAINERS_ANNOTATION = "power-dev-plugin/containers"
PROTECTED_NAMESPACES = ("kube-system", "openshift")  # and every openshift-* namespace


class BadPod(ValueError):
    """The object is not a pod we can read; str() says what is wrong."""


@dataclass(frozen=True)
class Decision:
    patch: list[dict[str, object]]
    reason: str  # why this patch, or why none: for the log and the response's status


def escape(token: str) -> str:
    """A JSON Pointer reference token (RFC 6901): '~' is '~0', '/' is '~1'."""
    return token.replace("~", "~0").replace("/", "~1")


def protected(namespace: str, own_namespace: str) -> bool:
    return (
        namespace == own_namespace
        or namespace in PROTECTED_NAMESPACES
        or namespace.startswith("openshift-")
    )


def _mapping(obj: dict, key: str, where: str) -> dict:
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadPod(f"{where}.{key} is not an object")
    return value


def _containers(spec: dict, key: str) -> list[dict]:
    value = spec.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(
        isinstance(c, dict) and isinstance(c.get("name"), str) for c in value
    ):
        raise BadPod(f"spec.{key} is not a list of named containers")
    return value


def container_ops(base: str, container: dict, resource: str, quantity: str) -> list[dict]:
    """The operations that give one container `quantity` of `resource` in both
    limits and requests, or none if it already asks for the resource."""
    resources = container.get("resources")
    if resources is None:
        amount = {resource: quantity}
        return [
            {
                "op": "add",
                "path": f"{base}/resources",
                "value": {"limits": dict(amount), "requests": dict(amount)},
            }
        ]
    if not isinstance(resources, dict):
        raise BadPod(f"container {container['name']!r}: resources is not an object")
    parts = {}
    for key in ("limits", "requests"):
        part = resources.get(key)
        if part is not None and not isinstance(part, dict):
            raise BadPod(f"container {container['name']!r}: resources.{key} is not an object")
        if part is not None and resource in part:
            return []  # it asks already: its owner's numbers stand
        parts[key] = part
    ops = []
    for key, part in parts.items():
        if part is None:  # absent or null: "add" creates it (or replaces the null)
            ops.append(
                {"op": "add", "path": f"{base}/resources/{key}", "value": {resource: quantity}}
            )
        else:
            ops.append(
                {
                    "op": "add",
                    "path": f"{base}/resources/{key}/{escape(resource)}",
                    "value": quantity,
                }
            )
    return ops


def decide(pod: object, namespace: str, config: WebhookConfig, *, own_namespace: str) -> Decision:
    """The patch for a pod being created in `namespace`. Raises BadPod."""
    if protected(namespace, own_namespace):
        return Decision([], f"namespace {namespace!r} is never mutated")
    if not isinstance(pod, dict):
        raise BadPod("the object is not a JSON object")
    metadata = _mapping(pod, "metadata", "pod")
    labels = _mapping(metadata, "labels", "metadata")
    annotations = _mapping(metadata, "annotations", "metadata")
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise BadPod("the pod has no spec object")
    inject = annotations.get(INJECT_ANNOTATION)
    if inject == "false":
        return Decision([], f"the pod is annotated {INJECT_ANNOTATION}: false")
    if config.require_annotation and inject != "true":
        return Decision([], f"the pod is not annotated {INJECT_ANNOTATION}: true")
    missing = [f"{k}={v}" for k, v in config.pod_labels if labels.get(k) != v]
    if missing:
        return Decision([], f"the pod lacks the labels {', '.join(missing)}")

    wanted: set[str] | None = None
    names = annotations.get(CONTAINERS_ANNOTATION)
    if isinstance(names, str):
        wanted = {name.strip() for name in names.split(",") if name.strip()}
    quantity = str(config.count)
    ops: list[dict] = []
    given: list[str] = []
    kinds = ["containers", "initContainers"] if config.init_containers else ["containers"]
    for kind in kinds:
        for index, container in enumerate(_containers(spec, kind)):
            if wanted is not None and container["name"] not in wanted:
                continue
            more = container_ops(f"/spec/{kind}/{index}", container, config.resource, quantity)
            if more:
                ops.extend(more)
                given.append(container["name"])
    if not ops:
        return Decision([], "no chosen container lacks the resource")
    return Decision(ops, f"{config.resource}: {quantity} for {', '.join(given)}")
