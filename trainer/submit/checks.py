"""What `submit` checks on this machine before anything reaches a cluster: the pool's capacity, the pre-flight."""

from __future__ import annotations

import sys

from trainer.submit.target import GpuPool


def check_capacity_of_pool(cfg, pool: GpuPool | None) -> None:
    """More GPU workers than the pool's nodes can ever hold would wait forever: refuse it here."""
    from trainer.jobs.cluster import ClusterError

    if cfg.use_gpu and pool is not None and cfg.num_workers > pool.gpus:
        raise ClusterError(f"--num-workers {cfg.num_workers} asks for {cfg.num_workers} GPUs; node pool {pool.name} "
                           f"has {pool.gpus} at most ({pool.max_nodes} x {pool.instance_type}); use --num-workers "
                           f"{pool.gpus} or fewer, or give the pool more nodes (gpuNodeCount, or with nodePools "
                           f"the pool's desiredSize or maxSize)")


def check_here(cfg, cluster_storage: bool) -> None:
    """The pre-flight on this machine, before anything is submitted: the model (config, tokenizer, weight
    headers), the first records, the run folder when it is known here. The job repeats it at its start on
    the cluster, with the whole dataset. s3:// inputs are checked here only with AWS credentials here."""
    from trainer.jobs.launch import preflight, print_notes

    uses_s3 = any(str(v).startswith("s3://") for v in (cfg.model, cfg.dataset, cfg.tokenizer, cfg.chat_template,
                                                        None if cluster_storage else cfg.storage_path))
    if uses_s3 and not aws_credentials():
        print("note: no AWS credentials on this machine, so the s3:// inputs are checked at the job's start on "
              "the cluster, not here", file=sys.stderr)
        return
    print_notes(preflight(cfg, full_data=False, for_run=not cluster_storage))


def aws_credentials() -> bool:
    try:
        import botocore.session

        return botocore.session.get_session().get_credentials() is not None
    except Exception:  # noqa: BLE001 - no botocore, or a broken profile: nothing to check with
        return False
