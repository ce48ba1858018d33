"""Fixtures of the DRA harness tests: the kit's draharness (the control
plane and its API client come from tests/controlplane_fixtures.py, through
tests/conftest.py). Without the kit the tests skip with one
line that names what is missing and the build command; with CI=true they
fail instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerdev.devtools import kit
from tests.conftest import require_tool

__all__ = ["draharness"]


@pytest.fixture
def draharness() -> Path:
    """The draharness binary."""
    return require_tool(kit.DRAHARNESS)
