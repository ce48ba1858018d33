"""Finding the conformance kit's tools, and what a test does without one."""

import pytest

from powerdev.kubelet import cdicheck
from tests.conftest import require_tool


def executable(path):
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_cdicheck_is_found_at_the_variable_first_then_in_the_checkout(tmp_path, monkeypatch):
    named = executable(tmp_path / "named")
    built = executable(tmp_path / "built")
    monkeypatch.setattr(cdicheck, "BUILT", built)
    monkeypatch.setenv(cdicheck.CDICHECK_ENV, str(named))
    assert cdicheck.find_cdicheck() == named
    monkeypatch.delenv(cdicheck.CDICHECK_ENV)
    assert cdicheck.find_cdicheck() == built
    built.chmod(0o644)
    assert cdicheck.find_cdicheck() is None


def test_the_built_cdicheck_lives_in_this_checkouts_conformance_bin():
    root = cdicheck.BUILT.parents[2]
    assert (root / "conformance" / "build").is_file()
    assert cdicheck.BUILT == root / "conformance" / "bin" / "cdicheck"


def test_a_missing_tool_skips_but_fails_on_ci(tmp_path, monkeypatch):
    assert require_tool(tmp_path, "unused") == tmp_path
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="run this"):
        require_tool(None, "run this")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true: run this"):
        require_tool(None, "run this")
