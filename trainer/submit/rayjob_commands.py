"""`submit --rayjob`, and `status|logs|stop RUN --rayjob`: the RayJob (trainer.submit.rayjob) through kubectl."""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
from dataclasses import replace as dataclass_replace
from pathlib import Path
from typing import Iterator

import facts
from facts import outputs as stack_outputs
from facts.errors import EXIT_OK
from trainer.config import load
from trainer.config.flags import ConfigError, flag, is_remote
from trainer.submit import rayjob
from trainer.submit.checks import check_capacity_of_pool, check_here
from trainer.submit.connection import command_hint, connect
from trainer.submit.follow import follow
from trainer.submit.job import job_environment, parse_env, remote_problems, runtime_env, stage_job, train_entrypoint
from trainer.submit.target import SubmitError, Target, choose_pool, stack_defaults, stack_target

REPO = Path(facts.__file__).resolve().parent.parent  # where `python -m deploy.stack_outputs` runs (dry runs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("KubeRay RayJob mode (with --stack)")
    group.add_argument("--rayjob", nargs="?", const=rayjob.OWN, choices=(rayjob.OWN, rayjob.STACK),
                       help="run as a RayJob: `--rayjob` on a cluster of its own, deleted when the job ends; "
                            "`--rayjob stack` on the stack's RayCluster")
    group.add_argument("--max-hours", type=float, help="stop the job after this long, every attempt and the wait "
                                                       "for nodes included (activeDeadlineSeconds)")
    group.add_argument("--max-wait", type=float, metavar="MINUTES",
                       help="give up when the job is not running after this long: no capacity, an image that "
                            "does not pull (preRunningDeadlineSeconds)")
    group.add_argument("--retries", type=int, default=0, help="new attempts after a failed one, each on a new "
                                                              "cluster, resuming from the last complete checkpoint "
                                                              "(backoffLimit; default 0)")
    group.add_argument("--ttl", type=int, default=rayjob.DEFAULT_TTL_S, metavar="SECONDS",
                       help=f"keep the finished RayJob this long for status and logs "
                            f"(ttlSecondsAfterFinished; default {rayjob.DEFAULT_TTL_S})")
    group.add_argument("--dry-run", action="store_true", help="print the RayJob as YAML and stop: no cluster, no "
                                                              "upload (the stack's configuration, read offline)")


def offline_outputs(stack: str) -> dict:
    """What the stack would export, from Pulumi.<stack>.yaml under mocks (`python -m deploy.stack_outputs`)."""
    proc = subprocess.run([sys.executable, "-m", "deploy.stack_outputs", "--stack", stack], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        lines = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise SubmitError(f"--stack {stack} --dry-run: the offline plan failed: {lines[-1] if lines else proc.returncode}")
    return json.loads(proc.stdout)


@contextlib.contextmanager
def stack(args: argparse.Namespace) -> Iterator[tuple[Target | None, dict]]:
    if not args.stack or args.address:
        raise SubmitError("--rayjob: a RayJob is created in a stack's Kubernetes cluster; pass --stack NAME "
                          "(not --address)")
    if args.dry_run:
        yield None, offline_outputs(args.stack)
        return
    with stack_target(args.stack) as found:
        yield found


def submit_main(args: argparse.Namespace, training: dict, requested_pool: str | None) -> int:
    """Build the RayJob from the stack's outputs; print it (--dry-run) or upload its package and create it."""
    caps = rayjob.Caps(args.max_hours, args.max_wait, args.retries, args.ttl)
    if problems := caps.problems(args.rayjob):
        raise ConfigError(problems)
    if training.get("run_name"):  # before the stack is read
        rayjob.job_name(training["run_name"])
    with stack(args) as (target, outputs):
        pool = choose_pool(outputs, requested_pool)
        cfg = load.from_args(argparse.Namespace(**training), stack_defaults(outputs, pool))
        cfg = dataclass_replace(cfg, run_name=cfg.resolved_run_name)
        name = rayjob.job_name(cfg.run_name)
        problems = remote_problems(cfg)
        if not is_remote(cfg.storage_path) and not any(p.startswith(flag("storage_path")) for p in problems):
            problems.append(f"{flag('storage_path')} {cfg.storage_path}: a RayJob's attempts run on new clusters; "
                            "use an s3:// URI (the stack's checkpoint bucket is the default)")
        if problems:
            raise ConfigError(problems)
        if not args.dry_run:
            check_capacity_of_pool(cfg, pool)
            check_here(cfg, False)
        env = job_environment(cfg, args.require_efa, parse_env(args.env))
        with tempfile.TemporaryDirectory(prefix="trainer-rayjob-") as folder:
            data, digest = rayjob.package(stage_job(Path(folder), cfg))
        uri = rayjob.package_uri(cfg.storage_path, digest)
        body = rayjob.manifest(
            name=name, namespace=outputs[stack_outputs.RAY_NAMESPACE], entrypoint=train_entrypoint(),
            runtime_env=runtime_env(uri, args.pip, env), caps=caps,
            **({"cluster_spec": own_cluster_spec(outputs, args.stack)} if args.rayjob == rayjob.OWN
               else {"cluster": outputs.get(stack_outputs.RAY_CLUSTER_NAME)}))
        if args.dry_run:
            import yaml

            print(yaml.safe_dump(body, sort_keys=False), end="")
            print(f"# dry run: nothing created; the job's package ({len(data)} bytes) would be uploaded to {uri}",
                  file=sys.stderr)
            return EXIT_OK
        replace_finished(target, name)
        upload(data, uri)
        rayjob.create(target, body)
    connection = ["--stack", args.stack, "--rayjob"]
    print(f"Created RayJob {name} in namespace {body['metadata']['namespace']}: {cfg.num_workers} "
          f"{cfg.device.upper()} worker(s); checkpoints, metrics and the exported model go to {cfg.run_uri}. "
          f"Follow it with `{command_hint('logs', name, connection)}`; see its attempt with "
          f"`{command_hint('status', name, connection)}`; stop it with `{command_hint('stop', name, connection)}`.")
    return EXIT_OK


def own_cluster_spec(outputs: dict, stack_name: str) -> dict:
    spec = outputs.get(stack_outputs.RAY_JOB_CLUSTER_SPEC)
    if not spec:
        raise SubmitError(f"--stack {stack_name}: the stack has no output {stack_outputs.RAY_JOB_CLUSTER_SPEC} (deployed "
                          "by an older version of this program); run `pulumi up`, or use --rayjob stack")
    return spec


def replace_finished(target: Target, name: str) -> None:
    """A finished RayJob of the same name goes (its run resumes in the new one); a running one is refused."""
    existing = rayjob.get(target, name)
    if existing is None:
        return
    deployment = (existing.get("status") or {}).get("jobDeploymentStatus")
    if deployment not in rayjob.TERMINAL:
        raise SubmitError(f"RayJob {name} exists and is {deployment or 'starting'}: follow it with "
                          f"`python -m trainer logs {name} --stack ... --rayjob`, or stop it with "
                          f"`python -m trainer stop {name} --stack ... --rayjob`")
    print(f"RayJob {name} was {deployment}: replacing it; the run resumes from its last complete checkpoint.")
    rayjob.delete(target, name)


def upload(data: bytes, uri: str) -> None:
    """The package, once: it is named by its content."""
    from trainer.storage import Storage

    parent, _, file_name = uri.rpartition("/")
    try:
        where = Storage.from_uri(parent)
        if not where.exists(file_name):
            where.write_bytes(data, file_name)
    except OSError as err:
        raise SubmitError(f"uploading the job's package to {uri} failed ({err}); the RayJob's cluster downloads it "
                          "from there: check this machine's AWS credentials for the stack's bucket") from None


def manage(command: str, args: argparse.Namespace) -> int:
    """`status|logs|stop RUN --rayjob`: the RayJob's attempt and state, its current job's log, or its deletion."""
    with contextlib.ExitStack() as stack_:
        target = (stack_.enter_context(stack_target(args.stack))[0] if args.stack
                  else Target(None, args.namespace, args.service, args.raycluster))
        if command == "stop":
            if rayjob.get(target, args.run) is None:
                raise SubmitError(f"no RayJob named {args.run!r} in namespace {target.namespace}")
            rayjob.delete(target, args.run)
            print(f"RayJob {args.run}: deleted; KubeRay stops its Ray job and removes the cluster it created")
            return EXIT_OK
        job = rayjob.get(target, args.run)
        if job is None:
            raise SubmitError(f"no RayJob named {args.run!r} in namespace {target.namespace}; "
                              "`kubectl get rayjobs` shows what is there")
        print(rayjob.describe(job), file=sys.stderr)
        if command == "status":
            return rayjob.exit_code(job)
        head = rayjob.cluster_target(target, job)
        with connect(argparse.Namespace(**{**vars(args), "address": None, "stack": None}), head) as client:
            code = follow(client, job["status"]["jobId"])
        after = rayjob.get(target, args.run)
        if after is not None:
            print(rayjob.describe(after), file=sys.stderr)
        return code
