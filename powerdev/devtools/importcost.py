"""What each import costs the daemon in resident memory: run in a fresh
interpreter, it imports what `powerdev run` imports, library by library in
the daemon's order and then powerdev's own modules, and prints the RSS
after each step. Measures, asserts nothing:

    python -m powerdev.devtools.importcost

The first steps are the packages the design fixes (trio, trio-asyncio and
with it asyncio, grpclib, betterproto, pyudev; ssl comes with trio); after
them a line says what the interpreter and those packages hold together,
before any library powerdev chose or any code of its own. Like the
benches, it byte-compiles powerdev first, as the image does; then it
measures in a fresh interpreter of its own, which imports nothing before
its first line: that line is the bare interpreter.
"""

from __future__ import annotations

import importlib
import sys

DESIGN = (
    ("ssl (trio and asyncio import it)", "ssl"),
    ("attrs (trio's)", "attrs"),
    ("trio", "trio"),
    ("trio-asyncio (asyncio, greenlet)", "trio_asyncio"),
    ("grpclib's server (h2, hpack, multidict)", "grpclib.server"),
    ("betterproto (dateutil, importlib.metadata)", "betterproto"),
    ("pyudev", "pyudev"),
)
CHOSEN = (
    ("protobuf with the device plugin API", "powerdev._proto.api_pb2"),
    ("prometheus_client (http.server, wsgiref)", "prometheus_client"),
    ("h11", "h11"),
    ("powerdev: the command line", "powerdev.cli.commands"),
    ("powerdev: the daemon", "powerdev.daemon.supervisor"),
)
FLOOR = "interpreter and the design's packages"


MEASURE = "--measure"  # the child that measures, in a fresh interpreter


def main(argv: list[str]) -> int:
    if MEASURE not in argv:
        import subprocess

        from powerdev.devtools.bytecode import compile_for_bench

        compile_for_bench("importcost")  # powerdev's modules load as in the image
        return subprocess.call([sys.executable, "-m", "powerdev.devtools.importcost", MEASURE])
    return measure()


def measure() -> int:
    start = rss_kib_now()
    print(f"{'interpreter':48} {start / 1024:6.1f} MiB")
    before = start
    for steps in (DESIGN, CHOSEN):
        for what, module in steps:
            importlib.import_module(module)
            now = rss_kib_now()
            print(f"{what:48} {now / 1024:6.1f} MiB  (+{(now - before) / 1024:.1f})")
            before = now
        if steps is DESIGN:
            print(f"{FLOOR:48} {before / 1024:6.1f} MiB")
    return 0


def rss_kib_now() -> int:
    """This process's VmRSS in KiB, read without importing anything."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
