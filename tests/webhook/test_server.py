"""The webhook in-process on a real TLS socket (test CA), asked by a real
HTTP client (httpx, HTTP/1.1, with HTTP/2 offered or not): patches, pods left alone, dry run,
bad requests, config and key-pair reloads. Each test bounded by fail_after."""

import base64
import json
import os
import ssl

import h11
import httpx
import jsonpatch
import pytest
import trio

from tests.webhook.conftest import (
    LIMIT,
    NAMESPACE,
    RESOURCE,
    client,
    client_context,
    container,
    deployment_pod,
    pair_files,
    post_review,
    review,
    settings_for,
    sha256_of,
    webhook_in_process,
)


def patched(response: dict, pod: dict) -> dict:
    assert response["patchType"] == "JSONPatch"
    return jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))


def limits_of(pod: dict) -> list[dict]:
    return [(c.get("resources") or {}).get("limits") for c in pod["spec"]["containers"]]


@pytest.mark.parametrize("http2", [False, True], ids=["http1.1", "h2-offered"])
async def test_a_deployment_pod_gets_the_resource(tmp_path, ca, secret, http2):
    """A client that offers HTTP/2 too (as the API server does) is answered
    in HTTP/1.1, the one protocol the server offers (ALPN)."""
    with trio.fail_after(LIMIT):
        async with (
            webhook_in_process(settings_for(tmp_path, secret)) as serving,
            client(ca, serving.url, http2=http2) as http,
        ):
            pod = deployment_pod(container("db"), container("log", {"limits": {"cpu": "1"}}))
            answer = await http.post("/mutate", json=review(pod))
            assert answer.http_version == "HTTP/1.1"
            response = answer.json()["response"]
            assert response["allowed"] is True
            assert limits_of(patched(response, pod)) == [
                {RESOURCE: "1"},
                {"cpu": "1", RESOURCE: "1"},
            ]


async def test_pods_and_namespaces_left_alone_get_allowed_without_a_patch(tmp_path, ca, secret):
    cases = [
        (deployment_pod(container("a")), NAMESPACE, "never mutated"),
        (deployment_pod(container("a")), "kube-system", "never mutated"),
        (deployment_pod(container("a")), "openshift-ingress", "never mutated"),
        (
            deployment_pod(container("a"), annotations={"power-dev-plugin/inject": "false"}),
            "team-a",
            "annotated power-dev-plugin/inject: false",
        ),
        (
            deployment_pod(container("a", {"limits": {RESOURCE: "1"}})),
            "team-a",
            "no chosen container",
        ),
    ]
    with trio.fail_after(LIMIT):
        async with (
            webhook_in_process(settings_for(tmp_path, secret)) as serving,
            client(ca, serving.url) as http,
        ):
            for pod, namespace, reason in cases:
                response = await post_review(http, review(pod, namespace))
                assert "patch" not in response and "patchType" not in response
                assert reason in response["status"]["message"]


async def test_dry_run_gets_the_same_patch(tmp_path, ca, secret):
    pod = deployment_pod(container("db"))
    with trio.fail_after(LIMIT):
        async with (
            webhook_in_process(settings_for(tmp_path, secret)) as serving,
            client(ca, serving.url) as http,
        ):
            real = await post_review(http, review(pod))
            dry = await post_review(http, review(pod, dryRun=True))
            assert dry["patch"] == real["patch"]


async def test_requests_that_are_not_pod_creations_are_allowed_unmodified(tmp_path, ca, secret):
    pod = deployment_pod(container("db"))
    cases = [
        (review(pod, operation="UPDATE"), "operation 'UPDATE' is not CREATE"),
        (review(pod, subResource="ephemeralcontainers"), "subresource"),
        (
            review(pod, kind={"group": "apps", "version": "v1", "kind": "Deployment"}),
            "not for a v1 Pod",
        ),
        (review(None), "the pod cannot be read: the object is not a JSON object"),
        (review({"metadata": {}}), "the pod cannot be read: the pod has no spec object"),
        (review(pod, namespace=None), "names no namespace"),
    ]
    with trio.fail_after(LIMIT):
        async with (
            webhook_in_process(settings_for(tmp_path, secret)) as serving,
            client(ca, serving.url) as http,
        ):
            for body, reason in cases:
                response = await post_review(http, body)
                assert "patch" not in response
                assert reason in response["status"]["message"]


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


async def test_bad_requests_get_an_error_status_and_the_server_keeps_serving(tmp_path, ca, secret):
    settings = settings_for(tmp_path, secret, max_body=64 * 1024)
    ok = review(deployment_pod(container("db")))
    huge = json.dumps(review(deployment_pod(container("x" * 70_000)))).encode()
    json_type = {"content-type": "application/json"}

    async def chunks():
        for _ in range(100):
            yield b" " * 1024  # no Content-Length: the bound holds on the bytes themselves

    cases = [
        ("POST", "/mutate", {"content": b"not json", "headers": json_type}, 400, "not JSON"),
        ("POST", "/mutate", {"content": b"\xff\xfe{}", "headers": json_type}, 400, "not UTF-8"),
        ("POST", "/mutate", {"content": _nested(20_000), "headers": json_type}, 400, "nested"),
        ("POST", "/mutate", {"json": [ok]}, 400, "not a JSON object"),
        ("POST", "/mutate", {"json": {**ok, "kind": "Pod"}}, 400, "kind AdmissionReview"),
        (
            "POST",
            "/mutate",
            {"json": {**ok, "apiVersion": "admission.k8s.io/v1beta1"}},
            400,
            "expected apiVersion admission.k8s.io/v1",
        ),
        ("POST", "/mutate", {"json": {**ok, "request": None}}, 400, "no request object"),
        (
            "POST",
            "/mutate",
            {"json": {**ok, "request": {**ok["request"], "uid": ""}}},
            400,
            "no uid",
        ),
        ("POST", "/mutate", {"content": json.dumps(ok)}, 415, "application/json"),
        (
            "POST",
            "/mutate",
            {"content": json.dumps(ok), "headers": {"content-type": "text/plain"}},
            415,
            "application/json",
        ),
        ("POST", "/mutate", {"content": huge, "headers": json_type}, 413, "larger than 65536"),
        ("POST", "/mutate", {"content": chunks(), "headers": json_type}, 413, "larger than"),
        ("GET", "/mutate", {}, 405, "use POST"),
        ("POST", "/healthz", {}, 405, "use GET"),
        ("GET", "/", {}, 404, "serves /mutate"),
    ]
    with trio.fail_after(LIMIT):
        async with webhook_in_process(settings) as serving:
            for method, path, kwargs, status, words in cases:
                async with client(ca, serving.url) as http:  # a 413 may close the connection
                    answer = await http.request(method, path, **kwargs)
                assert answer.status_code == status, (path, kwargs.get("json"), answer.text)
                assert words in answer.text, answer.text
            async with client(ca, serving.url) as http:
                assert (await http.get("/healthz")).text == "ok\n"
                assert (await http.get("/readyz")).status_code == 200
                assert "patch" in await post_review(http, ok)


async def test_a_body_declared_far_too_large_is_refused_before_it_is_sent(tmp_path, ca, secret):
    """Headers only, Content-Length 1 GB: the answer comes at once, nothing is read."""
    settings = settings_for(tmp_path, secret, max_body=64 * 1024)
    with trio.fail_after(LIMIT):
        async with webhook_in_process(settings) as serving:
            host, port = serving.url.removeprefix("https://").rsplit(":", 1)
            context = client_context(ca)
            context.set_alpn_protocols(["http/1.1"])
            stream = await trio.open_ssl_over_tcp_stream(host, int(port), ssl_context=context)
            connection = h11.Connection(h11.CLIENT)
            request = h11.Request(
                method="POST",
                target="/mutate",
                headers=[
                    ("host", host),
                    ("content-type", "application/json"),
                    ("content-length", str(1 << 30)),
                ],
            )
            await stream.send_all(connection.send(request))
            event = h11.NEED_DATA
            while event is h11.NEED_DATA:
                connection.receive_data(await stream.receive_some(65536))
                event = connection.next_event()
            assert isinstance(event, h11.Response) and event.status_code == 413
            await stream.aclose()


async def test_config_changes_apply_and_a_bad_one_keeps_the_last_good(tmp_path, ca, secret):
    settings = settings_for(tmp_path, secret)
    config = settings.config_path
    config.write_text('{"count": 2}')
    pod = deployment_pod(container("db"))

    def replace(text: str) -> None:  # as an editor or a ConfigMap update does: a rename
        tmp = config.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, config)

    with trio.fail_after(LIMIT):
        async with (
            webhook_in_process(settings) as serving,
            client(ca, serving.url) as http,
        ):
            assert limits_of(patched(await post_review(http, review(pod)), pod)) == [
                {RESOURCE: "2"}
            ]
            replace('{"count": 3, "pod-labels": {"app": "db"}}')
            await serving.holder.wait_until(lambda h: h.applied == 2)
            assert limits_of(patched(await post_review(http, review(pod)), pod)) == [
                {RESOURCE: "3"}
            ]
            replace('{"count": "many"}')
            await serving.holder.wait_until(lambda h: h.rejected == 1)
            assert limits_of(patched(await post_review(http, review(pod)), pod)) == [
                {RESOURCE: "3"}
            ]
            config.unlink()
            await serving.holder.wait_until(lambda h: h.rejected == 2)
            assert serving.holder.config.count == 3


async def _served_fingerprint(url: str, context: ssl.SSLContext) -> str:
    host, port = url.removeprefix("https://").rsplit(":", 1)
    stream = await trio.open_ssl_over_tcp_stream(host, int(port), ssl_context=context)
    try:
        await stream.do_handshake()
        import hashlib

        return hashlib.sha256(stream.getpeercert(binary_form=True)).hexdigest()
    finally:
        await stream.aclose()


async def test_the_key_pair_is_reloaded_when_the_secret_changes(tmp_path, ca, secret):
    first = sha256_of_current = None
    import trustme

    new_ca = trustme.CA()
    new_cert = new_ca.issue_cert("127.0.0.1")
    with trio.fail_after(LIMIT):
        async with webhook_in_process(settings_for(tmp_path, secret)) as serving:
            first = await _served_fingerprint(serving.url, client_context(ca))
            sha256_of_current = serving.keys.fingerprint
            assert first == sha256_of_current
            async with client(ca, serving.url) as old_connection:
                assert (await old_connection.get("/healthz")).status_code == 200

                secret.write(pair_files(new_cert))  # the kubelet's ..data swap
                await serving.keys.wait_until(lambda k: k.loads == 2)
                assert await _served_fingerprint(serving.url, client_context(new_ca)) == sha256_of(
                    new_cert
                )
                with pytest.raises(httpx.ConnectError):  # new handshakes: the old CA fails
                    async with client(ca, serving.url) as http:
                        await http.get("/healthz")
                async with client(new_ca, serving.url) as http:
                    response = await post_review(http, review(deployment_pod(container("a"))))
                    assert "patch" in response
                # a connection opened before keeps working
                assert (await old_connection.get("/healthz")).status_code == 200

            # a broken pair (a certificate with another key) is refused; the last good serves on
            other = new_ca.issue_cert("127.0.0.1")
            secret.write({"tls.crt": pair_files(other)["tls.crt"], "tls.key": b"not a key"})
            await serving.keys.wait_until(lambda k: k.failures == 1)
            assert await _served_fingerprint(serving.url, client_context(new_ca)) == sha256_of(
                new_cert
            )
            mismatched = pair_files(new_ca.issue_cert("127.0.0.1"))
            secret.write(
                {"tls.crt": mismatched["tls.crt"], "tls.key": pair_files(other)["tls.key"]}
            )
            await serving.keys.wait_until(lambda k: k.failures == 2)
            assert await _served_fingerprint(serving.url, client_context(new_ca)) == sha256_of(
                new_cert
            )


async def test_requests_sent_together_on_a_kept_alive_connection_are_each_answered(
    tmp_path, ca, secret
):
    """Three requests in one write (HTTP/1.1 pipelining): three answers, in order."""
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with trio.fail_after(LIMIT):
        async with webhook_in_process(settings_for(tmp_path, secret)) as serving:
            host, port = serving.url.removeprefix("https://").rsplit(":", 1)
            context = client_context(ca)
            context.set_alpn_protocols(["http/1.1"])
            stream = await trio.open_ssl_over_tcp_stream(host, int(port), ssl_context=context)
            await stream.send_all(request * 2 + b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n")
            connection = h11.Connection(h11.CLIENT)
            seen = []
            for _ in range(3):  # h11 reads an answer to a request it has sent
                connection.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
                connection.send(h11.EndOfMessage())
                status = None
                while True:
                    event = connection.next_event()
                    if event is h11.NEED_DATA:
                        connection.receive_data(await stream.receive_some(65536))
                    elif isinstance(event, h11.Response):
                        status = event.status_code
                    elif isinstance(event, h11.EndOfMessage):
                        break
                connection.start_next_cycle()
                seen.append(status)
            assert seen == [200, 200, 404]
            await stream.aclose()
