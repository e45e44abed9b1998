"""The run record (run.json) and the exported model's card, read back with huggingface_hub."""

from __future__ import annotations

import json

import torch

from trainer.config.flags import TrainConfig
from trainer.run_folder import record
from trainer.storage import Storage

META = {"source": "HuggingFaceH4/ultrachat_200k", "config": None, "split": "train_sft", "train_on": "completion",
        "records": 1000, "documents": 990, "dropped": 10, "drop_reasons": {"x": 10}, "truncated": 3, "rows": 120,
        "seq_len": 2048, "tokens": 500000, "trained_tokens": 200000, "real_tokens": 240000, "loss_tokens": 199000,
        "fill": 0.976, "source_fingerprint": {"spec": "HuggingFaceH4/ultrachat_200k", "kind": "hub"}}


def test_run_json_records_config_versions_data_and_every_attempts_hardware(tmp_path):
    cfg = TrainConfig(model="Qwen/Qwen2.5-1.5B", dataset="HuggingFaceH4/ultrachat_200k", run_name="r1",
                      instance_type="g6.12xlarge")
    storage = Storage.from_uri(str(tmp_path / "r1"))
    first = record.write_run_record(storage, cfg, device=torch.device("cpu"), rank=0, world_size=1, data_meta=META,
                                    data_key="abc123", start_step=0, total_steps=100)
    again = record.write_run_record(storage, cfg, device=torch.device("cpu"), rank=0, world_size=1, data_meta=META,
                                    data_key="abc123", start_step=40, total_steps=100)
    saved = json.loads((tmp_path / "r1" / "run.json").read_text())
    assert saved == json.loads(json.dumps(again)) and first["attempts"][0]["start_step"] == 0
    assert [a["start_step"] for a in saved["attempts"]] == [0, 40]  # a resumed run adds an attempt
    assert TrainConfig.from_dict(saved["config"]) == cfg
    assert {"python", "torch", "ray", "transformers", "datasets"} <= set(saved["versions"])
    assert saved["versions"]["torch"] == torch.__version__.split("+")[0] or saved["versions"]["torch"] == \
        torch.__version__
    assert saved["data"]["packed_data_key"] == "abc123" and saved["data"]["fill"] == 0.976
    assert saved["hardware"]["world_size"] == 1 and saved["hardware"]["instance_type"] == "g6.12xlarge"
    assert record.write_run_record(storage, cfg, device=torch.device("cpu"), rank=1, world_size=1, data_meta=META,
                                   data_key="k", start_step=0, total_steps=1) is None  # only rank 0 writes


def test_the_model_card_is_a_hugging_face_card_with_what_was_trained(tmp_path):
    from huggingface_hub import ModelCard

    cfg = TrainConfig(model="Qwen/Qwen2.5-1.5B", dataset="HuggingFaceH4/ultrachat_200k", run_name="r1", lr=2e-5,
                      global_batch_size=64, seq_len=2048, steps=500, adam_beta2=0.98)
    rec = record.run_record(cfg, data_meta=META, data_key="abc123", previous=None, start_step=0, total_steps=500,
                            hw=record.hardware([{"host": "a", "device": "cuda", "gpu": "NVIDIA L4"}] * 4 +
                                               [{"host": "b", "device": "cuda", "gpu": "NVIDIA L4"}] * 4,
                                               "g6.12xlarge"))
    (tmp_path / "README.md").write_text(record.model_card(rec, {"loss": 1.23456}, steps=500, tokens=31_000_000))
    card = ModelCard.load(tmp_path / "README.md")
    assert card.data.base_model == "Qwen/Qwen2.5-1.5B" and card.data.datasets == ["HuggingFaceH4/ultrachat_200k"]
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "text-generation"
    for needle in ("steps: 500, tokens: 31,000,000", "final loss: 1.2346", "learning rate: 2e-05",
                   "global batch: 64 sequences of 2048 tokens", "8 worker(s) on 2 node(s): NVIDIA L4, g6.12xlarge",
                   "data fingerprint: `abc123`", "97.6% full", "optimizer: AdamW (betas 0.9, 0.98; epsilon 1e-08)"):
        assert needle in card.text, needle
