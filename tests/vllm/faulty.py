"""The kvtier connector with faults a test can ask for, per request, through
its ``kv_transfer_params``:

* ``test_flood_mb``: right after the request's lookup, write this many MB
  of other blocks into the tier (pushing it past maxmemory before the load);
* ``test_no_hold``: look the request up without ``HOLD``.

Loaded by tests/vllm/test_vllm.py as ``kv_connector_module_path: faulty``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional

import kvtier
from kvtier.vllm import KvtierConnector as _Base

__all__ = ["KvtierConnector"]

FLOOD_BLOCK = 1 << 20


class KvtierConnector(_Base):
    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[Optional[int], bool]:
        params = request.kv_transfer_params or {}
        options = self.options
        if params.get("test_no_hold"):
            self.options = dataclasses.replace(options, hold_ms=0)
        try:
            found = super().get_num_new_matched_tokens(request, num_computed_tokens)
        finally:
            self.options = options
        flood = int(params.get("test_flood_mb", 0))
        if flood and found[0] is not None:  # once the lookup answered
            # A client of its own: the scheduler's has the lookup's short
            # timeout, and a flood that timed out on a loaded machine would
            # kill the engine instead of testing it.
            junk = os.urandom(FLOOD_BLOCK)
            with kvtier.Client(self.options.url) as client:
                for i in range(flood):
                    name = "flood:%s:%d" % (request.request_id, i)
                    client.put_chain([name], [junk], chain=False)
        return found
