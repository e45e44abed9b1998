"""Checkpoint storage, completion markers, and a save/load round trip of the whole training state."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from trainer.data.packing import prepare
from trainer.loop.optim import build_optimizer, build_scheduler
from trainer.loop.parallel import ONE_PROCESS
from trainer.loop.step import train_step
from trainer.model.build import build_model
from trainer.model.sources import load_tokenizer
from trainer.run_folder import checkpoint as ckpt
from trainer.run_folder.export import save_safetensors
from trainer.storage import Storage


def test_storage_round_trips_files_and_lists_folders(tmp_path):
    store = Storage.from_uri(str(tmp_path / "run"))
    store.write_text("hello", "a", "b.txt")
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "x.bin").write_bytes(b"\x00\x01")
    store.upload_dir(tmp_path / "local", "c")
    assert store.read_text("a", "b.txt") == "hello" and store.list_dirs() == ["a", "c"]
    assert store.list_files() == ["a/b.txt", "c/x.bin"]
    store.download_dir(tmp_path / "back", "c")
    assert (tmp_path / "back" / "x.bin").read_bytes() == b"\x00\x01"
    store.delete_dir("a")
    assert not store.exists("a") and store.is_dir("c")


def test_names_are_a_run_folders_checkpoint_folders_oldest_first(tmp_path):
    """What the demo's summary and the tests list: checkpoint folders only, never Ray's snapshot or the export."""
    run = tmp_path / "run"
    for name in (ckpt.dir_name(10), ckpt.dir_name(2), "model", "tensorboard", ckpt.PREFIX + "tmp"):
        (run / name).mkdir(parents=True)
    (run / ckpt.RAY_SNAPSHOT).write_text("{}")
    assert ckpt.names(run) == [ckpt.dir_name(2), ckpt.dir_name(10)] == ckpt.names(Storage.from_uri(str(run)))
    assert ckpt.names(tmp_path / "no-run-yet") == []


def test_folders_without_the_completion_marker_are_never_resumed(tmp_path):
    store = Storage.from_uri(str(tmp_path))
    for step in (5, 10):
        store.write_text("{}", ckpt.dir_name(step), ckpt.TRAIN_STATE)
    store.write_text(json.dumps({"step": 5}), ckpt.dir_name(5), ckpt.MARKER)
    store.write_text("junk", ckpt.RAY_SNAPSHOT)
    assert ckpt.resume_point(store) == ckpt.dir_name(5)
    # even when Ray reports the incomplete one as its latest checkpoint
    assert ckpt.resume_point(store, preferred=store.path(ckpt.dir_name(10))) == ckpt.dir_name(5)
    store.write_text("{}", ckpt.dir_name(10), ckpt.MARKER)
    assert ckpt.resume_point(store) == ckpt.dir_name(10)
    assert ckpt.resume_point(Storage.from_uri(str(tmp_path / "empty"))) is None


def test_a_marker_of_a_format_this_trainer_does_not_read_is_never_resumed_from(tmp_path, caplog):
    store = Storage.from_uri(str(tmp_path))
    for step, fmt in ((5, ckpt.MARKER_FORMAT), (10, ckpt.MARKER_FORMAT + 1)):
        store.write_text("{}", ckpt.dir_name(step), ckpt.TRAIN_STATE)
        store.write_text(json.dumps({"format": fmt, "step": step}), ckpt.dir_name(step), ckpt.MARKER)
    assert ckpt.resume_point(store) == ckpt.dir_name(5)
    assert f"is of format {ckpt.MARKER_FORMAT + 1}; this trainer reads formats" in caplog.text


def _setup(model_path, total=20):
    model = build_model(model_path, device=torch.device("cpu"), use_gpu=False)
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.1, fused=False)
    sched = build_scheduler(opt, warmup=3, total=total, schedule="cosine", min_ratio=0.1)
    return model, opt, sched


def test_save_then_load_restores_model_optimizer_schedule_and_rng(process_group, demo_assets, tmp_path):
    tok = load_tokenizer(demo_assets["model"])
    data = prepare(str(demo_assets["train"]), "train", tok, 128, tmp_path / "cache")
    batches = lambda s: data.micro_batches(s, rank=0, world_size=1, global_batch=4, micro_batch=2, seed=0)  # noqa: E731
    model, opt, sched = _setup(demo_assets["model"])
    for s in range(3):
        train_step(model, opt, sched, batches(s), device=torch.device("cpu"), collectives=ONE_PROCESS)
    store = Storage.from_uri(str(tmp_path / "run"))
    torch.manual_seed(123), random.seed(123), np.random.seed(123)
    path = ckpt.save(store, 3, model, opt, sched, data.position(3, 4))
    expected_rng = (torch.rand(1), random.random(), np.random.rand())
    lr_at_save = opt.param_groups[0]["lr"]
    assert path.endswith(ckpt.dir_name(3)) and ckpt.is_complete(store, ckpt.dir_name(3))
    continued = [float(train_step(model, opt, sched, batches(s), device=torch.device("cpu"), collectives=ONE_PROCESS).loss)
                 for s in (3, 4)]

    model2, opt2, sched2 = _setup(demo_assets["model"])
    torch.manual_seed(999)
    state = ckpt.load(store, ckpt.resume_point(store), model2, opt2, sched2)
    assert state["step"] == 3 and state["data_position"]["rows_consumed"] == 12
    assert (torch.rand(1), random.random(), np.random.rand()) == expected_rng
    assert sched2.last_epoch == 3 and opt2.param_groups[0]["lr"] == pytest.approx(lr_at_save)
    resumed = [float(train_step(model2, opt2, sched2, batches(s), device=torch.device("cpu"), collectives=ONE_PROCESS).loss)
               for s in (3, 4)]
    assert resumed == pytest.approx(continued, rel=1e-6)


def test_large_exports_are_sharded_the_way_from_pretrained_reads_them(demo_assets, tmp_path):
    from transformers import AutoModelForCausalLM

    source = AutoModelForCausalLM.from_pretrained(demo_assets["model"])
    state = {k: v.to(torch.bfloat16) for k, v in source.state_dict().items() if k != "lm_head.weight"}
    save_safetensors(state, tmp_path, max_shard_size="300KB")
    source.config.save_pretrained(tmp_path)
    assert len(list(tmp_path.glob("model-0000*-of-*.safetensors"))) > 1
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    for name, tensor in loaded.state_dict().items():
        expected = source.state_dict()[name].to(torch.bfloat16).to(tensor.dtype)
        torch.testing.assert_close(tensor, expected, rtol=0, atol=0)


def _saved_run(demo_assets, tmp_path, steps=(1, 2), keep=None):
    model, opt, sched = _setup(demo_assets["model"])
    store = Storage.from_uri(str(tmp_path / "run"))
    for step in steps:
        ckpt.save(store, step, model, opt, sched, {"rows_consumed": step}, keep=keep)
    return store


def test_the_marker_records_the_sha256_of_every_file_as_written(process_group, demo_assets, tmp_path):
    import hashlib

    store = _saved_run(demo_assets, tmp_path, steps=(1,))
    marker = json.loads(store.read_text(ckpt.dir_name(1), ckpt.MARKER))
    assert marker["format"] == ckpt.MARKER_FORMAT and ckpt.MARKER_FORMAT in ckpt.READABLE_FORMATS  # what is written resumes
    on_disk = {k: v for k, v in store.file_sizes(ckpt.dir_name(1)).items() if k != ckpt.MARKER}
    assert set(marker["files"]) == set(on_disk) >= {".metadata", "__0_0.distcp", ckpt.TRAIN_STATE, "rng/rank_0.pt"}
    for path, entry in marker["files"].items():  # hashed from the written bytes, equal to the stored content
        content = (tmp_path / "run" / ckpt.dir_name(1) / path).read_bytes()
        assert entry == {"size": len(content), "sha256": hashlib.sha256(content).hexdigest()}, path


def test_a_same_size_corruption_falls_back_to_the_previous_checkpoint_with_a_log_line(process_group, demo_assets,
                                                                                      tmp_path, caplog):
    store = _saved_run(demo_assets, tmp_path)
    assert ckpt.resume_point(store) == ckpt.dir_name(2)
    shard = tmp_path / "run" / ckpt.dir_name(2) / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: same size, so the size check alone passes
    shard.write_bytes(bytes(data))
    assert ckpt.is_complete(store, ckpt.dir_name(2))
    with caplog.at_level("WARNING", logger=ckpt.log.name):
        assert ckpt.resume_point(store, preferred=store.path(ckpt.dir_name(2))) == ckpt.dir_name(1)
    assert f"{ckpt.dir_name(2)}: content differs from what was written (__0_0.distcp: sha256" in caplog.text
    assert "resuming from the previous complete checkpoint instead" in caplog.text


def test_checkpoints_outside_rays_bookkeeping_are_pruned_by_the_same_keep_rule(process_group, demo_assets, tmp_path):
    store = _saved_run(demo_assets, tmp_path, steps=(1, 2))
    # a leftover no marker was written for, and a checkpoint Ray tracks (its snapshot names it)
    store.write_text("partial", ckpt.dir_name(3), "__0_0.distcp")
    store.write_text(json.dumps({"checkpoints": [{"dir": ckpt.dir_name(1)}]}), ckpt.RAY_SNAPSHOT)
    model, opt, sched = _setup(demo_assets["model"])
    ckpt.save(store, 4, model, opt, sched, {"rows_consumed": 4}, keep=1)
    # kept: the newest complete one and the one Ray will delete itself; pruned: the rest
    assert [n for n in store.list_dirs() if ckpt.step_of(n)] == [ckpt.dir_name(1), ckpt.dir_name(4)]
    store.write_text("{}", ckpt.RAY_SNAPSHOT)  # Ray deleted step 1 and tracks nothing else
    ckpt.save(store, 5, model, opt, sched, {"rows_consumed": 5}, keep=2)
    assert [n for n in store.list_dirs() if ckpt.step_of(n)] == [ckpt.dir_name(4), ckpt.dir_name(5)]
