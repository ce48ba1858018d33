"""One AdmissionReview (admission.k8s.io/v1) in, one answer out.

A body that is not an AdmissionReview we can answer (not JSON, another
apiVersion or kind, no request or uid) raises BadReview: the server sends an
HTTP error status, and with failurePolicy Ignore the API server admits the
pod unmodified and logs the failure. A review we can answer is always
answered allowed: true (this webhook never denies), with the patch, or with
no patch and a status message saying why.
"""

from __future__ import annotations

import base64
import json
import logging

from powerdev.webhook.config import WebhookConfig
from powerdev.webhook.patch import BadPod, decide

log = logging.getLogger(__name__)
API_VERSION = "admission.k8s.io/v1"
POD_KIND = {"group": "", "version": "v1", "kind": "Pod"}
POD_RESOURCE = {"group": "", "version": "v1", "resource": "pods"}


class BadReview(ValueError):
    """Not an AdmissionReview that can be answered; str() says why."""


def parse(body: bytes) -> dict:
    """The review's request object, checked for what an answer needs."""
    try:
        review = json.loads(body.decode("utf-8"))  # bytes alone would let json guess UTF-16
    except UnicodeDecodeError:
        raise BadReview("the body is not UTF-8 JSON") from None
    except ValueError as err:
        raise BadReview(f"the body is not JSON ({err})") from None
    except RecursionError:
        raise BadReview("the body is JSON nested too deeply") from None
    if not isinstance(review, dict):
        raise BadReview("the body is not a JSON object")
    if review.get("apiVersion") != API_VERSION or review.get("kind") != "AdmissionReview":
        raise BadReview(
            f"expected apiVersion {API_VERSION} kind AdmissionReview, got "
            f"{review.get('apiVersion')!r} {review.get('kind')!r}"
        )
    request = review.get("request")
    if not isinstance(request, dict):
        raise BadReview("the AdmissionReview has no request object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("the AdmissionReview's request has no uid")
    return request


def _answer(uid: str, patch: list[dict] | None, message: str | None) -> dict:
    response: dict[str, object] = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(
            json.dumps(patch, separators=(",", ":")).encode()
        ).decode()
    elif message:
        response["status"] = {"message": message}
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def unmodified(uid: str, message: str) -> dict:
    """Allowed as it is, with the reason in the response's status."""
    return _answer(uid, None, message)


def answer(request: dict, config: WebhookConfig, *, own_namespace: str) -> dict:
    """The AdmissionReview to send back for a parsed request. Never raises for
    anything in the request: what cannot be read is answered unmodified."""
    uid = request["uid"]
    namespace = request.get("namespace")
    dry = " (dry run)" if request.get("dryRun") is True else ""
    what = f"pod {namespace}/{_pod_name(request)}{dry}"
    if request.get("kind") != POD_KIND or request.get("resource") != POD_RESOURCE:
        return _left_alone(uid, what, "the request is not for a v1 Pod", warn=True)
    if request.get("subResource"):
        return _left_alone(uid, what, f"subresource {request['subResource']!r} is not mutated")
    if request.get("operation") != "CREATE":
        return _left_alone(uid, what, f"operation {request.get('operation')!r} is not CREATE")
    if not isinstance(namespace, str) or not namespace:
        return _left_alone(uid, what, "the request names no namespace", warn=True)
    try:
        decision = decide(request.get("object"), namespace, config, own_namespace=own_namespace)
    except BadPod as err:
        return _left_alone(uid, what, f"the pod cannot be read: {err}", warn=True)
    if not decision.patch:
        return _left_alone(uid, what, decision.reason)
    # Dry run: the same answer. The patch is the answer, not a side effect, and
    # this webhook has none (sideEffects: None): it writes nothing anywhere.
    log.info("%s: added %s", what, decision.reason)
    return _answer(uid, decision.patch, None)


def _left_alone(uid: str, what: str, reason: str, *, warn: bool = False) -> dict:
    log.log(logging.WARNING if warn else logging.DEBUG, "%s left alone: %s", what, reason)
    return _answer(uid, None, reason)


def _pod_name(request: dict) -> str:
    name = request.get("name")
    if isinstance(name, str) and name:
        return name
    obj = request.get("object")
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if isinstance(meta, dict) and isinstance(meta.get("generateName"), str):
        return meta["generateName"] + "*"
    return "?"
