"""A user error raised on a worker is named once, by the driver, as one `error:` line: Ray prints none of it.

Ray Train 2.58 logs an exception of the training function twice, each with the worker's traceback:
the worker's "Error in training function" (ray/train/v2/_internal/util.py,
construct_user_exception_with_traceback, inside the except block of the thread that ran it) and the
controller's failure-policy decision, which quotes that traceback (failure_handling/default.py,
_log_decision, with the WorkerGroupError as exc_info). Both reach the driver's stderr through Ray's log
streaming. For a UserError (a message that names the input and the fix) the traceback adds nothing,
so both records are dropped; any other exception keeps them: its traceback is where it came from.
"""

from __future__ import annotations

import logging
import sys

from ray.train import UserCallback

from facts.errors import UserError

WORKER_LOGGER = "ray.train.v2._internal.util"
CONTROLLER_LOGGER = "ray.train.v2._internal.execution.failure_handling.default"


class WorkerRecord(logging.Filter):
    """Drops Ray's log of the training function's exception when that exception is a UserError."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not isinstance(sys.exc_info()[1], UserError)


class ControllerRecord(logging.Filter):
    """Drops the failure policy's decision when a worker's failure in it is a UserError (the driver names it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        failures = getattr(error, "worker_failures", None) or {}
        return not any(isinstance(f, UserError) for f in failures.values())


def install(logger_name: str, kind: type[logging.Filter]) -> None:
    """The filter on Ray's logger of that name, once per process."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, kind) for f in logger.filters):
        logger.addFilter(kind())


def on_worker() -> None:
    """In the training function, before anything can fail."""
    install(WORKER_LOGGER, WorkerRecord)


class QuietUserErrors(UserCallback):
    """On the controller (RunConfig.callbacks), where the failure policy logs its decision.

    UserCallback.after_exception is called from the worker group's poll, before the failure policy decides
    (controller.py, _step), so the filter is in place for that decision's record."""

    def after_exception(self, run_context, worker_exceptions) -> None:
        install(CONTROLLER_LOGGER, ControllerRecord)
