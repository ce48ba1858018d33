"""Fixtures of the DRA harness tests: the kit's draharness, and the
end-to-end tests' control plane and API client (imported from
tests/e2e/conftest.py, not copied). Without the kit the tests skip with one
line that names what is missing and the build command; with CI=true they
fail instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerdev.devtools import kit
from tests.conftest import require_tool
from tests.e2e.conftest import api, control_plane

__all__ = ["api", "control_plane", "draharness"]


@pytest.fixture
def draharness() -> Path:
    """The draharness binary."""
    return require_tool(kit.DRAHARNESS)
