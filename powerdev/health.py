"""`powerdev health`: is the daemon alive (and, with --ready, registered)?

Alive: every resource the status file names is either waiting for the
kubelet, or has a socket that answers GetDevicePluginOptions. Ready: every
resource is registered and its socket answers. Exit 0 when so, 1 otherwise,
with a line per resource.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import trio

from powerdev.rpc import PluginClient, asyncio_door
from powerdev.status import read_status


async def check(
    status_file: Path, *, ready: bool, answer_seconds: float, say: Callable[[str], None]
) -> bool:
    resources = read_status(status_file)
    if not resources:
        say(f"unknown: no status in {status_file} (is powerdev run up?)")
        return False
    healthy = True
    async with asyncio_door():
        for name, entry in sorted(resources.items()):
            state = str(entry.get("state"))
            socket = Path(str(entry.get("socket")))
            if state == "waiting":
                ok = not ready
                say(f"{name}: waiting for the kubelet ({'not ' if ready else ''}ok)")
            else:
                answers = await _answers(socket, answer_seconds)
                ok = answers and (state == "registered" or not ready)
                say(
                    f"{name}: {state}, socket {socket} "
                    f"{'answers' if answers else 'does not answer'} ({'ok' if ok else 'not ok'})"
                )
            healthy &= ok
    return healthy


async def _answers(socket: Path, answer_seconds: float) -> bool:
    client = PluginClient(socket)
    try:
        with trio.move_on_after(answer_seconds):
            await client.options(dial_seconds=answer_seconds)
            return True
        return False
    except Exception:
        return False
    finally:
        client.close()
