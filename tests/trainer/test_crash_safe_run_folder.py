"""Issue 29, item 3: a full disk or a torn file never makes a run unresumable; one run at a time trains into a
run folder. In-process: the writes fail by injection at each file a checkpoint writes (no root, no small
filesystem needed), then the run resumes from the previous checkpoint bit-exactly."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.guards import nonempty
from trainer.__main__ import main as trainer
from trainer.loop.optim import build_optimizer, build_scheduler
from trainer.model.build import build_model
from trainer.run_folder import checkpoint as ckpt
from trainer.run_folder import lock as run_lock
from trainer.storage import Storage

REPO = Path(__file__).resolve().parents[2]


def _disk_full() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device")


def _setup(model_path, seed: int):
    torch.manual_seed(seed)
    model = build_model(model_path, device=torch.device("cpu"), use_gpu=False, random_init=True, seed=seed)
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.1, fused=False)
    sched = build_scheduler(opt, warmup=3, total=20, schedule="cosine", min_ratio=0.1)
    return model, opt, sched


def _state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@contextlib.contextmanager
def _full_disk_at(name: str, monkeypatch):
    """Every write of the file `name` (a checkpoint's relative path) stops half-way with ENOSPC."""
    from torch.distributed.checkpoint.filesystem import FileSystem

    real_stream, real_hashed, real_write = FileSystem.create_stream, ckpt._write_hashed, Storage.write_bytes

    @contextlib.contextmanager
    def stream(self, path, mode):
        with real_stream(self, path, mode) as raw:
            if "w" in mode and Path(path).name.startswith(name):
                class Half:
                    def __getattr__(self, attr):
                        return getattr(raw, attr)

                    def write(self, b):
                        raw.write(bytes(b)[: len(b) // 2])
                        raise _disk_full()
                yield Half()
            else:
                yield raw

    def hashed(data, path, digests):
        if Path(path).name == name:
            Path(path).write_bytes(data[: len(data) // 2])
            raise _disk_full()
        return real_hashed(data, path, digests)

    def write_bytes(self, data, *parts):
        if parts and parts[-1] == name:
            raise _disk_full()
        return real_write(self, data, *parts)

    monkeypatch.setattr(FileSystem, "create_stream", stream)
    monkeypatch.setattr(ckpt, "_write_hashed", hashed)
    monkeypatch.setattr(Storage, "write_bytes", write_bytes)
    yield
    monkeypatch.undo()


CHECKPOINT_FILES = [".metadata", "__0_0.distcp", "rank_0.pt", ckpt.TRAIN_STATE, ckpt.MARKER]


@pytest.mark.parametrize("name", CHECKPOINT_FILES)
def test_a_full_disk_at_any_file_of_a_checkpoint_leaves_the_previous_one_to_resume_from_bit_exactly(
        name, process_group, demo_assets, tmp_path, monkeypatch):
    store = Storage.from_uri(str(tmp_path / "run"))
    model, opt, sched = _setup(demo_assets["model"], seed=1)
    ckpt.save(store, 1, model, opt, sched, {"rows_consumed": 1})
    at_step_1 = _state(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # step 2 differs from step 1 everywhere
    with _full_disk_at(name, monkeypatch), pytest.raises(ckpt.CheckpointError, match="No space left on device"):
        ckpt.save(store, 2, model, opt, sched, {"rows_consumed": 2})
    written = store.file_sizes(ckpt.dir_name(2))
    assert ckpt.MARKER not in written and not ckpt.is_complete(store, ckpt.dir_name(2))
    store.write_text("", ckpt.RAY_SNAPSHOT)  # what the full disk leaves of Ray Train's own record
    assert "cannot be read (0 bytes, not JSON)" in ckpt.repair_ray_record(store)

    assert ckpt.resume_point(store) == ckpt.dir_name(1)
    model2, opt2, sched2 = _setup(demo_assets["model"], seed=2)
    state = ckpt.load(store, ckpt.resume_point(store), model2, opt2, sched2)
    assert state["step"] == 1
    resumed = _state(model2)
    for key in nonempty(list(at_step_1), "weights"):
        assert torch.equal(resumed[key], at_step_1[key]), key
    # the disk has room again: the same step saves completely over what the failed save left
    ckpt.save(store, 2, model, opt, sched, {"rows_consumed": 2})
    assert ckpt.resume_point(store) == ckpt.dir_name(2)


def test_a_full_disk_while_a_record_is_rewritten_leaves_the_previous_content(tmp_path, monkeypatch):
    store = Storage.from_uri(str(tmp_path / "run"))
    store.write_text(json.dumps({"run_name": "run", "attempts": [1]}), "run.json")
    monkeypatch.setattr("trainer.storage.os.fsync", lambda fd: (_ for _ in ()).throw(_disk_full()))
    with pytest.raises(OSError, match="No space left"):
        store.write_text(json.dumps({"run_name": "run", "attempts": [1, 2]}), "run.json")
    assert json.loads(store.read_text("run.json")) == {"run_name": "run", "attempts": [1]}
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["run.json"]  # no temporary file left


@pytest.fixture
def no_ray(monkeypatch):
    import ray

    def refuse(*args, **kwargs):
        raise AssertionError("the bad input reached ray.init")

    monkeypatch.setattr(ray, "init", refuse)


def _argv(demo_assets, out: Path, *extra: str) -> list[str]:
    return ["--model", str(demo_assets["model"]), "--dataset", str(demo_assets["train"]), "--seq-len", "128",
            "--global-batch-size", "8", "--num-workers", "2", "--out", str(out), *extra]


def test_a_torn_run_record_is_an_error_not_a_skipped_resume_check(no_ray, demo_assets, tmp_path, capsys):
    from trainer.config.load import parse
    from trainer.jobs import launch

    run = tmp_path / "run"
    (run / ckpt.dir_name(4)).mkdir(parents=True)
    (run / "run.json").write_text('{"run_name": "run", "inputs": {"sett')  # a write cut short
    assert trainer(["train", *_argv(demo_assets, run, "--lr", "0.5")]) == 2
    err = capsys.readouterr().err
    for needle in ["run.json is not JSON (", "bytes, as a write cut short leaves it)", "cannot be checked",
                   "another --run-name", "--resume-anyway"]:
        assert needle in err, (needle, err)
    assert sorted(p.name for p in run.iterdir()) == [ckpt.dir_name(4), "run.json"]  # nothing written
    notes = launch.preflight(parse(_argv(demo_assets, run, "--lr", "0.5", "--resume-anyway")))["notes"]
    assert any("run.json is not JSON" in n and "the inputs were not compared" in n for n in notes), notes


def test_a_second_run_into_a_run_folder_is_refused_naming_the_first_and_a_killed_holder_frees_it(
        no_ray, demo_assets, tmp_path, capsys):
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom trainer.run_folder import lock\nfrom trainer.storage import "
         "Storage\nwith lock.held(Storage.from_uri(sys.argv[1]), 'first'):\n    print('held', flush=True)\n"
         "    time.sleep(120)\n", str(run)], cwd=REPO, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "held"
        assert trainer(["train", *_argv(demo_assets, run)]) == 2
        err = capsys.readouterr().err
        assert f"run 'first' (driver pid {holder.pid} on " in err and "is training into this run folder" in err, err
        assert "another --run-name" in err
        with pytest.raises(run_lock.RunFolderLocked, match=f"driver pid {holder.pid}"):
            with run_lock.held(Storage.from_uri(str(run)), "second"):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    with run_lock.held(Storage.from_uri(str(run)), "second"):  # the kernel released the killed holder's lock
        assert json.loads((run / run_lock.LOCK).read_text())["run_name"] == "second"
    assert not (run / run_lock.LOCK).exists()  # released at the end
