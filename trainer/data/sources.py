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

A pre-flight's sample (`sample`: the client's and the driver's check of the first records) reads
only what those records need from one JSON Lines, text or parquet file, local or s3:// (its first
lines, or its first row group), and tells the dataset's size from metadata where it has it
(parquet's row count, a save_to_disk dataset's length), else estimates it from the stored bytes.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import shutil
import tempfile
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
    """sha256 of a file, remembered per (path, size, mtime) in the cache so each rank does not read it again (a
    cache that cannot be written only loses the memo: the pre-flight reports an unusable --cache-dir itself)."""
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
        tmp = memo.with_name(memo.name + f".{os.getpid()}.tmp")
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(digest)
            tmp.replace(memo)
        except OSError:
            pass
    return digest


# ---------------------------------------------------------------- the pre-flight's sample

STREAMED = ("json", "parquet", "text")  # builders whose first records can be read without the rest
_STREAM_CODECS = {".gz": "gzip", ".bz2": "bz2"}  # what the standard library inflates as it comes and writes back
_FIRST_BLOCK, _LAST_BLOCK = 1 << 14, 1 << 20  # each read twice the last: few requests, little read past the sample


@dataclass(frozen=True)
class Size:
    """How big the dataset is, found without reading it: `records` where metadata has the count (or the sample
    reached the end), else `estimated_records` from the stored bytes and the sample's bytes per record."""

    records: int | None = None
    stored_bytes: int | None = None
    estimated_records: int | None = None
    how: str = "unknown"

    @property
    def count(self) -> int | None:
        """The record count, or its estimate; None when neither is known (a hub dataset)."""
        return self.records if self.records is not None else self.estimated_records

    def describe(self) -> str:
        if self.records is not None:
            return f"{self.records:,} records ({self.how})"
        if self.estimated_records is not None:
            return f"about {self.estimated_records:,} records ({self.how})"
        return f"an unknown number of records ({self.how})"


@dataclass(frozen=True)
class Sample:
    """The first records of the split, as `records(source, limit=...)` gives them, the dataset's size, and the bytes
    read from storage to get them."""

    records: list[dict]
    size: Size
    bytes_read: int | None = None


def sample(spec: str, split: str = "train", *, config: str | None = None, storage_fs: Any = None, limit: int = 100,
           cache_dir: str | Path | None = None) -> Sample:
    """The first `limit` records and the size, reading one JSON Lines / text / parquet file (local or s3://) only
    as far as those records go; other sources are read as `records` reads them (an s3:// prefix is fetched)."""
    found = _one_streamable_file(spec, split, storage_fs, limit)
    if found is None:
        source = resolve(spec, config=config, split=split, storage_fs=storage_fs, cache_dir=cache_dir)
        return _opened_sample(source, limit, cache_dir)
    fs, path, builder, stored, limit = found
    source = Source(spec, "file", path, config, split, builder)
    reader = _parquet_head if builder == "parquet" else _lines_head
    with tempfile.TemporaryDirectory(prefix="trainer-sample-") as tmp:
        local = Path(tmp) / "head" / path.rpartition("/")[2]
        local.parent.mkdir()
        got, size, read = reader(fs, path, local, limit, stored, builder)
        head = Source(spec, "file", str(local), config, "train", builder)
        rows = records(head, cache_dir=Path(tmp) / "cache") if got else []
    if not rows:
        raise DataError(f"{source.label}: is empty; it needs at least one record")
    sliced = _SPLIT.match(split).group(3)
    if sliced:  # train[:N]: at most N of the file's records
        size = Size(None if size.records is None else min(size.records, int(sliced)), size.stored_bytes,
                    None if size.estimated_records is None else min(size.estimated_records, int(sliced)),
                    f"{size.how}, at most {int(sliced):,} by --dataset-split {split}")
    return Sample(rows[:limit], size, read)


def _one_streamable_file(spec: str, split: str, storage_fs: Any, limit: int):
    """(filesystem, path, builder, stored bytes, records wanted) of a single local or s3:// file whose first
    records can be read alone, with the split its only one (`train`, or `train[:N]`); else None."""
    import pyarrow.fs as pafs

    match = _SPLIT.match(split)
    if mixture.is_mixture(spec) or not match or match.group(1) != "train" or match.group(2) not in (None, "", "0") \
            or (match.group(3) or "").startswith("-"):
        return None
    if match.group(3):
        limit = min(limit, int(match.group(3)))
    if spec.startswith("s3://"):
        parent, _, name = spec.rstrip("/").rpartition("/")
        store = Storage.from_uri(parent, fs=storage_fs)
        fs, path = store.fs, store.path(name)
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise DataError(f"dataset {spec!r}: not found in S3; check the bucket and key (and the pod's IAM role)")
    else:
        local = Path(spec).expanduser()
        if not local.is_file():
            return None
        fs, path = pafs.LocalFileSystem(), str(local.absolute())
        info = fs.get_file_info(path)
    builder = builder_for(path)
    codec = next((c for ext, c in _STREAM_CODECS.items() if path.lower().endswith(ext)), None)
    compressed = path.lower().endswith(_COMPRESSION)
    if info.type != pafs.FileType.File or not info.size or builder not in STREAMED or limit < 1 \
            or (compressed and (codec is None or builder == "parquet")):
        return None
    return fs, path, builder, info.size, limit


class _Counted(io.RawIOBase):
    """A pyarrow input file seen as a Python one that counts the bytes taken from it (what storage served)."""

    def __init__(self, raw):
        super().__init__()
        self.raw, self.read_bytes = raw, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.raw.read(len(buffer))
        buffer[:len(data)] = data
        self.read_bytes += len(data)
        return len(data)


class _Inflated:
    """The blocks of a stream, decompressed (gzip or bz2) as they come; how many stored bytes gave how many."""

    def __init__(self, raw, codec: str | None):
        import bz2
        import zlib

        self.raw, self.stored, self.inflated, self.block = raw, 0, 0, _FIRST_BLOCK
        self.codec = None if codec is None else zlib.decompressobj(wbits=47) if codec == "gzip" \
            else bz2.BZ2Decompressor()

    def read(self) -> bytes:
        """The next block (b"" at the end)."""
        while True:
            chunk = self.raw.read(self.block)
            self.block = min(2 * self.block, _LAST_BLOCK)
            self.stored += len(chunk)
            out = chunk if self.codec is None or not chunk else self.codec.decompress(chunk)
            self.inflated += len(out)
            if out or not chunk:
                return out


def _lines_head(fs, path: str, local: Path, limit: int, stored: int, builder: str) -> tuple[int, Size, int]:
    """The file's first `limit` records (non-blank lines of JSON Lines, every line of text) written to `local`
    (compressed again as the original was); their count, the size, the bytes read."""
    import bz2
    import gzip

    codec = next((c for ext, c in _STREAM_CODECS.items() if path.lower().endswith(ext)), None)
    raw = fs.open_input_stream(path, compression=None)
    blocks = _Inflated(raw, codec)
    kept, n, pending = bytearray(), 0, b""
    try:
        block = b"x"
        while n < limit and block:
            block = blocks.read()
            lines = (pending + block).split(b"\n") if block else [pending]
            pending = lines.pop() if block else b""
            for i, line in enumerate(lines):
                line += b"\n" if block else b""
                kept += line
                n += builder == "text" or bool(line.strip())
                if n >= limit:
                    pending = b"\n".join([*lines[i + 1:], pending])
                    break
        ended = not block or not (pending.strip() or blocks.read().strip())
    finally:
        raw.close()
    data = bytes(kept)
    local.write_bytes(gzip.compress(data) if codec == "gzip" else bz2.compress(data) if codec == "bz2" else data)
    if ended:
        size = Size(records=n, stored_bytes=stored, how="the sample reached the end of the file")
    elif codec:  # the sample's bytes per record, at the compression ratio its stream showed
        per_record = len(data) / n * blocks.stored / max(blocks.inflated, 1)
        size = Size(stored_bytes=stored, estimated_records=round(stored / per_record),
                    how=f"estimated from {stored:,} compressed bytes at the sample's {per_record:,.0f} per record")
    else:
        size = Size(stored_bytes=stored, estimated_records=round(stored * n / max(len(data), 1)),
                    how=f"estimated from {stored:,} bytes at the sample's {len(data) / n:,.0f} bytes per record")
    return n, size, blocks.stored


def _parquet_head(fs, path: str, local: Path, limit: int, stored: int, builder: str) -> tuple[int, Size, int]:
    """The first `limit` rows of a parquet file (its footer, then its first row groups) written to `local`;
    their count, the size (the footer's row count), the bytes read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    raw = fs.open_input_file(path)
    counted = _CountedFile(raw)
    try:
        pf = pq.ParquetFile(pa.PythonFile(counted, mode="r"))
        total = pf.metadata.num_rows
        groups, n = [], 0
        while n < limit and len(groups) < pf.num_row_groups:
            groups.append(pf.read_row_group(len(groups), use_threads=False))
            n += groups[-1].num_rows
        table = pa.concat_tables(groups).slice(0, limit) if groups else pf.schema_arrow.empty_table()
    except (pa.ArrowInvalid, OSError) as e:
        raise DataError(f"dataset {path.rpartition('/')[2]!r}: not a readable parquet file ({first_line(e)}); check "
                        f"the file's format") from None
    finally:
        raw.close()
    pq.write_table(table, local)
    return table.num_rows, Size(records=total, stored_bytes=stored, how="the parquet footer's row count"), \
        counted.read_bytes


class _CountedFile(_Counted):
    """A random-access one (parquet reads its footer, then the byte ranges of its first row group)."""

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.raw.seek(offset, whence)

    def tell(self) -> int:
        return self.raw.tell()


def _opened_sample(source: Source, limit: int, cache_dir: str | Path | None) -> Sample:
    """Today's read of the first records (a hub dataset streamed, the rest opened whole); the length of what was
    opened is the record count."""
    if source.kind == "hub":
        return Sample(records(source, limit=limit, cache_dir=cache_dir), Size(how="a hub dataset: not listed here"))
    try:
        ds = open_dataset(source, cache_dir=cache_dir)
        rows = ds.select(range(min(limit, len(ds)))).to_list()
    except UnicodeDecodeError as e:
        raise undecodable(source, e) from None
    path = Path(source.path)
    stored = sum(p.stat().st_size for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file()) \
        if source.kind != "mixture" else None
    how = "the saved dataset's length" if source.kind == "saved" else "the whole dataset opened"
    return Sample(rows, Size(records=len(ds), stored_bytes=stored, how=how))
