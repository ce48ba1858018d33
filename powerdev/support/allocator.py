"""glibc's allocator, set once at start so that the daemon's memory follows
what it holds.

- By default glibc raises its mmap threshold each time a large block (a
  10,000-device list, a survey's tables) is freed, up to 32 MiB, and its
  trim threshold with it: from then on large blocks come from the heap, and
  what they leave free stays in the process. Fixed at glibc's own starting
  values (128 KiB), large blocks are mapped and unmapped, and the heap
  gives back what is free at its top.
- Each worker thread would get an arena of its own, which keeps what the
  thread freed (about 1.2 MiB after a 10,000-device start). Under the GIL
  the threads gain nothing from separate arenas: one arena serves all.

At 10,000 devices the daemon's RSS is about 3.5 MiB lower, and the same
from run to run (docs/performance.md, Memory). Elsewhere than glibc (musl),
nothing is set. Set before any worker thread starts.
"""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD = -1  # glibc's <malloc.h>
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
THRESHOLD = 128 * 1024  # bytes: glibc's default for both, kept from growing


def tune() -> bool:
    """True if the C library took every setting."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False  # a C library without mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    settings = ((M_ARENA_MAX, 1), (M_TRIM_THRESHOLD, THRESHOLD), (M_MMAP_THRESHOLD, THRESHOLD))
    taken = [mallopt(option, value) for option, value in settings]  # each, whatever the others
    return all(taken)
