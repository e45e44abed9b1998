"""Checkpoints on s3:// against a real S3 API: moto's server, started here on 127.0.0.1.

Storage failures are made at the HTTP layer: a small WSGI middleware in front of moto
answers chosen writes (by key) with a real S3 error document (503 SlowDown, 403
AccessDenied), so the trainer meets them through the same pyarrow S3 client, retries and
error paths as in AWS. Nothing in the trainer is patched.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from dataclasses import dataclass, field

import pytest
import torch

from trainer.data.packing import prepare
from trainer.jobs import launch
from trainer.loop.optim import build_optimizer, build_scheduler
from trainer.loop.parallel import ONE_PROCESS
from trainer.loop.step import train_step
from trainer.model.build import build_model
from trainer.model.sources import load_tokenizer
from trainer.run_folder import checkpoint as ckpt
from trainer.run_folder.export import EXPORT_DIR
from trainer.storage import Storage

from . import reference_runs as runs
from .conftest import free_port

BUCKET = "checkpoints"
KEY, SECRET, REGION = "testing", "testing", "us-east-1"


@dataclass
class Fault:
    pattern: re.Pattern
    status: str
    code: str
    times: int | None  # None: until cleared


@dataclass
class FaultyS3:
    """WSGI middleware in front of moto: rejects matching writes (PUT/POST on /bucket/key) with an S3 error."""

    app: object
    faults: list[Fault] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fail_writes(self, pattern: str, status: str = "503 Slow Down", code: str = "SlowDown",
                    times: int | None = None) -> None:
        with self.lock:
            self.faults.append(Fault(re.compile(pattern), status, code, times))

    def clear(self) -> None:
        with self.lock:
            self.faults.clear()
            self.rejected.clear()

    def _match(self, environ) -> Fault | None:
        if environ["REQUEST_METHOD"] not in ("PUT", "POST"):
            return None
        path = environ.get("PATH_INFO", "")
        with self.lock:
            for fault in self.faults:
                if fault.times != 0 and fault.pattern.search(path):
                    if fault.times:
                        fault.times -= 1
                    self.rejected.append(f"{environ['REQUEST_METHOD']} {path}")
                    return fault
        return None

    def __call__(self, environ, start_response):
        fault = self._match(environ)
        if fault is None:
            return self.app(environ, start_response)
        from werkzeug.wsgi import get_input_stream

        get_input_stream(environ).read()  # drain the request body, as S3 does before answering
        body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{fault.code}</Code>'
                f'<Message>injected by the test</Message><RequestId>test</RequestId></Error>').encode()
        start_response(fault.status, [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
        return [body]


@dataclass
class S3Server:
    endpoint: str
    faults: FaultyS3

    def filesystem(self):
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(access_key=KEY, secret_key=SECRET, region=REGION, scheme="http",
                                 endpoint_override=self.endpoint)

    def keys(self, prefix: str) -> list[str]:
        """Object keys under a prefix, listed by boto3 (a client independent of the trainer's)."""
        import boto3

        client = boto3.client("s3", endpoint_url=f"http://{self.endpoint}", aws_access_key_id=KEY,
                              aws_secret_access_key=SECRET, region_name=REGION)
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return sorted(o["Key"][len(prefix):] for page in pages for o in page.get("Contents", []))


@pytest.fixture(scope="module")
def s3():
    """moto's S3 in server mode on a free local port, behind the fault middleware, with one bucket."""
    import boto3
    from moto.moto_server.werkzeug_app import MotoRequestHandler
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    class QuietHandler(MotoRequestHandler):
        def log_request(self, *args) -> None:  # one line per request is noise in the test output
            pass

    faults = FaultyS3(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", free_port(), faults, threaded=True, request_handler=QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"127.0.0.1:{server.server_address[1]}"
    with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5):
        pass
    boto3.client("s3", endpoint_url=f"http://{endpoint}", aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                 region_name=REGION).create_bucket(Bucket=BUCKET)
    yield S3Server(endpoint, faults)
    server.shutdown()
    thread.join(timeout=10)




def _full(model) -> dict[str, torch.Tensor]:
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in model.state_dict().items()}


def test_a_storage_error_mid_save_fails_loudly_and_the_previous_checkpoint_stays_loadable(
        process_group, s3, demo_assets, tmp_path):
    s3.faults.clear()
    tok = load_tokenizer(demo_assets["model"])
    data = prepare(str(demo_assets["train"]), "train", tok, 128, tmp_path / "cache")
    cpu = torch.device("cpu")

    def setup():
        model = build_model(demo_assets["model"], device=cpu, use_gpu=False)
        opt = build_optimizer(model, lr=1e-3, weight_decay=0.0, fused=False)
        return model, opt, build_scheduler(opt, warmup=0, total=10, schedule="constant", min_ratio=1.0)

    def step(s: int) -> None:
        train_step(model, opt, sched, data.micro_batches(s, rank=0, world_size=1, global_batch=4, micro_batch=2,
                                                          seed=0), device=cpu, collectives=ONE_PROCESS)

    store = Storage.from_uri(f"s3://{BUCKET}/unit", fs=s3.filesystem())
    model, opt, sched = setup()
    step(0)
    ckpt.save(store, 1, model, opt, sched, data.position(1, 4))
    saved = _full(model)
    first, second = ckpt.dir_name(1), ckpt.dir_name(2)
    assert ckpt.MARKER in s3.keys(f"unit/{first}/")

    step(1)
    # the credentials stop working while the shard of the next checkpoint is being uploaded
    s3.faults.fail_writes(rf"/{BUCKET}/unit/{second}/__0_0\.distcp$", status="403 Forbidden", code="AccessDenied")
    with pytest.raises(ckpt.CheckpointError) as failed:
        ckpt.save(store, 2, model, opt, sched, data.position(2, 4))
    message = str(failed.value)
    for needle in (store.path(second), "rank 0", "ACCESS_DENIED", "__0_0.distcp", f"no {ckpt.MARKER}"):
        assert needle in message, (needle, message)
    assert s3.faults.rejected and all("__0_0.distcp" in r for r in s3.faults.rejected)
    left = s3.keys(f"unit/{second}/")
    assert ckpt.MARKER not in left and "__0_0.distcp" not in left, left
    s3.faults.clear()

    assert ckpt.resume_point(store) == first
    model2, opt2, sched2 = setup()
    state = ckpt.load(store, first, model2, opt2, sched2)
    assert state["step"] == 1 and state["data_position"]["rows_consumed"] == 4
    loaded, trained = _full(model2), _full(model)
    runs.assert_identical(loaded, saved, "parameters loaded back from the s3 checkpoint")
    assert any(not torch.equal(trained[k], saved[k]) for k in saved)  # the failed save's weights are different


@pytest.fixture(scope="module")
def reference(ray_cluster, trainer_cache, demo_assets):
    return runs.reference_run(demo_assets, trainer_cache)


def test_a_run_on_s3_fails_loudly_on_a_storage_error_and_resumes_from_the_last_complete_checkpoint(
        ray_cluster, reference, s3, demo_assets, trainer_cache, tmp_path):
    s3.faults.clear()
    name, failing = "s3-run", ckpt.dir_name(2 * runs.EVERY)
    cfg = runs.config(demo_assets, trainer_cache, f"s3://{BUCKET}/runs", name, max_failures=0)
    store = Storage.from_uri(cfg.run_uri, fs=s3.filesystem())
    # S3 throttles the upload of rank 1's shard of the second checkpoint for good (the SDK retries, then gives up)
    s3.faults.fail_writes(rf"/{BUCKET}/runs/{name}/{failing}/__1_0\.distcp$")
    with pytest.raises(Exception) as failed:  # noqa: PT011 - Ray wraps the workers' CheckpointError
        launch.train(cfg, storage_filesystem=s3.filesystem(), quiet=True)
    for needle in ("CheckpointError", failing, "rank 1", "SLOW_DOWN", f"no {ckpt.MARKER}"):
        assert needle in str(failed.value), (needle, str(failed.value)[-3000:])
    assert len(s3.faults.rejected) >= 2  # the SDK retried before giving up
    s3.faults.clear()

    # rank 0's half of the checkpoint reached S3, rank 1's shard and the marker did not
    left = s3.keys(f"runs/{name}/{failing}/")
    assert {".metadata", "__0_0.distcp", ckpt.TRAIN_STATE, "rng/rank_0.pt"} <= set(left), left
    assert "__1_0.distcp" not in left and ckpt.MARKER not in left, left
    assert ckpt.resume_point(store) == ckpt.dir_name(runs.EVERY)
    events = [json.loads(line) for line in store.read_text("events.jsonl").splitlines()]
    assert [e["event"] for e in events] == ["start", "checkpoint", "checkpoint_failed"], events
    assert events[-1]["step"] == 2 * runs.EVERY and "SLOW_DOWN" in events[-1]["error"]

    # the same run name again, storage healthy: it resumes from the last complete checkpoint
    result = launch.train(cfg, storage_filesystem=s3.filesystem(), quiet=True)
    assert result.error is None, result.error
    events = [json.loads(line) for line in store.read_text("events.jsonl").splitlines()]
    resume = [e for e in events if e["event"] == "resume"]
    assert len(resume) == 1 and resume[0]["step"] == runs.EVERY, events
    assert resume[0]["checkpoint"].endswith(ckpt.dir_name(runs.EVERY))
    after = events[events.index(resume[0]) + 1:]
    assert [(e["event"], e["step"]) for e in after] == [
        ("checkpoint", s) for s in range(2 * runs.EVERY, runs.STEPS + 1, runs.EVERY)] + [("export", runs.STEPS)]
    assert ckpt.resume_point(store) == ckpt.dir_name(runs.STEPS)
    local = tmp_path / name
    for folder in (EXPORT_DIR, ckpt.dir_name(runs.STEPS)):
        store.download_dir(local / folder, folder)
    runs.assert_same_training(local, reference)


def test_the_preflight_reads_s3_weight_headers_and_asks_the_bucket_without_writing(s3, demo_assets):
    from trainer.model.errors import ModelSourceError
    from trainer.model.sources import check_weights
    from trainer.storage import location_problem

    s3.faults.clear()
    fs = s3.filesystem()
    store = Storage.from_uri(f"s3://{BUCKET}/models/tiny", fs=fs)
    store.upload_dir(demo_assets["model"])
    assert check_weights(f"s3://{BUCKET}/models/tiny", storage_fs=fs) == ["model.safetensors"]
    weights = (demo_assets["model"] / "model.safetensors").read_bytes()
    store.write_bytes(weights[: len(weights) // 2], "model.safetensors")  # an upload cut short
    with pytest.raises(ModelSourceError, match=r"model.safetensors cannot be read \(its tensors end at byte \d+, "
                                               r"the file has \d+ \(truncated\?\)\)"):
        check_weights(f"s3://{BUCKET}/models/tiny", storage_fs=fs)
    before = s3.keys("")
    assert location_problem(f"s3://{BUCKET}/runs/new-run", fs) is None
    assert "the bucket no-such-bucket does not exist" in location_problem("s3://no-such-bucket/runs/x", fs)
    assert s3.keys("") == before  # asked, nothing written


def test_the_preflight_tokenizer_of_an_s3_model_fetches_its_tokenizer_files_and_no_weights(s3, demo_assets):
    from pathlib import Path

    from trainer.model.sources import tokenizer_only

    s3.faults.clear()
    fs = s3.filesystem()
    Storage.from_uri(f"s3://{BUCKET}/models/tok", fs=fs).upload_dir(demo_assets["model"])
    tok = tokenizer_only(f"s3://{BUCKET}/models/tok", "unused", storage_fs=fs)
    fetched = {p.name for p in Path(tok.name_or_path).iterdir()}
    assert "config.json" in fetched and not any(n.endswith(".safetensors") for n in fetched)
    text = "a tokenizer read from s3"
    assert tok(text)["input_ids"] == load_tokenizer(demo_assets["model"])(text)["input_ids"]
    assert tok.pad_token_id is not None


def test_the_run_folder_lock_on_s3_refuses_a_second_run_and_a_dead_local_holder_is_taken_over(s3):
    """Issue 29: S3 cannot lock, so the lock is an object naming its holder; the same host's dead holder is stale."""
    import json
    import socket as sockets

    from trainer.run_folder import lock as run_lock

    s3.faults.clear()
    store = Storage.from_uri(f"s3://{BUCKET}/runs/locked", fs=s3.filesystem())
    other = {"run_name": "first", "host": "another-host", "pid": 1, "since": "2026-12-01T00:00:00+0000"}
    store.write_text(json.dumps(other), run_lock.LOCK)
    with pytest.raises(run_lock.RunFolderLocked, match=r"run 'first' \(driver pid 1 on another-host, .*delete "
                                                       r".*run.lock and run again"):
        with run_lock.held(store, "second"):
            pass
    dead = {**other, "host": sockets.gethostname(), "pid": 2**22 + 7}  # no such process here
    store.write_text(json.dumps(dead), run_lock.LOCK)
    with run_lock.held(store, "second"):
        assert json.loads(store.read_text(run_lock.LOCK))["run_name"] == "second"
    assert not store.exists(run_lock.LOCK)  # removed by its holder at the end
