"""Issue 29, item 5: SIGTERM or Ctrl-C (SIGINT) to the driver while it trains stops the run cleanly: exit 130
with the last complete checkpoint named, no Ray signal dump, the run folder's lock released.

One run stopped by SIGTERM, then resumed by the same command and stopped by SIGINT: what is tested is Ray
Train's fit() under each signal (its own SIGINT handler, its controller's abort), which only a real run on
the session cluster shows, and that the checkpoint named is the one the same command resumes from."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from trainer.run_folder import checkpoint as ckpt
from trainer.run_folder import lock as run_lock
from trainer.storage import Storage

from . import reference_runs as runs

REPO = Path(__file__).resolve().parents[2]


def _train_until(cmd: list[str], env: dict, marker: Path, sig: signal.Signals) -> tuple[int, str]:
    """`trainer train` sent `sig` once `marker` (a checkpoint's) exists; its exit code and stderr."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not marker.exists() and proc.poll() is None:
            assert time.monotonic() < deadline, f"no {marker} within 240 s"
            time.sleep(0.2)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err


def _assert_stopped(code: int, err: str, run: Path, sig: signal.Signals) -> str:
    """Exit 130, one line naming the newest complete checkpoint, nothing of Ray's, the lock gone; that name."""
    assert code == 130, (code, err[-3000:])
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
    newest = ckpt.complete_names(Storage.from_uri(str(run)))[-1]
    assert line.startswith(f"error: interrupted by {sig.name}: the run stopped; its last complete checkpoint is "
                           f"{run / newest} (step {ckpt.step_of(newest)}); run the same command again"), line
    lines = err.splitlines()
    at = next((i for i, ln in enumerate(lines) if "Traceback" in ln), None)
    assert at is None, "\n".join(lines[at:at + 40])
    assert f"*** {sig.name} received" not in err, err[-3000:]
    assert not (run / run_lock.LOCK).exists()  # the lock went with the driver
    return newest


def test_sigterm_then_sigint_to_the_driver_stop_the_run_with_exit_130_naming_the_checkpoint_it_resumes_from(
        ray_cluster, demo_assets, trainer_cache, tmp_path):
    cfg = runs.config(demo_assets, trainer_cache, str(tmp_path), "stopped", steps=400, num_workers=1,
                      checkpoint_every=runs.EVERY, export=False)
    run = tmp_path / "stopped"
    cmd = [sys.executable, "-m", "trainer", "train", "--address", ray_cluster.address, *runs.cli_flags(cfg)]
    env = ray_cluster.client_env()
    first = _assert_stopped(*_train_until(cmd, env, run / ckpt.dir_name(runs.EVERY) / ckpt.MARKER, signal.SIGTERM),
                            run, signal.SIGTERM)
    # the same command resumes from the checkpoint named; Ctrl-C (SIGINT) stops it alike, past its next checkpoint
    later = run / ckpt.dir_name(ckpt.step_of(first) + runs.EVERY) / ckpt.MARKER
    second = _assert_stopped(*_train_until(cmd, env, later, signal.SIGINT), run, signal.SIGINT)
    assert ckpt.step_of(second) > ckpt.step_of(first)
    (resume,) = [e for e in runs.events(run) if e["event"] == "resume"]
    assert resume["step"] == ckpt.step_of(first) and resume["checkpoint"].endswith(first), resume


class RayTrainWorker:
    """Stands for Ray Train's worker actor, which the state API knows by its class name."""

    def ready(self) -> bool:
        return True


def test_the_checkpoint_is_named_only_once_the_jobs_training_workers_are_gone(ray_cluster):
    """fit() can return while a worker Ray already told to stop still finishes a checkpoint (ray.kill is
    asynchronous): the CI run that named step 12 while step 16 completed after it."""
    import threading

    import ray
    from ray.util.state import list_actors

    from trainer.jobs import interrupt

    worker = ray.remote(num_cpus=0)(RayTrainWorker).remote()
    ray.get(worker.ready.remote())
    threading.Timer(2.0, ray.kill, args=(worker,)).start()
    interrupt.wait_for_workers(timeout_s=60)
    (state,) = [a.state for a in list_actors(address=ray_cluster.dashboard_url,
                                             filters=[("actor_id", "=", worker._actor_id.hex())])]
    assert state == "DEAD"
