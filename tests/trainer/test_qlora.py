"""QLoRA (trainer.model.quantize): the frozen base in torchao's NF4 under FSDP2 on two gloo ranks, against torchao's
own unsharded quantization and a one-process peft model on the same NF4 weights; a run's export, checkpoints and
resumption; the refusals before Ray."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

from tests.guards import nonempty

from .conftest import free_port
from .test_lora import assert_resumes_bit_exactly

RANK, ALPHA = 4, 8.0


def _batch(vocab: int, seed: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(3, vocab, (2, 32), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "labels": ids}


def _nf4_parts(t) -> dict[str, torch.Tensor]:
    return {name: getattr(t, name).clone() for name in t.__tensor_flatten__()[0]}


def _qlora_worker(rank: int, world: int, port: int, model_dir: str, out_dir: str) -> None:
    import torch.distributed as dist

    from trainer.model import adapters, quantize
    from trainer.model.build import build_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = build_model(model_dir, device=torch.device("cpu"), use_gpu=False, seed=3,
                            lora=dict(rank=RANK, alpha=ALPHA), qlora=True)
        g = torch.Generator().manual_seed(5)  # non-zero B (peft starts it at zero), the same for any world size
        with torch.no_grad():
            for name, p in sorted(adapters.adapter_parameters(model).items()):
                if ".lora_B." in name:
                    p.to_local().copy_(adapters._local_rows(torch.randn(p.shape, generator=g) * 0.1, p))
        adapters_start = {n: p.full_tensor().clone() for n, p in adapters.adapter_parameters(model).items()}
        nf4 = {n: p for n, p in model.named_parameters() if quantize.is_nf4(p)}
        sizes = {n: (quantize.local_nf4(p).block_size, quantize.local_nf4(p).scaler_block_size) for n, p in nf4.items()}
        before = {n: _nf4_parts(quantize.local_nf4(p)) for n, p in nf4.items()}
        gathered = quantize.dequantized(model)  # FSDP2's own all-gather of the NF4 shards
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5, momentum=0.9)
        losses, grads = [], []
        for step in range(2):
            loss = model(**_batch(model.config.vocab_size, seed=10 * step + rank)).loss
            loss.backward()
            total = loss.detach().clone()
            dist.all_reduce(total)
            losses.append(float(total) / world)
            grads.append({n: p.grad.full_tensor().clone() for n, p in adapters.adapter_parameters(model).items()})
            frozen_grads = [n for n, p in model.named_parameters() if not p.requires_grad and p.grad is not None]
            opt.step()
            opt.zero_grad(set_to_none=True)
        after = {n: _nf4_parts(quantize.local_nf4(p)) for n, p in nf4.items()}
        hybrid = _hybrid_check(model_dir, model.config.vocab_size, rank)
        unchanged = all(torch.equal(before[n][k], after[n][k]) for n in nf4 for k in before[n])
        torch.save({"gathered": gathered, "sizes": sizes, "local_rows": {n: quantize.local_nf4(p).shape[0]
                                                                          for n, p in nf4.items()},
                    "losses": losses, "grads": grads, "frozen_grads": frozen_grads, "unchanged": unchanged,
                    "adapters_start": adapters_start, "hybrid": hybrid}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _hybrid_check(model_dir: str, vocab: int, rank: int) -> dict:
    """The same build on a 2-D (replicate x shard) mesh, as hybrid sharding makes it: adapters and NF4 shards are
    cut on the shard dimension."""
    from torch.distributed.device_mesh import init_device_mesh

    from trainer.model import adapters, quantize
    from trainer.model.build import build_model

    mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("replicate", "shard"))
    model = build_model(model_dir, device=torch.device("cpu"), use_gpu=False, seed=3, mesh=mesh,
                        lora=dict(rank=RANK, alpha=ALPHA), qlora=True)
    return {"gathered": quantize.dequantized(model),
            "adapters": {n: p.full_tensor().clone() for n, p in adapters.adapter_parameters(model).items()}}


@pytest.mark.slow
def test_nf4_under_fsdp2_on_two_ranks_is_torchao_unsharded_and_peft_in_one_process(demo_assets, tmp_path):
    """Two gloo ranks: each NF4 weight's shards, gathered by FSDP2, dequantize exactly to torchao's to_nf4 of the
    whole checkpoint tensor; the NF4 weights get no gradient and do not change; loss and adapter gradients per step
    are those of peft's own model in one process on the same NF4 weights."""
    import peft
    from safetensors.torch import load_file
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4
    from transformers import AutoModelForCausalLM

    mp.start_processes(_qlora_worker, args=(2, free_port(), str(demo_assets["model"]), str(tmp_path)),
                       nprocs=2, join=True, start_method="spawn")
    res = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    source = load_file(str(demo_assets["model"] / "model.safetensors"))
    gathered = nonempty(list(res[0]["gathered"].items()), "NF4 weights")
    assert len(gathered) == 7 * 2  # every linear of the 2 blocks
    for name, weight in gathered:
        key = name.replace(".base_layer.", ".")
        whole = to_nf4(source[key].float(), *res[0]["sizes"][name])
        assert res[0]["local_rows"][name] * 2 == source[key].shape[0], name  # each rank holds half the rows
        assert torch.equal(weight, whole.get_original_weight()), name
        assert torch.equal(res[1]["gathered"][name], weight), name
    assert all(r["unchanged"] and r["frozen_grads"] == [] for r in res)
    hybrid = res[0]["hybrid"]  # a replicate x shard mesh: the same NF4 weights and seeded adapters
    assert set(hybrid["gathered"]) == set(res[0]["gathered"])
    assert all(torch.equal(hybrid["gathered"][n], w) for n, w in gathered)
    lora_a = nonempty([n for n in hybrid["adapters"] if ".lora_A." in n], "hybrid adapters")
    assert all(torch.equal(hybrid["adapters"][n], res[0]["adapters_start"][n]) for n in lora_a)

    base = AutoModelForCausalLM.from_pretrained(str(demo_assets["model"]), dtype=torch.float32)
    model = peft.get_peft_model(base, peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                                                      target_modules="all-linear"))
    prefix = "base_model.model."
    ours = {n.removeprefix(prefix): p for n, p in model.named_parameters()}
    modules = {n.removeprefix(prefix): m for n, m in model.named_modules()}
    with torch.no_grad():
        for name, _ in gathered:  # the same NF4 weights, unsharded, in peft's layers
            linear = modules[name.removesuffix(".weight")]
            linear.weight = torch.nn.Parameter(to_nf4(linear.weight.detach(), *res[0]["sizes"][name]),
                                               requires_grad=False)
        for name, t in nonempty(list(res[0]["adapters_start"].items()), "adapters"):  # the workers' start
            ours[name].copy_(t)
    assert {n for n in ours if ".lora_" in n} == set(res[0]["adapters_start"])  # the same adapters, no more
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5, momentum=0.9)
    for step in range(2):
        pair = [model(**_batch(base.config.vocab_size, seed=10 * step + r)).loss for r in range(2)]
        loss = (pair[0] + pair[1]) / 2
        loss.backward()
        assert loss.item() == pytest.approx(res[0]["losses"][step], rel=1e-5)
        for name, grad in nonempty(list(res[0]["grads"][step].items()), "adapter gradients"):
            torch.testing.assert_close(ours[name].grad, grad, rtol=1e-4, atol=1e-6, msg=f"step {step}: {name}")
        opt.step()
        opt.zero_grad(set_to_none=True)


def _qlora_cfg(demo_assets, tmp_path, name: str, **kw):
    from trainer.config.flags import TrainConfig

    kw = {"global_batch_size": 4, "num_workers": 1, **kw}
    return TrainConfig(model=str(demo_assets["model"]), dataset=str(demo_assets["train"]), seq_len=128,
                       steps=4, log_every=1, checkpoint_every=2, progress=False,
                       storage_path=str(tmp_path), run_name=name, cache_dir=str(tmp_path / "cache"),
                       method="qlora", lora_rank=RANK, lora_alpha=ALPHA, lora_dropout=0.1, report_to="none", **kw)


def test_a_qlora_run_checkpoints_only_the_adapters_exports_what_peft_loads_and_resumes_bit_exactly(
        process_group, demo_assets, tmp_path):
    """The loop in-process on a one-rank gloo group: its checkpoints hold the adapters and their optimizer state,
    not the base; the adapter folder loads with peft; the merged folder is the NF4 base torchao dequantizes plus
    peft's scaled B @ A; a run killed after its step-2 checkpoint resumes to the same adapters."""
    import peft
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4
    from transformers import AutoModelForCausalLM

    from trainer.loop.parallel import setup_parallel
    from trainer.loop.run import run
    from trainer.model import quantize
    from trainer.run_folder import checkpoint as ckpt
    from trainer.run_folder.export import ADAPTER_DIR, EXPORT_DIR
    from trainer.storage import Storage

    cfg = _qlora_cfg(demo_assets, tmp_path, "straight")
    run(cfg, setup_parallel(cfg, 0, 1, 0), Storage.from_uri(cfg.run_uri))
    saved = dcp.FileSystemReader(str(tmp_path / "straight" / ckpt.dir_name(4))).read_metadata().state_dict_metadata
    model_keys = nonempty([k for k in saved if k.startswith("model.")], "checkpointed model tensors")
    assert all(".lora_" in k for k in model_keys), [k for k in model_keys if ".lora_" not in k][:3]
    assert len(model_keys) == 2 * 7 * 2 and any(k.startswith("optim.") for k in saved)

    adapter_dir, merged_dir = tmp_path / "straight" / ADAPTER_DIR, tmp_path / "straight" / EXPORT_DIR
    base = AutoModelForCausalLM.from_pretrained(str(demo_assets["model"]), dtype=torch.float32)
    tuned = peft.PeftModel.from_pretrained(base, str(adapter_dir))
    adapters = load_file(str(adapter_dir / "adapter_model.safetensors"))
    assert {k for k, _ in tuned.named_parameters() if ".lora_" in k} == \
        {k.replace(".weight", ".default.weight") for k in adapters}
    assert any(v.abs().sum() > 0 for k, v in nonempty(list(adapters.items()), "adapters") if "lora_B" in k)
    source = load_file(str(demo_assets["model"] / "model.safetensors"))
    merged = load_file(str(merged_dir / "model.safetensors"))
    stems = nonempty(sorted({k.split(".lora_")[0] for k in adapters}), "adapted linears")
    for stem in stems:
        key = stem.removeprefix("base_model.model.") + ".weight"
        sizes = quantize.block_sizes(tuple(source[key].shape), 1)
        delta = adapters[f"{stem}.lora_B.weight"] @ adapters[f"{stem}.lora_A.weight"] * (ALPHA / RANK)
        want = (to_nf4(source[key].float(), *sizes).get_original_weight() + delta).to(torch.bfloat16)
        assert torch.equal(merged[key], want), key
    assert torch.equal(merged["model.embed_tokens.weight"], source["model.embed_tokens.weight"].to(torch.bfloat16))
    assert AutoModelForCausalLM.from_pretrained(str(merged_dir)) is not None

    assert_resumes_bit_exactly(_qlora_cfg(demo_assets, tmp_path, "killed", fail_at_step=3), adapters)


def test_bad_qlora_settings_are_refused_before_ray(demo_assets, tmp_path):
    """No block linear NF4 can shard over 5 ranks (rows of 64, 128 and 384), and a random base has nothing to
    quantize: each is one problem naming the flag, before any worker starts."""
    from trainer.config.flags import ConfigError, TrainConfig, validate
    from trainer.jobs.launch import preflight

    with pytest.raises(ConfigError) as e:
        preflight(_qlora_cfg(demo_assets, tmp_path, "five", num_workers=5, global_batch_size=10))
    assert any(p.startswith("--method qlora: QLoRA: the decoder layers of Qwen2ForCausalLM have no nn.Linear "
                            "weight NF4 can store") and "divisible by the 5 rank(s)" in p and "use --method lora" in p
               for p in e.value.problems), e.value.problems
    with pytest.raises(ConfigError, match=r"--random-init \(random_init\) = True: --method qlora quantizes a trained"):
        validate(TrainConfig(model="m", dataset="d", method="qlora", random_init=True))


def test_a_changed_base_is_named_before_an_adapter_run_resumes_on_it(demo_assets, tmp_path):
    """Checkpoints of lora/qlora runs hold no base: the resume rebuilds it from --model, so run.json's model
    identity must tell a base whose weights changed (same shapes, same file size) from the one the run began on."""
    import shutil

    from safetensors.torch import load_file, save_file

    from trainer.run_folder.resume import differences, model_identity

    base = tmp_path / "base"
    shutil.copytree(demo_assets["model"], base)
    then = {"model": model_identity(str(base))}
    assert differences(then, {"model": model_identity(str(base))}, {}) == []
    state = load_file(str(base / "model.safetensors"))
    key = "model.layers.1.mlp.down_proj.weight"
    state[key] = state[key] + 1e-3
    save_file(state, str(base / "model.safetensors"), metadata={"format": "pt"})
    assert differences(then, {"model": model_identity(str(base))}, {}) == ["the model's config or weights changed"]
