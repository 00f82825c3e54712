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


def make_lora(path: Path, model: Path, seed: int, rank: int = 8) -> Path:
    """A LoRA adapter of ``model`` (PEFT's format: q_proj and v_proj of
    every layer) with random weights, saved to ``path`` (kept if there)."""
    import json

    import torch
    import transformers
    from safetensors.torch import save_file

    if (path / "adapter_config.json").exists():
        return path
    config = transformers.AutoConfig.from_pretrained(model)
    head = config.hidden_size // config.num_attention_heads
    out = {"q_proj": config.hidden_size, "v_proj": config.num_key_value_heads * head}
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config.num_hidden_layers):
        for proj, width in out.items():
            name = "base_model.model.model.layers.%d.self_attn.%s" % (layer, proj)
            tensors[name + ".lora_A.weight"] = torch.randn(rank, config.hidden_size, generator=gen) * 0.05
            tensors[name + ".lora_B.weight"] = torch.randn(width, rank, generator=gen) * 0.05
    path.mkdir(parents=True)
    save_file(
        {k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()},
        str(path / "adapter_model.safetensors"),
    )
    adapter = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "target_modules": list(out),
        "bias": "none",
        "base_model_name_or_path": str(model),
        "task_type": "CAUSAL_LM",
    }
    (path / "adapter_config.json").write_text(json.dumps(adapter))
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
