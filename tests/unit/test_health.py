"""health.judge, the one verdict of /healthz, /readyz and `powerdev health`:
each state, with a socket that answers or not, alive and ready."""

from __future__ import annotations

import socket

import pytest

from powerdev.ops import health

# state, the socket ("answers", "refuses": its server died, "gone"), alive, ready
TABLE = [
    ("waiting", "gone", True, False),
    ("serving", "answers", True, False),
    ("serving", "refuses", False, False),
    ("registered", "answers", True, True),
    ("registered", "refuses", False, False),  # a server that died: restart it
    ("registered", "gone", True, False),  # a restarting kubelet deleted it: routine
    ("re-registering", "gone", True, False),  # routine: the socket is being replaced
    ("re-registering", "answers", True, False),
]


@pytest.mark.parametrize(("state", "answers", "alive", "ready"), TABLE)
def test_each_state_alive_and_ready(tmp_path, state, answers, alive, ready):
    path = tmp_path / "plugin.sock"
    with socket.socket(socket.AF_UNIX) as server:
        if answers != "gone":
            server.bind(str(path))
        if answers == "answers":
            server.listen()
        said: list[str] = []
        entry = {"state": state, "socket": str(path)}
        assert health.judge({"r": entry}, ready=False, say=said.append) is alive
        assert health.judge({"r": entry}, ready=True, say=said.append) is ready
    assert all(line.startswith(f"r: {state}") or "waiting" in line for line in said), said


def test_a_problem_is_alive_not_ready_and_said_until_it_is_gone(tmp_path):
    from powerdev.ops.status import StatusFile, read_status_file

    path = tmp_path / "status.json"
    status = StatusFile(path)
    status.set("r", "registered", tmp_path / "dra.sock")
    why = "its ResourceSlices cannot be published (connection refused): trying again"
    status.problem("r", why)
    status.set("r", "waiting", tmp_path / "dra.sock")  # a new state keeps the problem
    _, resources = read_status_file(path)
    said: list[str] = []
    assert health.judge(resources, ready=False, say=said.append) is True
    assert health.judge(resources, ready=True, say=said.append) is False
    assert said == [f"r: waiting, but {why} (ok)", f"r: waiting, but {why} (not ok)"]
    status.problem("r", None)
    _, resources = read_status_file(path)
    assert "problem" not in resources["r"]
