"""LoRA through peft under FSDP2 (trainer.model.adapters): two gloo ranks against one process of peft itself; the
same two ranks resume from object storage fetching only their share (trainer.run_folder.checkpoint)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.guards import nonempty

from .conftest import free_port

RANK, ALPHA = 4, 8.0


def _batch(vocab: int, seed: int) -> dict[str, torch.Tensor]:
    """Plain causal rows, every token labelled: each rank's mean loss weighs its tokens as the global mean does."""
    ids = torch.randint(3, vocab, (2, 32), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "labels": ids}


def _set_b(model, seed: int) -> None:
    """Non-zero B matrices (peft starts them at zero), the same full tensors for any world size."""
    from trainer.model import adapters

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(adapters.adapter_parameters(model).items()):
            if ".lora_B." in name:
                full = torch.randn(p.shape, generator=g) * 0.1
                p.to_local().copy_(adapters._local_rows(full, p))


def _lora_worker(rank: int, world: int, port: int, model_dir: str, out_dir: str) -> None:
    import torch.distributed as dist

    from trainer.model import adapters
    from trainer.model.build import build_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = build_model(model_dir, device=torch.device("cpu"), use_gpu=False, seed=3,
                            lora=dict(rank=RANK, alpha=ALPHA))
        _set_b(model, seed=5)
        start = {n: p.full_tensor().clone() for n, p in model.named_parameters()}
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5, momentum=0.9)
        losses, grads = [], []
        for step in range(2):
            loss = model(**_batch(model.config.vocab_size, seed=10 * step + rank)).loss
            loss.backward()  # FSDP2 averages the adapters' gradients over the ranks
            total = loss.detach().clone()
            dist.all_reduce(total)
            losses.append(float(total) / world)
            grads.append({n: p.grad.full_tensor().clone() for n, p in adapters.adapter_parameters(model).items()})
            frozen_grads = [n for n, p in model.named_parameters() if not p.requires_grad and p.grad is not None]
            opt.step()
            opt.zero_grad(set_to_none=True)
        end = {n: p.full_tensor().clone() for n, p in model.named_parameters()}
        share = _resume_share(rank, model, opt, model_dir, out_dir)
        torch.save({"start": start, "end": end, "losses": losses, "grads": grads, "frozen_grads": frozen_grads,
                    **share}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _resume_share(rank: int, model, opt, model_dir: str, out_dir: str) -> dict:
    """Save the sharded run to object storage (a non-local filesystem) and resume a fresh model from what this
    rank fetches: its bytes on disk per file, and whether weights and optimizer state came back bit for bit."""
    import pyarrow.fs as pafs

    from trainer.model.build import build_model
    from trainer.run_folder import checkpoint as ckpt
    from trainer.storage import Storage

    remote = Storage(pafs.SubTreeFileSystem(out_dir, pafs.LocalFileSystem()), "run")
    ckpt.save(remote, 2, model, opt, None, {"epoch": 0, "row": 0})
    name = ckpt.dir_name(2)
    with ckpt._rank_copy(remote, name, model, opt) as folder:
        # bytes on disk (st_blocks): a sparse file takes only what was written into it
        fetched = {p.relative_to(folder).as_posix(): p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file()}
    fresh = build_model(model_dir, device=torch.device("cpu"), use_gpu=False, seed=4, lora=dict(rank=RANK, alpha=ALPHA))
    fresh_opt = torch.optim.SGD([p for p in fresh.parameters() if p.requires_grad], lr=0.5, momentum=0.9)
    ckpt.load(remote, name, fresh, fresh_opt, None)
    same = all(torch.equal(a.to_local(), b.to_local())
               for a, b in zip(model.parameters(), fresh.parameters(), strict=True))
    moments = [(s["momentum_buffer"].to_local(), fresh_opt.state[q]["momentum_buffer"].to_local())
               for (_, s), q in zip(opt.state.items(), [p for p in fresh.parameters() if p.requires_grad], strict=True)]
    return {"fetched": fetched, "same": same, "same_moments": bool(moments) and all(torch.equal(a, b) for a, b in moments)}


@pytest.mark.slow
def test_lora_under_fsdp2_on_two_ranks_is_peft_in_one_process(demo_assets, tmp_path):
    """Two real gloo ranks (FSDP2's sharded adapters and gradient reduction, DCP's per-rank files, need a 2-rank
    world): the same loss and adapter gradients per step as peft's own model on one process; frozen weights get
    no gradient and stay; the run resumes from object storage with each rank fetching only its share."""
    import peft
    from transformers import AutoModelForCausalLM

    mp.start_processes(_lora_worker, args=(2, free_port(), str(demo_assets["model"]), str(tmp_path)),
                       nprocs=2, join=True, start_method="spawn")
    _check_resume_share(tmp_path)
    res = torch.load(tmp_path / "rank0.pt")
    assert res["frozen_grads"] == []
    adapters_start = {n: t for n, t in res["start"].items() if ".lora_" in n}
    assert len(nonempty(list(adapters_start), "adapters")) == 2 * 7 * 2  # A and B on 7 linears x 2 layers
    assert all(t.abs().sum() > 0 for t in nonempty(list(adapters_start.values()), "adapters"))  # A seeded, B set
    for name, t in nonempty(list(res["end"].items()), "parameters"):  # only the adapters moved
        assert torch.equal(t, res["start"][name]) != (".lora_" in name), name

    base = AutoModelForCausalLM.from_pretrained(str(demo_assets["model"]), dtype=torch.float32)
    targets = sorted({n.split(".lora_")[0].rsplit(".", 1)[-1] for n in adapters_start})
    model = peft.get_peft_model(base, peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=targets,
                                                      lora_dropout=0.0))
    prefix = "base_model.model."
    ours = {n.removeprefix(prefix): p for n, p in model.named_parameters()}
    with torch.no_grad():
        # the same starting point: the base as loaded, our adapters
        for name, t in nonempty(list(res["start"].items()), "parameters"):
            key = name if name in ours else name.replace(".base_layer.", ".")
            if ".lora_" in name:
                ours[name].copy_(t)
            else:
                torch.testing.assert_close(ours.get(name, ours.get(key)), t, rtol=0, atol=0, msg=name)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5, momentum=0.9)
    for step in range(2):
        pair = [model(**_batch(base.config.vocab_size, seed=10 * step + r)).loss for r in range(2)]
        loss = (pair[0] + pair[1]) / 2
        loss.backward()
        assert loss.item() == pytest.approx(res["losses"][step], rel=1e-5)
        for name, grad in nonempty(list(res["grads"][step].items()), "adapter gradients"):
            torch.testing.assert_close(ours[name].grad, grad, rtol=1e-4, atol=1e-6, msg=f"step {step}: {name}")
        opt.step()
        opt.zero_grad(set_to_none=True)


def _check_resume_share(tmp_path) -> None:
    """The checkpoint holds the adapters, not the frozen base (reloaded from the model). Resuming from object
    storage: each rank fetched the metadata, the train state, its own RNG file and the
    byte ranges its pieces are in (about all of its own shard file, a few blocks of the other's), not the whole
    checkpoint, and came back bit for bit."""
    from trainer.run_folder import checkpoint as ckpt

    folder = tmp_path / "run" / ckpt.dir_name(2)
    saved = {p.relative_to(folder).as_posix(): p.stat().st_size for p in folder.rglob("*") if p.is_file()}
    import torch.distributed.checkpoint as dcp

    keys = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    weights = nonempty([k for k in keys if k.startswith("model.")], "checkpointed weights")
    assert all(".lora_" in k for k in weights), [k for k in weights if ".lora_" not in k][:3]  # the adapters only
    shards = nonempty(sorted(f for f in saved if f.endswith(".distcp")), "shard files")
    assert len(shards) == 2 and min(saved[f] for f in shards) > 50_000, saved
    for r in (0, 1):
        res = torch.load(tmp_path / f"rank{r}.pt")
        fetched = res["fetched"]
        assert res["same"] and res["same_moments"], r  # weights and optimizer state, bit for bit
        assert f"rng/rank_{r}.pt" in fetched and f"rng/rank_{1 - r}.pt" not in fetched
        assert {".metadata", ckpt.MARKER, ckpt.TRAIN_STATE} <= set(fetched)
        own, other = f"__{r}_0.distcp", f"__{1 - r}_0.distcp"
        assert fetched[own] >= saved[own] * 0.9, (r, fetched, saved)
        assert fetched.get(other, 0) <= saved[other] * 0.1, (r, fetched, saved)


def _lora_cfg(demo_assets, tmp_path, name: str, **kw):
    from trainer.config.flags import TrainConfig

    return TrainConfig(model=str(demo_assets["model"]), dataset=str(demo_assets["train"]), seq_len=128,
                       global_batch_size=4, num_workers=1, steps=4, log_every=1, checkpoint_every=2, progress=False,
                       storage_path=str(tmp_path), run_name=name, cache_dir=str(tmp_path / "cache"),
                       method="lora", lora_rank=RANK, lora_alpha=ALPHA, lora_dropout=0.1, report_to="none", **kw)


def test_a_lora_run_exports_what_peft_loads_and_resumes_bit_exactly(process_group, demo_assets, tmp_path):
    """The loop in-process on a one-rank gloo group: the adapter folder loads with peft onto the base and gives
    the merged folder's logits; the merged folder is peft's merge_and_unload; a run killed after its step-2
    checkpoint resumes to the same adapters as one that was not (dropout on: the RNG state resumes too)."""
    import peft
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from trainer.loop.parallel import setup_parallel
    from trainer.loop.run import run
    from trainer.run_folder.export import ADAPTER_DIR, EXPORT_DIR
    from trainer.storage import Storage

    cfg = _lora_cfg(demo_assets, tmp_path, "straight")
    run(cfg, setup_parallel(cfg, 0, 1, 0), Storage.from_uri(cfg.run_uri))
    adapter_dir, merged_dir = tmp_path / "straight" / ADAPTER_DIR, tmp_path / "straight" / EXPORT_DIR
    base = AutoModelForCausalLM.from_pretrained(str(demo_assets["model"]), dtype=torch.float32)
    tuned = peft.PeftModel.from_pretrained(base, str(adapter_dir)).eval()
    adapters = load_file(str(adapter_dir / "adapter_model.safetensors"))
    assert any(v.abs().sum() > 0 for k, v in nonempty(list(adapters.items()), "adapters") if "lora_B" in k)
    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir), dtype=torch.float32).eval()
    ids = _batch(base.config.vocab_size, seed=99)["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, tuned(input_ids=ids).logits, rtol=0.02, atol=0.02)
        reference = {k: v.to(torch.bfloat16) for k, v in tuned.merge_and_unload().state_dict().items()}
    exported = load_file(str(merged_dir / "model.safetensors"))
    for key, value in nonempty(list(exported.items()), "exported weights"):
        assert torch.equal(value, reference[key]), key

    assert_resumes_bit_exactly(_lora_cfg(demo_assets, tmp_path, "killed", fail_at_step=3), adapters)


def assert_resumes_bit_exactly(killed, adapters: dict) -> None:
    """A one-rank run that fails at its --fail-at-step, run again: it resumes and ends with `adapters`, to the bit."""
    from safetensors.torch import load_file

    from trainer.loop.parallel import setup_parallel
    from trainer.loop.run import InjectedFailure, run
    from trainer.run_folder.export import ADAPTER_DIR
    from trainer.storage import Storage

    with pytest.raises(InjectedFailure):
        run(killed, setup_parallel(killed, 0, 1, 0), Storage.from_uri(killed.run_uri))
    run(killed, setup_parallel(killed, 0, 1, 0), Storage.from_uri(killed.run_uri))
    resumed = load_file(str(Path(killed.run_uri) / ADAPTER_DIR / "adapter_model.safetensors"))
    for key, value in nonempty(list(adapters.items()), "adapters"):
        assert torch.equal(resumed[key], value), key


def test_bad_lora_settings_are_refused_before_ray(demo_assets, tmp_path):
    from trainer.config.flags import ConfigError, TrainConfig, validate
    from trainer.jobs.launch import preflight

    with pytest.raises(ConfigError, match=r"--lora-target-modules: LoRA target modules nope_proj match no linear"):
        preflight(_lora_cfg(demo_assets, tmp_path, "bad", lora_target_modules="q_proj,nope_proj"))
    with pytest.raises(ConfigError, match=r"--lora-rank \(lora_rank\) = 8: applies to --method lora"):
        validate(TrainConfig(model="m", dataset="d", lora_rank=8))


def test_a_bf16_frozen_base_shards_beside_fp32_adapters(process_group, demo_assets):
    """What build does on GPU (the plan counts the base at 2 bytes): FSDP2 shards a bf16 frozen base and fp32
    adapters in the same groups, and backward reaches every adapter (here on CPU, one gloo rank)."""
    from trainer.model import adapters
    from trainer.model.build import build_model

    model = build_model(str(demo_assets["model"]), device=torch.device("cpu"), use_gpu=False,
                        lora=dict(rank=RANK, alpha=ALPHA, frozen_dtype=torch.bfloat16))
    _set_b(model, seed=5)
    dtypes = {(p.requires_grad, p.dtype) for p in model.parameters()}
    assert dtypes == {(False, torch.bfloat16), (True, torch.float32)}
    model(**_batch(model.config.vocab_size, seed=1)).loss.backward()
    grads = nonempty(list(adapters.adapter_parameters(model).values()), "adapters")
    assert all(p.grad is not None and p.grad.to_local().abs().sum() > 0 for p in grads)
    assert all(p.grad is None for p in nonempty([p for p in model.parameters() if not p.requires_grad], "frozen"))
