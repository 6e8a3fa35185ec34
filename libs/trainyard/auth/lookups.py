"""How often a gateway asks NATS about a credential id it does not hold.

A token id or session id that this gateway has not seen costs a KV look-up
(it may have been created a moment ago on another gateway).  An unauthenticated
caller could send a new random id with every request and make each one a NATS
round trip, so :class:`Lookups` remembers the ids that were not found for a
while and allows only so many look-ups per second (a token bucket); past that,
an unknown id is refused without a look-up, and the caller is told to retry.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class Lookups:
    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        per_second: float = 20.0,
        burst: float = 40.0,
        remember_s: float = 30.0,
        max_remembered: int = 10_000,
    ) -> None:
        self.clock = clock
        self.per_second = per_second  # look-ups allowed per second, on average
        self.burst = burst  # look-ups allowed at once after a quiet spell
        self.remember_s = remember_s  # how long an id that was not found is answered without a look-up
        self.max_remembered = max_remembered
        self._allowance = burst  # look-ups that may be made now
        self._refilled_at = clock()
        self._missing: OrderedDict[str, float] = OrderedDict()  # id -> until when it is known missing
        self.refused = 0  # look-ups not made, for the record

    def allow(self, key: str) -> bool:
        """Whether ``key`` may be looked up now (else answer "unknown")."""
        now = self.clock()
        until = self._missing.get(key)
        if until is not None:
            if now < until:
                self.refused += 1
                return False
            del self._missing[key]
        self._allowance = min(self.burst, self._allowance + (now - self._refilled_at) * self.per_second)
        self._refilled_at = now
        if self._allowance < 1.0:
            self.refused += 1
            return False
        self._allowance -= 1.0
        return True

    def missing(self, key: str) -> None:
        """``key`` was looked up and not found: answer it without a look-up for a while."""
        self._missing[key] = self.clock() + self.remember_s
        self._missing.move_to_end(key)
        while len(self._missing) > self.max_remembered:
            self._missing.popitem(last=False)

    def found(self, key: str) -> None:
        self._missing.pop(key, None)
