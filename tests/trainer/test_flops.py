"""FLOPs per token as in facts.md section 6, MFU, and the counts each architecture really has."""

from __future__ import annotations

import pytest
from transformers import Qwen2Config

from tests.guards import nonempty
from trainer.model.flops import flops_per_token, matmul_params, mfu, model_shape, parameter_count, peak_flops_per_device

from .architectures import NAMES, config

QWEN25_15B = Qwen2Config(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)


def test_qwen25_15b_is_10_32_gflop_per_token_at_2048():
    assert flops_per_token(QWEN25_15B, 2048) / 1e9 == pytest.approx(10.32, abs=0.005)


def test_tied_lm_head_is_counted():
    # 1.31 B non-embedding matmul params + the 151936 x 1536 lm_head matmul
    assert matmul_params(QWEN25_15B) == 1_310_195_712 + 151_936 * 1536


def test_attention_term_grows_with_sequence_length():
    assert flops_per_token(QWEN25_15B, 4096) - flops_per_token(QWEN25_15B, 2048) == 12 * 28 * 1536 * 2048


def test_mfu_against_device_peak():
    peak = peak_flops_per_device("NVIDIA H200")
    assert peak == 989e12
    assert peak_flops_per_device("NVIDIA L4") == 121e12
    assert peak_flops_per_device("cpu") is None and mfu(1000, 1e9, None) is None
    # 8 devices at 40k tokens/s each on Qwen2.5-1.5B
    assert mfu(8 * 40_000, 10.32e9, peak, 8) == pytest.approx(40_000 * 10.32e9 / 989e12)
    assert peak_flops_per_device("anything", override_tflops=790) == 790e12


# ---------------------------------------------------------------- the model's own shape, per architecture

def _meta(config):
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("name", NAMES)
def test_parameter_count_is_the_models_own(name):
    for tied in (False, True):
        cfg = config(name, tied)
        assert parameter_count(cfg) == sum(p.numel() for p in _meta(cfg).parameters()), (name, tied)


def test_moe_counts_the_active_experts_per_token():
    cfg = config("mixtral", False)  # 3 experts, 2 per token
    d, ff, layers, vocab = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    attn = d * d * 2 + d * 16 * 2  # q, o: 4 heads x 8; k, v: 2 heads x 8
    router = d * 3
    expected = layers * (attn + router + 2 * 3 * d * ff) + vocab * d
    assert matmul_params(cfg) == expected
    assert model_shape(cfg).experts == (2, 3)
    assert parameter_count(cfg) > expected  # all 3 experts are gathered and reduced
    qwen = config("qwen2_moe", False)  # 4 experts of 16, 2 per token, a shared expert of 32 and its gate
    d = qwen.hidden_size
    experts = 2 * 3 * d * 16 + 3 * d * 32 + d * 1 + d * 4
    assert matmul_params(qwen) == 2 * (d * d * 2 + d * 16 * 2 + experts) + qwen.vocab_size * d


def test_gpt_neox_has_a_fused_qkv_and_a_two_matrix_mlp_with_biases():
    cfg = config("gpt_neox", False)
    d, ff = cfg.hidden_size, cfg.intermediate_size
    assert matmul_params(cfg) == 2 * (4 * d * d + 2 * d * ff) + cfg.vocab_size * d  # qkv + dense, in + out
    biases_and_norms = 2 * (3 * d + d + ff + d + 4 * d) + 2 * d
    assert parameter_count(cfg) == matmul_params(cfg) + cfg.vocab_size * d + biases_and_norms


def test_sliding_window_layers_attend_to_their_window_only():
    cfg = config("gemma3", True)  # layer 0 sliding (window 8), layer 1 full; 4 heads x 16
    width = 4 * 16
    assert flops_per_token(cfg, 128) - 6 * matmul_params(cfg) == 12 * width * (8 + 128)
    assert flops_per_token(cfg, 4) - 6 * matmul_params(cfg) == 12 * width * (4 + 4)


def test_the_peak_of_every_catalog_gpu_is_the_catalog_row_s_own():
    """A GPU type added to facts.catalog gets its MFU without a second table."""
    from facts.catalog import GPU_TYPES

    for row in nonempty(GPU_TYPES.values(), "GPU types in the catalog"):
        assert peak_flops_per_device(f"{row.gpu_model} 80GB HBM3") == row.gpu_bf16_tflops * 1e12, row.name
    assert peak_flops_per_device("NVIDIA A10G") == 125e12  # a chip outside the catalog
