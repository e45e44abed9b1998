"""Shared fixtures of the trainer tests: ONE real local Ray cluster per session, demo assets.

The cluster is a real `ray start --head` (own temp dir, 8 CPUs, dashboard on a free port)
with token authentication, so job-submission tests can reuse it. Its node carries the Ray label
of a node pool named LOCAL_POOL, as a stack's worker nodes carry theirs, so `--pool` can be tried. It is stopped with
SIGKILL to its process group plus any worker that left the group (a SIGTERM did not stop
`ray start --block` reliably here).
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from facts import ray as ray_facts

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
LOCAL_POOL = "local"  # the node pool the session cluster's node says it is in (facts.ray.POOL_LABEL)

# No network here: make any accidental hub access fail fast instead of hanging.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Ray Train's controller polls its workers every 2 s; each run waits on several polls (started, reports, done).
# A quarter second takes ~5 s off every run of the suite; jobs and every Ray process inherit it from here.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            out.append(child)
            todo.append(child)
    return out


def pids_using(marker: str) -> list[int]:
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker in cmdline.read_bytes().decode(errors="replace"):
                pids.append(int(cmdline.parent.name))
        except OSError:
            continue
    return pids


def ray_start_head(temp_dir: str, port: int, dash_port: int, cpus: int = 8) -> list[str]:
    """`ray start --head --block` on 127.0.0.1 with every port chosen free."""
    return [str(VENV_BIN / "ray"), "start", "--head", "--block", "--port", str(port), "--num-cpus", str(cpus),
            "--node-ip-address", "127.0.0.1", "--temp-dir", temp_dir, "--include-dashboard", "true",
            "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash_port), "--disable-usage-stats",
            # Fixed default ports (the job agent's 52365 among them) collide when two clusters share a
            # machine, and a job agent that cannot bind leaves the Jobs API with "No available agent".
            "--dashboard-agent-listen-port", str(free_port()), "--dashboard-agent-grpc-port", str(free_port()),
            "--runtime-env-agent-port", str(free_port()), "--metrics-export-port", str(free_port()),
            "--ray-client-server-port", str(free_port()),
            "--labels", ",".join(f"{k}={v}" for k, v in ray_facts.pool_labels(LOCAL_POOL).items())]


@dataclass
class RayCluster:
    address: str           # GCS address for ray.init / `ray start --address`
    dashboard_url: str     # Jobs API / dashboard
    token: str             # RAY_AUTH_TOKEN the cluster was started with
    temp_dir: str
    env: dict = field(default_factory=dict)  # env vars a client process needs (auth)

    def client_env(self) -> dict:
        return {**os.environ, **self.env}


def _reload_ray_auth() -> None:
    """Ray caches the auth mode and token the first time it reads them: a test module that imports
    ray at collection, before this fixture sets them, would leave this process with no token."""
    import ray._private.authentication_test_utils as ray_auth

    ray_auth.reset_auth_token_state()


@pytest.fixture(scope="session")
def ray_cluster():
    temp_dir = tempfile.mkdtemp(prefix="rt-", dir="/tmp")  # short: Ray's socket paths have a length limit
    port, dash_port = free_port(), free_port()
    token = secrets.token_hex(24)
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    log = open(Path(temp_dir) / "ray-start.log", "w")
    proc = subprocess.Popen(
        ray_start_head(temp_dir, port, dash_port),
        # PATH is left as it is, as after `.venv/bin/ray start` without activating the virtualenv:
        # a bare `python` there has no torch, and jobs must still find the interpreter that does.
        # RAY_ADDRESS: Ray Train's PlacementGroupCleaner asks the state API with no address, which fails with a
        # traceback ("Found multiple active Ray instances") when another cluster runs on the same machine.
        env={**os.environ, **auth, "RAY_ADDRESS": f"127.0.0.1:{port}"},
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    saved = {k: os.environ.get(k) for k in auth}
    os.environ.update(auth)
    _reload_ray_auth()
    cluster = RayCluster(f"127.0.0.1:{port}", f"http://127.0.0.1:{dash_port}", token, temp_dir, auth)
    try:
        import ray

        deadline = time.time() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"ray start exited with {proc.returncode}: "
                                   f"{(Path(temp_dir) / 'ray-start.log').read_text()[-2000:]}")
            try:
                ray.init(address=cluster.address, logging_level="WARNING")
                break
            except Exception:
                if time.time() > deadline:
                    raise
                time.sleep(1.0)
        yield cluster
    finally:
        try:
            import ray

            ray.shutdown()
        except Exception:  # noqa: BLE001
            pass
        victims = set(descendants(proc.pid)) | set(pids_using(temp_dir))
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=30)
        log.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _reload_ray_auth()


@pytest.fixture(scope="session")
def trainer_cache(tmp_path_factory):
    """Per-session model/tokenization cache (the trainer reads TRAINER_CACHE)."""
    path = tmp_path_factory.mktemp("trainer-cache")
    old = os.environ.get("TRAINER_CACHE")
    os.environ["TRAINER_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("TRAINER_CACHE", None)
    else:
        os.environ["TRAINER_CACHE"] = old


@pytest.fixture(scope="session")
def demo_assets(tmp_path_factory):
    """The demo's tiny random-init Qwen2 model and generated train / held-out data."""
    from trainer import demo

    root = tmp_path_factory.mktemp("demo-assets")
    train_rows, eval_rows = demo.make_dataset(seed=0, n_train=600, n_eval=60)
    return {
        "model": demo.write_init_model(root / "init-model", seed=0),
        "train": demo.write_jsonl(train_rows, root / "train.jsonl"),
        "heldout": demo.write_jsonl(eval_rows, root / "heldout.jsonl"),
        "root": root,
    }


@pytest.fixture
def process_group():
    """A one-rank gloo group: the same collectives code path as the Ray workers."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
