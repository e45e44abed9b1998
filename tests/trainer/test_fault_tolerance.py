"""Fault tolerance on the session's real Ray cluster (2 CPU workers, gloo): a worker process
SIGKILLed mid-run, and a submitted run that failed, resubmitted through `python -m trainer
submit` past a checkpoint left without its completion marker. Each run must end with the
weights of an uninterrupted run, bit for bit (see reference_runs for why torch.equal)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from trainer.jobs import launch
from trainer.loop.optim import build_optimizer, build_scheduler
from trainer.model.build import build_model
from trainer.run_folder import checkpoint as ckpt
from trainer.storage import Storage

from . import reference_runs as runs

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reference(ray_cluster, trainer_cache, demo_assets) -> Path:
    return runs.reference_run(demo_assets, trainer_cache)


def _alive_train_workers(dashboard_url: str) -> dict[str, int]:
    """actor id -> pid of the live Ray Train workers of this session's cluster (Ray's state API)."""
    from ray.util.state import list_actors

    actors = list_actors(address=dashboard_url, raise_on_missing_output=False,
                         filters=[("class_name", "=", "RayTrainWorker"), ("state", "=", "ALIVE")])
    return {a.actor_id: a.pid for a in actors if a.pid}


class WorkerKiller(threading.Thread):
    """Waits for the run's workers and for `marker`, then SIGKILLs one worker process."""

    def __init__(self, dashboard_url: str, marker: Path, timeout: float = 300):
        super().__init__(daemon=True)
        self.dashboard_url, self.marker, self.timeout = dashboard_url, marker, timeout
        self.ignore = set(_alive_train_workers(dashboard_url))  # none expected: runs do not overlap
        self.pid: int | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            def new_workers():
                found = {k: v for k, v in _alive_train_workers(self.dashboard_url).items() if k not in self.ignore}
                return found if len(found) == 2 else None

            workers = runs.wait_for(new_workers, self.timeout, "the run's 2 RayTrainWorker actors", interval=0.5)
            runs.wait_for(self.marker.is_file, self.timeout, f"{self.marker}")
            self.pid = sorted(workers.values())[-1]
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes().decode(errors="replace")
            assert "RayTrainWorker" in cmdline, cmdline
            os.kill(self.pid, signal.SIGKILL)
        except BaseException as e:  # noqa: BLE001 - re-raised by the test
            self.error = e


def _resume_events(run: Path) -> list[dict]:
    return [e for e in runs.events(run) if e["event"] == "resume"]


def test_a_sigkilled_worker_restarts_from_the_last_complete_checkpoint_with_identical_weights(
        ray_cluster, reference, demo_assets, trainer_cache, tmp_path):
    # every checkpoint kept (Ray would delete all but the last 2), so their markers tell when each was written
    cfg = runs.config(demo_assets, trainer_cache, str(tmp_path), "killed", max_failures=1, num_to_keep=10)
    run = tmp_path / "killed"
    killer = WorkerKiller(ray_cluster.dashboard_url, run / ckpt.dir_name(runs.EVERY) / ckpt.MARKER)
    killer.start()
    result = launch.train(cfg, quiet=True)
    killer.join(timeout=10)
    if killer.error:
        raise killer.error
    assert result.error is None, result.error
    with pytest.raises(ProcessLookupError):
        os.kill(killer.pid, 0)  # the worker really died

    events = runs.events(run)
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds.count("resume") == 1 and kinds[-1] == "export", kinds
    resume = _resume_events(run)[0]
    # the newest checkpoint that was complete when the first attempt died: every marker written
    # before the resume belongs to the first attempt, the later ones to the restarted one
    markers = {s: json.loads((run / ckpt.dir_name(s) / ckpt.MARKER).read_text())["time"]
               for s in runs.complete_steps(run)}
    before = [s for s, t in markers.items() if t < resume["time"]]
    assert runs.EVERY <= resume["step"] < runs.STEPS, resume  # killed mid-run, after a checkpoint
    assert resume["step"] == max(before), (resume, markers)
    assert resume["checkpoint"].endswith(ckpt.dir_name(resume["step"]))
    after = [e["step"] for e in events[kinds.index("resume"):] if e["event"] == "checkpoint"]
    assert after == list(range(resume["step"] + runs.EVERY, runs.STEPS + 1, runs.EVERY)), events
    runs.assert_same_training(run, reference)


def _job_status(ray_cluster, run_name: str):
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(ray_cluster.dashboard_url).get_job_status(run_name)


def _tear(run: Path, name: str) -> None:
    """What a crash during the upload of a checkpoint leaves: part of its files, no marker."""
    (run / name / ckpt.MARKER).unlink()
    shard = run / name / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    (run / name / "rng" / "rank_1.pt").unlink()


def test_a_failed_job_resubmitted_under_its_run_name_resumes_past_a_torn_checkpoint_with_identical_weights(
        ray_cluster, reference, demo_assets, trainer_cache, tmp_path):
    """A submitted run fails mid-way (an exception in the workers at step FAIL_AT, after two checkpoints; no
    retries). `submit --no-wait` printed the command that follows it: run as printed, it streams the job to its
    end and exits 1 with the tail of the error. Its newest checkpoint is then torn, as an upload cut short
    leaves it, and Ray's own record of the checkpoints with it, as a full disk leaves it. The same `submit`
    again rebuilds that record and resumes from the newest checkpoint that is still complete, never the torn
    one, and ends with the weights of the uninterrupted run.

    Both submissions name no --storage-path, as a user of a plain `ray start` cluster would: the run folder is
    the head's ~/trainer-runs/NAME (an absolute path Ray Train accepts; HOME is the test's folder here)."""
    from ray.job_submission import JobStatus

    name = "resubmitted"
    fail_at = 2 * runs.EVERY + 2
    cfg = runs.config(demo_assets, trainer_cache, "runs", name, max_failures=0, fail_at_step=fail_at)
    home = tmp_path / "home"
    run = home / "trainer-runs" / name
    flags = runs.cli_flags(cfg)
    assert "--storage-path" not in flags and "--out" not in flags
    submit = [sys.executable, "-m", "trainer", "submit", "--address", ray_cluster.dashboard_url, *flags,
              "--env", f"HOME={home}"]
    env = ray_cluster.client_env()

    first = subprocess.run(submit + ["--no-wait"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"Submitted run {name}" in first.stdout and f"~/trainer-runs/{name} on the head" in first.stdout
    logs = re.search(r"Follow it with `([^`]+)`", first.stdout).group(1)
    assert logs.split()[-2:] == ["--address", ray_cluster.dashboard_url]
    followed = subprocess.run(shlex.split(logs), cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert followed.returncode == 1, followed.stdout[-3000:] + followed.stderr[-3000:]
    assert f"Run {name}: FAILED" in followed.stderr
    assert "Last lines of the job log" in followed.stderr and "injected failure" in followed.stderr
    interrupted = runs.events(run)
    assert "export" not in [e["event"] for e in interrupted], interrupted
    done = runs.complete_steps(run)
    assert sorted(done) == [runs.EVERY, 2 * runs.EVERY], done  # Ray keeps the newest two
    torn, previous = ckpt.dir_name(2 * runs.EVERY), ckpt.dir_name(runs.EVERY)
    _tear(run, torn)
    assert ckpt.resume_point(Storage.from_uri(str(run))) == previous
    snapshot = run / ckpt.RAY_SNAPSHOT  # Ray's own record torn too, as a full disk leaves it
    assert torn in snapshot.read_text()
    snapshot.write_bytes(snapshot.read_bytes()[:100])

    second = subprocess.run(submit, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"Run {name} was FAILED: resubmitting" in second.stdout, second.stdout
    assert "previous attempt's log is left out" in second.stdout
    assert "(start 0)" not in second.stdout, second.stdout  # the first attempt's log is not streamed as new
    # Ray's own record, torn, is rebuilt from the checkpoints that verify (naming the torn one, Ray would delete
    # the step saved again) and Ray's controller reads it
    rebuilt = (f"{ckpt.RAY_SNAPSHOT} cannot be read (100 bytes, not JSON): set aside as {ckpt.RAY_SNAPSHOT}.set-aside-",
               f"and rebuilt from the verified checkpoint(s) {previous}; the run resumes from {previous}",
               "A run snapshot was found in storage folder")
    for needle in rebuilt:
        assert needle in second.stdout + second.stderr, (needle, second.stdout[-3000:])
    assert _job_status(ray_cluster, name) == JobStatus.SUCCEEDED

    resumed = runs.events(run)[len(interrupted):]
    assert resumed[0]["event"] == "resume", resumed
    assert resumed[0]["step"] == runs.EVERY and resumed[0]["checkpoint"].endswith(previous), resumed[0]
    assert [e["event"] for e in resumed][-1] == "export"  # --fail-at-step fails a first attempt only
    assert ckpt.is_complete(Storage.from_uri(str(run)), ckpt.dir_name(runs.STEPS))
    ray_named = [r["checkpoint_dir_name"] for r in json.loads(snapshot.read_text())["checkpoint_results"]]
    assert ray_named == [ckpt.dir_name(runs.STEPS - runs.EVERY), ckpt.dir_name(runs.STEPS)]  # Ray's record, on
    runs.assert_same_training(run, reference)


def _wait_for(client, job_id: str, timeout: float = 600):
    import time

    deadline = time.monotonic() + timeout
    while not (status := client.get_job_status(job_id)).is_terminal():
        assert time.monotonic() < deadline, f"{job_id} still {status} after {timeout:.0f} s"
        time.sleep(1.0)
    return status


def test_each_rayjob_attempt_resumes_the_run_from_its_last_complete_checkpoint(
        ray_cluster, reference, demo_assets, trainer_cache, tmp_path):
    """KubeRay retries a RayJob (backoffLimit) by submitting its entrypoint and runtimeEnvYAML again, over the
    Jobs API (HTTPMode), under a new job id, on a new cluster. Both attempts run here as the operator submits
    them, from the manifest `submit --rayjob` builds; the package comes from a file:// URI, which Ray fetches
    and unpacks as it does s3:// (one top-level folder removed). The first attempt fails after a checkpoint;
    the second resumes from it and ends with the uninterrupted run's weights. A Ray run is needed because the
    attempt is Ray's to run: the zip working_dir, the entrypoint and job.yaml as the cluster sees them."""
    import tempfile

    import yaml
    from ray.job_submission import JobStatus, JobSubmissionClient

    from trainer.submit import rayjob
    from trainer.submit.job import runtime_env, stage_job, train_entrypoint

    name = "rayjob-attempts"
    cfg = runs.config(demo_assets, trainer_cache, str(tmp_path / "runs"), name, max_failures=0,
                      fail_at_step=runs.EVERY + 2)
    with tempfile.TemporaryDirectory() as folder:
        data, digest = rayjob.package(stage_job(Path(folder), cfg))
    uri = rayjob.package_uri(f"file://{tmp_path / 'bucket'}", digest)
    Path(uri.removeprefix("file://")).parent.mkdir(parents=True)
    Path(uri.removeprefix("file://")).write_bytes(data)
    job = rayjob.manifest(name=name, namespace="ray", entrypoint=train_entrypoint(),
                          runtime_env=runtime_env(uri, [], {}), caps=rayjob.Caps(retries=1),
                          cluster_spec={"headGroupSpec": {}})
    client = JobSubmissionClient(ray_cluster.dashboard_url)
    spec = job["spec"]
    for attempt in (1, 2):  # what KubeRay's dashboard client sends (spec.entrypoint, the parsed runtimeEnvYAML)
        job_id = client.submit_job(entrypoint=spec["entrypoint"], runtime_env=yaml.safe_load(spec["runtimeEnvYAML"]),
                                   submission_id=f"{name}-attempt-{attempt}",
                                   entrypoint_num_cpus=spec["entrypointNumCpus"])
        status = _wait_for(client, job_id)
        assert status == (JobStatus.FAILED if attempt == 1 else JobStatus.SUCCEEDED), client.get_job_logs(job_id)[-3000:]
    run = tmp_path / "runs" / name
    events = runs.events(run)
    kinds = [e["event"] for e in events]
    resume = events[kinds.index("resume")]
    assert resume["step"] == runs.EVERY and resume["checkpoint"].endswith(ckpt.dir_name(runs.EVERY)), events
    assert kinds[-1] == "export"
    runs.assert_same_training(run, reference)


def test_a_marker_is_trusted_only_while_every_file_it_lists_is_there(process_group, demo_assets, tmp_path):
    model = build_model(demo_assets["model"], device=torch.device("cpu"), use_gpu=False)
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.0, fused=False)
    sched = build_scheduler(opt, warmup=0, total=10, schedule="constant", min_ratio=1.0)
    store = Storage.from_uri(str(tmp_path / "run"))
    for step in (1, 2):
        ckpt.save(store, step, model, opt, sched, {"rows_consumed": step})
    marker = json.loads(store.read_text(ckpt.dir_name(2), ckpt.MARKER))
    assert {".metadata", ckpt.TRAIN_STATE, "rng/rank_0.pt", "__0_0.distcp"} <= set(marker["files"])
    sizes = {k: v for k, v in store.file_sizes(ckpt.dir_name(2)).items() if k != ckpt.MARKER}
    assert {k: f["size"] for k, f in marker["files"].items()} == sizes
    assert ckpt.resume_point(store) == ckpt.dir_name(2)
    # stopped after writing the marker of step 2 but before reporting it: Ray still names step 1
    assert ckpt.resume_point(store, preferred=store.path(ckpt.dir_name(1))) == ckpt.dir_name(2)

    # a deletion cut short (a crash while Ray removed an old checkpoint) leaves the marker behind
    shard = tmp_path / "run" / ckpt.dir_name(2) / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])
    assert not ckpt.is_complete(store, ckpt.dir_name(2))
    assert ckpt.resume_point(store, preferred=store.path(ckpt.dir_name(2))) == ckpt.dir_name(1)
    shard.unlink()
    assert ckpt.resume_point(store) == ckpt.dir_name(1)
    # and a half-written marker (a crash while writing it on a local disk) is no marker: step 1's save never
    # completed, so step 2's is the only one and it is damaged (refused: not trained again from step 0 unasked)
    store.write_text('{"step": 1, "fi', ckpt.dir_name(1), ckpt.MARKER)
    with pytest.raises(ckpt.DamagedCheckpoints, match=rf"damaged \({ckpt.dir_name(2)}: files listed [^;]*\), so"):
        ckpt.resume_point(store)
    store.write_text('{"step": 2, "fi', ckpt.dir_name(2), ckpt.MARKER)
    assert ckpt.resume_point(store) is None
