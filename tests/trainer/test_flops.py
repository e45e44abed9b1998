"""FLOPs per token as in facts.md section 6, and MFU."""

from __future__ import annotations

import pytest
from transformers import Qwen2Config

from trainer.flops import flops_per_token, matmul_params, mfu, peak_flops_per_device

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
