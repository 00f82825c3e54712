"""What the serving-stack plugins (vLLM, LMCache, SGLang) share besides the
value codec: reading their options and backing off a server that failed."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any


def truthy(value: Any) -> bool:
    """An option's boolean: ``true``/``1``/``yes``/``on`` (any case) as a
    string, or the value's truth."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def read_options(
    given: Mapping[str, Any], defaults: Mapping[str, Any], what: str, host: Iterable[str] = ()
) -> dict[str, Any]:
    """A plugin's options, read the same way by every plugin: each name of
    ``defaults`` from ``given``, else its default, as its default's type (a
    boolean by :func:`truthy`; a default of None takes the value as given).
    Any other key of ``given`` is refused (a misspelt option is an error,
    not silently the default), except the ``host`` project's own keys that
    share the mapping. ``what`` names the plugin in the errors."""
    unknown = sorted(set(given) - set(defaults) - set(host))
    if unknown:
        raise ValueError(
            "unknown %s option(s): %s (it takes %s)" % (what, ", ".join(unknown), ", ".join(sorted(defaults)))
        )
    options: dict[str, Any] = {}
    for name, default in defaults.items():
        value = given.get(name, default)
        if value is not None and default is not None:
            kind = type(default)
            try:
                value = truthy(value) if kind is bool else kind(value)
            except (TypeError, ValueError):
                raise ValueError(
                    "%s option %s: %r is not a %s" % (what, name, value, kind.__name__)
                ) from None
        options[name] = value
    return options


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
