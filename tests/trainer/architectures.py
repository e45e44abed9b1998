"""Tiny random-init models of the architectures people fine-tune, from transformers' own config classes.

Each is saved with save_pretrained (the checkpoint layout transformers writes: per-expert
keys for the mixture-of-experts models) next to the demo's character tokenizer, so the
same folders serve the in-process comparisons and the Ray runs. Hidden 32, 2 layers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

VOCAB = 128  # the demo tokenizer's vocabulary
COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _configs() -> dict[str, Callable[..., object]]:
    import transformers as T

    return {
        "llama": lambda **kw: T.LlamaConfig(**COMMON, **kw),
        "mistral": lambda **kw: T.MistralConfig(**COMMON, sliding_window=16, **kw),
        "qwen2": lambda **kw: T.Qwen2Config(**COMMON, **kw),
        "qwen3": lambda **kw: T.Qwen3Config(**COMMON, head_dim=16, **kw),
        "phi3": lambda **kw: T.Phi3Config(**COMMON, **kw),
        # softcaps on: the final one is applied after the head, the attention one inside the layers
        "gemma2": lambda **kw: T.Gemma2Config(**COMMON, head_dim=16, final_logit_softcapping=5.0, **kw),
        # one sliding and one full layer: a rotary frequency buffer per layer type, plus the embedding scale
        "gemma3": lambda **kw: T.Gemma3TextConfig(**COMMON, head_dim=16, sliding_window=8, final_logit_softcapping=5.0,
                                                  layer_types=["sliding_attention", "full_attention"], **kw),
        # 3 experts: uneven over 2 ranks; router logits on, so the auxiliary loss is part of the loss
        "mixtral": lambda **kw: T.MixtralConfig(**COMMON, num_local_experts=3, num_experts_per_tok=2,
                                                output_router_logits=True, router_aux_loss_coef=0.02, **kw),
        "qwen2_moe": lambda **kw: T.Qwen2MoeConfig(**COMMON, num_experts=4, num_experts_per_tok=2,
                                                   moe_intermediate_size=16, shared_expert_intermediate_size=32,
                                                   output_router_logits=True, router_aux_loss_coef=0.02, **kw),
        "gpt_neox": lambda **kw: T.GPTNeoXConfig(**{k: v for k, v in COMMON.items() if k != "num_key_value_heads"},
                                                 **kw),
        # logits scaled after the head: Cohere multiplies by logit_scale, Granite divides by logits_scaling
        "cohere": lambda **kw: T.CohereConfig(**COMMON, logit_scale=0.25, **kw),
        "granite": lambda **kw: T.GraniteConfig(**COMMON, logits_scaling=4.0, **kw),
    }


NAMES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "mixtral", "qwen2_moe", "gpt_neox")
CASES = [(name, tied) for name in NAMES for tied in (False, True)]
SCALED = ("cohere", "granite")  # the loss only (their layers are Llama's)


def config(name: str, tied: bool):
    return _configs()[name](tie_word_embeddings=tied)


def write_model(name: str, tied: bool, folder: Path, seed: int = 0) -> Path:
    """save_pretrained of a random-init model (fp32) and the demo tokenizer; reused when already written."""
    import torch
    from transformers import AutoModelForCausalLM

    from trainer import demo

    folder = Path(folder)
    if (folder / "config.json").is_file():
        return folder
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config(name, tied), dtype=torch.float32)
    with torch.no_grad():  # norms and biases away from their init values: loading them is then visible
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    tmp = folder.with_name(folder.name + ".tmp")
    model.save_pretrained(tmp)
    demo.build_tokenizer().save_pretrained(tmp)
    tmp.rename(folder)
    return folder
