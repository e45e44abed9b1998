"""The Ray job: the staged package, its runtime environment and entry point, its submission."""

from __future__ import annotations

import contextlib
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import replace as dataclass_replace
from pathlib import Path

import facts
import trainer
from trainer import efa
from trainer.config.flags import flag, is_inline_template
from trainer.submit.target import SubmitError

# What a job's working_dir holds: the trainer and the stdlib package of shared facts it imports.
JOB_PACKAGES = (Path(trainer.__file__).resolve().parent, Path(facts.__file__).resolve().parent)


def stage_package(into: Path) -> Path:
    """The job's working_dir: the trainer package and the facts it imports, without caches."""
    for package in JOB_PACKAGES:
        shutil.copytree(package, into / package.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return into


def runtime_env(working_dir: Path | str, pip: list[str], env: dict[str, str]) -> dict:
    """With NCCL_DEBUG_FILE set, every worker process first creates its directory (NCCL makes none)."""
    spec: dict = {"working_dir": str(working_dir), "env_vars": dict(env)}
    if pip:
        spec["pip"] = list(pip)
    if env.get("NCCL_DEBUG_FILE"):
        spec["worker_process_setup_hook"] = efa.SETUP_HOOK
    return spec


def parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SubmitError(f"--env {pair!r}: expected KEY=VALUE")
        env[key] = value
    return env


JOB_CONFIG = "job.yaml"


CHAT_TEMPLATE_FILE = "chat_template.jinja"


_HAS_TRAINER_DEPS = "import importlib.util as u, sys; sys.exit(not (u.find_spec('ray') and u.find_spec('torch')))"


def entrypoint(argv: list[str]) -> str:
    """The job's shell command: `python ARGV` with the first interpreter on the head that has ray and torch.

    A bare `python` is the DLC's on the cluster, but on a `ray start` from a virtualenv that was
    never activated it is the system one; this submitter's own interpreter is tried last.
    """
    candidates = " ".join(shlex.quote(c) for c in ("python", "python3", sys.executable))
    return (f"for py in {candidates}; do if command -v \"$py\" >/dev/null 2>&1 && "
            f"\"$py\" -c {shlex.quote(_HAS_TRAINER_DEPS)} 2>/dev/null; then exec \"$py\" {shlex.join(argv)}; fi; "
            f"done; echo 'error: no python with ray and torch on the Ray head (tried {candidates})' >&2; exit 127")


def stage_job(into: Path, cfg, cluster_storage: bool = False) -> Path:
    """The job's working_dir: the package, and the configuration validated here as job.yaml (a local
    --chat-template file beside it). With `cluster_storage` the storage path is left out of it."""
    import yaml

    working_dir = stage_package(into)
    if cfg.chat_template and "://" not in cfg.chat_template and not is_inline_template(cfg.chat_template):
        # the driver reads it from the working_dir
        shutil.copyfile(Path(cfg.chat_template).expanduser(), working_dir / CHAT_TEMPLATE_FILE)
        cfg = dataclass_replace(cfg, chat_template=CHAT_TEMPLATE_FILE)
    job_config = cfg.to_dict()
    if cluster_storage:
        del job_config["storage_path"]
    (working_dir / JOB_CONFIG).write_text(yaml.safe_dump(job_config, sort_keys=False))
    return working_dir


def train_entrypoint() -> str:
    """What every run's job executes: `trainer train` on the job.yaml beside it."""
    return entrypoint(["-m", "trainer", "train", "--config", JOB_CONFIG])


def submit(client, *, cfg, pip: list[str], env: dict[str, str], cluster_storage: bool = False) -> tuple[str, int]:
    """Submit (or resubmit) the run; a finished job of the same name is replaced, a running one is refused.

    The job runs exactly the configuration validated here: it travels as job.yaml beside the package
    (a local --chat-template file too). With `cluster_storage` the storage path is left out of it, so
    the cluster's default applies (CHECKPOINT_URI on the head, see trainer.jobs.launch.storage_default).
    Returns the job id and the length of the log a previous attempt left under the same id (Ray
    appends the new attempt to it).
    """
    from ray.job_submission import JobStatus

    run_name = cfg.resolved_run_name
    previous_log = 0
    with contextlib.suppress(RuntimeError):
        previous = client.get_job_status(run_name)
        if not previous.is_terminal():
            raise SubmitError(f"run {run_name} is already {previous.value}; follow it with "
                              f"`python -m trainer logs {run_name}` or stop it with `python -m trainer stop {run_name}`")
        print(f"Run {run_name} was {previous.value}: resubmitting; it resumes from its last complete checkpoint.")
        wait_for_previous_job(client, run_name)
        with contextlib.suppress(RuntimeError):
            previous_log = len(client.get_job_logs(run_name))
        client.delete_job(run_name)
    with tempfile.TemporaryDirectory(prefix="trainer-job-") as folder:
        working_dir = stage_job(Path(folder), cfg, cluster_storage)
        job_id = submit_when_ready(
            client,
            entrypoint=train_entrypoint(),
            submission_id=run_name,
            runtime_env=runtime_env(working_dir, pip, env),
            metadata={"run_name": run_name},
        ) or JobStatus.PENDING.value
    return job_id, previous_log


SUPERVISOR_WAIT_S = 60.0


MONITOR_GRACE_S = 5.0


def wait_for_previous_job(client, run_name: str) -> None:
    """Let Ray's job manager finish with the previous job of this submission id before reusing it.

    The manager watches each job's supervisor actor once a second until it sees it die. A job
    submitted under the same id before that is never watched itself, and the stale watcher
    marks it FAILED ("Job supervisor actor died", the old actor's death) while its entrypoint
    keeps running unobserved (seen with Ray 2.58 right after a stop). So wait until the old
    supervisor actor is dead and the watcher has had a few polls to notice.
    """
    from ray.dashboard.modules.job.common import JOB_ACTOR_NAME_TEMPLATE
    from ray.util.state import list_actors

    name = JOB_ACTOR_NAME_TEMPLATE.format(job_id=run_name)
    deadline = time.monotonic() + SUPERVISOR_WAIT_S
    while list_actors(address=client.get_address(), raise_on_missing_output=False,
                      filters=[("name", "=", name), ("state", "!=", "DEAD")]):
        if time.monotonic() > deadline:
            raise SubmitError(f"run {run_name} has ended but its job supervisor is still alive after "
                              f"{SUPERVISOR_WAIT_S:.0f} s; try again shortly, or use another --run-name")
        time.sleep(0.5)
    ended_ms = client.get_job_info(run_name).end_time or 0
    time.sleep(max(0.0, ended_ms / 1000 + MONITOR_GRACE_S - time.time()))


AGENT_WAIT_S = 90.0


def submit_when_ready(client, **job) -> str:
    """submit_job, waiting for the head's job agent, which a freshly started cluster lacks for a while."""
    deadline = time.monotonic() + AGENT_WAIT_S
    while True:
        try:
            return client.submit_job(**job)
        except RuntimeError as err:
            if "No available agent" not in str(err) or time.monotonic() > deadline:
                raise SubmitError(f"the Ray cluster refused the job: {err}") from None
            time.sleep(2.0)


def job_environment(cfg, require_efa: bool | None, extra: dict[str, str], log_dir: str | None = None) -> dict[str, str]:
    """What every process of the job sees: the EFA proof settings on GPUs, then the user's --env.

    GPU jobs run NCCL_DEBUG=INFO into per-rank files (not the job log), whatever the stack's
    ncclDebug: the EFA proof reads INFO lines. Lowering it with --env is refused unless the
    check is off (--no-require-efa).
    """

    env: dict[str, str] = {}
    if cfg.use_gpu:
        env.update(efa.nccl_debug_env(log_dir or efa.NCCL_LOG_DIR))
        env[efa.REQUIRE_EFA_ENV] = {None: "auto", True: "1", False: "0"}[require_efa]
        level = extra.get("NCCL_DEBUG", "INFO").strip().upper()
        if level not in ("INFO", "TRACE") and require_efa is not False:
            raise SubmitError(
                f"--env NCCL_DEBUG={extra['NCCL_DEBUG']}: the EFA check reads NCCL's INFO lines, so GPU jobs run "
                "NCCL_DEBUG=INFO (written to per-rank files under "
                f"{efa.debug_file_dir(env['NCCL_DEBUG_FILE'])}, not the job log); drop the --env, or add "
                "--no-require-efa to train without the proof")
    env.update(extra)
    return env


def remote_problems(cfg) -> list[str]:
    """A cluster reached through a port-forward cannot read files on this machine."""
    problems = []
    for name in ("model", "dataset", "tokenizer", "storage_path"):
        value = getattr(cfg, name)
        if value and "://" not in value and (Path(value).expanduser().exists() or name == "storage_path"):
            problems.append(f"{flag(name)} {value}: a local path on this machine, which the cluster cannot read; "
                            "use an s3:// URI (the stack's checkpoint bucket) or a Hugging Face hub id")
    return problems
