"""One rule for retries: an attempt is retried only when a machine failed, never for the inputs.

A failed fit is retried (a resume from the last complete checkpoint) only when every worker
failure is one of a machine: a node or process lost (Ray's actor, node and health-check
errors), the network or collectives (torch.distributed's errors, NCCL, gloo, sockets),
storage I/O, a device fault, or the --fail-at-step testing aid that stands for one. Anything
else a worker raises comes from what it was given (the configuration, data, model, tokenizer
or credentials) and fails alike on every attempt: it ends the run at once as a UserError
(exit 2), the lowest rank's, one line. A preemption is Ray's own (its separate budget).
"""

from __future__ import annotations

import errno

from facts.errors import UserError, first_line
from trainer.jobs.cluster import ClusterError
from trainer.loop.run import InjectedFailure
from trainer.run_folder.checkpoint import CheckpointError

# RuntimeError texts of the machine: the collectives' transports, and CUDA faults of the device itself (not a
# device-side assert: an index out of range, such as a token id beyond the model's vocabulary)
MACHINE_TEXTS = ("nccl", "gloo", "c10d", "connection reset", "connection closed", "connection refused",
                 "broken pipe", "timed out", "ecc error", "uncorrectable", "illegal memory access",
                 "unspecified launch failure", "cuda driver", "no cuda gpus are available", "libfabric")
# OSErrors caused by a path the user gave (the pre-flight checks them; on a worker they still repeat)
INPUT_ERRNOS = (errno.ENOENT, errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR, errno.EROFS)


class WorkerInputError(UserError):
    """A worker failed on what it was given (not on a machine): retrying would fail alike."""

    def __init__(self, message: str):
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (str(self),))


def _ray_machine_types() -> tuple[type, ...]:
    import ray.exceptions as rex
    from ray.train.v2._internal import exceptions as train_ex

    return (rex.RayActorError, rex.NodeDiedError, rex.WorkerCrashedError, rex.ObjectLostError,
            rex.RaySystemError, rex.OutOfMemoryError, rex.GetTimeoutError,
            train_ex.WorkerHealthCheckFailedError, train_ex.WorkerHealthCheckTimeoutError,
            train_ex.WorkerGroupStartupFailedError, train_ex.CollectiveTimeoutError)


def machine_failure(error: BaseException) -> bool:
    """Whether a worker's exception is a failure of a machine (node, process, network, storage, device)."""
    import torch.distributed as dist

    if isinstance(error, UserError):
        return False
    if isinstance(error, (InjectedFailure, CheckpointError, ConnectionError, TimeoutError, dist.DistError,
                          *_ray_machine_types())):
        return True
    if isinstance(error, OSError):
        return error.errno not in INPUT_ERRNOS
    if type(error) is RuntimeError or type(error).__name__ in ("AcceleratorError", "OutOfMemoryError"):
        text = str(error).lower()
        return any(t in text for t in MACHINE_TEXTS)
    return False


def user_error(error: BaseException) -> UserError | None:
    """The user error behind a failed fit (the lowest rank's), or None when only machines failed.

    A worker's UserError is raised as it is; any other exception that is no machine's failure
    becomes a WorkerInputError naming the rank and the exception: it fails alike on every retry.
    """
    from ray.train import ControllerError, WorkerGroupError

    if isinstance(error, UserError):
        return error
    if isinstance(error, WorkerGroupError):
        for _, failure in sorted(error.worker_failures.items()):
            if isinstance(failure, UserError):
                return failure
        for rank, failure in sorted(error.worker_failures.items()):
            if not machine_failure(failure):
                return WorkerInputError(
                    f"rank {rank}: {first_line(failure)}. This is no failure of a machine (a node, process, network "
                    f"or storage), so it would fail alike on every retry and was not retried: it comes from the "
                    f"inputs (--model, --tokenizer, --dataset, --config or a flag, or credentials); the worker's "
                    f"log above shows where")
        return None
    if isinstance(error, ControllerError):
        from ray.train.v2._internal.exceptions import InsufficientClusterResourcesError

        if isinstance(error.controller_failure, InsufficientClusterResourcesError):
            return ClusterError(str(error.controller_failure).replace("\n", " "))
    return None


def retryable(error: BaseException) -> bool:
    """A worker group that failed only of machine failures (a lost node or process, the network, storage)."""
    from ray.train import WorkerGroupError

    return isinstance(error, WorkerGroupError) and user_error(error) is None


def failure_summary(error: BaseException) -> str:
    """`rank N: Type: first line` of a failed attempt, for the retry line."""
    from ray.train import WorkerGroupError

    if isinstance(error, WorkerGroupError) and error.worker_failures:
        rank, first = min(error.worker_failures.items())
        return f"rank {rank}: {first_line(first)}"
    return first_line(error)
