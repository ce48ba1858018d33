"""`powerdev webhook` as a real process, as a user runs it: it says when it
serves (a ready line on stderr, which the tests read instead of dialling),
answers over TLS, follows a Secret's ..data swap and a config change (each
seen in its log), exits 0 on SIGTERM and 2 with one clear line at a bad start."""

import base64
import json
import signal
import socket
import subprocess
import sys

import jsonpatch
import trio
import trustme

from tests.webhook.conftest import (
    LIMIT,
    RESOURCE,
    client,
    container,
    deployment_pod,
    pair_files,
    post_review,
    review,
    settings_for,
    sha256_of,
    webhook_command,
    webhook_process,
)


async def test_the_process_serves_reloads_and_stops_on_sigterm(tmp_path, ca, secret):
    settings = settings_for(tmp_path, secret)
    settings.config_path.write_text('{"count": 2}')
    pod = deployment_pod(container("db", {"limits": {"cpu": "1"}}))
    new_ca = trustme.CA()
    new_cert = new_ca.issue_cert("127.0.0.1")
    with trio.fail_after(LIMIT):
        async with webhook_process(settings) as running:
            async with client(ca, running.url) as http:
                response = await post_review(http, review(pod))
            after = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
            assert after["spec"]["containers"][0]["resources"] == {
                "limits": {"cpu": "1", RESOURCE: "2"},
                "requests": {RESOURCE: "2"},
            }

            mark = len(running.stderr.lines)
            settings.config_path.write_text('{"count": 4}')
            await running.stderr.wait_for(lambda line: "webhook config applied" in line, mark)
            mark = len(running.stderr.lines)
            settings.config_path.write_text('{"count": -1}')
            _, line = await running.stderr.wait_for(lambda line: "not applied" in line, mark)
            assert f"{settings.config_path}: field 'count'" in line
            async with client(ca, running.url) as http:
                response = await post_review(http, review(pod))
            assert '"4"' in base64.b64decode(response["patch"]).decode()

            mark = len(running.stderr.lines)
            secret.write(pair_files(new_cert))
            await running.stderr.wait_for(lambda line: sha256_of(new_cert) in line, mark)
            async with client(new_ca, running.url, http2=True) as http:
                assert "patch" in await post_review(http, review(pod))

            running.proc.send_signal(signal.SIGTERM)
            assert await running.proc.wait() == 0


def _start(tmp_path, settings, *more):
    return subprocess.run(
        webhook_command(settings, *more),
        capture_output=True,
        text=True,
        timeout=LIMIT,
        check=False,
        cwd=tmp_path,
    )


def test_a_bad_start_exits_2_with_one_line_naming_the_file_and_fix(tmp_path, ca, secret):
    settings = settings_for(tmp_path, secret)
    settings.config_path.write_text('{"count": 1, "init-container": true}')
    done = _start(tmp_path, settings)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"powerdev webhook: bad config: {settings.config_path}: field 'init-container': "
        "is not a field of webhook.json; use only resource, count, pod-labels, "
        "require-annotation, init-containers"
    ]

    settings.config_path.write_text("{}")
    missing = settings_for(tmp_path, secret, cert_dir=tmp_path / "nowhere")
    done = _start(tmp_path, missing)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"powerdev webhook: bad key pair: {tmp_path / 'nowhere' / 'tls.crt'}")
    assert "mount the webhook's TLS Secret" in line

    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "tls.crt").write_text("not a certificate")
    (tmp_path / "bad" / "tls.key").write_text("not a key")
    done = _start(tmp_path, settings_for(tmp_path, secret, cert_dir=tmp_path / "bad"))
    assert done.returncode == 2
    assert "not a PEM certificate and its key" in done.stderr

    done = _start(tmp_path, settings, "--max-body", "10")
    assert (done.returncode, done.stderr.strip()) == (
        2,
        "powerdev webhook: --max-body 10: too small for any review; use at least 1024",
    )
    for option, value, words in [
        ("--max-connections", "0", "--max-connections 0: use 1 to 65536"),
        ("--request-seconds", "0", "--request-seconds 0: use more than 0, at most 300"),
        ("--handshake-seconds", "-1", "--handshake-seconds -1: use more than 0, at most 60"),
    ]:
        done = _start(tmp_path, settings, option, value)
        assert (done.returncode, done.stderr.strip()) == (2, f"powerdev webhook: {words}")

    with socket.create_server(("127.0.0.1", 0)) as taken:
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        done = _start(tmp_path, settings_for(tmp_path, secret, listen=address))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"powerdev webhook: --listen: cannot listen on {address}: Address already in use; "
        "choose a free port and an address of this host"
    ]


def test_the_webhook_command_does_not_import_the_daemon_stack():
    """The webhook needs neither asyncio's door nor the device code."""
    code = (
        "import sys; from powerdev.cli import build_parser; build_parser();"
        "import powerdev.webhook.server;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('grpclib', 'trio_asyncio', 'betterproto', 'pyudev') or m.startswith('powerdev.rpc')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=LIMIT, check=True
    )
    assert done.stdout.strip() == "[]"
