"""What each import costs the daemon in resident memory: run in a fresh
interpreter, it imports what `powerdev run` imports, library by library in
the daemon's order and then powerdev's own modules, and prints the RSS
after each step. Measures, asserts nothing:

    python -m powerdev.devtools.importcost
"""

from __future__ import annotations

import importlib
import os
import sys

from powerdev.devtools.testing import rss_kib

STEPS = (
    ("ssl (trio imports it)", "ssl"),
    ("attrs (trio's)", "attrs"),
    ("trio", "trio"),
    ("trio-asyncio", "trio_asyncio"),
    ("grpclib's server (h2, hpack, multidict)", "grpclib.server"),
    ("protobuf with the device plugin API", "powerdev._proto.api_pb2"),
    ("betterproto (dateutil, importlib.metadata)", "betterproto"),
    ("pyudev", "pyudev"),
    ("prometheus_client (http.server, wsgiref)", "prometheus_client"),
    ("h11", "h11"),
    ("powerdev: the command line", "powerdev.cli.commands"),
    ("powerdev: the daemon", "powerdev.daemon.supervisor"),
)


def main() -> int:
    before = rss_kib_now()
    print(f"{'interpreter':48} {before / 1024:6.1f} MiB")
    for what, module in STEPS:
        importlib.import_module(module)
        now = rss_kib_now()
        print(f"{what:48} {now / 1024:6.1f} MiB  (+{(now - before) / 1024:.1f})")
        before = now
    return 0


def rss_kib_now() -> int:
    return rss_kib(os.getpid()) or 0


if __name__ == "__main__":
    sys.exit(main())
