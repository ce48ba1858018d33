"""The C allocator's settings the daemon makes at start (support/allocator.py)."""

import ctypes
import os
import platform
import subprocess
import sys

import pytest

pytestmark = [
    pytest.mark.skipif(
        platform.libc_ver()[0] != "glibc", reason="the settings are glibc's: this C library is not"
    ),
    pytest.mark.skipif(
        not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="mallinfo2 needs glibc 2.33 or later"
    ),
]

# In a process of its own (the settings last for the process): free a 1 MiB
# block, which by default raises glibc's mmap threshold above it, then ask
# for 256 KiB and say whether glibc mapped it (mallinfo2's hblks).
PROBE = """
import ctypes, sys
from powerdev.support import allocator

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
        "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = (ctypes.c_void_p,)
libc.mallinfo2.restype = Info
took = allocator.tune() if sys.argv[1] == "tuned" else None
libc.free(libc.malloc(1 << 20))
before = libc.mallinfo2().hblks
block = libc.malloc(256 << 10)
print(took, libc.mallinfo2().hblks > before)
libc.free(block)
"""


def probe(how: str) -> str:
    """In a child whose environment sets none of glibc's own malloc knobs."""
    env = {
        k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES" and not k.startswith("MALLOC_")
    }
    out = subprocess.run(
        [sys.executable, "-c", PROBE, how],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=env,
    )
    return out.stdout.strip()


def test_large_blocks_stay_mapped_after_a_larger_one_is_freed():
    """Tuned, a 256 KiB block is its own mapping (given back when freed)
    even after a 1 MiB one came and went; by default glibc has raised its
    threshold by then and takes it from the heap, which keeps it."""
    assert probe("default") == "None False"
    assert probe("tuned") == "True True"
