"""The control plane's fixtures, for every test that needs the API server
(tests/e2e, tests/dra): one control plane for the whole session (its start
is paid once), and an API client for each test. tests/conftest.py imports
them, so that pytest knows them once, from one place.

Without the kit the tests skip, with one line that names what is missing and
the command that builds it; when CI is "true" they fail instead, so that CI
can never pass by skipping them."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from powerdev.devtools import kit
from powerdev.devtools.cluster import controlplane
from powerdev.devtools.cluster.client import Api
from powerdev.devtools.cluster.controlplane import ControlPlane
from tests import conftest

NEEDED = (*kit.CONTROL_PLANE, "kubectl")
# Names the API server resolves to 127.0.0.1: the webhook's Service, for the
# webhook's URL (see test_webhook_e2e.py).
LOOPBACK_NAMES = (
    "power-dev-webhook.power-device-plugin.svc",
    "power-dev-webhook.power-device-plugin.svc.cluster.local",
)


def require_tools(names: tuple[str, ...], env: dict[str, str] | None = None) -> dict[str, Path]:
    """The tools by name; skips (fails when CI=true) if one is missing."""
    env = dict(os.environ) if env is None else env
    found = kit.find_all(names, env)
    missing = [name for name in names if name not in found]
    if missing:
        conftest.require(None, kit.missing_message(missing, env), env)
    return found


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without the kit, the tests that need it are marked to skip before they
    start, so that the summary names the missing tools once per file, not
    once per test. With CI=true nothing is marked: the fixture fails each."""
    env = dict(os.environ)
    found = kit.find_all(NEEDED, env)
    missing = [name for name in NEEDED if name not in found]
    if not missing or env.get("CI") == "true":
        return
    skip = pytest.mark.skip(reason=kit.missing_message(missing, env))
    for item in items:
        if "control_plane" in getattr(item, "fixturenames", ()):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    tools = require_tools(NEEDED)
    root = tmp_path_factory.mktemp("cp")
    with controlplane.in_thread(root, tools, hosts=LOOPBACK_NAMES) as plane:
        yield plane


@pytest.fixture
async def api(control_plane: ControlPlane) -> AsyncIterator[Api]:
    """The admin's client; after the test, every process must still run."""
    async with control_plane.api() as client:
        yield client
    failures = control_plane.failures()
    assert not failures, "the control plane lost a process: " + "; ".join(failures)
