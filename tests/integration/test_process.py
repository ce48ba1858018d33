"""`powerdev run` as a real process: signals, exit codes, what stderr says."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from powerdev.devtools.fake_kubelet import FakeKubelet
from powerdev.devtools.testing import run_command
from powerdev.rpc import asyncio_door
from tests.conftest import make_dev_tree, wait_for_file

LIMIT = 20
RESOURCE = "power-dev-plugin/dev"


def powerdev_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "powerdev", *args]


async def test_sigterm_stops_serving_removes_the_socket_and_exits_0(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", ["dm-0", "dm-1"])
    config = tmp_path / "config.json"
    config.write_text('{"include-devices": ["/dev/dm-*"]}')
    plugin_dir = tmp_path / "device-plugins"
    for signum in (signal.SIGTERM, signal.SIGINT):
        with trio.fail_after(LIMIT):
            async with asyncio_door(), trio.open_nursery() as nursery:
                kubelet = FakeKubelet(plugin_dir)
                await nursery.start(kubelet.run)
                proc = await trio.lowlevel.open_process(run_command(plugin_dir, config, dev))
                try:
                    await kubelet.wait_until(
                        lambda k: RESOURCE in k.resources and k.resources[RESOURCE].updates
                    )
                    assert kubelet.resources[RESOURCE].capacity == 2
                    sock = plugin_dir / kubelet.resources[RESOURCE].endpoint
                    assert os.stat(sock).st_mode & 0o077 == 0  # the kubelet (root) only
                    proc.send_signal(signum)
                    with trio.fail_after(5):
                        assert await proc.wait() == 0
                    assert not sock.exists()
                    await kubelet.wait_until(lambda k: not k.resources[RESOURCE].connected)
                finally:
                    proc.kill()
                    await proc.wait()
                nursery.cancel_scope.cancel()


def run_with_config(tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    config = tmp_path / "config.json"
    config.write_text(text)
    return subprocess.run(
        powerdev_command("run", "--plugin-dir", str(tmp_path / "dp"), "--config", str(config)),
        capture_output=True,
        text=True,
        timeout=LIMIT,
        check=False,
    )


def test_a_broken_config_at_start_exits_non_zero_with_one_clear_line(tmp_path):
    for text, field in (
        ('{"permissions": "rwx"}', "'permissions'"),
        ('{"scan-interval": "soon"}', "'scan-interval'"),
        ('{"discovery-strategy": 1}', "'discovery-strategy'"),
    ):
        done = run_with_config(tmp_path, text)
        assert done.returncode == 2
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith(
            f"powerdev: bad config: {tmp_path / 'config.json'}: field {field}"
        )
    assert not (tmp_path / "dp").exists()  # nothing was served


def test_bad_json_and_bad_resource_name(tmp_path):
    done = run_with_config(tmp_path, "{not json")
    assert done.returncode == 2 and "not valid JSON (line 1, column 2" in done.stderr
    done = subprocess.run(
        powerdev_command(
            "run", "--resource-name", "nodomain", "--config", str(tmp_path / "none.json")
        ),
        capture_output=True,
        text=True,
        timeout=LIMIT,
        check=False,
    )
    assert done.returncode == 2
    assert "--resource-name: 'nodomain': an extended resource name needs a domain" in done.stderr


def test_a_dra_resource_needs_the_node_name_and_a_both_resource_cdi_for_device_fields(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    (tmp_path / "config.json").write_text('{"api": "dra"}')
    args = ("run", "--plugin-dir", str(tmp_path / "dp"), "--config", str(tmp_path / "config.json"))
    done = run_powerdev(*args, env=env)
    assert done.returncode == 2
    assert done.stderr.startswith("powerdev: bad config: --node-name: is needed by ")
    assert "NODE_NAME" in done.stderr
    done = run_powerdev(*args, "--dra-driver", "Not_A_Domain", env={**env, "NODE_NAME": "n1"})
    assert done.returncode == 2 and "--dra-driver: 'Not_A_Domain' is not a DNS" in done.stderr
    missing = str(tmp_path / "no-kubeconfig")
    done = run_powerdev(*args, "--kubeconfig", missing, env={**env, "NODE_NAME": "n1"})
    assert done.returncode == 2
    assert done.stderr.startswith(f"powerdev: bad config: --kubeconfig: {missing} cannot be used")
    deep = str(tmp_path / ("d" * 100))
    done = run_powerdev(*args, "--dra-registry-dir", deep, env={**env, "NODE_NAME": "n1"})
    assert done.returncode == 2 and "--dra-registry-dir: the socket path" in done.stderr
    (tmp_path / "config.json").write_text('{"api": "both"}')
    done = run_powerdev(*args, env=env)
    assert done.returncode == 2 and "--node-name: is needed by " in done.stderr
    (tmp_path / "config.json").write_text('{"api": "both", "device-gid": 6}')
    done = run_powerdev(*args, env={**env, "NODE_NAME": "n1"})
    assert done.returncode == 2 and "field 'device-gid'" in done.stderr
    assert 'set "cdi": true' in done.stderr  # so both APIs give the same gid
    assert not (tmp_path / "dp").exists()


def test_options_come_from_the_environment_too(tmp_path):
    env = {**os.environ, "POWERDEV_CONFIG": str(tmp_path / "config.json")}
    (tmp_path / "config.json").write_text('{"upper-limit": "many"}')
    done = subprocess.run(
        powerdev_command("run"), capture_output=True, text=True, timeout=LIMIT, check=False, env=env
    )
    assert done.returncode == 2 and "field 'upper-limit'" in done.stderr


def run_powerdev(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        powerdev_command(*args),
        capture_output=True,
        text=True,
        timeout=LIMIT,
        check=False,
        env={**os.environ, **(env or {})},
    )


def one_error_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) in (1, 2), done.stderr  # argparse adds its usage line
    assert "Traceback" not in done.stderr
    return lines[-1]


def test_bad_environment_values_are_one_line_and_exit_2_like_flags(tmp_path):
    config = str(tmp_path / "none.json")
    for name, value, option in (
        ("POWERDEV_LOG_LEVEL", "verbose", "--log-level"),
        ("POWERDEV_UEVENTS", "netlink", "--uevents"),
    ):
        from_env = one_error_line(run_powerdev("run", "--config", config, env={name: value}))
        from_flag = one_error_line(run_powerdev("run", "--config", config, option, value))
        assert from_env == from_flag
        assert option in from_env and repr(value) in from_env


def test_log_levels_are_the_same_in_any_case_from_flags_and_environment(tmp_path):
    from powerdev.cli import build_parser

    flag = build_parser().parse_args(["run", "--log-level", "INFO"])
    os.environ["POWERDEV_LOG_LEVEL"] = "INFO"
    try:
        env = build_parser().parse_args(["run"])
    finally:
        del os.environ["POWERDEV_LOG_LEVEL"]
    assert flag.log_level == env.log_level == "info"


def test_local_with_a_bad_or_missing_config_is_one_line(tmp_path):
    missing = one_error_line(run_powerdev("local", "--config", str(tmp_path / "no.json")))
    assert missing.startswith(f"powerdev: bad config: {tmp_path / 'no.json'}: does not exist")
    (tmp_path / "bad.json").write_text('{"permissions": "x"}')
    bad = one_error_line(run_powerdev("local", "--config", str(tmp_path / "bad.json")))
    assert "field 'permissions'" in bad


@pytest.mark.parametrize("api", ["dra", "both"])
def test_local_refuses_a_dra_resource_at_once_in_one_line(tmp_path, api):
    config = tmp_path / "config.json"
    entry = {"name": "example.com/a", "api": api, "include-devices": ["/dev/null"]}
    other = {"name": "example.com/b", "socket": "b.sock", "include-devices": ["/dev/zero"]}
    config.write_text(json.dumps({"resources": [other, entry]}))
    done = run_powerdev("local", "--config", str(config))
    assert done.returncode == 2
    line = one_error_line(done)
    assert line.startswith(
        f"powerdev: bad config: {config}: field 'resources[1].api': example.com/a says "
        f'"{api}": powerdev local runs a fake kubelet, with no API server for DRA; set '
        '"api": "device-plugin"'
    ), line


def test_a_socket_path_too_long_for_unix_sockets_is_refused_at_start(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    line = one_error_line(
        run_powerdev("run", "--plugin-dir", str(deep), "--config", str(tmp_path / "no.json"))
    )
    assert "over the 107 a unix socket path may have" in line
    assert "shorter --plugin-dir" in line


def health(status_file: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        powerdev_command("health", "--status-file", str(status_file), "--timeout", "5", *flags),
        capture_output=True,
        text=True,
        timeout=LIMIT,
        check=False,
    )


async def test_health_follows_the_daemon_from_waiting_to_registered_to_gone(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", ["dm-0"], target="/dev/null")
    config = tmp_path / "config.json"
    config.write_text('{"include-devices": ["/dev/dm-*"]}')
    plugin_dir, status = tmp_path / "device-plugins", tmp_path / "run" / "status.json"
    status.parent.mkdir()
    assert health(status).returncode == 1  # no daemon, no status
    with trio.fail_after(LIMIT):
        async with asyncio_door(), trio.open_nursery() as nursery:
            proc = await trio.lowlevel.open_process(
                run_command(
                    plugin_dir, config, dev, "--status-file", str(status), "--uevents", "off"
                )
            )
            try:
                await wait_for_file(status, lambda text: '"waiting"' in text)
                live, ready = await trio.to_thread.run_sync(
                    lambda: (health(status), health(status, "--ready"))
                )
                assert live.returncode == 0, live.stdout
                assert "waiting for the kubelet" in live.stdout
                assert ready.returncode == 1
                kubelet = FakeKubelet(plugin_dir)
                await nursery.start(kubelet.run)
                await kubelet.wait_until(lambda k: k.registrations == 1)
                await wait_for_file(status, lambda text: '"registered"' in text)
                ready = await trio.to_thread.run_sync(health, status, "--ready")
                assert ready.returncode == 0, ready.stdout
                assert "registered, socket" in ready.stdout
                assert "accepts connections" in ready.stdout
                proc.kill()  # gone without cleaning up: the status file and socket lie now
                await proc.wait()
                gone = await trio.to_thread.run_sync(health, status)
                assert gone.returncode == 1, gone.stdout
                assert f"left by process {proc.pid}, which is gone" in gone.stdout
            finally:
                proc.kill()
                await proc.wait()
            nursery.cancel_scope.cancel()


def test_health_imports_neither_trio_nor_grpc(tmp_path):
    probe = (
        "import sys\n"
        "from powerdev import cli\n"
        f"cli.main(['health', '--status-file', {str(tmp_path / 'none.json')!r}])\n"
        "heavy = ('trio', 'trio_asyncio', 'grpclib', 'betterproto', 'pyudev', 'google')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == "[]"


async def test_the_daemon_serving_imports_no_fake_kubelet(tmp_path):
    """RSS: `powerdev run`, registered and having answered an Allocate, has
    never imported `powerdev local`'s fake kubelet or the kubelet's side of
    the API; with no resource that says "api": "dra", nor lightkube and the
    DRA driver's services."""
    dev = make_dev_tree(tmp_path / "dev", ["dm-0"], target="/dev/null")
    config = tmp_path / "config.json"
    config.write_text('{"include-devices": ["/dev/dm-*"]}')
    plugin_dir = tmp_path / "device-plugins"
    args = run_command(plugin_dir, config, dev)[3:]  # after: python -m powerdev
    unwanted = (
        "powerdev.devtools.local",
        "powerdev.devtools.fake_kubelet",
        "powerdev.rpc.kubelet_side",
        "powerdev.rpc.dra_service",
        "powerdev.dra.kubeapi",
        "powerdev.dra.claims",
        "lightkube",
        "httpx2",
    )
    script = (
        "import sys\n"
        "from powerdev import cli\n"
        f"cli.main({args!r})\n"
        f"unwanted = {unwanted!r}\n"
        "print(sorted(m for m in sys.modules if m.startswith(unwanted)))\n"
    )
    with trio.fail_after(LIMIT):
        async with asyncio_door(), trio.open_nursery() as nursery:
            kubelet = FakeKubelet(plugin_dir)
            await nursery.start(kubelet.run)
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-c", script], stdout=subprocess.PIPE
            )
            try:
                await kubelet.wait_until(
                    lambda k: RESOURCE in k.resources and k.resources[RESOURCE].updates
                )
                allocated = await kubelet.allocate(RESOURCE, ["dm-0"])
                assert [d.host_path for d in allocated.devices] == ["/dev/dm-0"]
                proc.send_signal(signal.SIGTERM)
                assert proc.stdout is not None
                printed = b""
                while chunk := await proc.stdout.receive_some():
                    printed += chunk
                assert await proc.wait() == 0
            finally:
                proc.kill()
                await proc.wait()
            nursery.cancel_scope.cancel()
    assert printed.decode().strip().splitlines()[-1] == "[]"
