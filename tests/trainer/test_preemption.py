"""A node about to be reclaimed (Spot): the loop saves a checkpoint as soon as it hears of it."""

from __future__ import annotations

import json

from ray.train import PreemptionInfo

from trainer.config.flags import TrainConfig
from trainer.loop.parallel import setup_parallel
from trainer.loop.run import run
from trainer.run_folder import checkpoint as ckpt
from trainer.storage import Storage


def test_a_preemption_notice_saves_a_checkpoint_at_once_and_only_once(process_group, demo_assets, tmp_path):
    cfg = TrainConfig(model=str(demo_assets["model"]), dataset=str(demo_assets["train"]), seq_len=128,
                      global_batch_size=4, num_workers=1, steps=5, log_every=1, checkpoint_every=0, export=False,
                      progress=False, storage_path=str(tmp_path), run_name="spot", cache_dir=str(tmp_path / "cache"))
    calls = []

    def preemption():  # what ray.train.get_preemption_info answers: None until a node drains
        calls.append(len(calls) + 1)
        return PreemptionInfo(deadline_ms=None, preempted_node_to_ranks={"node-a": [0]}) if len(calls) >= 2 else None

    storage = Storage.from_uri(cfg.run_uri)
    run(cfg, setup_parallel(cfg, 0, 1, 0), storage, preemption=preemption)

    events = [json.loads(line) for line in (tmp_path / "spot" / "events.jsonl").read_text().splitlines()]
    notices = [e for e in events if e["event"] == "preemption_notice"]
    assert [(e["step"], e["ranks"]) for e in notices] == [(2, [0])]
    assert [e["step"] for e in events if e["event"] == "checkpoint"] == [2, 5]
    assert ckpt.is_complete(storage, ckpt.dir_name(2))
    assert calls == [1, 2]  # asked at every logging step until it answered, then no more
