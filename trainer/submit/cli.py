"""The commands: `submit`, `status`, `logs`, `stop` and `nccl-bench` (run through `python -m trainer`)."""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from dataclasses import replace as dataclass_replace
from pathlib import Path

from facts import outputs as stack_outputs
from facts import ray as ray_facts
from facts.errors import EXIT_FAILED, EXIT_OK, EXIT_STOPPED, EXIT_USAGE
from trainer.config import load
from trainer.config.flags import EXTRA_ARGUMENTS, FLAGS, ConfigError, flag
from trainer.efa import nccl_bench
from trainer.submit import rayjob_commands
from trainer.submit.checks import check_capacity_of_pool, check_here
from trainer.submit.connection import add_connection_arguments, command_hint, connect, connection_flags, parse_connection
from trainer.submit.follow import follow, report_status
from trainer.submit.job import (
    entrypoint,
    job_environment,
    parse_env,
    remote_problems,
    runtime_env,
    stage_package,
    submit,
    submit_when_ready,
)
from trainer.submit.target import SubmitError, Target, catalog_row, choose_pool, stack_defaults, stack_target


def status_main(argv: list[str]) -> int:
    return manage("status", argv)


def logs_main(argv: list[str]) -> int:
    return manage("logs", argv)


def stop_main(argv: list[str]) -> int:
    return manage("stop", argv)


def manage(command: str, argv: list[str]) -> int:
    """`python -m trainer status|logs|stop RUN`."""
    parser = argparse.ArgumentParser(prog=f"python -m trainer {command}")
    parser.add_argument("run", help="run name (the job's submission id; with --rayjob, the RayJob's name)")
    add_connection_arguments(parser)
    parser.add_argument("--rayjob", action="store_true", help="the run is a RayJob (`submit --rayjob`): show its "
                                                              "attempt, follow its current attempt, or delete it")
    args = parse_connection(parser, argv)
    if args.rayjob:
        return rayjob_commands.manage(command, args)
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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer submit",
        description="Submit a fine-tuning run as a Ray job, stream its logs and exit with its status "
                    f"(0 succeeded, {EXIT_FAILED} failed, {EXIT_STOPPED} stopped, {EXIT_USAGE} bad input or "
                    "unreachable cluster). Resubmitting a run name resumes it from its last complete checkpoint.")
    load.add_arguments(parser)
    add_connection_arguments(parser)
    job = parser.add_argument_group("the job")
    job.add_argument("--no-wait", action="store_true", help="return once submitted")
    job.add_argument("--pip", action="append", default=[], metavar="PACKAGE", help="extra pip package (repeatable)")
    job.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="environment variable (repeatable)")
    job.add_argument("--require-efa", action=argparse.BooleanOptionalAction, default=None,
                     help="fail within the first steps if NCCL is not on EFA (default: on for multi-node GPU jobs)")
    rayjob_commands.add_arguments(parser)
    args = parse_connection(parser, argv)

    names = set(FLAGS) | set(EXTRA_ARGUMENTS)
    training = {k: v for k, v in vars(args).items() if k in names}
    if args.rayjob or args.dry_run:
        if not args.rayjob:
            raise SubmitError("--dry-run prints a RayJob: add --rayjob (a plain Ray job has nothing to print)")
        return rayjob_commands.submit_main(args, training, requested_pool(args, training))
    with contextlib.ExitStack() as stack:  # the stack's kubeconfig lives exactly as long as this block
        target, outputs = (stack.enter_context(stack_target(args.stack)) if args.stack and not args.address
                           else (None, {}))
        pool = choose_pool(outputs, requested_pool(args, training))
        defaults = stack_defaults(outputs, pool)
        cfg = load.from_args(argparse.Namespace(**training), defaults)
        cfg = dataclass_replace(cfg, run_name=cfg.resolved_run_name)
        cluster_storage = "storage_path" not in (defaults or {}) and not storage_chosen(args, training)
        if args.address and not cluster_storage:  # a relative folder names one here, not in the job's working_dir
            cfg = load.absolute_storage(cfg)
        if not args.address:
            problems = [p for p in remote_problems(cfg)
                        if not (cluster_storage and p.startswith(flag("storage_path")))]
            if problems:
                raise ConfigError(problems)
        env = job_environment(cfg, args.require_efa, parse_env(args.env))
        if cluster_storage:  # the head's CHECKPOINT_URI, else (one node only) a folder on the head
            env.setdefault(ray_facts.NODE_RUNS_ENV, ray_facts.NODE_RUNS_DIR)
        check_capacity_of_pool(cfg, pool)
        check_here(cfg, cluster_storage)
        return submit_and_follow(args, target, cfg, env, cluster_storage)


def plan_main(argv: list[str]) -> int:
    """`python -m trainer plan`: trainer.jobs.plan on --instance-type/--nodes, or on a stack's GPU pool (--stack)."""
    from trainer.jobs import plan

    parser = argparse.ArgumentParser(prog="python -m trainer plan", description=plan.__doc__.split("\n\n")[0])
    plan.add_arguments(parser)
    parser.add_argument("--stack", help="Pulumi stack: its GPU pool's instance type and node count")
    parser.add_argument("--pool", help="the stack's GPU pool (required when it has several)")
    args = parser.parse_args(list(argv))
    if args.stack and (args.instance_type or args.nodes):
        raise plan.PlanError("--stack and --instance-type/--nodes: give one of them (the stack names both)")
    if not args.stack:
        if not args.instance_type or args.nodes is None:
            raise plan.PlanError("--instance-type and --nodes are both required, or --stack NAME")
        return plan.run(args, plan.Target(args.instance_type, args.nodes))
    with stack_target(args.stack) as (_, outputs):
        pool = choose_pool(outputs, args.pool)
    if pool is None:
        raise SubmitError(f"--stack {args.stack}: the stack has no GPU node pool with Ray workers to plan for")
    return plan.run(args, plan.Target(pool.instance_type, pool.max_nodes, disk_gib=pool.disk_gib, pool=pool.name))


def requested_pool(args: argparse.Namespace, flags: dict) -> str | None:
    """--pool, else the --config file's `pool`: it decides the defaults, so it is read before the rest (the
    configuration then carries it to the job, which pins its workers to the pool)."""
    if flags.get("pool"):
        return flags["pool"]
    return (load.load_yaml(args.config).get("pool") if args.config else None) or None


def storage_chosen(args: argparse.Namespace, flags: dict) -> bool:
    """Did --storage-path/--out, or the --config file, name the storage? If not, the cluster's default applies."""
    if "storage_path" in flags or "out" in flags:
        return True
    return bool(load.yaml_keys(args.config) & {"storage_path", "out"})


def submit_and_follow(args: argparse.Namespace, target: Target | None, cfg, env: dict[str, str],
                      cluster_storage: bool = False) -> int:
    with connect(args, target) as client:
        if cluster_storage and args.address:  # a stack's RayCluster sets CHECKPOINT_URI on its head
            check_nodes_share_storage(client, env[ray_facts.NODE_RUNS_ENV])
        job_id, previous_log = submit(client, cfg=cfg, pip=args.pip, env=env, cluster_storage=cluster_storage)
        where = (f"the cluster's {ray_facts.CHECKPOINT_ENV}/{job_id} (the stack's bucket; on a single-node "
                 f"cluster without it, {env[ray_facts.NODE_RUNS_ENV]}/{job_id} on the head)" if cluster_storage
                 else cfg.run_uri)
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


def check_nodes_share_storage(client, folder: str) -> None:
    """Before submitting without storage to a cluster named by --address: a folder on the head serves one node
    only, so a cluster of several is refused here (the job checks again at its start, the autoscaler included)."""
    from ray.util.state import list_nodes

    from trainer.jobs.cluster import ClusterError, shared_storage_problem

    try:
        alive = list_nodes(address=client.get_address(), filters=[("state", "=", "ALIVE")],
                           raise_on_missing_output=False)
    except Exception:  # noqa: BLE001 - an older dashboard without the State API: the job's own check decides
        return
    problem = shared_storage_problem(len(alive), False, f"{folder}/{'<run name>'}")
    if problem:
        raise ClusterError(problem)


def bench_main(argv: list[str]) -> int:
    """Submit the all-reduce bandwidth test (trainer.efa.nccl_bench) across all workers as a Ray job."""

    parser = argparse.ArgumentParser(
        prog="python -m trainer nccl-bench",
        description="All-reduce bus bandwidth from 8 B to 1 GiB across every worker, as a Ray job, compared with "
                    "what the instance type's network allows (from the instance catalog).")
    add_connection_arguments(parser)
    parser.add_argument("--workers", type=int, help="ranks (default: every GPU of the stack: nodes x GPUs per node)")
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu", help="gpu (NCCL) or cpu (gloo)")
    parser.add_argument("--instance-type", help="GPU instance type (default: the pool's)")
    parser.add_argument("--pool", help="GPU node pool to run on (default: the stack's only GPU pool; required when it "
                                       "has several)")
    parser.add_argument("--min-bytes", type=int, default=nccl_bench.MIN_BYTES)
    parser.add_argument("--max-bytes", type=int, default=nccl_bench.MAX_BYTES)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--no-wait", action="store_true", help="return once submitted")
    args = parse_connection(parser, argv)
    try:
        nccl_bench.message_sizes(args.min_bytes, args.max_bytes)
    except ValueError as err:
        raise SubmitError(f"--min-bytes {args.min_bytes} / --max-bytes {args.max_bytes}: {err}") from None
    with contextlib.ExitStack() as stack:  # the stack's kubeconfig lives exactly as long as this block
        target, outputs = (stack.enter_context(stack_target(args.stack)) if args.stack and not args.address
                           else (None, {}))
        pool = choose_pool(outputs, args.pool)
        row = catalog_row(args.instance_type or (pool.instance_type if pool else None))
        workers = args.workers or (pool.max_nodes * row.gpus if pool and row else None)
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
        if args.pool:  # checked against the stack's pools above, when there is a stack
            bench_argv += ["--pool", args.pool]
        if stack_outputs.CHECKPOINT_BUCKET_URI in outputs:
            bench_argv += ["--storage-path", outputs[stack_outputs.CHECKPOINT_BUCKET_URI]]
        with connect(args, target) as client, tempfile.TemporaryDirectory(prefix="nccl-bench-") as folder:
            job_id = submit_when_ready(
                client,
                entrypoint=entrypoint(["-m", "trainer", "nccl-bench-job", *bench_argv]),
                runtime_env=runtime_env(stage_package(Path(folder)), [], env),
                submission_id=f"nccl-bench-{time.strftime('%Y%m%d-%H%M%S')}")
            print(f"Submitted {job_id}: {workers} ranks, {args.device}")
            return EXIT_OK if args.no_wait else follow(client, job_id)
