"""What makes two engines' KV of the same tokens the same bytes: the model's
identity (its configuration and a fingerprint of its weight files, not its
name or path) and the attention backend's cache layout.

Engines whose identities differ never share a block; one checkpoint served
from two paths, or under two names, does. The plugins fold these into their
keys' layout digest (``kvtier.vllm``) so that a doubt is a miss.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Optional

logger = logging.getLogger("vllm.kvtier")

#: Weight files a checkpoint may hold.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".npz", ".msgpack")
#: A weight file is fingerprinted by its size and SAMPLES slices of
#: SAMPLE_BYTES spread evenly over it (the first one holds a safetensors
#: header: every tensor's name, dtype and shape).
SAMPLES = 64
SAMPLE_BYTES = 64 << 10

#: Fields of vLLM's ModelConfig that do not shape a block's KV: names and
#: paths (the weights are fingerprinted instead), serving limits and
#: switches of the process. Every other field is part of the identity, so a
#: new vLLM field is a miss between versions, never a silent share.
NOT_KV = frozenset(
    {
        "model",
        "tokenizer",
        "tokenizer_mode",
        "tokenizer_revision",
        "served_model_name",
        "hf_config_path",
        "hf_token",
        "hf_config",  # hashed without its path (model_fingerprint)
        "hf_text_config",
        "model_weights",
        "max_model_len",
        "spec_target_max_model_len",
        "max_logprobs",
        "logprobs_mode",
        "return_sampling_mask",
        "use_fp64_gumbel",
        "generation_config",
        "override_generation_config",
        "logits_processors",
        "seed",
        "enforce_eager",
        "skip_tokenizer_init",
        "allowed_local_media_path",
        "allowed_media_domains",
        "enable_sleep_mode",
        "sleep_mode_backend",
        "sleep_mode_offload_cudagraph",
        "sleep_preserve_parameter_names",
        "enable_cumem_allocator",
        "enable_nccl_comm_suspend",
        "renderer_num_workers",
        "enable_trace_replay",
        "config_format",
        "io_processor_plugin",
        "mm_processor_cache_gb",
        "mm_processor_cache_type",
        "mm_shm_cache_max_object_size_mb",
        "mm_ipc_gpu_memory_gb",
        "skip_mm_profiling",
    }
)


def weights_fingerprint(folder: Path, mode: str = "sampled") -> Optional[str]:
    """A digest of the weight files under ``folder`` (their names relative
    to it, sizes and contents: ``sampled`` slices of each, or ``full``), so
    that two checkpoints never share and one checkpoint at two paths does.
    None when the folder holds no weight file."""
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES) and ".cache" not in p.parts
    )
    if not files:
        return None
    h = hashlib.blake2b(digest_size=16)
    for path in files:
        size = path.stat().st_size
        h.update(b"%s\0%d\0" % (str(path.relative_to(folder)).encode(), size))
        with open(path, "rb") as f:
            if mode == "full":
                while chunk := f.read(8 << 20):
                    h.update(chunk)
                continue
            offsets = {0, max(0, size - SAMPLE_BYTES)}
            if size > SAMPLE_BYTES:
                step = (size - SAMPLE_BYTES) / (SAMPLES - 1)
                offsets.update(int(i * step) for i in range(SAMPLES))
            for off in sorted(offsets):
                f.seek(off)
                h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()


def _local_folder(model: str, revision: Optional[str]) -> Optional[Path]:
    """The folder holding ``model``'s files: the path itself, or its
    snapshot in the Hugging Face cache."""
    if os.path.isdir(model):
        return Path(model)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model, revision=revision, local_files_only=True))
    except Exception:
        return None


def model_fingerprint(model_config: Any, weights: str = "sampled", weights_id: Optional[str] = None) -> str:
    """The model's identity as a digest: vLLM's ModelConfig fields that
    shape the KV (architecture, revision, quantization, dtype, RoPE scaling
    and every override, as the model's config after overrides), and the
    weight files' fingerprint (``weights``: ``sampled``, ``full`` or
    ``none``: the model's name stands for its weights; ``weights_id``: an
    operator's name for the weights instead of either)."""
    factors: dict[str, Any] = {}
    try:
        from dataclasses import fields

        from vllm.config.utils import normalize_value

        for f in fields(model_config):
            if f.name in NOT_KV:
                continue
            try:
                factors[f.name] = normalize_value(getattr(model_config, f.name, None))
            except TypeError:
                factors[f.name] = repr(getattr(model_config, f.name, None))
    except ImportError:  # another vLLM: the fields the KV depends on by name
        for name in ("dtype", "quantization", "revision", "code_revision", "hf_overrides"):
            factors[name] = repr(getattr(model_config, name, None))
    hf = getattr(model_config, "hf_config", None)
    if hf is not None:
        config = hf.to_dict()
        config.pop("_name_or_path", None)
        factors["hf_config"] = config
    factors["weights"] = _weights_identity(model_config, weights, weights_id)
    return _digest(factors)


def _digest(fields: dict[str, Any]) -> str:
    """32 hex digits naming ``fields`` (JSON with sorted keys)."""
    text = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _weights_identity(model_config: Any, weights: str, weights_id: Optional[str]) -> str:
    name = str(model_config.model)
    if weights_id is not None:
        return "id:" + weights_id
    if weights != "none":
        folder = _local_folder(name, getattr(model_config, "revision", None))
        fingerprint = weights_fingerprint(folder, weights) if folder is not None else None
        if fingerprint is not None:
            return fingerprint
        logger.warning(
            "kvtier: no weight files found for %s: its blocks are named by the model's name and "
            "revision, so two checkpoints under that name would share them",
            name,
        )
    return "name:" + name


def attention_layout(vllm_config: Any, head_size: int) -> str:
    """The attention backend and the layout it writes the KV cache in: on
    the CPU build the ISA kernels' layout (AMX tiles, AVX-512/AVX2, NEON,
    ... each their own), elsewhere the chosen backend and cache layout."""
    parts = []
    try:
        from vllm.platforms import current_platform

        parts.append(str(current_platform.device_type))
    except Exception:
        parts.append("?")
    backend = getattr(getattr(vllm_config, "attention_config", None), "backend", None)
    parts.append(str(getattr(backend, "name", backend)))
    model = vllm_config.model_config
    cache = vllm_config.cache_config
    if parts[0] == "cpu":
        try:
            from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

            parts.append(_get_attn_isa(model.dtype, cache.block_size, head_size, cache.cache_dtype))
        except Exception as e:  # a doubt is a miss: a layout of its own
            parts.append("isa?%s" % type(e).__name__)
    # The cache layout (NHD, HND, ...) where this vLLM records one.
    layout = getattr(cache, "kv_cache_layout", None)
    parts.append(str(getattr(layout, "name", layout)))
    return "/".join(parts)


def identity_tag(identity: str) -> str:
    """12 hex digits naming a model's identity in the plugins' keys
    (``<model>~<tag>``)."""
    return hashlib.blake2b(identity.encode(), digest_size=6).hexdigest()


def serving_identity(model: Optional[str]) -> str:
    """For plugins that see only a model's name (LMCache, SGLang): the
    identity of the model the serving engine in this process loaded (vLLM's
    current configuration, SGLang's published server arguments: weights
    fingerprint, revision, dtype, quantization, overrides), else of the
    weights under ``model`` when it is a folder, else the name alone."""
    try:
        from vllm.config import get_current_vllm_config

        config = get_current_vllm_config()
        if getattr(config, "model_config", None) is not None:
            return model_fingerprint(config.model_config)
    except Exception:  # not inside a vLLM engine
        pass
    try:
        from sglang.srt.runtime_context import get_server_args

        args = get_server_args()
        if args is not None and getattr(args, "model_path", None):
            folder = _local_folder(str(args.model_path), getattr(args, "revision", None))
            fields = {
                name: repr(getattr(args, name, None))
                for name in (
                    "revision",
                    "dtype",
                    "quantization",
                    "kv_cache_dtype",
                    "json_model_override_args",
                    "attention_backend",
                    "load_format",
                )
            }
            fields["weights"] = (weights_fingerprint(folder) if folder else None) or "name:" + str(
                args.model_path
            )
            return _digest(fields)
    except Exception:  # not inside an SGLang server
        pass
    if model and os.path.isdir(model):
        fingerprint = weights_fingerprint(Path(model))
        if fingerprint is not None:
            return fingerprint
    return "name:%s" % model
