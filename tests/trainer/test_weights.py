"""Checkpoint formats from_pretrained reads (sharded safetensors with an index, pytorch_model.bin) load the same
through the trainer, and broken or foreign checkpoints are refused naming the tensor, the file and the fix."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from trainer.model.build import build_model
from trainer.model.errors import ModelSourceError

from .architectures import write_model
from .test_architectures import assert_same_tensors, every_tensor, reference

CPU = torch.device("cpu")


def test_sharded_safetensors_and_pytorch_bin_load_like_from_pretrained(process_group, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    source = write_model("mixtral", False, tmp_path / "mixtral")
    split = tmp_path / "split"
    AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).save_pretrained(split, max_shard_size="40KB")
    index = json.loads((split / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2  # several files, per-expert keys spread over them
    assert_same_tensors(every_tensor(build_model(split, device=CPU, use_gpu=False)), every_tensor(reference(split)),
                        "sharded safetensors")
    legacy = tmp_path / "bin"
    shutil.copytree(source, legacy)
    torch.save(load_file(str(legacy / "model.safetensors")), legacy / "pytorch_model.bin")
    (legacy / "model.safetensors").unlink()
    assert_same_tensors(every_tensor(build_model(legacy, device=CPU, use_gpu=False)),
                        every_tensor(reference(legacy)), "pytorch_model.bin")


def test_broken_and_foreign_checkpoints_are_named(process_group, tmp_path):
    llama = write_model("llama", False, tmp_path / "llama")
    neox = write_model("gpt_neox", False, tmp_path / "neox")
    wrong_shape = tmp_path / "wrong-shape"
    shutil.copytree(llama, wrong_shape)
    cfg = json.loads((wrong_shape / "config.json").read_text())
    (wrong_shape / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 48}))
    with pytest.raises(ModelSourceError, match=r"model weights in .*wrong-shape: model\.layers\.0\.mlp\.down_proj"
                                               r"\.weight in model\.safetensors: .*shape \(32, 64\) does not fit"):
        build_model(wrong_shape, device=CPU, use_gpu=False)
    foreign = tmp_path / "foreign"
    shutil.copytree(llama, foreign)
    shutil.copy(neox / "model.safetensors", foreign / "model.safetensors")
    with pytest.raises(ModelSourceError, match=r"none of its \d+ tensors .* is a weight of LlamaForCausalLM"):
        build_model(foreign, device=CPU, use_gpu=False)
    truncated = tmp_path / "truncated"
    shutil.copytree(llama, truncated)
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelSourceError, match=r"model\.safetensors cannot be read .*download or save the folder"):
        build_model(truncated, device=CPU, use_gpu=False)
