"""The model shapes a benchmark runs: a named Qwen2 shape, or any model's config (only the config is read)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from facts.errors import UserError, first_line

SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                         tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6),
    # Matmul-bound like Qwen2.5-1.5B at 2048 (attention ~11% of the FLOPs) yet fast enough for a CPU.
    "small": dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True),
}
SETUPS = ("hf_trainer", "trainer")


class BenchError(UserError):
    """A bad benchmark option, named with the fix (exit 2)."""


def model_config(shape: str):
    """A named shape (Qwen2), or the config of a model folder / config.json file (any architecture)."""
    from transformers import AutoConfig, Qwen2Config

    if shape in SHAPES:
        return Qwen2Config(**SHAPES[shape], use_cache=False)
    path = Path(shape).expanduser()
    if not (path.is_file() or (path / "config.json").is_file()):
        raise BenchError(f"--model-shape {shape!r}: not a named shape ({', '.join(SHAPES)}) nor a model folder "
                         f"with config.json or a config .json file; pass one of those")
    try:
        config = AutoConfig.from_pretrained(str(path))
    except Exception as e:  # noqa: BLE001 - a foreign or broken JSON file: name it
        raise BenchError(f"--model-shape {shape!r}: not a transformers model config ({first_line(e)})") from None
    config.use_cache = False
    return config


def write_config(shape: str, folder: Path) -> Path:
    """A config-only model folder: build_model(random_init=True) gives it the config's initialisation."""
    model_config(shape).save_pretrained(str(folder))
    return folder

