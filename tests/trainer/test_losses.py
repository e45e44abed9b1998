"""The chunked linear cross-entropy equals the plain loss, values and gradients, alone and
inside the trainer's step, unsharded and under FSDP2 with the tied lm_head sharded."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from trainer.loop.parallel import ONE_PROCESS
from trainer.loop.step import IGNORE_INDEX, loss_index, resolve_loss, token_loss_sum, train_step
from trainer.model.losses import chunk_rows_for, chunked_linear_cross_entropy, linear_cross_entropy_sum

from .conftest import free_port


def _case(n=300, d=32, vocab=97, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=g).to(dtype).requires_grad_()
    weight = (torch.randn(vocab, d, generator=g) * 0.3).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab, (n,), generator=g)
    labels[torch.rand(n, generator=g) < 0.4] = IGNORE_INDEX
    return hidden, weight, labels


def _plain(hidden, weight, labels):
    return F.cross_entropy(F.linear(hidden, weight).float(), labels, ignore_index=IGNORE_INDEX, reduction="sum")


def _value_and_grads(fn, hidden, weight, labels, scale=0.37):
    hidden.grad = weight.grad = None
    loss = fn(hidden, weight, labels)
    (loss * scale).backward()
    return loss.detach(), hidden.grad.clone(), weight.grad.clone()


@pytest.mark.parametrize("chunk", [7, 64, 1000])
def test_chunked_equals_plain_in_fp32(chunk):
    hidden, weight, labels = _case()
    ref = _value_and_grads(_plain, hidden, weight, labels)
    got = _value_and_grads(lambda h, w, y: chunked_linear_cross_entropy(h, w, y, chunk_rows=chunk),
                           hidden, weight, labels)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert ref[1][labels == IGNORE_INDEX].abs().max() == 0  # ignored tokens get no gradient
    assert ref[1].abs().max() > 0 and ref[2].abs().max() > 0


def test_chunked_is_as_accurate_as_plain_in_bf16():
    hidden, weight, labels = _case(n=512, d=64, vocab=301, dtype=torch.bfloat16)
    plain = _value_and_grads(_plain, hidden, weight, labels)
    got = _value_and_grads(lambda h, w, y: chunked_linear_cross_entropy(h, w, y, chunk_rows=128),
                           hidden, weight, labels)
    assert got[1].dtype == got[2].dtype == torch.bfloat16 and got[0].dtype == torch.float32
    exact = _value_and_grads(_plain, hidden.detach().double().requires_grad_(),
                             weight.detach().double().requires_grad_(), labels)
    for name, a, b, e in zip(("loss", "hidden grad", "weight grad"), got, plain, exact, strict=True):
        scale = float(e.abs().max())
        err_chunked, err_plain = float((a.double() - e).abs().max()), float((b.double() - e).abs().max())
        assert err_chunked <= 1e-2 * scale, (name, err_chunked, scale)  # bf16 rounding, no more
        assert err_chunked <= 1.5 * err_plain + 1e-3 * scale, (name, err_chunked, err_plain)


def test_restricting_to_labelled_tokens_changes_nothing():
    hidden, weight, labels = _case()
    ref = _value_and_grads(_plain, hidden, weight, labels)
    idx = loss_index(labels)
    assert len(idx) == int((labels != IGNORE_INDEX).sum())
    for impl in ("chunked", "plain"):
        got = _value_and_grads(lambda h, w, y: linear_cross_entropy_sum(h, w, y, impl=impl, index=idx, chunk_rows=50),
                               hidden, weight, labels)
        for a, b in zip(got, ref, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_no_labelled_token_still_gives_the_weight_a_zero_gradient():
    # Under FSDP every rank must produce the same gradients to reduce, even an all-prompt micro-batch.
    hidden, weight, labels = _case(n=10)
    loss = linear_cross_entropy_sum(hidden, weight, labels, index=torch.zeros(0, dtype=torch.long))
    loss.backward()
    assert float(loss.detach()) == 0.0 and weight.grad is not None and weight.grad.abs().max() == 0


def test_chunk_size_bounds_the_logits_memory():
    assert chunk_rows_for(151_936) * 151_936 * 6 <= 1 << 30
    assert chunk_rows_for(151_936) >= 1024  # large enough for an efficient matmul
    assert chunk_rows_for(128) % 64 == 0


def test_loss_choice_is_checked():
    assert resolve_loss("auto", torch.device("cpu")) == "chunked"
    assert resolve_loss("plain", torch.device("cpu")) == "plain"
    with pytest.raises(ValueError, match="liger.*CUDA.*use 'chunked'"):
        resolve_loss("liger", torch.device("cpu"))
    with pytest.raises(ValueError, match="loss 'fast'"):
        resolve_loss("fast", torch.device("cpu"))


def packed_batch(vocab: int, rows: int = 2, seq: int = 48, seed: int = 0) -> dict[str, torch.Tensor]:
    """Packed rows: several documents per row (position ids restart), prompt tokens unlabelled."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (rows, seq), generator=g)
    pos = torch.cat([torch.arange(20), torch.arange(seq - 20)]).repeat(rows, 1)
    labels = torch.roll(ids, -1, 1).clone()
    labels[:, :6] = IGNORE_INDEX
    labels[:, 19] = IGNORE_INDEX
    labels[:, 20:26] = IGNORE_INDEX
    labels[:, -1] = IGNORE_INDEX
    return {"input_ids": ids, "position_ids": pos, "labels": labels}


def test_token_loss_sum_matches_plain_on_the_model_and_restores_the_head(demo_assets):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(demo_assets["model"])
    batch = packed_batch(model.config.vocab_size)
    results = {}
    for impl in ("plain", "chunked"):
        model.zero_grad()
        mb = {**batch, "loss_index": loss_index(batch["labels"])}
        loss = token_loss_sum(model, mb, impl)
        loss.backward()
        results[impl] = (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    torch.testing.assert_close(results["chunked"][0], results["plain"][0], rtol=1e-5, atol=1e-5)
    for name, grad in results["plain"][1].items():
        torch.testing.assert_close(results["chunked"][1][name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert "forward" not in model.lm_head.__dict__  # the head is itself again
    assert model(input_ids=batch["input_ids"]).logits.shape[-1] == model.config.vocab_size


# ---------------------------------------------------------------- FSDP2, 2 gloo ranks

def _fsdp_worker(rank: int, world: int, port: int, model_dir: str, out_dir: str) -> None:
    import torch.distributed as dist

    from trainer.model.build import build_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        cpu = torch.device("cpu")
        result = {}
        for impl in ("plain", "chunked"):
            model = build_model(model_dir, device=cpu, use_gpu=False)
            assert isinstance(model.lm_head.weight, DTensor)  # sharded outside forward
            vocab = model.config.vocab_size
            batches = [packed_batch(vocab, seed=10 * rank + i) for i in range(2)]
            # raw gradients of one micro-batch, after FSDP's reduce-scatter
            token_loss_sum(model, {**batches[0], "loss_index": loss_index(batches[0]["labels"])}, impl).backward()
            grads = {n: p.grad.full_tensor().clone() for n, p in model.named_parameters()}
            model.zero_grad(set_to_none=True)
            # SGD: the update is the accumulated, clipped gradient itself (Adam's first step is
            # sign(grad) and would magnify rounding differences of near-zero gradients)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            out = train_step(model, opt, None, batches, device=cpu, collectives=ONE_PROCESS, loss=impl)
            params = {n: p.full_tensor().clone() for n, p in model.named_parameters()}
            result[impl] = {"grads": grads, "loss": float(out.loss), "grad_norm": float(out.grad_norm),
                            "params": params}
        if rank == 0:
            torch.save(result, os.path.join(out_dir, "fsdp.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_chunked_equals_plain_under_fsdp2_with_the_tied_head_sharded(demo_assets, tmp_path):
    mp.start_processes(_fsdp_worker, args=(2, free_port(), str(demo_assets["model"]), str(tmp_path)),
                       nprocs=2, join=True, start_method="spawn")
    res = torch.load(tmp_path / "fsdp.pt")
    plain, chunked = res["plain"], res["chunked"]
    assert chunked["loss"] == pytest.approx(plain["loss"], rel=1e-5)
    assert chunked["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-4)
    for name, grad in plain["grads"].items():
        torch.testing.assert_close(chunked["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)
    # the tied embedding/lm_head gradient includes the lm_head part from both ranks
    assert plain["grads"]["model.embed_tokens.weight"].abs().max() > 0
    for name, p in plain["params"].items():
        torch.testing.assert_close(chunked["params"][name], p, rtol=1e-4, atol=1e-6, msg=name)


# ---------------------------------------------------------------- what the model does after its head

def _transformed_plain(scale, softcap):
    from trainer.model.losses import transformed_logits

    return lambda h, w, y: F.cross_entropy(transformed_logits(F.linear(h, w), scale, softcap), y,
                                           ignore_index=IGNORE_INDEX, reduction="sum")


@pytest.mark.parametrize("scale,softcap", [(1.0, 3.0), (0.25, None), (0.5, 2.0)])
def test_chunked_applies_the_models_softcap_and_logit_scale_exactly(scale, softcap):
    hidden, weight, labels = _case()
    with torch.no_grad():
        weight.mul_(10)  # logits well beyond the cap: tanh saturates
    ref = _value_and_grads(_transformed_plain(scale, softcap), hidden, weight, labels)
    got = _value_and_grads(lambda h, w, y: chunked_linear_cross_entropy(h, w, y, chunk_rows=64, scale=scale,
                                                                         softcap=softcap), hidden, weight, labels)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    untransformed = _value_and_grads(_plain, hidden, weight, labels)
    assert abs(float(untransformed[0]) - float(ref[0])) > 0.1 * float(ref[0])  # the transform matters here
    for impl in ("plain", "chunked"):
        got = _value_and_grads(lambda h, w, y: linear_cross_entropy_sum(h, w, y, impl=impl, scale=scale,
                                                                         softcap=softcap), hidden, weight, labels)
        torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-5)


def test_softcap_in_bf16_stays_within_bf16_rounding():
    hidden, weight, labels = _case(n=512, d=64, vocab=301, dtype=torch.bfloat16)
    exact = _value_and_grads(_transformed_plain(1.0, 4.0), hidden.detach().double().requires_grad_(),
                             weight.detach().double().requires_grad_(), labels)
    got = _value_and_grads(lambda h, w, y: chunked_linear_cross_entropy(h, w, y, chunk_rows=128, softcap=4.0),
                           hidden, weight, labels)
    for name, a, e in zip(("loss", "hidden grad", "weight grad"), got, exact, strict=True):
        assert float((a.double() - e).abs().max()) <= 1e-2 * float(e.abs().max()), name


def test_a_model_that_changes_its_logits_in_an_unknown_way_gets_the_plain_loss(caplog):
    """The chunked loss cannot know this transform: the check sees the mismatch and falls back."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from trainer.loop.step import check_loss_path, head_transform

    class ShiftedLogits(LlamaForCausalLM):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 0.5 + 1.0
            return out

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)
    torch.manual_seed(0)
    model = ShiftedLogits(config)
    assert head_transform(model).scale == 1.0 and head_transform(model).softcap is None
    with caplog.at_level("WARNING", logger="trainer"):
        assert check_loss_path(model, "chunked", torch.device("cpu"), collectives=ONE_PROCESS) == "plain"
    assert "does not reproduce ShiftedLogits's own loss" in caplog.text
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    batch = packed_batch(64)
    out = train_step(model, opt, None, [batch], device=torch.device("cpu"), collectives=ONE_PROCESS, grad_clip=0.0,
                     loss="chunked")
    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
    own = F.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX)
    assert float(out.loss) == pytest.approx(float(own), rel=1e-5)
    plain_llama = LlamaForCausalLM(config)
    assert check_loss_path(plain_llama, "chunked", torch.device("cpu"), collectives=ONE_PROCESS) == "chunked"
