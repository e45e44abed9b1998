"""Model setup: meta-device build, FSDP2 groups, sharded weight loading, schedule, activation checkpointing."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch.distributed.tensor import DTensor

from tests.guards import nonempty
from trainer.data.packing import prepare
from trainer.loop.optim import build_optimizer, lr_factor
from trainer.loop.parallel import ONE_PROCESS
from trainer.loop.step import train_step
from trainer.model.build import build_model
from trainer.model.errors import ModelSourceError
from trainer.model.sources import describe_source, load_tokenizer, resolve_model_path, tokenizer_only


def test_sharded_model_loads_the_checkpoint_weights_exactly(process_group, demo_assets):
    from transformers import AutoModelForCausalLM

    model = build_model(demo_assets["model"], device=torch.device("cpu"), use_gpu=False)
    reference = AutoModelForCausalLM.from_pretrained(demo_assets["model"])
    ids = torch.randint(0, 100, (2, 24))
    pos = torch.arange(24).expand(2, 24)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids, position_ids=pos).logits,
                                   reference(input_ids=ids, position_ids=pos).logits, rtol=0, atol=0)
    # tied embedding / lm_head survive sharding as one parameter, in one FSDP group with the final norm
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert isinstance(model.lm_head.weight, DTensor)
    groups = [type(m).__name__ for m in model.modules() if hasattr(m, "unshard")]
    assert groups.count("FSDPQwen2DecoderLayer") == 2 and "FSDPEmbedding" in groups


def test_activation_checkpointing_changes_memory_not_numbers(process_group, demo_assets, tmp_path):
    tok = load_tokenizer(demo_assets["model"])
    data = prepare(str(demo_assets["train"]), "train", tok, 128, tmp_path / "cache")
    results = []
    for ac in (False, True):
        model = build_model(demo_assets["model"], device=torch.device("cpu"), use_gpu=False,
                            activation_checkpointing=ac)
        assert model.is_gradient_checkpointing == ac
        opt = build_optimizer(model, lr=1e-3, weight_decay=0.0, fused=False)
        outs = [train_step(model, opt, None, data.micro_batches(s, rank=0, world_size=1, global_batch=4,
                                                                 micro_batch=2, seed=0),
                           device=torch.device("cpu"), collectives=ONE_PROCESS)
                for s in range(2)]
        results.append([v for o in outs for v in (float(o.loss), float(o.grad_norm))])
    assert results[0] == pytest.approx(results[1], rel=1e-5)


def test_memory_forces_activation_checkpointing_only_when_one_sequence_does_not_fit(process_group, demo_assets,
                                                                                   tmp_path, monkeypatch):
    from trainer.config.flags import TrainConfig
    from trainer.loop import memory
    from trainer.loop.memory import resolve_micro_batch
    from trainer.loop.parallel import WorkerEnv

    cpu = torch.device("cpu")
    data = prepare(str(demo_assets["train"]), "train", load_tokenizer(demo_assets["model"]), 128, tmp_path / "cache")
    cfg = TrainConfig(model="m", dataset="d", seq_len=128, global_batch_size=4, num_workers=1)
    assert cfg.micro_batch_auto
    env = WorkerEnv(rank=0, world_size=1, local_rank=0, device=cpu, mesh=None)
    models, fits = [], []
    for host_bytes in ("plenty", "tight"):
        model = build_model(demo_assets["model"], device=cpu, use_gpu=False)
        opt = build_optimizer(model, lr=1e-3, weight_decay=0.0, fused=False)
        if host_bytes == "plenty":
            monkeypatch.setattr(memory, "available_host_bytes", lambda: 2.0**40)
        else:  # room for one sequence with checkpointing, not without
            full = memory.activation_bytes_per_row(model.config, 128)
            kept = memory.activation_bytes_per_row(model.config, 128, checkpointed=True)
            assert kept < full
            fixed = fits[0]["fixed_gib"] * 2**30
            monkeypatch.setattr(memory, "available_host_bytes", lambda: (fixed + (full + kept) / 2) / 0.9)
        fits.append(resolve_micro_batch(cfg, model, opt, env))
        outs = [train_step(model, opt, None, data.micro_batches(s, rank=0, world_size=1, global_batch=4,
                                                                 micro_batch=fits[-1]["micro_batch_size"], seed=0),
                           device=cpu, collectives=ONE_PROCESS) for s in range(2)]
        models.append((model, [v for o in outs for v in (float(o.loss), float(o.grad_norm))]))
    roomy, tight = fits
    assert roomy["micro_batch_size"] == 4 and roomy["fits"] and not roomy["activation_checkpointing"]
    assert not models[0][0].is_gradient_checkpointing
    assert tight["micro_batch_size"] == 1 and tight["fits"] and tight["activation_checkpointing"]
    assert "one sequence needs" in tight["activation_checkpointing_reason"] and models[1][0].is_gradient_checkpointing
    # turned on after sharding, it changes memory, not the numbers (micro-batch 4 vs 4 x 1 included)
    assert models[0][1] == pytest.approx(models[1][1], rel=1e-5)


def test_a_folder_without_weights_is_refused_unless_random_init_is_asked_for(process_group, demo_assets, tmp_path):
    from trainer.model.errors import ModelSourceError

    folder = tmp_path / "config-only"
    folder.mkdir()
    shutil.copy(demo_assets["model"] / "config.json", folder)
    with pytest.raises(ModelSourceError, match=r"config-only.*no weight files.*--random-init"):
        build_model(folder, device=torch.device("cpu"), use_gpu=False)
    model = build_model(folder, device=torch.device("cpu"), use_gpu=False, random_init=True)
    w = model.model.layers[0].mlp.up_proj.weight.full_tensor()
    assert 0.01 < float(w.std()) < 0.03  # initializer_range 0.02
    assert torch.all(model.model.norm.weight.full_tensor() == 1)


def test_schedules_warm_up_then_decay_to_the_floor():
    kw = dict(warmup=10, total=110, min_ratio=0.1)
    assert [lr_factor(s, schedule="cosine", **kw) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert lr_factor(60, schedule="cosine", **kw) == pytest.approx(0.55)
    assert lr_factor(60, schedule="linear", **kw) == pytest.approx(0.55)
    assert lr_factor(35, schedule="linear", **kw) == pytest.approx(0.1 + 0.9 * 0.75)
    assert lr_factor(110, schedule="cosine", **kw) == pytest.approx(0.1)
    assert lr_factor(500, schedule="constant", **kw) == 1.0


def test_optimizer_skips_decay_on_biases_and_norms(process_group, demo_assets):
    model = build_model(demo_assets["model"], device=torch.device("cpu"), use_gpu=False)
    decay, no_decay = build_optimizer(model, lr=1e-3, weight_decay=0.1, fused=False).param_groups
    assert decay["weight_decay"] == 0.1 and all(p.ndim == 2 for p in nonempty(decay["params"], "decayed parameters"))
    assert no_decay["weight_decay"] == 0.0 and all(p.ndim == 1 for p in nonempty(no_decay["params"], "parameters without decay"))


def test_the_optimizer_takes_lr_decay_betas_and_epsilon_from_the_config():
    from trainer.config.flags import TrainConfig
    from trainer.loop.optim import for_run

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    cfg = TrainConfig(lr=3e-4, weight_decay=0.1, adam_beta1=0.8, adam_beta2=0.99, adam_epsilon=1e-6)
    decay, no_decay = for_run(model, cfg, total_steps=10)[0].param_groups
    for group in (decay, no_decay):
        assert (group["initial_lr"], group["betas"], group["eps"]) == (3e-4, (0.8, 0.99), 1e-6)
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    # the defaults are the declared ones, with or without a config
    default = for_run(model, TrainConfig(), total_steps=10)[0].param_groups[0]
    plain = build_optimizer(model, lr=1e-3, weight_decay=0.0, fused=False).param_groups[0]
    assert (default["betas"], default["eps"]) == (plain["betas"], plain["eps"]) == ((0.9, 0.95), 1e-8)


def test_model_sources_are_recognised_and_bad_ones_explained(tmp_path, demo_assets):
    assert describe_source("Qwen/Qwen2.5-1.5B") == "hub"
    assert describe_source("s3://bucket/models/qwen") == "s3"
    assert describe_source(str(demo_assets["model"])) == "local"
    assert resolve_model_path(str(demo_assets["model"]), tmp_path) == demo_assets["model"]
    with pytest.raises(ModelSourceError, match="has no config.json"):
        resolve_model_path(str(tmp_path), tmp_path)
    with pytest.raises(ModelSourceError, match="does not exist"):
        resolve_model_path("./no/such/folder", tmp_path)


def test_a_hub_id_resolves_to_its_snapshot_in_the_hub_cache_and_is_remembered(tmp_path, demo_assets):
    """huggingface_hub's own offline snapshot_download reads a cache laid out as the hub writes it."""
    repo = tmp_path / "cache" / "hub" / "models--org--tiny"
    commit = "0" * 40
    shutil.copytree(demo_assets["model"], repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    path = resolve_model_path("org/tiny", tmp_path / "cache")
    assert path == repo / "snapshots" / commit and (path / "config.json").is_file()
    assert tokenizer_only("org/tiny", tmp_path / "cache")("hub")["input_ids"] == load_tokenizer(path)("hub")["input_ids"]
    shutil.rmtree(repo / "refs")  # the marker in the per-node cache answers without asking the hub again
    assert resolve_model_path("org/tiny", tmp_path / "cache") == path
    with pytest.raises(ModelSourceError, match=r"model 'org/absent': not a local folder, and fetching it from "
                                               r"the Hugging Face hub failed .*HF_TOKEN"):
        resolve_model_path("org/absent", tmp_path / "cache")


def hub_cache_with_revisions(hub, demo_model, revisions: dict[str, int]):
    """models--org--tiny as huggingface_hub writes it: refs/<revision> holds a commit, snapshots/<commit> its files
    (each revision's config.json says which one it is, by its layer count)."""
    import json

    repo = hub / "models--org--tiny"
    (repo / "refs").mkdir(parents=True)
    commits = {}
    for n, (revision, layers) in enumerate(revisions.items()):
        commits[revision] = commit = f"{n + 1:040x}"
        shutil.copytree(demo_model, repo / "snapshots" / commit)
        config = json.loads((repo / "snapshots" / commit / "config.json").read_text())
        config.pop("layer_types", None)  # (one per layer: derived again from the count)
        (repo / "snapshots" / commit / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}))
        (repo / "refs" / revision).write_text(commit)
    return repo, commits


def test_a_model_revision_pins_the_download_the_config_the_tokenizer_and_the_cache_entry(tmp_path, demo_assets,
                                                                                            monkeypatch):
    from huggingface_hub import constants

    from trainer.config.load import parse
    from trainer.jobs import launch
    from trainer.model.sources import model_cache_key, read_model_config

    cache = tmp_path / "cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache / "hub"))  # where from_pretrained looks, offline
    repo, commits = hub_cache_with_revisions(cache / "hub", demo_assets["model"], {"main": 2, "it-mid-training": 1})
    pinned = resolve_model_path("org/tiny", cache, revision="it-mid-training")
    assert pinned == repo / "snapshots" / commits["it-mid-training"]
    assert resolve_model_path("org/tiny", cache, revision="main") == repo / "snapshots" / commits["main"]
    assert resolve_model_path("org/tiny", cache) == repo / "snapshots" / commits["main"]  # main is the default
    assert model_cache_key("org/tiny", "it-mid-training") != model_cache_key("org/tiny") \
        == model_cache_key("org/tiny", "main")  # each revision its own entry; main keeps the unpinned one's
    assert read_model_config("org/tiny", revision="it-mid-training").num_hidden_layers == 1
    assert read_model_config("org/tiny").num_hidden_layers == 2
    assert tokenizer_only("org/tiny", cache, revision="it-mid-training")("hub")["input_ids"] \
        == load_tokenizer(pinned)("hub")["input_ids"]
    for call in (lambda: resolve_model_path("org/tiny", cache, revision="v9"),
                 lambda: read_model_config("org/tiny", revision="v9")):
        with pytest.raises(ModelSourceError) as e:
            call()
        assert "\n" not in str(e.value)
        assert str(e.value).startswith("model 'org/tiny' at revision 'v9': ") and "check --model-revision" in str(e.value)
    # the pre-flight: a TRL recipe's model_revision reaches it; an unknown one, or one on a local folder, is refused
    argv = ["--dataset", str(demo_assets["train"]), "--seq-len", "64", "--global-batch-size", "2", "--num-workers", "1",
            "--steps", "1", "--out", str(tmp_path / "out"), "--cache-dir", str(cache), "--random-init"]
    info = launch.preflight(parse(["--model", "org/tiny", "--model-revision", "it-mid-training", *argv]))
    assert info["decoder_layers"] == 1
    for model, revision, needle in (("org/tiny", "v9", "model 'org/tiny' at revision 'v9': reading its config"),
                                    (str(demo_assets["model"]), "v1", "applies to a Hugging Face hub model")):
        with pytest.raises(Exception, match=needle):
            launch.preflight(parse(["--model", model, "--model-revision", revision, *argv]))
