#!/usr/bin/env bash
# Prints the path of the connector tests' Python venv (torch, lmcache 0.5.6,
# sglang), building it first when it is missing: tests/venv.sh keeps it
# outside the clone, keyed by this directory's requirement files.
exec "$(dirname "${BASH_SOURCE[0]}")/../venv.sh" venv "$(dirname "${BASH_SOURCE[0]}")" \
    'import torch, lmcache, sglang.srt.mem_cache.hicache_storage, sglang.srt.mem_cache.pool_host.mha, sglang.srt.managers.cache_controller'
