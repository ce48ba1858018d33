"""`powerdev health`: is the daemon alive (and, with --ready, registered)?

Alive: the status file was written by a process that is still running, and
every resource it names is waiting for the kubelet, registering again (its
socket being replaced, or just removed by a restarting kubelet), has a
problem it keeps trying to get past (a DRA pool the API server does not
take), or has a socket that accepts connections. Ready: every resource is
registered, has no problem, and its socket accepts connections. Exit 0
when so, 1 otherwise, with a line per resource. A probe runs this every
few seconds, so it imports no Trio and no gRPC: it reads one small file
and makes one connect per resource.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from powerdev.ops.status import read_status_file
from powerdev.support.probe import socket_answers


def main(status_file: Path, *, ready: bool, timeout: float) -> int:
    del timeout  # a unix connect answers at once; kept for old probe command lines
    return 0 if check(status_file, ready=ready, say=print) else 1


def check(status_file: Path, *, ready: bool, say: Callable[[str], None]) -> bool:
    pid, resources = read_status_file(status_file)
    if not resources:
        say(f"unknown: no status in {status_file} (is powerdev run up?)")
        return False
    if pid is None or not _running(pid):
        say(f"not running: {status_file} was left by process {pid}, which is gone")
        return False
    return judge(resources, ready=ready, say=say)


def judge(
    resources: Mapping[str, Mapping[str, object]], *, ready: bool, say: Callable[[str], None]
) -> bool:
    """Alive (or, with ready, ready) by each resource's state and socket.
    The daemon's own /healthz and /readyz answer with this too."""
    healthy = True
    for name, entry in sorted(resources.items()):
        state = str(entry.get("state"))
        socket = Path(str(entry.get("socket")))
        problem = entry.get("problem")
        if problem is not None:
            # alive (it tries again), not ready: it cannot do its work
            ok = not ready
            say(f"{name}: {state}, but {problem} ({'not ' if ready else ''}ok)")
        elif state == "waiting":
            ok = not ready
            say(f"{name}: waiting for the kubelet ({'not ' if ready else ''}ok)")
        elif state == "re-registering":
            # Routine (a kubelet restart): the old socket is going, the next
            # one comes up in milliseconds. Not ready: the kubelet has no
            # registration from us until then.
            ok = not ready
            say(f"{name}: re-registering, its socket being replaced ({'not ' if ready else ''}ok)")
        elif state == "registered" and not socket.exists():
            # A kubelet starting anew deletes every socket; the daemon sees it
            # by inotify and serves and registers again within milliseconds.
            ok = not ready
            say(
                f"{name}: registered, but a restarting kubelet removed its socket {socket}: "
                f"re-registering ({'not ' if ready else ''}ok)"
            )
        else:
            answers = socket_answers(socket)
            ok = answers and (state == "registered" or not ready)
            say(
                f"{name}: {state}, socket {socket} "
                f"{'accepts connections' if answers else 'does not answer'} "
                f"({'ok' if ok else 'not ok'})"
            )
        healthy &= ok
    return healthy


def _running(pid: int) -> bool:
    """Is a process with this pid alive, and is it powerdev (not a reused pid)?"""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    if b"powerdev" not in cmdline:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
