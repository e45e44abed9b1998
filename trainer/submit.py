"""Submit fine-tuning runs to a Ray cluster as Ray jobs, and follow them.

    python -m trainer submit [training flags] [--address URL | --stack STACK | --namespace NS --service SVC]
    python -m trainer status|logs|stop RUN [same connection flags]

The job's submission id is the run name, and the run's storage folder is named
after it too, so resubmitting a run name resumes from that run's last complete
checkpoint. The head is reached at `--address`, or through a `kubectl
port-forward` this command opens and closes itself (nothing of Ray is ever
exposed outside the cluster). With token authentication on, the token comes from
RAY_AUTH_TOKEN or from the RayCluster's auth Secret, read with kubectl.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from dataclasses import replace as dataclass_replace
from pathlib import Path
from typing import Iterator, Sequence

import facts
from facts import outputs as stack_outputs
from facts import ray as ray_facts
from facts.errors import EXIT_FAILED, EXIT_OK, EXIT_STOPPED, EXIT_USAGE, UserError

PACKAGE_DIR = Path(__file__).resolve().parent
# What a job's working_dir holds: the trainer and the stdlib package of shared facts it imports.
JOB_PACKAGES = (PACKAGE_DIR, Path(facts.__file__).resolve().parent)
DASHBOARD_PORT = ray_facts.DASHBOARD_PORT
CONNECT_TIMEOUT_S = 10.0
PORT_FORWARD_TIMEOUT_S = 30.0
DEFAULT_NAMESPACE = ray_facts.DEFAULT_NAMESPACE
DEFAULT_SERVICE = ray_facts.head_service()
DEFAULT_RAYCLUSTER = ray_facts.CLUSTER_NAME
CHECKPOINT_ENV = ray_facts.CHECKPOINT_ENV  # the head's default storage (trainer.launch.storage_default)



class SubmitError(UserError, RuntimeError):
    """A problem reaching or using the cluster, explained for the user."""


@dataclass(frozen=True)
class Target:
    """How to reach a Ray head: an address, or a Kubernetes service to port-forward to."""

    address: str | None
    namespace: str
    service: str
    raycluster: str
    kubeconfig: str | None = None


# --- reaching the head ---------------------------------------------------------

def _run(cmd: list[str], what: str, env: dict | None = None, timeout: float = 60) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except FileNotFoundError:
        raise SubmitError(f"{what}: `{cmd[0]}` is not installed or not on PATH") from None
    except subprocess.TimeoutExpired:
        raise SubmitError(f"{what}: `{shlex.join(cmd)}` did not finish within {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise SubmitError(f"{what}: `{shlex.join(cmd)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


@contextlib.contextmanager
def stack_target(stack: str) -> Iterator[tuple[Target, dict]]:
    """Namespace, head service and kubeconfig from `pulumi stack output`, and all the outputs.

    The kubeconfig is a secret: it lives in a 0600 temporary file only while the block runs, and is
    removed however the block ends (bad input found later included).
    """
    raw = _run(["pulumi", "stack", "output", "--json", "--show-secrets", "--stack", stack], f"--stack {stack}")
    try:
        outputs = json.loads(raw)
    except ValueError:
        raise SubmitError(f"--stack {stack}: `pulumi stack output --json` did not print JSON") from None
    missing = [k for k in stack_outputs.REQUIRED_BY_SUBMIT if k not in outputs]
    if missing:
        raise SubmitError(f"--stack {stack}: the stack has no output {', '.join(missing)}; run `pulumi up` first")
    fd, path = tempfile.mkstemp(prefix="kubeconfig-", suffix=".json")  # created 0600
    try:
        config = outputs[stack_outputs.KUBECONFIG]
        with os.fdopen(fd, "w") as kubeconfig:
            kubeconfig.write(config if isinstance(config, str) else json.dumps(config))
        yield Target(None, outputs[stack_outputs.RAY_NAMESPACE], outputs[stack_outputs.RAY_HEAD_SERVICE],
                     outputs.get(stack_outputs.RAY_CLUSTER_NAME, DEFAULT_RAYCLUSTER), path), outputs
    finally:
        Path(path).unlink(missing_ok=True)


def _kubectl(target: Target) -> list[str]:
    return ["kubectl", *(["--kubeconfig", target.kubeconfig] if target.kubeconfig else []), "-n", target.namespace]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def port_forward(target: Target, timeout: float = PORT_FORWARD_TIMEOUT_S) -> Iterator[str]:
    """`kubectl port-forward` to the head's dashboard port on 127.0.0.1, closed on exit."""
    port = _free_port()
    cmd = [*_kubectl(target), "port-forward", f"svc/{target.service}", f"{port}:{DASHBOARD_PORT}",
           "--address", "127.0.0.1"]
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except FileNotFoundError:
        raise SubmitError("kubectl is not installed or not on PATH; install it, or pass --address") from None
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SubmitError(f"kubectl port-forward to svc/{target.service} in namespace {target.namespace} "
                                  f"exited: {proc.stderr.read().strip()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.2)
        else:
            raise SubmitError(f"kubectl port-forward to svc/{target.service} did not open within {timeout:.0f} s")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()


def auth_token_from_cluster(target: Target) -> str:
    """The token KubeRay generated for the RayCluster (authOptions.mode: token), from its Secret."""
    kubectl = _kubectl(target)
    spec = json.loads(_run([*kubectl, "get", "raycluster", target.raycluster, "-o", "json"],
                           "reading the RayCluster to find its auth Secret"))
    name = (spec.get("spec", {}).get("authOptions") or {}).get("secretName")
    secrets = json.loads(_run([*kubectl, "get", "secrets", "-o", "json"], "listing Secrets to find the Ray auth token"))
    for secret in secrets.get("items", []):
        owners = {(o.get("kind"), o.get("name")) for o in secret["metadata"].get("ownerReferences", [])}
        named = name and secret["metadata"]["name"] == name
        data = secret.get("data", {})
        if (named or ("RayCluster", target.raycluster) in owners) and ray_facts.AUTH_TOKEN_KEY in data:
            return base64.b64decode(data[ray_facts.AUTH_TOKEN_KEY]).decode().strip()
    raise SubmitError(f"no Secret with an auth_token for RayCluster {target.raycluster} in namespace {target.namespace}; "
                      "is authOptions.mode token set? Or export RAY_AUTH_TOKEN yourself")


def check_reachable(address: str, token: str | None, timeout: float = CONNECT_TIMEOUT_S) -> str:
    """Fail fast, within `timeout`, with the cause: unreachable, not Ray, token missing or wrong."""
    request = urllib.request.Request(f"{address.rstrip('/')}/api/version")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read()).get("ray_version", "unknown")
    except urllib.error.HTTPError as err:
        if err.code == 401:
            raise SubmitError(f"the Ray cluster at {address} requires a token: set RAY_AUTH_TOKEN "
                              "(or omit it to read the RayCluster's auth Secret with kubectl)") from None
        if err.code == 403:
            raise SubmitError(f"the Ray cluster at {address} rejected the token: RAY_AUTH_TOKEN is wrong "
                              "for this cluster; read it again from the RayCluster's auth Secret") from None
        raise SubmitError(f"{address} answered HTTP {err.code} on /api/version: is it a Ray dashboard?") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        raise SubmitError(f"cannot reach the Ray dashboard at {address} within {timeout:.0f} s ({reason}); "
                          "check --address, or that the port-forward / cluster is up") from None


@contextlib.contextmanager
def connect(args: argparse.Namespace, target: Target | None = None) -> Iterator["JobSubmissionClient"]:  # noqa: F821
    """A JobSubmissionClient for --address, or through a port-forward that is closed afterwards."""
    token = os.environ.get("RAY_AUTH_TOKEN") or None
    with contextlib.ExitStack() as stack:
        if args.address:
            target = Target(args.address, args.namespace, args.service, args.raycluster)
        elif target is None and args.stack:
            target, _ = stack.enter_context(stack_target(args.stack))
        elif target is None:
            target = Target(None, args.namespace, args.service, args.raycluster)
        address = target.address or stack.enter_context(
            port_forward(target, timeout=max(args.timeout, PORT_FORWARD_TIMEOUT_S)))
        if token is None and target.address is None:
            token = auth_token_from_cluster(target)
        check_reachable(address, token, timeout=args.timeout)
        yield _client(address, token)


def _client(address: str, token: str | None):
    if token:  # before Ray is imported: it reads the auth mode once
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN"] = token
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(address)
    except AuthenticationError as err:
        raise SubmitError(f"authentication with the Ray cluster at {address} failed: {err}") from None
    except ConnectionError as err:
        raise SubmitError(f"cannot reach the Ray cluster at {address}: {err}") from None


# --- the job --------------------------------------------------------------------

def stage_package(into: Path) -> Path:
    """The job's working_dir: the trainer package and the facts it imports, without caches."""
    for package in JOB_PACKAGES:
        shutil.copytree(package, into / package.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return into


def runtime_env(working_dir: Path, pip: list[str], env: dict[str, str]) -> dict:
    """With NCCL_DEBUG_FILE set, every worker process first creates its directory (NCCL makes none)."""
    from trainer import efa

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


def submit(client, *, cfg, pip: list[str], env: dict[str, str], cluster_storage: bool = False) -> tuple[str, int]:
    """Submit (or resubmit) the run; a finished job of the same name is replaced, a running one is refused.

    The job runs exactly the configuration validated here: it travels as job.yaml beside the package
    (a local --chat-template file too). With `cluster_storage` the storage path is left out of it, so
    the cluster's default applies (CHECKPOINT_URI on the head, see trainer.launch.storage_default).
    Returns the job id and the length of the log a previous attempt left under the same id (Ray
    appends the new attempt to it).
    """
    import yaml
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
        working_dir = stage_package(Path(folder))
        if cfg.chat_template and "://" not in cfg.chat_template:  # the driver reads it from the working_dir
            shutil.copyfile(Path(cfg.chat_template).expanduser(), working_dir / CHAT_TEMPLATE_FILE)
            cfg = dataclass_replace(cfg, chat_template=CHAT_TEMPLATE_FILE)
        job_config = cfg.to_dict()
        if cluster_storage:
            del job_config["storage_path"]
        (working_dir / JOB_CONFIG).write_text(yaml.safe_dump(job_config, sort_keys=False))
        job_id = submit_when_ready(
            client,
            entrypoint=entrypoint(["-m", "trainer", "train", "--config", JOB_CONFIG]),
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


def follow(client, job_id: str, skip: int = 0, connection: Sequence[str] = ()) -> int:
    """Stream the job's logs until it ends, leaving out the first `skip` characters (a previous
    attempt's log, which Ray keeps in the same file); exit with its status."""
    async def stream():
        left = skip
        async for lines in client.tail_job_logs(job_id):
            if left:
                lines, left = lines[left:], max(0, left - len(lines))
            if lines:
                print(lines, end="", flush=True)

    try:
        asyncio.run(stream())
    except KeyboardInterrupt:
        print(f"\nDetached; the job keeps running. `{command_hint('logs', job_id, connection)}` follows it again, "
              f"`{command_hint('stop', job_id, connection)}` stops it.", file=sys.stderr)
        return EXIT_OK
    return report_status(client, job_id)


def report_status(client, job_id: str) -> int:
    from ray.job_submission import JobStatus

    info = client.get_job_info(job_id)
    print(f"Run {job_id}: {info.status.value}" + (f" ({info.message})" if info.message else ""), file=sys.stderr)
    if info.status == JobStatus.SUCCEEDED:
        return EXIT_OK
    if info.status == JobStatus.FAILED:
        tail = client.get_job_logs(job_id).strip().splitlines()[-20:]
        print("Last lines of the job log:\n" + "\n".join(f"  {line}" for line in tail), file=sys.stderr)
        # the job's own verdict: 2 is a bad input found on the cluster (the `error:` line above)
        return EXIT_USAGE if getattr(info, "driver_exit_code", None) == EXIT_USAGE else EXIT_FAILED
    if info.status == JobStatus.STOPPED:
        return EXIT_STOPPED
    return EXIT_OK


# --- command line ---------------------------------------------------------------

def parse_connection(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse, then take RAY_ADDRESS (as `ray job` does) when it is a dashboard URL and nothing else says where."""
    args = parser.parse_args(argv)
    env_address = os.environ.get("RAY_ADDRESS", "")
    if not args.address and not args.stack and env_address.startswith(("http://", "https://")):
        args.address = env_address
    return args


def connection_flags(args: argparse.Namespace) -> list[str]:
    """The flags that reach the same cluster again (for the commands this prints)."""
    if args.address:
        return ["--address", args.address]
    if args.stack:
        return ["--stack", args.stack]
    out = []
    for name, default in (("namespace", DEFAULT_NAMESPACE), ("service", DEFAULT_SERVICE),
                          ("raycluster", DEFAULT_RAYCLUSTER)):
        if getattr(args, name) != default:
            out += [f"--{name}", getattr(args, name)]
    return out


def command_hint(command: str, run: str, connection: Sequence[str] = ()) -> str:
    """A command that works as printed: this interpreter, the run, the same connection flags."""
    return shlex.join([sys.executable, "-m", "trainer", command, run, *connection])


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("reaching the Ray cluster")
    group.add_argument("--address", help="Ray dashboard URL, e.g. http://127.0.0.1:8265 (default: RAY_ADDRESS when "
                                         "it is such a URL and --stack is not given, else a port-forward)")
    group.add_argument("--stack", help="Pulumi stack whose outputs name the namespace, service and kubeconfig")
    group.add_argument("--namespace", default=DEFAULT_NAMESPACE, help=f"namespace of the RayCluster ({DEFAULT_NAMESPACE})")
    group.add_argument("--service", default=DEFAULT_SERVICE, help=f"head service to port-forward to ({DEFAULT_SERVICE})")
    group.add_argument("--raycluster", default=DEFAULT_RAYCLUSTER, help="RayCluster name, for its auth Secret")
    group.add_argument("--timeout", type=float, default=CONNECT_TIMEOUT_S, metavar="SECONDS",
                       help=f"give up reaching the cluster after this long ({CONNECT_TIMEOUT_S:g})")


def status_main(argv: list[str]) -> int:
    return manage("status", argv)


def logs_main(argv: list[str]) -> int:
    return manage("logs", argv)


def stop_main(argv: list[str]) -> int:
    return manage("stop", argv)


def manage(command: str, argv: list[str]) -> int:
    """`python -m trainer status|logs|stop RUN`."""
    parser = argparse.ArgumentParser(prog=f"python -m trainer {command}")
    parser.add_argument("run", help="run name (the job's submission id)")
    add_connection_arguments(parser)
    args = parse_connection(parser, argv)
    try:
        with connect(args) as client:
            try:
                if command == "logs":
                    return follow(client, args.run, connection=connection_flags(args))
                if command == "stop":
                    stopped = client.stop_job(args.run)
                    print(f"Run {args.run}: {'stop requested' if stopped else 'already finished'}")
                    return EXIT_OK
                return report_status(client, args.run)
            except RuntimeError as err:
                if "does not exist" in str(err) or "404" in str(err):
                    raise SubmitError(f"no run named {args.run!r} on this cluster; "
                                      "`ray job list` shows what is there") from None
                raise
    except SubmitError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE


# --- `python -m trainer submit` -------------------------------------------------

def job_environment(cfg, require_efa: bool | None, extra: dict[str, str], log_dir: str | None = None) -> dict[str, str]:
    """What every process of the job sees: the EFA proof settings on GPUs, then the user's --env.

    GPU jobs run NCCL_DEBUG=INFO into per-rank files (not the job log), whatever the stack's
    ncclDebug: the EFA proof reads INFO lines. Lowering it with --env is refused unless the
    check is off (--no-require-efa).
    """
    from trainer import efa

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


def _remote_problems(cfg) -> list[str]:
    """A cluster reached through a port-forward cannot read files on this machine."""
    from trainer.config import flag

    problems = []
    for name in ("model", "dataset", "tokenizer", "storage_path"):
        value = getattr(cfg, name)
        if value and "://" not in value and (Path(value).expanduser().exists() or name == "storage_path"):
            problems.append(f"{flag(name)} {value}: a local path on this machine, which the cluster cannot read; "
                            "use an s3:// URI (the stack's checkpoint bucket) or a Hugging Face hub id")
    return problems


def main(argv: list[str]) -> int:
    from trainer import config as train_config

    parser = argparse.ArgumentParser(
        prog="python -m trainer submit",
        description="Submit a fine-tuning run as a Ray job, stream its logs and exit with its status "
                    f"(0 succeeded, {EXIT_FAILED} failed, {EXIT_STOPPED} stopped, {EXIT_USAGE} bad input or "
                    "unreachable cluster). Resubmitting a run name resumes it from its last complete checkpoint.")
    train_config.add_arguments(parser)
    add_connection_arguments(parser)
    job = parser.add_argument_group("the job")
    job.add_argument("--no-wait", action="store_true", help="return once submitted")
    job.add_argument("--pip", action="append", default=[], metavar="PACKAGE", help="extra pip package (repeatable)")
    job.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="environment variable (repeatable)")
    job.add_argument("--require-efa", action=argparse.BooleanOptionalAction, default=None,
                     help="fail within the first steps if NCCL is not on EFA (default: on for multi-node GPU jobs)")
    args = parse_connection(parser, argv)

    fields = {f.name for f in dataclass_fields(train_config.TrainConfig)} | {"config", "out"}
    training = {k: v for k, v in vars(args).items() if k in fields}
    with contextlib.ExitStack() as stack:
        try:
            target, outputs = (stack.enter_context(stack_target(args.stack)) if args.stack and not args.address
                               else (None, {}))
            defaults = stack_defaults(outputs)
            cfg = train_config.from_args(argparse.Namespace(**training), defaults)
            cfg = dataclass_replace(cfg, run_name=cfg.resolved_run_name)
            cluster_storage = "storage_path" not in (defaults or {}) and not _storage_chosen(args, training)
            if not args.address:
                problems = [p for p in _remote_problems(cfg)
                            if not (cluster_storage and p.startswith(train_config.flag("storage_path")))]
                if problems:
                    raise train_config.ConfigError(problems)
            env = job_environment(cfg, args.require_efa, parse_env(args.env))
            check_capacity_of_stack(cfg, outputs)
            check_here(cfg, cluster_storage)
        except UserError as err:
            print(f"error: {err}", file=sys.stderr)
            return EXIT_USAGE
        return _submit_and_follow(args, target, cfg, env, cluster_storage)


def check_capacity_of_stack(cfg, outputs: dict) -> None:
    """More GPU workers than the stack's GPU nodes can ever hold would wait forever: refuse it here."""
    from trainer.cluster import ClusterError

    gpus = stack_gpus(outputs)
    if cfg.use_gpu and gpus is not None and cfg.num_workers > gpus:
        raise ClusterError(f"--num-workers {cfg.num_workers} asks for {cfg.num_workers} GPUs; the stack has {gpus} "
                           f"at most ({outputs.get('gpuNodeCount')} x {outputs.get('gpuNodeType')}); use "
                           f"--num-workers {gpus} or fewer, or raise gpuNodeCount")


def check_here(cfg, cluster_storage: bool) -> None:
    """The pre-flight on this machine, before anything is submitted: the model (config, tokenizer, weight
    headers), the first records, the run folder when it is known here. The job repeats it at its start on
    the cluster, with the whole dataset. s3:// inputs are checked here only with AWS credentials here."""
    from trainer.launch import preflight, print_notes

    uses_s3 = any(str(v).startswith("s3://") for v in (cfg.model, cfg.dataset, cfg.tokenizer, cfg.chat_template,
                                                        None if cluster_storage else cfg.storage_path))
    if uses_s3 and not _aws_credentials():
        print("note: no AWS credentials on this machine, so the s3:// inputs are checked at the job's start on "
              "the cluster, not here", file=sys.stderr)
        return
    print_notes(preflight(cfg, full_data=False, for_run=not cluster_storage))


def _aws_credentials() -> bool:
    try:
        import botocore.session

        return botocore.session.get_session().get_credentials() is not None
    except Exception:  # noqa: BLE001 - no botocore, or a broken profile: nothing to check with
        return False


def _storage_chosen(args: argparse.Namespace, flags: dict) -> bool:
    """Did --storage-path/--out, or the --config file, name the storage? If not, the cluster's default applies."""
    from trainer import config as train_config

    if "storage_path" in flags or "out" in flags:
        return True
    keys = {str(k).replace("-", "_") for k in train_config.load_yaml(args.config)} if args.config else set()
    return bool(keys & {"storage_path", "out"})


def _submit_and_follow(args: argparse.Namespace, target: Target | None, cfg, env: dict[str, str],
                       cluster_storage: bool = False) -> int:
    try:
        with connect(args, target) as client:
            job_id, previous_log = submit(client, cfg=cfg, pip=args.pip, env=env, cluster_storage=cluster_storage)
            where = (f"the cluster's {CHECKPOINT_ENV}/{job_id} (the stack's bucket; {cfg.run_uri} on a cluster "
                     f"without it)" if cluster_storage else cfg.run_uri)
            print(f"Submitted run {job_id}: {cfg.num_workers} {cfg.device.upper()} worker(s); checkpoints, metrics "
                  f"and the exported model go to {where}")
            connection = connection_flags(args)
            if args.no_wait:
                print(f"Follow it with `{command_hint('logs', job_id, connection)}`; stop it with "
                      f"`{command_hint('stop', job_id, connection)}`.")
                return EXIT_OK
            if previous_log:
                print(f"(The previous attempt's log is left out; `{command_hint('logs', job_id, connection)}` "
                      f"shows both.)", flush=True)
            return follow(client, job_id, skip=previous_log, connection=connection)
    except SubmitError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE


# --- `python -m trainer nccl-bench` ---------------------------------------------

def stack_gpus(outputs: dict, instance_type: str | None = None) -> int | None:
    """Every GPU of the stack: GPU nodes x GPUs per node of its instance type (None when unknown)."""
    row = _catalog_row(instance_type or outputs.get(stack_outputs.GPU_NODE_TYPE))
    count = outputs.get(stack_outputs.GPU_NODE_COUNT)
    return row.gpus * int(count) if row and count is not None else None


def stack_defaults(outputs: dict) -> dict | None:
    """What `submit --stack` trains on unless flags say otherwise: every GPU of the stack, its bucket."""
    defaults: dict = {}
    if stack_outputs.CHECKPOINT_BUCKET_URI in outputs:
        defaults["storage_path"] = outputs[stack_outputs.CHECKPOINT_BUCKET_URI]
    gpus = stack_gpus(outputs)
    if gpus:
        defaults.update(device="gpu", num_workers=gpus)
    return defaults or None


def _catalog_row(instance_type: str | None):
    """The instance type's catalog row (facts.catalog); None when no type is known."""
    from facts.catalog import GPU_TYPES

    if not instance_type:
        return None
    if instance_type not in GPU_TYPES:
        raise SubmitError(f"--instance-type {instance_type}: not in the instance catalog; use one of {', '.join(GPU_TYPES)}")
    return GPU_TYPES[instance_type]


def bench_main(argv: list[str]) -> int:
    """Submit the all-reduce bandwidth test (trainer.nccl_bench) across all workers as a Ray job."""
    from trainer import nccl_bench

    parser = argparse.ArgumentParser(
        prog="python -m trainer nccl-bench",
        description="All-reduce bus bandwidth from 8 B to 1 GiB across every worker, as a Ray job, compared with "
                    "what the instance type's network allows (from the instance catalog).")
    add_connection_arguments(parser)
    parser.add_argument("--workers", type=int, help="ranks (default: every GPU of the stack: nodes x GPUs per node)")
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu", help="gpu (NCCL) or cpu (gloo)")
    parser.add_argument("--instance-type", help="GPU instance type (default: the stack's gpuNodeType)")
    parser.add_argument("--min-bytes", type=int, default=nccl_bench.MIN_BYTES)
    parser.add_argument("--max-bytes", type=int, default=nccl_bench.MAX_BYTES)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--no-wait", action="store_true", help="return once submitted")
    args = parse_connection(parser, argv)
    with contextlib.ExitStack() as stack:
        return _bench(args, stack)


def _bench(args: argparse.Namespace, stack: contextlib.ExitStack) -> int:
    """nccl-bench's body: the stack's kubeconfig (if any) lives exactly as long as `stack`."""
    from trainer import nccl_bench

    try:
        nccl_bench.message_sizes(args.min_bytes, args.max_bytes)
        target, outputs = (stack.enter_context(stack_target(args.stack)) if args.stack and not args.address
                           else (None, {}))
        row = _catalog_row(args.instance_type or outputs.get(stack_outputs.GPU_NODE_TYPE))
        workers = args.workers or stack_gpus(outputs, args.instance_type)
        if not workers or workers < 1:
            raise SubmitError("--workers: how many ranks? pass --workers N (or --stack to use every GPU of the stack)")
        env = {}
        if args.device == "gpu":
            from trainer import efa
            env = efa.nccl_debug_env(efa.NCCL_LOG_DIR)
        bench_argv = ["--workers", str(workers), "--device", args.device, "--min-bytes", str(args.min_bytes),
                      "--max-bytes", str(args.max_bytes), "--iters", str(args.iters), "--warmup", str(args.warmup)]
        if row:
            bench_argv += ["--network-gbps", str(row.network_gbps), "--instance-type", row.name]
        if stack_outputs.CHECKPOINT_BUCKET_URI in outputs:
            bench_argv += ["--storage-path", outputs[stack_outputs.CHECKPOINT_BUCKET_URI]]
    except (ValueError, SubmitError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with connect(args, target) as client, tempfile.TemporaryDirectory(prefix="nccl-bench-") as folder:
            job_id = submit_when_ready(
                client,
                entrypoint=entrypoint(["-m", "trainer", "nccl-bench-job", *bench_argv]),
                runtime_env=runtime_env(stage_package(Path(folder)), [], env),
                submission_id=f"nccl-bench-{time.strftime('%Y%m%d-%H%M%S')}")
            print(f"Submitted {job_id}: {workers} ranks, {args.device}")
            return EXIT_OK if args.no_wait else follow(client, job_id)
    except SubmitError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
