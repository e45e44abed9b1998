"""The pre-flight names what the workers would hit, before Ray starts (trainer.loop.behaviour, trainer.jobs.launch):
an attention implementation the model lacks, a checkpoint that leaves tensors unloaded, a model whose packed
documents would see each other (trained one document per row, with the cost in the notes); and the loading and
loss fixes behind them: a hub checkpoint in the multimodal `model.language_model.*` layout loads as
from_pretrained loads it, the chunked loss works on a strictly typed config."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from tests.guards import nonempty
from trainer.config.flags import ConfigError, TrainConfig
from trainer.jobs.launch import preflight
from trainer.loop import behaviour
from trainer.model.tiny import shrink

from .test_architectures import assert_same_tensors, every_tensor

CPU = torch.device("cpu")
VOCAB = 128  # the demo tokenizer's


def tiny_folder(model_type: str, folder: Path, *, seed: int = 0, **overrides) -> Path:
    """A model type's default config shrunk (the demo tokenizer's vocabulary), random weights, saved with the
    demo tokenizer."""
    from transformers import AutoModelForCausalLM

    from trainer import demo

    config = shrink(behaviour.default_config(model_type))
    for name, value in {"vocab_size": VOCAB, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
                        **overrides}.items():
        setattr(config, name, value)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    demo.build_tokenizer().save_pretrained(folder)
    return folder


def run_config(model: Path, demo_assets, **kw) -> TrainConfig:
    return TrainConfig(model=str(model), dataset=str(demo_assets["train"]), seq_len=128, global_batch_size=4,
                       num_workers=1, **kw)


def test_an_attention_implementation_the_model_lacks_is_refused_naming_the_flag(tmp_path, demo_assets):
    bloom = tiny_folder("bloom", tmp_path / "bloom")  # eager attention only
    with pytest.raises(ConfigError) as err:
        preflight(run_config(bloom, demo_assets, storage_path=str(tmp_path / "runs")))
    assert "--attn-implementation sdpa: transformers' BloomForCausalLM does not support it (it supports eager)" \
        in str(err.value) and "pass --attn-implementation eager" in str(err.value)
    assert not (tmp_path / "runs").exists()
    found = behaviour.measure(behaviour.default_config("bloom"), attn_implementation="eager")
    assert found.packing == behaviour.ONE_PER_ROW and "no position ids" in found.reason


def test_a_model_that_mixes_packed_documents_trains_one_document_per_row_with_the_cost_noted(tmp_path, demo_assets,
                                                                                           trainer_cache, monkeypatch):
    opt = tiny_folder("opt", tmp_path / "opt")  # its mask is built without the position ids
    info = preflight(run_config(opt, demo_assets, storage_path=str(tmp_path / "runs"), cache_dir=str(trainer_cache)))
    assert info["behaviour"].packing == behaviour.ONE_PER_ROW
    data = info["data"]
    assert data["rows"] == data["documents"] > data["packed_rows"] > 0  # one row each, against best fit
    note = next(n for n in info["notes"] if n.startswith("documents are trained one per row"))
    assert "second document's logits differ" in note and f"{data['rows']:,} rows of" in note
    assert f"against {data['packed_rows']:,} rows" in note
    # the workers pack by the driver's verdict, handed to them, and measure nothing again
    from trainer.jobs.launch import build_trainer
    from trainer.loop import run as loop_run
    from trainer.storage import Storage

    cfg = run_config(opt, demo_assets, storage_path=str(tmp_path / "runs"), cache_dir=str(trainer_cache))
    handed = build_trainer(cfg, found=info).train_loop_config
    assert handed[loop_run.ONE_PER_ROW_KEY] == info["behaviour"].reason != ""
    assert handed[loop_run.INPUTS_KEY] == info["inputs"] and handed[loop_run.MEMORY_PLAN_KEY] == info["memory_plan"]
    monkeypatch.setattr(loop_run, "documents_per_row", lambda *a: pytest.fail("measured again on a worker"))
    worker = loop_run.fetch_inputs(cfg, Storage.from_uri(cfg.run_uri), None, handed[loop_run.ONE_PER_ROW_KEY])
    assert worker.data.num_rows == data["rows"]
    # without a verdict (a run started without its pre-flight) the worker measures the same one
    monkeypatch.undo()
    assert loop_run.fetch_inputs(cfg, Storage.from_uri(cfg.run_uri), None).data.num_rows == data["rows"]
    # a model that keeps documents apart packs several per row
    packed = preflight(run_config(demo_assets["model"], demo_assets, storage_path=str(tmp_path / "runs2"),
                                  cache_dir=str(trainer_cache)))
    assert packed["behaviour"].packing == behaviour.PACKED
    assert packed["data"]["rows"] == packed["data"]["packed_rows"] < packed["data"]["documents"]
    assert not any("one per row" in n for n in packed["notes"])


def test_a_checkpoint_that_leaves_tensors_unloaded_is_refused_before_ray_and_on_the_workers(tmp_path, demo_assets,
                                                                                          process_group):
    from safetensors.torch import load_file, save_file

    from trainer.model.build import build_model
    from trainer.model.errors import ModelSourceError

    llama = tiny_folder("llama", tmp_path / "llama")
    state = load_file(str(llama / "model.safetensors"))
    dropped = sorted(k for k in state if k.endswith("mlp.down_proj.weight"))
    assert len(dropped) == 2
    save_file({k: v for k, v in state.items() if k not in dropped}, str(llama / "model.safetensors"),
              metadata={"format": "pt"})
    with pytest.raises(ConfigError) as err:
        preflight(run_config(llama, demo_assets, storage_path=str(tmp_path / "runs")))
    assert f"2 of the {len(state)} tensors of LlamaForCausalLM are not in the checkpoint" in str(err.value)
    assert dropped[0] in str(err.value) and "--random-init" in str(err.value)
    with pytest.raises(ModelSourceError, match=r"2 of the \d+ tensors of LlamaForCausalLM are not in the checkpoint"):
        build_model(llama, device=CPU, use_gpu=False)
    assert build_model(llama, device=CPU, use_gpu=False, random_init=True) is not None  # asked for: no checkpoint


def test_a_checkpoint_in_the_multimodal_layout_loads_as_from_pretrained_loads_it(tmp_path, demo_assets,
                                                                               process_group):
    """Qwen3.5's published checkpoints nest the text model under model.language_model.*: transformers renames it."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from trainer.model.build import build_model

    folder = tiny_folder("qwen3_5_text", tmp_path / "qwen3_5")
    state = load_file(str(folder / "model.safetensors"))
    nested = {k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k: v
              for k, v in state.items()}
    assert sum(k.startswith("model.language_model.") for k in nested) == len(state) - 1  # all but lm_head
    save_file(nested, str(folder / "model.safetensors"), metadata={"format": "pt"})
    want = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert_same_tensors(every_tensor(build_model(folder, device=CPU, use_gpu=False)), every_tensor(want), "qwen3_5")
    assert preflight(run_config(folder, demo_assets, storage_path=str(tmp_path / "runs")),
                     full_data=False, for_run=False)["behaviour"].packing == behaviour.ONE_PER_ROW  # linear attention


def test_the_chunked_loss_works_on_a_strictly_typed_config(process_group):
    """Gemma 3n's config refuses None for its softcap field, which the chunked loss turns off for one call."""
    from transformers import AutoModelForCausalLM

    from trainer.loop.parallel import ONE_PROCESS
    from trainer.loop.step import check_loss_path, forward_loss

    config = shrink(behaviour.default_config("gemma3n_text"))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    assert config.final_logit_softcapping
    assert check_loss_path(model, "chunked", CPU, collectives=ONE_PROCESS) == "chunked"
    ids = torch.randint(3, config.vocab_size, (1, 16))
    labels = torch.roll(ids, -1, 1)
    labels[:, -1] = -100
    batch = {"input_ids": ids, "labels": labels, "position_ids": torch.arange(16)[None]}
    with torch.no_grad():
        chunked, plain = forward_loss(model, batch, "chunked")[0], forward_loss(model, batch, "plain")[0]
    assert float(chunked) == pytest.approx(float(plain), rel=1e-5)
    assert model.config.final_logit_softcapping == config.final_logit_softcapping  # put back


def test_random_init_builds_the_architectures_whose_init_computes_with_their_parameters(tmp_path, process_group):
    """Mamba's and RWKV's init mix a sharded parameter with plain tensors: each runs on whole parameters."""
    from trainer.model.build import build_model

    for model_type in ("mamba", "rwkv"):
        folder = tmp_path / model_type
        shrink(behaviour.default_config(model_type)).save_pretrained(folder)
        model = build_model(folder, device=CPU, use_gpu=False, random_init=True, attn_implementation="eager")
        tensors = every_tensor(model)
        assert all(bool(torch.isfinite(t).all()) for t in nonempty(tensors.values(), "tensors") if t.is_floating_point())
        if model_type == "mamba":
            a_log = tensors["backbone.layers.0.mixer.A_log"]
            torch.testing.assert_close(a_log[0], torch.log(torch.arange(1, a_log.shape[1] + 1, dtype=torch.float32)))


def test_a_refused_model_with_a_supported_attention_is_accepted(tmp_path, demo_assets):
    bloom = tiny_folder("bloom", tmp_path / "bloom")
    cfg = dataclasses.replace(run_config(bloom, demo_assets, storage_path=str(tmp_path / "runs")),
                              attn_implementation="eager")
    info = preflight(cfg, full_data=False, for_run=False)
    assert info["behaviour"].packing == behaviour.ONE_PER_ROW
    assert any(n.startswith("documents are trained one per row") for n in info["notes"])
