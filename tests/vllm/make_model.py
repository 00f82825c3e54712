"""Writes a Llama model with random weights that vLLM can serve (no
download, no tokenizer: prompts are token ids).

    python make_model.py DIR [--layers 12] [--hidden 768] [--kv-heads 12]
"""

from __future__ import annotations

import argparse
from pathlib import Path

VOCAB = 4096


def make_model(path: Path, layers: int, hidden: int, kv_heads: int, seed: int = 0) -> Path:
    """A ``LlamaForCausalLM`` of ``layers`` layers, ``hidden`` wide (heads of
    64), ``kv_heads`` KV heads, bf16, saved to ``path`` (kept if there)."""
    import torch
    import transformers

    if (path / "config.json").exists():
        return path
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=hidden * 4,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=kv_heads,
        max_position_embeddings=8192,
        dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)  # type: ignore[no-untyped-call]
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp)
    tmp.rename(path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=Path)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--kv-heads", type=int, default=12)
    a = ap.parse_args()
    print(make_model(a.dir, a.layers, a.hidden, a.kv_heads))


if __name__ == "__main__":
    main()
