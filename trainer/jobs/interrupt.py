"""Ctrl-C (SIGINT) or SIGTERM to the driver while it trains: the run stops cleanly, exit 130, naming the last
complete checkpoint, from which the same command resumes.

Ray Train's fit() installs a SIGINT handler of its own that aborts its controller and then exits
1 without a word, and leaves SIGTERM to the default (Ray's C++ signal dump). Here fit() gets this
module's handler instead, for both signals (through TorchTrainer's `_register_sigint_handler`,
the one place fit() asks for one; without it, Ray's own behaviour stays): the first signal aborts
the controller as Ray's does, and once fit() returns or fails, Interrupted is raised in its place.
A second signal stops at once (KeyboardInterrupt).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from typing import Iterator

from facts.errors import EXIT_INTERRUPTED, UserError
from trainer.run_folder import checkpoint as ckpt
from trainer.storage import Storage

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(UserError):
    """The run was stopped by a signal; it resumes from its last complete checkpoint."""

    exit_code = EXIT_INTERRUPTED


class Stop:
    """The signal that stopped the run (None while none did); `attach` hands fit() this handler."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def attach(self, trainer):
        if not hasattr(trainer, "_register_sigint_handler"):
            return trainer

        def register(controller) -> None:
            import ray

            def handler(signum, frame) -> None:
                if self.signum is not None:
                    raise KeyboardInterrupt
                self.signum = signum
                print(f"note: {signal.Signals(signum).name}: stopping the run (again to stop at once)",
                      file=sys.stderr, flush=True)
                with contextlib.suppress(Exception):
                    ray.get(controller.abort.remote())

            for sig in SIGNALS:
                signal.signal(sig, handler)

        trainer._register_sigint_handler = register
        return trainer


def wait_for_workers(timeout_s: float = 30.0) -> None:
    """Until this job's training workers are gone (at most timeout_s).

    fit() returns once Ray's controller has asked its workers to stop, given them 5 s and sent ray.kill,
    which is asynchronous: a worker can still finish a checkpoint after that. The checkpoint named to the
    user must be the one a resume will really start from, so it is read only once no worker is left."""
    import ray
    from ray.util.state import list_actors

    deadline = time.monotonic() + timeout_s
    with contextlib.suppress(Exception):  # no state API (a cluster without its dashboard): name what is there
        context = ray.get_runtime_context()
        filters = [("job_id", "=", context.get_job_id()), ("class_name", "=", "RayTrainWorker"), ("state", "!=", "DEAD")]
        # the connected cluster's address: without one the state API refuses when two clusters share the machine
        while list_actors(address=context.gcs_address, filters=filters, raise_on_missing_output=False) and \
                time.monotonic() < deadline:
            time.sleep(0.5)


def last_checkpoint(run: Storage) -> str:
    """Where the run resumes from, in words."""
    try:
        names = ckpt.complete_names(run)
    except Exception:  # noqa: BLE001 - the message must come out whatever the storage says
        names = []
    if not names:
        return "no checkpoint is complete yet, so running the same command again starts it from step 0"
    return (f"its last complete checkpoint is {run.path(names[-1])} (step {ckpt.step_of(names[-1])}); run the "
            f"same command again to resume from it")


@contextlib.contextmanager
def stopped_by_signal(run: Storage) -> Iterator[Stop]:
    """The block with SIGINT and SIGTERM handlers restored after it; Interrupted when a signal stopped it."""
    stop = Stop()
    saved = {sig: signal.getsignal(sig) for sig in SIGNALS}
    try:
        yield stop
    except BaseException:
        if stop.signum is None:
            raise
    finally:
        for sig, handler in saved.items():
            with contextlib.suppress(ValueError, TypeError):  # not the main thread: nothing was installed
                signal.signal(sig, handler)
    if stop.signum is not None:
        wait_for_workers()
        raise Interrupted(f"interrupted by {signal.Signals(stop.signum).name}: the run stopped; "
                          f"{last_checkpoint(run)}")
