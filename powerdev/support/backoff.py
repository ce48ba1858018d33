"""One backoff rule for every retry in powerdev: a first wait that doubles
up to a bound, and starts again from the first after a success."""

from __future__ import annotations


class Backoff:
    def __init__(self, first: float, longest: float) -> None:
        self.first = first
        self.longest = longest
        self.failures = 0

    def next(self) -> float:
        """The wait before the next try, counting this failure."""
        delay = min(self.longest, self.first * 2 ** min(self.failures, 30))
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0
