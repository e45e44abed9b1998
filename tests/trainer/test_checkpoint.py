"""Checkpoint storage, completion markers, and a save/load round trip of the whole training state."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.guards import nonempty
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
    assert store.file_sizes() == {"a/b.txt": 5, "c/x.bin": 2}
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


def _draws() -> dict:
    """A few numbers from each RNG stream a checkpoint restores (torch CPU, Python's random, NumPy's global)."""
    return {"torch": torch.rand(4), "python": [random.random() for _ in range(4)],
            "numpy": np.random.rand(4).tolist()}


def _assert_same_draws(got: dict, want: dict) -> None:
    """Each stream on its own, so that the message names the one that was not restored."""
    assert torch.equal(got["torch"], want["torch"]), "torch's CPU RNG was not restored"
    assert got["python"] == want["python"], "Python's random was not restored"
    assert got["numpy"] == want["numpy"], "NumPy's global RNG was not restored"


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
    expected_rng = _draws()
    lr_at_save = opt.param_groups[0]["lr"]
    assert path.endswith(ckpt.dir_name(3)) and ckpt.is_complete(store, ckpt.dir_name(3))
    # tensors and plain values only: the file loads with the safe unpickler and nothing allowlisted
    assert torch.load(tmp_path / "run" / ckpt.dir_name(3) / "rng" / "rank_0.pt", weights_only=True).keys() >= {
        "python", "numpy", "torch"}
    continued = [float(train_step(model, opt, sched, batches(s), device=torch.device("cpu"), collectives=ONE_PROCESS).loss)
                 for s in (3, 4)]

    model2, opt2, sched2 = _setup(demo_assets["model"])
    torch.manual_seed(999), random.seed(999), np.random.seed(999)  # every stream elsewhere: each must be restored
    state = ckpt.load(store, ckpt.resume_point(store), model2, opt2, sched2)
    assert state["step"] == 3 and state["data_position"]["rows_consumed"] == 12
    _assert_same_draws(_draws(), expected_rng)
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
    # hashed from the written bytes, equal to the stored content
    for path, entry in nonempty(marker["files"].items(), "files the marker lists"):
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


def _rewrite_rng(store: Storage, name: str, state, marker_format: int) -> None:
    """Replace rank 0's RNG file, and record it in a marker of `marker_format` so that the checkpoint stays complete."""
    import hashlib
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    store.write_bytes(buffer.getvalue(), name, "rng", "rank_0.pt")
    marker = json.loads(store.read_text(name, ckpt.MARKER))
    marker["format"] = marker_format
    marker["files"]["rng/rank_0.pt"] = {"size": len(buffer.getvalue()), "sha256": hashlib.sha256(buffer.getvalue()).hexdigest()}
    store.write_text(json.dumps(marker), name, ckpt.MARKER)


def test_a_checkpoint_of_the_pickled_rng_format_still_resumes_bit_exact(process_group, demo_assets, tmp_path):
    """Formats 1-2 pickled NumPy's key as an ndarray: read with weights_only=True and only that allowlisted."""
    store = _saved_run(demo_assets, tmp_path, steps=(1,))
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    legacy = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    expected = _draws()
    _rewrite_rng(store, ckpt.dir_name(1), legacy, marker_format=2)
    assert ckpt.resume_point(store) == ckpt.dir_name(1)
    model, opt, sched = _setup(demo_assets["model"])
    torch.manual_seed(999), random.seed(999), np.random.seed(999)
    ckpt.load(store, ckpt.dir_name(1), model, opt, sched)
    _assert_same_draws(_draws(), expected)
    # the allowlist is for formats 1-2 alone: the same file under this trainer's marker is refused
    _rewrite_rng(store, ckpt.dir_name(1), legacy, marker_format=ckpt.MARKER_FORMAT)
    with pytest.raises(ckpt.CheckpointError, match=r"rng/rank_0.pt: not an RNG state of tensors and plain values.*"
                                                    r"it pickles [^;]*numpy\._?core\.multiarray\._reconstruct"):
        ckpt.load(store, ckpt.dir_name(1), model, opt, sched)


class _RunsCode:
    """A pickled object whose unpickling runs code: here, it makes a folder."""

    def __init__(self, folder):
        self.folder = str(folder)

    def __reduce__(self):
        import os

        return os.mkdir, (self.folder,)


@pytest.mark.parametrize("marker_format", [2, ckpt.MARKER_FORMAT])
def test_an_rng_file_holding_a_pickled_object_is_refused_without_running_it(process_group, demo_assets, tmp_path,
                                                                              marker_format):
    """A pickle from storage is code execution: refused with a CheckpointError naming the file and the global."""
    store = _saved_run(demo_assets, tmp_path, steps=(1,))
    ran = tmp_path / "code-ran"
    _rewrite_rng(store, ckpt.dir_name(1), {"python": _RunsCode(ran), "numpy": None, "torch": None}, marker_format)
    model, opt, sched = _setup(demo_assets["model"])
    with pytest.raises(ckpt.CheckpointError) as refused:
        ckpt.load(store, ckpt.resume_point(store), model, opt, sched)
    message = str(refused.value)
    assert message.startswith(f"checkpoint {store.path(ckpt.dir_name(1))}: rng/rank_0.pt: not an RNG state")
    assert message.endswith("(a pickle from storage could run code); it pickles posix.mkdir")
    assert "\n" not in message and not ran.exists()


def test_a_run_whose_every_saved_checkpoint_is_damaged_is_refused_not_trained_again_from_step_0(
        process_group, demo_assets, tmp_path):
    """A resume that finds no intact checkpoint after saves completed would quietly start over (and Ray, still naming
    them, then deletes the steps saved again): refused on the workers, before Ray (sizes), and by the record's repair.
    A folder without a marker is a save that never completed: a run with only those starts from step 0."""
    store = _saved_run(demo_assets, tmp_path, steps=(1, 2))
    one, two = ckpt.dir_name(1), ckpt.dir_name(2)
    shard = tmp_path / "run" / one / "__0_0.distcp"
    shard.write_bytes(b"\0" * shard.stat().st_size)  # same size: only its sha256 tells
    (tmp_path / "run" / two / "__0_0.distcp").write_bytes(b"")
    ckpt.check_resumable(store)  # one of them is complete by its sizes: the workers hash it
    with pytest.raises(ckpt.DamagedCheckpoints) as refused:
        ckpt.resume_point(store)
    message = str(refused.value)
    assert message.startswith(f"{store.root}: every checkpoint this run saved is damaged ({one}: content differs "
                              f"from what was written (__0_0.distcp: sha256 "), message
    assert f"; {two}: files listed in {ckpt.MARKER} are gone or shorter: __0_0.distcp (0 of " in message
    assert " bytes)), so resuming would train it again from step 0. Restore them from a copy; or delete those " \
           "folders" in message
    assert "\n" not in message and message.endswith("or start a new run (another --run-name)")
    store.write_text("", ckpt.RAY_SNAPSHOT)
    with pytest.raises(ckpt.DamagedCheckpoints, match=f"{one}: content differs"):
        ckpt.repair_ray_record(store)
    assert store.read_text(ckpt.RAY_SNAPSHOT) == ""  # refused before anything is set aside or written

    shard.write_bytes(b"")
    with pytest.raises(ckpt.DamagedCheckpoints, match=f"damaged \\({one}: files listed"):
        ckpt.check_resumable(store)  # before Ray: every one is short
    for name in (one, two):
        store.delete_file(name, ckpt.MARKER)  # saves that never completed
    ckpt.check_resumable(store)
    assert ckpt.resume_point(store) is None


def _rays_view(store: Storage):
    """What Ray Train 2.58's own checkpoint manager reads from the run folder's record: (its checkpoints, latest)."""
    from ray.train import CheckpointConfig
    from ray.train.v2._internal.execution.checkpoint.checkpoint_manager import CheckpointManager
    from ray.train.v2._internal.execution.storage import StorageContext

    root = Path(store.root)
    manager = CheckpointManager(CheckpointConfig(num_to_keep=2), StorageContext(str(root.parent), root.name))
    named = [Path(r.checkpoint.path).name for r in manager._checkpoint_results]
    return named, Path(manager.latest_checkpoint_result.checkpoint.path).name


def test_rays_record_is_rebuilt_from_the_verified_checkpoints_when_it_names_a_torn_one_or_cannot_be_read(
        process_group, demo_assets, tmp_path):
    """Ray resumes from, and later deletes, what its record names: a record naming a torn checkpoint would have Ray
    delete the step the resumed run saves again under that name; an unreadable one fails every resume. Rebuilt,
    Ray's own checkpoint manager reads it and names the complete checkpoints, the newest intact one the latest."""
    store = _saved_run(demo_assets, tmp_path, steps=(1, 2, 3))
    one, two, three = ckpt.dir_name(1), ckpt.dir_name(2), ckpt.dir_name(3)
    record = {"checkpoint_results": [{"checkpoint_dir_name": n} for n in (one, two, three)]}
    store.write_text(json.dumps(record), ckpt.RAY_SNAPSHOT)
    assert ckpt.repair_ray_record(store) is None  # every checkpoint it names is complete: kept as it is
    assert json.loads(store.read_text(ckpt.RAY_SNAPSHOT)) == record

    store.delete_file(three, ckpt.MARKER)  # the newest torn, as an upload cut short leaves it
    note = ckpt.repair_ray_record(store)
    assert f"names {three}, which is not complete: set aside as {ckpt.RAY_SNAPSHOT}.set-aside-" in note
    assert note.endswith(f"rebuilt from the verified checkpoint(s) {one}, {two}; the run resumes from {two}")
    (aside,) = [p for p in (tmp_path / "run").iterdir() if p.name.startswith(f"{ckpt.RAY_SNAPSHOT}.")]
    assert json.loads(aside.read_text()) == record  # kept for whoever wants to look, never read by Ray again
    assert _rays_view(store) == ([one, two], two)
    assert ckpt.repair_ray_record(store) is None  # the rebuilt record is fine as it is

    (tmp_path / "run" / two / "__0_0.distcp").write_bytes(b"\0" * (tmp_path / "run" / two / "__0_0.distcp").stat().st_size)
    store.write_text("", ckpt.RAY_SNAPSHOT)  # what a full disk leaves
    note = ckpt.repair_ray_record(store)
    assert "cannot be read (0 bytes, not JSON)" in note and note.endswith(f"from the verified checkpoint(s) {one}; "
                                                                          f"the run resumes from {one}")
    assert _rays_view(store) == ([one], one)  # the newest complete one's content differs from what was written
    assert ckpt.resume_point(store) == one

    store.delete_file(ckpt.RAY_SNAPSHOT)
    assert ckpt.repair_ray_record(store) is None  # no record: nothing to do
