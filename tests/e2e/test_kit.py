"""Finding the kit's binaries: the environment variable first, then
conformance/bin/; a missing tool skips with one line naming it and the build
command, and fails instead when CI is "true". And what the control plane's
start does when a process fails (with stand-in scripts, no kit needed)."""

import pytest
import trio

from powerdev.devtools import kit
from powerdev.devtools.cluster import controlplane
from tests.controlplane_fixtures import NEEDED, require_tools


def executable(path):
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_the_variable_comes_first_and_is_the_only_place_looked_at(tmp_path):
    tool = executable(tmp_path / "my-apiserver")
    assert kit.find("kube-apiserver", {"POWERDEV_KUBE_APISERVER": str(tool)}) == tool
    gone = {"POWERDEV_KUBE_APISERVER": str(tmp_path / "nothing")}
    assert kit.find("kube-apiserver", gone) is None
    assert kit.where("kube-apiserver", gone) == (
        f"$POWERDEV_KUBE_APISERVER={tmp_path / 'nothing'} is not an executable file"
    )
    (tmp_path / "plain").write_text("not executable")
    assert kit.find("etcd", {"POWERDEV_ETCD": str(tmp_path / "plain")}) is None


def test_without_the_variable_the_checkouts_bin_is_used():
    path = kit.find("kubectl", {})
    expected = kit.KIT_BIN / "kubectl"
    assert path == (expected if expected.is_file() else None)
    assert kit.where("kubectl", {}) == "no conformance/bin/kubectl and $POWERDEV_KUBECTL unset"


def _nowhere(tmp_path) -> dict[str, str]:
    return {
        variable: str(tmp_path / name)
        for name, variable in ((n, t.env) for n, t in kit.TOOLS.items())
    }


def test_a_missing_tool_skips_with_one_line_naming_it_and_the_build(tmp_path):
    env = _nowhere(tmp_path)
    env["POWERDEV_ETCD"] = str(executable(tmp_path / "etcd-here"))
    with pytest.raises(pytest.skip.Exception) as skipped:
        require_tools(NEEDED, env)
    message = str(skipped.value)
    assert "\n" not in message
    assert "etcd" not in message  # found, so not named
    for name in ("kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl"):
        assert f"{name} (${kit.TOOLS[name].env}=" in message
    assert message.endswith("build it with: bash conformance/build")


def test_in_ci_a_missing_tool_fails_instead(tmp_path):
    env = {**_nowhere(tmp_path), "CI": "true"}
    with pytest.raises(pytest.fail.Exception) as failed:
        require_tools(NEEDED, env)
    assert "kube-apiserver" in str(failed.value)
    assert "bash conformance/build" in str(failed.value)
    env["CI"] = "false"  # only "true" means CI
    with pytest.raises(pytest.skip.Exception):
        require_tools(NEEDED, env)


def test_with_every_tool_found_nothing_skips(tmp_path):
    env = {
        variable: str(executable(tmp_path / name))
        for name, variable in ((n, t.env) for n, t in kit.TOOLS.items())
    }
    assert require_tools(NEEDED, env) == {name: tmp_path / name for name in NEEDED}


def script(path, body):
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def leaves(group: BaseException) -> list[BaseException]:
    if isinstance(group, BaseExceptionGroup):
        return [leaf for e in group.exceptions for leaf in leaves(e)]
    return [group]


async def test_a_process_that_fails_to_start_fails_the_start_with_its_log(tmp_path):
    ready = f'echo "{controlplane.ETCD_READY}https://127.0.0.1:1"; exec sleep 60'
    tools = {
        "etcd": script(tmp_path / "etcd", ready),
        "kube-apiserver": script(tmp_path / "apiserver", 'echo "unknown flag: --x" >&2; exit 1'),
        "kube-scheduler": script(tmp_path / "scheduler", "exit 1"),
        "kube-controller-manager": script(tmp_path / "manager", "exit 1"),
    }
    with trio.fail_after(20), pytest.raises(BaseExceptionGroup) as caught:
        await controlplane.run(tmp_path / "cp", tools)
    (error,) = [e for e in leaves(caught.value) if isinstance(e, controlplane.ControlPlaneError)]
    assert "kube-apiserver ended before it was ready" in str(error)
    assert str(error).endswith("unknown flag: --x")
    log = (tmp_path / "cp" / "logs" / "etcd.log").read_text()
    assert log.startswith(controlplane.ETCD_READY)  # its output is in its log
