"""Evaluation: the eval loss of held-out data, packed as training is, reduced as the training loss is, logged.

The loop runs in-process on a one-rank gloo group (the collectives' code path of the Ray workers);
the loss at the start is checked against the model's own forward (transformers, full logits) over
the same packed rows, so the packing, the masks and the reduction are all checked.
"""

from __future__ import annotations

import json

import pytest

from trainer.config.flags import ConfigError, TrainConfig
from trainer.config.load import merge
from trainer.data.packing import IGNORE_INDEX, DataSpec, prepare
from trainer.loop.parallel import setup_parallel
from trainer.loop.run import run
from trainer.storage import Storage


def reference_loss(model_dir, packed) -> float:
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    total, tokens = 0.0, 0
    with torch.no_grad():
        for row in range(packed.num_rows):
            ids = torch.as_tensor(packed.arrays["input_ids"][row:row + 1], dtype=torch.long)
            pos = torch.as_tensor(packed.arrays["position_ids"][row:row + 1], dtype=torch.long)
            labels = torch.as_tensor(packed.arrays["labels"][row:row + 1], dtype=torch.long)
            logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits.float()  # packed: no cache
            total += float(F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
                                           reduction="sum"))
            tokens += int((labels != IGNORE_INDEX).sum())
    return total / tokens


def test_the_eval_loss_of_held_out_data_is_logged_at_the_start_and_every_n_steps(process_group, demo_assets,
                                                                                 tmp_path):
    cfg = TrainConfig(model=str(demo_assets["model"]), dataset=str(demo_assets["train"]), seq_len=128,
                      global_batch_size=4, micro_batch_size=2, num_workers=1, steps=4, log_every=4,
                      eval_every=2, eval_on_start=True, eval_dataset=str(demo_assets["heldout"]), eval_batch_size=3,
                      export=False, progress=False, report_to="tensorboard", storage_path=str(tmp_path),
                      run_name="ev", cache_dir=str(tmp_path / "cache"))
    run(cfg, setup_parallel(cfg, 0, 1, 0), Storage.from_uri(cfg.run_uri))

    lines = [json.loads(line) for line in (tmp_path / "ev" / "metrics.jsonl").read_text().splitlines()]
    evals = [(m["step"], "loss" in m) for m in lines if "eval_loss" in m]
    assert evals == [(0, False), (2, True), (4, True)]  # at the start, then with the training metrics
    held_out = prepare(DataSpec.eval_from_config(cfg), tokenizer=_tokenizer(cfg), seq_len=cfg.seq_len,
                       cache_dir=cfg.cache_dir)
    start = lines[0]
    assert start["eval_tokens"] == int((held_out.arrays["labels"] != IGNORE_INDEX).sum()) > 0
    assert start["eval_loss"] == pytest.approx(reference_loss(demo_assets["model"], held_out), rel=1e-4)
    assert lines[-1]["eval_loss"] < start["eval_loss"]  # it learns
    record = json.loads((tmp_path / "ev" / "run.json").read_text())
    assert [r["step"] for r in record["eval"]["history"]] == [0, 2, 4]
    assert record["eval"]["best"]["eval_loss"] == min(r["eval_loss"] for r in record["eval"]["history"])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "ev" / "tensorboard")).Reload()
    assert [e.step for e in events.Scalars("eval/loss")] == [0, 2, 4]


def _tokenizer(cfg):
    from trainer.model.sources import load_tokenizer

    return load_tokenizer(cfg.model)


@pytest.mark.parametrize("text, want", [
    ({"eval_strategy": "steps", "eval_steps": 50}, 50),
    ({"eval_strategy": "steps", "logging_steps": 25}, 25),  # transformers: eval_steps defaults to logging_steps
    ({"eval_strategy": "no", "eval_steps": 50}, 0),
    ({}, 0),
])
def test_trls_eval_strategy_and_steps_set_how_often_the_eval_loss_is_computed(text, want):
    cfg = merge({"model_name_or_path": "m", "dataset_name": "d", "per_device_eval_batch_size": 4,
                 "dataset_test_split": "valid", **text}, {})
    assert (cfg.eval_every, cfg.eval_batch_size, cfg.eval_split) == (want, 4, "valid")


def test_evaluation_by_epoch_and_the_best_checkpoint_are_refused_with_the_fix():
    with pytest.raises(ConfigError) as e:
        merge({"model_name_or_path": "m", "dataset_name": "d", "eval_strategy": "epoch",
               "load_best_model_at_end": True}, {})
    text = "\n".join(e.value.problems)
    assert "use eval_strategy: steps with eval_steps: N" in text and "best checkpoint by eval loss" in text
