"""LoRA through peft under FSDP2 (trainer.model.adapters): two gloo ranks against one process of peft itself."""

from __future__ import annotations

import os

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
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
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
        if rank == 0:
            torch.save({"start": start, "end": end, "losses": losses, "grads": grads, "frozen_grads": frozen_grads},
                       os.path.join(out_dir, "fsdp.pt"))
    finally:
        dist.destroy_process_group()


def test_lora_under_fsdp2_on_two_ranks_is_peft_in_one_process(demo_assets, tmp_path):
    """Two real gloo ranks (FSDP2's sharded adapters and gradient reduction need a 2-rank world): the same loss
    and adapter gradients per step as peft's own model on one process; frozen weights get no gradient and stay."""
    import peft
    from transformers import AutoModelForCausalLM

    mp.start_processes(_lora_worker, args=(2, free_port(), str(demo_assets["model"]), str(tmp_path)),
                       nprocs=2, join=True, start_method="spawn")
    res = torch.load(tmp_path / "fsdp.pt")
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
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    for step in range(2):
        pair = [model(**_batch(base.config.vocab_size, seed=10 * step + r)).loss for r in range(2)]
        loss = (pair[0] + pair[1]) / 2
        loss.backward()
        assert loss.item() == pytest.approx(res["losses"][step], rel=1e-5)
        for name, grad in nonempty(list(res["grads"][step].items()), "adapter gradients"):
            torch.testing.assert_close(ours[name].grad, grad, rtol=1e-4, atol=1e-6, msg=f"step {step}: {name}")
        opt.step()
        opt.zero_grad(set_to_none=True)
