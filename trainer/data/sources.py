"""Where the training records come from, read through Hugging Face `datasets` (the loaders TRL users
already rely on):

    --dataset org/name [--dataset-config SUBSET] [--dataset-split train]   a hub dataset
    --dataset data.jsonl | .json | .parquet | .csv | .txt (also .gz etc.)   one file
    --dataset folder/                                                       a folder of shards (or a dataset repo
                                                                            layout with README configs)
    --dataset saved/                                                        `Dataset.save_to_disk` output
    --dataset s3://bucket/key or s3://bucket/prefix/                        any of the above in S3

s3:// inputs are copied to the node's cache (trainer.cache) through the run storage's filesystem
(pyarrow, the same credentials and endpoint as checkpoints; no s3fs needed), re-fetched when an
object's size or modification time changes, then read like local ones.
Splits accept datasets' slicing syntax (`train[:1000]`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from facts.errors import first_line
from trainer import cache
from trainer.data import mixture
from trainer.data.formats import DataError
from trainer.storage import Storage

BUILDERS = {".jsonl": "json", ".json": "json", ".ndjson": "json", ".parquet": "parquet", ".csv": "csv",
            ".tsv": "csv", ".arrow": "arrow", ".txt": "text"}
_COMPRESSION = (".gz", ".bz2", ".xz", ".zst", ".lz4")
SAVED_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")


@dataclass(frozen=True)
class Source:
    """A dataset location resolved to what `datasets` reads: kind is hub, file, folder or saved."""

    spec: str
    kind: str
    path: str
    config: str | None = None
    split: str = "train"
    builder: str | None = None
    members: tuple = ()  # a mixture's datasets, each resolved (trainer.data.mixture)

    @property
    def label(self) -> str:
        if self.kind == "mixture":
            return f"dataset {mixture.label(self.spec)}"
        extra = [f"config {self.config!r}" if self.config else "", f"split {self.split!r}"]
        return f"dataset {self.spec!r} ({', '.join(e for e in extra if e)})"


def builder_for(name: str) -> str | None:
    lower = name.lower()
    for ext in _COMPRESSION:
        if lower.endswith(ext):
            lower = lower[: -len(ext)]
    return BUILDERS.get(Path(lower).suffix)


def _looks_like_path(spec: str) -> bool:
    return spec.startswith(("/", ".", "~")) or builder_for(spec) is not None or spec.count("/") > 1


def _local_kind(path: Path, spec: str) -> tuple[str, str | None]:
    if path.is_file():
        if path.stat().st_size == 0:
            raise DataError(f"dataset {spec!r}: is empty; it needs at least one record")
        builder = builder_for(path.name)
        if builder is None:
            raise DataError(f"dataset {spec!r}: unknown file type; use {', '.join(sorted(BUILDERS))} "
                            f"(optionally compressed), a folder of such files, or save_to_disk output")
        return "file", builder
    if any((path / m).is_file() for m in SAVED_MARKERS):
        return "saved", None
    return "folder", None


def resolve(spec: str, *, config: str | None = None, split: str = "train", storage_fs: Any = None,
            cache_dir: str | Path | None = None) -> Source:
    """Where `spec` points; s3:// objects are copied into the cache first. Raises DataError if missing."""
    if mixture.is_mixture(spec):
        members = tuple(resolve(m["id"], config=m["config"], split=m["split"], storage_fs=storage_fs,
                                cache_dir=cache_dir) for m in mixture.parse(spec)["datasets"])
        return Source(spec, "mixture", spec, split=split, members=members)
    if spec.startswith("s3://"):
        local = _fetch_s3(spec, storage_fs, Path(cache_dir or cache.default_dir()))
        kind, builder = _local_kind(local, spec)
        return Source(spec, kind, str(local), config, split, builder)
    path = Path(spec).expanduser()
    if path.exists():
        kind, builder = _local_kind(path, spec)
        return Source(spec, kind, str(path.absolute()), config, split, builder)
    if _looks_like_path(spec):
        raise DataError(f"dataset {spec!r}: not found; pass an existing .jsonl/.json/.parquet/.csv file, a folder "
                        f"of them, save_to_disk output, an s3:// URI of one, or a Hugging Face hub dataset id")
    return Source(spec, "hub", spec, config, split)


def _fetch_s3(uri: str, storage_fs: Any, cache_dir: Path) -> Path:
    """The object (or every object under the prefix) in the local cache, re-fetched when it changed."""
    parent, _, name = uri.rstrip("/").rpartition("/")
    store = Storage.from_uri(parent, fs=storage_fs)
    if not store.exists(name):
        raise DataError(f"dataset {uri!r}: not found in S3; check the bucket and key (and the pod's IAM role)")
    listing = _listing(store, name)
    if not listing:
        raise DataError(f"dataset {uri!r}: an empty S3 prefix; it holds no files")
    where = cache.key(uri, 12)
    target = cache_dir / "datasets-s3" / f"{where}-{cache.key(json.dumps(listing), 12)}"
    local = target / name
    if cache.is_complete(target):
        return local
    for stale in target.parent.glob(f"{where}-*"):  # this URI's earlier objects: never read again
        if not stale.name.endswith(".tmp"):
            shutil.rmtree(stale, ignore_errors=True)

    def download(tmp: Path) -> None:
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        if store.is_dir(name):
            store.download_dir(tmp / name, name)
        else:
            (tmp / name).write_bytes(store.read_bytes(name))

    cache.fill(target, download, uri)
    return local


def _listing(store, name: str) -> list[list]:
    """[relative path, size, mtime] of the object or of every object under the prefix."""
    import posixpath

    import pyarrow.fs as pafs

    base = store.path(name)
    info = store.fs.get_file_info(base)
    infos = store.fs.get_file_info(pafs.FileSelector(base, recursive=True)) if info.type == pafs.FileType.Directory \
        else [info]
    return sorted([posixpath.relpath(i.path, base) if i.path != base else "", i.size, i.mtime_ns]
                  for i in infos if i.type == pafs.FileType.File)


def _root(err: BaseException) -> BaseException:
    """The root cause: `datasets` wraps the reader's error in a generic one."""
    while err.__cause__ is not None or (err.__context__ is not None and not str(err)):
        err = err.__cause__ or err.__context__
    return err


def undecodable(source: Source, err: UnicodeDecodeError) -> DataError:
    """A DataError naming the file, line and byte that are not UTF-8 (text formats must be)."""
    path = Path(source.path)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and builder_for(p.name)
                                                 in ("json", "csv", "text")) if path.exists() else []
    for file in files:
        if builder_for(file.name) not in ("json", "csv", "text") or file.name.endswith(_COMPRESSION):
            continue
        data = file.read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as bad:
            line = data.count(b"\n", 0, bad.start) + 1
            return DataError(f"{source.label}: {file.name} line {line} (byte {bad.start}) is not UTF-8 "
                             f"({bad.reason}: {data[bad.start:bad.end]!r}); save the file as UTF-8 (e.g. "
                             f"`iconv -f latin1 -t utf-8`), or fix or remove that record")
    return DataError(f"{source.label}: a record is not valid UTF-8 ({err.reason} at byte {err.start} of a "
                     f"field); save the data as UTF-8")


MAX_JSON_DEPTH = 64  # a record is a few levels of fields; pyarrow's JSON reader crashes the process on 10,000
_JSON_STRING = re.compile(rb'"(?:[^"\\\n]|\\.)*"')
_BRACKETS = re.compile(rb"[\[\]{}]")


def _json_files(source: Source) -> list[Path]:
    """The uncompressed JSON files `datasets` will read for a local file or folder source."""
    if source.kind not in ("file", "folder"):
        return []
    path = Path(source.path)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and ".cache" not in p.parts)
    return [f for f in files if builder_for(f.name) == "json" and not f.name.endswith(_COMPRESSION)]


def json_too_deep(file: Path, limit: int = MAX_JSON_DEPTH) -> tuple[int, int] | None:
    """(line, depth) where `file`'s JSON nests deeper than `limit`, or None; strings are skipped, not parsed.

    A line is only walked bracket by bracket when its brackets could reach the limit, so a
    dataset of ordinary records costs a count per line.
    """
    depth = 0
    lines_alone = file.name.endswith((".jsonl", ".ndjson"))
    with file.open("rb") as f:
        for n, line in enumerate(f, 1):
            depth = 0 if lines_alone else max(depth, 0)
            if b'"' in line:
                line = _JSON_STRING.sub(b'""', line)
            opens = line.count(b"[") + line.count(b"{")
            if depth + opens <= limit:
                depth += opens - line.count(b"]") - line.count(b"}")
                continue
            for bracket in _BRACKETS.findall(line):
                depth += 1 if bracket in b"[{" else -1
                if depth > limit:
                    return n, depth
    return None


def check_json_depth(source: Source) -> None:
    """DataError naming the file and line of a record nested deeper than MAX_JSON_DEPTH, before `datasets` reads it."""
    for file in _json_files(source):
        found = json_too_deep(file)
        if found:
            raise DataError(f"{source.label}: {file.name} line {found[0]} nests more than {MAX_JSON_DEPTH} levels of "
                            f"lists and objects; a record is a few levels of fields (messages, role, content): "
                            f"fix or remove that record")


def json_error_line(source: Source) -> str | None:
    """`FILE line N: why` of the first line of a JSON Lines file that is not JSON, for `datasets`' line-less error."""
    for file in _json_files(source):
        if not file.name.endswith((".jsonl", ".ndjson")):
            continue
        with file.open("rb") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    json.loads(line)
                except ValueError as e:
                    why = e.msg if isinstance(e, json.JSONDecodeError) else first_line(e)
                    column = f", column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
                    return f"{file.name} line {n}{column} is not JSON ({why})"
    return None


def open_dataset(source: Source, *, streaming: bool = False, cache_dir: str | Path | None = None):
    """A datasets.Dataset (or IterableDataset when streaming) of the source's split."""
    import datasets

    check_json_depth(source)
    datasets.disable_progress_bars()  # the trainer reports its own progress; these would flood job logs
    if source.kind == "mixture":
        return _open_mixture(source, cache_dir)
    kw: dict[str, Any] = {"cache_dir": str(Path(cache_dir) / "datasets")} if cache_dir else {}
    quiet = logging.getLogger("datasets")  # its readers log the error they raise; the DataError below names it
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        if source.kind == "saved":
            loaded = _saved_split(datasets.load_from_disk(source.path), source)
            return loaded.to_iterable_dataset() if streaming else loaded
        if source.kind == "file":
            return datasets.load_dataset(source.builder, data_files=source.path, split=source.split,
                                         streaming=streaming, **kw)
        return datasets.load_dataset(source.path, name=source.config, split=source.split,
                                     streaming=streaming, **kw)
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - datasets raises many kinds; each means this input is unusable
        if isinstance(_root(e), UnicodeDecodeError):
            raise undecodable(source, _root(e)) from None
        if source.kind == "hub":
            raise DataError(f"{source.label}: not a local file or folder, and loading it from the Hugging Face "
                            f"hub failed ({first_line(_root(e))}); check the id, --dataset-config and --dataset-split, "
                            f"network access, and HF_TOKEN for gated datasets") from None
        bad_line = json_error_line(source) if source.builder in (None, "json") else None
        if bad_line:
            raise DataError(f"{source.label}: {bad_line}; fix or remove that line") from None
        raise DataError(f"{source.label}: `datasets` cannot read it ({first_line(_root(e))}); check the file's format "
                        f"and --dataset-split (a single file has the split 'train')") from None
    finally:
        quiet.setLevel(level)


def _open_mixture(source: Source, cache_dir: str | Path | None):
    """alignment-handbook's get_dataset: columns, weights (shuffled with the seed), concatenated and shuffled,
    the train part of the test split."""
    import datasets

    mix = mixture.parse(source.spec)
    seed, parts = mix["seed"], []
    for entry, member in zip(mix["datasets"], source.members, strict=True):
        ds = open_dataset(member, cache_dir=cache_dir)
        if entry["columns"] is not None:
            missing = [c for c in entry["columns"] if c not in ds.column_names]
            if missing:
                raise DataError(f"{member.label} (in the dataset_mixture): no column {', '.join(missing)}; its "
                                f"columns are {', '.join(ds.column_names)}")
            ds = ds.select_columns(entry["columns"])
        if entry["weight"] is not None:
            ds = ds.shuffle(seed=seed).select(range(int(len(ds) * entry["weight"])))
        parts.append(ds)
    try:
        combined = datasets.concatenate_datasets(parts).shuffle(seed=seed)
    except ValueError as e:
        raise DataError(f"{source.label}: its datasets cannot be concatenated ({first_line(e)}); select the same "
                        f"columns of each (columns: [...])") from None
    if mix["test_split_size"] is not None:
        return combined.train_test_split(test_size=mix["test_split_size"], seed=seed)[
            "test" if source.split == "test" else "train"]
    if source.split == "test":
        raise DataError(f"{source.label}: has no test split to evaluate; give the mixture a test_split_size, or "
                        f"pass --eval-dataset")
    return combined


_SPLIT = re.compile(r"^([\w.-]+)(?:\[(-?\d*):(-?\d*)\])?$")


def _saved_split(saved, source: Source):
    """`name` or `name[a:b]` of save_to_disk output (load_dataset's slicing needs a builder); a saved
    Dataset (not a DatasetDict) is its only split."""
    import datasets

    match = _SPLIT.match(source.split)
    if not match:
        raise DataError(f"{source.label}: a save_to_disk dataset takes a split name, optionally sliced with "
                        f"whole numbers (train[:1000]); percentages need a file or hub dataset")
    name, lo, hi = match.groups()
    if not isinstance(saved, datasets.DatasetDict):
        ds = saved
    elif name not in saved:
        raise DataError(f"{source.label}: the saved DatasetDict has no split {name!r}; its splits are "
                        f"{', '.join(saved)} (--dataset-split)")
    else:
        ds = saved[name]
    if match.group(2) is None:
        return ds
    return ds.select(range(len(ds))[slice(int(lo) if lo else None, int(hi) if hi else None)])


def records(source: Source, *, limit: int | None = None, cache_dir: str | Path | None = None) -> list[dict]:
    """The split's records as dicts (only the first `limit`, streamed, for a hub dataset)."""
    try:
        if limit and source.kind == "hub":  # (a mixture is read whole: its weights and shuffle need every record)
            ds = open_dataset(source, streaming=True, cache_dir=cache_dir)
            return [dict(r) for r in ds.take(limit)]
        ds = open_dataset(source, cache_dir=cache_dir)
        if limit:
            ds = ds.select(range(min(limit, len(ds))))
        return ds.to_list()
    except UnicodeDecodeError as e:  # pyarrow reads JSON bytes as they are; decoding happens here
        raise undecodable(source, e) from None


def fingerprint(source: Source, cache_dir: str | Path | None = None) -> dict:
    """What identifies the data for caching and the run record: files by path, size and content (sha256).

    By content, not modification time: the same data written again (the local demo rewrites
    its file on every run) is the same data, and keeps its packed rows in the cache.
    """
    info: dict[str, Any] = {"spec": source.spec, "kind": source.kind, "config": source.config, "split": source.split}
    if source.kind == "mixture":
        return {**info, "members": [fingerprint(m, cache_dir) for m in source.members]}
    if source.kind == "hub":
        return info
    path = Path(source.path)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and ".cache" not in p.parts)
    info["files"] = [[str(p.relative_to(path)) if p != path else p.name, p.stat().st_size, content_hash(p, cache_dir)]
                     for p in files]
    return info


def content_hash(path: Path, cache_dir: str | Path | None = None) -> str:
    """sha256 of a file, remembered per (path, size, mtime) in the cache so each rank does not read it again."""
    st = path.stat()
    memo = None
    if cache_dir:
        key = hashlib.sha256(json.dumps([str(path.absolute()), st.st_size, st.st_mtime_ns]).encode()).hexdigest()[:24]
        memo = Path(cache_dir) / "hashes" / key
        if memo.is_file():
            return memo.read_text().strip()
    h = hashlib.sha256()
    try:
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError as e:
        raise DataError(f"dataset file {path}: cannot be read ({type(e).__name__}: {e})") from None
    digest = h.hexdigest()
    if memo is not None:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(memo.name + f".{os.getpid()}.tmp")
        tmp.write_text(digest)
        tmp.replace(memo)
    return digest
