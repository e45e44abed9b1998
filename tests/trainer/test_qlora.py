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
        unchanged = all(torch.equal(before[n][k], after[n][k]) for n in nf4 for k in before[n])
        torch.save({"gathered": gathered, "sizes": sizes, "local_rows": {n: quantize.local_nf4(p).shape[0]
                                                                          for n, p in nf4.items()},
                    "losses": losses, "grads": grads, "frozen_grads": frozen_grads, "unchanged": unchanged,
                    "adapters_start": adapters_start}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


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
