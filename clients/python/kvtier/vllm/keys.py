"""Block keys: the layout digest, the TP rank and a chained block hash, and the
value header's length."""

from __future__ import annotations

import array
import hashlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Optional

from .. import _codec
from .._identity import attention_layout, model_fingerprint
from .options import Options

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


# Under vLLM's logger, so that its handlers and level apply.
logger = logging.getLogger("vllm.kvtier")

# -- keys ---------------------------------------------------------------------------


#: The part of a value's header after the fixed one: the layout digest.
HEADER_LEN = _codec.FIXED.size + 16


class KeyScheme:
    """Block keys: a layout digest, the TP rank and a chained block hash.

    The layout names everything that shapes a block's bytes besides its
    tokens: the model's identity (its configuration and weights, not its
    name or path), dtype, KV cache dtype and scales, block size, the
    attention backend and its cache layout, the layers in order, KV heads,
    head size and TP size. The scheduler and every worker build it from the
    same configuration (:meth:`from_vllm`), so they name the same blocks.
    """

    def __init__(
        self,
        *,
        model_id: str,
        dtype: str,
        cache_dtype: str,
        block_size: int,
        layers: int,
        kv_heads: int,
        head_size: int,
        tp: int,
        kv_layout: str,
        layer_names: Sequence[str] = (),
        extra: Sequence[str] = (),
    ) -> None:
        self.block_size = block_size
        self.tp = tp
        self.layers = layers
        self.kv_heads = kv_heads
        self.head_size = head_size
        fields = (
            "v2",
            model_id,
            dtype,
            cache_dtype,
            block_size,
            layers,
            kv_heads,
            head_size,
            tp,
            kv_layout,
            ",".join(layer_names),
            *extra,
        )
        self.descriptor = "|".join(str(x) for x in fields)
        self.layout = hashlib.blake2b(self.descriptor.encode(), digest_size=8).hexdigest()
        #: Every value's header carries it and a load checks it: a key that
        #: collides across layouts is a miss, never another layout's bytes.
        self.layout_digest = hashlib.blake2b(
            self.descriptor.encode(), digest_size=16, person=b"kvtier-layout"
        ).digest()

    @classmethod
    def from_vllm(
        cls, vllm_config: VllmConfig, options: Options, kv_cache_config: Optional[KVCacheConfig] = None
    ) -> KeyScheme:
        model = vllm_config.model_config
        parallel = vllm_config.parallel_config
        cache = vllm_config.cache_config
        if parallel.pipeline_parallel_size > 1:
            raise ValueError("the kvtier connector does not support pipeline parallelism")
        attn_type = str(getattr(model, "attn_type", "decoder"))
        if attn_type != "decoder" or not getattr(model.hf_text_config, "is_causal", True):
            # A block's KV would depend on the tokens after it: vLLM itself
            # turns prefix caching off for these.
            raise ValueError(
                "kvtier.vllm stores the KV of causal decoder models only; %s is %s"
                % (model.model, attn_type if attn_type != "decoder" else "not causal")
            )
        head_size = model.get_head_size()
        groups = getattr(kv_cache_config, "kv_cache_groups", None) or ()
        layer_names = list(groups[0].layer_names) if groups else []
        return cls(
            model_id=model_fingerprint(model, options.weights, options.model_id),
            dtype=str(model.dtype).replace("torch.", ""),
            cache_dtype=str(cache.cache_dtype),
            block_size=cache.block_size,
            layers=model.get_num_layers(parallel),
            kv_heads=model.get_num_kv_heads(parallel),
            head_size=head_size,
            tp=parallel.tensor_parallel_size,
            kv_layout=attention_layout(vllm_config, head_size),
            layer_names=layer_names,
            extra=(
                "scales=%s" % getattr(cache, "calculate_kv_scales", None),
                "skip=%s" % ",".join(getattr(cache, "kv_cache_dtype_skip_layers", None) or ()),
            ),
        )

    def extend(
        self,
        hashes: list[str],
        root: bytes,
        tokens: Sequence[int],
        blocks: int,
        extras: Optional[Callable[[int], bytes]] = None,
    ) -> None:
        """Appends the hashes of full blocks ``len(hashes)..blocks`` of ``tokens``."""
        extend_chain(hashes, root, tokens, blocks, self.block_size, extras)

    def key(self, rank: int, block_hash: str) -> str:
        return block_key(self.layout, rank, block_hash)

    def lookup_keys(self, hashes: Sequence[str]) -> list[str]:
        """Every rank's key of each block, block by block: PREFIXLEN over
        them, divided by the TP size, is the blocks every rank can load."""
        return [self.key(r, h) for h in hashes for r in range(self.tp)]


class BlockExtras:
    """What besides its tokens makes a block of one request different KV,
    block by block, as vLLM's own prefix cache keys it: the LoRA adapter's
    name and path, the cache salt (first block), each multimodal input in
    the blocks it covers at its offset, and the prompt embeddings of each
    block. Called once per block, in order."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.needed = bool(
            getattr(request, "lora_request", None)
            or getattr(request, "cache_salt", None)
            or getattr(request, "mm_features", None)
            or getattr(request, "prompt_embeds", None) is not None
        )
        self._mm_index = 0
        self._keys: Optional[Callable[..., tuple[Any, int]]] = None
        if self.needed:
            try:
                from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys

                self._keys = generate_block_hash_extra_keys
            except ImportError:
                self._keys = None

    @property
    def keyable(self) -> bool:
        """False when the request needs extra keys this vLLM cannot give:
        it is neither looked up nor stored."""
        return not self.needed or self._keys is not None

    def __call__(self, block: int, block_size: int) -> bytes:
        if not self.needed or self._keys is None:
            return b""
        keys, self._mm_index = self._keys(
            self.request, block * block_size, (block + 1) * block_size, self._mm_index
        )
        return b"" if keys is None else repr(keys).encode()

    def tail(self, start: int, end: int) -> Optional[bytes]:
        """The extras of the partial block of tokens ``start..end``; None
        when a multimodal input may fall in it (their keys follow the
        blocks in order: no partial block is stored then)."""
        if not self.needed:
            return b""
        if self._keys is None or getattr(self.request, "mm_features", None):
            return None
        keys, _ = self._keys(self.request, start, end, 0)
        return b"" if keys is None else repr(keys).encode()


def chain_root(layout: str) -> bytes:
    """The hash a chain starts from (what else makes the same tokens other
    KV is folded into each block's hash: :class:`BlockExtras`)."""
    return hashlib.blake2b(layout.encode(), digest_size=16).digest()


def extend_chain(
    hashes: list[str],
    root: bytes,
    tokens: Sequence[int],
    blocks: int,
    block_size: int,
    extras: Optional[Callable[[int], bytes]] = None,
) -> None:
    """Appends to ``hashes`` (hex) the hashes of full blocks
    ``len(hashes)..blocks`` of ``tokens``: each the blake2b of its parent's
    hash, its token ids (int64, little-endian) and ``extras(block)`` when
    that is not empty."""
    parent = bytes.fromhex(hashes[-1]) if hashes else root
    for b in range(len(hashes), blocks):
        h = hashlib.blake2b(parent, digest_size=16)
        h.update(array.array("q", tokens[b * block_size : (b + 1) * block_size]).tobytes())
        extra = extras(b) if extras is not None else b""
        if extra:
            h.update(b"\0extra\0" + extra)
        parent = h.digest()
        hashes.append(parent.hex())


def tail_hash(parent: bytes, tokens: Sequence[int], extra: bytes = b"") -> str:
    """The hash of a prompt's final partial block (``tokens``, fewer than a
    block, and its extras) after the block hashed ``parent``: never a full
    block's hash."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(b"\0partial\0")
    h.update(array.array("q", tokens).tobytes())
    if extra:
        h.update(b"\0extra\0" + extra)
    return h.hexdigest()


def block_key(layout: str, rank: int, block_hash: str) -> str:
    """The kvtier key of one block of one TP rank."""
    return "kvtier:vllm:%s:%d:%s" % (layout, rank, block_hash)
