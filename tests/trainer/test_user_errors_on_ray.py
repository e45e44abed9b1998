"""On the session's real Ray cluster (8 CPUs): a run that can never be placed is refused within seconds, a
user error on the workers ends the run at once whatever --max-failures says (exit 2, one `error:` line without
Ray's tracebacks of it; for a submitted job too), and a finished run folder resumes only with the inputs it was
started with, and not at all once every checkpoint it saved is damaged."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.guards import nonempty
from trainer.jobs import launch
from trainer.run_folder import checkpoint as ckpt
from trainer.storage import Storage

from . import reference_runs as runs

REPO = Path(__file__).resolve().parents[2]


def _cli(*argv: str, env: dict, timeout: float = 300) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "trainer", *argv], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    return proc, time.monotonic() - t0


def test_more_workers_than_the_cluster_can_ever_have_is_an_error_not_a_wait(ray_cluster, demo_assets, trainer_cache,
                                                                             tmp_path):
    cfg = runs.config(demo_assets, trainer_cache, str(tmp_path), "too-big", num_workers=20, global_batch_size=20, pool=None,
                      micro_batch_size=1)
    proc, seconds = _cli("train", "--address", ray_cluster.address, *runs.cli_flags(cfg), env=ray_cluster.client_env())
    print(f"train --num-workers 20 on 8 CPUs: exit {proc.returncode} after {seconds:.1f} s")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert ("error: --num-workers 20 asks for 20 CPU (1 per worker); the Ray cluster has 8 CPU and cannot grow "
            "(no autoscaler); use --num-workers 8 or fewer") in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "too-big").exists()


def test_a_user_error_on_the_workers_ends_the_run_at_once_whatever_max_failures_says(ray_cluster, demo_assets,
                                                                                     trainer_cache, tmp_path):
    # a learning rate no model survives: the loss is NaN after the first update, on every attempt alike
    cfg = runs.config(demo_assets, trainer_cache, str(tmp_path), "diverges", lr=1e30, log_every=1, max_failures=2, num_workers=1,
                      steps=6, checkpoint_every=0, export=False)
    proc, seconds = _cli("train", "--address", ray_cluster.address, *runs.cli_flags(cfg), env=ray_cluster.client_env())
    print(f"train --lr 1e30 --max-failures 2: exit {proc.returncode} after {seconds:.1f} s")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    # named once, by the driver: neither the worker's traceback nor the controller's quote of it
    (line,) = [ln for ln in proc.stderr.splitlines() if "the loss is" in ln]
    assert line.startswith("error: step 2: the loss is"), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Error Snippet" not in proc.stderr, proc.stderr[-3000:]
    assert "attempt 1 failed" not in proc.stderr  # not retried
    events = [e["event"] for e in runs.events(tmp_path / "diverges")]
    assert events == ["start", "stopped"], events


def test_a_submitted_job_that_finds_a_bad_input_exits_2_as_the_cli_does(ray_cluster, demo_assets, trainer_cache,
                                                                         tmp_path):
    cfg = runs.config(demo_assets, trainer_cache, str(tmp_path), "too-big-job", num_workers=20, global_batch_size=20, pool=None,
                      micro_batch_size=1)
    proc, seconds = _cli("submit", "--address", ray_cluster.dashboard_url, *runs.cli_flags(cfg),
                         env=ray_cluster.client_env())
    print(f"submit --num-workers 20 on 8 CPUs: exit {proc.returncode} after {seconds:.1f} s")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Run too-big-job: FAILED" in proc.stderr and "asks for 20 CPU" in proc.stdout + proc.stderr


def test_a_bad_record_past_the_pre_flights_sample_is_found_by_the_clusters_data_pass_exit_2(
        ray_cluster, demo_assets, trainer_cache, tmp_path):
    """The pre-flight reads 100 records; record 437 is found by a chunk task on the cluster (trainer.data.distributed),
    named by its number in the whole dataset as the pre-flight would name it, before any run folder exists."""
    import json

    rows = [json.loads(line) for line in Path(demo_assets["train"]).read_text().splitlines()]
    rows[437] = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant"}]}
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = runs.config(demo_assets, trainer_cache, str(tmp_path / "runs"), "bad-record", dataset=str(bad))
    proc, seconds = _cli("train", "--address", ray_cluster.address, *runs.cli_flags(cfg), env=ray_cluster.client_env())
    print(f"train, record 437 of 600 bad: exit {proc.returncode} after {seconds:.1f} s")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"--dataset: dataset {str(bad)!r} record 437 field messages[1].content: missing" in proc.stderr, \
        proc.stderr[-3000:]
    assert not (tmp_path / "runs" / "bad-record").exists()
    assert not list((tmp_path / "runs").rglob("meta.json")), "a failed pass leaves nothing that is read"


def test_a_finished_run_pointed_at_new_data_or_settings_is_refused_listing_what_changed(
        ray_cluster, demo_assets, trainer_cache, tmp_path):
    reference = runs.reference_run(demo_assets, trainer_cache)
    run = tmp_path / "finished"
    shutil.copytree(reference, run)
    data = tmp_path / "other.jsonl"
    data.write_text("".join(Path(demo_assets["train"]).read_text().splitlines(keepends=True)[::-1]))
    cfg = runs.config(demo_assets, trainer_cache, str(tmp_path), "finished")
    base = [*runs.cli_flags(cfg), "--address", ray_cluster.address]
    for change, needles in ((["--dataset", str(data)], ["--dataset: ", "the dataset's content changed"]),
                            (["--lr", "0.001", "--steps", str(2 * runs.STEPS)],
                             ["--lr: 0.003 then, 0.001 now", f"--steps: {runs.STEPS} then, {2 * runs.STEPS} now"])):
        proc, seconds = _cli("train", *base, *change, env=ray_cluster.client_env())
        print(f"finished run, {' '.join(change)}: exit {proc.returncode} after {seconds:.1f} s")
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
        for needle in [*needles, "--resume-anyway", "another --run-name"]:
            assert needle in proc.stderr, (needle, proc.stderr[-3000:])
    # what the run was started with passes the check (the run itself is complete: nothing to train)
    from trainer.config.load import parse

    assert launch.preflight(parse(runs.cli_flags(cfg) + ["--log-every", "1", "--max-failures", "5"]))["notes"] == []

    # every checkpoint it saved damaged: refused before Ray, naming them, rather than trained again from step 0
    saved = ckpt.names(Storage.from_uri(str(run)))
    for name in saved:
        shard = run / name / "__0_0.distcp"
        shard.write_bytes(shard.read_bytes()[:100])
    before = sorted((p.relative_to(run), p.stat().st_size) for p in run.rglob("*") if p.is_file())
    proc, seconds = _cli("train", *base, env=ray_cluster.client_env())
    print(f"finished run, every checkpoint damaged: exit {proc.returncode} after {seconds:.1f} s")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert line.startswith(f"error: {run}: every checkpoint this run saved is damaged ({saved[0]}: files listed in "), line
    assert all(n in line for n in nonempty(saved, "saved checkpoints")), line
    assert line.endswith("or start a new run (another --run-name)"), line
    assert "Traceback" not in proc.stderr
    assert sorted((p.relative_to(run), p.stat().st_size) for p in run.rglob("*") if p.is_file()) == before
