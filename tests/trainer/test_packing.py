"""Packing correctness: a packed batch gives the same per-document losses as each document alone."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from trainer import demo
from trainer.data.formats import Example, Renderer, to_example
from trainer.data.packing import pack
from trainer.loop.step import IGNORE_INDEX, token_loss_sum


def tokenize_messages(tokenizer, messages: list[dict]) -> tuple[list[int], list[bool]]:
    """One conversation's token ids and assistant mask (the default masking), as the data pipeline renders it."""
    return Renderer(tokenizer).encode(Example("messages", True, messages=to_example(
        {"messages": messages}, "messages").messages))


@torch.no_grad()
def document_losses(model: torch.nn.Module, batch) -> list[torch.Tensor]:
    """Per-document mean response-token loss of a packed micro-batch (documents split at position 0)."""
    out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)
    token_loss = F.cross_entropy(out.logits.float().flatten(0, 1), batch["labels"].flatten(),
                                 ignore_index=IGNORE_INDEX, reduction="none").view(batch["labels"].shape)
    losses = []
    for row in range(batch["input_ids"].shape[0]):
        pos = batch["position_ids"][row]
        starts = (pos == 0).nonzero().flatten().tolist() + [pos.numel()]
        for a, b in pairwise(starts):
            mask = batch["labels"][row, a:b] != IGNORE_INDEX
            if mask.any():
                losses.append(token_loss[row, a:b][mask].mean())
    return losses


@pytest.fixture(scope="module")
def tokenizer():
    return demo.build_tokenizer()


def _model(attn: str):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(demo.model_config(), attn_implementation=attn, dtype=torch.float32)
    return model.eval()


def _docs(tokenizer):
    rows, _ = demo.make_dataset(seed=3, n_train=7, n_eval=1)
    return [tokenize_messages(tokenizer, r["messages"]) for r in rows]


def _batch(arrays, rows=slice(None)):
    return {k: torch.from_numpy(arrays[k][rows]).long() for k in ("input_ids", "labels", "position_ids")}


# flex_attention is what the padding benchmark uses on a GPU; on CPU it compiles for each batch shape (tens of
# seconds each), so both batches below have one shape: the documents alone are one row each, and the packed
# batch is filled up to as many rows with rows of padding only (no trained token: no document of theirs).
@pytest.mark.parametrize("attn", ["sdpa", "eager", pytest.param("flex_attention", marks=pytest.mark.slow)])
def test_packed_batch_gives_the_same_per_document_losses_as_documents_alone(tokenizer, attn):
    model = _model(attn)
    docs = _docs(tokenizer)
    packed, stats = pack(docs, seq_len=96, pad_id=tokenizer.pad_token_id)
    assert stats.rows < stats.documents and stats.truncated == 0  # several documents really share rows, whole
    singles = [pack([doc], seq_len=96, pad_id=tokenizer.pad_token_id)[0] for doc in docs]
    alone_batch = {k: np.concatenate([one[k] for one in singles]) for k in ("input_ids", "labels", "position_ids")}
    padding_row = {"input_ids": np.full((1, 96), tokenizer.pad_token_id, np.int32),
                   "labels": np.full((1, 96), IGNORE_INDEX, np.int32), "position_ids": np.arange(96)[None]}
    packed = {k: np.concatenate([packed[k], *[padding_row[k]] * (len(docs) - stats.rows)])
              for k in ("input_ids", "labels", "position_ids")}
    assert packed["input_ids"].shape == alone_batch["input_ids"].shape == (len(docs), 96)

    packed_losses = torch.stack(document_losses(model, _batch(packed)))
    alone = torch.stack(document_losses(model, _batch(alone_batch)))
    assert packed_losses.shape == alone.shape == (len(docs),)
    torch.testing.assert_close(packed_losses, alone, rtol=1e-5, atol=1e-5)


def _token_losses(model, batch, position_ids):
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], position_ids=position_ids, use_cache=False)
    return torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), batch["labels"].flatten(),
                                             ignore_index=IGNORE_INDEX, reduction="none").view(batch["labels"].shape)


def _segments(batch):
    """(row, start, end, first_in_row) of every document with response tokens."""
    for row in range(batch["input_ids"].shape[0]):
        starts = (batch["position_ids"][row] == 0).nonzero().flatten().tolist() + [batch["input_ids"].shape[1]]
        for k, (a, b) in enumerate(pairwise(starts)):
            if (batch["labels"][row, a:b] != IGNORE_INDEX).any():
                yield row, a, b, k == 0


def test_the_check_detects_attention_leaking_across_documents(tokenizer):
    """The same packed tokens under one running position sequence (a plain causal mask) give other
    losses for every document that has a predecessor in its row: the equality above is not vacuous."""
    model = _model("sdpa")
    packed, _ = pack(_docs(tokenizer), seq_len=96, pad_id=tokenizer.pad_token_id)
    batch = _batch(packed)
    good = _token_losses(model, batch, batch["position_ids"])
    leaky = _token_losses(model, batch, torch.arange(batch["input_ids"].shape[1]).expand_as(batch["input_ids"]))
    firsts, later = [], []
    for row, a, b, first in _segments(batch):
        mask = batch["labels"][row, a:b] != IGNORE_INDEX
        pair = (good[row, a:b][mask].mean(), leaky[row, a:b][mask].mean())
        (firsts if first else later).append(pair)
    assert firsts and later
    for g, leak in firsts:
        torch.testing.assert_close(g, leak, rtol=1e-5, atol=1e-5)
    assert max(abs(float(g - leak)) for g, leak in later) > 1e-3


def test_training_loss_sum_equals_sum_over_documents(tokenizer):
    model = _model("sdpa")
    docs = _docs(tokenizer)
    packed, stats = pack(docs, seq_len=96, pad_id=tokenizer.pad_token_id)
    with torch.no_grad():
        total = token_loss_sum(model, _batch(packed))
    per_doc_sum = 0.0
    for doc in docs:
        single, _ = pack([doc], seq_len=len(doc[0]), pad_id=tokenizer.pad_token_id)
        with torch.no_grad():
            per_doc_sum += float(token_loss_sum(model, _batch(single)))
    assert float(total) == pytest.approx(per_doc_sum, rel=1e-5)
    assert stats.loss_tokens == sum(int((single_labels != IGNORE_INDEX).sum())
                                    for single_labels in [pack([d], len(d[0]), 0)[0]["labels"] for d in docs])
