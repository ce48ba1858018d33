"""health.judge, the one verdict of /healthz, /readyz and `powerdev health`:
each state, with a socket that answers or not, alive and ready."""

from __future__ import annotations

import socket

import pytest

from powerdev import health

# state, socket answers, alive, ready
TABLE = [
    ("waiting", False, True, False),
    ("serving", True, True, False),
    ("serving", False, False, False),
    ("registered", True, True, True),
    ("registered", False, False, False),  # a server that died: restart it
    ("re-registering", False, True, False),  # routine: the socket is being replaced
    ("re-registering", True, True, False),
]


@pytest.mark.parametrize(("state", "answers", "alive", "ready"), TABLE)
def test_each_state_alive_and_ready(tmp_path, state, answers, alive, ready):
    path = tmp_path / "plugin.sock"
    with socket.socket(socket.AF_UNIX) as server:
        if answers:
            server.bind(str(path))
            server.listen()
        said: list[str] = []
        entry = {"state": state, "socket": str(path)}
        assert health.judge({"r": entry}, ready=False, say=said.append) is alive
        assert health.judge({"r": entry}, ready=True, say=said.append) is ready
    assert all(line.startswith(f"r: {state}") or "waiting" in line for line in said), said
