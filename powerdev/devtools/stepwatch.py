"""The longest time the Trio thread was held by one task step.

A Trio instrument, installed in the daemon only when POWERDEV_STEP_REPORT
names a file (`powerdev bench` sets it): every task step is timed, and the
longest few, with their task names, are written to that file as JSON when
the daemon exits. uevent_bench.py installs one in-process for a while
(trio.lowlevel.add_instrument); the step that installs it is not counted.
A long step is time in which nothing else ran: no signal handled, no
Allocate answered. A step costs the instrument two clock reads; where the
task stopped is looked up only for a step long enough to be kept, so the
figures the benches take meanwhile are not the instrument's.
"""

from __future__ import annotations

import heapq
import json
import os
import time
from pathlib import Path

import trio

REPORT_ENV = "POWERDEV_STEP_REPORT"
KEEP = 5


class StepWatch(trio.abc.Instrument):
    def __init__(self) -> None:
        self._began = 0.0
        self._stepping: trio.lowlevel.Task | None = None
        # a min-heap of (seconds, task name, where the task stopped after it)
        self.longest: list[tuple[float, str, str]] = []

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._stepping = task
        self._began = time.perf_counter()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is not self._stepping:
            return  # installed during this step (add_instrument): its start is unknown
        self._stepping = None
        took = time.perf_counter() - self._began
        if len(self.longest) < KEEP:
            heapq.heappush(self.longest, (took, task.name, _innermost(task.coro)))
        elif took > self.longest[0][0]:
            heapq.heapreplace(self.longest, (took, task.name, _innermost(task.coro)))

    def report(self) -> dict[str, object]:
        ordered = sorted(self.longest, reverse=True)
        return {
            "longest_ms": round(ordered[0][0] * 1000, 2) if ordered else 0.0,
            "steps": [
                {"ms": round(s * 1000, 2), "task": name, "stopped_at": where}
                for s, name, where in ordered
            ],
        }


def _innermost(coro: object) -> str:
    """Where a suspended coroutine chain waits: its deepest frame, and
    the deepest of powerdev's own when that is another."""
    where = ours = ""
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            where = f"{frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno}"
            if "/powerdev/" in frame.f_code.co_filename:
                ours = f"{frame.f_code.co_filename.rsplit('/powerdev/', 1)[-1]}:{frame.f_lineno}"
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return where if ours in ("", where) else f"{where} in {ours}"


def from_environment() -> tuple[StepWatch, Path] | None:
    path = os.environ.get(REPORT_ENV)
    return (StepWatch(), Path(path)) if path else None


def write(watch: StepWatch, path: Path) -> None:
    path.write_text(json.dumps(watch.report()))


def read(path: Path) -> dict[str, object] | None:
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None
