"""What the serving-stack plugins (vLLM, LMCache, SGLang) share besides the
value header: reading boolean options and backing off a server that failed."""

from __future__ import annotations

import logging
import time
from typing import Any


def truthy(value: Any) -> bool:
    """An option's boolean: ``true``/``1``/``yes``/``on`` (any case) as a
    string, or the value's truth."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


class Health:
    """After a failure, calls are skipped for ``retry_after`` seconds (so a
    server that is down or stalled costs nothing per request), then tried
    again. A failure is logged at most once every ``warn_every`` seconds: a
    server down for an hour is a line every few seconds, not one per call."""

    def __init__(self, retry_after: float, logger: logging.Logger, warn_every: float = 10.0) -> None:
        self.retry_after = retry_after
        self.logger = logger
        self.warn_every = warn_every
        self.down_until = 0.0
        self.warned_at = -warn_every
        self.failures = 0

    def ok(self) -> bool:
        return time.monotonic() >= self.down_until

    def failed(self, what: str, error: BaseException) -> None:
        self.failures += 1
        now = time.monotonic()
        if now - self.warned_at >= self.warn_every:
            self.warned_at = now
            self.logger.warning(
                "kvtier: %s failed (%s); skipping the server for %.1fs (%d failures so far)",
                what,
                error,
                self.retry_after,
                self.failures,
            )
        self.down_until = now + self.retry_after
