"""webhook.json, parsed into frozen settings: which pods, which containers,
what to add. Pure functions; the server decides when to read the file. Every
error names the file, the field and the fix."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from powerdev.config import (
    DEFAULT_RESOURCE_NAME,
    ConfigError,
    decode_config,
    resource_name_problem,
)

DEFAULT_WEBHOOK_CONFIG = "/etc/powerdev-webhook/config/webhook.json"
# The command's other defaults, kept here because this module is light to import.
DEFAULT_LISTEN = "0.0.0.0:8443"
DEFAULT_CERT_DIR = "/etc/powerdev-webhook/tls"
DEFAULT_NAMESPACE = "power-device-plugin"
# A pod object is at most about 1.5 MiB (etcd's request limit); its review,
# JSON-escaped, fits in 3 MiB with room to spare.
DEFAULT_MAX_BODY = 3 * 1024 * 1024
# The API server keeps a few connections to each replica and waits at most
# 30 s (timeoutSeconds; 5 in deploy/webhook) for an answer.
DEFAULT_MAX_CONNECTIONS = 128
DEFAULT_REQUEST_SECONDS = 10.0
DEFAULT_HANDSHAKE_SECONDS = 5.0
MAX_COUNT = 1024  # far more units than one container could use; a typo, not a plan
MAX_POD_LABELS = 64

_DNS_LABEL_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-.")
_NAME_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.")

FIELDS = {
    "resource": "the extended resource to add, like power-dev-plugin/dev",
    "count": "how many units each chosen container gets",
    "pod-labels": "labels a pod must carry (all of them) to be chosen",
    "require-annotation": 'true: only pods annotated power-dev-plugin/inject: "true"',
    "init-containers": "also give the resource to init containers",
}


@dataclass(frozen=True)
class WebhookConfig:
    source: str = field(default="defaults", compare=False)
    resource: str = DEFAULT_RESOURCE_NAME
    count: int = 1
    pod_labels: tuple[tuple[str, str], ...] = ()
    require_annotation: bool = False
    init_containers: bool = False

    def describe(self) -> str:
        labels = ",".join(f"{k}={v}" for k, v in self.pod_labels) or "any"
        return (
            f"resource {self.resource} x{self.count}, pod labels {labels}, "
            f"require annotation {str(self.require_annotation).lower()}, "
            f"init containers {str(self.init_containers).lower()}"
        )


def label_key_problem(key: str) -> str | None:
    """Why `key` cannot be a Kubernetes label key, or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and (
        not prefix
        or len(prefix) > 253
        or not set(prefix) <= _DNS_LABEL_CHARS
        or prefix[0] in "-."
        or prefix[-1] in "-."
    ):
        return f"prefix {prefix!r} is not a lowercase DNS subdomain"
    return label_value_problem(name, empty_ok=False)


def label_value_problem(value: str, *, empty_ok: bool = True) -> str | None:
    if not value:
        return None if empty_ok else "a name part is needed"
    if len(value) > 63:
        return f"{value!r} is longer than 63 characters"
    if not set(value) <= _NAME_CHARS or not value[0].isalnum() or not value[-1].isalnum():
        return (
            f"{value!r} must be letters, digits, '-', '_' or '.', starting and ending alphanumeric"
        )
    return None


def parse_webhook_config(text: str, *, source: str) -> WebhookConfig:
    """Parse webhook.json text (empty means the defaults). Raises ConfigError."""
    if not text.strip():
        return WebhookConfig(source=source)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as err:
        where = f" (line {err.lineno}, column {err.colno})" if hasattr(err, "lineno") else ""
        raise ConfigError(source, None, f"is not JSON{where}", "write one JSON object") from None
    if not isinstance(data, dict):
        raise ConfigError(source, None, "is not a JSON object", 'write {"resource": ..., ...}')
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise ConfigError(
            source,
            unknown[0],
            "is not a field of webhook.json",
            "use only " + ", ".join(FIELDS),
        )
    values: dict[str, object] = {}

    resource = data.get("resource", DEFAULT_RESOURCE_NAME)
    if not isinstance(resource, str):
        raise ConfigError(source, "resource", "must be a string", 'like "power-dev-plugin/dev"')
    problem = resource_name_problem(resource)
    if problem:
        raise ConfigError(source, "resource", f"{resource!r}: {problem}", "fix the name")
    values["resource"] = resource

    count = data.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_COUNT:
        raise ConfigError(
            source, "count", f"{count!r} is not a whole number from 1 to {MAX_COUNT}", "like 1"
        )
    values["count"] = count

    labels = data.get("pod-labels", {})
    if not isinstance(labels, dict) or len(labels) > MAX_POD_LABELS:
        raise ConfigError(
            source,
            "pod-labels",
            f"must be an object of at most {MAX_POD_LABELS} labels",
            'like {"app": "db"}, or {} for every pod',
        )
    for key, value in labels.items():
        if not isinstance(value, str):
            raise ConfigError(
                source, "pod-labels", f"the value of {key!r} is not a string", 'quote it: "true"'
            )
        problem = label_key_problem(key) or label_value_problem(value)
        if problem:
            raise ConfigError(source, "pod-labels", problem, "use a valid Kubernetes label")
    values["pod_labels"] = tuple(sorted(labels.items()))

    for name, attr in (
        ("require-annotation", "require_annotation"),
        ("init-containers", "init_containers"),
    ):
        flag = data.get(name, False)
        if not isinstance(flag, bool):
            raise ConfigError(source, name, f"{flag!r} is not true or false", "write true or false")
        values[attr] = flag
    return WebhookConfig(source=source, **values)  # type: ignore[arg-type]


def load_webhook_config(path: Path) -> WebhookConfig:
    """Read and parse the file; a missing file means the defaults."""
    try:
        text = decode_config(path.read_bytes(), str(path))
    except FileNotFoundError:
        return WebhookConfig(source=f"{path} (missing: defaults)")
    except IsADirectoryError:
        raise ConfigError(
            str(path), None, "is a directory", "point --config at webhook.json inside it"
        ) from None
    except OSError as err:
        raise ConfigError(
            str(path), None, f"cannot be read ({err})", "check the file and its permissions"
        ) from None
    return parse_webhook_config(text, source=str(path))
