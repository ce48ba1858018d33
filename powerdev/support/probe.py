"""Is a unix socket served right now? One non-blocking connect, nothing more.

Used by the registration loop (never take a live server's socket) and by
`powerdev health`, which must stay cheap: no Trio, no gRPC."""

from __future__ import annotations

import socket
from pathlib import Path


def socket_answers(path: Path) -> bool:
    """Does a server accept connections on this unix socket right now?"""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    try:
        probe.connect(str(path))
    except BlockingIOError:
        return True  # alive, with a full backlog
    except OSError:
        return False  # no file, not a socket, or nobody listening (a stale file)
    else:
        return True
    finally:
        probe.close()
