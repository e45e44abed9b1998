"""One run at a time trains into a run folder: the driver holds its lock while it fits.

Two runs into one folder would save the same steps over each other and prune each other's
checkpoints. Locally (and on a shared filesystem) the lock is an flock on LOCK in the run folder,
which the kernel releases when the holding process dies, so a killed driver never leaves it
stuck; the file names the holder, for the refusal. In an object store (s3://) nothing can lock:
LOCK is an object naming the holder, taken over when that holder is a process of this host
that no longer runs, and removed by its holder at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Iterator

from facts.errors import UserError
from trainer.storage import Storage

LOCK = "run.lock"


class RunFolderLocked(UserError):
    """Another run is training into this run folder."""


def _owner(run_name: str) -> dict:
    return {"run_name": run_name, "host": socket.gethostname(), "pid": os.getpid(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def _refusal(storage: Storage, holder: dict, fix: str = "") -> RunFolderLocked:
    who = (f"run {holder.get('run_name', '?')!r} (driver pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
           f"since {holder.get('since', '?')})")
    return RunFolderLocked(f"{storage.root}: {who} is training into this run folder ({storage.path(LOCK)}); two "
                           f"runs would save and prune each other's checkpoints. Wait for it to end or stop it, or "
                           f"use another --run-name (or --out FOLDER){fix}")


def _read(path: Path) -> dict:
    try:
        value = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _alive(pid: object) -> bool:
    try:
        os.kill(int(pid), 0)  # type: ignore[arg-type]
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _local(storage: Storage, run_name: str) -> Iterator[None]:
    import fcntl

    path = Path(storage.path(LOCK))
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _refusal(storage, _read(path)) from None
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break  # the file still at the path: not one its previous holder removed after we opened it
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(_owner(run_name)).encode())
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)  # releases the flock


@contextlib.contextmanager
def _remote(storage: Storage, run_name: str) -> Iterator[None]:
    owner = _owner(run_name)
    if storage.exists(LOCK):
        try:
            holder = json.loads(storage.read_text(LOCK))
        except (OSError, ValueError):
            holder = {}
        stale = holder.get("host") == owner["host"] and not _alive(holder.get("pid"))
        if not stale:
            raise _refusal(storage, holder, f". If that run is gone (its driver was killed), delete "
                                            f"{storage.path(LOCK)} and run again")
    storage.write_text(json.dumps(owner), LOCK)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            if json.loads(storage.read_text(LOCK)) == owner:
                storage.delete_file(LOCK)


_HELD: set[str] = set()  # run folders this process holds: a nested hold is the same hold


@contextlib.contextmanager
def held(storage: Storage, run_name: str) -> Iterator[None]:
    """Hold the run folder's lock for the block; RunFolderLocked naming the holder when another run has it."""
    key = storage.path()
    if key in _HELD:
        yield
        return
    with (_local if storage.is_local else _remote)(storage, run_name):
        _HELD.add(key)
        try:
            yield
        finally:
            _HELD.discard(key)


def check_free(storage: Storage, run_name: str) -> None:
    """RunFolderLocked now, before a cluster is joined, when another run holds the folder; nothing is created."""
    if storage.path() in _HELD:
        return
    try:
        if not storage.exists(LOCK):
            return
    except OSError:  # storage that does not answer: the pre-flight names why
        return
    with held(storage, run_name):
        pass
