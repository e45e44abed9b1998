"""Sharded checkpoints in run storage and resumption (the Hugging Face export: trainer.run_folder.export).

Layout of one checkpoint, `<run>/checkpoint_<step>/`:
  *.distcp, .metadata   torch.distributed.checkpoint shards of the trained parameters and their optimizer
                        state (with --method lora/qlora the adapters only: the frozen base is reloaded from
                        the model source, whose identity run.json pins)
  rng/rank_<r>.pt       each rank's Python/NumPy/torch RNG state, tensors and plain values only
  train_state.json      step, data position, scheduler state, world size
  COMPLETE.json         written last, after every rank's files are in storage

A checkpoint folder without COMPLETE.json (a crash mid-upload, ray issue 41700) is never
resumed from. The sequence per save is: every rank writes its shard and uploads it; the
ranks exchange their outcome; rank 0 lists the folder in storage and checks that every
file the DCP metadata refers to is there at full length, plus every rank's RNG state;
only then does it write the marker, which records each file's size; then the checkpoint
is reported to Ray, so Ray's "latest checkpoint" is always a complete one. A failure on
any rank fails the save on every rank with one CheckpointError (no rank hangs in a
collective waiting for another), and no marker is written.

A marker is trusted only when this trainer reads its format (MARKER_FORMAT is written,
READABLE_FORMATS are read) and while the files it lists are still there at their recorded
sizes, so a folder that lost files afterwards (a deletion cut short) is skipped too. The
marker (from format 2) also records each file's sha256, computed from the bytes as they were
written (DCP's streams, the RNG and train state), not read back; on resume the ranks
verify them, a share of the files each, and a checkpoint whose content changed (a
same-size corruption) is skipped with a log line for the previous complete one.

The RNG files are read with torch.load(weights_only=True): a pickle from storage can run code,
so anything but tensors and plain values is refused with a CheckpointError. Format 3 holds only
those; formats 1-2 pickled NumPy's MT19937 key as an ndarray, which is let through for them alone
(the NumPy globals that rebuild a uint32 array), so their checkpoints still resume bit-exact.

After every save, checkpoint folders that Ray's own bookkeeping does not track (a save
that never got reported, a crashed attempt's leftover) are pruned by the same rule Ray
applies to the ones it tracks: the newest --num-to-keep complete checkpoints stay.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import pickle
import random
import re
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from facts.errors import UserError
from trainer.storage import Storage

log = logging.getLogger(__name__)

MARKER = "COMPLETE.json"
MARKER_FORMAT = 3  # written by this trainer: 3, RNG files without pickled objects; 2, sha256 per file; 1, sizes only
READABLE_FORMATS = (1, 2, 3)  # a marker of another format (a newer trainer's) is never resumed from
TENSOR_ONLY_RNG = 3  # the first format whose RNG files load with weights_only=True and nothing allowlisted
RAY_SNAPSHOT = "checkpoint_manager_snapshot.json"  # Ray Train's record of the checkpoints it tracks
TRAIN_STATE = "train_state.json"
PREFIX = "checkpoint_"


def dir_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def names(run: Storage | str | os.PathLike) -> list[str]:
    """The checkpoint folders of a run folder (storage, a local path or a URI), complete or not, oldest first."""
    storage = run if isinstance(run, Storage) else Storage.from_uri(os.fspath(run))
    return sorted((n for n in storage.list_dirs() if step_of(n) is not None), key=step_of)


def step_of(name: str) -> int | None:
    tail = name.rsplit("/", 1)[-1]
    if not tail.startswith(PREFIX):
        return None
    try:
        return int(tail[len(PREFIX):])
    except ValueError:
        return None


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rng_state() -> dict:
    """Every RNG stream as tensors and plain values, so that the file loads with weights_only=True."""
    name, key, pos, has_gauss, cached_gaussian = np.random.get_state()
    state = {"python": random.getstate(),  # (version, 625 ints, gauss_next): plain values already
             "numpy": (name, torch.from_numpy(key.astype(np.int64)), int(pos), int(has_gauss), float(cached_gaussian)),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    """Restores what rng_state saved; NumPy's key may also be the ndarray of a format 1-2 file."""
    random.setstate(state["python"])
    name, key, *rest = state["numpy"]
    np.random.set_state((name, np.asarray(key, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _legacy_rng_globals() -> list:
    """What rebuilds the uint32 ndarray a format 1-2 RNG file pickled NumPy's key as; nothing else."""
    return [np.zeros(1).__reduce__()[0], np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def _read_rng(path: Path, marker_format: int) -> dict:
    """An RNG file read with weights_only=True; CheckpointError when it holds anything else."""
    allowed = _legacy_rng_globals() if marker_format < TENSOR_ONLY_RNG else []
    shown = f"{path.parent.name}/{path.name}"
    try:
        with torch.serialization.safe_globals(allowed):
            state = torch.load(path, weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(f"{shown}: not an RNG state of tensors and plain values, so it is not loaded (a pickle "
                              f"from storage could run code); it pickles {_pickled_globals(path, allowed)}") from None
    if not isinstance(state, dict) or not {"python", "numpy", "torch"} <= state.keys():
        raise CheckpointError(f"{shown}: not an RNG state (want a dict of python, numpy and torch states)")
    return state


def _pickled_globals(path: Path, allowed: list) -> str:
    """The globals a file's pickle names beyond those allowed, found without unpickling it."""
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception as e:  # noqa: BLE001 - only the message's detail: the file is refused either way
        return f"something unreadable ({type(e).__name__})"
    allowed_names = {f"{g.__module__}.{g.__qualname__}" for g in allowed}
    return ", ".join(sorted(g for g in found if g not in allowed_names)) or "objects weights_only=True does not load"


def _options(loading: bool = False):
    """Only the parameters that train: with lora/qlora the frozen base is not saved (it is reloaded from the model
    source on resume, which run.json's model identity pins), so a checkpoint holds the adapters and their state.
    Loading, the frozen keys are absent by design (dcp.load has already refused any trained key it lacks)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, strict=not loading)


def _sharded_state(model, optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    frozen = {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    model_state = get_model_state_dict(model, options=_options())  # keeps a tied copy of a frozen weight: dropped
    return {"model": {k: v for k, v in model_state.items() if k not in frozen},
            "optim": get_optimizer_state_dict(model, optimizer, options=_options())}


@contextmanager
def _staging(storage: Storage, name: str) -> Iterator[Path]:
    """Write straight into local storage; stage in a temp folder for remote storage."""
    if storage.is_local:
        path = Path(storage.path(name))
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    tmp = Path(tempfile.mkdtemp(prefix=f"{name}-rank{_rank()}-"))
    try:
        yield tmp
        storage.upload_dir(tmp, name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class _HashingStream(io.RawIOBase):
    """A write stream that hashes what passes through it."""

    def __init__(self, raw):
        super().__init__()
        self.raw, self.sha = raw, hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.sha.update(b)
        return self.raw.write(b)

    def tell(self) -> int:
        return self.raw.tell()

    def flush(self) -> None:
        self.raw.flush()

    def fileno(self) -> int:
        return self.raw.fileno()


def _hashing_writer(folder: Path):
    """DCP's FileSystemWriter whose streams record each file's sha256 while it is written."""
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.filesystem import FileSystem

    class HashingFileSystem(FileSystem):
        def __init__(self):
            super().__init__()
            self.digests: dict[str, str] = {}

        @contextmanager
        def create_stream(self, path, mode):
            with super().create_stream(path, mode) as raw:
                if "w" not in mode:
                    yield raw
                    return
                stream = _HashingStream(raw)
                yield stream
            self.digests[str(Path(path))] = stream.sha.hexdigest()

        def rename(self, path, new_path) -> None:
            super().rename(path, new_path)
            if str(Path(path)) in self.digests:
                self.digests[str(Path(new_path))] = self.digests.pop(str(Path(path)))

    writer = FileSystemWriter(str(folder))
    writer.fs = HashingFileSystem()
    return writer


def _write_hashed(data: bytes, path: Path, digests: dict[str, str]) -> None:
    path.write_bytes(data)
    digests[str(path)] = hashlib.sha256(data).hexdigest()


class CheckpointError(RuntimeError):
    """A checkpoint could not be written completely (it has no marker and is never resumed from), or not read."""


def _why(error: BaseException) -> str:
    """`Type: message` of a failed write; DCP's CheckpointException (a BaseException: a full disk raises one
    from dcp.save, which `except Exception` misses) by the error it wraps."""
    failures = getattr(error, "failures", None)
    if isinstance(error, CheckpointException) and isinstance(failures, dict) and failures:
        inner = next(iter(failures.values()))
        error = inner[0] if isinstance(inner, tuple) and inner and isinstance(inner[0], BaseException) else error
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300] if text else ''}"


def _gather(value):
    """Every rank's value, in rank order (a collective)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def _from_rank0(value):
    """Rank 0's value on every rank (a collective)."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _required_files(folder: Path, world: int) -> dict[str, int]:
    """Minimum size of every file a load reads: DCP's own index of the shards, the RNG and train state."""
    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(str(folder)).read_metadata()
    required: dict[str, int] = {".metadata": 1, TRAIN_STATE: 1}
    for info in (metadata.storage_data or {}).values():
        required[info.relative_path] = max(required.get(info.relative_path, 0), info.offset + info.length)
    for r in range(world):
        required[f"rng/rank_{r}.pt"] = 1
    return required


def _size(recorded) -> int:
    return recorded["size"] if isinstance(recorded, dict) else int(recorded)


def _missing(present: dict[str, int], required: dict) -> list[str]:
    """Files absent or shorter than required (`required`: path -> size, or a format-2 marker entry)."""
    return sorted(f"{path} ({'absent' if path not in present else f'{present[path]} of {_size(want)} bytes'})"
                  for path, want in required.items() if present.get(path, -1) < _size(want))


def save(storage: Storage, step: int, model, optimizer, scheduler, data_position: dict,
         extra: dict | None = None, keep: int | None = None, keep_best: bool = False) -> str:
    """Collective: every rank writes its shard; returns the checkpoint's path in storage.

    With `keep`, rank 0 then prunes the folders Ray does not track to the newest `keep`, or with
    `keep_best` the `keep` of lowest eval loss (prune).

    Raises CheckpointError on every rank when any rank failed to write or the files are not
    all in storage; the folder then has no marker and the previous checkpoint stays the latest.
    """
    import torch.distributed.checkpoint as dcp

    name = dir_name(step)
    rank, world = _rank(), _world()
    if rank == 0 and storage.exists(name):
        storage.delete_dir(name)  # a leftover of a crashed attempt at this same step
    _barrier()
    t0 = time.perf_counter()
    required: dict[str, int] = {}
    digests: dict[str, str] = {}
    error = None
    try:
        with _staging(storage, name) as folder:
            writer = _hashing_writer(folder)
            dcp.save(_sharded_state(model, optimizer), storage_writer=writer)
            digests.update(writer.fs.digests)
            (folder / "rng").mkdir(exist_ok=True)
            buffer = io.BytesIO()
            torch.save(rng_state(), buffer)
            _write_hashed(buffer.getvalue(), folder / "rng" / f"rank_{rank}.pt", digests)
            if rank == 0:
                state = {"step": step, "data_position": data_position, "world_size": world,
                         "scheduler": scheduler.state_dict() if scheduler is not None else None, **(extra or {})}
                _write_hashed(json.dumps(state, indent=1).encode(), folder / TRAIN_STATE, digests)
                required = _required_files(folder, world)
            digests = {Path(p).relative_to(folder).as_posix(): h for p, h in digests.items()}
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - reported to every rank below, then raised
        error = _why(e)
    outcomes = _gather((error, digests))
    failures = [(r, err) for r, (err, _) in enumerate(outcomes) if err]
    verdict = "; ".join(f"rank {r}: {err}" for r, err in failures) or None
    if verdict is None and rank == 0:
        try:
            present = storage.file_sizes(name)
            missing = _missing(present, required)
            hashed = {path: h for _, ranks_digests in outcomes for path, h in ranks_digests.items()}
            if missing:
                verdict = f"not in storage after the upload: {', '.join(missing)}"
            else:
                files = {path: {"size": size, "sha256": hashed.get(path)} for path, size in present.items()}
                storage.write_text(json.dumps({"format": MARKER_FORMAT, "step": step, "world_size": world,
                                               "time": time.time(), "save_s": round(time.perf_counter() - t0, 3),
                                               "files": files}), name, MARKER)
        except Exception as e:  # noqa: BLE001 - reported to every rank below, then raised
            verdict = f"rank 0 writing {MARKER}: {type(e).__name__}: {e}"
    verdict = _from_rank0(verdict)
    if verdict:
        raise CheckpointError(f"checkpoint {storage.path(name)} was not saved (no {MARKER}; the previous "
                              f"complete checkpoint stays the latest): {verdict}")
    if keep and rank == 0:
        try:
            prune(storage, keep, name, keep_best=keep_best)
        except Exception as e:  # noqa: BLE001 - the checkpoint is saved; leftovers only cost storage
            log.warning("pruning old checkpoints failed (%s: %s); they stay in storage", type(e).__name__, e)
    return storage.path(name)


def _ray_tracked(storage: Storage) -> set[str] | None:
    """Checkpoint folders Ray Train's own bookkeeping names (it deletes those itself), None if unknown."""
    if not storage.exists(RAY_SNAPSHOT):
        return set()
    try:
        return set(re.findall(rf"{PREFIX}\d{{8}}", storage.read_text(RAY_SNAPSHOT)))
    except (OSError, UnicodeDecodeError):
        return None


def ray_record(names_: list[str]) -> bytes:
    """Ray Train's checkpoint_manager_snapshot.json naming these checkpoints (oldest first; the newest is the latest).

    What Ray 2.58's CheckpointManager._load_state reads (ray/train/v2/_internal/execution/checkpoint/
    checkpoint_manager.py, _CheckpointManagerState): the same Ray version as the one running, each checkpoint's
    folder name and metrics (here only its step: the logged metrics are in metrics.jsonl), one report index per
    checkpoint, nothing pending validation."""
    from importlib.metadata import version

    results = [{"version": 0, "checkpoint_dir_name": n, "metrics": {"step": step_of(n), "checkpoint_step": step_of(n)}}
               for n in names_]
    return json.dumps({
        "ray_version": version("ray"), "checkpoint_results": results,
        "checkpoint_report_indices": list(range(len(results))),
        "latest_checkpoint_result": results[-1] if results else None,
        "pending_training_results": [], "pending_validation_specs": [], "current_report_index": len(results),
        "validated_checkpoint_dir_names": [], "timed_out_validation_checkpoint_dir_names": [],
        "failed_validation_checkpoint_dir_names": []}, indent=1).encode()


def repair_ray_record(storage: Storage) -> str | None:
    """Ray Train's checkpoint record rebuilt from the complete checkpoints when it names one that is not complete,
    or cannot be read; the old one is set aside.

    Ray resumes from the newest checkpoint its record names and deletes the paths of those it
    drops past --num-to-keep. When the newest is torn (an upload cut short), this trainer resumes
    from an older one and saves the same step again, under the same name: Ray, still tracking the
    torn one, would later delete the new folder as the old one's, then fail on the path it removed.
    An unreadable record (a full disk leaves it empty) fails every resume inside Ray's controller.
    The rebuilt record names the complete checkpoints up to the newest that verifies (verified_names),
    so Ray resumes from that one and keeps deleting old ones by its own rule. Returns the line to log,
    None when the record is fine.
    """
    if not storage.exists(RAY_SNAPSHOT):
        return None
    text = storage.read_bytes(RAY_SNAPSHOT)
    try:
        json.loads(text)
    except ValueError:
        why = f"cannot be read ({len(text)} bytes, not JSON)"
    else:
        torn = sorted(set(re.findall(rf"{PREFIX}\d{{8}}", text.decode(errors="replace"))) - set(complete_names(storage)))
        if not torn:
            return None
        why = f"names {', '.join(torn)}, which {'is' if len(torn) == 1 else 'are'} not complete"
    complete, damage = verified_names(storage)
    if not complete and damage:
        raise damaged(storage, damage)
    stamp = f"{RAY_SNAPSHOT}.set-aside-{time.strftime('%Y%m%dT%H%M%S')}"
    aside = next(name for n in range(1000) if not storage.exists(name := f"{stamp}{f'-{n}' if n else ''}"))
    storage.write_bytes(text, aside)
    if not complete:
        storage.delete_file(RAY_SNAPSHOT)
        return (f"Ray Train's checkpoint record {storage.path(RAY_SNAPSHOT)} {why}: set aside as {aside}; no "
                f"save completed, so the run starts from step 0")
    storage.write_bytes(ray_record(complete), RAY_SNAPSHOT)
    return (f"Ray Train's checkpoint record {storage.path(RAY_SNAPSHOT)} {why}: set aside as {aside} and rebuilt "
            f"from the verified checkpoint(s) {', '.join(complete)}; the run resumes from {complete[-1]}")


def verified_names(storage: Storage) -> tuple[list[str], dict[str, str]]:
    """The complete checkpoints up to the newest whose content is what was written (the one a resume starts
    from), oldest first, and the damaged ones (name -> why); one process hashes the newest until one verifies."""
    complete, damage = [], {}
    for name in names(storage):
        why = _incomplete(storage, name)
        if why is None:
            complete.append(name)
        elif not _never_completed(why):
            damage[name] = why
    while complete and (problems := content_problems(storage, complete[-1])):
        damage[complete.pop()] = f"content differs from what was written ({problems[0]})"
    return complete, dict(sorted(damage.items()))


def eval_losses(storage: Storage) -> dict[str, float]:
    """Each complete checkpoint's eval loss, as its train state holds it (those saved with an evaluation)."""
    found = {}
    for name in complete_names(storage):
        try:
            loss = json.loads(storage.read_text(name, TRAIN_STATE)).get("eval_loss")
        except (OSError, ValueError) as e:
            log.warning("checkpoint %s: unreadable %s (%s)", storage.path(name), TRAIN_STATE, e)
            continue
        if isinstance(loss, (int, float)) and math.isfinite(loss):
            found[name] = float(loss)
    return found


def complete_names(storage: Storage) -> list[str]:
    """The checkpoint folders whose marker is there and whose files are all there at their size, oldest first."""
    return [n for n in names(storage) if is_complete(storage, n)]


def prune(storage: Storage, keep: int, newest: str, *, keep_best: bool = False) -> list[str]:
    """Delete checkpoint folders outside Ray's bookkeeping by Ray's keep-N rule; returns what was deleted.

    Kept: the newest `keep` complete checkpoints (with `keep_best`, the `keep` of lowest eval loss, as
    Ray's checkpoint_score_attribute keeps them) and anything Ray tracks (Ray deletes those, and
    fails on a path that is gone). Deleted: older complete ones and incomplete ones older than
    `newest`, the checkpoint just saved.
    """
    tracked = _ray_tracked(storage)
    if tracked is None:
        return []
    found = names(storage)
    complete = [n for n in found if is_complete(storage, n)]
    if keep_best:
        scored = eval_losses(storage)
        kept = sorted(scored, key=lambda n: (scored[n], step_of(n)))[:keep]
    else:
        kept = complete[-keep:]
    keep_names = set(kept) | tracked | {newest}
    deleted = []
    for n in found:
        if n not in keep_names and step_of(n) < step_of(newest):
            storage.delete_dir(n)
            deleted.append(n)
    if deleted:
        log.info("pruned checkpoints outside Ray's bookkeeping (keeping the %s %d complete): %s",
                 "best by eval loss" if keep_best else "newest", keep, ", ".join(deleted))
    return deleted


NO_MARKER = f"no {MARKER}"  # a save that never completed: nothing was lost
TORN_MARKER = f"{MARKER} cut short"  # the same: the marker is written last


def _never_completed(why: str) -> bool:
    return why == NO_MARKER or why.startswith(TORN_MARKER)


def _incomplete(storage: Storage, name: str) -> str | None:
    """Why the checkpoint cannot be resumed from without reading its content (NO_MARKER, ...), None if complete."""
    if not storage.exists(name, MARKER):
        return NO_MARKER
    try:
        marker = json.loads(storage.read_text(name, MARKER))
    except ValueError as e:
        return f"{TORN_MARKER} ({e})"
    except OSError as e:
        return f"unreadable {MARKER} ({e})"
    if not isinstance(marker, dict):
        return f"{MARKER} holds a {type(marker).__name__}, not a marker"
    if marker.get("format", 1) not in READABLE_FORMATS:
        return (f"{MARKER} is of format {marker.get('format')!r}; this trainer reads formats "
                f"{', '.join(map(str, READABLE_FORMATS))}")
    listed = marker.get("files")
    missing = _missing(storage.file_sizes(name), listed) if listed else []
    return f"files listed in {MARKER} are gone or shorter: {', '.join(missing)}" if missing else None


def is_complete(storage: Storage, name: str) -> bool:
    """Marker present and readable, and every file it lists still there at its recorded size."""
    why = _incomplete(storage, name)
    if why is not None and why != NO_MARKER:
        log.warning("checkpoint %s: %s", storage.path(name), why)
    return why is None


class DamagedCheckpoints(UserError):
    """Every checkpoint whose save completed is damaged: resuming would quietly train the run again from step 0."""


def damaged(storage: Storage, damage: dict[str, str]) -> DamagedCheckpoints:
    """The refusal naming each damaged checkpoint (name -> why) and the ways on."""
    listed = "; ".join(f"{n}: {why}" for n, why in damage.items())
    return DamagedCheckpoints(
        f"{storage.root}: every checkpoint this run saved is damaged ({listed}), so resuming would train it again "
        f"from step 0. Restore them from a copy; or delete those folders to train it from step 0 in this run folder; "
        f"or start a new run (another --run-name)")


def check_resumable(storage: Storage) -> None:
    """Before Ray (markers and sizes only): DamagedCheckpoints when checkpoints were saved and none is complete.

    The content (sha256) is checked by the workers (resume_point), with the same refusal."""
    found = {n: _incomplete(storage, n) for n in names(storage)}
    if found and all(why is not None for why in found.values()):
        damage = {n: why for n, why in found.items() if not _never_completed(why)}
        if damage:
            raise damaged(storage, damage)


def _sha256(storage: Storage, *parts: str) -> str:
    h = hashlib.sha256()
    with storage.fs.open_input_stream(storage.path(*parts)) as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def content_problems(storage: Storage, name: str, rank: int = 0, world: int = 1) -> list[str]:
    """Files of this rank's share (every world-th) whose sha256 differs from the marker's."""
    try:
        files = json.loads(storage.read_text(name, MARKER)).get("files") or {}
    except (OSError, ValueError, AttributeError) as e:
        return [f"{MARKER}: unreadable ({e})"]
    problems = []
    hashed = sorted((p, f["sha256"]) for p, f in files.items() if isinstance(f, dict) and f.get("sha256"))
    for path, want in hashed[rank::world]:
        try:
            got = _sha256(storage, name, path)
        except OSError as e:
            problems.append(f"{path}: unreadable ({e})")
            continue
        if got != want:
            problems.append(f"{path}: sha256 {got[:12]}..., written as {want[:12]}...")
    return problems


def resume_point(storage: Storage, preferred: str | None = None) -> str | None:
    """Collective: the newest complete checkpoint whose content is what was written.

    Every rank hashes its share of each candidate's files; a checkpoint with any mismatch
    is skipped with a log line, and the previous complete one is tried. None when no save ever
    completed; DamagedCheckpoints (on every rank alike) when saves completed and none is intact.
    """
    rank, world = _rank(), _world()
    damage: dict[str, str] = {}
    for name in reversed(names(storage)):
        why = _incomplete(storage, name)
        if why is not None:
            if rank == 0:
                log.warning("skipping incomplete checkpoint %s (%s)", storage.path(name), why)
            if not _never_completed(why):
                damage[name] = why
            continue
        problems = [p for share in _gather(content_problems(storage, name, rank, world)) for p in share]
        if problems:
            if rank == 0:
                log.warning("checkpoint %s: content differs from what was written (%s); resuming from the "
                            "previous complete checkpoint instead", storage.path(name), "; ".join(problems[:3]))
            damage[name] = f"content differs from what was written ({problems[0]})"
            continue
        if rank == 0 and preferred and preferred.rstrip("/").rsplit("/", 1)[-1] != name:
            log.info("resuming from %s rather than Ray's latest reported checkpoint %s", name, preferred)
        return name
    if damage:
        raise damaged(storage, dict(reversed(damage.items())))
    return None


def needed_ranges(folder: Path, state: dict) -> dict[str, list[tuple[int, int]]]:
    """Per checkpoint file (relative path), the (offset, length) byte ranges that hold the pieces of `state`
    this rank loads, merged.

    DCP's own load planner on the checkpoint's metadata: each read item names the file, offset and
    length of a piece of this rank's shards. A rank's shards are in its own file; DCP writes each
    replicated value (a step count, a scalar) once, into whichever rank's file, so a rank also needs a
    few bytes of the others'.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    metadata = dcp.FileSystemReader(str(folder)).read_metadata()
    planner = DefaultLoadPlanner()
    planner.set_up_planner(state, metadata, is_coordinator=False)
    ranges: dict[str, list[tuple[int, int]]] = {}
    for item in planner.create_local_plan().items:
        info = metadata.storage_data[item.storage_index]
        ranges.setdefault(info.relative_path, []).append((info.offset, info.length))
    return {path: _merged(spans) for path, spans in ranges.items()}


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for offset, length in sorted(spans):
        if out and offset <= out[-1][0] + out[-1][1]:
            out[-1][1] = max(out[-1][1], offset + length - out[-1][0])
        else:
            out.append([offset, length])
    return [(o, n) for o, n in out]


def _fetch(storage: Storage, name: str, part: str, into: Path) -> None:
    target = into / part
    target.parent.mkdir(parents=True, exist_ok=True)
    with storage.fs.open_input_stream(storage.path(name, part)) as src, open(target, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 22)


def _fetch_ranges(storage: Storage, name: str, part: str, spans: list[tuple[int, int]], into: Path) -> int:
    """Only `spans` of the file, each at its own offset of a sparse local file (the rest takes no disk)."""
    target = into / part
    target.parent.mkdir(parents=True, exist_ok=True)
    fetched = 0
    with storage.fs.open_input_file(storage.path(name, part)) as src, open(target, "wb") as dst:
        for offset, length in spans:
            done = 0
            while done < length:
                block = src.read_at(min(length - done, 1 << 24), offset + done)
                if not block:
                    raise CheckpointError(f"checkpoint {storage.path(name)}: {part} ends before byte "
                                          f"{offset + length} that its metadata names")
                dst.seek(offset + done)
                dst.write(block)
                done += len(block)
            fetched += length
    return fetched


@contextmanager
def _rank_copy(storage: Storage, name: str, model, optimizer) -> Iterator[Path]:
    """The checkpoint as this rank reads it: a local folder as it is; from object storage only this rank's
    share (the metadata, the train state, its RNG file and the byte ranges of the shard files its pieces are
    in), so the ranks of a node do not each download the whole checkpoint."""
    if storage.is_local:
        yield Path(storage.path(name))
        return
    tmp = Path(tempfile.mkdtemp(prefix=f"{name}-load-"))
    try:
        for part in (".metadata", MARKER, TRAIN_STATE, f"rng/rank_{_rank()}.pt"):
            if storage.exists(name, part):
                _fetch(storage, name, part, tmp)
        for part, spans in sorted(needed_ranges(tmp, _sharded_state(model, optimizer)).items()):
            _fetch_ranges(storage, name, part, spans, tmp)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load(storage: Storage, name: str, model, optimizer, scheduler) -> dict:
    """Collective: restore model/optimizer shards (resharding if the world size changed), scheduler, RNG."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    with _rank_copy(storage, name, model, optimizer) as folder:
        state = _sharded_state(model, optimizer)
        dcp.load(state, checkpoint_id=str(folder))
        set_model_state_dict(model, state["model"], options=_options(loading=True))
        set_optimizer_state_dict(model, optimizer, state["optim"], options=_options(loading=True))
        train_state = json.loads((folder / TRAIN_STATE).read_text())
        if scheduler is not None and train_state.get("scheduler"):
            scheduler.load_state_dict(train_state["scheduler"])
        rng_file = folder / "rng" / f"rank_{_rank()}.pt"
        if rng_file.is_file() and train_state.get("world_size") == _world():
            try:
                set_rng_state(_read_rng(rng_file, _marker_format(folder)))
            except CheckpointError as e:
                raise CheckpointError(f"checkpoint {storage.path(name)}: {e}") from None
    return train_state


def _marker_format(folder: Path) -> int:
    """The format of a checkpoint's marker; this trainer's own when there is none to read."""
    try:
        return int(json.loads((folder / MARKER).read_text()).get("format", 1))
    except (OSError, ValueError, AttributeError, TypeError):
        return MARKER_FORMAT
