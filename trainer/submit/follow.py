"""Following a job: its log streamed until it ends, and its status as the exit code
(docs/troubleshooting.md, Exit codes)."""

from __future__ import annotations

import asyncio
import sys
from typing import Sequence

from facts.errors import EXIT_FAILED, EXIT_OK, EXIT_STOPPED, EXIT_USAGE
from trainer.submit.connection import command_hint


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
