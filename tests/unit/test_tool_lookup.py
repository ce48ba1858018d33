"""Finding the conformance kit's binaries, and what a test does without one."""

import pytest

from powerdev.devtools import kit
from tests.conftest import require_tool

TOOL = kit.KitBinary("tool", "POWERDEV_TEST_TOOL", "the test tool")


def executable(path):
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_the_variable_is_looked_at_first_then_the_kits_build(tmp_path, monkeypatch):
    named = executable(tmp_path / "named")
    (tmp_path / "bin").mkdir()
    built = executable(tmp_path / "bin" / "tool")
    monkeypatch.setenv(TOOL.env, str(named))
    assert TOOL.find(kit_bin=tmp_path / "bin") == named
    named.chmod(0o644)  # named but not executable: reported, not hidden by the kit's build
    assert TOOL.find(kit_bin=tmp_path / "bin") is None
    assert TOOL.where() == f"${TOOL.env}={named} is not an executable file"
    monkeypatch.delenv(TOOL.env)
    assert TOOL.find(kit_bin=tmp_path / "bin") == built
    built.chmod(0o644)
    assert TOOL.find(kit_bin=tmp_path / "bin") is None


def test_the_kit_lives_in_this_checkouts_conformance_bin():
    root = kit.ROOT
    assert (root / "conformance" / "build").is_file()
    assert (root / "conformance" / "go.mod").is_file()
    assert {kit.DMHARNESS.name, kit.CDICHECK.name} == {"dmharness", "cdicheck"}


def test_a_missing_tool_skips_with_the_build_command_but_fails_on_ci(tmp_path, monkeypatch):
    monkeypatch.setenv(TOOL.env, str(executable(tmp_path / "named")))
    assert require_tool(TOOL) == tmp_path / "named"
    monkeypatch.delenv(TOOL.env)
    monkeypatch.delenv("CI", raising=False)
    building = r"run `bash conformance/build`.*POWERDEV_TEST_TOOL"
    with pytest.raises(pytest.skip.Exception, match=building):
        require_tool(TOOL)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true: the test tool is not built"):
        require_tool(TOOL)
