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
from trainer.data.packing import IGNORE_INDEX, DataSpec, PackedData, prepare
from trainer.loop.parallel import setup_parallel
from trainer.loop.run import run
from trainer.storage import Storage

GIB = 2 ** 30


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
    """Trained on the small held-out file itself (14 packed rows: 3 steps an epoch), so epochs end within 6 steps.

    The run also keeps the pre-flight's memory plan in run.json, handed to the worker as the driver hands it
    (build_trainer's train_loop_config), beside the peak measured at its logging steps."""
    from transformers import AutoConfig

    from trainer.jobs.launch import build_trainer, preflight
    from trainer.jobs.plan import run_prediction
    from trainer.loop.run import MEMORY_PLAN_KEY
    from trainer.model import footprint as fp

    cfg = TrainConfig(model=str(demo_assets["model"]), dataset=str(demo_assets["heldout"]), seq_len=128,
                      global_batch_size=4, micro_batch_size=2, num_workers=1, steps=6, log_every=6,
                      eval_every=4, eval_each_epoch=True, eval_on_start=True, checkpoint_each_epoch=True,
                      eval_dataset=str(demo_assets["heldout"]), eval_batch_size=3, export=False, progress=False,
                      report_to="tensorboard", storage_path=str(tmp_path), run_name="ev", cache_dir=str(tmp_path / "c"))
    handed = build_trainer(cfg, found=preflight(cfg)).train_loop_config[MEMORY_PLAN_KEY]
    run(cfg, setup_parallel(cfg, 0, 1, 0), Storage.from_uri(cfg.run_uri), memory_plan=handed)

    lines = [json.loads(line) for line in (tmp_path / "ev" / "metrics.jsonl").read_text().splitlines()]
    evals = [(m["step"], "loss" in m) for m in lines if "eval_loss" in m]
    assert PackedData(tmp_path / "c" / "data" / next(p.name for p in (tmp_path / "c" / "data").iterdir()
                                                     if (p / "meta.json").is_file())).steps_per_epoch(4) == 3
    # at the start; then with the training metrics: each epoch's end (3, 6) and every 4 steps (4)
    assert evals == [(0, False), (3, True), (4, True), (6, True)]
    events = [json.loads(line) for line in (tmp_path / "ev" / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["event"] == "checkpoint"] == [3, 6]  # each epoch's end
    held_out = prepare(DataSpec.eval_from_config(cfg), tokenizer=_tokenizer(cfg), seq_len=cfg.seq_len,
                       cache_dir=cfg.cache_dir)
    start = lines[0]
    assert start["eval_tokens"] == int((held_out.arrays["labels"] != IGNORE_INDEX).sum()) > 0
    assert start["eval_loss"] == pytest.approx(reference_loss(demo_assets["model"], held_out), rel=1e-4)
    assert lines[-1]["eval_loss"] < start["eval_loss"]  # it learns
    record = json.loads((tmp_path / "ev" / "run.json").read_text())
    assert [r["step"] for r in record["eval"]["history"]] == [0, 3, 4, 6]
    assert record["eval"]["best"]["eval_loss"] == min(r["eval_loss"] for r in record["eval"]["history"])
    model_config = AutoConfig.from_pretrained(str(demo_assets["model"]))
    memory = record["memory"]
    assert memory["plan"] == run_prediction(cfg, model_config)
    written = fp.footprint(fp.census(model_config), "full", 1, seq_len=128, micro_batch=2)  # the run as configured
    assert (memory["plan"]["params_gib"], memory["plan"]["gib_per_gpu"], memory["plan"]["activation_checkpointing"]) \
        == (round(written.params_bytes / GIB, 3), round(written.peak_bytes / GIB, 3), False)
    peaks = {m["step"]: m["peak_mem_gb"] for m in lines if "peak_mem_gb" in m}
    assert sorted(peaks) == [3, 4, 6] and memory["measured"]["peak_gib"] == max(peaks.values()) > 0
    assert memory["measured"]["step"] == min(s for s, v in peaks.items() if v == max(peaks.values()))
    assert memory["measured"]["kind"] == "host_max_rss_process"  # on CPU; cuda_max_allocated on a GPU
    assert memory["measured_over_plan"] == round(memory["measured"]["peak_gib"] / memory["plan"]["gib_per_gpu"], 3)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(tmp_path / "ev" / "tensorboard")).Reload()
    assert [e.step for e in board.Scalars("eval/loss")] == [0, 3, 4, 6]


def _tokenizer(cfg):
    from trainer.model.sources import load_tokenizer

    return load_tokenizer(cfg.model)


@pytest.mark.parametrize("text, want", [
    ({"eval_strategy": "steps", "eval_steps": 50}, 50),
    ({"eval_strategy": "steps", "logging_steps": 25}, 25),  # transformers: eval_steps defaults to logging_steps
    ({"eval_strategy": "no", "eval_steps": 50}, 0),
    ({"eval_strategy": "epoch"}, "epoch"),
    ({}, 0),
])
def test_trls_eval_strategy_and_steps_set_how_often_the_eval_loss_is_computed(text, want):
    cfg = merge({"model_name_or_path": "m", "dataset_name": "d", "per_device_eval_batch_size": 4,
                 "dataset_test_split": "valid", **text}, {})
    assert ("epoch" if cfg.eval_each_epoch else cfg.eval_every, cfg.eval_batch_size, cfg.eval_split) == \
        (want, 4, "valid")
    assert cfg.evaluates == bool(want)


def test_an_unknown_eval_strategy_a_best_checkpoint_without_evaluation_and_other_metrics_are_refused_with_the_fix():
    with pytest.raises(ConfigError) as e:
        merge({"model_name_or_path": "m", "dataset_name": "d", "eval_strategy": "best",
               "load_best_model_at_end": True, "metric_for_best_model": "accuracy", "greater_is_better": True}, {})
    text = "\n".join(e.value.problems)
    assert len(e.value.problems) == 3, text
    for needle in ("use eval_strategy: steps, epoch or no",
                   "'metric_for_best_model' = 'accuracy': not applicable here: the only metric evaluated here is the "
                   "eval loss", "'greater_is_better' = True: not applicable here: the best checkpoint has the lowest"):
        assert needle in text
    with pytest.raises(ConfigError, match=r"--keep-best \(keep_best\) = True: needs held-out evaluation during the "
                                          r"run: pass --eval-every N or --eval-each-epoch"):
        merge({"model_name_or_path": "m", "dataset_name": "d", "load_best_model_at_end": True}, {})


def test_load_best_model_at_end_keeps_and_exports_the_checkpoint_with_the_lowest_eval_loss(process_group, demo_assets,
                                                                                         tmp_path):
    """A constant lr of 0.05 makes the tiny model's eval loss rise from step 2 to 4: the best is not the last."""
    from trainer.jobs.launch import checkpoint_config
    from trainer.run_folder import checkpoint as ckpt

    trl_yaml = {"model_name_or_path": str(demo_assets["model"]), "dataset_name": str(demo_assets["heldout"]),
                "load_best_model_at_end": True, "metric_for_best_model": "eval_loss", "greater_is_better": False,
                "eval_strategy": "steps", "eval_steps": 2, "save_steps": 2, "save_total_limit": 1, "max_steps": 4,
                "learning_rate": 0.05, "lr_scheduler_type": "constant", "per_device_train_batch_size": 2,
                "gradient_accumulation_steps": 2, "max_length": 128, "gradient_checkpointing": False}
    cfg = merge(trl_yaml, {"num_workers": 1, "eval_dataset": str(demo_assets["heldout"]), "progress": False,
                           "storage_path": str(tmp_path), "run_name": "best", "cache_dir": str(tmp_path / "c")})
    assert cfg.keep_best and cfg.sources["settings"]["keep_best"] == \
        "YAML: load_best_model_at_end, metric_for_best_model, greater_is_better"
    ray_keeps = checkpoint_config(cfg)  # Ray keeps the best by eval loss (and the latest, to resume from)
    assert (ray_keeps.num_to_keep, ray_keeps.checkpoint_score_attribute, ray_keeps.checkpoint_score_order) == \
        (1, "eval_loss", "min")
    run(cfg, setup_parallel(cfg, 0, 1, 0), Storage.from_uri(cfg.run_uri))

    folder = tmp_path / "best"
    record = json.loads((folder / "run.json").read_text())
    losses = {r["step"]: r["eval_loss"] for r in record["eval"]["history"]}
    assert list(losses) == [2, 4] and losses[2] < losses[4]
    assert record["best_checkpoint"] == {"checkpoint": str(folder / ckpt.dir_name(2)), "step": 2,
                                         "eval_loss": losses[2]}
    # save_total_limit 1 keeps the best and the latest (as Ray's score ordering and transformers do)
    assert sorted(p.name for p in folder.glob("checkpoint_*")) == [ckpt.dir_name(2), ckpt.dir_name(4)]
    held_out = prepare(DataSpec.eval_from_config(cfg), tokenizer=_tokenizer(cfg), seq_len=cfg.seq_len,
                       cache_dir=cfg.cache_dir)
    exported = reference_loss(folder / "model", held_out)  # the best's weights, exported (in bf16: not to the bit)
    assert exported == pytest.approx(losses[2], rel=2e-3) and abs(exported - losses[2]) < abs(exported - losses[4]) / 10
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["event"] == "best_checkpoint"] == [2]
    assert "exported: the best checkpoint by eval loss, step 2" in (folder / "model" / "README.md").read_text()


@pytest.mark.parametrize("settings, says", [
    ({"eval_each_epoch": True}, "at the end of every epoch"),
    ({"eval_every": 5}, "every 5 steps"),
    ({"eval_on_start": True, "eval_every": 5, "eval_each_epoch": True},
     "at the start, every 5 steps and at the end of every epoch"),
    ({}, "never"),
])
def test_the_preflight_says_when_the_held_out_loss_is_measured(settings, says):
    from trainer.jobs.launch import eval_schedule

    assert eval_schedule(TrainConfig(**settings)) == says
