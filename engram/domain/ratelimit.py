"""Per-caller rate limits: a token bucket per (caller, action), refilled continuously."""

from __future__ import annotations

import time
from collections.abc import Callable


class RateLimiter:
    """`rate_per_s` tokens a second up to `burst`; each allowed call takes one."""

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic,
                 max_callers: int = 10_000) -> None:
        self._rate = rate_per_s
        self._burst = burst
        self._clock = clock
        self._max_callers = max_callers
        self._buckets: dict[tuple[str, str], tuple[float, float]] = {}  # -> (tokens, when)

    def take(self, caller: str, action: str) -> float:
        """0 if the call may go ahead (a token is taken), else the seconds until one is free."""
        now = self._clock()
        tokens, when = self._buckets.get((caller, action), (float(self._burst), now))
        tokens = min(self._burst, tokens + (now - when) * self._rate)
        if tokens < 1:
            self._buckets[(caller, action)] = (tokens, now)
            return (1 - tokens) / self._rate
        if len(self._buckets) >= self._max_callers:  # full buckets forget nothing that matters
            self._buckets = {k: v for k, v in self._buckets.items() if v[0] < self._burst - 1}
        self._buckets[(caller, action)] = (tokens - 1, now)
        return 0.0
